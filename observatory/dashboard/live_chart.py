"""`live_chart(fig, key, window_key)`: a plotly chart that a rerun updates in place, for the Live page.

`st.plotly_chart` gives a chart a new element id whenever its figure changes, and the browser
then mounts a new chart: every redraw of a growing run blanked each chart for about 0.2 s.
This chart is a Streamlit v2 component (`live_chart.js`, no iframe) with a stable key, whose
`<div>` gets `Plotly.react` with the new figure: what is drawn stays drawn while it updates.
Its title is a line of text above the plot (plotly's toolbar never covers it). plotly.js is the
copy the plotly package ships (`plotly/package_data/plotly.min.js`), served by Streamlit's
component asset route and loaded once per page. Where that route cannot be set up (another
Streamlit), the chart falls back to `st.plotly_chart`.

A box selection zooms the chart group's step window, as `widgets.show_chart` does. Under
AppTest the component's data (`{"figure": ...}`) is the figure in plotly's wire form.
"""

from __future__ import annotations

import functools
from pathlib import Path

from observatory.dashboard.cache import derive
from observatory.dashboard.widgets import apply_box, show_chart, wire_figure

__all__ = ["live_chart", "plotly_src", "CONFIG"]

ASSETS = "observatory.plotly"  # the component whose asset folder is plotly's package_data
# plotly's toolbar without the tools that do not apply (lasso) or that fight the step window (autoscale)
CONFIG = {
    "displaylogo": False,
    "showSendToCloud": False,
    "showEditInChartStudio": False,
    "responsive": True,
    "modeBarButtonsToRemove": ["lasso2d", "autoScale2d", "sendDataToCloud"],
}
# While a rerun has not re-sent an element, Streamlit marks it stale and fades it after 0.5 s; on a page
# of live charts what is drawn stays as it is until its update arrives, so nothing there is faded.
CSS = """
.stMain:has(.obs-chart) [data-stale="true"] { opacity: 1 !important; transition: none !important; }
@media (max-width: 640px) {  /* a phone: the page's header keeps to the top of the first screen */
  .stMain:has(.obs-chart) .stMainBlockContainer { padding-top: 4rem; }
  .stMain:has(.obs-chart) h1 { font-size: 1.6rem; padding: 0 0 0.25rem 0; }
  .stMain:has(.obs-chart) [data-testid="stVerticalBlock"] { gap: 0.5rem; }
}
.obs-chart-title { font-size: 14px; font-weight: 600; line-height: 1.3; margin: 0 0 2px 4px; overflow-wrap: anywhere; }
"""


@functools.cache
def plotly_src() -> str | None:
    """The page-relative URL of plotly.min.js (plotly's own copy), or None where it cannot be served.

    Registers plotly's package_data folder as the asset folder of a v2 component with
    Streamlit's component manager, the way a package's `[tool.streamlit.component]` manifest is.
    """
    try:
        import plotly
        from streamlit.components.v2.get_bidi_component_manager import get_bidi_component_manager
        from streamlit.components.v2.manifest_scanner import ComponentConfig, ComponentManifest

        root = Path(plotly.__file__).parent
        if not (root / "package_data" / "plotly.min.js").is_file():
            return None
        manifest = ComponentManifest(
            name=ASSETS.split(".")[0],
            version=plotly.__version__,
            components=[ComponentConfig(name=ASSETS.split(".")[1], asset_dir="package_data")],
        )
        get_bidi_component_manager().register_from_manifest(manifest, root)
    except Exception:  # another Streamlit: no asset route to use
        return None
    # relative to the page (/live, or /<base path>/live behind a proxy)
    return f"_stcore/bidi-components/{ASSETS}/plotly.min.js?v={plotly.__version__}"


@functools.cache
def _component():
    import streamlit.components.v2 as components

    js = (Path(__file__).parent / "live_chart.js").read_text()
    return components.component("observatory_live_chart", js=js, css=CSS, isolate_styles=False)


def live_chart(fig: dict, key: str, window_key: str | None = None) -> None:
    """Draw a figure dict that later reruns update in place; a box selection zooms `window_key`'s window."""
    src = plotly_src()
    if src is None:
        show_chart(fig, key=key, window_key=window_key)
        return
    data = {"figure": derive(wire_figure, fig), "config": CONFIG, "src": src}
    res = _component()(key=key, data=data, default={"box": None}, on_box_change=lambda: None)
    box = getattr(res, "box", None)
    if window_key is not None and isinstance(box, list) and len(box) == 3:
        apply_box(key, window_key, box[:2], box[2])
