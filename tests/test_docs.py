"""The README, docs/ and the code agree (datasette's test_docs idea)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from observatory import settings
from observatory.cli import COMMANDS
from observatory.events import KINDS
from observatory.store import schema_columns

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CLI_MD = (ROOT / "docs" / "cli.md").read_text()
SCHEMA_MD = (ROOT / "docs" / "schema.md").read_text()
EVENTS_MD = (ROOT / "docs" / "events.md").read_text()


def _kind_rows(text: str) -> set[str]:
    """Rows of the event kinds table: the section headed 'Kinds', up to the next heading."""
    section = re.split(r"^#+ Kinds\s*$", text, maxsplit=1, flags=re.M)[1]
    section = re.split(r"^#", section, maxsplit=1, flags=re.M)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_is_documented(kind):
    assert kind in _kind_rows(EVENTS_MD), f"event kind {kind!r} has no row in docs/events.md's kinds table"


def test_the_docs_document_no_kind_the_code_lacks():
    assert _kind_rows(EVENTS_MD) <= set(KINDS)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_field_of_a_kind_is_documented(kind):
    row = re.search(rf"^\| `{kind}` \|(.*)$", EVENTS_MD, flags=re.M).group(1)
    missing = [f.name for f in KINDS[kind].fields if f"`{f.name}`" not in row]
    assert not missing, f"docs/events.md's {kind} row lacks {missing}"


@pytest.mark.parametrize("table", sorted(schema_columns()))
def test_every_store_table_and_column_is_documented(table):
    text = SCHEMA_MD
    assert f"`{table}`" in text, f"table {table} is not in docs/schema.md"
    for column, _type, _doc in schema_columns()[table]:
        assert re.search(rf"\b{re.escape(column)}\b", text), f"{table}.{column} is not documented"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_cli_command_is_in_the_cli_reference(command):
    assert f"observatory {command}" in CLI_MD


@pytest.mark.parametrize("name", sorted(settings.SETTINGS))
def test_every_setting_is_documented(name):
    assert settings.SETTINGS[name].env in CLI_MD, (
        f"setting {name} ({settings.SETTINGS[name].env}) not in docs/cli.md"
    )


def test_generated_doc_sections_are_up_to_date():
    from observatory import docs

    for page in set(docs.PAGES.values()):
        text = page.read_text()
        assert docs.render(text, docs.blocks_of(page)) == text, (
            f"{page.name} is stale: run `python -m observatory.docs`"
        )


def _cli_rows() -> dict[str, str]:
    parts = CLI_MD.split("<!-- BEGIN cli -->", 1)
    assert len(parts) == 2, "docs/cli.md needs a generated <!-- BEGIN cli --> table"
    section = parts[1].split("<!-- END cli -->", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `(observatory [a-z ]+?)(?: [A-Z\[][^`]*)?` \|", line)
        if m:
            rows[m.group(1)] = line
    return rows


def test_cli_table_has_every_command_and_its_options():
    """Walks the click commands, groups included: a new command, subcommand or option shows up."""
    import click

    from observatory import docs

    rows = _cli_rows()
    leaves = dict(docs._commands(COMMANDS))
    assert set(rows) == set(leaves)
    for name, cmd in leaves.items():
        for p in cmd.params:
            if isinstance(p, click.Option) and p.name not in docs.SHARED_OPTIONS:
                assert max(p.opts, key=len) in rows[name], (
                    f"{name}: {p.opts} missing from docs/cli.md's CLI table"
                )
            if isinstance(p, click.Argument):
                assert p.human_readable_name.upper() in rows[name]
        assert cmd.get_short_help_str(limit=300).split("(")[0].strip() in rows[name].replace("\\|", "|")


def test_cli_table_is_regenerated_from_the_commands():
    from observatory import docs

    stale = CLI_MD.replace("| `observatory ingest` |", "| `observatory ingest --old-flag` |", 1)
    assert stale != CLI_MD and docs.render(stale, ["cli", "settings"]) == CLI_MD


def _relative_links(page: Path) -> list[tuple[str, Path]]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:|^#", target):
            continue  # a URL, mailto: or an anchor on the same page
        out.append((target, (page.parent / target.split("#", 1)[0]).resolve()))
    return out


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name
)
def test_every_relative_link_resolves(page):
    broken = [target for target, path in _relative_links(page) if not path.exists()]
    assert not broken, f"{page.relative_to(ROOT)} links to what is not there: {broken}"
