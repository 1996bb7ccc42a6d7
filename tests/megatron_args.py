"""A recorded copy of the Megatron-LM arguments the exports use, and of the ``validate_args`` checks
that concern them, for tests (Megatron-LM's training parser is in no wheel).

Read from Megatron-LM **core_v0.19.0** (commit 5be9626709af2722333bf54797c954c09edeada3):
``megatron/training/arguments.py`` (flags made from ``ModelParallelConfig`` / ``TransformerConfig`` /
``TrainingConfig`` / ``DistributedInitConfig`` fields by ``megatron/training/argument_utils.py``'s
``ArgumentGroupFactory`` as ``"--" + name.replace("_", "-")``), checked against that release's own
``parse_args`` (each flag's kind, choices and default below are what its parser reports). The MoE
and MLA names were first read at core_v0.15.3 (309ffca6a405) and are the same at core_v0.19.0.
Line numbers cite ``arguments.py`` at core_v0.19.0.
"""

from __future__ import annotations

import argparse
import re
import shlex

#: name -> True (store_true), a type, or a tuple of choices (what ``parse_args`` accepts)
MEGATRON_ARGS = {
    # parallelism and batch (ModelParallelConfig fields; _add_distributed_args l. 2936-3065)
    "--tensor-model-parallel-size": int, "--pipeline-model-parallel-size": int, "--context-parallel-size": int,
    "--num-virtual-stages-per-pipeline-rank": int, "--decoder-first-pipeline-num-layers": int,
    "--decoder-last-pipeline-num-layers": int, "--pipeline-model-parallel-layout": str,
    "--sequence-parallel": True, "--tp-comm-overlap": True, "--use-distributed-optimizer": True,
    "--overlap-grad-reduce": True, "--overlap-param-gather": True,
    "--micro-batch-size": int, "--global-batch-size": int,
    # recomputation (TransformerConfig fields)
    "--recompute-granularity": ("full", "selective"), "--recompute-method": ("uniform", "block"),
    "--recompute-num-layers": int, "--recompute-modules": "+",
    # activation offloading (ModelParallelConfig.cpu_offloading_num_layers; l. 1869 sets cpu_offloading)
    "--cpu-offloading-num-layers": int,
    # fused kernels (_add_training_args l. 2755-2758: store_false, dests bias_gelu_fusion / bias_swiglu_fusion)
    "--no-bias-gelu-fusion": False, "--no-bias-swiglu-fusion": False,
    # precision (ModelParallelConfig / TransformerConfig fields; _add_mixed_precision_args l. 2902)
    "--bf16": True, "--fp16": True, "--grad-reduce-in-bf16": True,
    "--fp8-format": ("e4m3", "hybrid"), "--fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise", "custom"),
    "--fp8-param-gather": True,
    # the precision-aware optimizer (l. 3500-3517)
    "--use-precision-aware-optimizer": True, "--main-grads-dtype": ("fp32", "bf16"),
    "--main-params-dtype": ("fp32", "fp16"), "--exp-avg-dtype": ("fp32", "fp16", "bf16", "fp8"),
    "--exp-avg-sq-dtype": ("fp32", "fp16", "bf16", "fp8"),
    # sharding: Megatron-FSDP (_add_distributed_args; _add_experimental_args l. 3520; CheckpointConfig)
    "--use-megatron-fsdp": True,
    "--data-parallel-sharding-strategy": ("no_shard", "optim", "optim_grads", "optim_grads_params"),
    "--num-distributed-optimizer-instances": int, "--ckpt-format": ("torch", "torch_dist", "torch_dcp", "fsdp_dtensor"),
    "--megatron-fsdp-main-grads-dtype": ("fp32", "bf16", "fp16", "auto"),
    # MoE overlap (ModelParallelConfig fields)
    "--overlap-moe-expert-parallel-comm": True, "--delay-wgrad-compute": True,
    # _add_moe_args (TransformerConfig fields)
    "--num-experts": int, "--expert-model-parallel-size": int, "--expert-tensor-parallel-size": int,
    "--moe-layer-freq": str, "--moe-ffn-hidden-size": int, "--moe-shared-expert-intermediate-size": int,
    "--moe-grouped-gemm": True, "--moe-router-dtype": ("fp32", "fp64"),
    "--moe-router-score-function": ("softmax", "sigmoid"), "--moe-router-topk": int,
    "--moe-router-pre-softmax": True, "--moe-router-enable-expert-bias": True,
    "--moe-token-dispatcher-type": ("allgather", "alltoall", "flex"), "--moe-expert-capacity-factor": float,
    "--moe-pad-expert-input-to-capacity": True,
    # the model (_add_network_size_args l. 2293-2380, TransformerConfig fields; export_megatron_model)
    "--num-layers": int, "--hidden-size": int, "--ffn-hidden-size": int, "--num-attention-heads": int,
    "--group-query-attention": True, "--num-query-groups": int, "--kv-channels": int, "--seq-length": int,
    "--max-position-embeddings": int,
    "--position-embedding-type": ("learned_absolute", "rope", "yarn", "mrope", "relative", "none"),
    "--normalization": ("LayerNorm", "RMSNorm"), "--swiglu": True, "--disable-bias-linear": True,
    "--add-qkv-bias": True, "--qk-layernorm": True, "--untie-embeddings-and-output-weights": True,
    "--attention-dropout": float, "--hidden-dropout": float,
    "--attention-backend": ("flash", "fused", "unfused", "local", "auto"),
    # _add_network_size_args and _add_mla_args
    "--multi-latent-attention": True, "--q-lora-rank": int, "--kv-lora-rank": int, "--qk-head-dim": int,
    "--qk-pos-emb-head-dim": int, "--v-head-dim": int,
}

