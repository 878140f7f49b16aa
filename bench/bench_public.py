"""Safe on the public internet: what a hostile visitor gets out of the dashboard's server.

Sections (each prints its own figures; `--only NAME` runs one):

- `sql`: the hostile SQL corpus of tests/sql_corpus.py through the user-SQL door, under
  a 1000 ms / 256 MB limit. Prints the refused / harmless / harmful counts, every harmful
  statement with its reasons, and the worst time and peak memory of any statement as a
  ratio to its limit (goal: 0 harmful, both ratios at most 1.5).

- `secrets`: the redaction classes of issue 36 (tests/test_redact.py's generator: every secret
  key in every context -- query string, after another pair, header, JSON -- with every value
  shape, and tokens glued to word characters). Harmful: any part of a value left.
- `planted`: tests/public_secrets.py's needles (a shape of each detect-secrets rule among them) in a
  foreign log and in `init(config=…)`: harmful when one is in the store or in the log the writer wrote.
- `text`: every page and view over tests/hostile_store.py (every field of every event kind
  planted with Markdown, HTML, Streamlit directives, foreign images and links) under
  AppTest: each Markdown text with a planted part is harmless when it would render none of
  it, harmful when it would (or the page raised).
- `params`: every query parameter of every page with 15 hostile values: harmful when the
  page raises.
- `types`: every DuckDB type (test_all_types() and the rest) through the SQL console's table
  and CSV, and values Python cannot hold (`INTERVAL 100000000 YEARS`): harmful when a column
  raises or a refusal blames a limit.
- `forged`: the forged findings of tests/hostile_store.py: refused when a rejected line;
  harmful when stored as the observatory's or shown by a page.
- `memory`: 200 distinct 0.8 MB answers through the dashboard's cache bounded at 4 MB:
  harmful when the cache holds more; prints the RSS growth.
- `server`: a real server started as `observatory dashboard` starts it, and chromium: its
  internal and static endpoints (refused: not served, the app's page instead; harmful: a server
  path, an installation id or Streamlit's metrics in the answer), and every websocket frame and
  HTTP body of each page (harmful: a server path or an installation id in it).

- `links`: a real server over the hostile store and chromium opening 160 distinct hostile deep links
  (`BENCH_LINKS`) with the dashboard cache bounded at 32 MB: the server's RSS after each quarter;
  harmful when the last quarter still grows it (more than 8 MB, or a tenth of the first quarter's).
  `BENCH_LINKS_SAME=1`: the control, the same eight links over and over.

- `load`: `bench/bench_load.py` (20 viewers on Live, Experts and SQL for 2 minutes while a
  run trains: time to first chart against one viewer, errors, busy, staleness, RSS).
- `faults`: `bench/bench_public_faults.py` (the fault matrix: each scenario, recovered or
  not, events lost).

    python bench/bench_public.py [--only sql|secrets|planted|text|params|types|forged|memory|server|links|load|faults] [--verbose]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from dashboard_fixtures import make_store  # noqa: E402  (after the sys.path lines)
from sql_corpus import CORPUS, MEMORY_LIMIT_MB, TIME_LIMIT_MS, Probe, limits_env  # noqa: E402


def section_sql(verbose: bool) -> bool:
    """The SQL corpus; True when nothing was harmful and every statement stayed within 1.5x its limits."""
    os.environ.update(limits_env())
    with tempfile.TemporaryDirectory() as tmp:
        _, db = make_store(Path(tmp))
        probe = Probe(db)
        try:
            verdicts = [probe.judge(case) for case in CORPUS]
        finally:
            probe.close()
    counts = {k: sum(v.outcome == k for v in verdicts) for k in ("refused", "harmless", "harmful")}
    print(f"SQL corpus: {len(verdicts)} statements (limits {TIME_LIMIT_MS} ms, {MEMORY_LIMIT_MB} MB)")
    print(f"  refused {counts['refused']}, harmless {counts['harmless']}, harmful {counts['harmful']}")
    for v in verdicts:
        if v.outcome == "harmful":
            print(f"  HARMFUL {v.case.label}: {'; '.join(v.reasons)}")
        elif not v.expected:
            print(f"  unexpected {v.outcome}: {v.case.label}: {v.message[:120]}")
        elif verbose:
            print(
                f"  {v.outcome:8s} {v.case.label:26s} {v.elapsed_ms:7.0f} ms {v.peak_memory_mb:7.1f} MB  {v.message[:90]!r}"
            )
    slowest = max(verdicts, key=lambda v: v.elapsed_ms)
    biggest = max(verdicts, key=lambda v: v.peak_memory_mb)
    t_ratio = slowest.elapsed_ms / TIME_LIMIT_MS
    m_ratio = biggest.peak_memory_mb / MEMORY_LIMIT_MB
    print(f"  worst time:   {slowest.elapsed_ms:.0f} ms = {t_ratio:.2f}x the limit ({slowest.case.label})")
    print(
        f"  worst memory: {biggest.peak_memory_mb:.0f} MB = {m_ratio:.2f}x the limit ({biggest.case.label})"
    )
    return counts["harmful"] == 0 and t_ratio <= 1.5 and m_ratio <= 1.5


def _counts(name: str, tried: int, refused: int, harmless: int, harmful: list[str], verbose: bool) -> bool:
    print(f"{name}: tried {tried}, refused {refused}, harmless {harmless}, harmful {len(harmful)}")
    for h in harmful if verbose else harmful[:10]:
        print(f"  HARMFUL {h}")
    return not harmful


def section_secrets(verbose: bool) -> bool:
    """Each secret shape of test_redact's generator through scrub_text: refused = the whole value hidden."""
    from test_redact import _CONTEXTS, _KEYS, _VALUES, _value_parts

    from observatory.redact import scrub_text

    tried, harmful = 0, []
    for context in _CONTEXTS:
        for key in _KEYS:
            for v in _VALUES:
                if '"' in context and "&" in v:
                    continue
                tried += 1
                out, _ = scrub_text(f"before {context.format(k=key, v=v)}\nafter")
                if [p for p in _value_parts(v) if p in out]:
                    harmful.append(repr(out[:120]))
    glued = [
        "ghp_0123456789ABCDEFGHIJKLMNOPQRSTUVWXyz",
        "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
        "AKIAIOSFODNN7EXAMPLE",
    ]
    for token in glued:
        for glue in ("k_", "%3D", "x", "9", "/"):
            tried += 1
            out, _ = scrub_text(f"name {glue}{token} end")
            if token[6:16] in out:
                harmful.append(repr(out))
    return _counts("secrets", tried, tried - len(harmful), 0, harmful, verbose)


