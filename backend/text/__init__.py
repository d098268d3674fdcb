"""The text layer: plain sentences for people, worded once from the analysis' data and verdict objects.

backend/align.py, backend/feeds.py and backend/drafter/ return data (an alignment's `Finding`s, the Feeds `Summary`,
an engine `Reading`'s kind and ids rule, the drafter check's `Finding`s); the modules here word them as plain
sentences, no markdown, no Streamlit or plotly. The command line (backend/__main__.py, backend/release_cli.py,
backend/demo.py), the runs that write reports (backend/check_drafter.py, backend/training_data.py) and the pages
(dashboard/align_words.py, dashboard/feeds_words.py, dashboard/check_charts.py) all use the same sentences;
dashboard/ adds markdown, tiles and URLs around them.
In the layers of docs/ARCHITECTURE.md this package sits above analysis and below engines/runs."""
