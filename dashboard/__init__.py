"""The dashboard: everything that imports Streamlit or draws a figure (ui, charts, exports, auth, serve). Pages
(`pages/`, `app.py`) use these and read data through backend/ only; nothing under backend/ imports from here."""
