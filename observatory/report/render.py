"""Renderers for a `Report`: one self-contained HTML file, Markdown with PNG figures, or PDF.

HTML and Markdown walk the same sections in the same order. HTML inlines plotly.js
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
from observatory.markup import Markup, markdown_html, md_escape
from observatory.report.collect import Report, build
from observatory.report.format import flatten, fmt_time, fmt_value

__all__ = ["render_html", "render_markdown", "render_pdf", "write", "write_pngs", "SECTIONS", "FORMATS", "CHROMIUM_ARGS"]

FORMATS = ("html", "md", "pdf")

SECTIONS = (
    ("summary", "Summary"),
    ("timeline", "Timeline"),
    ("windows", "Around each failure and anomaly"),
    ("experts", "Expert load and token drops"),
    ("decisions", "Decisions"),
    ("lineage", "Lineage"),
    ("config", "Config and its diffs"),
    ("ladder", "Forecasts and ladder"),
)
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


PROSE = ("hypothesis", "goal", "action", "outcome", "follow-up")  # decision fields rendered as Markdown


def _html_cell(c: Any) -> str:
    """A table cell: sanitised HTML as is (`Markup`), anything else escaped."""
    return c if isinstance(c, Markup) else escape(str(c))


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

    s = []
    s.append('<section id="summary"><h2>Summary</h2>')
    s.append('<ul class="story">' + "".join(f"<li>{escape(x)}</li>" for x in rep.story) + "</ul>")
    s.append(_table(["", ""], [[k, v] for k, v in rep.summary]))
    s.append("</section>")
    s.append('<section id="timeline"><h2>Timeline</h2>')
    s.append(fig("overview"))
    events, left_out = _timeline_view(rep)
    s.append(_table(TIMELINE_HEAD, _rows_timeline(events), [f"k-{e['kind']}" for e in events]))
    if left_out:
        s.append(f"<p><em>{escape(_left_out_note(left_out))}</em></p>")
    s.append("</section>")
    s.append('<section id="windows"><h2>Around each failure and anomaly</h2>')
    if rep.windows:
        s += [fig(f"window-{i + 1}") for i in range(len(rep.windows))]
    else:
        s.append("<p><em>no failures or anomalies recorded</em></p>")
    s.append("</section>")
    s.append('<section id="experts"><h2>Expert load and token drops</h2>')
    s.append(_table(EXPERT_HEAD, _expert_rows(rep)))
    s += [fig("experts"), fig("drops")]
    s.append("</section>")
    s.append('<section id="decisions"><h2>Decisions</h2>')
    if not rep.decisions:
        s.append("<p><em>no decisions linked to this run</em></p>")
    for d in rep.decisions:
        s.append(f'<h3 id="decision-{escape(d.id)}">{escape(d.id)}: {escape(d.title)}</h3>')
        rows = [[k, markdown_html(v) if k in PROSE else v] for k, v in _decision_fields(d)]
        s.append(_table(["field", "value"], rows))
    s.append("</section>")
    s.append('<section id="lineage"><h2>Lineage</h2>')
    s.append(f"<pre>{escape(_lineage_text(rep))}</pre>")
    s.append(fig("lineage"))
    s.append("</section>")
    s.append('<section id="config"><h2>Config and its diffs</h2>')
    s.append(_table(["step", "against", "key", "old", "new"], _diff_rows(rep)))
    s.append("<details open><summary>Resolved config</summary>")
    s.append(_table(["key", "value"], [[k, _cell(v)] for k, v in flatten(rep.config)]))
    s.append("</details></section>")
    s.append('<section id="ladder"><h2>Forecasts and ladder</h2>')
    if rep.forecasts:
        s.append(_table(FORECAST_HEAD, _forecast_rows(rep)))
        s.append(fig("forecast"))
    else:
        s.append("<p><em>no forecast recorded for this run</em></p>")
    if rep.ladder:
        s.append(f"<h3>Ladder {escape(str(rep.info.get('ladder_name')))}</h3>")
        s.append(_table(LADDER_HEAD, _ladder_rows(rep)))
    s.append("</section>")
    nav = " ".join(f'<a href="#{k}">{escape(v)}</a>' for k, v in SECTIONS)
    status = escape(rep.status)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>Post-mortem: {escape(rep.run)}</title><style>{CSS}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head>\n<body>'
        f'<h1>Post-mortem: {escape(rep.run)} <span class="status status-{status}">{status}</span></h1>'
        f"<nav>{nav}</nav>\n" + "\n".join(x for x in s if x) + "\n</body></html>\n"
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

    s = [f"# Post-mortem: {md_escape(rep.run)} ({md_escape(rep.status)})\n"]
    s.append("## Summary\n")
    s += [f"- {md_escape(x)}" for x in rep.story]
    s.append("")
    s.append(_md_table(["", ""], [[k, v] for k, v in rep.summary]))
    s.append("## Timeline\n")
    s.append(fig("overview"))
    events, left_out = _timeline_view(rep)
    s.append(_md_table(TIMELINE_HEAD, _rows_timeline(events)))
    if left_out:
        s.append(f"_{_left_out_note(left_out)}_\n")
    s.append("## Around each failure and anomaly\n")
    if not rep.windows:
        s.append("_no failures or anomalies recorded_\n")
    for i, w in enumerate(rep.windows):
        s.append(f"**{md_escape(w['title'])}** (steps {w['lo']}-{w['hi']})\n")
        s.append(fig(f"window-{i + 1}"))
    s.append("## Expert load and token drops\n")
    s.append(_md_table(EXPERT_HEAD, _expert_rows(rep)))
    s += [fig("experts"), fig("drops")]
    s.append("## Decisions\n")
    if not rep.decisions:
        s.append("_no decisions linked to this run_\n")
    for d in rep.decisions:
        s.append(f"### {md_escape(d.id)}: {md_escape(d.title)}\n")
        s.append(_md_table(["field", "value"], [list(x) for x in _decision_fields(d)]))
    s.append("## Lineage\n")
    s.append(_md_fence(_lineage_text(rep)))
    s.append(fig("lineage"))
    s.append("## Config and its diffs\n")
    s.append(_md_table(["step", "against", "key", "old", "new"], _diff_rows(rep)))
    s.append(_md_table(["key", "value"], [[k, _cell(v)] for k, v in flatten(rep.config)]))
    s.append("## Forecasts and ladder\n")
    if rep.forecasts:
        s.append(_md_table(FORECAST_HEAD, _forecast_rows(rep)))
        s.append(fig("forecast"))
    else:
        s.append("_no forecast recorded for this run_\n")
    if rep.ladder:
        s.append(f"### Ladder {md_escape(rep.info.get('ladder_name'))}\n")
        s.append(_md_table(LADDER_HEAD, _ladder_rows(rep)))
    return "\n".join(x for x in s if x is not None).rstrip("\n") + "\n"


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
