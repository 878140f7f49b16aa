"""Renderers for a `Report`: one self-contained HTML file, Markdown with PNG figures, or PDF.

HTML and Markdown come from one walk over the sections (`_walk`), which tells each
element to a per-format writer (`_Html`, `_Markdown`). HTML inlines plotly.js
once in <head> and gives every figure a fixed div id, so the file works offline and
two renders of one store are identical. Markdown's PNGs come from kaleido, which
drives the system chromium (`BROWSER_PATH` overrides where it is); PDF is the HTML
printed by headless chromium (`--print-to-pdf`).

plotly (and the figures module, which imports it) is imported inside the functions
that draw, so importing the report package stays fast for the CLI.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from html import escape
from pathlib import Path
from typing import Any

from observatory.lineage import format_text
from observatory.markup import Markup, md_escape
from observatory.report.collect import Report, build
from observatory.report.format import flatten, fmt_time, fmt_value

__all__ = [
    "render_html",
    "render_markdown",
    "render_pdf",
    "write",
    "write_pngs",
    "SECTIONS",
    "FORMATS",
    "CHROMIUM_ARGS",
]

FORMATS = ("html", "md", "pdf")

SECTIONS = (
    ("summary", "Summary"),
    ("timeline", "Timeline"),
    ("windows", "Around each failure and anomaly"),
    ("slow", "Slow changes"),
    ("experts", "Expert load and token drops"),
    ("decisions", "Decisions"),
    ("lineage", "Lineage"),
    ("config", "Config and its diffs"),
    ("ladder", "Forecasts and ladder"),
)
_TITLES = dict(SECTIONS)
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
padding:0 1rem;color:#222;line-height:1.45}
h1{font-size:1.7rem;margin-bottom:.2rem} h2{border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem;width:100%}
th,td{border:1px solid #e2e2e2;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f6f6f6} td.num{text-align:right;font-variant-numeric:tabular-nums}
.status{display:inline-block;padding:.1rem .6rem;border-radius:1rem;color:#fff;font-weight:600}
.status-completed{background:#2ca02c}.status-failed{background:#d62728}.status-crashed{background:#8c564b}
.status-running{background:#1f77b4}.status-killed,.status-preempted,.status-records,.status-unknown{background:#7f7f7f}
.story li{margin:.2rem 0} nav a{margin-right:.8rem} pre{background:#f6f6f6;padding:.6rem;overflow-x:auto}
.k-failure{color:#d62728;font-weight:600}.k-anomaly{color:#c65d00}.k-decision{color:#1f77b4}
.k-config_diff{color:#9467bd}.figure{margin:1rem 0}
@media print{nav{display:none} .figure{break-inside:avoid}}
"""


def _cell(x: Any) -> str:
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, (dict, list)):
        return json.dumps(x, sort_keys=True)
    return fmt_value(x)


CAPPED_KINDS = ("checkpoint", "eval", "note", "anomaly")
KEEP_PER_KIND = 100  # first and last 50 of a capped kind: a long run's 10k checkpoints would bury the rest


