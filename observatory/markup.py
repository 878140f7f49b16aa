"""Text from logs stays inert: the one place that turns it into Markdown or HTML.

Decision texts, notes, run names, tags, config values and failure messages come from
anyone who can write an event log, and pages and reports show them to anyone who can
open the dashboard. None of it may run script or inject links:

- `md_escape(text)`: the text as Markdown that renders as exactly that text -- every
  Markdown and HTML special character backslash-escaped, Streamlit's `:color[...]`,
  `:emoji:` and `$math$` syntax included, newlines folded, bare URLs and addresses kept
  from being linked (a zero-width space after `https`, `www`, `@`). For the pages' `st.markdown`,
  captions, subheaders and alerts, and for Markdown reports.
- `markdown_html(text)`: Markdown prose (a decision's hypothesis, say) rendered to HTML
  with markdown-it-py, raw HTML disabled (it is shown as text), images shown as text (no
  reader's browser fetches a log writer's URL) and only `http:`, `https:`, `mailto:` and
  relative links (`safe_url`): no `javascript:`,
  `data:`, `vbscript:` or `file:`, however they are spelled or entity-encoded.
- `plot_text(text)`: the text for a plotly figure (a trace name, title, hover text):
  plotly renders a subset of HTML (`<b>`, `<a href>`, `<br>`) there, so HTML-escaped.
- `Markup`: a str that is already HTML (what `markdown_html` returns); HTML builders
  escape every other str.
- `CSV_FORMULA`: a CSV cell a spreadsheet would run as a formula (`=cmd|' /C calc'!A0`,
  `+`, `-`, `@`, a tab or carriage return first); CSV writers (the SQL page's download,
  `export --format csv`) prefix such a text cell with `'` (`csv_cell`).
"""

from __future__ import annotations

import html
import re
import unicodedata
from urllib.parse import unquote

from markdown_it import MarkdownIt

__all__ = ["Markup", "md_escape", "markdown_html", "plot_text", "safe_url", "CSV_FORMULA", "csv_cell"]

CSV_FORMULA = r"^[=+\-@\t\r]"  # (a regex for polars and Arrow too)


def csv_cell(text: str) -> str:
    """A text cell for a CSV file: one a spreadsheet would take for a formula gets a leading `'`."""
    return "'" + text if re.match(CSV_FORMULA, text) else text


class Markup(str):
    """A string that is HTML already (escaped or sanitised); builders insert it as is."""


# what makes HTML, links, images, code spans, emphasis, tables, Streamlit's `:red[...]` and `$math$`
_MD_SPECIAL = re.compile(r"([\\`*_\[\]()<>&~:$|!])")
_MD_BLOCK_START = re.compile(r"^([#+\-=>]|\d+[.)])")  # a heading, list, rule or quote at the line's start


# GitHub-flavoured Markdown (Streamlit's) links bare URLs and addresses after parsing, escapes or not:
# a zero-width space after the scheme, `www` or `@` keeps them text
_AUTOLINK = re.compile(r"(?i)(https?|ftps?|mailto|xmpp|www)(?=[:.])|(@)")
ZWSP = "\u200b"


def md_escape(text: object) -> str:
    """`text` (any value, shown with str) as Markdown that renders literally, on one line."""
    s = " ".join(str(text).split())  # newlines would start blocks (headings, lists, code)
    s = _AUTOLINK.sub(lambda m: m.group(0) + ZWSP, s)
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return _MD_BLOCK_START.sub(lambda m: m.group(1)[:-1] + "\\" + m.group(1)[-1], s)


def plot_text(text: object) -> str:
    """`text` for a plotly figure's names, titles and hover text: shown as text, not plotly's HTML."""
    return html.escape(str(text), quote=False)


_SAFE_SCHEMES = ("http", "https", "mailto")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*):")


def safe_url(url: str) -> bool:
    """True for http(s)/mailto URLs and relative ones; False for every other scheme.

    The URL is decoded first (HTML entities, %-escapes) and stripped of whitespace and
    control characters, the way browsers read `java&#x09;script:` or `%6Aavascript:`.
    """
    s = url
    for _ in range(3):  # nested encodings
        s = unquote(html.unescape(s))
    s = "".join(c for c in s if not (c.isspace() or unicodedata.category(c).startswith("C")))
    m = _SCHEME.match(s)
    if m is None:
        return ":" not in s.split("/", 1)[0]  # relative (a colon before any slash reads as a scheme)
    return m.group(1).lower() in _SAFE_SCHEMES


_MD = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
_MD.validateLink = safe_url  # links with any other scheme stay text
_MD.disable(
    "image"
)  # an image would make every reader's browser fetch the log writer's URL: `![alt](url)` stays text


def markdown_html(text: str) -> Markup:
    """Markdown prose as sanitised HTML: raw HTML escaped, unsafe links left as text."""
    return Markup(_MD.render(str(text)))