def section_planted(verbose: bool) -> bool:
    """tests/public_secrets.py's needles planted in a foreign run (every place a log holds text, and a shape of
    each detect-secrets rule in its context): harmful = a needle found in the store (every column of every
    table, as text) or, for the config's and notes' needles, in the log `init(config=…)` writes."""
    from public_secrets import IN_CONFIG, SECRETS, foreign_config, leaks, write_foreign_run

    from observatory.pipeline import ingest
    from observatory.store import connect
    from observatory.writer import init

    with tempfile.TemporaryDirectory() as tmp:
        runs, db = Path(tmp) / "runs", Path(tmp) / "store.duckdb"
        write_foreign_run(runs)
        ingest(runs, db, emit=None)
        with connect(db) as con:
            tables = [
                t for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall()
            ]
            text = "\n".join(repr(r) for t in tables for r in con.execute(f'SELECT * FROM "{t}"').fetchall())
        stored = leaks(text)
        run = init(
            run_id="w",
            runs_dir=Path(tmp) / "w",
            config=foreign_config(),
            notes=f"my password is {SECRETS['prose']} for now",
            install_signal_handlers=False,
        )
        run.finish()
        written = leaks(
            (Path(tmp) / "w" / "w" / "events.0.jsonl").read_text(), {k: SECRETS[k] for k in IN_CONFIG}
        )
    print(
        f"planted: {len(SECRETS)} needles in a foreign log, {len(stored)} stored: {' '.join(stored) or '-'}"
    )
    print(
        f"  init(config=…): {len(IN_CONFIG)} needles, {len(written)} in the log written: {' '.join(written) or '-'}"
    )
    harmful = [f"stored: {n}" for n in stored] + [f"written: {n}" for n in written]
    return _counts(
        "planted",
        len(SECRETS) + len(IN_CONFIG),
        0,
        len(SECRETS) + len(IN_CONFIG) - len(harmful),
        harmful,
        verbose,
    )


