"""The sub-commands' arguments: one function a command, each adding its parser to the
``soapbox`` command's sub-parsers (:func:`engine.cli.build_parser` calls them in order). The
options that shape a strategy are made from the layout record (:func:`engine.cli.common.
add_strategy_options`); what each command does is :mod:`engine.cli.commands`'.
"""

from __future__ import annotations

from ..export.infer import EXPORT_FORMATS
from ..graph import PRECISIONS
from ..search import ALGORITHMS
from ..search.baselines import BASELINES
from .common import (add_batch_options, add_routing_options, add_strategy_options, int_in, name_arg, number_in,
                     positive_int)
from .search import option_names

__all__ = ["add_models", "add_clusters", "add_cluster", "add_schema", "add_validate", "add_model", "add_import",
           "add_profile", "add_export", "add_sweep", "add_whatif", "add_simulate", "add_search", "add_baseline",
           "add_experts"]


def add_models(sub) -> None:
    """``soapbox models``: the sample models."""
    p = sub.add_parser("models", help="list the sample models (or write their files)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--write", metavar="FOLDER",
                   help="write every sample model's soapbox.model/1 file into FOLDER, from its builder "
                        "(how sample_models/ is made: soapbox models --write sample_models)")


def add_clusters(sub) -> None:
    """``soapbox clusters``: the cluster presets."""
    p = sub.add_parser("clusters", help="list the cluster presets")
    p.add_argument("--json", action="store_true", help="print JSON")


def add_cluster(sub) -> None:
    """``soapbox cluster``: a preset as a cluster file."""
    p = sub.add_parser("cluster", help="write a preset as an editable cluster file")
    p.add_argument("name", help="preset name, e.g. dgx-a100-80gb:2 or hetero-demo (dgx-a100-80gb:2+nics=4: another "
                                "network)")
    p.add_argument("-o", "--output", required=True, help="cluster file to write")


def add_schema(sub) -> None:
    """``soapbox schema``: a format's JSON Schema."""
    p = sub.add_parser("schema", help="print the JSON Schema of a file format")
    p.add_argument("kind", choices=("model", "cluster", "strategy", "profile"))


def add_validate(sub) -> None:
    """``soapbox validate``: any soapbox file checked."""
    p = sub.add_parser("validate", help="check a model, cluster, strategy or profile file")
    p.add_argument("file")
    p.add_argument("--model", help="model to check a strategy against (default: the one it names)")
    p.add_argument("--cluster", help="cluster to check a strategy against (default: the one it names)")


def add_model(sub) -> None:
    """``soapbox model``: a model file from a shape."""
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
    m = g.add_argument_group("mixture of experts (Mixtral / Qwen3-MoE / DeepSeek shapes: SwiGLU experts, RMSNorm, "
                             "rotary, fused attention, untied)")
    m.add_argument("--experts", type=int_in(2, 1 << 16), help="routed experts a layer (makes the MLPs experts)")
    m.add_argument("--top-k", type=int_in(1, 1 << 16), help="experts each token is routed to (needs --experts)")
    m.add_argument("--expert-ffn", type=positive_int, help="one routed expert's width (default: --ffn-hidden)")
    m.add_argument("--shared-experts", type=int_in(0, 1 << 16), default=0, help="experts every token passes")
    m.add_argument("--dense-layers", type=int_in(0, 4096), default=0,
                   help="leading layers with a dense MLP of --ffn-hidden (DeepSeek's first_k_dense_replace)")
    g.add_argument("--precision", choices=PRECISIONS, default="fp16")
    g.add_argument("--name", type=name_arg, default="gpt")
    g.add_argument("-o", "--output", required=True, help="model file to write")


def add_import(sub) -> None:
    """``soapbox import``: a model file from ONNX, PyTorch or a Hugging Face config."""
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
    p.add_argument("--attention", choices=["fused", "eager"],
                   help="--hf: attention as one fused (FlashAttention) op a layer, what training stacks run "
                        "(default, unless the config's attn_implementation is eager), or eager matmuls and softmax")
    p.add_argument("-o", "--output", required=True, help="model file to write")


def add_profile(sub) -> None:
    """``soapbox profile``: measured op partitions."""
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


