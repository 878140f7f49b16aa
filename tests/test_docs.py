"""The README, shared/EVENTS.md and the code agree (datasette's test_docs idea)."""

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
EVENTS_MD = ROOT.parent / "shared" / "EVENTS.md"


def _kind_rows(text: str) -> set[str]:
    """Rows of the event kinds table: the section headed 'Kinds', up to the next heading."""
    section = re.split(r"^#+ Kinds\s*$", text, maxsplit=1, flags=re.M)[1]
    section = re.split(r"^#", section, maxsplit=1, flags=re.M)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_is_documented_in_the_readme(kind):
    assert kind in _kind_rows(README), f"event kind {kind!r} has no row in the README's kinds table"


def test_readme_documents_no_kind_the_code_lacks():
    assert _kind_rows(README) <= set(KINDS)


@pytest.mark.skipif(not EVENTS_MD.exists(), reason="shared/EVENTS.md is beside the repo only in a checkout")
def test_readme_copy_of_events_md_matches_the_contract():
    contract = _kind_rows(EVENTS_MD.read_text())
    assert contract == set(KINDS)


@pytest.mark.parametrize("table", sorted(schema_columns()))
def test_every_store_table_and_column_is_documented(table):
    section = README.split("## SQL schema", 1)
    assert len(section) == 2, "README needs a '## SQL schema' section"
    text = section[1].split("\n## ", 1)[0]
    assert f"`{table}`" in text, f"table {table} is not in the README's SQL schema"
    for column, _type, _doc in schema_columns()[table]:
        assert re.search(rf"\b{re.escape(column)}\b", text), f"{table}.{column} is not documented"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_cli_command_is_in_the_cli_reference(command):
    ref = README.split("## CLI reference", 1)
    assert len(ref) == 2, "README needs a '## CLI reference' section"
    assert f"observatory {command}" in ref[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("name", sorted(settings.SETTINGS))
def test_every_setting_is_documented(name):
    assert settings.SETTINGS[name].env in README, f"setting {name} ({settings.SETTINGS[name].env}) not in README"


def test_generated_readme_sections_are_up_to_date():
    from observatory import docs

    assert docs.render(README) == README, "README is stale: run `python -m observatory.docs`"
