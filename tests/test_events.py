"""The event contract: envelope and payload validation, non-finite numbers."""

from __future__ import annotations

import json
import math

import pytest

from observatory.events import (
    KINDS,
    ValidationError,
    decode_number,
    encode_value,
    json_text,
    validate_event,
)


def ev(**kw):
    base = {
        "v": 1,
        "run": "r-1.a_b",
        "kind": "metrics",
        "step": 3,
        "t": 1.5,
        "host": 0,
        "seq": 0,
        "data": {"x": 1},
    }
    return {**base, **kw}


def test_valid_event_passes():
    assert validate_event(ev(), run_folder="r-1.a_b", host=0) == ev()
    validate_event(ev(step=None, kind="note", data={"text": "hi"}))
    validate_event(ev(kind="some_future_kind", data={"anything": [1, {"b": 2}]}))  # unknown kinds are kept
    validate_event(ev(kind="failure", data={"type": "crashed", "message": "cut short", "final": True}))


@pytest.mark.parametrize(
    "bad, field",
    [
        (ev(v=2), "v"),
        (ev(v=True), "v"),
        (ev(run="has space"), "run"),
        (ev(run="x" * 129), "run"),
        (ev(kind=""), "kind"),
        (ev(step=-1), "step"),
        (ev(step=2.0), "step"),
        (ev(t="now"), "t"),
        (ev(t=None), "t"),
        (ev(host=-1), "host"),
        (ev(seq=None), "seq"),
        (ev(data=[]), "data"),
        (ev(data={"x": "1"}), "data.x"),
        (ev(data={"": 1}), "data"),
        (ev(kind="expert_load", data={"layer": 0, "routed": [1], "dropped": [1, 2]}), "data.dropped"),
        (ev(kind="expert_load", data={"layer": 0, "routed": [-1], "dropped": [0]}), "data.routed"),
        (ev(kind="anomaly", data={"detector": "d", "severity": "meh", "message": "m"}), "data.severity"),
        (ev(kind="checkpoint", data={"path": 3}), "data.path"),
        (ev(kind="run_start", data={"tags": "x"}), "data.tags"),
        (ev(kind="failure", data={"type": "crashed", "message": "m", "final": "yes"}), "data.final"),
        (ev(run=".."), "run"),
        (ev(run="."), "run"),
        (ev(run="../x"), "run"),
    ],
)
def test_invalid_events_name_the_field(bad, field):
    with pytest.raises(ValidationError) as e:
        validate_event(bad)
    assert e.value.field == field
    assert str(e.value).startswith(field)


def test_location_checks():
    with pytest.raises(ValidationError, match="does not match its folder"):
        validate_event(ev(), run_folder="other")
    with pytest.raises(ValidationError, match="does not match its file name"):
        validate_event(ev(), host=3)


def test_nonfinite_round_trip():
    enc = encode_value({"a": math.nan, "b": [math.inf, -math.inf, 1.0]})
    assert enc == {"a": "nan", "b": ["inf", "-inf", 1.0]}
    assert math.isnan(decode_number("nan")) and decode_number("-inf") == -math.inf
    assert decode_number("1.0") is None and decode_number(True) is None and decode_number(2) == 2.0
    validate_event(ev(data={"loss": "nan", "g": "inf"}))


@pytest.mark.parametrize(
    "value",
    [
        {"config": {"lr": 1e-3, "layers": [1, 2.5, None, True], "name": "é\n"}, "tags": ("a", "b")},
        {"a": math.nan, "b": [1.0, {"c": math.inf}], "d": (-math.inf,)},
        [{"deep": [[[math.nan]]]}],
        1.0,
        math.nan,
    ],
    ids=["finite", "non-finite", "nested-non-finite", "a-float", "a-nan"],
)
@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_json_text_is_json_of_encode_value(value, separators):
    """The walk that turns non-finite floats into strings runs only where one is: the text is the same."""
    want = json.dumps(encode_value(value), separators=separators)
    assert json_text(value, separators) == want
    assert "NaN" not in want and "Infinity" not in want


def test_every_kind_names_its_table():
    assert {k.table for k in KINDS.values()} == {"runs", "metrics", "expert_load", "events"}
    for k in KINDS.values():
        assert k.doc
