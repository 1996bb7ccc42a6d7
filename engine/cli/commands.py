"""The commands other than ``search``: listing, writing and validating files, building
baselines, simulating. See :mod:`engine.cli`."""

from __future__ import annotations

import argparse
from typing import Any
from pathlib import Path
import json
import os
import shlex
import sys
import time

from ..cluster import PRESETS, preset
from ..errors import ValidationError, printable, problems_summary
from ..formats import load_strategy, resolve_model, save_json, schema, validate_file
from ..models import SAMPLE_MODELS, sample_names
from ..models.transformer import GPTConfig, gpt
from ..sim.report import json_text
from ..search.baselines import BASELINES, make_baseline
from .common import (EXIT_DOES_NOT_FIT, EXIT_INVALID_FILE, baseline_strategy, model_and_cluster, strategy_options,
    with_routing)

__all__ = ["cmd_models", "cmd_clusters", "cmd_cluster", "cmd_schema", "cmd_validate", "cmd_model", "cmd_baseline",
           "cmd_simulate", "cmd_experts"]


def cmd_models(args: argparse.Namespace) -> int:
    from ..models import build_sample, sample_dir

    if args.write:
        folder = Path(args.write)
        for name in SAMPLE_MODELS:
            g = build_sample(name)
            save_json(g.to_dict(), folder / f"{name}.json")
            if not args.json:
                print(f"{name}: {len(g)} ops, {g.param_count:,} parameters -> {folder / (name + '.json')}")
        if args.json:
            print(json.dumps([str(folder / f"{name}.json") for name in SAMPLE_MODELS]))
        return 0
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


def cmd_clusters(args: argparse.Namespace) -> int:
    rows = []
    for name, (_, takes_count, desc) in PRESETS.items():
        c = preset(f"{name}:1" if takes_count else name)
        rows.append({"name": f"{name}:N" if takes_count else name, "description": desc,
                     "gpus_per_node" if takes_count else "gpus": c.gpus_per_node if takes_count else c.num_devices,
                     "device_types": sorted({d.type for d in c.devices})})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        gpus = r.get("gpus", r.get("gpus_per_node"))
        unit = "GPUs per node" if "gpus_per_node" in r else "GPUs"
        print(f"{r['name']:<16} {gpus:>3} {unit:<14} {r['description']}")
    print("another network after a preset's name: +nics=N +nic_gbps=G +pod=GPUS +oversub=R (dgx-h100:16+nics=4)")
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:
    c = preset(args.name)
    save_json(c.to_dict(), args.output)
    print(f"wrote {args.output}: {c.name}, {c.summary()}; edit it and pass it as --cluster {args.output}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(schema(f"soapbox.{args.kind}/1"), indent=2))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        print(validate_file(args.file, args.model, args.cluster))
        return 0
    except ValidationError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_INVALID_FILE


def cmd_model(args: argparse.Namespace) -> int:
    if args.experts is not None or args.top_k is not None:
        return _moe_model(args)
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


def _moe_model(args: argparse.Namespace) -> int:
    """``soapbox model gpt --experts N --top-k K``: a mixture-of-experts decoder (moe_gpt)."""
    from ..models.moe import MoEConfig, moe_gpt

    if args.experts is None or args.top_k is None:
        raise ValueError("a mixture-of-experts model needs both --experts and --top-k")
    width = args.expert_ffn or args.ffn_hidden
    if width is None:
        raise ValueError("--experts needs --expert-ffn (one expert's width) or --ffn-hidden")
    if args.dense_layers and args.ffn_hidden is None:
        raise ValueError("--dense-layers needs --ffn-hidden (the dense layers' MLP width)")
    cfg = MoEConfig(args.layers, args.hidden, args.heads, args.seq_len, args.vocab, args.batch, args.experts,
                    args.top_k, width, kv_heads=args.kv_heads, shared_experts=args.shared_experts,
                    dense_layers=args.dense_layers, dense_ffn=args.ffn_hidden if args.dense_layers else None,
                    precision=args.precision, name=args.name)
    g = moe_gpt(cfg, source=shlex.join(["soapbox", *args.argv]))
    save_json(g.to_dict(), args.output)
    print(f"wrote {args.output}: {g.name}, {len(g)} ops, {g.param_count:,} parameters, "
          f"{g.fwd_flops + g.bwd_flops:.3e} FLOPs per iteration")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from ..formats.jsonio import read_bytes, read_json

    notes: list[str] = []
    if args.torch:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            raise ValueError("--torch needs PyTorch: pip install 'soapbox[torch]'")
        from ..models.torch_import import import_torch, load_factory

        g, notes = import_torch(load_factory(args.torch), unknown=args.unknown, precision=args.precision,
                                name=args.name, source=printable(args.torch)[:200])
    elif args.hf:
        from ..models.hf import from_hf_config

        if args.batch is None:
            raise ValueError("--hf needs --batch (the global batch in sequences)")
        cfg = read_json(args.hf)  # (a path the user typed: limits on size and depth, no NaN)
        g = from_hf_config(cfg, batch=args.batch, seq_len=args.seq_len, precision=args.precision, name=args.name,
                           source=printable(str(args.hf))[:200], notes=notes, attention=args.attention)
    else:
        from ..models.onnx_import import MAX_ONNX_BYTES, import_onnx

        dims = {}
        for pair in args.dim:
            key, sep, value = pair.partition("=")
            value = value.strip()
            if not sep or not key or not (value.isascii() and value.isdigit() and len(value) <= 9) or int(value) < 1:
                raise ValueError(f"--dim {printable(pair)[:60]!r}: expected NAME=N with N a positive whole number")
            dims[key] = int(value)
        source = printable(str(args.onnx_file))[:200]
        data = read_bytes(args.onnx_file, source, MAX_ONNX_BYTES, "an ONNX file")
        g, notes = import_onnx(data, batch=args.batch, seq_len=args.seq_len, dims=dims, unknown=args.unknown,
                               precision=args.precision, name=args.name, source=source)
    save_json(g.to_dict(), args.output)
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.output}: {g.name}, {len(g)} ops, {g.param_count:,} parameters, batch {g.batch_size}, "
          f"{g.precision}")
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    g, c = model_and_cluster(args)
    s = with_routing(baseline_strategy(args.kind, g, c, strategy_options(args), make_baseline), args, g)
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


