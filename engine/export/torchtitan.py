"""A torchtitan 0.3.0 launch for a layout (``soapbox export --format torchtitan``), and the
layout such a launch gives back (for round trips).

torchtitan 0.3.0 has no TOML job file: ``python -m torchtitan.train`` (``torchtitan/train.py``)
builds its config with ``ConfigManager.parse_args`` (``torchtitan/config/manager.py``): a
config function (``--module M --config F``: ``torchtitan/models/M/config_registry.py``) and
then command-line overrides parsed by tyro, ``--section.key value``. Everything below was read
from the installed torchtitan 0.3.0 wheel (and torch 2.13.0, the pinned test extra):

* ``config/configs.py`` ``ParallelismConfig`` / ``TrainingConfig`` / ``CompileConfig``: the
  override names; ``training.mixed_precision_param`` is ``Literal["bfloat16", "float32"]``
  (no float16) and ``mixed_precision_reduce`` ``Literal["float32"]``; ``data_parallel_shard_degree``
  -1 takes the leftover ranks (written explicitly here).
* ``trainer.py`` ``Trainer.__init__``: gradient accumulation steps = global_batch_size /
  (local_batch_size x dp_replicate x dp_shard), pipeline microbatches = local_batch_size /
  pipeline_parallel_microbatch_size with pp > 1 (else 1); ``Trainer.Config.__post_init__``:
  local_batch_size divisible by the microbatch size under pp, and CUDA graphs refused with pp
  (``--training.disable_cuda_graphs`` needed); the sequence length divisible by tp (with
  sequence parallelism) x 2 cp (with cp > 1). ``train_step`` syncs no gradient flag: FSDP2
  reduces gradients on every accumulation step's backward.
* ``Trainer.Config.model_spec`` is ``tyro.conf.Suppress``: model converters (float8) are set in
  the config function only, never by an override (``llama3_405b`` is the one shipped llama3
  config with ``Float8LinearConverter``).
* ``distributed/activation_checkpoint.py``: ``activation_checkpoint`` is a tyro subcommand,
  ``activation-checkpoint:{selective,full,memory-budget,none}``; ``selective`` is per-op
  (compute-intensive ops saved, every second matmul recomputed), there is no attention-core-only
  mode.
* ``distributed/parallel_dims.py``: dp_replicate x dp_shard x cp x tp x pp = world size;
  ``fsdp_enabled`` is dp_shard > 1 or cp > 1 (FSDP shards over dp_shard x cp: with cp > 1 the
  parameters are always sharded over the context-parallel ranks); mesh order pp, dp_replicate,
  dp_shard, cp, tp (tp fastest, as Megatron ranks). ``models/llama3/parallelize.py``: FSDP2
  ``fully_shard`` always (dp_shard 1 with dp_replicate = DDP-like replication).
* ``distributed/fsdp.py`` ``get_fsdp_reshard_after_forward_policy``: "always" reshards
  (ZeRO-3), "never" keeps the gathered parameters to the backward (ZeRO-2), "default" is
  "not pp_enabled" (so ZeRO-2 under pipelines).
* torch 2.13.0 ``torch/distributed/pipelining/stage.py`` ``backward_maybe_with_nosync``: under
  pipelining FSDP neither syncs nor reshards between microbatches (one reduce-scatter at the end
  of the step): ZeRO-2's schedule, whatever the reshard policy, with the gradients accumulated
  unsharded in float32 (``accumulate_unsharded``; ``_fsdp_param.py``
  ``to_accumulated_grad_if_needed``).
* ``distributed/pipeline_parallel.py``: ``module_fqns_per_model_part`` (one list per model
  chunk; ``tok_embeddings``, ``layers.N``, ``norm``, ``lm_head``) sets the split and the stages
  per rank (chunks / pp); looped schedules place chunk c on rank c % pp.
* ``models/common/decoder.py``: weight tying is refused with pipeline parallelism.
* launch: torchtitan's ``run_train.sh`` (``PYTORCH_ALLOC_CONF="expandable_segments:True"
  torchrun --nproc_per_node=N --rdzv_backend c10d --rdzv_endpoint=... -m torchtitan.train
  --module M --config F "$@"``; read at the repository's ``b5bcd76c6``, the launcher the 0.3.0
  wheel does not ship).

The previous release's TOML (0.2.2) is no longer written: it cannot be checked beside 0.3.0.
"""

