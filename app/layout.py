"""The page: the header's pickers, the message lines and the tabs (each tab's own layout is in
:mod:`app.tabs`). Component ids are the contract with the callbacks and the browser tests."""

from __future__ import annotations

from dash import dcc, html

from engine.cluster import PRESETS
from engine.models import MAX_SAMPLE_BATCH, MAX_SAMPLE_SEQ, sample_names
from engine.search.baselines import BASELINES

from .sources import family_sizes
from .tabs import compare, explore, export, learn, plan, search

__all__ = ["make_layout", "cluster_options", "model_options"]


def cluster_options(extra: str | None = None) -> list[dict[str, str]]:
    """Presets; sized ones (``dgx-a100-80gb:N``) offered from 1 node to the explorer's 1,024
    GPUs; ``extra``: an uploaded cluster's name, or a preset with another network
    (``dgx-h100:8+nics=4``, opened from the Which GPUs tab), listed first."""
    note = "another network" if extra and "+" in extra else "uploaded"
    out = [{"label": f"{extra} ({note})", "value": extra}] if extra else []
    for name, (_, takes_count, doc) in PRESETS.items():
        sizes = family_sizes(f"{name}:1") if takes_count else [name]
        out += [{"label": s, "value": s, "title": doc} for s in sizes]
    return out


def model_options(extra: str | None = None) -> list[dict[str, str]]:
    """The sample models; ``extra``: an uploaded model's name, listed first."""
    out = [{"label": f"{extra} (uploaded)", "value": extra}] if extra else []
    return out + [{"label": m, "value": m} for m in sample_names()]


def _pickers() -> html.Div:
    return html.Div([
        html.Div([html.Label("model"), dcc.Dropdown(id="pick-model", options=model_options(), value=None,
                                                     clearable=False)], className="pick"),
        html.Div([html.Label("batch", htmlFor="pick-batch",
                             title="the sample model's global batch in samples (empty: its default)"),
                  dcc.Input(id="pick-batch", type="number", min=1, max=MAX_SAMPLE_BATCH, step=1, debounce=True,
                            placeholder="default", className="batch-input")], className="pick pick-batch"),
        html.Div([html.Label("sequence", htmlFor="pick-seq",
                             title="a sample language model's sequence length in tokens (empty: its default)"),
                  dcc.Input(id="pick-seq", type="number", min=1, max=MAX_SAMPLE_SEQ, step=1, debounce=True,
                            placeholder="default", className="batch-input")], className="pick pick-batch"),
        html.Div([html.Label("precision", htmlFor="pick-precision",
                             title="the sample model's training precision (empty: its default)"),
                  dcc.Dropdown(id="pick-precision", value="default", clearable=False, searchable=False,
                               options=[{"label": "default", "value": "default"}, "fp32", "tf32", "fp16", "bf16"])],
                 className="pick pick-precision"),
        html.Div([html.Label("cluster"), dcc.Dropdown(id="pick-cluster", options=cluster_options(), value=None,
                                                       clearable=False)], className="pick"),
        html.Div([html.Label("network", htmlFor="pick-network",
                             title="the preset's network changed (Enter): nics=4 nic_gbps=400 pod=256 oversub=2; "
                                   "empty: the preset's own"),
                  dcc.Input(id="pick-network", type="text", debounce=True, placeholder="its own", value="",
                            className="network-input")], className="pick pick-network"),
        html.Div([html.Label("start from"), dcc.Dropdown(id="pick-baseline", options=list(BASELINES),
                                                          value=None, clearable=False)], className="pick"),
        dcc.Upload(id="upload", children=html.Div(["Drop or ", html.A("choose"),
                                                  " a model (soapbox JSON, ONNX or a Hugging Face config.json), cluster, strategy or profile file"]),
                   className="upload", multiple=False),
    ], className="pickers")


def make_layout() -> html.Div:
    return html.Div([
        dcc.Location(id="url", refresh=False),
        # the session's state lives in the tab's sessionStorage: it survives a reload and a
        # server restart, and each tab is its own session
        dcc.Store(id="state", storage_type="session"),
        # the state's session id, copied there in the browser (app.tabs.search): what the search
        # poll and stop send instead of the whole state; kept beside it, so a reload during a
        # search polls it from the first interval
        dcc.Store(id="sid", storage_type="session"),
        dcc.Store(id="upload-ok", storage_type="memory"),
        dcc.Store(id="gantt-window", storage_type="memory"),
        html.Div(id="img-dummy", style={"display": "none"}),
        html.Header([
            html.H1("soapbox"),
            html.Span("see, search and hand-edit how a DNN is parallelized", className="tagline"),
        ]),
        _pickers(),
        html.Div(id="message", className="message", role="status"),
        html.Div([html.Span(id="sim-status"), html.Button("Cancel: go back", id="sim-cancel", n_clicks=0,
                                                          className="small")],
                 id="sim-box", className="message sim-box", role="status", style={"display": "none"}),
        dcc.Interval(id="sim-poll", interval=1000, disabled=True),
        dcc.Tabs(id="tabs", value="explore", children=[
            dcc.Tab(label="Explore", value="explore", children=explore.layout()),
            dcc.Tab(label="Search", value="search", children=search.layout()),
            dcc.Tab(label="Which GPUs", value="plan", children=plan.layout()),
            dcc.Tab(label="Compare", value="compare", children=compare.layout()),
            dcc.Tab(label="Export", value="export", children=export.layout()),
            dcc.Tab(label="Learn", value="learn", children=learn.layout()),
        ]),
    ], className="page")
