"""The tree is the map: no import cycles among our modules, stages import downwards, files stay small.

The import graph is built from `ast` over every module of ours, imports inside functions
included (a lazy import is still a dependency), so that the layout cannot drift back.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("observatory", "trainer")
# `ruff format` formats the whole tree (no `fmt: skip`): the line count says something about design
MAX_LINES = 800


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of ours that an imported dotted name is, or lives in."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(mod: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            target = _resolve(n)
            if target is not None and target != mod:
                out.add(target)
    return out


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_our_imports():
    assert "observatory.events" in GRAPH["observatory.writer"]
    assert any(m.startswith("observatory") for m in GRAPH["trainer.train"])


def test_no_import_cycles():
    assert _cycles(GRAPH) == [], "import cycles among our modules (each list is one cycle's modules)"


def _package(mod: str) -> str:
    """The package a module is in, to the depth of the stages (`observatory.detect.scan`: `observatory.detect`)."""
    return ".".join(mod.split(".")[:2])


def test_no_import_cycles_between_packages():
    """Module cycles are not the only knot: `detect.scan` importing `alerts.rules` while `alerts.rules` imports
    `detect.thresholds` is no module cycle, yet neither package can be read, moved or tested without the other."""
    packages: dict[str, set[str]] = {_package(m): set() for m in GRAPH}
    for m, ts in GRAPH.items():
        packages[_package(m)] |= {_package(t) for t in ts} - {_package(m)}
    assert _cycles(packages) == [], "import cycles among our packages (each list is one cycle's packages)"


# Stages bottom to top (README's code layout; docs/architecture.md for the processes): a module imports only its own
# stage and stages below it.
LAYERS = [
    {
        "observatory.settings",
        "observatory.events",
        "observatory.redact",
        "observatory.provenance",
        "observatory.logtail",
        "observatory.telemetry",
        "observatory.bucket",
    },
    {"observatory.writer"},
    {"observatory.findings"},
    {"observatory.store"},
    # ingest is one stage: it imports none of the analyses above it; `pipeline` runs it, then them
    {"observatory.ingest"},
    {"observatory.queries"},
    {"observatory.detect", "observatory.ladder", "observatory.decisions"},
    {"observatory.alerts"},  # over the detectors: its rules file sets their thresholds per run
    {
        "observatory.pipeline",
        "observatory.report",
        "observatory.interop",
        "observatory.lineage",
        "observatory.markup",
    },
    {"observatory.dashboard", "observatory.integrations"},
    {
        "observatory.commands",
        "observatory.cli",
        "observatory.demo",
        "observatory.entry",
        "observatory.app",
        "observatory",
    },
    {"observatory.docs"},  # the README's generated sections: from settings, the schema and the CLI
]


def _layer(mod: str) -> int | None:
    for i, names in enumerate(LAYERS):
        for n in names:
            if mod == n or (n != "observatory" and mod.startswith(n + ".")):
                return i
    return None


@pytest.mark.parametrize("mod", sorted(m for m in GRAPH if m.startswith("observatory")))
def test_stages_import_only_downwards(mod):
    mine = _layer(mod)
    assert mine is not None, f"{mod} belongs to no stage in LAYERS (add it where it sits in the flow)"
    up = sorted(t for t in GRAPH[mod] if t.startswith("observatory") and (_layer(t) or 0) > mine)
    assert up == [], f"{mod} (stage {mine}) imports stages above it: {up}"


def test_trainer_uses_only_the_event_writer_of_observatory():
    allowed = {
        "observatory",
        "observatory.writer",
        "observatory.settings",
        "observatory.events",
        "observatory.redact",
        "observatory.bucket",
        "observatory.interop.wandb_mirror",
    }
    used = {
        t for m, ts in GRAPH.items() if m.startswith("trainer") for t in ts if t.startswith("observatory")
    }
    assert used <= allowed, f"trainer imports more of observatory than its writer: {sorted(used - allowed)}"


def test_observatory_core_never_imports_jax():
    for mod, path in MODULES.items():
        if mod.startswith("observatory") and not mod.startswith("observatory.integrations"):
            tree = ast.parse(path.read_text())
            names = {
                a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
            }
            names |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            assert not names & {"jax", "flax", "optax", "orbax"}, f"{mod} imports JAX"


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_no_file_over_the_limit(mod):
    n = len(MODULES[mod].read_text().splitlines())
    assert n <= MAX_LINES, (
        f"{MODULES[mod].relative_to(ROOT)} has {n} lines (> {MAX_LINES}): two ideas, split it"
    )


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_no_module_level_getattr(mod):
    tree = ast.parse(MODULES[mod].read_text())
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body), (
        f"{mod} re-exports through a module-level __getattr__"
    )


def test_readme_layout_names_every_package_and_only_real_ones():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Code layout", 1)[1].split("\n## ", 1)[0]
    diagram = section.split("```", 2)[1]
    top = {
        p.name.removesuffix(".py")
        for p in (ROOT / "observatory").iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()
    }
    rows = [
        line for line in diagram.splitlines() if line.strip() and "│" not in line and "trainer/" not in line
    ]
    # a row is its stage's names, then 3+ spaces, then what they do
    names = [
        re.match(r"^\s*((?:[a-z_]+/?\s{1,2})*[a-z_]+/?)(?:\s{3,}|$)", row).group(1).split() for row in rows
    ]
    named = {n.rstrip("/") for ns in names for n in ns}
    missing = sorted(t for t in top if t not in named)
    assert missing == [], f"README's layout diagram lacks {missing}"
    for layer in LAYERS:  # each stage's packages are in the diagram, in the same order bottom to top
        for name in layer:
            if name != "observatory":
                assert name.split(".")[1] in named, f"{name} is not in the README diagram"
    order = [max(_layer(f"observatory.{n.rstrip('/')}") for n in ns) for ns in names]
    assert order == sorted(order, reverse=True), (
        "README's diagram lists the stages out of order (top is last)"
    )
    for mod in re.findall(r"`([a-z_]+)\.py`", section):
        assert (ROOT / "trainer" / f"{mod}.py").exists(), (
            f"README names trainer/{mod}.py, which does not exist"
        )
