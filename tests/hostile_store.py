"""A store holding every optional field of every event kind at once, each free-text field a planted payload.

`write_hostile_runs(runs_dir)` builds it from `observatory.events.KINDS`: a field of type
`str` or `str_list` gets `planted(where)` (Markdown, HTML, Streamlit directives, image and
link URLs to a foreign host, and a name that ends like another widget's key), an object its
known shape with planted strings, enums a valid value. Two runs (`HOSTILE`, `HOSTILE2`) in
two ladders with the same group and project, so the Runs page's filters, the by-ladder view,
Compare and Ladder all have something to show. A new kind or field in KINDS is planted
without a change here (its type decides); a kind whose shape is not known fails loudly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from observatory.events import ALERT_STATES, KINDS, PHASES, SEVERITIES, STATUSES

FOREIGN = "evil.invalid"  # a visitor's browser must send no request here
MARKS = {  # what each planted part renders as if it is not escaped: the markers the tests look for
    "bold": "**BOLDMK{w}**",
    "red": ":red[REDMK{w}]",
    "icon": ":material/rocket_launch:",
    "image": f"![IMGMK{{w}}](http://{FOREIGN}/i{{w}}.png)",
    "link": f"[LINKMK{{w}}](https://{FOREIGN}/l{{w}})",
    "html": f"<b>HTMLMK{{w}}</b><img src=http://{FOREIGN}/h{{w}}.png>",
    "heading": "\n# HEADMK{w}",
}
HOSTILE, HOSTILE2, DECISION = "hostile", "hostile-2", "hostile-decision"
T0 = 1.7e9


def planted(where: str) -> str:
    """The payload for one field (`where` names it, so a finding says which field leaked)."""
    w = "".join(c for c in where if c.isalnum())[:24]
    return f"{where} " + " ".join(m.format(w=w) for m in MARKS.values())


_ENUMS = {
    ("run_end", "status"): STATUSES,
    ("anomaly", "severity"): SEVERITIES,
    ("alert", "severity"): SEVERITIES,
    ("alert", "state"): ALERT_STATES,
    ("phase", "phase"): PHASES,
    ("heartbeat", "phase"): PHASES,
}


def _object(kind: str, name: str, run: str, ladder: str) -> Any:
    p = lambda f: planted(f"{kind}.{name}.{f}")  # noqa: E731
    shapes = {
        ("run_start", "config"): {
            "model": {"d": 64, "note": p("model.note")},
            p("key"): p("value"),
            "lr": 1e-3,
        },
        ("run_start", "parent"): {"run": HOSTILE2 if run == HOSTILE else HOSTILE, "step": 1},
        ("run_start", "ladder"): {"name": ladder, "rung": p("rung"), "seed": 1},
        ("run_start", "code"): {"commit": p("commit"), "dirty": True},
        ("run_start", "data"): {"name": p("name"), "fingerprint": p("fp"), "tokens": 10**6},
        ("run_start", "mesh"): {"data": 1, "expert": 1, "processes": 1, "devices": 1},
        ("run_start", "model"): {"params_total": 10**6, "params_active": 10**5, "flops_per_token": 6e5},
        ("run_start", "source"): {"trainer": p("trainer"), "version": p("version")},
        ("config_diff", "against"): {"run": HOSTILE2 if run == HOSTILE else HOSTILE, "step": 0},
        ("config_diff", "changes"): {p("key"): [p("old"), p("new")], "lr": [1e-3, 2e-3]},
        ("forecast", "source"): {"ladder": ladder, "fit": p("fit")},
        ("alert", "finding"): {"detector": p("detector"), "message": p("message")},
    }
    if (kind, name) not in shapes:
        raise AssertionError(f"hostile_store: no shape for {kind}.{name}; add one")
    return shapes[(kind, name)]


def _value(kind: str, f, run: str, ladder: str, step: int) -> Any:
    if (kind, f.name) in _ENUMS:
        return _ENUMS[(kind, f.name)][0 if kind != "anomaly" else 2]
    t = f.type
    if t == "str":
        return planted(f"{kind}.{f.name}")
    if t == "str_list":
        return [planted(f"{kind}.{f.name}.0"), "plain"]
    if t == "object":
        return _object(kind, f.name, run, ladder)
    if t in ("int", "number"):
        return 1 if t == "int" else 1.5
    if t == "bool":
        return False
    if t == "int_list":
        return [max(step - 2, 0), step] if f.name == "window" else [5, 3, 2, 6]
    if t == "number_list":
        return [0.0, 1.0, 2.0, 3.0, 4.0]
    if t == "list":
        return [{"step": 40, "value": 2.0, "low": 1.8, "high": 2.2}]
    raise AssertionError(f"hostile_store: no value for {kind}.{f.name} of type {t}")


def _data(kind: str, run: str, ladder: str, step: int) -> dict:
    data = {f.name: _value(kind, f, run, ladder, step) for f in KINDS[kind].fields}
    if kind == "histogram":
        data["bucket_counts"] = [1, 2, 3, 4]
    if kind == "expert_load":
        data |= {"layer": 0, "routed": [5, 3, 2, 6], "dropped": [0, 1, 0, 2]}
    if kind == "decision":
        data |= {
            "id": DECISION,
            "title": planted("decision.title"),
            "kind": "intervention",
            "status": "running",
            "hypothesis": planted("decision.hypothesis"),
            "author": planted("decision.author"),
            "action": planted("decision.action"),
            "runs": [{"run": run, "step": step}],
        }
    if kind == "summary":
        data = {planted("summary.key"): planted("summary.value"), "final/loss": 1.0}
    if kind == "metrics":
        data = {"train/loss": 3.0 - 0.01 * step, f"eval/{planted('metric.name')}": 1.0}
    if kind == "run_end":
        data["final_step"] = 30
    return data


def write_hostile_runs(runs_dir: Path) -> list[Path]:
    """Two runs whose every event kind has every field, free text planted; returns their logs."""
    paths = []
    for run, ladder in ((HOSTILE, planted("ladder.name")), (HOSTILE2, planted("ladder.name") + "_rungs")):
        events = [("run_start", _data("run_start", run, ladder, 0) | {"group": "g", "project": "p"}, None)]
        for step in range(31):
            events.append(("metrics", _data("metrics", run, ladder, step), step))
            if step == 10:
                others = [k for k in KINDS if k not in ("run_start", "metrics", "run_end")]
                events += [(k, _data(k, run, ladder, step), step) for k in others]
        events.append(("run_end", _data("run_end", run, ladder, 30), 30))
        lines = [
            json.dumps(
                {"v": 1, "run": run, "kind": k, "step": st, "t": T0 + i, "host": 0, "seq": i, "data": d}
            )
            for i, (k, d, st) in enumerate(events)
        ]
        path = runs_dir / run / "events.0.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(path)
    return paths