#: flags whose dest is not their name (``--fp8-format`` stores ``fp8``: TransformerConfig's field;
#: the store_false switches (False above) store their fusion's name)
DESTS = {"--fp8-format": "fp8", "--no-bias-gelu-fusion": "bias_gelu_fusion",
         "--no-bias-swiglu-fusion": "bias_swiglu_fusion"}

#: parse_args' defaults the rules read (the parser's own, core_v0.19.0)
DEFAULTS = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
            "expert_model_parallel_size": 1, "fp8_recipe": "delayed", "ckpt_format": "torch_dist",
            "data_parallel_sharding_strategy": "optim_grads_params", "num_distributed_optimizer_instances": 1,
            "megatron_fsdp_main_grads_dtype": "auto", "optimizer": "adam", "main_grads_dtype": "fp32",
            "main_params_dtype": "fp32", "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32"}

RELEASE = "core_v0.19.0"


def megatron_parse(text: str) -> argparse.Namespace:
    """Parse an export's flags as Megatron-LM's parser would (unknown names, missing or extra
    values and bad choices fail). ``text``: the flags, or an export's whole text (its comment and
    ``export`` lines are not flags)."""
    p = argparse.ArgumentParser(exit_on_error=False, add_help=False, allow_abbrev=False)
    for name, kind in MEGATRON_ARGS.items():
        dest = {"dest": DESTS[name]} if name in DESTS else {}
        if kind is True:
            p.add_argument(name, action="store_true", **dest)
        elif kind is False:
            p.add_argument(name, action="store_false", **dest)
        elif kind == "+":
            p.add_argument(name, nargs="+", **dest)
        elif isinstance(kind, tuple):
            p.add_argument(name, choices=kind, **dest)
        else:
            p.add_argument(name, type=kind, **dest)
    p.set_defaults(**DEFAULTS)
    lines = [x for x in text.splitlines() if x.strip() and not x.lstrip().startswith(("#", "export "))]
    args, unknown = p.parse_known_args(shlex.split("\n".join(lines)))
    assert unknown == [], f"not Megatron-LM arguments: {unknown}"
    return args


def environment(text: str) -> dict[str, str]:
    """The ``export NAME=value`` lines of an export's text."""
    return dict(x.split(None, 1)[1].split("=", 1) for x in text.splitlines() if x.startswith("export "))


def eval_layer_freq(pattern: str) -> list[int]:
    """Megatron-LM's moe_freq_type / _eval_pattern (arguments.py): only , digits [ ] ( ) + *."""
    assert not re.search(r"[^,\d\[\]\(\)\+\*]", pattern), pattern
    return eval(pattern)


def parse_pipeline_layout(layout: str) -> list[str]:
    """PipelineParallelLayerLayout.parse_str_to_list (megatron/core/transformer/
    pipeline_parallel_layer_layout.py, core_v0.15.3 and core_v0.19.0): the chunks' layer letters
    (E embedding, t transformer layer, L loss, m MTP)."""
    layout = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        layout = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), layout)
    return layout.split("|")