def _hostile_env() -> None:
    from hostile_store import write_hostile_runs

    from observatory.pipeline import ingest

    tmp = Path(tempfile.mkdtemp(prefix="bench_public_hostile_"))
    os.environ.setdefault("OBSERVATORY_KEY_FILE", str(tmp / "observatory.key"))  # not the user's key
    write_hostile_runs(tmp / "runs")
    ingest(tmp / "runs", tmp / "store.duckdb", emit=None)
    os.environ["OBSERVATORY_DB"] = str(tmp / "store.duckdb")


def _page(name: str, query: dict):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_string(
        f"from observatory.dashboard.pages import {name}\n{name}.render()\n", default_timeout=120
    )
    for k, v in query.items():
        at.query_params[k] = v
    return at.run()


def section_text(verbose: bool) -> bool:
    from test_hostile_pages import PAGES, inert, markdown_texts

    _hostile_env()
    tried = harmless = 0
    harmful = []
    for name, query in PAGES:
        at = _page(name, query)
        if at.exception:
            harmful.append(f"{name} {query}: raised")
        for t in markdown_texts(at):
            if "MK" in t or "rocket_launch" in t:
                tried += 1
                bad = inert(t)
                harmless += not bad
                harmful += [f"{name} {query}: {b}" for b in bad[:1]]
    return _counts("text", tried, 0, harmless, harmful, verbose)


def section_params(verbose: bool) -> bool:
    from test_hostile_pages import BAD_VALUES, HOSTILE, PARAMS

    _hostile_env()
    tried, harmful = 0, []
    for name, keys in PARAMS.items():
        for key in keys:
            for value in BAD_VALUES:
                tried += 1
                query = {key: value} | ({"run": HOSTILE} if key == "layer" else {})
                if _page(name, query).exception:
                    harmful.append(f"{name}?{key}={value[:20]!r}")
    return _counts("params", tried, 0, tried - len(harmful), harmful, verbose)


def section_types(verbose: bool) -> bool:
    """Every DuckDB type through the SQL console's table and CSV; a value Python cannot hold is refused with
    a message saying so (not a dead worker). Harmful: an exception, or a refusal that blames a limit."""
    from test_dashboard import EVERY_TYPE

    from observatory.dashboard.pages.sql import csv_text, to_frame
    from observatory.queries.user_sql import QueryError, run_user_sql

    overflow = [
        "SELECT INTERVAL 100000000 YEARS",
        "SELECT [INTERVAL 100000000 YEARS]",
        "SELECT {'a': INTERVAL 100000000 YEARS}",
    ]
    tried = refused = harmless = 0
    harmful = []
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "empty.duckdb"
        for sql in [*EVERY_TYPE.values(), *overflow]:
            try:
                res = run_user_sql(db, sql)
            except QueryError as e:
                tried += 1
                if e.setting is None and "out of the range" in str(e):
                    refused += 1
                else:
                    harmful.append(f"{sql[:60]}: {str(e)[:100]}")
                continue
            frame = to_frame(res)
            for (
                col
            ) in frame.columns:  # each column: shown (Arrow, as the browser's table gets it) and in the CSV
                tried += 1
                try:
                    frame.select(col).to_arrow()
                    csv_text(frame.select(col))
                    harmless += 1
                except Exception as e:
                    harmful.append(f"{sql[:40]} column {col}: {type(e).__name__}: {e}"[:160])
    return _counts("types", tried, refused, harmless, harmful, verbose)


def section_forged(verbose: bool) -> bool:
    """Forged findings (tests/hostile_store.py: an anomaly or alert in a trainer's log, findings in the
    observatory's own file unsigned or signed with another key). Refused: a rejected line, in no page."""
    import duckdb
    from hostile_store import FORGED
    from test_hostile_pages import PAGES, markdown_texts

    _hostile_env()
    with duckdb.connect(os.environ["OBSERVATORY_DB"], read_only=True) as con:
        tried = con.execute(
            "SELECT (SELECT count(*) FROM rejected_events WHERE raw LIKE $f) + "
            "(SELECT count(*) FROM events WHERE data::VARCHAR LIKE $f)",
            {"f": f"%{FORGED}%"},
        ).fetchone()[0]
        stored = con.execute(
            "SELECT run, kind FROM events WHERE data::VARCHAR LIKE ?", [f"%{FORGED}%"]
        ).fetchall()
    harmful = [f"stored as the observatory's: {r} {k}" for r, k in stored]
    for name, query in PAGES:
        at = _page(name, query)
        shown = markdown_texts(at) + [c.proto.spec for c in at.get("plotly_chart")]
        shown += [d.value.to_csv() for d in at.dataframe]
        if at.exception or any(FORGED in t for t in shown):
            harmful.append(f"{name} {query}: {'raised' if at.exception else 'shows a forged finding'}")
    return _counts("forged", tried, tried - len(stored), 0, harmful, verbose)


