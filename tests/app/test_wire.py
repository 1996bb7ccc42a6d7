"""A callback's outputs written as Dash writes them (``app.components.wire``): the same JSON as
Dash makes of the components themselves, and JSON orjson writes whole (so Plotly's writer does
not fall back to walking the response in Python)."""

from __future__ import annotations

import orjson
import pytest
from dash import dcc, html
from plotly.io.json import to_json_plotly

from app import actions as ACT
from app import state as ST
from app.components import wire
from app.tabs import compare as CMP
from app.tabs import editor as ED
from app.tabs import explore as EXP

PLAIN = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def test_a_small_tree_pinned():
    tree = html.Div(["text ", html.B("bold", id="b"), [html.I("deep")]], className="c")
    assert wire(tree) == {
        "props": {"children": ["text ", {"props": {"children": "bold", "id": "b"}, "type": "B",
                                         "namespace": "dash_html_components"},
                               [{"props": {"children": "deep"}, "type": "I", "namespace": "dash_html_components"}]],
                  "className": "c"},
        "type": "Div", "namespace": "dash_html_components"}


@pytest.mark.parametrize("value", [
    "a line", 3, None, {"data": [{"x": [1, 2], "y": [3.5, 4]}]}, [1, 2, 3], [[1, 2], [3, 4]],
    html.P(["a ", html.Code("b"), " c"]), [html.Li("one"), "two", html.Li(html.Span("three"))],
    dcc.Dropdown(options=[{"label": "x", "value": "x"}], value="x", id="d"),
    html.Details([html.Summary("s"), html.Table([html.Tr([html.Td(1.5), html.Td("q")])])]),
])
def test_the_same_json_as_dash_makes(value):
    assert to_json_plotly(wire(value)) == to_json_plotly(value)
    orjson.dumps(wire(value), option=PLAIN)  # (plain: no fallback walk)


def _views(state: dict) -> list:
    out = EXP.draw_explore(state, True, "utilization", {})
    return [out[i] for i in EXP.EXPLORE_IDS] + list(ED.render_editor(state)) + list(CMP.render_compare(state, []))


def test_every_view_of_a_page_writes_the_same(alex):
    state, _ = ACT.select_baseline(alex, "expert")  # (a strategy of several configs: the editor's degrees)
    state = {**state, "selected": [next(iter(ST.page_strategy(state).configs))]}
    views = _views(state)
    assert any(not isinstance(v, (str, dict, list, type(None), int, float)) for v in views)  # (components among them)
    for v in views:
        assert to_json_plotly(wire(v)) == to_json_plotly(v)
        orjson.dumps(wire(v), option=PLAIN)