from __future__ import annotations

import shlex

from ..cluster import Cluster
from .refusals import refuse
from .moe import torchtitan_expert_lines
from ..graph import OpGraph
from ..layout import Layout
from ..graph.blocks import layer_blocks
from ..layout.placement import balanced_layers

__all__ = ["TORCHTITAN_RELEASE", "SHIPPED", "PLACEHOLDER", "to_torchtitan", "overrides", "launch_args", "layout_from_torchtitan",
           "render", "placeholder_module", "shipped_note", "SHIPPED_MOE",
           "FLOAT8_CONFIGS"]

#: the torchtitan release the export targets
TORCHTITAN_RELEASE = "0.3.0"

#: the module and config function a model needs when torchtitan ships none for it
PLACEHOLDER = ("MODULE_OF_YOUR_MODEL", "YOUR_CONFIG_FUNCTION")

#: torchtitan 0.3.0's shipped dense configs: (layers, dim, heads, kv heads, ffn, vocab) ->
#: (module, config function, float8 on). Shapes from ``torchtitan/models/llama3/__init__.py``
#: ``model_registry("8B" | "70B" | "405B")`` (checked against it by the tests); converters from
#: ``torchtitan/models/llama3/config_registry.py`` (only ``llama3_405b`` converts to float8,
#: its ``lm_head`` left out).
SHIPPED = {
    (32, 4096, 32, 8, 14336, 128256): ("llama3", "llama3_8b", False),
    (80, 8192, 64, 8, 28672, 128256): ("llama3", "llama3_70b", False),
    (126, 16384, 128, 8, 53248, 128256): ("llama3", "llama3_405b", True),
}

#: torchtitan 0.3.0's shipped mixture-of-experts configs, told by (parameters, layers,
#: vocabulary) of the model soapbox builds -> (module, config function, float8 on, what differs).
#: ``torchtitan/models/{qwen3,deepseek_v3,gpt_oss}/config_registry.py``; each config's model,
#: built on the meta device, has these parameters (tests/export/test_export_torchtitan.py checks
#: it): the same as soapbox's samples, but GPT-OSS's attention sinks, which soapbox leaves out.
SHIPPED_MOE = {
    (30_532_122_624, 48, 151936): [("qwen3", "qwen3_30b_a3b", False, "")],
    (671_026_404_352, 61, 129280): [
        ("deepseek_v3", "deepseek_v3_671b", False, ""),
        # Float8LinearConverter (filter lm_head, router.gate) and Float8GroupedExpertsConverter
        ("deepseek_v3", "deepseek_v3_671b_float8", True,
         "deepseek_v3_671b_float8 keeps lm_head and the routers' gates in bf16 (its filter_fqns)")],
    (116_829_154_368, 36, 201088): [("gpt_oss", "gpt_oss_120b", False,
                                     "torchtitan's gpt_oss_120b also trains the attention sinks (2,304 parameters) "
                                     "the simulation leaves out")],
}
#: the shipped config functions that turn float8 on (llama3's and deepseek_v3's config_registry.py)
FLOAT8_CONFIGS = ("llama3_405b", "deepseek_v3_671b_float8")

_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B"}
_AC = {"none": "activation-checkpoint:none", "full": "activation-checkpoint:full",
       "selective-op": "activation-checkpoint:selective"}
_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


