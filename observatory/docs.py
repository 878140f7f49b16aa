"""Regenerate the documentation sections that follow from code: `python -m observatory.docs`.

The settings table (docs/cli.md) comes from `observatory.settings.SETTINGS`, the SQL
schema (docs/schema.md) from `observatory.store.SCHEMA_DOC` (itself generated from the
DDL) and the CLI table (docs/cli.md) from the click commands of
`observatory.cli.COMMANDS`, so the pages cannot drift from them; `tests/test_docs.py`
checks they are up to date.
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

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = {
    "settings": DOCS / "cli.md",
    "cli": DOCS / "cli.md",
    "schema": DOCS / "schema.md",
}  # block -> its page


def settings_table() -> str:
    rows = [f"| `{s.name}` | `{s.env}` | `{s.default}` | {s.help}{_bounds(s)} |" for s in SETTINGS.values()]
    return "| setting | env | default | meaning |\n|---|---|---|---|\n" + "\n".join(rows)


def _bounds(s) -> str:
    text = s.range_text()
    return f" (must be {text})" if text else ""


def schema_doc() -> str:
    # docs/schema.md nests the tables under its title
    return re.sub(r"^## ", "### ", SCHEMA_DOC.strip(), flags=re.M)


# described once, in the prose above the CLI table
SHARED_OPTIONS = {"runs_dir", "db", "help"}


def _commands(
    cmds: dict[str, click.Command], prefix: str = "observatory"
) -> Iterator[tuple[str, click.Command]]:
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
        opts = [
            _option(p, ctx)
            for p in cmd.params
            if isinstance(p, click.Option) and not p.hidden and p.name not in SHARED_OPTIONS
        ]
        options = ", ".join(f"`{_cell(o)}`" for o in opts) or "-"
        usage = f"{name} {args}".strip()
        rows.append(f"| `{_cell(usage)}` | {options} | {_cell(cmd.get_short_help_str(limit=300))} |")
    return "| command | options | what it does |\n|---|---|---|\n" + "\n".join(rows)


SECTIONS = {"settings": settings_table, "schema": schema_doc, "cli": cli_table}


def render(text: str, blocks=None) -> str:
    """`text` with its generated blocks (`blocks`: their names; default every one it must hold) made anew."""
    for name in blocks or SECTIONS:
        fn = SECTIONS[name]
        pattern = re.compile(rf"(<!-- BEGIN {name} -->\n).*?(<!-- END {name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"no <!-- BEGIN {name} --> ... <!-- END {name} --> block")
        text = pattern.sub(lambda m, fn=fn: m.group(1) + fn() + "\n" + m.group(2), text)
    return text


def blocks_of(page: Path) -> list[str]:
    return [name for name, p in PAGES.items() if p == page]


def main() -> int:
    stale = []
    for page in dict.fromkeys(PAGES.values()):
        old = page.read_text()
        new = render(old, blocks_of(page))
        if new != old:
            stale.append(page.name)
            if "--check" not in sys.argv:
                page.write_text(new)
    if "--check" in sys.argv:
        return 1 if stale else 0
    print(f"updated {', '.join(stale)}" if stale else "docs already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