def add_export(sub) -> None:
    """``soapbox export``: a strategy for a framework."""
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
    p.add_argument("--seq-len", type=positive_int, metavar="TOKENS",
                   help="the sample model's sequence length, when the strategy was made with one")
    p.add_argument("--model-precision", choices=["fp32", "tf32", "fp16", "bf16"],
                   help="the sample model's precision, when the strategy was made with one")
    p.add_argument("-o", "--output", help="file to write (default: print)")


def add_sweep(sub) -> None:
    """``soapbox sweep``: layouts x cluster sizes."""
    p = sub.add_parser("sweep", help="simulate every combination of layouts x cluster sizes (process pool or Ray)",
                       description="Simulate every combination of a grid of Megatron-shaped layouts on each "
                                   "cluster (and, with --network, each network); infeasible points are kept with the "
                                   "reason. Results as CSV, JSON or "
                                   "Parquet, and an HTML report with the Pareto front (time vs GPUs vs memory).")
    p.add_argument("--model", required=True, help="sample model name or model file")
    add_batch_options(p, per_gpu=False)  # (one batch for every cluster size: a sweep compares them at it)
    p.add_argument("--grid", nargs="+", required=True, metavar="KEY=V1,V2",
                   help="values per key: tp, pp, cp, vpp, mb (micro-batch), zero, recompute, sp (0/1); or auto: "
                        "every valid layout of the model on each cluster")
    p.add_argument("--clusters", required=True, metavar="PRESET:N1,N2",
                   help="clusters, e.g. dgx-a100-80gb:4,8,16 (several groups separated by spaces in quotes; "
                        "dgx-h100:8,16+nics=4: on another network)")
    p.add_argument("--network", nargs="+", metavar="KEY=V1,V2",
                   help="each point on each network: nics (NICs a node), nic_gbps (a NIC's Gb/s), pod (GPUs a "
                        "full-bisection pod), oversub (oversubscription between pods), e.g. nics=4,8 pod=256 "
                        "oversub=1,2")
    p.add_argument("--backend", choices=["pool", "serial", "ray"], default="pool",
                   help="a local process pool (default), one process, or Ray (--address for a cluster; local "
                        "mode without)")
    p.add_argument("--address", help="Ray cluster address (ray://host:10001, or auto)")
    p.add_argument("--workers", type=positive_int,
                   help="processes (pool) or local CPUs (Ray); default: all cores; at most one a task and 8 a core")
    p.add_argument("--batch-points", type=positive_int, help="points a task (default: about 4 tasks a worker)")
    p.add_argument("-o", "--output", required=True, help="results: .csv, .json or .parquet (checked before the sweep)")
    p.add_argument("--report", help="HTML report to write (Plotly; .html)")
    p.add_argument("--tokens", type=number_in(1.0, 1e18), default=1e12,
                   help="tokens of the training run the report prices in days and GPU-hours (default 1e12; samples "
                        "for a model that is not a language model)")
    p.add_argument("--time-all", action="store_true",
                   help="simulate the layouts whose memory floor (weights, gradients, optimizer state and the "
                        "activations held before the first backward) is already over a GPU's capacity too, for "
                        "their time; by default they are rows that do not fit, without a time")


def add_whatif(sub) -> None:
    """``soapbox whatif``: failures and goodput."""
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


def add_simulate(sub) -> None:
    """``soapbox simulate``: one iteration simulated."""
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


def add_search(sub) -> None:
    """``soapbox search``: a faster strategy."""
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


def add_baseline(sub) -> None:
    """``soapbox baseline``: a baseline strategy."""
    p = sub.add_parser("baseline", help="build a baseline strategy and write it as JSON")
    p.add_argument("--model", required=True, help="sample model name or model file")
    p.add_argument("--cluster", required=True, help="preset name (e.g. dgx-a100-80gb:2) or cluster file")
    p.add_argument("--kind", required=True, choices=list(BASELINES), help="which baseline")
    add_batch_options(p)
    add_strategy_options(p)
    add_routing_options(p)
    p.add_argument("-o", "--output", required=True, help="strategy file to write")
    p.add_argument("--json", action="store_true", help="print a JSON summary")


def add_experts(sub) -> None:
    """``soapbox experts``: a mixture-of-experts strategy's experts per rank."""
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
