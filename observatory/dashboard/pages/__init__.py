"""Dashboard pages, one module each with `render()`: runs, live, experts, health, compare, sweeps, decisions, ladder, reports, sql.

`PAGES` lists them in navigation order as (module name, title, url path, icon);
`app.py` routes to them.
"""

from __future__ import annotations

PAGES = (
    ("runs", "Runs", "runs", ":material/list:"),
    ("live", "Live run", "live", ":material/monitoring:"),
    ("experts", "Experts", "experts", ":material/grid_on:"),
    ("health", "Health", "health", ":material/monitor_heart:"),
    ("compare", "Compare", "compare", ":material/compare_arrows:"),
    ("sweeps", "Sweeps", "sweeps", ":material/scatter_plot:"),
    ("decisions", "Decisions", "decisions", ":material/gavel:"),
    ("ladder", "Ladder", "ladder", ":material/stacked_line_chart:"),
    ("reports", "Reports", "reports", ":material/description:"),
    ("sql", "SQL", "sql", ":material/terminal:"),
)
