"""Post-mortem reports: after a run that went wrong, one command explains what happened and when.

    observatory report RUN [--out DIR] [--format html|md|pdf]

- `collect`: `build(db, run)` reads everything from the store into a `Report` (plain data);
- `format`: the text of its cells (times, numbers, config keys);
- `figures`: plotly figures drawn from a `Report` alone;
- `render`: HTML (one self-contained file; plotly.js inlined, so it works offline),
  Markdown (`<run>.md` with PNG figures in `<run>_figures/`) and PDF (the HTML printed
  by headless chromium), and `write`, which builds and writes one of them.

The same store gives the same report, byte for byte.
"""

from observatory.report.collect import Report, build, effective_status
from observatory.report.render import (
    CHROMIUM_ARGS,
    FORMATS,
    render_html,
    render_markdown,
    render_pdf,
    write,
)

__all__ = [
    "Report",
    "build",
    "effective_status",
    "render_html",
    "render_markdown",
    "render_pdf",
    "write",
    "FORMATS",
    "CHROMIUM_ARGS",
]
