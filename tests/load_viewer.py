"""Viewers without a browser: Streamlit's websocket protocol spoken as a browser would (bench/bench_load.py,
tests/test_load.py).

Each viewer opens a page with a `rerun_script` BackMsg, answers the Live page's fragments' `auto_rerun`, submits the
SQL form, and records what it saw and when (`View`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

RUN = "load-run"
PAGES = ("live", "experts", "sql")
LAST_STEP = re.compile(r"\*\*Last step\*\* ([\d,]+)")
SQL_DONE = re.compile(r"rows in \d+ ms")


# ---------------------------------------------------------------- one viewer over the protocol


@dataclass
class View:
    """One page view by one viewer: what it saw, and when."""

    page: str
    opened: float
    first: float | None = None  # seconds from opening to the first chart (SQL: the query result)
    errors: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    form: float | None = None  # SQL: seconds from opening to the form's submit (the page's own part)
    steps: list[tuple[float, int]] = field(default_factory=list)  # (wall time, "Last step" shown)
    # the server's CPU seconds (given a `cpu` clock, one viewer at a time): from opening to the end of
    # the script run that drew the first chart, and for each auto-refresh from its request to its end
    cpu_view: float | None = None
    cpu_refresh: list[tuple[float, float]] = field(default_factory=list)  # (its fragment's interval, CPU s)
    refreshes: int = 0


def session(port: int):
    """A new session on the dashboard at `port`: its websocket, opened as a browser's is."""
    import websockets

    return websockets.connect(
        f"ws://127.0.0.1:{port}/_stcore/stream",
        subprotocols=["streamlit"],
        origin=f"http://127.0.0.1:{port}",
        max_size=None,
        open_timeout=60,
    )


def _client_state(
    page: str, query: str, page_hash: str = "", fragment: str = "", widgets=(), auto: bool | None = None
):
    """A rerun's client state; `fragment`: rerun that fragment alone (by itself, `auto`, unless told)."""
    # lazy: streamlit's protobufs, which --help does not need
    from streamlit.proto.ClientState_pb2 import ClientState

    cs = ClientState(query_string=query, page_name=page, page_script_hash=page_hash, fragment_id=fragment)
    cs.is_auto_rerun = bool(fragment) if auto is None else auto
    cs.context_info.timezone = "UTC"
    cs.context_info.url = f"http://127.0.0.1/{page}?{query}"
    for w in widgets:
        cs.widget_states.widgets.append(w)
    return cs


def rerun(page: str, query: str, **kw) -> bytes:
    from streamlit.proto.BackMsg_pb2 import BackMsg

    msg = BackMsg()
    msg.rerun_script.CopyFrom(_client_state(page, query, **kw))
    return msg.SerializeToString()


def sql_submit(page_hash: str, area_id: str, button_id: str, sql: str, fragment: str = "") -> bytes:
    """The form's submit as a browser sends it: the console's fragment alone reruns (when it is one)."""
    from streamlit.proto.WidgetStates_pb2 import WidgetState

    area = WidgetState(id=area_id, string_value=sql)
    button = WidgetState(id=button_id, trigger_value=True)
    return rerun("sql", "", page_hash=page_hash, widgets=(area, button), fragment=fragment, auto=False)