def section_memory(verbose: bool) -> bool:
    """200 distinct 0.8 MB answers through the dashboard's cache with a 4 MB bound (as 200 distinct deep
    links would make). Harmful: the cache past its bound. Prints the server process's RSS growth."""
    import psutil
    from test_dashboard_cache import big_answer

    from observatory.dashboard import cache
    from observatory.pipeline import ingest

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "runs").mkdir()
        ingest(Path(tmp) / "runs", Path(tmp) / "s.duckdb", emit=None)
        os.environ["OBSERVATORY_DB"] = str(Path(tmp) / "s.duckdb")
        os.environ["OBSERVATORY_DASHBOARD_CACHE_MB"] = "4"
        rss0 = psutil.Process().memory_info().rss
        harmful = []
        for i in range(200):
            cache.query(big_answer, i)
            if cache.cached_bytes()[0] > 4 << 20:
                harmful.append(
                    f"after {i + 1} answers the cache holds {cache.cached_bytes()[0] / 2**20:.1f} MB"
                )
        grown = (psutil.Process().memory_info().rss - rss0) / 2**20
    print(f"memory: 200 distinct answers of 0.8 MB, cache bound 4 MB: RSS +{grown:.0f} MB")
    return _counts("memory", 200, 0, 200 - len(harmful), harmful[:1], verbose)


# Streamlit's own endpoints and static routes, and paths that try to climb out of them
ENDPOINTS = (
    "/_stcore/metrics",
    "/_stcore/metrics?families=session_state,cache_memory_bytes",
    "/_stcore/host-config",
    "/_stcore/health",
    "/_stcore/script-health-check",
    "/_stcore/allowed-message-origins",
    "/_stcore/upload_file",
    "/static/../../../../etc/passwd",
    "/app/static/../../pyproject.toml",
    "/component/observatory.dashboard.live_chart.observatory_live_chart/../../../../pyproject.toml",
    "/media/../observatory.duckdb",
)


def section_server(verbose: bool) -> bool:
    """A real server (tests/browser_fixtures.dashboard: `observatory.dashboard.serve`, as `observatory dashboard`
    starts it) over a small store: its endpoints probed over HTTP, its pages opened in chromium."""
    import urllib.error
    import urllib.request

    from browser_fixtures import PUBLIC_PAGES, chromium, dashboard, page_traffic, server_secrets

    harmful: list[str] = []
    refused = harmless = 0
    with tempfile.TemporaryDirectory() as tmp:
        _, db = make_store(Path(tmp) / "store")
        secrets = server_secrets(db)
        with dashboard(db, Path(tmp) / "streamlit.log") as url:
            with urllib.request.urlopen(url + "/", timeout=30) as r:
                app_page = r.read()
            for path in ENDPOINTS:
                try:
                    with urllib.request.urlopen(url + path, timeout=30) as r:
                        body, kind = r.read(), r.headers.get("content-type", "")
                except urllib.error.HTTPError as e:
                    body, kind = e.read(), "error"
                leaks = [s for s in secrets if s.encode() in body]
                if leaks or "openmetrics" in kind or b"# TYPE" in body:
                    harmful.append(f"{path}: {'metrics' if not leaks else leaks[0]}")
                elif kind == "error" or body == app_page:
                    refused += 1
                else:
                    harmless += 1  # an answer with nothing of the server's in it (the health check's "ok")
            with chromium() as browser:
                frames, bodies = page_traffic(browser, url, PUBLIC_PAGES)
    for what, items in (("frame", [("ws", f) for f in frames]), ("body", bodies)):
        for where, data in items:
            leaks = [s for s in secrets if s.encode() in data]
            if leaks:
                harmful.append(f"a {what} ({where[:80]}) holds {leaks[0]}")
            else:
                harmless += 1
    print(
        f"server: {len(ENDPOINTS)} endpoints, {len(PUBLIC_PAGES)} pages: {len(frames)} websocket frames, {len(bodies)} HTTP bodies"
    )
    return _counts("server", len(ENDPOINTS) + len(frames) + len(bodies), refused, harmless, harmful, verbose)