def _shape(graph: OpGraph | None) -> tuple[int, ...] | None:
    """(layers, dim, heads, kv heads, ffn, vocab) of a Llama-shaped graph, None otherwise."""
    if graph is None:
        return None
    blocks = layer_blocks(graph)
    ops = {op.name: op for op in graph.ops}
    emb = next((op for op in graph.ops if op.kind == "embedding"), None)
    if not blocks or emb is None:
        return None
    b = blocks[0]
    q, k, gate = ops.get(f"{b}.attn.q.split_heads"), ops.get(f"{b}.attn.k.split_heads"), ops.get(f"{b}.mlp.gate")
    norm = ops.get(f"{b}.norm1")
    if q is None or k is None or gate is None or norm is None or norm.kind != "rmsnorm":
        return None
    if any(op.param_group and op.param_group != op.name for op in graph.ops):
        return None  # (tied weights: torchtitan's Llama 3 is untied)
    try:
        return (len(blocks), int(emb.attrs["embedding_dim"]), int(q.attrs["shape"][2]), int(k.attrs["shape"][2]),
                int(gate.attrs["out_features"]), int(emb.attrs["num_embeddings"]))
    except (KeyError, IndexError, TypeError):
        return None


def placeholder_module(graph: OpGraph | None, fp8: bool) -> tuple[str, str]:
    """(--module, --config) of the shipped torchtitan config that builds ``graph`` with the same
    float8 setting, or :data:`PLACEHOLDER`."""
    hit = SHIPPED.get(_shape(graph) or ())
    if hit is None:
        hit = next((e for e in SHIPPED_MOE.get(_size(graph) or (), []) if e[2] == fp8), None)
    if hit is None or hit[2] != fp8:
        return PLACEHOLDER
    return hit[0], hit[1]


def _size(graph: OpGraph | None) -> tuple[int, int, int] | None:
    """(parameters, layers, vocabulary) of ``graph`` (:data:`SHIPPED_MOE`'s key)."""
    emb = next((op for op in graph.ops if op.kind == "embedding"), None) if graph is not None else None
    if emb is None:
        return None
    return graph.param_count, len(layer_blocks(graph)), int(emb.attrs.get("num_embeddings", 0))


def shipped_note(graph: OpGraph | None, config: str) -> str:
    """What the shipped mixture-of-experts ``config`` does beyond the simulated model ("" if nothing)."""
    return next((e[3] for e in SHIPPED_MOE.get(_size(graph) or (), []) if e[1] == config), "")


def _tied(graph: OpGraph | None) -> bool:
    return graph is not None and any(op.param_group and op.param_group != op.name for op in graph.ops)


def _chunks(lay: Layout, graph: OpGraph | None) -> list[list[str]]:
    """The modules of each model chunk (pp x vpp of them), as the simulation splits the layers."""
    n = len(layer_blocks(graph)) if graph is not None else 0
    if not n:
        raise refuse("torchtitan", "a pipeline split needs the model's layers", "export with the model")
    counts = list(lay.layers_per_stage) if lay.vpp == 1 and lay.layers_per_stage else \
        balanced_layers(n, lay.pp * lay.vpp)
    parts, i = [], 0
    for c, count in enumerate(counts):
        part = ["tok_embeddings"] if c == 0 else []
        part += [f"layers.{j}" for j in range(i, i + count)]
        i += count
        if c == len(counts) - 1:
            part += ["norm", "lm_head"]
        parts.append(part)
    return parts


