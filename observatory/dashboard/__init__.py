"""The public Streamlit dashboard: `app.py` routes to the pages in `observatory.dashboard.pages`.

Each page is a module with `render()`, a thin layer over `observatory.queries`
(no SQL in page code); `common` holds the cached query helper, the run picker,
deep links and chart helpers. Nothing here writes to the store.
"""