def _strategy(args: argparse.Namespace, g, c):
    """The strategy ``--strategy`` names (a baseline kind with the baseline options, or a
    file), with the routing what-if of ``--routing-skew`` / ``--routing-histogram``."""
    if args.strategy in BASELINES:
        s = baseline_strategy(args.strategy, g, c, strategy_options(args), make_baseline)
    else:
        given = [k for k, v in strategy_options(args).items() if v not in (None, False)]
        if given:
            raise ValueError(f"baseline options ({', '.join('--' + k.replace('_', '-') for k in given)}) "
                             f"apply to a baseline kind, not to the strategy file {args.strategy}")
        s = load_strategy(args.strategy, g, c)
    return with_routing(s, args, g)


def cmd_simulate(args: argparse.Namespace) -> int:
    from ..costs import CostModel
    from ..formats import load_profile
    from ..sim.memory import memory_report
    from ..sim.trace import write_chrome_trace
    from ..sim.report import format_summary, simulate_strategy
    from ..sim.unfold import simulate_drawn

    g, c = model_and_cluster(args)
    s = _strategy(args, g, c)
    cost = CostModel(profile=load_profile(args.profile)) if args.profile else CostModel()
    # (a baseline and a loaded file are checked; a long pipeline's steady state is extrapolated:
    # engine.sim.steady, and a trace drawn from it, every task unfolded: engine.sim.unfold)
    result, timeline = simulate_drawn(g, s, c, cost) if args.trace else \
        (simulate_strategy(g, s, c, cost, check=False, steady=True), None)
    cover = None
    if args.profile:
        from ..studies.profiling import coverage

        cover = coverage(g, s, c, cost)
    if args.trace:
        memory = result.memory if timeline is result.timeline else memory_report(g, s, c, timeline)
        n = write_chrome_trace(args.trace, g, c, timeline, memory)
        if not args.json:
            print(f"wrote {args.trace}: {n:,} trace events (open in https://ui.perfetto.dev)")
    if args.json:
        print(json_text({**result.summary(), **({"profile": cover} if cover else {})}))
    else:
        print(format_summary(result))
        if cover:
            print(f"  measured compute   {cover['measured_share_of_compute']:.1%} of compute time from the profile "
                  f"({cover['measured_partitions']:,} of {cover['partitions']:,} op partitions; the rest roofline)")
    return 0 if result.memory.feasible else EXIT_DOES_NOT_FIT


