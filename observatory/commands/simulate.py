"""`observatory simulate`: write synthetic runs shaped like the reference run as event logs."""

from __future__ import annotations

import shlex
import sys

import click

from observatory import bucket
from observatory.commands import bucket_options
from observatory.interop.cases import FAULTS, SLOW_CASES

__all__ = ["simulate"]

PRESET_NAMES = ("tiny", "ladder", "535b")


@click.command("simulate")
@click.option("--preset", type=click.Choice(PRESET_NAMES), required=True, help="Shape and story of the runs.")
@click.option("--steps", type=int, help="Schedule length [default: tiny 200, ladder 200, 535b 500].")
@bucket_options
@click.option(
    "--run-id", help="Main run id [default: sim-<preset>]; the fork is <id>-fork, ladder rungs <id>-<rung>."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same bytes.")
@click.option(
    "--expert-load-every",
    type=int,
    help="expert_load every K steps, 0 = never [default: tiny 1, ladder 5, 535b 10].",
)
@click.option("--hosts", type=int, default=1, show_default=True, help="Processes: one event file each.")
@click.option("--replace", is_flag=True, help="Overwrite runs simulated earlier with other arguments.")
@click.option("--ingest", "do_ingest", is_flag=True, help="Also update the store (--db) from the runs dir.")
@click.option(
    "--fault",
    type=click.Choice(FAULTS),
    help="Instead of the preset's story: a live many-host job (phases, heartbeats) playing one operator "
    "fault, ending now, with its goodput ground truth in a summary event (docs/operate.md).",
)
@click.option(
    "--slow",
    type=click.Choice(SLOW_CASES),
    help="Instead of the preset's story: one run of a slow failure, or of a healthy run it must be told "
    "from, --steps long [default: 10000], with its truth in a summary event (docs/detectors.md).",
)
def simulate(
    preset, steps, runs_dir, db, run_id, seed, expert_load_every, hosts, replace, do_ingest, fault, slow
):
    """Write synthetic runs as real event logs (deterministic by seed).

    535b: the reference MoE (48 layers x 384 experts, top-8 + 2 shared, seq 4096) with a
    loss spike led by its grad norm, a NaN with rollback, a preemption and resume, a fork
    with a config diff and a drifting hot expert. tiny: the same story at 4 x 16.
    ladder: four rungs on L(C) = E + A*C^-alpha for `observatory ladder fit`.
    """
    from observatory.interop.simulate import simulate as run_simulate

    if fault is not None:
        _fault(fault, steps, runs_dir, db, run_id, seed, hosts, do_ingest)
        return
    if slow is not None:
        _slow(slow, steps, runs_dir, db, run_id, seed, do_ingest)
        return
    try:
        with bucket.staged(runs_dir) as local:  # a bucket's runs: written here, then uploaded as chunks
            res = run_simulate(
                preset,
                local,
                steps=steps,
                run_id=run_id,
                seed=seed,
                expert_load_every=expert_load_every,
                hosts=hosts,
                replace=replace,
            )
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    for path, state, _ in res.files:
        if state == "conflict":
            click.secho(
                f"FAILED {path}: different events are already there (other arguments?); pass --replace "
                "to overwrite them (then rebuild the store)",
                fg="red",
                err=True,
            )
    click.echo(f"{', '.join(res.runs)} -> {bucket.safe(str(runs_dir))}: {res.summary()}")
    if do_ingest:
        from observatory.interop import ingest_runs

        report = ingest_runs(runs_dir, db, rebuild=any(s == "replaced" for _, s, _ in res.files))
        click.echo(f"store {db}: {report.summary()}")
    else:
        command = "rebuild" if any(s == "replaced" for _, s, _ in res.files) else "ingest"
        click.echo(
            f"next: observatory {command} --runs-dir {shlex.quote(bucket.safe(str(runs_dir)))}", err=True
        )
    if res.conflicts:
        sys.exit(1)


def _fault(fault, steps, runs_dir, db, run_id, seed, hosts, do_ingest) -> None:
    from observatory.interop.simulate_ops import simulate_ops

    try:
        with bucket.staged(runs_dir) as local:
            run, truth = simulate_ops(
                fault, local, hosts=max(hosts, 8), steps=steps or 3000, seed=seed, run_id=run_id
            )
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    click.echo(
        f"{run} -> {bucket.safe(str(runs_dir))}: {max(hosts, 8)} hosts, fault {fault}; goodput {truth['sim/goodput']:.4f}"
    )
    if do_ingest:
        from observatory.interop import ingest_runs

        click.echo(f"store {db}: {ingest_runs(runs_dir, db).summary()}")


def _slow(case, steps, runs_dir, db, run_id, seed, do_ingest) -> None:
    from observatory.interop.simulate_slow import simulate_slow

    with bucket.staged(runs_dir) as local:  # a bucket's runs: written here, then uploaded as chunks
        run, truth = simulate_slow(case, local, steps=steps or 10_000, seed=seed, run_id=run_id)
    change = truth["sim/change_step"]
    click.echo(
        f"{run} -> {bucket.safe(str(runs_dir))}: {case}, {truth['sim/steps']} steps"
        + (f"; the change starts at step {change}, for {truth['sim/expect']}" if change is not None else "")
    )
    if do_ingest:
        from observatory.interop import ingest_runs

        click.echo(f"store {db}: {ingest_runs(runs_dir, db).summary()}")
