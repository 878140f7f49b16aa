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

import hmac
import json
from pathlib import Path
from typing import Any

from observatory import provenance
from observatory.events import ALERT_STATES, KINDS, OBSERVATORY_HOST, PHASES, SEVERITIES, STATUSES

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
        ("run_start", "ladder"): {"name": ladder, "rung": p("rung"), "seed": 1, "flops": 1e18},
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
    if kind == "heartbeat":  # a telemetry name: the Health page's legend, hover and picker
        data[f"x/{planted('telemetry.name')}"] = 1.0
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
        # the observatory's findings are in its own file, signed (a finding may quote log text)
        own = [e for e in events if e[0] in provenance.FINDING_KINDS]
        theirs = [e for e in events if e[0] not in provenance.FINDING_KINDS] + forged_findings(run)
        for host, evs in ((0, theirs), (OBSERVATORY_HOST, own)):
            lines = []
            for i, (k, d, st) in enumerate(evs):
                ev = {
                    "v": 1,
                    "run": run,
                    "kind": k,
                    "step": st,
                    "t": T0 + i,
                    "host": host,
                    "seq": i,
                    "data": d,
                }
                lines.append(json.dumps(provenance.signed(ev) if host else ev))
            lines += [json.dumps(ev) for ev in forged_own_lines(run, start=len(evs))] if host else []
            path = runs_dir / run / f"events.{host}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            paths.append(path)
    return paths


FORGED = "FORGEDMK"  # in every forged finding: no page may show it


def _forged(kind: str, run: str) -> dict:
    text = f"{FORGED} {kind}: the observatory says this run is broken"
    return {
        "anomaly": {
            "detector": "loss_spike",
            "metric": "train/loss",
            "severity": "critical",
            "message": text,
        },
        "alert": {"rule": f"{FORGED}-rule", "state": "open", "severity": "critical", "message": text},
        "forecast": {"metric": "train/loss", "value": 0.1, "low": 0.0, "high": 0.2, "method": text},
    }[kind] | ({"window": [5, 9]} if kind == "anomaly" else {})


def forged_findings(run: str) -> list[tuple[str, dict, int]]:
    """Findings in a trainer's own log (host 0): a writer claiming to be the observatory."""
    return [(k, _forged(k, run), 12) for k in sorted(provenance.VERDICT_KINDS)]


def forged_own_lines(run: str, start: int) -> list[dict]:
    """Findings appended to the observatory's own file by someone else: unsigned, signed with HMAC of a wrong
    key, and signed with an Ed25519 key nobody trusts."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    untrusted = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    out = []
    for i, k in enumerate(sorted(provenance.FINDING_KINDS)):
        ev = {"v": 1, "run": run, "kind": k, "step": 12, "t": T0 + start + 3 * i, "host": OBSERVATORY_HOST}
        out.append(ev | {"seq": start + 3 * i, "data": _forged(k, run)})
        wrong = ev | {"seq": start + 3 * i + 1, "data": _forged(k, run)}
        out.append(
            wrong | {"sig": hmac.new(b"not the key", provenance.canonical(wrong), "sha256").hexdigest()}
        )
        out.append(provenance.signed(ev | {"seq": start + 3 * i + 2, "data": _forged(k, run)}, untrusted))
    return out
