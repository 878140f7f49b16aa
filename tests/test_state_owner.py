"""State has one owner: no module of observatory/ or trainer/ keeps mutable state in a module global.
What a long-lived process keeps lives in an object it passes explicitly (`observatory.pipeline`'s
`Ingester`: the stage's `Stage`, the analyses' `Analyses`); a memo of a pure function is a
`functools.cache`.

Checked on the `ast` of every module: a name bound at module level must be no instance of the module's
own classes, and must not be changed in place in a function of its module (`NAME[k] = ...`, `NAME.add(...)`, `NAME.clear()`, ..., or `global NAME`). The names left
are listed with why, so that the debt stays in sight."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MUTATORS = {
    "add", "append", "extend", "update", "setdefault", "pop", "popitem", "clear", "remove", "discard",
    "insert", "move_to_end", "__setitem__",
}  # fmt: skip
# still module state, each with why it is not owned yet
KNOWN = {
    # the one owner of the process's store state (`connection.Process`: its docstring says why it is one per
    # process): the DuckDB instances every caller's units of work share, and each thread's read connections,
    # which `ReentrantWrite` checks in any caller. Tests set a new one; none clears it
    ("observatory/store/connection.py", "PROCESS"),
    # one per server process, each an owner object: the dashboard's query cache, the SQL console's kept
    # results (bounded over all sessions together), its worker pool and admission gate
    ("observatory/dashboard/cache.py", "CACHE"),
    ("observatory/dashboard/pages/sql.py", "RESULTS"),
    ("observatory/queries/user_sql.py", "_POOL"),
    ("observatory/queries/user_sql.py", "_GATE"),
    # the SQL worker is a process of its own that runs one query at a time: its watchdog and its scrubbers
    ("observatory/queries/user_sql_worker.py", "_WATCHDOG"),
    ("observatory/queries/user_sql_worker.py", "_SCRUBBERS"),
    # wandb's API, which ours copies, is process-global by design: `observatory.run`, `.config`, `.summary`
    # are the active run's, and the shim keeps that run, its listeners and the excepthook it chained
    ("observatory/__init__.py", "run"),
    ("observatory/__init__.py", "config"),
    ("observatory/__init__.py", "summary"),
    ("observatory/integrations/wandb_api.py", "_active"),
    ("observatory/integrations/wandb_api.py", "_listeners"),
    ("observatory/integrations/wandb_api.py", "_warned"),
    ("observatory/integrations/wandb_api.py", "_previous_excepthook"),
    # the names of train_step's scalars vector, recorded when JAX traces it (keyed by model config)
    ("trainer/step.py", "_SCALAR_NAMES"),
}


def _top_level(body: list[ast.stmt]):
    """The module's statements, those inside its top-level `if` and `try` blocks too (not functions')."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            for part in (node.body, node.orelse, *(h.body for h in getattr(node, "handlers", ()))):
                yield from _top_level(part)


def _frozen(c: ast.ClassDef) -> bool:
    """`@dataclass(frozen=True)`: its instances cannot be changed (a table of rules made at import)."""
    return any(
        isinstance(d, ast.Call)
        and getattr(d.func, "id", None) == "dataclass"
        and any(k.arg == "frozen" and getattr(k.value, "value", None) is True for k in d.keywords)
        for d in c.decorator_list
    )


def _module_state(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in _top_level(tree.body):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    changed = set()
    # inside functions only: what module code does at import (a table built in two statements) is no state
    funcs = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for n in (n for f in funcs for n in ast.walk(f)):
        if isinstance(n, ast.Global):
            changed |= set(n.names)
        elif isinstance(n, (ast.Assign, ast.AugAssign, ast.Delete)):
            for t in n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]:
                if isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(t.value, ast.Name):
                    changed.add(t.value.id)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS:
            if isinstance(n.func.value, ast.Name):
                changed.add(n.func.value.id)
    # an instance of a class of the module, made at import: its methods change it (a frozen dataclass's cannot)
    classes = {c.name for c in tree.body if isinstance(c, ast.ClassDef) and not _frozen(c)}
    for node in _top_level(tree.body):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Name) and func.id in classes:
                changed |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names & changed


FILES = sorted(p for pkg in ("observatory", "trainer") for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_global_is_changed(path):
    rel = str(path.relative_to(ROOT))
    found = {name for name in _module_state(path) if (rel, name) not in KNOWN}
    assert found == set(), f"{rel} changes module globals {sorted(found)}: keep them in an owner object"


def test_the_check_finds_what_it_looks_for(tmp_path):
    p = tmp_path / "m.py"
    p.write_text(
        "A = {}\nB = set()\nC = 0\nD = []\ndef f():\n    global C\n    A['k'] = 1\n    B.add(2)\n    C = 3\n"
    )
    assert _module_state(p) == {"A", "B", "C"}
    p.write_text(
        "from dataclasses import dataclass\n@dataclass(frozen=True)\nclass R:\n    x: int\n"
        "class S:\n    pass\nR1 = R(1)\nS1 = S()\n"
    )
    assert _module_state(p) == {"S1"}


def test_the_known_ones_are_still_there():
    """An entry of KNOWN that was given an owner comes off the list."""
    for rel, name in KNOWN:
        assert name in _module_state(ROOT / rel), f"{rel}: {name} is gone: take it off KNOWN"


def _globals_cleared(path: Path) -> set[str]:
    """`mod._NAME.clear()` (or another change in place) in a test, where `mod` is one of our modules and
    `_NAME` its private global (a public one, such as wandb's `observatory.config`, is the API under test)."""
    tree = ast.parse(path.read_text())
    ours = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("observatory"):
            ours |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            ours |= {
                (a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("observatory")
            }
    found = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS:
            target = n.func.value
            if (
                isinstance(target, ast.Attribute)
                and target.attr.startswith("_")
                and isinstance(target.value, ast.Name)
                and target.value.id in ours
            ):
                found.add(f"{target.value.id}.{target.attr}")
    return found


@pytest.mark.parametrize("path", sorted((ROOT / "tests").glob("test_*.py")), ids=lambda p: p.name)
def test_no_test_clears_a_global_of_ours(path):
    """A test that needs a clean owner makes a new one (`query_cache`, `connection.Process()`, a new pool)."""
    assert _globals_cleared(path) == set(), f"{path.name} changes our modules' globals in place"


def test_the_test_check_finds_what_it_looks_for(tmp_path):
    p = tmp_path / "test_x.py"
    p.write_text(
        "from observatory.dashboard import cache\ndef test():\n    cache._HOT.clear()\n    x = []\n    x.clear()\n"
    )
    assert _globals_cleared(p) == {"cache._HOT"}
