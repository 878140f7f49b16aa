"""Health: every host of a run, from their heartbeats: who is silent, who is slow, who is running out of memory.

First the run's goodput (where its wall time went) and its open alerts; then the hosts × time
heatmap of one measure (seconds per step from each host's own heartbeats, or any telemetry name:
CPU, RSS, accelerator memory, ...), rows thinned to readable ticks at 1,000 hosts as the Experts page
does at 384 experts; then the hosts table, the silent ones first; and one host's every telemetry
name over time, picked from the table's host list (or `?host=`).
"""

from __future__ import annotations

import re
import time

import numpy as np
import streamlit as st

from observatory import settings
from observatory.alerts import open_alerts
from observatory.dashboard.cache import derive, query_all
from observatory.dashboard.charts import _ticks, scatter
from observatory.dashboard.runs_table import is_running, run_row
from observatory.dashboard.widgets import pick_run, show_chart
from observatory.markup import md_escape, plot_text
from observatory.queries import health as qh
from observatory.queries.goodput import describe_goodput, goodput

NAME_KEY = "health_name"


def _alerts(con, run: str) -> list[dict]:
    return sorted(
        open_alerts(con, [run]).values(), key=lambda d: (d.get("severity") != "critical", d.get("rule", ""))
    )


def _goodput(con, run: str) -> dict | None:
    return goodput(con, [run]).get(run)


def host_heatmap(m: dict) -> dict:
    """hosts down, minutes since the run's first heartbeat across (the whole run), one measure; a figure dict."""
    hosts = [str(h) for h in m["hosts"]]
    height = int(min(800, max(260, 6 * len(hosts) + 110)))
    t = np.asarray(m["t"])
    unit, scale = unit_of(m["name"])
    return {
        "data": [
            {
                "type": "heatmap",
                "z": (m["z"] / scale).astype(np.float32),
                "x": ((t - m["t0"]) / 60.0).round(3),
                "y": hosts,
                "colorscale": "Viridis",
                "hovertemplate": "host %{y}, minute %{x:.1f}: %{z:.4g}" + f" {unit}<extra></extra>",
                "colorbar": {"title": {"text": unit}},
            }
        ],
        "layout": {
            "title": {"text": plot_text(f"{m['name']} ({unit}), every host"), "font": {"size": 14}},
            "height": height,
            "margin": {"l": 50, "r": 10, "t": 36, "b": 40},
            "xaxis": {
                "title": {"text": "minutes since the first heartbeat"},
                "range": [0, max((m["t1"] - m["t0"]) / 60.0, 1e-3)],
            },
            "yaxis": {
                "title": {"text": "host"},
                "type": "category",
                "autorange": "reversed",
                **_ticks(hosts, {}, height - 76, 14),
            },
        },
    }


def unit_of(name: str) -> tuple[str, float]:
    """A telemetry name's unit as shown, and what its raw value is divided by: bytes in GB, percentages."""
    if name == qh.STEP_TIME:
        return "s", 1.0
    if name.endswith("_bytes"):
        return "GB", 1e9
    if name.endswith("_percent") or name.endswith("/util"):
        return "%", 1.0
    if name.endswith("_w"):
        return "W", 1.0
    return "value", 1.0


def host_figures(series: dict, host: int) -> list[dict]:
    """One host's every telemetry name over time: a chart per unit (GB, %, W, ...), one line per name, so
    no axis mixes bytes and percentages."""
    groups: dict[str, list[str]] = {}
    for name in series:
        groups.setdefault(unit_of(name)[0], []).append(name)
    t_first = min(d["t"][0] for d in series.values() if len(d["t"]))
    figs = []
    for unit, names in groups.items():
        scale = unit_of(names[0])[1]
        data = [
            scatter(
                x=(np.asarray(series[n]["t"], dtype=float) - t_first) / 60.0,
                y=np.asarray(series[n]["value"], dtype=float) / scale,
                mode="lines",
                name=plot_text(n),
                hovertemplate="minute %{x:.1f}: %{y:.4g} " + unit + "<extra>" + plot_text(n) + "</extra>",
            )
            for n in names
        ]
        figs.append(
            {
                "data": data,
                "layout": {
                    "title": {"text": f"Host {host}: telemetry in {unit}", "font": {"size": 14}},
                    "height": 300,
                    "margin": {"l": 50, "r": 10, "t": 36, "b": 40},
                    "xaxis": {"title": {"text": "minutes since its first heartbeat"}},
                    "yaxis": {"title": {"text": unit}, "rangemode": "tozero"},
                    "legend": {"orientation": "h", "y": -0.3},
                },
            }
        )
    return figs


