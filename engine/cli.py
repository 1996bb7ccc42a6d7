"""The ``soapbox`` command.

Sub-commands (``soapbox COMMAND --help`` for each):

* ``models`` / ``clusters``: the sample models and cluster presets (``--json``).
* ``validate FILE``: check a model, cluster or strategy file; exit 0 when valid, 1 with
  every problem listed otherwise.
* ``model gpt``: write a GPT-style model file from its shape.
* ``cluster NAME -o FILE``: write a preset as an editable cluster file.
* ``schema model|cluster|strategy``: print a format's JSON Schema.
* ``baseline``: build a baseline strategy for a model on a cluster and write it.
* ``simulate``: simulate one iteration of a strategy (file or baseline kind); ``--json``,
  ``--trace`` for a Chrome trace.
* ``search``: search for a faster strategy (MCMC with delta simulation); ``-o best.json``.

Errors a user can fix are printed as ``soapbox: error: ...`` with exit status 2 (1 for an
invalid file under ``validate``); no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Any, Callable, Mapping, Sequence

from .cluster import PRESETS, preset
from .errors import SoapboxError, ValidationError
from .formats import resolve_cluster, resolve_model, save_json, schema, validate_file
from .graph import PRECISIONS
from .models import SAMPLE_MODELS
from .models.transformer import GPTConfig, gpt
from .search import ALGORITHMS
from .search.baselines import BASELINES, make_baseline
from .strategy import RECOMPUTE, SCHEDULES

__all__ = ["main", "build_parser", "add_strategy_options", "strategy_options"]


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def add_strategy_options(p: argparse.ArgumentParser) -> None:
    """Options that shape a baseline strategy; the same on ``baseline``, ``simulate`` and
    ``search`` so ``--strategy megatron --tp 8 ...`` names a strategy anywhere."""
    g = p.add_argument_group("baseline options (see `soapbox baseline --help`)")
    g.add_argument("--tp", type=_positive_int, help="tensor-parallel degree (megatron, fsdp)")
    g.add_argument("--pp", type=_positive_int, help="pipeline stages (megatron)")
    g.add_argument("--dp", type=_positive_int, help="data-parallel replicas (megatron; default: the rest)")
    g.add_argument("--micro-batch", type=_positive_int, help="micro-batch size in samples")
    g.add_argument("--vpp", type=_positive_int, help="model chunks per stage: interleaved 1F1B (megatron)")
    g.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule (megatron; default 1f1b)")
    g.add_argument("--recompute", choices=RECOMPUTE, help="activation recomputation (megatron, fsdp)")
    g.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism")
    g.add_argument("--zero-stage", type=int, choices=(1, 2, 3), help="ZeRO/FSDP sharding stage (fsdp; default 3)")


def strategy_options(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k, None) for k in
            ("tp", "pp", "dp", "micro_batch", "vpp", "schedule", "recompute", "sequence_parallel", "zero_stage")}


#: A command added by a layer above the engine (the app adds ``serve``): help text, a function
#: that adds its arguments, and the function that runs it.
ExtraCommand = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]


def build_parser(extra: Mapping[str, ExtraCommand] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="soapbox",
        description="Explore, simulate and search parallelization strategies for DNN training.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, add_args, _) in (extra or {}).items():
        add_args(sub.add_parser(name, help=help_text))

    p = sub.add_parser("models", help="list the sample models")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("clusters", help="list the cluster presets")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("cluster", help="write a preset as an editable cluster file")
    p.add_argument("name", help="preset name, e.g. dgx-a100-80gb:2 or hetero-demo")
    p.add_argument("-o", "--output", required=True, help="cluster file to write")

    p = sub.add_parser("schema", help="print the JSON Schema of a file format")
    p.add_argument("kind", choices=("model", "cluster", "strategy"))

    p = sub.add_parser("validate", help="check a model, cluster or strategy file")
    p.add_argument("file")
    p.add_argument("--model", help="model to check a strategy against (default: the one it names)")
    p.add_argument("--cluster", help="cluster to check a strategy against (default: the one it names)")

    p = sub.add_parser("model", help="build a model file")
    msub = p.add_subparsers(dest="family", required=True, metavar="FAMILY")
    g = msub.add_parser("gpt", help="a GPT-style decoder from its shape")
    g.add_argument("--layers", type=_positive_int, required=True)
    g.add_argument("--hidden", type=_positive_int, required=True)
    g.add_argument("--heads", type=_positive_int, required=True)
    g.add_argument("--kv-heads", type=_positive_int, help="grouped-query attention: key/value heads")
    g.add_argument("--ffn-hidden", type=_positive_int, help="MLP width (default 4*hidden, or LLaMA's rule with --swiglu)")
    g.add_argument("--swiglu", action="store_true", help="SwiGLU MLP, RMSNorm, rotary positions, no biases (LLaMA)")
    g.add_argument("--seq-len", type=_positive_int, required=True)
    g.add_argument("--vocab", type=_positive_int, required=True)
    g.add_argument("--batch", type=_positive_int, required=True, help="global batch in sequences")
    g.add_argument("--flash-attention", action="store_true", help="fused causal attention (FlashAttention)")
    g.add_argument("--precision", choices=PRECISIONS, default="fp16")
    g.add_argument("--name", default="gpt")
    g.add_argument("-o", "--output", required=True, help="model file to write")

    p = sub.add_parser("simulate", help="simulate one training iteration of a strategy")
    p.add_argument("--model", required=True, help="sample model name or model file")
    p.add_argument("--cluster", required=True, help="preset name or cluster file")
    p.add_argument("--strategy", required=True, help="a strategy file, or a baseline kind: " + ", ".join(BASELINES))
    add_strategy_options(p)
    p.add_argument("--profile", help="measured profile table (soapbox.profile/1) to use before the roofline")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", help="write a Chrome trace (Perfetto) of the iteration to this file")

    p = sub.add_parser("search", help="search for a faster strategy")
    p.add_argument("--model", required=True, help="sample model name or model file")
    p.add_argument("--cluster", required=True, help="preset name or cluster file")
    p.add_argument("--algo", default="mcmc", help="search algorithm: " + ", ".join(ALGORITHMS) +
                   ", or all (each in turn, compared side by side)")
    p.add_argument("--budget", default="30s", help="proposals (5000) or time (30s, 2m); default 30s")
    p.add_argument("--seed", type=int, default=0, help="random seed (an iteration budget is reproducible)")
    p.add_argument("--chains", type=_positive_int, default=4, help="starting points (data parallel, expert, random)")
    p.add_argument("--strategy", help="also start from this strategy (a file or a baseline kind)")
    add_strategy_options(p)
    p.add_argument("-o", "--output", help="write the best strategy here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = sub.add_parser("baseline", help="build a baseline strategy and write it as JSON")
    p.add_argument("--model", required=True, help="sample model name or model file")
    p.add_argument("--cluster", required=True, help="preset name (e.g. dgx-a100-80gb:2) or cluster file")
    p.add_argument("--kind", required=True, choices=list(BASELINES), help="which baseline")
    add_strategy_options(p)
    p.add_argument("-o", "--output", required=True, help="strategy file to write")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    return parser


def _cmd_models(args: argparse.Namespace) -> int:
    from .models import sample_dir

    rows = []
    for name, (_, _, desc) in SAMPLE_MODELS.items():
        g = resolve_model(name)
        rows.append({"name": name, "description": desc, "ops": len(g), "parameters": g.param_count,
                     "fwd_flops": g.fwd_flops, "batch": g.batch_size, "precision": g.precision,
                     "file": str(sample_dir() / f"{name}.json")})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'name':<14} {'ops':>6} {'parameters':>17} {'fwd FLOPs':>10} {'batch':>6}  description")
    for r in rows:
        print(f"{r['name']:<14} {r['ops']:>6} {r['parameters']:>17,} {r['fwd_flops']:>10.3g} {r['batch']:>6}  "
              f"{r['description']}")
    return 0


def _cmd_clusters(args: argparse.Namespace) -> int:
    rows = []
    for name, (_, takes_count, desc) in PRESETS.items():
        c = preset(f"{name}:1" if takes_count else name)
        rows.append({"name": f"{name}:N" if takes_count else name, "description": desc,
                     "gpus_per_node" if takes_count else "gpus": c.num_devices,
                     "device_types": sorted({d.type for d in c.devices})})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        gpus = r.get("gpus", r.get("gpus_per_node"))
        unit = "GPUs per node" if "gpus_per_node" in r else "GPUs"
        print(f"{r['name']:<16} {gpus:>3} {unit:<14} {r['description']}")
    return 0


def _cmd_cluster(args: argparse.Namespace) -> int:
    c = preset(args.name)
    save_json(c.to_dict(), args.output)
    print(f"wrote {args.output}: {c.name}, {c.summary()}; edit it and pass it as --cluster {args.output}")
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(schema(f"soapbox.{args.kind}/1"), indent=2))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    try:
        print(validate_file(args.file, args.model, args.cluster))
        return 0
    except ValidationError as exc:
        print(str(exc), file=sys.stderr)
        return 1


def _cmd_model(args: argparse.Namespace) -> int:
    swiglu = args.swiglu
    cfg = GPTConfig(args.layers, args.hidden, args.heads, args.seq_len, args.vocab, args.batch,
                    kv_heads=args.kv_heads, ffn_hidden=args.ffn_hidden, swiglu=swiglu,
                    norm="rmsnorm" if swiglu else "layernorm", positions="rotary" if swiglu else "learned",
                    bias=not swiglu, tie_embeddings=not swiglu, dropout=0.0 if swiglu else 0.1,
                    flash_attention=args.flash_attention, precision=args.precision, name=args.name)
    g = gpt(cfg, source=shlex.join(["soapbox", *args.argv]))
    save_json(g.to_dict(), args.output)
    print(f"wrote {args.output}: {g.name}, {len(g)} ops, {g.param_count:,} parameters, "
          f"{g.fwd_flops + g.bwd_flops:.3e} FLOPs per iteration")
    return 0


def _cmd_baseline(args: argparse.Namespace) -> int:
    g = resolve_model(args.model)
    c = resolve_cluster(args.cluster)
    s = make_baseline(args.kind, g, c, **strategy_options(args))
    save_json(s.to_dict(), args.output)
    used = len(s.devices_used())
    summary = {"output": args.output, "model": g.name, "cluster": c.name, "kind": args.kind,
               "ops": len(s.configs), "devices_used": used, "devices": c.num_devices,
               "pipeline": s.pipeline.to_dict(), "options": s.found_by.get("options", {})}
    notes = list(s.found_by.get("notes", []))
    summary["notes"] = notes
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"wrote {args.output}: {args.kind} strategy for {g.name} ({len(g)} ops) on {c.name}, "
              f"{used} of {c.num_devices} devices used, {s.pipeline.stages} stage(s), "
              f"{s.pipeline.microbatches} microbatch(es); valid")
        for note in notes:
            print(f"note: {note}")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .costs import CostModel, ProfileTable
    from .formats import load_strategy
    from .formats.trace import write_chrome_trace
    from .report import format_summary, simulate_strategy

    g = resolve_model(args.model)
    c = resolve_cluster(args.cluster)
    if args.strategy in BASELINES:
        s = make_baseline(args.strategy, g, c, **strategy_options(args))
    else:
        given = [k for k, v in strategy_options(args).items() if v not in (None, False)]
        if given:
            raise ValueError(f"baseline options ({', '.join('--' + k.replace('_', '-') for k in given)}) "
                             f"apply to a baseline kind, not to the strategy file {args.strategy}")
        s = load_strategy(args.strategy, g, c)
    cost = CostModel(profile=ProfileTable.load(args.profile)) if args.profile else CostModel()
    result = simulate_strategy(g, s, c, cost)
    if args.trace:
        n = write_chrome_trace(args.trace, g, c, result.timeline, result.memory)
        if not args.json:
            print(f"wrote {args.trace}: {n:,} trace events (open in https://ui.perfetto.dev)")
    if args.json:
        print(json.dumps(result.summary()))
    else:
        print(format_summary(result))
    return 0


def _progress_bar(budget):
    def show(p) -> None:
        if budget.iterations:
            frac = min(1.0, p.iteration / budget.iterations)
        elif budget.seconds:
            frac = min(1.0, p.elapsed_s / budget.seconds)
        else:
            frac = 0.0
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r[{bar:<30}] {p.iteration:6d} proposals {p.elapsed_s:6.1f} s  "
                         f"current {p.current_cost_s * 1e3:9.3f} ms  best {p.best_cost_s * 1e3:9.3f} ms  "
                         f"accepted {p.acceptance_rate * 100:4.1f}%  chains {p.chains}")
        sys.stderr.flush()
    return show


def _cmd_search(args: argparse.Namespace) -> int:
    from .formats import load_strategy
    from .search.mcmc import Budget

    if args.algo not in ALGORITHMS and args.algo != "all":
        raise ValueError(f"unknown search algorithm {args.algo!r}; available: {', '.join(ALGORITHMS)}, all")
    budget = Budget.parse(args.budget)
    g = resolve_model(args.model)
    c = resolve_cluster(args.cluster)
    if args.algo == "all":
        return _search_all(args, g, c, budget)
    initial = None
    if args.strategy:
        initial = make_baseline(args.strategy, g, c, **strategy_options(args)) if args.strategy in BASELINES \
            else load_strategy(args.strategy, g, c)
    search, _ = ALGORITHMS[args.algo]
    show = None if args.quiet or args.json or not sys.stderr.isatty() and not os.environ.get("SOAPBOX_PROGRESS") \
        else _progress_bar(budget)
    try:
        result = search(g, c, budget, seed=args.seed, chains=args.chains, progress=show, initial=initial)
    finally:
        if show is not None:
            sys.stderr.write("\n")
    if args.output:
        save_json(result.best.to_dict(), args.output)
    summary = {"model": g.name, "cluster": c.name, "algorithm": args.algo, "budget": str(budget),
               "seed": args.seed, "best_cost_s": result.best_cost_s, "baselines": result.baselines,
               "speedup_vs_data_parallel": result.speedup_vs_data_parallel,
               "speedup_vs_best_baseline": min(result.baselines.values()) / result.best_cost_s,
               "iterations": result.iterations, "elapsed_s": result.elapsed_s,
               "locally_optimal": result.locally_optimal, "cancelled": result.cancelled, "output": args.output}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"{g.name} on {c.name}: {args.algo}, {result.iterations} proposals in {result.elapsed_s:.1f} s (seed {args.seed})")
    print(f"  best            {result.best_cost_s * 1e3:.3f} ms per iteration"
          f"{' (locally optimal)' if result.locally_optimal else ''}")
    for name, cost in result.baselines.items():
        print(f"  {name:<15} {cost * 1e3:.3f} ms  ({cost / result.best_cost_s:.2f}x slower than best)")
    if result.speedup_vs_data_parallel:
        print(f"  speedup over data parallel: {result.speedup_vs_data_parallel:.2f}x")
    if args.output:
        print(f"wrote {args.output}")
    return 0


def compare_searches(g, c, budget, seed: int = 0, algorithms: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run each search on ``g`` / ``c`` and return one row per algorithm: best simulated cost,
    speedup over data parallel, search time, and the time it first came within 1% of the best
    cost any of them found (from its progress trace), or an error message."""
    rows = []
    results = {}
    for name in algorithms or list(ALGORITHMS):
        search, _ = ALGORITHMS[name]
        t = time.perf_counter()
        try:
            results[name] = search(g, c, budget, seed=seed)
        except (ValueError, SoapboxError) as exc:
            rows.append({"algorithm": name, "error": str(exc), "search_s": time.perf_counter() - t})
    if results:
        best = min(r.best_cost_s for r in results.values())
        for name, r in results.items():
            within = next((p.elapsed_s for p in r.trace if p.best_cost_s <= best * 1.01), None)
            if within is None and r.best_cost_s <= best * 1.01:
                within = r.elapsed_s
            rows.append({"algorithm": name, "best_cost_s": r.best_cost_s,
                         "speedup_vs_data_parallel": r.speedup_vs_data_parallel, "search_s": r.elapsed_s,
                         "time_to_within_1pct_s": within, "iterations": r.iterations,
                         "strategy": r.best.found_by.get("plan", "")})
    order = {n: k for k, n in enumerate(algorithms or list(ALGORITHMS))}
    return sorted(rows, key=lambda r: order[r["algorithm"]])