def _refusals(lay: Layout, precision: str, seq_len: int, graph: OpGraph | None, module: tuple[str, str]) -> None:
    r = refuse
    if lay.zero_stage == 1:
        raise r("torchtitan", "ZeRO-1 (sharded optimizer state only) has no torchtitan setting (FSDP shards "
                               "parameters too)", "export --format megatron (--use-distributed-optimizer)")
    if precision not in _DTYPES:
        raise r("torchtitan", f"{precision} training: torchtitan 0.3.0's training.mixed_precision_param is bfloat16 "
                               "or float32 (config/configs.py)", "build the model in bf16, or export --format "
                               "megatron / deepspeed")
    if precision == "bf16" and not lay.grad_reduce_in_fp32:
        raise r("torchtitan", "bf16 gradient reduction: torchtitan 0.3.0 reduces in float32 only "
                               "(training.mixed_precision_reduce)",
                "keep grad_reduce_in_fp32, or export --format megatron")
    if lay.recompute == "selective" or lay.recompute_modules:
        raise r("torchtitan", "Megatron's selective recomputation (the attention core or --recompute-modules): "
                               "torchtitan 0.3.0's selective checkpointing is per-op (activation-checkpoint:selective)",
                "recompute selective-op or full, or export --format megatron")
    if lay.accumulate_unsharded and lay.pp == 1:
        raise r("torchtitan", "unsharded gradient accumulation (FSDP's no_sync) without pp: torchtitan 0.3.0 "
                               "reduce-scatters every micro-batch's gradients", "turn accumulate_unsharded off")
    if lay.pp > 1 and lay.zero_stage == 2 and not lay.accumulate_unsharded:
        raise r("torchtitan", "ZeRO-2 with pp and gradients reduce-scattered into shards: under torch's pipelining "
                               "FSDP2 keeps every microbatch's gradients unsharded until the step's one "
                               "reduce-scatter (stage.py backward_maybe_with_nosync), in float32",
                "turn accumulate_unsharded on (what torchtitan runs), or export --format deepspeed")
    if lay.optimizer_state != "fp32":
        raise r("torchtitan", f"optimizer state {lay.optimizer_state}: torchtitan 0.3.0's FSDP2 keeps the sharded "
                               "parameters in float32, AdamW's moments in their dtype", "set optimizer_state to fp32, "
                               "or export --format megatron (bf16-moments)")
    if not lay.loss_parallel and lay.tp > 1:
        raise r("torchtitan", "the loss on gathered logits: torchtitan 0.3.0 computes it on the vocabulary shards "
                               "whenever tp > 1 (components/loss.py _LossParallelCrossEntropy)",
                "keep loss_parallel on")
    if lay.offload_activations:
        raise r("torchtitan", "activation offloading (Megatron-Core's --cpu-offloading-num-layers): torchtitan 0.3.0 "
                               "has no setting for it", "export --format megatron")
    if lay.moe_comm_overlap:
        raise r("torchtitan", "MoE all-to-all overlap (Megatron-Core's) has no torchtitan setting",
                "export --format megatron")
    if lay.offload_optimizer != "none" or lay.offload_params != "none":
        raise r("torchtitan", "ZeRO-Offload / ZeRO-Infinity (DeepSpeed's) is not torchtitan's CPU offload (which "
                               "moves parameters, gradients and optimizer state together)", "export --format deepspeed")
    if lay.tp_comm_overlap:
        raise r("torchtitan", "tensor-parallel communication overlap: torchtitan's async TP needs torch.compile of "
                               "the model, which the simulation does not run", "turn tp_comm_overlap off, or export "
                                                                                "--format megatron")
    if not lay.overlap_grad_reduce and lay.dp * lay.cp > 1:
        raise r("torchtitan", "gradient reduction after the backward: torchtitan's FSDP2 always overlaps it",
                "keep overlap_grad_reduce on")
    if lay.zero_stage == 0 and lay.cp > 1:
        raise r("torchtitan", f"cp {lay.cp} without ZeRO: torchtitan 0.3.0 always FSDP-shards the parameters over the "
                               "context-parallel ranks (parallel_dims.py fsdp_enabled)",
                "zero_stage 2 or 3, or export --format megatron")
    if lay.zero_stage >= 2 and lay.shard_group and lay.shard_group % lay.cp:
        raise r("torchtitan", f"shard group {lay.shard_group} with cp {lay.cp}: torchtitan shards over dp_shard x cp",
                f"a shard group that is a multiple of {lay.cp}")
    if lay.pp > 1 and lay.zero_stage == 3:
        raise r("torchtitan", "ZeRO-3 with pipeline parallelism: under torch 2.13's pipelining FSDP neither "
                               "reshards nor reduces gradients between microbatches (stage.py "
                               "backward_maybe_with_nosync), ZeRO-2's schedule",
                "zero_stage 2 with pp (fsdp_reshard_after_forward never), or export --format deepspeed")
    if lay.pp == 1 and lay.microbatches > 1 and lay.zero_stage in (0, 2) and lay.dp * lay.cp > 1:
        raise r("torchtitan", f"{lay.microbatches} accumulated microbatches with ZeRO-{lay.zero_stage}: torchtitan "
                               "0.3.0 reduces gradients after every accumulation step (trainer.py train_step; FSDP2's "
                               "default), the simulation once per step",
                "zero_stage 3 (reduced per microbatch, as simulated), one microbatch per step, or export "
                "--format megatron / deepspeed")
    if lay.pp > 1:
        sched = lay.schedule or ("interleaved" if lay.vpp > 1 else "1f1b")
        if (sched == "interleaved") != (lay.vpp > 1):
            raise r("torchtitan", f"schedule {sched} with vpp {lay.vpp}: torchtitan's looped schedule "
                                   "(Interleaved1F1B) needs 2+ model chunks per rank and the single-stage ones "
                                   "(1F1B, GPipe) exactly one (pipeline_parallel.py)",
                    "interleaved with vpp >= 2, or 1f1b / gpipe with vpp 1")
        if _tied(graph):
            raise r("torchtitan", "tied embedding and output weights with pipeline parallelism: torchtitan 0.3.0 "
                                   "refuses weight tying under pp (models/common/decoder.py)",
                    "pp 1, or export --format megatron")
    div = (lay.tp if lay.sequence_parallel else 1) * (2 * lay.cp if lay.cp > 1 else 1)
    if seq_len and seq_len % div:
        raise r("torchtitan", f"sequence length {seq_len} is not divisible by {div} (tp with sequence parallelism x "
                               "2 cp; trainer.py)", "a sequence length divisible by it")
    if lay.fp8 and lay.fp8_library != "torchao":
        raise r("torchtitan", f"fp8 GEMMs by {lay.fp8_library}: torchtitan's float8 is torchao's Float8Linear, "
                               "which keeps the bf16 input and weight for the backward (float8_linear.py "
                               "save_for_backward(input_hp, weight_hp_t)) and caches no fp8 weight",
                "fp8_library torchao")
    if lay.fp8 and module == PLACEHOLDER:
        raise r("torchtitan", "fp8 GEMMs: torchtitan 0.3.0 sets float8 as a model converter inside the config "
                               "function (Trainer.Config.model_spec takes no command-line override), and ships "
                               f"it for {' and '.join(FLOAT8_CONFIGS)} (and debug models) only",
                "write a config function with Float8LinearConverter "
                                                           "(as llama3_debugmodel_float8), or export --format megatron")