def _timeline_view(rep: Report) -> tuple[list[dict], dict[str, int]]:
    """Timeline events to list, and per capped kind how many were left out of the table."""
    idx: dict[str, list[int]] = {}
    for i, e in enumerate(rep.timeline):
        idx.setdefault(e["kind"], []).append(i)
    drop: set[int] = set()
    left_out: dict[str, int] = {}
    for kind in CAPPED_KINDS:
        ii = idx.get(kind, [])
        if len(ii) > KEEP_PER_KIND:
            cut = ii[KEEP_PER_KIND // 2 : len(ii) - KEEP_PER_KIND // 2]
            drop.update(cut)
            left_out[kind] = len(cut)
    return [e for i, e in enumerate(rep.timeline) if i not in drop], left_out


def _rows_timeline(events: list[dict]) -> list[list[str]]:
    return [
        ["-" if e["step"] is None else str(e["step"]), fmt_time(e["t"]), e["kind"], e["text"]] for e in events
    ]


def _left_out_note(left_out: dict[str, int]) -> str:
    if not left_out:
        return ""
    parts = ", ".join(f"{n} {k} events" for k, n in left_out.items())
    return f"{parts} from the middle of the run are left out of this table (all are in the store)."


def _expert_rows(rep: Report) -> list[list[str]]:
    return [
        [
            str(x["layer"]),
            str(x["experts"]),
            str(x["routed"]),
            str(x["dropped"]),
            "-" if x["drop_fraction"] is None else f"{x['drop_fraction']:.2%}",
            "-" if x["max_over_mean"] is None else f"{x['max_over_mean']:.2f} (e{x['hottest']})",
            str(x["dead"]),
        ]
        for x in rep.expert_layers
    ]


EXPERT_HEAD = ["layer", "experts", "routed", "dropped", "drop fraction", "hottest max/mean", "dead experts"]
TIMELINE_HEAD = ["step", "time", "kind", "what"]
FORECAST_HEAD = ["metric", "step", "forecast", "band", "actual", "verdict", "source"]
LADDER_HEAD = ["run", "rung", "status", "steps", "final train/loss"]


def _forecast_rows(rep: Report) -> list[list[str]]:
    out = []
    for f in rep.forecasts:
        band = f"[{fmt_value(f['low'])}, {fmt_value(f['high'])}]" if f["low"] is not None else "-"
        actual = f"{fmt_value(f['actual'])} @ {f['actual_step']}" if f["actual"] is not None else "-"
        out.append(
            [
                f["metric"],
                fmt_value(f["step"]),
                fmt_value(f["value"]),
                band,
                actual,
                f["verdict"],
                f["source_text"] or "-",
            ]
        )
    return out


def _ladder_rows(rep: Report) -> list[list[str]]:
    return [
        [
            ("▶ " if x["run"] == rep.run else "") + x["run"],
            fmt_value(x["rung"]),
            fmt_value(x["status"]),
            fmt_value(x["steps"]),
            fmt_value(x["final"]),
        ]
        for x in rep.ladder
    ]


def _diff_rows(rep: Report) -> list[list[str]]:
    out = []
    for e in rep.config_diffs:
        a = e["data"].get("against") or {}
        for key, v in sorted((e["data"].get("changes") or {}).items()):
            old, new = (v[0], v[1]) if isinstance(v, list) and len(v) == 2 else (None, v)
            out.append([_cell(e["step"]), f"{a.get('run')}@{a.get('step')}", key, _cell(old), _cell(new)])
    for d in rep.decisions:
        for key, (old, new) in sorted(d.config_diff.items()):
            out.append(["-", f"decision {d.id}", key, _cell(old), _cell(new)])
    return out


def _decision_fields(d) -> list[tuple[str, str]]:
    rows = [("kind / status", f"{d.kind} / {d.status}"), ("author", d.author or "-")]
    rows += [("created", fmt_time(d.created)), ("updated", fmt_time(d.updated))]
    for name in ("hypothesis", "goal", "action", "outcome", "follow_up"):
        if getattr(d, name):
            rows.append((name.replace("_", "-"), getattr(d, name)))
    if d.forecast:
        rows.append(
            ("forecast", f"{d.forecast.metric} = {d.forecast.value:g} {d.forecast.assumptions}".strip())
        )
    if d.trigger:
        t = d.trigger
        rows.append(
            ("trigger", f"{t.metric} {t.rule}" + (f" at step {t.step}" if t.step is not None else ""))
        )
    if d.runs:
        rows.append(("runs", ", ".join(r.run + (f"@{r.step}" if r.step is not None else "") for r in d.runs)))
    if d.alternatives:
        rows.append(("alternatives", "; ".join(d.alternatives)))
    if d.evidence:
        rows.append(
            (
                "evidence",
                "; ".join(e if isinstance(e, str) else json.dumps(e, sort_keys=True) for e in d.evidence),
            )
        )
    if d.cost and d.cost.to_dict():
        rows.append(("cost", ", ".join(f"{k} {v:g}" for k, v in d.cost.to_dict().items())))
    return rows


def _lineage_text(rep: Report) -> str:
    if rep.lineage is None:
        return "no lineage (this folder has no run_start)"
    return format_text(rep.lineage)


def _walk(rep: Report, out) -> None:
    """The report's sections, in `SECTIONS` order, told to `out` (an `_Html` or a `_Markdown`)."""
    out.section("summary")
    out.bullets(rep.story)
    out.table(["", ""], [[k, v] for k, v in rep.summary])
    out.section("timeline")
    out.fig("overview")
    events, left_out = _timeline_view(rep)
    out.table(TIMELINE_HEAD, _rows_timeline(events), [f"k-{e['kind']}" for e in events])
    if left_out:
        out.note(_left_out_note(left_out))
    out.section("windows")
    if not rep.windows:
        out.note("no failures or anomalies recorded")
    for i, w in enumerate(rep.windows):
        out.window(w, f"window-{i + 1}")
    out.section("slow")
    if not rep.slow:
        out.note(
            "no slow change found: loss, eval loss, grad norm, drop fraction, router entropy, throughput"
        )
    else:
        out.table(
            ["step", "severity", "metric", "finding"],
            [[s["step"], s["severity"], s["metric"], s["message"]] for s in rep.slow],
        )
    for i, w in enumerate(rep.slow):
        out.window(w, f"slow-{i + 1}")
    out.section("experts")
    out.table(EXPERT_HEAD, _expert_rows(rep))
    out.fig("experts")
    out.fig("drops")
    out.section("decisions")
    if not rep.decisions:
        out.note("no decisions linked to this run")
    for d in rep.decisions:
        out.decision(d)
    out.section("lineage")
    out.pre(_lineage_text(rep))
    out.fig("lineage")
    out.section("config")
    out.table(["step", "against", "key", "old", "new"], _diff_rows(rep))
    out.details("Resolved config", ["key", "value"], [[k, _cell(v)] for k, v in flatten(rep.config)])
    out.section("ladder")
    if rep.forecasts:
        out.table(FORECAST_HEAD, _forecast_rows(rep))
        out.fig("forecast")
    else:
        out.note("no forecast recorded for this run")
    if rep.ladder:
        out.subheading("Ladder ", rep.info.get("ladder_name"))
        out.table(LADDER_HEAD, _ladder_rows(rep))
    out.end()


# ------------------------------------------------------------------ HTML


def _table(head: list[str], rows: list[list[str]], classes: list[str] | None = None) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    th = "".join(f"<th>{escape(h)}</th>" for h in head) if any(head) else ""
    body = []
    for i, r in enumerate(rows):
        cls = f' class="{escape(classes[i])}"' if classes else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{_html_cell(c)}</td>" for c in r) + "</tr>")
    thead = f"<thead><tr>{th}</tr></thead>" if th else ""
    return f"<table>{thead}<tbody>{''.join(body)}</tbody></table>"


PROSE = (
    "hypothesis",
    "goal",
    "action",
    "outcome",
    "follow-up",
)  # decision fields kept as written, lines and all


def _prose(text: str) -> Markup:
    """A decision's prose as text with its line breaks: a log writer's Markdown would render its links and
    formatting in every reader's report (issue 36), so it is shown as written."""
    return Markup("<br>".join(escape(line) for line in str(text).split("\n")))


def _html_cell(c: Any) -> str:
    """A table cell: sanitised HTML as is (`Markup`), anything else escaped."""
    return c if isinstance(c, Markup) else escape(str(c))


class _Html:
    """The report's sections as HTML pieces (`parts`), one `<section>` each; see `_walk`."""

    def __init__(self, fig):
        self.parts: list[str] = []
        self._fig = fig  # figure name -> its HTML ("" for a figure the report lacks)
        self._close = ""  # what ends the open section

    def fig(self, name: str) -> None:
        self.parts.append(self._fig(name))

    def section(self, key: str) -> None:
        self.end()
        self.parts.append(f'<section id="{key}"><h2>{escape(_TITLES[key])}</h2>')
        self._close = "</section>"

    def end(self) -> None:
        if self._close:
            self.parts.append(self._close)
        self._close = ""

    def bullets(self, items: list[str]) -> None:
        self.parts.append('<ul class="story">' + "".join(f"<li>{escape(x)}</li>" for x in items) + "</ul>")

    def table(self, head: list[str], rows: list[list[str]], classes: list[str] | None = None) -> None:
        self.parts.append(_table(head, rows, classes))

    def note(self, text: str) -> None:
        self.parts.append(f"<p><em>{escape(text)}</em></p>")

    def window(self, w: dict, name: str) -> None:
        self.fig(name)

    def decision(self, d) -> None:
        self.parts.append(f'<h3 id="decision-{escape(d.id)}">{escape(d.id)}: {escape(d.title)}</h3>')
        rows = [[k, _prose(v) if k in PROSE else v] for k, v in _decision_fields(d)]
        self.table(["field", "value"], rows)

    def pre(self, text: str) -> None:
        self.parts.append(f"<pre>{escape(text)}</pre>")

    def details(self, summary: str, head: list[str], rows: list[list[str]]) -> None:
        """A table folded under `summary` (open), to the end of the section."""
        self.parts.append(f"<details open><summary>{escape(summary)}</summary>")
        self.table(head, rows)
        self._close = "</details>" + self._close

    def subheading(self, label: str, value: Any) -> None:
        self.parts.append(f"<h3>{label}{escape(str(value))}</h3>")


def render_html(rep: Report) -> str:
    # lazy for start-up time: plotly is slow to import
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    from observatory.report.figures import figures

    figs = figures(rep)

    def fig(name: str) -> str:
        if name not in figs:
            return ""
        div = pio.to_html(
            figs[name], include_plotlyjs=False, full_html=False, div_id=f"fig-{name}", config=PLOTLY_CONFIG
        )
        return f'<div class="figure" data-figure="{escape(name)}">{div}</div>'

    out = _Html(fig)
    _walk(rep, out)
    nav = " ".join(f'<a href="#{k}">{escape(v)}</a>' for k, v in SECTIONS)
    status = escape(rep.status)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>Post-mortem: {escape(rep.run)}</title><style>{CSS}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head>\n<body>'
        f'<h1>Post-mortem: {escape(rep.run)} <span class="status status-{status}">{status}</span></h1>'
        f"<nav>{nav}</nav>\n" + "\n".join(x for x in out.parts if x) + "\n</body></html>\n"
    )


