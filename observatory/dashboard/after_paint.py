"""`after_first_paint(key)`: whether the browser has drawn this page's first plotly chart yet.

It lets a page send its first chart alone and the rest once that chart is on
screen, so the first chart reaches the screen sooner.
"""

from __future__ import annotations

import functools
from pathlib import Path

import streamlit.components.v2 as components

__all__ = ["after_first_paint"]


@functools.cache
def _component():
    """The zero-height component of `after_paint.js`, declared once per server process."""
    js = (Path(__file__).parent / "after_paint.js").read_text()
    return components.component("observatory_after_paint", js=js)


def after_first_paint(key: str) -> bool:
    """False until the browser has drawn a plotly chart on this page; then (about 1 s later) True.

    A zero-height component (`after_paint.js`, Streamlit's iframe-free v2 components): its
    state turning True reruns the script (or the fragment it sits in). Without a browser
    (AppTest) it stays False; the page's next run draws everything anyway.
    """
    res = _component()(key=key, default={"painted": False}, height=0, on_painted_change=lambda: None)
    return bool(getattr(res, "painted", False))