def _search_all(args: argparse.Namespace, g, c, budget) -> int:
    rows = compare_searches(g, c, budget, args.seed)
    if args.json:
        print(json.dumps({"model": g.name, "cluster": c.name, "budget": str(budget), "seed": args.seed,
                          "algorithms": rows}))
        return 0
    print(f"{g.name} on {c.name}, budget {budget}, seed {args.seed}")
    print(f"  {'algorithm':15} {'best ms':>10} {'vs data parallel':>16} {'search s':>9} {'to within 1% s':>15}")
    for r in rows:
        if "error" in r:
            print(f"  {r['algorithm']:15} refused: {r['error']}")
            continue
        sp = f"{r['speedup_vs_data_parallel']:.2f}x" if r["speedup_vs_data_parallel"] else "-"
        w = f"{r['time_to_within_1pct_s']:.1f}" if r["time_to_within_1pct_s"] is not None else "never"
        print(f"  {r['algorithm']:15} {r['best_cost_s'] * 1e3:10.3f} {sp:>16} {r['search_s']:9.1f} {w:>15}")
    return 0


COMMANDS = {
    "models": _cmd_models,
    "clusters": _cmd_clusters,
    "cluster": _cmd_cluster,
    "schema": _cmd_schema,
    "validate": _cmd_validate,
    "simulate": _cmd_simulate,
    "search": _cmd_search,
    "model": _cmd_model,
    "baseline": _cmd_baseline,
}


def main(argv: Sequence[str] | None = None, extra: Mapping[str, ExtraCommand] | None = None) -> int:
    """Run the ``soapbox`` command; ``extra`` adds commands from outside the engine."""
    parser = build_parser(extra)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    run = {**COMMANDS, **{k: v[2] for k, v in (extra or {}).items()}}
    try:
        return run[args.command](args)
    except (SoapboxError, ValueError) as exc:
        print(f"soapbox: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("soapbox: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into a command that stopped reading (`| head`)
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
