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

Exit status: 0 done; 1 an invalid file under ``validate``; 2 an error a user can fix
(printed as one line ``soapbox: error: ...``, no traceback: a bad argument, an unreadable
or invalid input, an output that cannot be written); 3 ``simulate`` of a strategy that does
not fit in memory (the report is printed and says which devices are over), or ``search``
that found no strategy that fits; 130 interrupted (Ctrl-C), 143 terminated (SIGTERM). An
interrupted write leaves the file it would replace as it was and no temporary file.

Names: ``--model``, ``--cluster``, ``--strategy``, ``--profile`` and ``validate FILE`` may
be paths, since a user typed them; the model and cluster a strategy file names resolve only
to samples and presets.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import signal
import sys
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from .cluster import MAX_DEVICES, PRESETS, preset
from .errors import SoapboxError, ValidationError, printable
from .formats import resolve_cluster, resolve_model, save_json, schema, validate_file
from .graph import PRECISIONS
from .models import SAMPLE_MODELS
from .models.transformer import GPTConfig, gpt
from .ops import MAX_DIM
from .report import json_text
from .search import ALGORITHMS
from .search.baselines import BASELINES, make_baseline
from .strategy import RECOMPUTE, SCHEDULES

__all__ = ["main", "int_in", "build_parser", "add_strategy_options", "strategy_options"]


EXIT_INVALID_FILE = 1
EXIT_ERROR = 2
EXIT_DOES_NOT_FIT = 3
EPILOG = ("exit status: 0 done; 1 invalid file (validate); 2 error (one line 'soapbox: error: ...'); "
          "3 the strategy does not fit in memory (simulate) or no strategy found fits (search); "
          "130 interrupted; 143 terminated")


