"""The scan's screen (`observatory.detect.screen`): many runs' rules at once, each run flagged as alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from observatory.detect import detectors as D
from observatory.detect import rolling as R
from observatory.detect import scan as A
from observatory.detect import screen
from observatory.detect.thresholds import Thresholds


def loud_runs(runs) -> set[str]:
    """`screen.loud` of (run, its series as `scan.detect_series` takes them, its thresholds) each: the series
    laid end to end as the scan lays its `SeriesRows` out, from per-run dicts the tests plant faults in."""
    groups: dict[Thresholds, list[tuple[str, dict]]] = {}
    for run, series, th in runs:
        groups.setdefault(th, []).append((run, series))
    out: set[str] = set()
    for th, members in groups.items():

        def columns(metric: str, members=members) -> tuple[np.ndarray, np.ndarray, list[str]]:
            have = [(run, s[metric][1]) for run, s in members if metric in s and len(s[metric][1])]
            lens = np.fromiter((len(v) for _, v in have), np.int64, len(have))
            starts = np.concatenate(([0], np.cumsum(lens)[:-1])) if have else np.empty(0, np.int64)
            x = np.concatenate([np.asarray(v, dtype=float) for _, v in have]) if have else np.empty(0)
            return x, starts, [run for run, _ in have]

        out |= screen.loud(th, columns)
    return out


TH = Thresholds()


def small_run(seed: int, n: int, fault: str | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A sweep's run of `n` steps (loss, grad norm, throughput, drop fraction), with one fault planted."""
    rng = np.random.default_rng(seed)
    steps = np.arange(1, n + 1)
    loss = 4.0 * 0.98**steps + 0.02 * rng.standard_normal(n)
    grad = np.exp(0.1 * rng.standard_normal(n))
    tps = 1e4 * (1 + 0.03 * rng.standard_normal(n))
    drop = np.clip(0.07 + 0.005 * rng.standard_normal(n), 0, 1)
    at = n - 8
    if fault == "loss_spike":
        loss[at : at + 2] *= 3
    elif fault == "loss_dip":
        loss[at] *= 0.3
    elif fault == "grad_spike":
        grad[at] *= 200
    elif fault == "grad_growth":
        grad *= 1 + 8 * np.clip((steps - n // 2) / (n // 4), 0, 1)
    elif fault == "throughput":
        tps[at - 6 :] *= 0.2
    elif fault == "drop":
        drop[at] = 0.6
    elif fault == "nan":
        loss[at] = np.nan  # a gap: the rules skip it
    return {
        D.LOSS: (steps, loss),
        D.GRAD: (steps, grad),
        D.UPDATE: (steps, grad * 0.01),
        D.THROUGHPUT: (steps, tps),
        D.DROP: (steps, drop),
    }


FAULTS = (None, "loss_spike", "loss_dip", "grad_spike", "grad_growth", "throughput", "drop", "nan")


def runs_of(k: int, seed: int = 0) -> list[tuple[str, dict]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(k):
        fault = FAULTS[i % len(FAULTS)] if i % 3 == 0 else None
        n = 150 if fault == "grad_growth" else int(rng.integers(30 if fault else 1, 60))
        out.append((f"r{i}", small_run(seed * 1000 + i, n, fault)))
    return out


@pytest.mark.parametrize("window,min_history", [(128, 16), (24, 8), (5, 3)])
def test_each_rule_flags_a_run_among_many_as_it_flags_it_alone(window, min_history):
    th = dataclasses.replace(TH, window=window, min_history=min_history)
    runs = runs_of(40)
    for metric, rules in screen.RULES.items():
        xs = [s[metric][1] for _, s in runs]
        starts = np.concatenate(([0], np.cumsum([len(x) for x in xs])[:-1]))
        cat = np.concatenate(xs)
        for rule in rules:
            together = rule(cat, th, starts)
            for x, lo in zip(xs, starts.tolist(), strict=True):
                np.testing.assert_array_equal(together[lo : lo + len(x)], rule(x, th, None))


def test_rolling_over_several_series_is_each_alone_bit_for_bit():
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(n) for n in (1, 7, 40, 300, 2)]
    for x in xs:
        x[rng.random(len(x)) < 0.15] = np.nan
    starts = np.concatenate(([0], np.cumsum([len(x) for x in xs])[:-1]))
    cat = np.concatenate(xs)
    for window, least, qs in ((128, 16, (0.5, 0.25, 0.75)), (10, 10, (0.0,)), (3, 1, (1.0,))):
        got = R.rolling(cat, window, least, qs, starts)
        for x, lo in zip(xs, starts.tolist(), strict=True):
            for g, want in zip(got, R.rolling(x, window, least, qs), strict=True):
                np.testing.assert_array_equal(g[lo : lo + len(x)], want)
    np.testing.assert_array_equal(R.shift(cat, 2, starts)[starts], np.full(len(xs), np.nan))


def findings_alone(series: dict, th: Thresholds) -> list:
    steps = np.unique(np.concatenate([s for s, _ in series.values()]))
    return A.detect_series(series, steps, th)


def test_the_quiet_runs_find_nothing_and_every_planted_fault_is_loud():
    runs = runs_of(64, seed=1)
    loud = loud_runs((run, s, TH) for run, s in runs)
    found = {run: findings_alone(s, TH) for run, s in runs}
    assert {run for run, f in found.items() if f} <= loud
    planted = {f"r{i}" for i in range(64) if i % 3 == 0 and FAULTS[i % len(FAULTS)] not in (None, "nan")}
    assert planted <= loud
    assert len(loud) < len(runs) // 2  # most runs of a sweep are screened out: the point of it


def test_runs_with_thresholds_of_their_own_are_flagged_by_theirs():
    series = small_run(7, 40, "loss_spike")
    # this run's project flags nothing: no z is that high, no throughput that low
    mine = dataclasses.replace(TH, loss_z=1e9, grad_z=1e9, drop_z=1e9, throughput_drop=1e-9, grad_growth=1e9)
    assert findings_alone(series, mine) == [] and findings_alone(series, TH) != []
    assert loud_runs([("mine", series, mine), ("default", series, TH)]) == {"default"}


def test_an_ingest_of_many_runs_stores_the_findings_of_each_alone(tmp_path, monkeypatch):
    """A batch of sweep runs, some with a fault: the screened scan stores what one run at a time stores,
    and runs the series detectors of few of them."""
    import observatory
    from observatory.pipeline import ingest
    from observatory.queries.anomalies import anomaly_events
    from observatory.store import connect

    def write(runs_dir):
        for i, (run, s) in enumerate(runs_of(24, seed=2)):
            r = observatory.init(run_id=run, runs_dir=runs_dir, install_signal_handlers=False)
            for j, step in enumerate(s[D.LOSS][0].tolist()):
                r.log(
                    {m: float(v[j]) for m, (_, v) in s.items() if not (i % 5 == 1 and m == D.DROP)}, step=step
                )
            r.finish()

    def stored(db):
        with connect(db) as con:
            return sorted((a["run"], a["detector"], a["window"][0]) for a in anomaly_events(con, None))

    calls = []
    real = A.detect_series
    monkeypatch.setattr(A, "detect_series", lambda *a, **k: calls.append(1) or real(*a, **k))
    write(tmp_path / "runs")
    ingest(tmp_path / "runs", tmp_path / "screened.duckdb", emit=None)
    screened = len(calls)
    monkeypatch.setattr(A, "SCREEN_FROM", 10**9)
    ingest(tmp_path / "runs", tmp_path / "alone.duckdb", emit=None)
    assert stored(tmp_path / "screened.duckdb") == stored(tmp_path / "alone.duckdb") != []
    assert 0 < screened < (len(calls) - screened) / 2


def test_grad_growth_flags_nothing_in_fewer_rows_than_it_needs():
    """The screen skips `growth_flags` for series shorter than `rows_needed`: one row fewer can never flag,
    however the grad norm grows; at that many rows it can."""
    n = screen.rows_needed(screen.RULES[D.GRAD][1], TH)
    assert n == TH.growth_steps + TH.growth_steps // 2 + TH.min_history - 1
    g = np.where(np.arange(n) >= n - 23, 100.0, 0.1)  # a thousandfold growth over the last 23 rows
    assert D.growth_flags(g, TH)[0][-1]
    assert not D.growth_flags(g[1:], TH)[0].any()
    assert screen.rows_needed(screen.RULES[D.LOSS][0], TH) == 1


def test_series_rows_give_each_run_what_metric_arrays_gives_it(tmp_path):
    """Every run's rows read at once (`metric_arrays_many`: sorted, each (name, step) once, hosts' rows at a
    step averaged, NULLs not counted) give each run the arrays its own `metric_arrays` gives it, bit for bit;
    and the screen's views of them (`values`, `longest`, `with_values`, `last_step`) agree with those."""
    from observatory import store
    from observatory.queries import anomalies as qa

    rng = np.random.default_rng(4)
    names = ["train/loss", "grad/norm/total", "throughput/tokens_per_s", "moe/drop_frac"]
    runs = [f"r{i:02d}" for i in range(14)] + ["s1", "s2"]
    # two runs of one row each, at the same name and step: one after the other, never one (name, step)
    rows = [(run, 5, names[0], v, 1e9, 0, False) for run, v in (("s1", 1.0), ("s2", 3.0))]
    for i, run in enumerate(runs[:14]):
        if i % 5 == 3:
            continue  # a run with no rows of these names
        for step in rng.permutation(np.arange(1, 20 + i)).tolist():  # stored out of step order
            for name in names[: 1 + i % 4]:
                for host in range(1 + (step % 7 == 0)):  # two hosts at some steps: averaged
                    value = None if (step + i) % 11 == 0 else float(rng.standard_normal())
                    rows.append((run, step, name, value, 1e9 + step, host, False))
    with store.connect(tmp_path / "s.duckdb", read_only=False) as con:
        store.ensure_schema(con)
        con.executemany(
            "INSERT INTO metrics (run, step, name, value, t, host, replaced) VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        since, fresh = [None] * len(runs), [False] * len(runs)
        qa.register_wanted(con, runs, since, fresh)
        try:
            many = qa.metric_arrays_many(con, since, fresh, None, names)
        finally:
            qa.unregister_wanted(con)
        alone = [qa.metric_arrays(con, run, None, names) for run in runs]
    longest = many.longest()
    members = np.array([i % 3 != 1 for i in range(len(runs))])
    for i, (steps, series) in enumerate(alone):
        got_steps, got = many.of(i)
        assert np.array_equal(got_steps, steps) and got.keys() == series.keys()
        for name, (s, v) in series.items():
            assert np.array_equal(got[name][0], s) and np.array_equal(got[name][1], v)  # NaN-free: exact
        assert many.last_step(i) == (int(steps[-1]) if len(steps) else None)
        assert longest[i] == max((len(v) for _, v in series.values()), default=0)
    for name in names:
        have = many.with_values(name)
        assert have.tolist() == [name in series for _, series in alone]
        x, heads, ks = many.values(name, members)
        want = [i for i in range(len(runs)) if members[i] and have[i]]
        assert ks.tolist() == want
        assert np.array_equal(x, np.concatenate([alone[i][1][name][1] for i in want]))
        assert heads.tolist() == np.cumsum([0] + [len(alone[i][1][name][1]) for i in want])[:-1].tolist()
    assert sum(len(s) for _, s in alone) > 20 and (longest == 0).any()
