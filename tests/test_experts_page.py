"""The Experts and Live pages at the reference run's shape (48 layers x 384 experts) under AppTest.

The store is a real one (`scale_fixtures.make_scale_store`: writer, ingester and
the detectors' findings), 80 steps with expert_load every 4: few steps, all the rows.
"""

from __future__ import annotations

import numpy as np
import pytest
from dashboard_fixtures import chart_specs
from scale_fixtures import (
    DEAD_EXPERTS,
    EVERY,
    EXPERTS,
    HOT_EXPERT,
    HOT_LAYER,
    LAYERS,
    RUN,
    STEPS,
    WORST_DROP_LAYER,
    WORST_LB_LAYER,
    loads,
    make_scale_store,
)
from streamlit.testing.v1 import AppTest
from test_dashboard import arr, page

from observatory.queries import dashboard as qd
from observatory.queries import experts as qe
from observatory.store import connect


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    _, db = make_scale_store(tmp_path_factory.mktemp("scale"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OBSERVATORY_DB", str(db))
        yield db


def charts(at: AppTest) -> dict[str, dict]:
    """Plotly specs (st.plotly_chart's and the Live page's in-place charts') by their title."""
    return {spec["layout"]["title"]["text"]: spec for spec in chart_specs(at)}


def chart(at: AppTest, start: str) -> dict:
    found = [s for t, s in charts(at).items() if t.startswith(start)]
    assert len(found) == 1, (start, list(charts(at)))
    return found[0]


def test_experts_page_at_384_experts(store):
    at = page("experts", run=RUN, layer=str(HOT_LAYER))
    assert not at.exception
    specs = list(charts(at).values())
    overview = specs[0]  # the all-layer overview is the first chart on the page
    assert overview["layout"]["title"]["text"].startswith("Drop fraction, every layer")
    assert overview["data"][0]["y"] == [str(x) for x in range(LAYERS)]
    z = arr(overview["data"][0]["z"])
    assert z.shape[0] == LAYERS
    assert int(np.nanargmax(np.nanmean(z, axis=1))) == WORST_DROP_LAYER
    assert overview["layout"]["height"] >= 9 * LAYERS  # sized to its rows
    assert overview["layout"]["shapes"][0]["y0"] == HOT_LAYER - 0.5  # the open layer is outlined

    share = chart(at, f"Layer {HOT_LAYER}: load share")
    hm = share["data"][0]
    assert len(hm["y"]) == EXPERTS and arr(hm["z"]).shape[0] == EXPERTS
    assert hm["y"] == [str(e) for e in range(EXPERTS)]  # by id: an order the axis explains
    assert share["layout"]["yaxis"]["title"]["text"] == "expert"
    assert share["layout"]["xaxis"]["title"]["text"] == "step"
    assert overview["layout"]["yaxis"]["title"]["text"] == "layer"
    assert overview["layout"]["xaxis"]["title"]["text"] == "step"
    assert share["layout"]["height"] >= 2 * EXPERTS
    ticks = share["layout"]["yaxis"]
    assert 20 <= len(ticks["tickvals"]) <= 100  # thinned, not 384 overlapping labels
    text = dict(zip(ticks["tickvals"], ticks["ticktext"], strict=True))
    assert "hot" in text[str(HOT_EXPERT)]
    first_dead = str(DEAD_EXPERTS[0])  # adjacent rows share one label: "300 dead +2"
    assert "dead" in text[first_dead] and text[first_dead].endswith(f"+{len(DEAD_EXPERTS) - 1}")
    assert "expert %{y}" in hm["hovertemplate"] and "dropped" in hm["hovertemplate"]
    drop = chart(at, f"Layer {HOT_LAYER}: dropped / routed")
    assert drop["data"][0]["y"] == hm["y"]  # the same row order in both heatmaps

    busiest = at.dataframe[0].value
    assert int(busiest.iloc[0]["expert"]) == HOT_EXPERT
    flagged = at.dataframe[1].value
    assert (flagged["finding"] == "hot").sum() == 1
    assert int(flagged[flagged["finding"] == "hot"]["expert"].iloc[0]) == HOT_EXPERT
    assert set(DEAD_EXPERTS) <= set(flagged[flagged["finding"] == "dead"]["expert"].astype(int))
    assert any("4× the mean load" in c.value and "20 logged steps" in c.value for c in at.caption)

    # many layers: the per-layer charts are a band, the chosen layer and the worst (bold red), not 48 lines
    lines = chart(at, "Drop fraction per layer")
    assert len(lines["data"]) <= 5 and any(t.get("fill") == "tonexty" for t in lines["data"])
    assert f"worst: layer {WORST_DROP_LAYER}" in lines["layout"]["title"]["text"]
    (worst,) = [t for t in lines["data"] if t.get("name") == f"layer {WORST_DROP_LAYER} (worst)"]
    assert worst["line"]["color"] == "#d62728" and worst["line"]["width"] >= 2
    assert lines["layout"]["yaxis"]["title"]["text"] == "dropped / routed"
    assert lines["layout"]["xaxis"]["title"]["text"] == "step"

    # drill down with the layer picker: the URL follows, the heatmaps are that layer's
    at.selectbox(key="experts_layer").set_value(WORST_DROP_LAYER).run()
    assert not at.exception
    assert at.query_params["layer"] in (str(WORST_DROP_LAYER), [str(WORST_DROP_LAYER)])
    hm = chart(at, f"Layer {WORST_DROP_LAYER}: load share")["data"][0]
    assert hm["y"] == [str(e) for e in range(EXPERTS)]
    assert len(at.dataframe) == 1  # the busiest experts; no finding in this layer...
    assert any(f"None in layer {WORST_DROP_LAYER}" in c.value for c in at.caption)
    assert any(f"layer {HOT_LAYER}: 3 dead, 1 hot" in c.value for c in at.caption)  # ...but in layer 7


def test_experts_page_deep_link_to_a_layer(store):
    at = page("experts", run=RUN, layer=str(WORST_DROP_LAYER))
    assert not at.exception
    assert at.selectbox(key="experts_layer").value == WORST_DROP_LAYER
    assert chart(at, f"Layer {WORST_DROP_LAYER}: load share")


def test_live_health_charts_band_across_48_layers(store):
    at = page("live", run=RUN)
    at.run()  # the health charts come on the rerun after the first paint
    assert not at.exception
    drop = chart(at, "Drop fraction")
    lb = chart(at, "Load-balancing loss")
    for spec, worst in ((drop, WORST_DROP_LAYER), (lb, WORST_LB_LAYER)):
        assert len(spec["data"]) < 10  # a band, not 48 traces
        assert any(t.get("fill") == "tonexty" for t in spec["data"])
        assert any(t.get("name") == f"{LAYERS} layers, mean" for t in spec["data"])
        assert f"worst: layer {worst}" in spec["layout"]["title"]["text"]
        assert sum(1 for t in spec["data"] if t.get("showlegend", True)) <= 4
    mean = next(t for t in drop["data"] if t.get("name") == f"{LAYERS} layers, mean")
    assert (arr(mean["customdata"])[:, 2] == WORST_DROP_LAYER).all()  # the hover names the worst layer


def test_layer_queries_match_the_raw_rows(store):
    with connect(store) as con:
        view = qe.experts_view(con, RUN, HOT_LAYER, None, None)
        ov = view["overview"]
        raw = con.execute(
            "SELECT layer, sum(dropped) / sum(routed) FROM expert_load WHERE run = ? GROUP BY layer ORDER BY layer",
            [RUN],
        ).fetchall()
        # every logged step is its own column here: the column mean of per-step fractions
        per_step = {
            layer: np.mean(
                [loads(s, layer)[1].sum() / loads(s, layer)[0].sum() for s in range(0, STEPS, EVERY)]
            )
            for layer in range(LAYERS)
        }
        assert [r[0] for r in raw] == list(ov["layers"])
        assert np.nanmean(ov["drop_frac"], axis=1) == pytest.approx([per_step[x] for x in range(LAYERS)])
        assert view["heatmap"]["share"].shape[1] <= 80_000 // EXPERTS  # the cell budget caps the columns
        bands = qd.layer_bands(
            con, RUN, ["moe/layer_*/drop_fraction", "router/layer_*/lb_loss"], 0, STEPS - 1
        )
        assert bands["worst"]["moe/layer_*/drop_fraction"]["layer"] == WORST_DROP_LAYER
        assert bands["worst"]["router/layer_*/lb_loss"]["layer"] == WORST_LB_LAYER
        d = bands["data"].filter(bands["data"]["family"] == "router/layer_*/lb_loss")
        assert d.height == STEPS and (d["n_layers"] == LAYERS).all()
        assert d["max"].to_numpy() == pytest.approx(1.5) and d["min"].to_numpy() == pytest.approx(1.0)


def test_a_running_runs_expert_view_is_kept_fresh_and_a_finished_ones_is_not(
    tmp_path, monkeypatch, query_cache
):
    """The Experts page asks the cache to keep a running run's view fresh in the background (as the Live
    panel's is), so viewers arriving after a commit find it filled; a finished run's is not polled."""
    from dashboard_fixtures import write_run

    from observatory.pipeline import ingest

    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    write_run(runs, "live-run", range(20), finish=False)
    write_run(runs, "done-run", range(20))
    ingest(runs, db, emit=None)
    monkeypatch.setenv("OBSERVATORY_DB", str(db))

    def hot(run: str) -> list:
        return [b for b in query_cache.hot if any("experts:experts_view" in k and f'"{run}"' in k for k in b)]

    at = page("experts", run="live-run")
    assert not at.exception and charts(at)
    assert hot("live-run")
    at = page("experts", run="done-run")
    assert not at.exception and charts(at)
    assert not hot("done-run")


def test_a_few_layers_the_worst_line_stands_out_and_the_axes_say_what_they_are():
    import polars as pl

    from observatory.dashboard.pages.experts import layer_lines

    df = pl.DataFrame(
        {
            "layer": [0, 0, 1, 1, 2, 2],
            "step": [0, 10, 0, 10, 0, 10],
            "drop_fraction": [0.01, 0.02, 0.20, 0.30, 0.02, 0.01],
        }
    )
    fig = layer_lines(df, "drop_fraction", "Drop fraction per layer", [0])
    (worst,) = [t for t in fig["data"] if t["name"] == "layer 1 (worst)"]
    assert worst["line"]["color"] == "#d62728" and worst["opacity"] == 1.0
    assert "worst: layer 1" in fig["layout"]["title"]["text"]
    assert fig["layout"]["xaxis"]["title"]["text"] == "step"
    assert fig["layout"]["yaxis"]["title"]["text"] == "dropped / routed"
