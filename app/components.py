"""Small pieces every tab's layout uses (figure config, image buttons, Learn boxes, summary
cards) and the one way a callback turns an error into a line of text."""

from __future__ import annotations

from dash import dcc, html

from engine.errors import first_line as engine_first_line

from .learn import TOPICS

__all__ = ["GRAPH_CONFIG", "image_buttons", "learn", "card", "first_line"]

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