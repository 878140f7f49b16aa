"""Decisions: every experiment, intervention and policy with its current state and its history.

Read-only: decisions are written with `observatory decide` (or the Python API),
as events. The chosen decision lives in the URL (`?decision=ID`).
"""

from __future__ import annotations

import datetime as _dt
import json

import streamlit as st

from observatory import decisions as dec
from observatory.dashboard.cache import query
from observatory.dashboard.widgets import page_opening
from observatory.decisions import markdown as decisions_md
from observatory.markup import md_escape

STATUS_ICON = {"proposed": "📝", "running": "🟢", "succeeded": "✅", "failed": "❌", "abandoned": "⏹️"}


def _all(con) -> dict:
    """Every decision as a plain dict (cacheable), oldest first, and the records that are not valid."""
    unreadable: list[tuple[str, str]] = []
    ds = [d.to_dict() for d in dec.list_decisions(con, unreadable=unreadable)]
    return {"decisions": ds, "unreadable": unreadable}


def _history(con, decision_id: str) -> list[dict]:
    return dec.history(con, decision_id)


def _when(t) -> str:
    return "-" if t is None else _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _change_time(h: dict) -> float | None:
    """When a history event's change was made: its record's `updated` (else `created`), else when written."""
    for name in ("updated", "created"):
        t = h["data"].get(name)
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            return float(t)
    return h["t"]


def _links(d: dict) -> str:
    return ", ".join(
        r["run"] + (f"@{r['step']}" if r.get("step") is not None else "") for r in d.get("runs", [])
    )


def filter_decisions(ds: list[dict], statuses=(), kinds=(), text: str = "") -> list[dict]:
    words = text.lower().split()
    out = []
    for d in ds:
        hay = " ".join([d["id"], d["title"], _links(d), d.get("author", "")]).lower()
        if statuses and d["status"] not in statuses:
            continue
        if kinds and d["kind"] not in kinds:
            continue
        if words and not all(w in hay for w in words):
            continue
        out.append(d)
    return out


def _detail(d: dict) -> None:
    st.subheader(f"{STATUS_ICON.get(d['status'], '•')} {md_escape(d['title'])}")
    st.caption(
        f"{md_escape(d['id'])} · {md_escape(d['kind'])} · {md_escape(d['status'])} · "
        f"by {md_escape(d.get('author') or '-')} · "
        f"created {_when(d.get('created'))} · updated {_when(d.get('updated'))}"
    )
    for name in ("hypothesis", "goal", "action", "outcome", "follow_up"):
        if d.get(name):
            st.markdown(f"**{name.replace('_', '-').capitalize()}**")
            st.text(d[name])  # text, not markdown: records come from anyone with CLI access
    facts = []
    if d.get("forecast"):
        f = d["forecast"]
        facts.append(("forecast", f"{f['metric']} = {f['value']:g} {f.get('assumptions', '')}".strip()))
    if d.get("trigger"):
        t = d["trigger"]
        facts.append(("trigger", f"{t['metric']} {t.get('rule', '')} at step {t.get('step', '-')}"))
    if d.get("runs"):
        facts.append(("runs", _links(d)))
    for k, (old, new) in (d.get("config_diff") or {}).items():
        facts.append((f"config {k}", f"{old!r} → {new!r}"))
    for a in d.get("alternatives", []):
        facts.append(("alternative", a))
    for e in d.get("evidence", []):
        facts.append(("evidence", e if isinstance(e, str) else json.dumps(e, sort_keys=True)))
    if d.get("cost"):
        facts.append(("cost", ", ".join(f"{k} {v:g}" for k, v in d["cost"].items())))
    if facts:
        st.dataframe([{"field": k, "value": v} for k, v in facts], hide_index=True, width="stretch")
    hist = query(_history, d["id"])
    st.markdown(f"**History** ({len(hist)} events)")
    st.dataframe(
        [
            {
                # the change's own time (`updated`, or `created` for the first; `decide --at` sets them), as
                # the header's created and updated are: a history written down later agrees with them
                "time": _when(_change_time(h)),
                "recorded": _when(h["t"]),
                "written to": f"{h['run']} (host {h['host']}, seq {h['seq']})",
                "fields": ", ".join(k for k in h["data"] if k not in ("id", "created", "updated")),
                "status": h["data"].get("status", ""),
            }
            for h in hist
        ],
        hide_index=True,
        width="stretch",
    )
    md = decisions_md.dumps(dec.Decision.from_dict(d), [h["data"] for h in hist])
    st.download_button("Download as Markdown", md, file_name=f"{d['id']}.md", mime="text/markdown")


def render() -> None:
    found = page_opening(
        "Decisions",
        "Experiments, interventions and policies, recorded as events: each change is kept. "
        "Write them with `observatory decide new|update`; keep them in git with `decide export`.",
        _all,
    )
    if found is None:
        return
    bad = found["unreadable"]  # someone else's records: named, escaped, bounded, and the rest still shown
    if bad:
        lines = [f"- {md_escape(did[:128])}: {md_escape(reason[:300])}" for did, reason in bad[:5]]
        more = f"\n- and {len(bad) - 5} more" if len(bad) > 5 else ""
        st.warning(f"{len(bad)} decision record(s) not shown, not valid:\n" + "\n".join(lines) + more)
    ds = found["decisions"]
    if not ds:
        st.info("No decisions yet. Record one: `observatory decide new --title ... --run RUN@STEP`.")
        return
    c1, c2, c3 = st.columns([2, 2, 3])
    statuses = c1.multiselect("Status", dec.STATUSES, key="dec_status")
    kinds = c2.multiselect("Kind", dec.KINDS, key="dec_kind")
    text = c3.text_input("Search (id, title, run, author)", key="dec_text")
    shown = filter_decisions(ds, statuses, kinds, text)
    counts = {s: sum(d["status"] == s for d in ds) for s in dec.STATUSES}
    st.caption(" · ".join(f"{STATUS_ICON[s]} {s} {n}" for s, n in counts.items() if n))
    st.dataframe(
        [
            {
                "id": d["id"],
                "status": f"{STATUS_ICON.get(d['status'], '')} {d['status']}",
                "kind": d["kind"],
                "title": d["title"],
                "runs": _links(d),
                "updated": _when(d.get("updated")),
            }
            for d in reversed(shown)
        ],
        hide_index=True,
        width="stretch",
    )
    if not shown:
        return
    ids = [d["id"] for d in reversed(shown)]
    wanted = st.query_params.get("decision")
    choice = st.selectbox("Decision", ids, index=ids.index(wanted) if wanted in ids else 0, key="dec_pick")
    if st.query_params.get("decision") != choice:
        st.query_params["decision"] = choice
    _detail(next(d for d in shown if d["id"] == choice))
