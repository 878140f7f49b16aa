"""`observatory dashboard`: start the Streamlit dashboard (`streamlit run app.py`, hardened) on a port.

The app is the package's `observatory/app.py` (an installed wheel has it); the
command runs from that folder, so its `.streamlit/config.toml` (the public-deployment
settings) applies. --db and --runs-dir reach the app as
OBSERVATORY_DB / OBSERVATORY_RUNS, the settings every page reads.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from observatory.commands import common_options

__all__ = ["dashboard", "app_path", "streamlit_argv", "port_free"]


def app_path() -> Path:
    """The dashboard's app.py, in the package (a checkout and an installed wheel alike)."""
    return Path(__file__).resolve().parents[1] / "app.py"


def streamlit_argv(app: Path, port: int, address: str, base_url_path: str = "") -> list[str]:
    """The command line for a headless, telemetry-free server: `streamlit run`, through
    `observatory.dashboard.serve`, which shuts what Streamlit has no setting for (its metrics
    endpoint, the script's path and installation ids in each session's first message)."""
    argv = [
        sys.executable,
        "-m",
        "observatory.dashboard.serve",
        "run",
        str(app),
        "--server.port",
        str(port),
        "--server.address",
        address,
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
    ]
    if base_url_path:
        argv += ["--server.baseUrlPath", base_url_path.strip("/")]
    return argv


def port_free(address: str, port: int) -> bool:
    """Whether a server can listen on `address`:`port` now (as Streamlit's does: SO_REUSEADDR, so a port
    in TIME_WAIT counts as free)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


@click.command("dashboard")
@common_options
@click.option("--port", type=int, default=8501, show_default=True, help="Port to serve on.")
@click.option(
    "--address",
    default="127.0.0.1",
    show_default=True,
    help="Interface to bind; 0.0.0.0 to serve other machines (better: a reverse proxy in front).",
)
@click.option(
    "--base-url-path", default="", help="Serve under a sub-path, e.g. 'observatory' behind a proxy."
)
@click.option("--dry-run", is_flag=True, help="Print the command instead of running it.")
def dashboard(runs_dir, db, port, address, base_url_path, dry_run):
    """Start the Streamlit dashboard over the store (read-only; run `observatory ingest --follow` beside it)."""
    app = app_path()
    if not app.is_file():
        raise click.ClickException(
            f"cannot find the dashboard entry {app}: a broken install? reinstall observatory"
        )
    argv = streamlit_argv(app, port, address, base_url_path)
    env = dict(
        os.environ, OBSERVATORY_DB=str(Path(db).resolve()), OBSERVATORY_RUNS=str(Path(runs_dir).resolve())
    )
    url = f"http://{'localhost' if address in ('127.0.0.1', '0.0.0.0') else address}:{port}/{base_url_path.strip('/')}"
    if dry_run:
        click.echo(f"cd {app.parent} && OBSERVATORY_DB={env['OBSERVATORY_DB']} " + " ".join(argv))
        return
    if not port_free(address, port):  # said before the URL is announced, not after Streamlit fails on it
        free = next((p for p in range(port + 1, port + 100) if port_free(address, p)), None)
        offer = f": try --port {free} (free now)" if free is not None else ": choose another with --port"
        raise click.ClickException(f"port {port} on {address} is already in use{offer}")
    click.echo(f"Observatory dashboard on {url} (store {env['OBSERVATORY_DB']}); Ctrl-C to stop", err=True)
    os.chdir(app.parent)  # .streamlit/config.toml next to app.py applies
    os.execve(sys.executable, argv, env)
