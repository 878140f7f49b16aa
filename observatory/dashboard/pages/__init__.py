"""Dashboard pages, one module each with `render()`: runs, live, experts, compare, decisions, sql, ladder, reports.

`PAGES` lists them in navigation order as (section, module name, title, url path,
icon). Pages owned by other parts of the project (ladder, decisions, reports)
are imported lazily, so a page that fails to import shows its error alone.
"""

from __future__ import annotations

PAGES = (
    ("Runs", "runs", "Runs", "runs", ":material/list:"),
    ("Runs", "live", "Live run", "live", ":material/monitoring:"),
    ("Runs", "experts", "Experts", "experts", ":material/grid_on:"),
    ("Runs", "compare", "Compare", "compare", ":material/compare_arrows:"),
    ("Research", "decisions", "Decisions", "decisions", ":material/gavel:"),
    ("Research", "ladder", "Ladder", "ladder", ":material/stacked_line_chart:"),
    ("Research", "reports", "Reports", "reports", ":material/description:"),
    ("Store", "sql", "SQL", "sql", ":material/terminal:"),
)
