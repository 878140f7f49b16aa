"""The package as a user installs it: the wheel built from this checkout, installed into a fresh venv, serves
the dashboard and ingests, queries and reports from a folder outside the repository."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build_wheel(dist: Path) -> Path:
    """The wheel of this checkout, built offline: setuptools from this venv (the test extra's), no build
    isolation and no index, so that no package is fetched (CI machines and sandboxes may have no network)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
        + ["-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("observatory-*.whl")
    return wheel


def _install_into_a_fresh_venv(wheel: Path, venv: Path) -> tuple[Path, Path]:
    """`wheel` alone (no dependencies, no index) in a new venv: (its python, its site-packages)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # not this checkout on PYTHONPATH: pip would take its build's observatory.egg-info for an installed copy
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
        env=env,
    )
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    return py, Path(subprocess.check_output([str(py), "-c", purelib], text=True).strip())


@pytest.mark.slow
def test_the_built_wheel_works_outside_the_checkout(tmp_path):
    venv = tmp_path / "venv"
    py, site = _install_into_a_fresh_venv(_build_wheel(tmp_path / "dist"), venv)
    bin_ = venv / "bin"
    # its dependencies: this venv's (already installed), after the fresh venv's own site-packages
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    away = tmp_path / "elsewhere"  # not the checkout: nothing of the repository is on hand here
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSERVATORY_")}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH="", XDG_DATA_HOME=str(tmp_path / "xdg"))

    def obs(*args: str) -> str:
        r = subprocess.run(
            [str(bin_ / "observatory"), *args], cwd=away, env=env, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, f"observatory {' '.join(args)}: {r.stdout}{r.stderr}"
        return r.stdout + r.stderr

    where = subprocess.check_output(
        [str(py), "-c", "import observatory; print(observatory.__file__)"], cwd=away, env=env, text=True
    )
    assert where.startswith(str(site)), where  # the wheel's copy, not the checkout's
    obs("simulate", "--preset", "tiny", "--steps", "60")
    assert "ingested" in obs("ingest")
    assert "sim-tiny" in obs("sql", "SELECT run FROM runs ORDER BY run")
    obs("report", "sim-tiny", "--out", str(away / "reports"))
    assert (away / "reports" / "sim-tiny.html").stat().st_size > 10_000
    port = _free_port()
    server = subprocess.Popen(
        [str(bin_ / "observatory"), "dashboard", "--port", str(port)],
        cwd=away,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=5) as r:
                    assert r.read() == b"ok"
                break
            except OSError:
                assert server.poll() is None, "the dashboard exited"
                assert time.time() < deadline, "the dashboard did not answer within 90 s"
                time.sleep(1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert b"<title>Streamlit</title>" in r.read() or r.status == 200
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)


@pytest.mark.slow
def test_a_light_install_runs_a_wandb_loop_and_says_what_the_cli_needs(tmp_path):
    """`pip install observatory` for `import observatory as wandb`: the wheel's own requirements are light,
    a W&B loop runs with them alone (no duckdb, streamlit, scipy, polars), and the CLI says what to add."""
    import shutil
    import zipfile

    wheel = _build_wheel(tmp_path / "dist")
    meta = zipfile.ZipFile(wheel).read("observatory-0.1.0.dist-info/METADATA").decode()
    core = {
        line.split(":", 1)[1].split(">")[0].split(";")[0].strip().lower()
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    }
    assert core == {"msgspec", "psutil", "click", "pyyaml"}, core
    venv = tmp_path / "venv"
    py, site = _install_into_a_fresh_venv(wheel, venv)
    here = Path(sysconfig.get_path("purelib"))
    for pkg in ("msgspec", "psutil", "click", "yaml"):  # the core requirements only, copied from this venv
        shutil.copytree(here / pkg, site / pkg)
    loop = (
        "import sys, observatory as wandb\n"
        "wandb.init(project='mnist', config={'lr': 3e-4})\n"
        "for i in range(5): wandb.log({'loss': 1.0 / (i + 1), 'acc': i / 5})\n"
        "wandb.finish()\n"
        "heavy = {'duckdb', 'streamlit', 'scipy', 'polars', 'pyarrow', 'plotly'} & set(sys.modules)\n"
        "print('heavy', sorted(heavy))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSERVATORY_")}
    env.update(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(tmp_path / "xdg"), PYTHONPATH="")
    out = subprocess.run(
        [str(py), "-c", loop], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "heavy []" in out.stdout
    (log,) = (tmp_path / "xdg" / "observatory" / "runs").glob("*/events.0.jsonl")
    assert '"loss"' in log.read_text()
    cli = subprocess.run(
        [str(venv / "bin" / "observatory"), "ingest"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 1 and "pip install 'observatory[server]'" in cli.stderr, cli.stderr