# deep links a visitor can make distinct without end: each a new entry of the server's caches (`{i}`: its number)
DEEP_LINKS = (
    "live?run=ghost-{i}-" + "x" * 100,
    "live?run=hostile&step={i}",
    "runs?q=" + "+".join(f"w{{i}}{k}" for k in range(40)),
    "compare?runs=hostile,hostile-2,ghost-{i}",
    "health?run=hostile&host={i}",
    "experts?run=hostile&layer={i}",
    "sweeps?view=Curves&metric=train/loss&var=project+%3D+p{i}",
    "decisions?decision=ghost-{i}",
)


def section_links(verbose: bool) -> bool:
    """A real server over tests/hostile_store.py's store, and chromium opening `LINKS` distinct hostile deep
    links (`DEEP_LINKS` in turn, each with its own number) one after another, after one of each kind: the
    server's RSS after each quarter. Harmful: the last quarter still grows it by more than a tenth of what the first did (unbounded
    growth), or a page shows an exception."""
    import psutil
    from browser_fixtures import ROOT as REPO
    from browser_fixtures import chromium, free_port, start_server, stop, wait_idle
    from hostile_store import write_hostile_runs

    from observatory.pipeline import ingest

    n = int(os.environ.get("BENCH_LINKS", "160"))
    same = os.environ.get("BENCH_LINKS_SAME") == "1"  # the control: the same eight links over and over
    harmful: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        write_hostile_runs(Path(tmp) / "runs")
        ingest(Path(tmp) / "runs", Path(tmp) / "s.duckdb", emit=None)
        os.environ["OBSERVATORY_DASHBOARD_CACHE_MB"] = os.environ.get("OBSERVATORY_DASHBOARD_CACHE_MB", "32")
        port = free_port()
        proc = start_server(REPO / "app.py", Path(tmp) / "s.duckdb", port, Path(tmp) / "streamlit.log")
        server = psutil.Process(proc.pid)
        rss = []
        try:
            with chromium() as browser:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.set_default_timeout(120_000)
                warm = len(DEEP_LINKS)  # each kind of link once first: the pages' imports are not growth
                for i in range(-warm, n + 1):
                    if i >= 0 and i % max(1, n // 4) == 0:
                        rss.append((i, server.memory_info().rss / 2**20))
                    if i == n:
                        break
                    link = DEEP_LINKS[i % len(DEEP_LINKS)].format(
                        i=i if i < 0 or not same else i % len(DEEP_LINKS)
                    )
                    page.goto(f"http://127.0.0.1:{port}/{link}")
                    # the page's own elements, not the app's shell: a run that ends before its script runs
                    # is a link the server never served
                    page.locator('[data-testid="stMain"] [data-testid="stElementContainer"]').first.wait_for()
                    wait_idle(page)
                    if page.locator('[data-testid="stException"]').count():
                        harmful.append(f"link {i}: an exception box")
        finally:
            stop(proc)
    steps = [b - a for (_, a), (_, b) in zip(rss, rss[1:], strict=False)]
    print(
        f"links: {n} {'repeated' if same else 'distinct'} hostile deep links, cache bound {os.environ['OBSERVATORY_DASHBOARD_CACHE_MB']} MB: "
        f"server RSS {' -> '.join(f'{mb:.0f} MB ({i})' for i, mb in rss)}"
    )
    if len(steps) >= 2 and steps[-1] > max(8.0, 0.1 * steps[0]):
        harmful.append(
            f"the last {n // 4} links grew the server by {steps[-1]:.0f} MB (the first {steps[0]:.0f} MB)"
        )
    return _counts("links", n, 0, n - len(harmful), harmful, verbose)


def _script(name: str) -> bool:
    """Another bench script of this folder, in a process of its own; True when it met its goals."""
    return subprocess.run([sys.executable, str(ROOT / "bench" / name)]).returncode == 0


def section_load(verbose: bool) -> bool:
    return _script("bench_load.py")


def section_faults(verbose: bool) -> bool:
    return _script("bench_public_faults.py")


SECTIONS = {
    "sql": section_sql,
    "secrets": section_secrets,
    "planted": section_planted,
    "text": section_text,
    "params": section_params,
    "types": section_types,
    "forged": section_forged,
    "memory": section_memory,
    "server": section_server,
    "links": section_links,
    "load": section_load,
    "faults": section_faults,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(SECTIONS), help="run one section")
    ap.add_argument("--verbose", action="store_true", help="print every statement's verdict")
    args = ap.parse_args()
    ok = True
    for name, section in SECTIONS.items():
        if args.only in (None, name):
            ok = section(args.verbose) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