def cmd_experts(args: argparse.Namespace) -> int:
    """The expert view: per expert-parallel rank, its experts and the routed token copies it
    receives per microbatch, and the gate the busiest rank sets (:func:`engine.moe.expert_table`)."""
    from ..moe import expert_table

    g, c = model_and_cluster(args)
    table = expert_table(g, _strategy(args, g, c))
    if table is None:
        raise ValueError(f"{printable(g.name, 80)!r} has no mixture-of-experts layers: no experts to show")
    if args.json:
        print(json_text({"model": g.name, "cluster": c.name, **table.to_dict()}))
        return 0
    t = table
    where = "balanced routing" if t.balanced else "routing what-if"
    print(f"{printable(g.name)} on {printable(c.name)}: {t.num_experts} experts (top-{t.top_k}) in each of {t.layers} "
          f"MoE layers, ep {t.ep} x etp {t.etp}, {t.microbatches} microbatch(es); {where}")
    print(f"  {t.tokens_per_microbatch:,.0f} routed token copies per microbatch and layer in each expert-parallel "
          f"group (tokens x top-{t.top_k})")
    print(f"  {'rank':>5}  {'experts':<12} {'share':>7} {'tokens/microbatch':>18}")
    rows = list(range(t.ep))
    shown = rows if len(rows) <= 2 * args.max_rows else rows[:args.max_rows] + rows[-args.max_rows:]
    for k, r in enumerate(shown):
        if k and shown[k - 1] != r - 1:
            print(f"  {'...':>5}  ({t.ep - 2 * args.max_rows:,} ranks not shown; --max-rows)")
        lo, hi = t.rank_experts[r]
        ex = f"{lo}" if lo == hi else f"{lo}-{hi}"
        busiest = "  <- busiest" if not t.balanced and t.rank_shares[r] == max(t.rank_shares) else ""
        print(f"  {r:>5}  {ex:<12} {t.rank_shares[r]:>7.1%} {t.rank_tokens[r]:>18,.0f}{busiest}")
    if t.balanced:
        print("  gate 1.00: balanced routing, as published MoE runs are measured (--routing-skew or "
              "--routing-histogram for an imbalance)")
    else:
        print(f"  gate {t.gate:.2f}: the busiest rank receives {t.gate:.2f}x the mean rank's tokens, and every "
              "rank waits for it")
    return 0


