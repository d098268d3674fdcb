"""SpecLens dashboard: `streamlit run app.py`. Data root: $SPECLENS_DATA (default ./data).

The pages, their URL paths and the query parameters each view is addressable by are registered once, in
backend/links.py `PAGES`; dashboard/page_registry.py builds the top bar from it. `/` forwards to /runs.
"""

from dashboard import page_registry, ui

ui.page_setup()       # page config (title, local favicon, wide), compact style, a fresh report bundle for this run

page = page_registry.navigation()
with ui.shared_catalog_reads():       # the page's catalog queries share one connection (docs/PERFORMANCE.md)
    page.run()
