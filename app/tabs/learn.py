"""The Learn tab: the guided comparison (each step sets up a model, a cluster and strategies
to compare, then opens the view that shows the point) and the explanations of every view."""

from __future__ import annotations

from dash import ALL, Dash, Input, Output, ctx, dcc, html, no_update

from ..actions import add_to_compare, apply_layout, select_baseline
from ..learn import TOPICS
from ..state import new_state
from .experts import apply_whatif

__all__ = ["layout", "register", "tour", "TOUR", "MOE_STEP", "MOE_LAYOUTS", "MOE_SKEW", "topic_figure"]

#: the guided comparison: step -> (title, what it sets up, the tab it opens)
TOUR: dict[str, tuple[str, str, str]] = {
    "soap": ("1 · Data, model and expert parallelism on AlexNet",
             "AlexNet on FlexFlow's 16 P100s under data parallel, model parallel and the expert strategy "
             "(data parallel for the convolutions, model parallel for the large linear layers), kept side by "
             "side in Compare: see which moves the least data and why the expert split wins.", "compare"),
    "pipeline": ("2 · A pipeline and its bubble on GPT-2",
                 "GPT-2 (batch 64) on one DGX A100 as a 4-stage pipeline (x 2 data parallel), once with 4 "
                 "microbatches and once with 32, kept in Compare. Explore shows the 32-microbatch plan, a "
                 "timeline row per stage and its idle time hatched: the schedule's bubble (p−1)/(m+p−1) "
                 "shrinks from 43% to 9%; what idles beyond it is imbalance (the last stage also computes "
                 "the 50,257-word output layer) and waiting for transfers.", "explore"),
    "experts": ("3 · Expert parallelism on Mixtral 8x7B at 64 GPUs",
                "Mixtral 8x7B (8 experts, top-2; batch 64 of 1,024 tokens) on eight DGX H100s (64 GPUs), tp 2 "
                "with sequence parallelism and the distributed optimizer: ep 8 (one expert per GPU, expert data "
                "parallel 8) and ep 4 x etp 2 kept in Compare, then ep 8 again under a skewed router (Zipf 1: the "
                "first expert gets 37% of the tokens). Explore shows the skewed plan: the timeline's all-to-alls "
                "(dispatch and combine, wine red) and the Experts panel, where the busiest rank gates every "
                "layer's step; 'Balanced routing' there goes back to what published runs measure.", "explore"),
}
#: the guided MoE step's layouts (name, layout panel form) and its routing skew
MOE_STEP = ("mixtral-8x7b", "dgx-h100:8", 64, 1024)
MOE_LAYOUTS = (("ep 8 (balanced)", {"tp": 2, "ep": 8, "zero_stage": 1, "flags": ["sequence_parallel"]}),
               ("ep 4 x etp 2 (balanced)", {"tp": 2, "ep": 4, "etp": 2, "zero_stage": 1,
                                            "flags": ["sequence_parallel"]}))
MOE_SKEW = 1.0


def tour(state: dict | None, step: str) -> tuple[dict, str]:
    """The state a guided-comparison step sets up (:data:`TOUR`), in the session of ``state``:
    its model, cluster and strategies, the ones to compare kept. Replaces what the page shows
    (the button says so)."""
    if step not in TOUR:
        return state or new_state(), f"Unknown step {str(step)[:30]!r}; steps: {', '.join(TOUR)}."
    sid = state.get("sid") if isinstance(state, dict) else None
    if step == "soap":
        s = new_state("alexnet", "p100-4x4", "data-parallel", sid=sid)
        s, _ = add_to_compare(s, "data parallel")
        for kind, name in (("model-parallel", "model parallel"), ("expert", "expert")):
            s, _ = select_baseline(s, kind)
            s, _ = add_to_compare(s, name)
    elif step == "experts":
        model, cluster, batch, seq = MOE_STEP
        s = new_state(model, cluster, "data-parallel", sid=sid, batch=batch, seq_len=seq)
        for name, form in MOE_LAYOUTS + ((f"ep 8, skewed routing (Zipf {MOE_SKEW:g})", MOE_LAYOUTS[0][1]),):
            s, msg = apply_layout(s, "megatron", form)
            if not msg.startswith("Layout"):
                raise ValueError(f"the guided step {step!r} could not be set up: {msg}")
            if name.startswith("ep 8, skewed"):
                s, msg = apply_whatif(s, {"source": "skew", "skew": MOE_SKEW})
            s, _ = add_to_compare(s, name)
    else:
        s = new_state("gpt2", "dgx-a100-80gb:1", "data-parallel", sid=sid, batch=64)
        for mb, name in ((8, "pp 4 · 4 microbatches"), (1, "pp 4 · 32 microbatches")):
            s, msg = apply_layout(s, "megatron", {"pp": 4, "micro_batch": mb})
            if not msg.startswith("Layout"):
                raise ValueError(f"the guided step {step!r} could not be set up: {msg}")
            s, _ = add_to_compare(s, name)
    s = dict(s, undo=[], redo=[], version=int((state or {}).get("version", 0)) + 1 if isinstance(state, dict) else 1)
    return s, f"Guided comparison {TOUR[step][0]}: {TOUR[step][1]}"


def topic_figure(topic: str) -> list:
    """What a topic shows under its text: the ``init-sweep`` measurement's figure
    (:func:`app.learn_figures.init_sweep_figure_json`), or one line saying it is not in this
    install; nothing for the other topics."""
    if topic != "init-sweep":
        return []
    from ..learn_figures import INIT_SWEEP_FILE, init_sweep_figure_json

    figure = init_sweep_figure_json()
    if figure is None:
        return [html.P(f"The measurement's figure needs app/data/{INIT_SWEEP_FILE.name} with its loss curves, which "
                       "this install does not have: run python benchmarks/init_sweep.py in the source tree.",
                       className="hint")]
    return [dcc.Graph(id="learn-init-sweep-graph", figure=figure,
                      config={"displaylogo": False})]


def layout() -> html.Div:
    steps = [html.Div([html.Button(title, id={"type": "tour", "step": step}, n_clicks=0, className="primary"),
                       html.P(text)], className="tour-step") for step, (title, text, _) in TOUR.items()]
    tour_panel = html.Div([html.H3("A guided comparison"),
                           html.P("Each step replaces the model, cluster and kept strategies the page shows, then "
                                  "opens the view to look at.", className="hint")] + steps,
                          className="panel", id="tour")
    return html.Div([tour_panel] + [html.Div([html.H3(title), dcc.Markdown(text)] + topic_figure(topic),
                                             className="panel") for topic, (title, text) in TOPICS.items()])


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    # (the timeline's rows for the step come with its state, from the header's reducer: set
    # here, they redrew the timeline for the state the page still had)
    @app.callback(Output("tabs", "value"), Output("expert-skew", "value"),
                  Output("expert-source", "value", allow_duplicate=True),
                  Input({"type": "tour", "step": ALL}, "n_clicks"), prevent_initial_call=True)
    def _tour_tab(clicks):
        step = ctx.triggered_id.get("step") if isinstance(ctx.triggered_id, dict) else None
        if not isinstance(step, str) or step not in TOUR or not isinstance(clicks, list) or not any(clicks):
            return no_update, no_update, no_update
        moe = step == "experts"  # (the Experts panel's controls show the what-if the step applied)
        return TOUR[step][2], MOE_SKEW if moe else no_update, "skew" if moe else no_update