def cmd_whatif(args: argparse.Namespace) -> int:
    from ..studies.whatif import (checkpoint_bytes, goodput, map_strategy, parse_failure, parse_replan_budget, replan,
        simulate_with_slow, survivors)

    for name, v, lo in (("--mtbf-hours", args.mtbf_hours, 1e-3), ("--storage-gbps", args.storage_gbps, 1e-6),
                        ("--restart-min", args.restart_min, 0.0)):
        if not (v >= lo and v < 1e12):
            raise ValueError(f"{name} {v!r}: must be a number >= {lo:g}")
    fails = [parse_failure(f) for f in args.fail]
    slow = [parse_failure(f, slow=True) for f in args.slow]
    if not fails and not slow:
        raise ValueError("give at least one --fail or --slow")
    budget = parse_replan_budget(args.budget)  # (None: --budget 0, no re-plan; a bad budget fails before any work)
    g, c = model_and_cluster(args)
    s = _strategy(args, g, c)
    t0 = time.perf_counter()
    tl, mem = simulate_with_slow(g, s, c, [])
    out: dict[str, Any] = {"model": g.name, "cluster": c.name, "gpus": c.num_devices,
                           "healthy": {"iteration_time_s": tl.makespan_s, "peak_memory_bytes": float(max(mem.peak_bytes)),
                                       "feasible": bool(mem.feasible)}}
    ckpt = checkpoint_bytes(g)
    mtbf_s, bw, restart_s = args.mtbf_hours * 3600.0, args.storage_gbps * 1e9, args.restart_min * 60.0
    # a job's failures come from the GPUs it uses
    out["healthy"]["goodput"] = goodput(tl.makespan_s, len(s.devices_used()), mtbf_s, ckpt, bw, restart_s)
    after, kept = survivors(c, fails) if fails else (c, list(range(c.num_devices)))
    slow_after = [type(f)(f.kind, kept.index(f.target), f.factor) for f in slow if f.target in kept]
    out["after"] = {"cluster": after.name, "gpus": after.num_devices}
    mapped, rule = (s, "the same strategy (no GPU lost)") if not fails else map_strategy(g, s, c, after)
    out["mapped"] = {"rule": rule}
    if mapped is not None:
        mtl, mmem = simulate_with_slow(g, mapped, after, slow_after)
        out["mapped"].update(iteration_time_s=mtl.makespan_s, peak_memory_bytes=float(max(mmem.peak_bytes)),
                             feasible=bool(mmem.feasible), gpus_used=len(mapped.devices_used()),
                             goodput=goodput(mtl.makespan_s, len(mapped.devices_used()), mtbf_s, ckpt, bw, restart_s))
    status = 0
    if budget is not None:
        # seeded with the mapped layout, priced as it is, and never worse than it (engine.studies.whatif.replan)
        mapped_priced = (out["mapped"]["iteration_time_s"], out["mapped"]["feasible"]) if mapped is not None else None
        rp = replan(g, after, mapped, slow_after, budget, expert_loads=s.expert_loads,
                    mapped_priced=mapped_priced)
        out["replan"] = {"iteration_time_s": rp.iteration_time_s, "feasible": rp.feasible, "search_s": rp.search_s,
                         "source": rp.source, "kept": rp.kept, "note": rp.note}
        if rp.strategy is not None:
            out["replan"]["gpus_used"] = len(rp.strategy.devices_used())
            out["replan"]["goodput"] = goodput(rp.iteration_time_s, out["replan"]["gpus_used"], mtbf_s, ckpt, bw,
                                               restart_s)
        else:
            status = EXIT_DOES_NOT_FIT
        if args.output and rp.strategy is not None:
            save_json(rp.strategy.to_dict(), args.output)
        out["replan"]["output"] = args.output if args.output and rp.strategy is not None else None
    skipped = None
    if budget is None and args.output:
        # no re-plan was asked for: nothing to write (a file already there is left as it was)
        skipped = (f"nothing written to {printable(args.output)}: --budget {printable(str(args.budget), 20)} "
                   "asks for no re-plan")
    out["seconds"] = time.perf_counter() - t0
    if args.json:
        print(json_text(out))
        if skipped:
            print(f"soapbox: {skipped}", file=sys.stderr)
        return status

    def line(label: str, d: dict[str, Any]) -> str:
        if "iteration_time_s" not in d:
            return f"  {label:<10} {d.get('rule', 'not computed')}"
        gp = d.get("goodput")
        mem_txt = f", peak {d['peak_memory_bytes'] / 1e9:.2f} GB" if "peak_memory_bytes" in d else ""
        fit = "" if d.get("feasible", True) else " (does not fit in memory)"
        txt = f"  {label:<10} {d['iteration_time_s'] * 1e3:,.1f} ms per iteration{mem_txt}{fit}"
        if gp:
            txt += (f"; checkpoint every {gp['checkpoint_every_iterations']:,} iterations "
                    f"({gp['daly_interval_s'] / 60:.1f} min), goodput {gp['goodput']:.1%}")
        return txt

    print(f"{printable(g.name)} on {printable(c.name)} ({c.num_devices} GPUs) -> {printable(after.name)} "
          f"({after.num_devices} GPUs){', ' + ', '.join(args.slow) + ' slowed' if slow else ''}")
    print(line("healthy", out["healthy"]))
    print(line("mapped", out["mapped"]) + (f"\n             {rule}" if mapped is not None else ""))
    if "replan" in out:
        print(line("re-plan", out["replan"]) + f"  [auto, {out['replan']['search_s']:.1f} s]")
        print(f"             {printable(out['replan']['note'])}")
        if args.output:
            print(f"  wrote {printable(args.output)}" if out["replan"]["output"] else
                  f"  nothing written to {printable(args.output)}: no plan fits in memory")
    elif skipped:
        print(f"  {skipped}")
    gp = out["healthy"]["goodput"]
    print(f"  job MTBF {gp['job_mtbf_s'] / 3600:.2f} h at {args.mtbf_hours:,.0f} GPU-hours a failure; checkpoint "
          f"{ckpt / 1e9:,.1f} GB written in {gp['checkpoint_write_s']:.1f} s; restart {args.restart_min:g} min")
    return status


