"""The Learn tab: the guided comparison (each step sets up a model, a cluster and strategies
to compare, then opens the view that shows the point) and the explanations of every view."""

from __future__ import annotations

from dash import ALL, Dash, Input, Output, ctx, dcc, html, no_update

from ..actions import add_to_compare, apply_layout, select_baseline
from ..learn import TOPICS
from ..state import new_state

__all__ = ["layout", "register", "tour", "TOUR"]

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
}


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
    else:
        s = new_state("gpt2", "dgx-a100-80gb:1", "data-parallel", sid=sid, batch=64)
        for mb, name in ((8, "pp 4 · 4 microbatches"), (1, "pp 4 · 32 microbatches")):
            s, msg = apply_layout(s, "megatron", {"pp": 4, "mb": mb})
            if not msg.startswith("Layout"):
                raise ValueError(f"the guided step {step!r} could not be set up: {msg}")
            s, _ = add_to_compare(s, name)
    s = dict(s, undo=[], redo=[], version=int((state or {}).get("version", 0)) + 1 if isinstance(state, dict) else 1)
    return s, f"Guided comparison {TOUR[step][0]}: {TOUR[step][1]}"


def layout() -> html.Div:
    steps = [html.Div([html.Button(title, id={"type": "tour", "step": step}, n_clicks=0, className="primary"),
                       html.P(text)], className="tour-step") for step, (title, text, _) in TOUR.items()]
    tour_panel = html.Div([html.H3("A guided comparison"),
                           html.P("Each step replaces the model, cluster and kept strategies the page shows, then "
                                  "opens the view to look at.", className="hint")] + steps,
                          className="panel", id="tour")
    return html.Div([tour_panel] + [html.Div([html.H3(title), dcc.Markdown(text)], className="panel")
                                    for title, text in TOPICS.values()])


def register(app: Dash) -> None:  # pragma: no cover - exercised by the browser tests
    @app.callback(Output("tabs", "value"), Output("gantt-rows", "value"),
                  Input({"type": "tour", "step": ALL}, "n_clicks"), prevent_initial_call=True)
    def _tour_tab(clicks):
        step = ctx.triggered_id.get("step") if isinstance(ctx.triggered_id, dict) else None
        if not isinstance(step, str) or step not in TOUR or not isinstance(clicks, list) or not any(clicks):
            return no_update, no_update
        return TOUR[step][2], ("stage" if step == "pipeline" else "auto")