# ------------------------------------------------------------------ Markdown


def _md_cell(x: str) -> str:
    return "<br>".join(md_escape(line) for line in str(x).split("\n"))


def _md_fence(text: str) -> str:
    """`text` in a code fence longer than any backtick run inside it (so it cannot close it)."""
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", text)), default=0))
    return f"{fence}\n{text}\n{fence}\n"


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    if not rows:
        return "_none_\n"
    out = ["| " + " | ".join(_md_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


class _Markdown:
    """The report's sections as Markdown pieces (`parts`), one `##` heading each; see `_walk`."""

    def __init__(self, fig):
        self.parts: list[str] = []
        self._fig = fig  # figure name -> its image link ("" for a figure the report lacks)

    def fig(self, name: str) -> None:
        self.parts.append(self._fig(name))

    def section(self, key: str) -> None:
        self.parts.append(f"## {_TITLES[key]}\n")

    def end(self) -> None:
        """A Markdown section ends where the next heading starts."""

    def bullets(self, items: list[str]) -> None:
        self.parts += [f"- {md_escape(x)}" for x in items]
        self.parts.append("")

    def table(self, head: list[str], rows: list[list[str]], classes: list[str] | None = None) -> None:
        self.parts.append(_md_table(head, rows))

    def note(self, text: str) -> None:
        self.parts.append(f"_{text}_\n")

    def window(self, w: dict, name: str) -> None:
        self.parts.append(f"**{md_escape(w['title'])}** (steps {w['lo']}-{w['hi']})\n")
        self.fig(name)

    def decision(self, d) -> None:
        self.parts.append(f"### {md_escape(d.id)}: {md_escape(d.title)}\n")
        self.table(["field", "value"], [list(x) for x in _decision_fields(d)])

    def pre(self, text: str) -> None:
        self.parts.append(_md_fence(text))

    def details(self, summary: str, head: list[str], rows: list[list[str]]) -> None:
        """Markdown has no folding: the table as is."""
        self.table(head, rows)

    def subheading(self, label: str, value: Any) -> None:
        self.parts.append(f"### {label}{md_escape(value)}\n")


def write_pngs(figs: dict, folder: Path) -> dict[str, Path]:
    """Export figures as PNG with kaleido (one chromium session for all of them)."""
    import plotly.io as pio  # lazy for start-up time

    if (
        not os.environ.get("BROWSER_PATH")
        and not shutil.which("chromium")
        and Path("/usr/bin/chromium").exists()
    ):
        os.environ["BROWSER_PATH"] = "/usr/bin/chromium"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.png" for name in figs}
    if figs:
        pio.write_images(
            list(figs.values()),
            [str(p) for p in paths.values()],
            format="png",
            width=1000,
            height=[int(f.layout.height or 400) for f in figs.values()],
        )
    return paths


def render_markdown(rep: Report, out_dir, fig_folder: str) -> str:
    """Markdown text; its PNG figures are written to <out_dir>/<fig_folder>/."""
    from observatory.report.figures import figures  # lazy for start-up time: it imports plotly

    figs = figures(rep)
    write_pngs(figs, Path(out_dir) / fig_folder)

    def fig(name: str) -> str:
        return f"![{name}]({fig_folder}/{name}.png)\n" if name in figs else ""

    out = _Markdown(fig)
    out.parts.append(f"# Post-mortem: {md_escape(rep.run)} ({md_escape(rep.status)})\n")
    _walk(rep, out)
    return "\n".join(out.parts).rstrip("\n") + "\n"


# ------------------------------------------------------------------ PDF and files


def _chromium() -> str:
    for cand in (os.environ.get("BROWSER_PATH"), shutil.which("chromium"), "/usr/bin/chromium"):
        if cand and Path(cand).exists():
            return cand
    raise RuntimeError(
        "PDF needs a chromium: install Debian's `chromium` (make chromium) or set BROWSER_PATH"
    )


# Headless chromium on a machine with no network beyond the package registries: without the
# background-networking flags it keeps trying (and failing) to reach Google's services.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def render_pdf(html_text: str, pdf_path: Path, timeout_s: float = 120) -> Path:
    """Print the HTML report with headless chromium (no extra Python package needed)."""
    pdf_path = Path(pdf_path)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "report.html"
        src.write_text(html_text, encoding="utf-8")
        cmd = [
            _chromium(),
            *CHROMIUM_ARGS,
            f"--user-data-dir={Path(tmp) / 'profile'}",
            "--no-pdf-header-footer",
            "--virtual-time-budget=10000",  # let plotly draw before printing
            f"--print-to-pdf={pdf_path.resolve()}",
            src.resolve().as_uri(),
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if r.returncode != 0 or not pdf_path.exists():
            raise RuntimeError(f"chromium could not print {pdf_path}: {r.stderr[-2000:]}")
    return pdf_path


def write(db, run: str, out_dir, fmt: str = "html") -> Path:
    """Build and write one report; returns the main file (<out>/<run>.html|md|pdf)."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    rep = build(db, run)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "html":
        path = out / f"{run}.html"
        path.write_text(render_html(rep), encoding="utf-8")
        return path
    if fmt == "md":
        path = out / f"{run}.md"
        path.write_text(render_markdown(rep, out, f"{run}_figures"), encoding="utf-8")
        return path
    return render_pdf(render_html(rep), out / f"{run}.pdf")