def hosts_table(hosts: dict, now: float) -> dict[str, list]:
    """The hosts table, the silent first: "silent for" only past two heartbeat intervals (a running host
    beats every `heartbeat_s`, so 29 s since its last beat is not silence), memory in GB."""
    every = float(settings.get("heartbeat_s")) or 30.0
    age = np.asarray([now - t for t in hosts["last_t"]], dtype=float)
    table: dict[str, list] = {
        "host": hosts["host"],
        "silent for": [_duration(a) if a > 2 * every else "—" for a in age],
        "step": hosts["step"],
        "phase": hosts["phase"],
    }
    for n in qh.SUMMARY_NAMES:
        if any(v is not None for v in hosts[n]):
            unit, scale = unit_of(n)
            table[f"{n.split('/', 1)[1].removesuffix('_bytes')} ({unit})"] = [
                "—" if v is None else round(v / scale, 2) for v in hosts[n]
            ]
    order = np.argsort(-age, kind="stable")
    return {k: [v[i] for i in order] for k, v in table.items()}


def _duration(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if s < 172800 else f"{s / 86400:.1f} days"


def _alert_box(a: dict) -> None:
    """One open alert as an error or warning box; its message is a log's text (a metric name): inert."""
    host = f" host {a['host']}" if a.get("host") is not None else ""
    (st.error if a.get("severity") == "critical" else st.warning)(
        md_escape(f"{a.get('rule', '?')}{host}: {a.get('message', '')}"),
        icon=":material/notifications_active:",
    )


def linked_host(raw, ids: list[int]) -> int | None:
    """The host `?host=` asks for: a plain ASCII integer (not `²`, `٣`, `+1`, `1e3`) that is one of `ids`;
    else None (ignored, with a note)."""
    if not isinstance(raw, str) or not re.fullmatch(r"[0-9]{1,6}", raw):
        return None
    return int(raw) if int(raw) in ids else None


def render() -> None:
    st.title("Health")
    run = pick_run()
    if run is None:
        return
    name = st.session_state.get(NAME_KEY, qh.STEP_TIME)
    live = is_running(run_row(run))
    view, alerts, gp = query_all(
        (qh.health_view, run, name), (_alerts, run), (_goodput, run), keep_fresh=live
    )
    if gp is not None and gp["total_s"]:
        st.markdown(f"**Goodput:** {describe_goodput(gp)}.")
    for a in alerts:
        _alert_box(a)
    hosts = view["hosts"]
    if not hosts["host"]:
        st.info(
            "This run's processes sent no heartbeats (the trainer, `observatory.init` and the Levanter "
            "tracker send one every `heartbeat_s`)."
        )
        return
    st.caption(f"{len(hosts['host'])} host(s) sent heartbeats.")
    if name not in view["names"]:
        name = qh.STEP_TIME
    st.selectbox("Measure", view["names"], index=view["names"].index(name), key=NAME_KEY)
    if view["names_total"] > len(view["names"]) - 1:
        st.caption(
            f"The first {len(view['names']) - 1} of {view['names_total']:,} telemetry names are listed."
        )
    if view["matrix"] is not None:
        show_chart(derive(host_heatmap, view["matrix"]), key=f"health_map_{run}")
    st.dataframe(hosts_table(hosts, time.time()), hide_index=True, key="health_hosts")
    ids = hosts["host"]
    wanted = linked_host(st.query_params.get("host"), ids)
    if wanted is None and st.query_params.get("host"):
        st.caption(md_escape(f"?host={st.query_params.get('host')[:40]} ignored: not a host of this run."))
    host = st.selectbox(
        "One host's telemetry", ids, key="health_host", index=ids.index(wanted) if wanted is not None else 0
    )
    if st.query_params.get("host") != str(host):
        st.query_params["host"] = str(host)
    series, total = query_all(
        (qh.host_series, run, int(host)), (qh.host_names_total, run, int(host)), keep_fresh=live
    )
    for i, fig in enumerate(derive(host_figures, series, int(host)) if series else []):
        show_chart(fig, key=f"health_host_{run}_{i}")
    if total > len(series):
        st.caption(f"Host {host} sent {total:,} telemetry names; the first {len(series)} are drawn.")
