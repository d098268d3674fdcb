"""The dashboard's navigation, built from the one page registry (backend/links.py `PAGES`: each view's URL path,
script, title and icon). app.py runs `navigation()`; a page links to another with `script(view)` and `icon(view)`.
Nothing here lists a page: a new page is one row of `PAGES`."""

from __future__ import annotations

import streamlit as st
from streamlit.navigation.page import StreamlitPage

from backend.links import PAGES

LANDING = next(iter(PAGES))           # `/` forwards here (the first view of the registry: Runs)


def script(view: str) -> str:
    """The script of a view (what st.page_link and st.switch_page take)."""
    return PAGES[view].script


def icon(view: str) -> str:
    return PAGES[view].icon


def navigation() -> StreamlitPage:
    """The top bar: every registered view in the registry's order (hidden ones reached by links only) behind a
    hidden default page at `/` that forwards to the landing view with the URL's query parameters (streamlit serves
    its default page at `/` only, so the default is a hidden forwarder)."""
    pages = {v: st.Page(p.script, title=p.title, url_path=p.path, icon=p.icon,
                        visibility="hidden" if p.hidden else "visible") for v, p in PAGES.items()}

    def home() -> None:
        st.switch_page(pages[LANDING], query_params=st.query_params.to_dict())

    default = st.Page(home, title="SpecLens", url_path="home", default=True, visibility="hidden")
    return st.navigation([default, *pages.values()], position="top")
