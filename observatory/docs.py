"""Regenerate the README sections that follow from code: `python -m observatory.docs`.

The settings table comes from `observatory.settings.SETTINGS`, the SQL schema
from `observatory.store.SCHEMA_DOC` (itself generated from the DDL) and the CLI
table from the click commands of `observatory.cli.COMMANDS`, so the README cannot
drift from them; `tests/test_docs.py` checks the README is up to date.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from observatory.cli import COMMANDS
from observatory.settings import SETTINGS
from observatory.store import SCHEMA_DOC

README = Path(__file__).resolve().parent.parent / "README.md"


def settings_table() -> str:
    rows = [f"| `{s.name}` | `{s.env}` | `{s.default}` | {s.help}{_bounds(s)} |" for s in SETTINGS.values()]
    return "| setting | env | default | meaning |\n|---|---|---|---|\n" + "\n".join(rows)


def _bounds(s) -> str:
    text = s.range_text()
    return f" (must be {text})" if text else ""


def schema_doc() -> str:
    # the README nests the tables under "## SQL schema"
    return re.sub(r"^## ", "### ", SCHEMA_DOC.strip(), flags=re.M)


# described once, in the prose above the CLI table
SHARED_OPTIONS = {"runs_dir", "db", "help"}


def _commands(cmds: dict[str, click.Command], prefix: str = "observatory") -> Iterator[tuple[str, click.Command]]:
    """(`observatory name [sub]`, command) for every command, a group's subcommands in its place."""
    for name, cmd in cmds.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd.commands, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}", cmd


def _argument(p: click.Argument) -> str:
    name = p.human_readable_name.upper() + ("..." if p.nargs == -1 else "")
    return name if p.required else f"[{name}]"


def _option(p: click.Option, ctx: click.Context) -> str:
    flags = "/".join(sorted(p.opts, key=len, reverse=True) + p.secondary_opts)
    if p.is_flag or p.count:
        return flags
    if isinstance(p.type, click.Choice):
        return f"{flags} {'|'.join(map(str, p.type.choices))}"
    # a range's metavar reads "INTEGER RANGE": its number type says enough here
    metavar = p.metavar or {"integer range": "INTEGER", "float range": "FLOAT"}.get(p.type.name)
    return f"{flags} {metavar or p.make_metavar(ctx)}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def cli_table() -> str:
    """One row per command: its arguments, its own options (not the shared --runs-dir/--db) and its help line."""
    rows = []
    for name, cmd in _commands(COMMANDS):
        ctx = click.Context(cmd, info_name=name)
        args = " ".join(_argument(p) for p in cmd.params if isinstance(p, click.Argument))
        opts = [_option(p, ctx) for p in cmd.params
                if isinstance(p, click.Option) and not p.hidden and p.name not in SHARED_OPTIONS]  # fmt: skip
        options = ", ".join(f"`{_cell(o)}`" for o in opts) or "-"
        usage = f"{name} {args}".strip()
        rows.append(f"| `{_cell(usage)}` | {options} | {_cell(cmd.get_short_help_str(limit=300))} |")
    return "| command | options | what it does |\n|---|---|---|\n" + "\n".join(rows)


SECTIONS = {"settings": settings_table, "schema": schema_doc, "cli": cli_table}


def render(text: str) -> str:
    for name, fn in SECTIONS.items():
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no <!-- BEGIN {name} --> ... <!-- END {name} --> block")
        text = pattern.sub(lambda m, fn=fn: m.group(1) + fn() + "\n" + m.group(2), text)
    return text


def main() -> int:
    old = README.read_text()
    new = render(old)
    if "--check" in sys.argv:
        return 0 if new == old else 1
    README.write_text(new)
    print("README.md " + ("updated" if new != old else "already up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
