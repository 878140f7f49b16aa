"""The public Streamlit dashboard: `app.py` routes to the pages in `observatory.dashboard.pages`.

Each page is a module with `render()`, a thin layer over `observatory.queries`
(no SQL in page code). What the pages share:

- `cache`: store queries on one read-only connection per batch, cached across sessions;
- `runs_table`: the run table every page starts from;
- `widgets`: the run picker and step window bound to the URL and session state;
- `charts`: plotly figures as dicts (min-max bands, event markers);
- `after_paint`: whether the browser has drawn a page's first chart yet.

Nothing here writes to the store.
"""