def megatron_rules(args: argparse.Namespace, gpus: int, layers: int, *, seq: int | None = None,
                   env: dict[str, str] | None = None, arch: int = 9) -> None:
    """The checks of Megatron-LM's validate_args (and of TransformerConfig, parallel_state and the
    schedules where named) that concern the exported flags, core_v0.19.0; ``arch``: the GPUs'
    compute capability major (``get_device_arch_version``). Mutates ``args`` as validate_args does
    (data_parallel_size, virtual_pipeline_model_parallel_size, use_distributed_optimizer, ...)."""
    env = env or {}
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    assert gpus % (tp * pp * cp) == 0  # l. 430: world size divisible by total_model_size
    args.data_parallel_size = dp = gpus // (tp * pp * cp)  # l. 446
    # the microbatch calculator (megatron/core/num_microbatches_calculator.py)
    assert args.micro_batch_size > 0 and args.global_batch_size % (args.micro_batch_size * dp) == 0
    args.num_microbatches = args.global_batch_size // (args.micro_batch_size * dp)
    # l. 878-901: one virtual-pipeline flag at most; vpp from the layout string or the flag
    assert (args.num_virtual_stages_per_pipeline_rank is not None) + \
        (args.pipeline_model_parallel_layout is not None) <= 1
    vpp = None
    if args.pipeline_model_parallel_layout is not None:
        chunks = parse_pipeline_layout(args.pipeline_model_parallel_layout)
        assert len(chunks) % pp == 0
        vpp = len(chunks) // pp
        # TransformerConfig: no first/last counts with a layout; validate_layer_layout
        assert args.decoder_first_pipeline_num_layers is None and args.decoder_last_pipeline_num_layers is None
        flat = [c for k in range(len(chunks)) for c in chunks[k]]
        assert flat[0] == "E" and flat[-1] == "L" and flat.count("E") == 1 and flat.count("L") == 1
        assert set(flat) <= set("EtLm") and flat.count("t") == layers
    elif args.num_virtual_stages_per_pipeline_rank is not None:
        vpp = args.num_virtual_stages_per_pipeline_rank
        assert layers % (pp * vpp) == 0  # TransformerConfig: even chunks
    elif args.decoder_first_pipeline_num_layers is None and args.decoder_last_pipeline_num_layers is None:
        assert layers % pp == 0  # l. 927-938
    else:  # TransformerConfig's uneven PP (transformer_config.py): the middle stages even, none empty
        first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
        assert first > 0 and last > 0 and pp > 2 and (layers - first - last) % (pp - 2) == 0
        assert layers - first - last > 0
    args.virtual_pipeline_model_parallel_size = vpp if vpp and vpp > 1 else None
    if args.virtual_pipeline_model_parallel_size:
        assert pp > 1  # l. 940-945 (overlap_p2p_comm is on by default)
        m = args.num_microbatches  # schedules.py l. 1133-1153: groups of pp microbatches
        assert pp <= m and not 0 < m % pp < pp
    if args.use_megatron_fsdp:  # l. 1100-1160
        args.use_distributed_optimizer = True
        assert args.optimizer in ("sgd", "adam")
        assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1"
        assert args.ckpt_format == "fsdp_dtensor"
        if args.num_distributed_optimizer_instances > 1:  # parallel_state.py l. 923
            assert (dp * cp) % args.num_distributed_optimizer_instances == 0
    if args.ckpt_format == "fsdp_dtensor":
        assert args.use_megatron_fsdp  # l. 1620
    if args.overlap_param_gather:  # l. 990-995
        assert args.use_distributed_optimizer or args.use_megatron_fsdp
        assert args.overlap_grad_reduce
    if args.fp8_param_gather:  # l. 1060
        assert args.use_distributed_optimizer or args.use_megatron_fsdp
    if args.use_precision_aware_optimizer:  # core/optimizer/optimizer_config.py l. 430-436
        assert args.optimizer == "adam" and args.use_distributed_optimizer
    assert not (args.fp16 and args.bf16)  # l. 1172-1180
    args.accumulate_allreduce_grads_in_fp32 = bool(args.bf16 and not args.grad_reduce_in_bf16)  # l. 1184-1190
    if seq is not None and cp > 1:
        assert seq % (2 * cp) == 0  # l. 1284
    if args.recompute_granularity == "selective":
        assert args.recompute_method is None and args.recompute_num_layers is None  # l. 1384, TransformerConfig
    elif args.recompute_granularity == "full":
        assert args.recompute_method is not None and args.recompute_num_layers is not None  # TransformerConfig
    if args.recompute_modules:
        assert args.recompute_granularity == "selective"
        assert set(args.recompute_modules) <= {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                                               "shared_experts"}
        assert "moe_act" not in args.recompute_modules or args.moe_grouped_gemm
        assert "mla_up_proj" not in args.recompute_modules or args.multi_latent_attention
        if args.fp8 and args.fp8_recipe == "delayed":  # transformer_config.py l. 1821-1826
            assert not {"moe_act", "layernorm"} & set(args.recompute_modules)
    args.cpu_offloading = (args.cpu_offloading_num_layers or 0) > 0  # l. 1869
    if args.cpu_offloading:  # transformer_config.py l. 1707-1722
        assert 0 <= args.cpu_offloading_num_layers < layers
        assert pp == 1
        assert args.recompute_granularity is None
    if tp == 1:
        args.sequence_parallel = False  # l. 1391
    if args.tp_comm_overlap:
        assert args.sequence_parallel  # l. 1401
    if (tp > 1 or cp > 1) and arch < 10 and not args.use_megatron_fsdp and not args.overlap_moe_expert_parallel_comm:
        assert env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1"  # l. 1411-1438
    if args.moe_grouped_gemm:
        assert arch >= 8  # l. 1338-1340
    # the MoE checks (l. 1592-1603; TransformerConfig; parallel_state)
    ep = args.expert_model_parallel_size
    etp = args.expert_tensor_parallel_size if args.expert_tensor_parallel_size is not None else tp
    if ep > 1:
        assert args.num_experts is not None and args.num_experts % ep == 0
    if args.num_experts:
        assert tp == 1 or args.sequence_parallel  # MoE with tensor parallelism needs sequence parallelism
        assert (gpus // pp) % (ep * etp) == 0  # parallel_state: expert data parallel size whole
        assert not args.moe_router_enable_expert_bias or args.moe_router_score_function == "sigmoid"
        assert args.moe_router_topk > 1 or args.moe_router_score_function != "softmax" or args.moe_router_pre_softmax
        assert not args.moe_pad_expert_input_to_capacity or args.moe_expert_capacity_factor is not None
        if args.moe_layer_freq is not None:
            assert len(eval_layer_freq(args.moe_layer_freq)) == layers
    if args.overlap_moe_expert_parallel_comm:  # TransformerConfig.__post_init__, core_v0.19.0
        assert pp == 1 or args.virtual_pipeline_model_parallel_size is not None  # vpp with pp > 1
        assert ep > 1 and args.moe_token_dispatcher_type in ("alltoall", "flex")
        assert args.recompute_granularity != "full" and args.recompute_method is None
        assert args.bf16 or args.fp16
    # (--delay-wgrad-compute, l. 1790, needs the transformer_engine implementation: the default)


def what_megatron_runs(args: argparse.Namespace) -> dict:
    """What a run with ``args`` (after :func:`megatron_rules`) does, in the simulation's terms."""
    if args.use_megatron_fsdp:
        zero = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}[
            args.data_parallel_sharding_strategy]
        n = args.num_distributed_optimizer_instances
        shard = args.data_parallel_size * args.context_parallel_size // n if n > 1 else 0
    else:
        zero, shard = (1 if args.use_distributed_optimizer else 0), 0
    recompute = args.recompute_granularity or "none"
    if recompute == "full":
        assert args.recompute_method == "uniform" and args.recompute_num_layers == 1  # every layer, whole
    return {"dp": args.data_parallel_size, "microbatches": args.num_microbatches,
            "vpp": args.virtual_pipeline_model_parallel_size or 1, "recompute": recompute,
            "recompute_modules": tuple(args.recompute_modules or ()), "zero_stage": zero, "shard_group": shard,
            "precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32",
            "fp8": args.fp8 is not None, "sequence_parallel": args.sequence_parallel,
            "grad_reduce_in_fp32": args.accumulate_allreduce_grads_in_fp32,
            "offload_activations": args.cpu_offloading_num_layers or 0,
            "kernels": "fused" if args.bias_swiglu_fusion else "eager"}