def overrides(lay: Layout, precision: str, seq_len: int, graph: OpGraph | None = None) -> list[str]:
    """torchtitan 0.3.0's command-line overrides for ``lay`` (everything but --module/--config)."""
    if lay.zero_stage >= 2:
        # FSDP over dp_shard x cp (parallel_dims.py): a shard group counts the dp x cp ranks
        shard = lay.shard_group // lay.cp if lay.shard_group else lay.dp
    else:
        shard = 1
    replicate = lay.dp // shard
    policy = {3: "always", 2: "never"}.get(lay.zero_stage, "default")
    o = ["--parallelism.data_parallel_replicate_degree", str(replicate),
         "--parallelism.data_parallel_shard_degree", str(shard),
         "--parallelism.fsdp_reshard_after_forward", policy,
         "--parallelism.tensor_parallel_degree", str(lay.tp),
         "--parallelism." + ("enable_sequence_parallel" if lay.sequence_parallel or lay.tp == 1
                             else "no_enable_sequence_parallel"),
         "--parallelism.context_parallel_degree", str(lay.cp),
         "--parallelism.pipeline_parallel_degree", str(lay.pp)]
    o += torchtitan_expert_lines(lay, graph, shard)
    if lay.pp > 1:
        # one accumulation step of all the microbatches, pipelined as one schedule
        local = lay.micro_batch * lay.microbatches
        sched = lay.schedule or ("interleaved" if lay.vpp > 1 else "1f1b")
        o += ["--parallelism.pipeline_parallel_schedule", _SCHEDULES[sched],
              "--parallelism.pipeline_parallel_microbatch_size", str(lay.micro_batch),
              "--parallelism.module_fqns_per_model_part", *(",".join(p) for p in _chunks(lay, graph))]
    else:
        local = lay.micro_batch  # accumulation steps = microbatches
    o += ["--training.local_batch_size", str(local), "--training.global_batch_size", str(lay.global_batch)]
    if seq_len:
        o += ["--training.seq_len", str(seq_len)]
    o += ["--training.dtype", "float32", "--training.mixed_precision_param", _DTYPES[precision],
          "--training.mixed_precision_reduce", "float32"]
    if lay.pp > 1 or lay.ep > 1:
        o.append("--training.disable_cuda_graphs")  # (Trainer.Config refuses CUDA graphs with pp / sync EP)
    # fused kernels are what torch.compile makes of the model's pointwise work (CompileConfig.enable)
    o += ["--compile.enable" if lay.kernels == "fused" else "--compile.no_enable",
          "--compile.no_enable_async_tensor_parallel", _AC[lay.recompute]]
    return o


