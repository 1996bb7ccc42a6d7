"""The ``soapbox`` command.

Sub-commands (``soapbox COMMAND --help`` for each):

* ``models`` / ``clusters``: the sample models and cluster presets (``--json``);
  ``models --write FOLDER`` writes the sample models' files from their builders.
* ``validate FILE``: check a model, cluster or strategy file; exit 0 when valid, 1 with
  every problem listed otherwise.
* ``model gpt``: write a GPT-style model file from its shape.
* ``import --hf config.json``: write a model file from a Hugging Face config (GPT-2, LLaMA,
  Mistral, Qwen2, Phi-3, Gemma, Falcon and the MoE families Mixtral, Qwen3-MoE, DeepSeek-V3, GPT-OSS).
* ``cluster NAME -o FILE``: write a preset as an editable cluster file.
* ``schema model|cluster|strategy``: print a format's JSON Schema.
* ``baseline``: build a baseline strategy for a model on a cluster and write it.
* ``simulate``: simulate one iteration of a strategy (file or baseline kind); ``--json``,
  ``--trace`` for a Chrome trace.
* ``experts``: the expert view of a mixture-of-experts strategy (experts and routed tokens
  per expert-parallel rank, the busiest rank's gate).
* ``search``: search for a faster strategy (MCMC with delta simulation); ``-o best.json``.
* ``init-sweep``: parallel random initialisation against N runs and one run, at equal compute
  (a small MLP trained with PyTorch on CPU; :mod:`engine.experiments.init_sweep`).

Exit status: 0 done; 1 an invalid file under ``validate``; 2 an error a user can fix
(printed as one line ``soapbox: error: ...``, no traceback: a bad argument, an unreadable
or invalid input, an output that cannot be written); 3 ``simulate`` of a strategy that does
not fit in memory (the report is printed and says which devices are over), ``search``
that found no strategy that fits, or ``whatif`` whose re-plan found no plan that fits; 130
interrupted (Ctrl-C), 143 terminated (SIGTERM). An interrupted write leaves the file it would
replace as it was and no temporary file. An
interrupted (or terminated) ``search -o FILE`` writes the best strategy it had found to FILE
first, and says so.

Names: ``--model``, ``--cluster``, ``--strategy``, ``--profile`` and ``validate FILE`` may
be paths, since a user typed them; the model and cluster a strategy file names resolve only
to samples and presets.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any, Callable, Mapping, Sequence

from ..errors import ROOT_CAUSE_PATHS, SUMMARY_PROBLEMS, SoapboxError, ValidationError, printable, problems_summary
from ..export.infer import EXPORT_FORMATS
from ..graph import PRECISIONS
from ..search import ALGORITHMS
from ..search.baselines import BASELINES
from .commands import (cmd_baseline, cmd_export, cmd_import, cmd_profile, cmd_cluster, cmd_clusters, cmd_experts,
    cmd_model, cmd_models, cmd_schema, cmd_simulate, cmd_sweep, cmd_whatif, cmd_validate)
from .common import (EPILOG, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED, Terminated, add_batch_options,
    add_routing_options, add_strategy_options, int_in, name_arg, number_in, positive_int, strategy_options)
from .init_sweep import add_init_sweep_parser, cmd_init_sweep
from .search import cmd_search, compare_searches, option_names

__all__ = ["main", "int_in", "build_parser", "add_strategy_options", "strategy_options", "compare_searches"]


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

    p = sub.add_parser("models", help="list the sample models (or write their files)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--write", metavar="FOLDER",
                   help="write every sample model's soapbox.model/1 file into FOLDER, from its builder "
                        "(how sample_models/ is made: soapbox models --write sample_models)")

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
    g.add_argument("--hidden", type=positive_int, required=True)
    g.add_argument("--heads", type=int_in(1, 65536), required=True)
    g.add_argument("--kv-heads", type=int_in(1, 65536), help="grouped-query attention: key/value heads")
    g.add_argument("--ffn-hidden", type=positive_int, help="MLP width (default 4*hidden, or LLaMA's rule with --swiglu)")
    g.add_argument("--swiglu", action="store_true", help="SwiGLU MLP, RMSNorm, rotary positions, no biases (LLaMA)")
    g.add_argument("--seq-len", type=positive_int, required=True)
    g.add_argument("--vocab", type=positive_int, required=True)
    g.add_argument("--batch", type=positive_int, required=True, help="global batch in sequences")
    g.add_argument("--flash-attention", action="store_true", help="fused causal attention (FlashAttention)")
    g.add_argument("--precision", choices=PRECISIONS, default="fp16")
    g.add_argument("--name", type=name_arg, default="gpt")
    g.add_argument("-o", "--output", required=True, help="model file to write")

    p = sub.add_parser("import", help="write a model file from an ONNX file or a Hugging Face config",
                       description="Write a soapbox.model/1 file from an ONNX model (needs the onnx package: "
                                   "pip install 'soapbox[onnx]') or a Hugging Face config.json (decoder-only "
                                   "families: gpt2, llama, mistral, qwen2, phi3, gemma, falcon, mixtral, qwen3_moe, "
                                   "deepseek_v3, gpt_oss), read offline from local files.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("onnx_file", nargs="?", metavar="MODEL_ONNX", help="an ONNX model file")
    src.add_argument("--hf", metavar="CONFIG_JSON", help="a Hugging Face config.json")
    src.add_argument("--torch", metavar="MODULE:FUNCTION",
                     help="a function returning (torch.nn.Module, example input), built on the meta device and "
                          "captured with torch.export (runs your code: pip install 'soapbox[torch]')")
    p.add_argument("--batch", type=positive_int,
                   help="global batch (sequences for --hf, required there); for ONNX, binds each input's first "
                        "symbolic axis")
    p.add_argument("--seq-len", type=positive_int, help="sequence length (--hf default: the config's context, at "
                                                        "most 4,096); for ONNX, binds the other symbolic axes")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                   help="bind an ONNX symbolic dimension by name (repeatable)")
    p.add_argument("--unknown", choices=["error", "elementwise"], default="error",
                   help="ONNX / ATen ops soapbox has no kind for: list them and stop (default), or import "
                        "those that keep their input's shape as memory-bound elementwise ops")
    p.add_argument("--precision", choices=PRECISIONS,
                   help="default: the config's torch_dtype (else bf16), the ONNX inputs' or the module's type")
    p.add_argument("--name", type=name_arg, help="model name (default: the config's _name_or_path or model_type, "
                                                 "the ONNX graph's or the module's class name)")
    p.add_argument("-o", "--output", required=True, help="model file to write")

    p = sub.add_parser("profile", help="measure each distinct op partition once (PyTorch) into a profile table",
                       description="FlexFlow's 'measure each distinct operator once': list the distinct (op kind, "
                                   "partition shape, precision) a strategy or the whole search space needs, time "
                                   "each once with PyTorch on this machine (cached across runs), and write a "
                                   "soapbox.profile/1 table for simulate/search --profile.")
    p.add_argument("--model", required=True, help="sample model name or model file")
    p.add_argument("--cluster", required=True, help="cluster preset name or cluster file")
    add_batch_options(p)
    what = p.add_mutually_exclusive_group()
    what.add_argument("--strategy", default="data-parallel", help="a strategy file or a baseline kind "
                                                                  "(default data-parallel)")
    what.add_argument("--all-configs", action="store_true", help="every config the SOAP search space may try")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--device-type", help="the device type name to label the measurements with (default: this "
                                         "machine's CPU or GPU name); they apply to clusters with that type")
    p.add_argument("--repeats", type=int_in(3, 1000), default=10)
    p.add_argument("--max-keys", type=positive_int, default=5000)
    p.add_argument("--cache", help="SQLite file of past measurements (default ~/.cache/soapbox/measurements.sqlite; "
                                   "'none' for no cache)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("-o", "--output", required=True, help="profile table to write")

    p = sub.add_parser("export", help="a strategy as Megatron-LM flags, a DeepSpeed config or a torchtitan "
                                      "launch line",
                       description="Export a Megatron-shaped strategy (tensor x pipeline x context x data "
                                   "parallel, as the frameworks lay them out) for a framework; a strategy they "
                                   "cannot express (per-op splits) is refused with the ops that break it.")
    p.add_argument("strategy", help="strategy file")
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    p.add_argument("--model", help="model (default: the one the strategy names)")
    p.add_argument("--cluster", help="cluster (default: the one the strategy names)")
    p.add_argument("--batch", type=positive_int, help="the sample model's global batch, when not its default")
    p.add_argument("-o", "--output", help="file to write (default: print)")

    p = sub.add_parser("sweep", help="simulate every combination of layouts x cluster sizes (process pool or Ray)",
                       description="Simulate every combination of a grid of Megatron-shaped layouts on each "
                                   "cluster; infeasible points are kept with the reason. Results as CSV, JSON or "
                                   "Parquet, and an HTML report with the Pareto front (time vs GPUs vs memory).")
    p.add_argument("--model", required=True, help="sample model name or model file")
    add_batch_options(p)
    p.add_argument("--grid", nargs="+", required=True, metavar="KEY=V1,V2",
                   help="values per key: tp, pp, cp, vpp, mb (micro-batch), zero, recompute, sp (0/1); or auto: "
                        "every valid layout of the model on each cluster")
    p.add_argument("--clusters", required=True, metavar="PRESET:N1,N2",
                   help="clusters, e.g. dgx-a100-80gb:4,8,16 (several groups separated by spaces in quotes)")
    p.add_argument("--backend", choices=["pool", "serial", "ray"], default="pool",
                   help="a local process pool (default), one process, or Ray (--address for a cluster; local "
                        "mode without)")
    p.add_argument("--address", help="Ray cluster address (ray://host:10001, or auto)")
    p.add_argument("--workers", type=positive_int, help="processes (pool) or local CPUs (Ray); default: all cores")
    p.add_argument("--batch-points", type=positive_int, help="points a task (default: about 4 tasks a worker)")
    p.add_argument("-o", "--output", required=True, help="results: .csv, .json or .parquet")
    p.add_argument("--report", help="HTML report to write (Plotly)")

    add_init_sweep_parser(sub)

    p = sub.add_parser("whatif", help="what a failed GPU, node or link (or a slow GPU) costs, and goodput",
                       description="Fail GPUs, nodes or network links (or slow a GPU down): the strategy mapped "
                                   "onto the survivors by its layout's rule, a re-plan by the search, and goodput "
                                   "over a job with checkpoints at the optimum interval (Young 1974, Daly 2006).",
                       epilog="exit status 0: done (with --budget 0 no re-plan is run and -o writes nothing, and "
                              "says so); 3: the re-plan found no plan that fits in memory, neither the search's nor "
                              "the mapped layout (nothing is written to -o); 2: an error")
    p.add_argument("--model", required=True, help="sample model name or model file")
    p.add_argument("--cluster", required=True, help="cluster preset name or cluster file")
    add_batch_options(p)
    p.add_argument("--strategy", default="data-parallel", help="strategy file or baseline kind (default data-parallel)")
    p.add_argument("--fail", action="append", default=[], metavar="gpu:N|node:N|link:NODE/nicK")
    p.add_argument("--slow", action="append", default=[], metavar="gpu:N=F", help="GPU N keeps F of its speed")
    add_strategy_options(p)
    add_routing_options(p)
    p.add_argument("--budget", default="30s",
                   help="the re-plan's search budget: proposals (5000) or a time (30s, 2m); 0 for no re-plan "
                        "(default 30s)")
    p.add_argument("--mtbf-hours", type=number_in(1e-3, 1e12), default=50_000.0,
                   help="mean time between failures of one GPU, hours (default 50,000: Llama 3's run)")
    p.add_argument("--storage-gbps", type=number_in(1e-6, 1e12), default=100.0,
                   help="checkpoint write bandwidth, GB/s (default 100)")
    p.add_argument("--restart-min", type=number_in(0.0, 1e12), default=10.0,
                   help="restart time after a failure, minutes")
    p.add_argument("--json", action="store_true")
    p.add_argument("-o", "--output", help="write the re-planned strategy here (nothing with --budget 0)")

    p = sub.add_parser("simulate", help="simulate one training iteration of a strategy",
                       epilog="exit status 3: the strategy does not fit in memory (the report says where); "
                              "2: an error")
    p.add_argument("--model", required=True, help="sample model name or model file")
    p.add_argument("--cluster", required=True, help="preset name or cluster file")
    p.add_argument("--strategy", required=True, help="a strategy file, or a baseline kind: " + ", ".join(BASELINES))
    add_batch_options(p)
    add_strategy_options(p)
    add_routing_options(p)
    p.add_argument("--profile", help="measured profile table (soapbox.profile/1) to use before the roofline")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", help="write a Chrome trace (Perfetto) of the iteration to this file")

    p = sub.add_parser("search", help="search for a faster strategy",
                       epilog="exit status 3: no strategy found fits in memory; 2: an error")
    p.add_argument("--model", required=True, help="sample model name or model file")
    p.add_argument("--cluster", required=True, help="preset name or cluster file")
    p.add_argument("--algo", default="auto", help="search algorithm: " + ", ".join(ALGORITHMS) +
                   ", or all (each in turn, compared side by side); default auto")
    p.add_argument("--budget", default="30s",
                   help="proposals (5000) or time (30s, 2m, 1h); at most 10**9 proposals or 7 days; default 30s")
    p.add_argument("--seed", type=int_in(-(2**63), 2**63 - 1), default=0,
                   help="random seed (an iteration budget is reproducible)")
    p.add_argument("--chains", type=int_in(1, 256), default=None,
                   help="mcmc: starting points (data parallel, expert, random); at most 256; default 4")
    p.add_argument("--backend", metavar="serial|pool|ray",
                   help="mcmc, auto: run the chains (and auto's seeds, with a proposal budget) as tasks in rounds "
                        "that share priced strategies and the best so far, in this process (serial, or local), a "
                        "local process pool or Ray (local mode; --address for a cluster): the same answer on each "
                        "for a proposal budget; default: the classic single-process search")
    p.add_argument("--workers", type=int_in(1, 4096), help="--backend: processes (pool) or local CPUs (Ray); "
                                                           "default: all cores")
    p.add_argument("--address", help="--backend ray: a Ray cluster's address (ray://host:10001, or auto)")
    p.add_argument("--option", action="append", metavar="NAME=VALUE",
                   help="an option of the algorithm (repeatable): mcmc " + option_names("mcmc") +
                   "; pase " + option_names("pase") + "; pipeline " + option_names("pipeline") +
                   "; differentiable " + option_names("differentiable"))
    p.add_argument("--strategy", help="also start from this strategy (a file or a baseline kind)")
    add_batch_options(p)
    add_strategy_options(p)
    p.add_argument("-o", "--output", help="write the best strategy here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = sub.add_parser("baseline", help="build a baseline strategy and write it as JSON")
    p.add_argument("--model", required=True, help="sample model name or model file")
    p.add_argument("--cluster", required=True, help="preset name (e.g. dgx-a100-80gb:2) or cluster file")
    p.add_argument("--kind", required=True, choices=list(BASELINES), help="which baseline")
    add_batch_options(p)
    add_strategy_options(p)
    add_routing_options(p)
    p.add_argument("-o", "--output", required=True, help="strategy file to write")
    p.add_argument("--json", action="store_true", help="print a JSON summary")

    p = sub.add_parser("experts", help="the expert view of a mixture-of-experts strategy: experts and tokens per "
                                       "expert-parallel rank",
                       description="Per expert-parallel rank of a mixture-of-experts model's first MoE layer: the "
                                   "experts it holds (placed in order, as Megatron-Core places them), its share of "
                                   "the routed tokens and the token copies it receives per microbatch, and the gate "
                                   "the busiest rank sets (every rank waits for it). Balanced unless --routing-skew "
                                   "or --routing-histogram states an imbalance.")
    p.add_argument("--model", required=True, help="a mixture-of-experts sample model (e.g. mixtral-8x7b) or file")
    p.add_argument("--cluster", required=True, help="preset name or cluster file")
    p.add_argument("--strategy", default="megatron",
                   help="a strategy file, or a baseline kind (default megatron): " + ", ".join(BASELINES))
    add_batch_options(p)
    add_strategy_options(p)
    add_routing_options(p)
    p.add_argument("--max-rows", type=int_in(1, 4096), default=16, metavar="N",
                   help="with more than 2N ranks, show the first and last N (default 16)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


COMMANDS = {
    "models": cmd_models,
    "clusters": cmd_clusters,
    "cluster": cmd_cluster,
    "schema": cmd_schema,
    "validate": cmd_validate,
    "simulate": cmd_simulate,
    "search": cmd_search,
    "model": cmd_model,
    "baseline": cmd_baseline,
    "import": cmd_import,
    "profile": cmd_profile,
    "export": cmd_export,
    "sweep": cmd_sweep,
    "whatif": cmd_whatif,
    "experts": cmd_experts,
    "init-sweep": cmd_init_sweep,
}


_Terminated = Terminated  # (its former name)


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
        if isinstance(exc, ValidationError):  # the root cause, a few problems and a count
            text = problems_summary(exc)
            if sum(p.path not in ROOT_CAUSE_PATHS for p in exc.problems) > SUMMARY_PROBLEMS:
                text += "\n  (`soapbox validate FILE` lists every problem)"
        else:
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
        return EXIT_INTERRUPTED
    except Terminated:
        print("soapbox: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    finally:
        if own:
            signal.signal(signal.SIGTERM, previous)


