"""Regenerate the README sections that follow from code: `python -m observatory.docs`.

The settings table comes from `observatory.settings.SETTINGS` and the SQL schema
from `observatory.store.SCHEMA_DOC` (itself generated from the DDL), so the README
cannot drift from them; `tests/test_docs.py` checks the README is up to date.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from observatory.settings import SETTINGS
from observatory.store import SCHEMA_DOC

README = Path(__file__).resolve().parent.parent / "README.md"


def settings_table() -> str:
    rows = [f"| `{s.name}` | `{s.env}` | `{s.default}` | {s.help} |" for s in SETTINGS.values()]
    return "| setting | env | default | meaning |\n|---|---|---|---|\n" + "\n".join(rows)


def schema_doc() -> str:
    # the README nests the tables under "## SQL schema"
    return re.sub(r"^## ", "### ", SCHEMA_DOC.strip(), flags=re.M)


SECTIONS = {"settings": settings_table, "schema": schema_doc}


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