def _launch(cluster: Cluster | None, lay: Layout) -> list[str]:
    n = lay.tp * lay.cp * lay.pp * lay.dp
    nodes = cluster.num_nodes if cluster is not None else 1
    per = cluster.gpus_per_node if cluster is not None else n
    if nodes > 1 and n == nodes * per:
        return ["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", "$MASTER_ADDR:29500"]
    return ["torchrun", "--nproc-per-node", str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"]


def to_torchtitan(lay: Layout, precision: str, seq_len: int, graph: OpGraph | None = None,
                  cluster: Cluster | None = None) -> str:
    """A torchtitan 0.3.0 launch line for ``lay`` with comments saying what the user adds."""
    fp8 = lay.fp8
    module = placeholder_module(graph, fp8)
    _refusals(lay, precision, seq_len, graph, module)
    name = graph.name if graph is not None else "the model"
    head = [f"# soapbox export --format torchtitan: for torchtitan {TORCHTITAN_RELEASE} (python -m torchtitan.train; its "
            "ConfigManager loads --module/--config, then these overrides)"]
    if module == PLACEHOLDER:
        head += [f"# {name}: torchtitan {TORCHTITAN_RELEASE} ships no config function for this model; replace "
                 f"{PLACEHOLDER[0]} and {PLACEHOLDER[1]}",
                 "#   with a config_registry module and function that build it (modules tok_embeddings, layers.N, "
                 "norm, lm_head)" + ("" if not lay.pp > 1 else ", as the pipeline split below names them")]
    else:
        head.append(f"# {name}: torchtitan's {module[0]} {module[1]} (same layers, width, heads and vocabulary)")
        if shipped_note(graph, module[1]):
            head.append(f"#   {shipped_note(graph, module[1])}")
    head.append("# add: --hf_assets_path (tokenizer), --dataloader.dataset, --training.steps and the optimizer "
                "your run needs")
    if fp8:
        head.append(f"# fp8: {module[1]} converts the linear layers to float8 (Float8LinearConverter, lm_head "
                    "left in bf16)")
    launch = _launch(cluster, lay)
    if "--nnodes" in launch:
        head.append("# run on every node, MASTER_ADDR set to the first node's address")
    cmd = ['PYTORCH_ALLOC_CONF="expandable_segments:True"', *launch[:-1], shlex.quote(launch[-1])
           if "$" not in launch[-1] else f'"{launch[-1]}"', "-m", "torchtitan.train", "--module", module[0],
           "--config", module[1]]
    opts = overrides(lay, precision, seq_len, graph)
    lines, cur = [], []
    for a in opts:
        if (a.startswith("--") or a.startswith("activation-checkpoint:")) and cur:
            lines.append(" ".join(cur))
            cur = []
        cur.append(shlex.quote(a))
    lines.append(" ".join(cur))
    return "\n".join(head) + "\n" + " \\\n  ".join([" ".join(cmd), *lines]) + "\n"


def launch_args(text: str) -> list[str]:
    """The arguments after ``-m torchtitan.train`` in an export's launch line."""
    body = " ".join(line.rstrip("\\").strip() for line in text.splitlines() if not line.startswith("#"))
    args = shlex.split(body)
    return args[args.index("torchtitan.train") + 1:]


def layout_from_torchtitan(text: str, base: Layout) -> Layout:
    """The layout the export ``text`` runs (its overrides read back); what no override says (the
    gather unit, the microbatch schedule's switches) comes from ``base``."""
    args = launch_args(text)
    v: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("activation-checkpoint:"):
            v["ac"] = a.split(":", 1)[1]
        elif a.startswith("--"):
            key = a[2:]
            vals = []
            while i + 1 < len(args) and not args[i + 1].startswith("--") and ":" not in args[i + 1]:
                vals.append(args[i + 1])
                i += 1
            v[key] = vals[0] if len(vals) == 1 else (vals or True)
        i += 1
    p = "parallelism."
    shard, rep = int(v[p + "data_parallel_shard_degree"]), int(v[p + "data_parallel_replicate_degree"])
    tp, cp, pp = int(v[p + "tensor_parallel_degree"]), int(v[p + "context_parallel_degree"]), \
        int(v[p + "pipeline_parallel_degree"])
    policy = v[p + "fsdp_reshard_after_forward"]
    zero = 0 if shard == 1 and cp == 1 else (3 if policy == "always" else 2)
    local, glob = int(v["training.local_batch_size"]), int(v["training.global_batch_size"])
    vpp, sched, mb, counts = 1, "1f1b", local, None
    if pp > 1:
        parts = v[p + "module_fqns_per_model_part"]
        parts = [parts] if isinstance(parts, str) else parts
        sizes = [sum(1 for m in part.split(",") if m.startswith("layers.")) for part in parts]
        vpp = len(parts) // pp
        sched = {b: a for a, b in _SCHEDULES.items()}[v[p + "pipeline_parallel_schedule"]]
        mb = int(v[p + "pipeline_parallel_microbatch_size"])
        counts = tuple(sizes) if vpp == 1 else None
    ac = {b.split(":")[1]: a for a, b in _AC.items()}[v["ac"]]
    return Layout(tp=tp, pp=pp, dp=shard * rep, cp=cp, ep=int(v.get(p + "expert_parallel_degree", 1)), etp=1,
                  vpp=vpp, micro_batch=mb, global_batch=glob, schedule=sched, recompute=ac, zero_stage=zero,
                  sequence_parallel=tp > 1 and p + "enable_sequence_parallel" in v, fp8=base.fp8,
                  fp8_library="torchao" if base.fp8 else "te",
                  layers_per_stage=counts, gather_unit=base.gather_unit,
                  shard_group=shard * cp if zero >= 2 and rep > 1 else 0, accumulate_unsharded=pp > 1 and zero == 2,
                  grad_reduce_in_fp32=base.grad_reduce_in_fp32, overlap_grad_reduce=base.overlap_grad_reduce,
                  overlap_param_gather=base.overlap_param_gather)


def render(lay: Layout, graph: OpGraph, cluster: Cluster) -> str:
    """The export's text: comments and a torchtitan 0.3.0 launch line."""
    seq = next((op.dim("length").size for op in graph.ops if "length" in op.dim_names), 0)
    return to_torchtitan(lay, graph.precision, seq, graph, cluster)
