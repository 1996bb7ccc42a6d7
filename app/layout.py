"""The page: pickers, tabs and the components callbacks write into (ids are the contract
with :mod:`app.callbacks` and the browser tests)."""

from __future__ import annotations

from dash import dcc, html

from engine.cluster import PRESETS
from engine.models import MAX_SAMPLE_BATCH, MAX_SAMPLE_SEQ, sample_names
from engine.search import ALGORITHMS
from engine.search.baselines import BASELINES

from .learn import TOPICS
from .workspace import TOUR, family_sizes

__all__ = ["make_layout", "cluster_options"]

_GRAPH_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}


def cluster_options(extra: str | None = None) -> list[dict[str, str]]:
    """Presets; sized ones (``dgx-a100-80gb:N``) offered from 1 node to the explorer's 1,024
    GPUs; ``extra``: an uploaded cluster's name, listed first."""
    out = [{"label": f"{extra} (uploaded)", "value": extra}] if extra else []
    for name, (_, takes_count, doc) in PRESETS.items():
        sizes = family_sizes(f"{name}:1") if takes_count else [name]
        out += [{"label": s, "value": s, "title": doc} for s in sizes]
    return out


def model_options(extra: str | None = None) -> list[dict[str, str]]:
    """The sample models; ``extra``: an uploaded model's name, listed first."""
    out = [{"label": f"{extra} (uploaded)", "value": extra}] if extra else []
    return out + [{"label": m, "value": m} for m in sample_names()]


def image_buttons(fig: str) -> html.Div:
    """PNG and SVG download buttons for the figure ``fig`` (drawn in the browser)."""
    return html.Div([html.Span("download"),
                     html.Button("PNG", id={"type": "img", "fig": fig, "fmt": "png"}, className="small"),
                     html.Button("SVG", id={"type": "img", "fig": fig, "fmt": "svg"}, className="small")],
                    className="imgrow")


def learn(topic: str) -> html.Details:
    title, text = TOPICS[topic]
    return html.Details([html.Summary(f"? {title}"), dcc.Markdown(text)], className="learn", id=f"learn-{topic}")


def _card(label: str, value_id: str) -> html.Div:
    return html.Div([html.Div(label, className="card-label"), html.Div("–", id=value_id, className="card-value")],
                    className="card")