def cmd_export(args: argparse.Namespace) -> int:
    from ..export import export
    from ..formats import load_strategy as load
    from ..formats import resolve_cluster
    from ..formats.writing import atomic_writer

    s = load(args.strategy)
    sizes = dict(batch=args.batch, seq_len=getattr(args, "seq_len", None),
                 precision=getattr(args, "model_precision", None))
    if not args.model and s.model_name not in sample_names():
        raise ValueError(f"{printable(str(args.strategy))[:200]}: the strategy names model {s.model_name[:80]!r}, "
                         "which is not a sample: give the model file it was made for with --model FILE")
    g = resolve_model(args.model, allow_path=True, **sizes) if args.model else resolve_model(s.model_name, **sizes)
    c = resolve_cluster(args.cluster, allow_path=True) if args.cluster else resolve_cluster(s.cluster_name)
    try:
        s = load(args.strategy, g, c)
    except ValidationError as e:
        if any(p.path == "model.fingerprint" for p in e.problems) and not args.model:
            raise ValueError(f"{problems_summary(e)}\n  (made for another size of {g.name!r}: give the --batch, "
                             "--seq-len and --model-precision it was made with, or its model file with --model)") \
                from None
        raise
    text = export(args.format, g, s, c)
    if args.output:
        with atomic_writer(args.output, make_parents=True) as f:
            f.write(text)
        print(f"wrote {args.output}: {args.format} settings for {g.name} on {c.name}")
    else:
        print(text, end="")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Measure each distinct (op kind, partition shape, precision) a strategy or the search
    space needs once, on the local device, and write a soapbox.profile/1 table."""
    from ..costs import ProfileTable
    from ..studies.profiling import MeasurementCache, all_config_keys, local_device_name, measure, needed_keys

    try:
        import torch
    except ImportError:
        raise ValueError("measuring needs PyTorch: pip install 'soapbox[torch]'") from None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible to PyTorch here")
    g, c = model_and_cluster(args)
    if args.all_configs:
        keys = all_config_keys(g, c)
    else:
        if args.strategy in BASELINES:
            s = make_baseline(args.strategy, g, c)
        else:
            s = load_strategy(args.strategy, g, c)
        keys = needed_keys(g, [s], c)
    label = args.device_type or local_device_name(args.device)
    distinct = list(dict.fromkeys(k[:5] + (label,) for k in keys))
    if len(distinct) > args.max_keys:
        raise ValueError(f"{len(distinct):,} distinct op partitions to measure, more than --max-keys "
                         f"{args.max_keys:,} (measure one strategy, or raise the limit)")
    cache = None
    if args.cache != "none":
        path = args.cache or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                          "soapbox", "measurements.sqlite")
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        cache = MeasurementCache(path)
    table, fresh, reused, t0 = ProfileTable(), 0, 0, time.perf_counter()
    try:
        for k, key in enumerate(distinct):
            m = cache.get(key, label, torch.__version__) if cache else None
            if m is None:
                m = measure(key, args.device, repeats=args.repeats)
                fresh += 1
                if cache:
                    cache.put(key, label, torch.__version__, m)
            else:
                reused += 1
            table.add(*key, m.fwd_s, m.bwd_s)
            if not args.quiet and sys.stderr.isatty():
                print(f"\r  {k + 1:,}/{len(distinct):,} measured", end="", file=sys.stderr, flush=True)
    finally:
        if cache:
            cache.close()
    if not args.quiet and sys.stderr.isatty():
        print(file=sys.stderr)
    save_json(table.to_dict(), args.output)
    print(f"wrote {args.output}: {len(distinct):,} distinct op partitions on {label!r} ({fresh:,} measured now, "
          f"{reused:,} from the cache) in {time.perf_counter() - t0:.1f} s; they apply to clusters whose device "
          f"type is named {label!r}")
    return 0