async def view_page(
    port: int,
    page: str,
    query: str,
    dwell_s: float,
    sql: str | None = None,
    cpu: Callable[[], float] | None = None,
) -> View:
    """Open `page?query` as a new session, follow it for `dwell_s` seconds, close it.

    `cpu`, the server's CPU clock, is read at the view's opening and script ends (one viewer only).
    """
    from streamlit.proto.Alert_pb2 import Alert
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    v = View(page, time.time())
    t0 = time.perf_counter()
    end = t0 + dwell_s
    page_hash = ""
    ids: dict[str, str] = {}
    submitted = False
    refreshers: dict[str, asyncio.Task] = {}  # fragment id -> its timer (the Live page has two)
    cpu0 = cpu() if cpu else 0.0
    # (interval, the server's CPU clock) when each refresh in flight was asked for, oldest first: the
    # server runs a session's fragment reruns in the order asked
    refresh_cpu: list[tuple[float, float]] = []
    try:
        async with session(port) as ws:
            await ws.send(rerun(page, query))

            async def refresh(interval: float, fragment: str) -> None:
                while True:  # the browser's side of st.fragment(run_every=...)
                    await asyncio.sleep(interval)
                    if cpu:
                        refresh_cpu.append((interval, cpu()))
                    v.refreshes += 1
                    await ws.send(rerun(page, query, page_hash=page_hash, fragment=fragment))

            while (left := end - time.perf_counter()) > 0:
                try:
                    raw = await asyncio.wait_for(ws.recv(), timeout=left)
                except TimeoutError:
                    break
                msg = ForwardMsg()
                msg.ParseFromString(raw)
                kind = msg.WhichOneof("type")
                now = time.perf_counter()
                if kind == "new_session":
                    page_hash = msg.new_session.page_script_hash
                elif kind == "page_info_changed" or kind == "navigation":
                    page_hash = getattr(msg.navigation, "page_script_hash", "") or page_hash
                elif kind == "page_not_found":
                    v.errors.append(f"page not found: {msg.page_not_found.page_name}")
                elif kind == "auto_rerun" and msg.auto_rerun.fragment_id not in refreshers:
                    refreshers[msg.auto_rerun.fragment_id] = asyncio.create_task(
                        refresh(msg.auto_rerun.interval, msg.auto_rerun.fragment_id)
                    )
                elif kind == "script_finished":
                    if cpu and v.first is not None and v.cpu_view is None:
                        v.cpu_view = cpu() - cpu0
                    elif (
                        cpu
                        and refresh_cpu
                        and msg.script_finished == ForwardMsg.FINISHED_FRAGMENT_RUN_SUCCESSFULLY
                    ):
                        interval, c = refresh_cpu.pop(0)
                        v.cpu_refresh.append((interval, cpu() - c))
                    if page == "sql" and not submitted and "area" in ids and "button" in ids:
                        submitted = True
                        v.form = now - t0
                        await ws.send(
                            sql_submit(
                                page_hash,
                                ids["area"],
                                ids["button"],
                                sql or "SELECT 1",
                                ids.get("fragment", ""),
                            )
                        )
                elif kind == "delta" and msg.delta.HasField("new_element"):
                    el = msg.delta.new_element
                    what = el.WhichOneof("type")
                    chart = (
                        what == "plotly_chart"
                        or (  # the Live page's in-place charts: dashboard.live_chart
                            what == "bidi_component"
                            and el.bidi_component.component_name == "observatory_live_chart"
                        )
                    )
                    if chart and page != "sql" and v.first is None:
                        v.first = now - t0
                    elif what == "markdown":
                        body = el.markdown.body
                        if m := LAST_STEP.search(body):
                            v.steps.append((time.time(), int(m.group(1).replace(",", ""))))
                        elif page == "sql" and submitted and v.first is None and SQL_DONE.search(body):
                            v.first = now - t0
                    elif what == "exception":
                        v.errors.append(f"exception {el.exception.type}: {el.exception.message[:200]}")
                    elif what == "alert":
                        body = el.alert.body
                        if "busy" in body.lower():
                            v.busy.append(body[:200])
                        elif el.alert.format == Alert.ERROR:
                            v.errors.append(f"error: {body[:200]}")
                    elif what == "text_area":
                        ids["area"] = el.text_area.id
                        ids["fragment"] = msg.delta.fragment_id  # "" outside a fragment
                    elif what == "button" and el.button.is_form_submitter:
                        ids["button"] = el.button.id
    except Exception as e:  # a dropped or refused connection is an error the viewer sees
        v.errors.append(f"connection: {type(e).__name__}: {e}")
    finally:
        for refresher in refreshers.values():
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await refresher
    if v.first is None and not v.errors and not v.busy:
        v.errors.append(f"no first chart within {dwell_s:.0f} s")
    return v


def page_query(page: str) -> str:
    return {"live": f"run={RUN}", "experts": f"run={RUN}", "sql": ""}[page]


async def viewer(
    port: int,
    stop_at: float,
    seed: int,
    out: list[View],
    sqls: list[str],
    dwell=(8.0, 16.0),
    arrive_s: float = 0.0,
):
    """One viewer until `stop_at`: page after page (Live, Experts, SQL in turn from a random start), the first
    opened `arrive_s` seconds after the load starts."""
    rng = random.Random(seed)
    i = rng.randrange(len(PAGES))
    await asyncio.sleep(arrive_s)
    while (left := stop_at - time.time()) > dwell[0]:  # no view cut shorter than the shortest dwell
        page = PAGES[i % len(PAGES)]
        i += 1
        sql = sqls[rng.randrange(len(sqls))] if page == "sql" else None
        out.append(await view_page(port, page, page_query(page), min(rng.uniform(*dwell), left), sql))


async def run_viewers(
    port: int, n: int, duration_s: float, sqls: list[str], dwell=(8.0, 16.0), ramp_s: float = 0.0
) -> list[View]:
    """`n` viewers at once until the hard stop; they arrive evenly over the first `ramp_s` seconds (0: all at once)."""
    out: list[View] = []
    stop_at = time.time() + duration_s
    await asyncio.gather(*(viewer(port, stop_at, k, out, sqls, dwell, ramp_s * k / n) for k in range(n)))
    return out