def _explore() -> html.Div:
    return html.Div([
        html.Div([_card("iteration time", "sum-time"), _card("throughput", "sum-throughput"),
                  _card("speedup over data parallel", "sum-speedup"), _card("communication / iteration", "sum-comm"),
                  _card("peak memory", "sum-memory"), _card("tasks simulated", "sum-tasks")],
                 className="cards", id="summary"),
        html.Div([html.Label("train", htmlFor="train-tokens", title="tokens (or samples) to train: 1T, 300B, 2e12"),
                  dcc.Input(id="train-tokens", type="text", value="1T", debounce=True, className="train-tokens",
                            placeholder="1T"),
                  html.Span(id="train-estimate", className="train-estimate"),
                  dcc.Store(id="rate")], className="train"),
        html.P(id="why", className="why"),
        html.Div([
            html.Div([
                html.H3("Operator graph"),
                dcc.Checklist(id="collapse", options=[{"label": " collapse blocks", "value": "on"}], value=["on"],
                              inline=True),
                dcc.Graph(id="op-graph", config=_GRAPH_CONFIG), image_buttons("op-graph"),
                learn("graph"), learn("soap"),
            ], className="panel wide"),
            html.Div([
                html.H3("Layout"),
                html.P("A Megatron (tensor x pipeline x data) or FSDP layout; data parallel fills the rest. "
                       "Empty fields take the default.", className="hint"),
                dcc.RadioItems(id="layout-kind", options=["megatron", "fsdp"], value="megatron", inline=True),
                html.Div([html.Div([html.Label(label, htmlFor=f"layout-{name}"),
                                    dcc.Input(id=f"layout-{name}", type="number", min=1, step=1, debounce=True,
                                              placeholder=ph, className="layout-num")], className="layout-field")
                          for name, label, ph in (("tp", "tp", "1"), ("pp", "pp", "1"), ("cp", "cp", "1"),
                                                  ("vpp", "vpp", "1"), ("mb", "micro-batch", "auto"),
                                                  ("shard", "shard group", "-"))], className="layout-grid"),
                html.Label("recomputation", htmlFor="layout-recompute"),
                dcc.Dropdown(id="layout-recompute", options=["none", "selective", "full"], value="none",
                             clearable=False),
                html.Label("ZeRO stage", htmlFor="layout-zero"),
                dcc.Dropdown(id="layout-zero", options=[{"label": str(z), "value": z} for z in (0, 1, 2, 3)],
                             placeholder="0 (megatron) / 3 (fsdp)"),
                html.Label("schedule (pipeline)", htmlFor="layout-schedule"),
                dcc.Dropdown(id="layout-schedule", options=["1f1b", "gpipe", "interleaved"], placeholder="1f1b"),
                dcc.Checklist(id="layout-flags", options=[{"label": " sequence parallel", "value": "sp"},
                                                          {"label": " fp8 GEMMs", "value": "fp8"}], value=[],
                              inline=True),
                html.Div([html.Button("Apply layout", id="layout-apply", n_clicks=0, className="primary")],
                         className="buttons"),
            ], className="panel narrow"),
            html.Div([
                html.H3("Op and edit"),
                html.Div(id="op-panel", className="op-panel"),
                html.Label("ops to edit"),
                dcc.Dropdown(id="edit-ops", multi=True, placeholder="click an op, or pick ops here"),
                html.Div(id="edit-degrees", className="degrees"),
                html.Label("devices (e.g. 0-3 or 0,2,4,6)"),
                dcc.Input(id="edit-devices", type="text", debounce=False, className="devices"),
                html.Div([html.Button("Apply", id="edit-apply", n_clicks=0, className="primary"),
                          html.Button("Undo", id="undo", n_clicks=0), html.Button("Redo", id="redo", n_clicks=0)],
                         className="buttons"),
            ], className="panel narrow"),
        ], className="row"),
        html.Div([html.H3("Timeline of one iteration"),
                  html.Div([
                      html.Label("rows", htmlFor="gantt-rows"),
                      dcc.RadioItems(id="gantt-rows", value="auto", inline=True, options=[
                          {"label": " auto", "value": "auto"}, {"label": " each GPU", "value": "gpu"},
                          {"label": " per stage", "value": "stage"}, {"label": " per node", "value": "node"}]),
                      html.Label("link rows", htmlFor="gantt-links"),
                      dcc.RadioItems(id="gantt-links", value="auto", inline=True, options=[
                          {"label": " auto", "value": "auto"}, {"label": " show", "value": "on"},
                          {"label": " hide", "value": "off"}]),
                      dcc.Input(id="gantt-filter", type="text", debounce=True, className="gantt-filter",
                                placeholder="filter rows: 0-7, stage 1, node 2, collectives"),
                  ], className="gantt-controls"),
                  html.P(id="gantt-notes", className="hint"),
                  html.Div(dcc.Graph(id="gantt", config=_GRAPH_CONFIG), className="gantt-scroll"),
                  image_buttons("gantt"),
                  learn("gantt"), learn("pipeline")], className="panel"),
        html.Div([
            html.Div([html.H3("Cluster"),
                      dcc.RadioItems(id="topo-metric", options=[{"label": " utilisation", "value": "utilization"},
                                                                {"label": " memory", "value": "memory"}],
                                     value="utilization", inline=True),
                      dcc.Graph(id="topology", config=_GRAPH_CONFIG), image_buttons("topology"), learn("topology")],
                     className="panel half"),
            html.Div([html.H3("Memory per GPU"), dcc.Graph(id="memory", config=_GRAPH_CONFIG), image_buttons("memory"),
                      html.Div([html.Button("Smallest cluster for this layout", id="fit-find", n_clicks=0,
                                            className="small"),
                                html.Span(id="fit-result", className="hint")], className="buttons"),
                      dcc.Interval(id="fit-poll", interval=700, disabled=True),
                      learn("memory")], className="panel half"),
        ], className="row"),
    ])


def _search() -> html.Div:
    return html.Div([
        html.Div([
            html.Label("algorithm"),
            dcc.Dropdown(id="search-algo", options=[{"label": f"{k}: {v.description}", "value": k}
                                                    for k, v in ALGORITHMS.items()],
                         value=next(iter(ALGORITHMS)), clearable=False),
            html.Label("budget (seconds like 20s, or a number of proposals)"),
            dcc.Input(id="search-budget", type="text", value="20s"),
            html.Label("seed"),
            dcc.Input(id="search-seed", type="number", value=0, min=0, step=1),
            html.Div([html.Button("Start search", id="search-start", n_clicks=0, className="primary"),
                      html.Button("Stop", id="search-stop", n_clicks=0),
                      html.Button("Adopt best", id="search-adopt", n_clicks=0)], className="buttons"),
            html.P(id="search-status", className="status"),
        ], className="panel narrow"),
        html.Div([dcc.Graph(id="search-trace", config=_GRAPH_CONFIG), image_buttons("search-trace"), learn("search")],
                 className="panel wide"),
        dcc.Interval(id="search-poll", interval=500, disabled=True),
        dcc.Store(id="search-seen", storage_type="memory"),  # what the trace last drew
    ], className="row")


