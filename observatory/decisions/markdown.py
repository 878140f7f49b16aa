"""Decisions as Markdown files: YAML front matter for the structure, sections for the prose.

One file per decision, so a lab can keep its decisions in git and review them in
pull requests. `export_dir` then `import_dir` into an empty store gives back the
same records with the same history (the front matter carries the event history);
importing into a store that has the decision writes one update with what changed.

    ---
    id: enable-zloss
    title: Enable z-loss after the grad-norm climb
    kind: intervention
    status: running
    runs: [{run: d512, step: 1200}]
    ...
    ---
    # Enable z-loss after the grad-norm climb

    ## Hypothesis

    Logit growth drives the grad norm...
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from observatory.decisions import store as ds
from observatory.decisions.record import DECISIONS_RUN, Decision

__all__ = ["SECTIONS", "dumps", "loads", "export_dir", "import_dir"]

# prose fields that live in the body, as `## Heading` sections (front matter keeps the rest)
SECTIONS = {
    "hypothesis": "Hypothesis",
    "goal": "Goal",
    "action": "Action",
    "outcome": "Outcome",
    "follow_up": "Follow-up",
}
_HEADING = {v.lower(): k for k, v in SECTIONS.items()}
_HEADING_RE = re.compile(r"^## +(.+?)\s*$", re.MULTILINE)


def _in_body(text: str) -> bool:
    """Prose goes in the body only if it reads back byte-identical from there."""
    if not text or text != text.strip():
        return False
    return not any(
        m.group(1).lower() in _HEADING for m in _HEADING_RE.finditer(text)
    ) and not text.startswith("# ")


def dumps(d: Decision, history: list[dict] | None = None) -> str:
    """A decision (and optionally its event payloads, oldest first) as a Markdown document."""
    meta = d.to_dict()
    body = [f"# {d.title}", ""] if "\n" not in d.title else []
    for name, heading in SECTIONS.items():
        text = getattr(d, name)
        if _in_body(text):
            meta.pop(name, None)
            body += [f"## {heading}", "", text, ""]
    if history:
        meta["history"] = [{k: v for k, v in h.items() if k != "id"} for h in history]
    import yaml  # lazy, with frontmatter: ~15 ms of every command's start-up, for the decision files only

    head = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=100)
    return f"---\n{head}---\n" + "\n".join(body).rstrip("\n") + "\n"


def loads(text: str, *, source: str = "<text>") -> tuple[dict[str, Any], list[dict] | None]:
    """Parse a decision document into (fields, history or None). Errors name the source."""
    import frontmatter  # lazy (see `dumps`)
    import yaml

    try:
        post = frontmatter.loads(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{source}: front matter is not valid YAML: {e}") from None
    meta = dict(post.metadata)
    history = meta.pop("history", None)
    if history is not None and (
        not isinstance(history, list) or not all(isinstance(h, dict) for h in history)
    ):
        raise ValueError(f"{source}: history must be a list of mappings")
    body = post.content
    parts = _HEADING_RE.split(body)
    # parts = [preamble, heading1, text1, heading2, text2, ...]; unknown headings stay in the text before them
    preamble, current, chunks = parts[0], None, {}
    for heading, chunk in zip(parts[1::2], parts[2::2], strict=True):
        key = _HEADING.get(heading.lower())
        if key is None:
            if current is None:
                preamble += f"## {heading}{chunk}"
            else:
                chunks[current] += f"## {heading}{chunk}"
            continue
        if key in chunks:
            raise ValueError(f"{source}: section '## {heading}' appears twice")
        current, chunks[key] = key, chunk
    for key, chunk in chunks.items():
        if key in meta:
            raise ValueError(f"{source}: {key} is given both in the front matter and as a section")
        meta[key] = chunk.strip("\n").rstrip()
    pre = preamble.strip()
    title_line = re.match(r"^# +(.+?)\s*$", pre.split("\n", 1)[0]) if pre else None
    if title_line:
        meta.setdefault("title", title_line.group(1))
        pre = pre.split("\n", 1)[1].strip() if "\n" in pre else ""
    if pre:
        if "hypothesis" in meta:
            raise ValueError(f"{source}: text before the first section; put it under a '## ' heading")
        meta["hypothesis"] = pre  # a plain note with no sections reads as the hypothesis
    return meta, history


def _check(meta: dict, source: str) -> Decision:
    try:
        return Decision.from_dict(meta)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{source}: {e}") from None


def read_file(path: Path) -> tuple[dict[str, Any], list[dict] | None]:
    return loads(Path(path).read_text(encoding="utf-8"), source=str(path))


def export_dir(db, out_dir, unreadable: list[tuple[str, str]] | None = None) -> list[Path]:
    """Write <out_dir>/<id>.md for every decision (with its history); returns the paths.

    Records that are not valid decisions are not written; their `(id, reason)` goes to `unreadable`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for d in ds.list_decisions(db, unreadable=unreadable):
        events = [e["data"] for e in ds.history(db, d.id)]
        p = out / f"{d.id}.md"
        p.write_text(dumps(d, events), encoding="utf-8")
        paths.append(p)
    return paths


def import_dir(runs_dir, db, in_dir, *, ingest: ds.Ingest | None = None) -> dict[str, list[str]]:
    """Load every *.md of a folder. New decisions replay their history; known ones get one update.

    Every file is validated before anything is written, so a bad file (named in the
    error) stops the import without writing half of it. When anything was written and
    `ingest` is given, calls `ingest(runs_dir, db)`. Returns {created, updated, unchanged}.
    """
    files = sorted(Path(in_dir).glob("*.md"))
    parsed = []
    for p in files:
        meta, hist = read_file(p)
        rec = _check(meta, str(p))
        for i, h in enumerate(hist or []):
            if not isinstance(h, dict):
                raise ValueError(f"{p}: history[{i}] must be a mapping")
        parsed.append((p, rec, hist))
    result: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": []}
    writes: dict[str, list[tuple[dict, int | None]]] = {}
    for p, rec, hist in parsed:
        cur = ds.get(db, rec.id)
        if cur is None:
            events = [{"id": rec.id, **h} for h in hist] if hist else [rec.to_dict()]
            # the replayed history must fold to what the file says, or it is not the same decision
            folded: dict[str, Any] = {}
            for e in events:
                folded.update(e)
            if _check(folded, str(p)).to_dict(times=False) != rec.to_dict(times=False):
                raise ValueError(
                    f"{p}: its history does not fold to its front matter; drop `history` to import as is"
                )
            writes.setdefault(ds.folder_for(runs_dir, rec), []).extend(
                (e, ds.event_step(rec) if i == 0 else None) for i, e in enumerate(events)
            )
            result["created"].append(rec.id)
            continue
        delta = ds.diff_fields(cur, rec)
        if not delta:
            result["unchanged"].append(rec.id)
            continue
        if "status" in delta:
            try:
                cur.check_transition(rec.status)
            except ValueError as e:
                raise ValueError(f"{p}: {e}") from None
        home = ds.home_run(db, rec.id) or DECISIONS_RUN
        writes.setdefault(home, []).append(({"id": rec.id, **delta, "updated": time.time()}, None))
        result["updated"].append(rec.id)
    for run, items in writes.items():
        ds.write_events(runs_dir, run, items)
    if ingest is not None and writes:
        ingest(runs_dir, db)
    return result
