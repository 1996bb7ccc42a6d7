"""Small pieces every tab's layout uses (figure config, image buttons, Learn boxes, summary
cards) and the one way a callback turns an error into a line of text."""

from __future__ import annotations

from typing import Any

from dash import dcc, html
from dash.development.base_component import Component

from engine.errors import first_line as engine_first_line

from .learn import TOPICS

__all__ = ["GRAPH_CONFIG", "image_buttons", "learn", "card", "first_line", "wire"]

#: every dcc.Graph's toolbar: no Plotly logo, PNG downloads at twice the size
GRAPH_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def image_buttons(fig: str) -> html.Div:
    """PNG and SVG download buttons for the figure ``fig`` (drawn in the browser)."""
    return html.Div([html.Span("download"),
                     html.Button("PNG", id={"type": "img", "fig": fig, "fmt": "png"}, className="small"),
                     html.Button("SVG", id={"type": "img", "fig": fig, "fmt": "svg"}, className="small")],
                    className="imgrow")


def learn(topic: str) -> html.Details:
    """A folded explanation from :data:`app.learn.TOPICS`."""
    title, text = TOPICS[topic]
    return html.Details([html.Summary(f"? {title}"), dcc.Markdown(text)], className="learn", id=f"learn-{topic}")


def card(label: str, value_id: str) -> html.Div:
    """A summary card: a label over a value a callback fills."""
    return html.Div([html.Div(label, className="card-label"), html.Div("–", id=value_id, className="card-value")],
                    className="card")


def first_line(e: BaseException) -> str:
    """The first line of an error's message (a list of problems: its first problem;
    :func:`engine.errors.first_line`)."""
    return engine_first_line(e)


def wire(value: Any) -> Any:
    """A callback's output as Dash writes it in the response: a component (and any component
    among its props, at any depth) as its JSON dict; anything else as it is.

    Why: Dash writes a response with Plotly's JSON writer, which hands it to orjson whole and,
    when one value is not plain JSON (a single ``html.P``), walks the whole response in Python
    instead, figures' lists included: 4.5 ms against 0.5 ms for the Explore views of
    Inception-v3 on 16 GPUs. The same JSON either way (tests/app/test_wire.py)."""
    if isinstance(value, Component):
        d = value.to_plotly_json()
        return {**d, "props": {k: wire(v) for k, v in d["props"].items()}}
    if isinstance(value, (list, tuple)) and any(isinstance(v, (Component, list, tuple)) for v in value):
        return [wire(v) for v in value]
    return value
