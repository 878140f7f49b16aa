"""`widgets.wire_figure` gives what plotly's own `go.Figure(...).to_dict()` gives, for every kind of figure
the pages draw and for the arrays plotly treats specially (int64 narrowed, 2-D shapes, skipped keys)."""

from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import polars as pl
import pytest

from observatory.dashboard import charts
from observatory.dashboard.widgets import wire_figure


def plotly_wire(fig: dict) -> dict:
    """The reference: the Figure plotly builds from the dict (unvalidated), as it hands it to the browser."""
    return go.Figure(data=[dict(t) for t in fig["data"]], layout=fig["layout"], _validate=False).to_dict()


def as_json(wired: dict):
    return json.loads(pio.to_json(wired, validate=False))


def _series() -> dict:
    n = 400
    df = pl.DataFrame(
        {
            "step": np.arange(n) * 8,
            "min": np.linspace(3, 1, n),
            "max": np.linspace(4, 2, n),
            "last": np.r_[np.linspace(3.5, 1.5, n - 1), np.nan],
            "n": np.full(n, 8),
            "n_nonfinite": np.r_[np.zeros(n - 1), 1],
        }
    )
    fig = charts.series_figure(df, "train/loss", smoothing=0.6, log_y=True)
    bands = pl.DataFrame(
        {
            "step": np.arange(50),
            "min": np.zeros(50),
            "max": np.ones(50),
            "mean": np.full(50, 0.5),
            "worst_layer": np.arange(50) % 48,
            "n_layers": np.full(50, 48),
        }
    )
    fig["data"] += charts.layer_band(bands, "drop fraction")
    return fig


def _heatmaps() -> list[dict]:
    rng = np.random.default_rng(0)
    layers, steps, experts = 48, 60, 384
    drop = rng.random((layers, steps)) * 0.07
    drop[:, 5] = np.nan  # a step without expert_load: dropped from the drawing
    ov = {
        "layers": np.arange(layers),
        "steps": np.arange(steps) * 16,
        "drop_frac": drop,
        "hot_max": rng.random((layers, steps)) * 3,
    }
    routed = rng.integers(0, 5000, (experts, steps)).astype(float)
    share = routed / routed.sum(axis=0)
    hm = {
        "experts": np.arange(experts),
        "steps": np.arange(steps) * 16,
        "routed": routed,
        "share": share,
        "drop_frac": rng.random((experts, steps)) * 0.1,
    }
    order = np.argsort(-routed.sum(axis=1))
    return [
        charts.layer_heatmap(ov, 3, "drop fraction by layer"),
        charts.expert_heatmap(
            hm, "share", order, {int(order[0]): "hot 17", int(order[-1]): "dead"}, "layer 3"
        ),
    ]


def _odd_arrays() -> dict:
    """Arrays plotly treats specially: int64/uint64 narrowed or left as they are, 2-D with a shape, empty,
    under a skipped key (`range`), inside lists and tuples, and a layout with a template of its own."""
    return {
        "data": [
            {
                "type": "scatter",
                "x": np.arange(10, dtype=np.int64),
                "y": np.arange(10, dtype=np.int64) * 100_000,
                "customdata": np.ones((10, 3)),
                "marker": {"color": np.arange(10, dtype=np.uint64), "size": np.array([], float)},
            },
            {
                "type": "scatter",
                "x": np.array([2**40, 2**41], dtype=np.int64),
                "y": (np.float32(1.5), 2),
                "text": ["a", "<b>b</b>"],
                "line": {"width": 0},
            },
            {"type": "heatmap", "z": [np.arange(3.0), np.arange(3.0)], "zmin": np.float64(0.0)},
        ],
        "layout": {
            "xaxis": {"range": np.array([0.0, 5.0])},
            "shapes": [{"type": "line", "x0": 1, "x1": 1}],
            "annotations": ({"text": "x", "x": np.int64(3)},),
            "template": {"layout": {"font": {"size": 9}}},
        },
    }


CASES = {
    "series": _series,
    "layer heatmap": lambda: _heatmaps()[0],
    "expert heatmap": lambda: _heatmaps()[1],
    "odd arrays": _odd_arrays,
    "empty": lambda: {"data": [], "layout": {}},
}


@pytest.mark.parametrize("name", CASES)
def test_wire_figure_is_plotlys_wire_form(name):
    fig = CASES[name]()
    ours, ref = wire_figure(fig), plotly_wire(fig)
    assert as_json(ours) == as_json(ref)
    # arrays travel base64-encoded (`bdata`), as plotly sends them, not as lists of numbers
    assert pio.to_json(ours, validate=False).count('"bdata"') == pio.to_json(ref, validate=False).count(
        '"bdata"'
    )


def test_wire_figure_leaves_its_input_as_it_was():
    """The input is a cached query's figure, shared by every session: building the wire form must not touch it."""
    fig = _odd_arrays()
    before = pio.to_json(fig, validate=False)
    wire_figure(fig)
    assert isinstance(fig["data"][0]["x"], np.ndarray) and fig["layout"]["template"] == {
        "layout": {"font": {"size": 9}}
    }
    assert pio.to_json(fig, validate=False) == before