def _compare() -> html.Div:
    return html.Div([
        html.Div([dcc.Input(id="compare-name", type="text", placeholder="name (optional)"),
                  html.Button("Keep current strategy", id="compare-add", n_clicks=0, className="primary"),
                  html.Button("Clear", id="compare-clear", n_clicks=0)], className="buttons"),
        html.Div(id="compare-table"),
        html.Div([html.Label("timelines drawn (one time axis):", htmlFor="compare-show"),
                  dcc.Checklist(id="compare-show", options=[], value=[], inline=True)], className="gantt-controls"),
        html.Div(dcc.Graph(id="compare-gantt", config=_GRAPH_CONFIG), className="gantt-scroll"),
        image_buttons("compare-gantt"),
        html.Div(id="compare-diff"),
    ], className="panel")


def _export() -> html.Div:
    return html.Div([
        html.Div([html.Button("Download strategy (JSON)", id="export-strategy", n_clicks=0, className="primary"),
                  html.Button("Download Chrome trace (Perfetto)", id="export-trace", n_clicks=0)],
                 className="buttons"),
        html.P("Import a strategy, model or cluster file with the upload box at the top. Every figure has PNG "
               "and SVG buttons under it (and the camera in its toolbar)."),
        html.H4("For a framework"),
        html.Div([html.Button("Megatron-LM flags", id="export-megatron", n_clicks=0),
                  html.Button("DeepSpeed config", id="export-deepspeed", n_clicks=0),
                  html.Button("torchtitan TOML", id="export-torchtitan", n_clicks=0)], className="buttons"),
        html.Div(id="export-fw-message", className="message", role="status"),
        html.H4("Share"),
        html.Div([html.Button("Make a link to this state", id="share", n_clicks=0),
                  dcc.Input(id="share-url", type="text", readOnly=True, className="share")], className="buttons"),
        dcc.Download(id="download"),
    ], className="panel")


def _tour() -> html.Div:
    """The guided comparison: each step sets up a model, a cluster and strategies to compare,
    and opens the view that shows the point."""
    return html.Div([html.H3("A guided comparison"),
                     html.P("Each step replaces the model, cluster and kept strategies the page shows, then "
                            "opens the view to look at.", className="hint")] +
                    [html.Div([html.Button(title, id={"type": "tour", "step": step}, n_clicks=0, className="primary"),
                               html.P(text)], className="tour-step") for step, (title, text, _) in TOUR.items()],
                    className="panel", id="tour")


def make_layout() -> html.Div:
    return html.Div([
        dcc.Location(id="url", refresh=False),
        # the session's state lives in the tab's sessionStorage: it survives a reload and a
        # server restart, and each tab is its own session
        dcc.Store(id="state", storage_type="session"),
        dcc.Store(id="upload-ok", storage_type="memory"),
        dcc.Store(id="gantt-window", storage_type="memory"),
        html.Div(id="img-dummy", style={"display": "none"}),
        html.Header([
            html.H1("soapbox"),
            html.Span("see, search and hand-edit how a DNN is parallelized", className="tagline"),
        ]),
        html.Div([
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
                                   options=[{"label": "default", "value": "default"}, "fp32", "fp16", "bf16"])],
                     className="pick pick-precision"),
            html.Div([html.Label("cluster"), dcc.Dropdown(id="pick-cluster", options=cluster_options(), value=None,
                                                           clearable=False)], className="pick"),
            html.Div([html.Label("start from"), dcc.Dropdown(id="pick-baseline", options=list(BASELINES),
                                                              value=None, clearable=False)], className="pick"),
            dcc.Upload(id="upload", children=html.Div(["Drop or ", html.A("choose"),
                                                      " a model (soapbox JSON or ONNX), cluster or strategy file"]),
                       className="upload", multiple=False),
        ], className="pickers"),
        html.Div(id="message", className="message", role="status"),
        html.Div([html.Span(id="sim-status"), html.Button("Cancel: go back", id="sim-cancel", n_clicks=0,
                                                          className="small")],
                 id="sim-box", className="message sim-box", role="status", style={"display": "none"}),
        dcc.Interval(id="sim-poll", interval=1000, disabled=True),
        dcc.Tabs(id="tabs", value="explore", children=[
            dcc.Tab(label="Explore", value="explore", children=_explore()),
            dcc.Tab(label="Search", value="search", children=_search()),
            dcc.Tab(label="Compare", value="compare", children=_compare()),
            dcc.Tab(label="Export", value="export", children=_export()),
            dcc.Tab(label="Learn", value="learn", children=html.Div([_tour()] + [
                html.Div([html.H3(title), dcc.Markdown(text)], className="panel") for title, text in TOPICS.values()
            ])),
        ]),
    ], className="page")