def int_in(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``lo`` to ``hi``."""
    def parse(text: str) -> int:
        try:
            v = int(text) if len(text) <= 30 else None
        except ValueError:
            v = None
        if v is None:
            raise argparse.ArgumentTypeError(f"{printable(text, 40)!r} is not an integer")
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v} must be at least {lo}")
        if v > hi:
            raise argparse.ArgumentTypeError(f"{v} must be at most {hi:,}")
        return v
    return parse


_positive_int = int_in(1, MAX_DIM)
_device_count = int_in(1, MAX_DEVICES)


def _name(text: str) -> str:
    """An argparse type: a model name as the model schema accepts it (1 to 256 characters)."""
    from .formats import MAX_NAME_CHARS

    if not 0 < len(text) <= MAX_NAME_CHARS:
        raise argparse.ArgumentTypeError(f"a name of 1 to {MAX_NAME_CHARS} characters, got {len(text):,}")
    return text


def add_strategy_options(p: argparse.ArgumentParser) -> None:
    """Options that shape a baseline strategy; the same on ``baseline``, ``simulate`` and
    ``search`` so ``--strategy megatron --tp 8 ...`` names a strategy anywhere."""
    g = p.add_argument_group("baseline options (see `soapbox baseline --help`)")
    g.add_argument("--tp", type=_device_count, help="tensor-parallel degree (megatron, fsdp)")
    g.add_argument("--pp", type=_device_count, help="pipeline stages (megatron)")
    g.add_argument("--dp", type=_device_count, help="data-parallel replicas (megatron; default: the rest)")
    g.add_argument("--micro-batch", type=_positive_int, help="micro-batch size in samples")
    g.add_argument("--vpp", type=int_in(1, 1024), help="model chunks per stage: interleaved 1F1B (megatron)")
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
        epilog=EPILOG,
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
    p.add_argument("kind", choices=("model", "cluster", "strategy", "profile"))

    p = sub.add_parser("validate", help="check a model, cluster, strategy or profile file")
    p.add_argument("file")
    p.add_argument("--model", help="model to check a strategy against (default: the one it names)")
    p.add_argument("--cluster", help="cluster to check a strategy against (default: the one it names)")

    p = sub.add_parser("model", help="build a model file")
    msub = p.add_subparsers(dest="family", required=True, metavar="FAMILY")
    g = msub.add_parser("gpt", help="a GPT-style decoder from its shape")
    g.add_argument("--layers", type=int_in(1, 4096), required=True)
    g.add_argument("--hidden", type=_positive_int, required=True)
    g.add_argument("--heads", type=int_in(1, 65536), required=True)
    g.add_argument("--kv-heads", type=int_in(1, 65536), help="grouped-query attention: key/value heads")
    g.add_argument("--ffn-hidden", type=_positive_int, help="MLP width (default 4*hidden, or LLaMA's rule with --swiglu)")
    g.add_argument("--swiglu", action="store_true", help="SwiGLU MLP, RMSNorm, rotary positions, no biases (LLaMA)")
    g.add_argument("--seq-len", type=_positive_int, required=True)
    g.add_argument("--vocab", type=_positive_int, required=True)
    g.add_argument("--batch", type=_positive_int, required=True, help="global batch in sequences")
    g.add_argument("--flash-attention", action="store_true", help="fused causal attention (FlashAttention)")
    g.add_argument("--precision", choices=PRECISIONS, default="fp16")
    g.add_argument("--name", type=_name, default="gpt")
    g.add_argument("-o", "--output", required=True, help="model file to write")

    p = sub.add_parser("simulate", help="simulate one training iteration of a strategy",
                       epilog="exit status 3: the strategy does not fit in memory (the report says where); "
                              "2: an error")
    p.add_argument("--model", required=True, help="sample model name or model file")
    p.add_argument("--cluster", required=True, help="preset name or cluster file")
    p.add_argument("--strategy", required=True, help="a strategy file, or a baseline kind: " + ", ".join(BASELINES))
    add_strategy_options(p)
    p.add_argument("--profile", help="measured profile table (soapbox.profile/1) to use before the roofline")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", help="write a Chrome trace (Perfetto) of the iteration to this file")

    p = sub.add_parser("search", help="search for a faster strategy",
                       epilog="exit status 3: no strategy found fits in memory; 2: an error")
    p.add_argument("--model", required=True, help="sample model name or model file")
    p.add_argument("--cluster", required=True, help="preset name or cluster file")
    p.add_argument("--algo", default="mcmc", help="search algorithm: " + ", ".join(ALGORITHMS) +
                   ", or all (each in turn, compared side by side)")
    p.add_argument("--budget", default="30s",
                   help="proposals (5000) or time (30s, 2m, 1h); at most 10**9 proposals or 7 days; default 30s")
    p.add_argument("--seed", type=int_in(-(2**63), 2**63 - 1), default=0,
                   help="random seed (an iteration budget is reproducible)")
    p.add_argument("--chains", type=int_in(1, 256), default=None,
                   help="mcmc: starting points (data parallel, expert, random); at most 256; default 4")
    p.add_argument("--option", action="append", metavar="NAME=VALUE",
                   help="an option of the algorithm (repeatable): mcmc " + _option_names("mcmc") +
                   "; pase " + _option_names("pase") + "; pipeline " + _option_names("pipeline") +
                   "; differentiable " + _option_names("differentiable"))
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
        return EXIT_INVALID_FILE


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
    g = resolve_model(args.model, allow_path=True)
    c = resolve_cluster(args.cluster, allow_path=True)
    s = make_baseline(args.kind, g, c, **strategy_options(args))
    save_json(s.to_dict(), args.output)
    used = len(s.devices_used())
    summary = {"output": args.output, "model": g.name, "cluster": c.name, "kind": args.kind,
               "ops": len(s.configs), "devices_used": used, "devices": c.num_devices,
               "pipeline": s.pipeline.to_dict(), "options": s.found_by.get("options", {})}
    notes = list(s.found_by.get("notes", []))
    summary["notes"] = notes
    if args.json:
        print(json_text(summary))
    else:
        print(f"wrote {args.output}: {args.kind} strategy for {printable(g.name)} ({len(g)} ops) on {printable(c.name)}, "
              f"{used} of {c.num_devices} devices used, {s.pipeline.stages} stage(s), "
              f"{s.pipeline.microbatches} microbatch(es); valid")
        for note in notes:
            print(f"note: {note}")
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .costs import CostModel
    from .formats import load_profile
    from .formats import load_strategy
    from .trace import write_chrome_trace
    from .report import format_summary, simulate_strategy

    g = resolve_model(args.model, allow_path=True)
    c = resolve_cluster(args.cluster, allow_path=True)
    if args.strategy in BASELINES:
        s = make_baseline(args.strategy, g, c, **strategy_options(args))
    else:
        given = [k for k, v in strategy_options(args).items() if v not in (None, False)]
        if given:
            raise ValueError(f"baseline options ({', '.join('--' + k.replace('_', '-') for k in given)}) "
                             f"apply to a baseline kind, not to the strategy file {args.strategy}")
        s = load_strategy(args.strategy, g, c)
    cost = CostModel(profile=load_profile(args.profile)) if args.profile else CostModel()
    result = simulate_strategy(g, s, c, cost, check=False)  # (a baseline and a loaded file are checked)
    if args.trace:
        n = write_chrome_trace(args.trace, g, c, result.timeline, result.memory)
        if not args.json:
            print(f"wrote {args.trace}: {n:,} trace events (open in https://ui.perfetto.dev)")
    if args.json:
        print(json_text(result.summary()))
    else:
        print(format_summary(result))
    return 0 if result.memory.feasible else EXIT_DOES_NOT_FIT


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


def _option_names(algorithm: str) -> str:
    return "(" + ", ".join(f.name for f in dataclasses.fields(ALGORITHMS[algorithm].options)) + ")"


def _search_options(args: argparse.Namespace):
    """The typed options of ``--algo`` from ``--option`` and ``--chains`` (an option another
    algorithm takes is an error, not silently dropped)."""
    pairs = list(args.option or [])
    if args.chains is not None:
        if args.algo != "mcmc":
            raise ValueError(f"--chains applies to mcmc, not {args.algo}")
        pairs.append(f"chains={args.chains}")
    if args.algo == "all":
        if pairs:
            raise ValueError("--option and --chains apply to one algorithm, not to --algo all")
        return None
    return ALGORITHMS[args.algo].parse_options(pairs)


def _cmd_search(args: argparse.Namespace) -> int:
    from .formats import load_strategy
    from .search import Budget

    if args.algo not in ALGORITHMS and args.algo != "all":
        raise ValueError(f"unknown search algorithm {args.algo!r}; available: {', '.join(ALGORITHMS)}, all")
    options = _search_options(args)
    budget = Budget.parse(args.budget)
    g = resolve_model(args.model, allow_path=True)
    c = resolve_cluster(args.cluster, allow_path=True)
    if args.algo == "all":
        return _search_all(args, g, c, budget)
    initial = None
    if args.strategy:
        initial = make_baseline(args.strategy, g, c, **strategy_options(args)) if args.strategy in BASELINES \
            else load_strategy(args.strategy, g, c)
    show = None if args.quiet or args.json or not sys.stderr.isatty() and not os.environ.get("SOAPBOX_PROGRESS") \
        else _progress_bar(budget)
    try:
        result = ALGORITHMS[args.algo].run(g, c, budget, seed=args.seed, progress=show, initial=initial,
                                           options=options)
    finally:
        if show is not None:
            sys.stderr.write("\n")
    if args.output:
        save_json(result.best.to_dict(), args.output)
    best = result.best_cost_s
    fits = math.isfinite(best)
    fitting = [v for v in result.baselines.values() if math.isfinite(v)]
    notes = [] if fits else ["no strategy found fits in memory: best_cost_s is null"]
    notes += result.notes
    summary = {"model": g.name, "cluster": c.name, "algorithm": args.algo, "budget": str(budget),
               "seed": args.seed, "best_cost_s": best if fits else None,
               "baselines": {k: (v if math.isfinite(v) else None) for k, v in result.baselines.items()},
               "speedup_vs_data_parallel": result.speedup_vs_data_parallel if fits else None,
               "speedup_vs_best_baseline": min(fitting) / best if fits and fitting and best > 0 else None,
               "iterations": result.iterations, "elapsed_s": result.elapsed_s,
               "locally_optimal": result.locally_optimal, "cancelled": result.cancelled, "output": args.output,
               "notes": notes}
    status = 0 if fits else EXIT_DOES_NOT_FIT
    if args.json:
        print(json_text(summary))
        return status
    print(f"{printable(g.name)} on {printable(c.name)}: {args.algo}, {result.iterations} proposals in "
          f"{result.elapsed_s:.1f} s (seed {args.seed})")
    if fits:
        print(f"  best            {best * 1e3:.3f} ms per iteration"
              f"{' (locally optimal)' if result.locally_optimal else ''}")
    else:
        print("  best            none found fits in memory")
    for name, cost in result.baselines.items():
        if not math.isfinite(cost):
            print(f"  {name:<15} does not fit in memory")
        elif fits and best > 0:
            print(f"  {name:<15} {cost * 1e3:.3f} ms  ({cost / best:.2f}x slower than best)")
        else:
            print(f"  {name:<15} {cost * 1e3:.3f} ms")
    if result.speedup_vs_data_parallel and fits:
        print(f"  speedup over data parallel: {result.speedup_vs_data_parallel:.2f}x")
    for note in result.notes:
        if not note.startswith("baseline "):  # (the baselines' lines above say it)
            print(f"  note: {printable(note)}")
    if args.output:
        print(f"wrote {args.output}")
    return status


def compare_searches(g, c, budget, seed: int = 0, algorithms: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run each search on ``g`` / ``c`` and return one row per algorithm: best simulated cost,
    speedup over data parallel, search time, and the time it first came within 1% of the best
    cost any of them found (from its progress trace), or an error message."""
    rows = []
    results = {}
    for name in algorithms or list(ALGORITHMS):
        t = time.perf_counter()
        try:
            results[name] = ALGORITHMS[name].run(g, c, budget, seed=seed)
        except (ValueError, SoapboxError) as exc:
            rows.append({"algorithm": name, "error": str(exc), "search_s": time.perf_counter() - t})
    if results:
        best = min(r.best_cost_s for r in results.values())
        for name, r in results.items():
            within = None
            if math.isfinite(best):  # (when nothing fits, no search comes within 1% of anything)
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
        print(json_text({"model": g.name, "cluster": c.name, "budget": str(budget), "seed": args.seed,
                         "algorithms": rows}))
        return 0
    print(f"{printable(g.name)} on {printable(c.name)}, budget {budget}, seed {args.seed}")
    print(f"  {'algorithm':15} {'best ms':>10} {'vs data parallel':>16} {'search s':>9} {'to within 1% s':>15}")
    for r in rows:
        if "error" in r:
            print(f"  {r['algorithm']:15} refused: {r['error']}")
            continue
        sp = f"{r['speedup_vs_data_parallel']:.2f}x" if r["speedup_vs_data_parallel"] else "-"
        w = f"{r['time_to_within_1pct_s']:.1f}" if r["time_to_within_1pct_s"] is not None else "never"
        cost = f"{r['best_cost_s'] * 1e3:10.3f}" if math.isfinite(r["best_cost_s"]) else f"{'no fit':>10}"
        print(f"  {r['algorithm']:15} {cost} {sp:>16} {r['search_s']:9.1f} {w:>15}")
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


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that ``finally`` blocks and temporary-file
    clean-ups run as for Ctrl-C."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(argv: Sequence[str] | None = None, extra: Mapping[str, ExtraCommand] | None = None) -> int:
    """Run the ``soapbox`` command; ``extra`` adds commands from outside the engine.

    Returns the exit status (see the module docstring): 0, 1, 2, 3, 130 or 143.
    """
    parser = build_parser(extra)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    run = {**COMMANDS, **{k: v[2] for k, v in (extra or {}).items()}}
    # The engine's own commands turn SIGTERM into an exception (temporary files are removed);
    # a command added from outside (the app's server) keeps its own signal handling.
    own = args.command in COMMANDS and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if own else None
    try:
        return run[args.command](args)
    except (SoapboxError, ValueError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):  # output piped into a command that stopped reading (`| head`)
            sys.stderr.close()
            return 0
        text = str(exc) if isinstance(exc, (SoapboxError, ValueError)) else \
            f"{exc.strerror or exc}{': ' + str(exc.filename) if exc.filename else ''}"
        lines = "\n".join(printable(line, 100_000) for line in text.split("\n"))
        print(f"soapbox: error: {lines}", file=sys.stderr)
        return EXIT_ERROR
    except RecursionError:  # (no input should reach one; a last line of defence)
        print("soapbox: error: an input is nested too deeply", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("soapbox: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("soapbox: terminated", file=sys.stderr)
        return 143
    finally:
        if own:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
