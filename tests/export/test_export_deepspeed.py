"""Issue 27 (DeepSpeed part): every export goes through DeepSpeed 0.19.8's own
``deepspeed.runtime.config.DeepSpeedConfig`` and what DeepSpeed would run, read back from its
parsed attributes, equals the strategy; what it cannot run is refused with the reason."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine.cluster import preset
from engine.errors import ValidationError
from engine.layout.build import build_layout
from engine.export import export, infer_layout, layout_from_deepspeed
from engine.formats import resolve_model
from engine.layout import Layout
from engine.graph.blocks import layer_blocks
from engine.models import build_sample
from engine.search.baselines import data_parallel
from engine.layout.build import fsdp
from engine.layout import build_layout

ds_config = pytest.importorskip("deepspeed.runtime.config")

GPT2, LLAMA, MIXTRAL = resolve_model("gpt2", batch=32), build_sample("llama2-7b"), build_sample("mixtral-8x7b")
A2, H8 = preset("dgx-a100-80gb:2"), preset("dgx-h100:8")


class Mpu:
    """The stand-in mpu DeepSpeedConfig asks for the data-parallel world size (runtime/config.py)."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.fixture(autouse=True)
def rank0(monkeypatch):
    """DeepSpeedConfig calls deepspeed.comm.get_rank() before it reads the mpu; without a process
    group that raises and it falls back to world size 1."""
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)


def op(s):
    return replace(s, gather_unit="op")


def mixtral(g, c):
    return op(build_layout(g, c, Layout(ep=8, zero_stage=3, micro_batch=1)))


MATRIX = {  # name: (graph, cluster, strategy)
    "gpt2-zero1-acc4": (GPT2, A2, lambda: build_layout(GPT2, A2, Layout(zero_stage=1, micro_batch=1, dp=8))),
    "gpt2-zero2-offload": (GPT2, A2, lambda: fsdp(GPT2, A2, Layout(zero_stage=2, offload_optimizer="cpu"))),
    "gpt2-zero3-op-full": (GPT2, A2, lambda: fsdp(GPT2, A2, Layout(zero_stage=3, micro_batch=1, recompute="full",
                                                                   gather_unit="op"))),
    "gpt2-zero3-op-offload": (GPT2, A2, lambda: fsdp(GPT2, A2, Layout(zero_stage=3, gather_unit="op",
                                                                      offload_optimizer="cpu", offload_params="cpu"))),
    "gpt2-ddp-no-overlap": (GPT2, A2, lambda: replace(data_parallel(GPT2, A2, micro_batch=1),
                                                      overlap_grad_reduce=False)),
    "llama-zero1-bf16": (LLAMA, H8, lambda: build_layout(LLAMA, H8, Layout(zero_stage=1, grad_reduce_in_fp32=False))),
    "llama-zero2-fp32grads": (LLAMA, H8, lambda: build_layout(LLAMA, H8, Layout(zero_stage=2, micro_batch=2))),
    "llama-tp2-zero1": (LLAMA, H8, lambda: build_layout(LLAMA, H8, Layout(tp=2, zero_stage=1,
                                                                          grad_reduce_in_fp32=False, micro_batch=1))),
    "llama-tp4-zero3-full": (LLAMA, H8, lambda: op(fsdp(LLAMA, H8, Layout(zero_stage=3, tp=4, recompute="full",
                                                                          micro_batch=1)))),
    "llama-zero3-op": (LLAMA, H8, lambda: op(fsdp(LLAMA, H8, Layout(zero_stage=3, micro_batch=4)))),
    "mixtral-ep8-zero3": (MIXTRAL, H8, lambda: mixtral(MIXTRAL, H8)),
}


def run(cfg, dp):
    """What DeepSpeed parses out of ``cfg`` on ``dp`` data-parallel ranks."""
    return ds_config.DeepSpeedConfig(json.loads(json.dumps(cfg)), mpu=Mpu(dp))


@pytest.mark.parametrize("name", sorted(MATRIX))
def test_deepspeed_runs_the_strategy(name):
    g, c, make = MATRIX[name]
    s = make()
    lay = infer_layout(g, s, c)
    text = export("deepspeed", g, s, c)
    cfg = json.loads(text)
    ds = run(cfg, lay.dp)
    # data parallelism and microbatches: DeepSpeed's batch arithmetic over its dp world size
    assert ds.world_size == lay.dp
    assert ds.train_micro_batch_size_per_gpu == lay.micro_batch
    assert ds.gradient_accumulation_steps == lay.microbatches == s.pipeline.microbatches
    assert ds.train_batch_size == g.batch_size == ds.train_micro_batch_size_per_gpu * \
        ds.gradient_accumulation_steps * lay.dp
    assert ds.pipeline["stages"] == "auto" and s.pipeline.stages == 1 and s.pipeline.virtual_stages == 1  # (no vpp)
    # sharding
    assert ds.zero_optimization_stage == s.zero_stage
    assert bool(ds.zero_config.overlap_comm) == s.overlap_grad_reduce
    assert ds.zero_config.zero_hpz_partition_size == 1  # (no ZeRO++ secondary copy)
    off_opt, off_par = ds.zero_config.offload_optimizer, ds.zero_config.offload_param
    assert (off_opt.device if off_opt else "none") == s.offload_optimizer
    assert (off_par.device if off_par else "none") == s.offload_params
    if s.zero_stage == 3:
        assert s.gather_unit == "op" and ds.zero_config.prefetch_bucket_size == 5e7
    # tensor and expert parallelism
    tp = ds.tensor_parallel_config.autotp_size or 1
    assert tp == lay.tp and (tp == 1 or ds.tensor_parallel_config.vocab_parallel_lm_head is False)
    ep = ds.expert_parallel_config
    assert (ep.autoep_size if ep.enabled else 1) == lay.ep and ep.expert_tensor_parallel_size == lay.etp
    # recomputation: the block names every layer, and the file says the model code must checkpoint them
    ac = ds.activation_checkpointing_config
    if s.recompute == "full":
        assert ac.number_checkpoints == len(layer_blocks(g)) and ac.partition_activations is False
        assert any("checkpoint each transformer layer" in n for n in cfg["soapbox"]["notes"])
    else:
        assert s.recompute == "none" and "activation_checkpointing" not in cfg and ac.number_checkpoints is None
    # precision
    assert ds.bfloat16_config.enabled == (g.precision == "bf16") and ds.float16_config.enabled == (g.precision ==
                                                                                                   "fp16")
    assert ds.communication_data_type is None  # (the model's dtype, as simulated)
    if g.precision == "bf16" and s.zero_stage < 3:
        assert (ds.grad_accum_dtype == "fp32") == s.grad_reduce_in_fp32
    assert cfg["soapbox"]["target"] == "DeepSpeed 0.19.8"
    # and back: the same configs, op for op
    back = build_layout(g, c, layout_from_deepspeed(cfg, lay))
    assert all(back.configs[o.name] == s.configs[o.name] for o in g.ops)


def test_autotp_batch_arithmetic_counts_distinct_samples():
    """With AutoTP, DeepSpeed's world size is the mpu's dp (world / tp); without an mpu it counts
    every rank, so train_batch_size is left for DeepSpeed to compute."""
    s = build_layout(LLAMA, H8, Layout(tp=2, zero_stage=1, grad_reduce_in_fp32=False, micro_batch=1))
    cfg = json.loads(export("deepspeed", LLAMA, s, H8))
    assert "train_batch_size" not in cfg
    assert run(cfg, 32).train_batch_size == LLAMA.batch_size


def test_the_target_block_is_tolerated():
    cfg = json.loads(export("deepspeed", GPT2, MATRIX["gpt2-zero1-acc4"][2](), A2))
    assert run(cfg, 8).train_batch_size == run({k: v for k, v in cfg.items() if k != "soapbox"}, 8).train_batch_size


def test_what_deepspeed_rejects_is_never_written():
    """MiCS is gone in 0.19.8: DeepSpeedConfig rejects mics_shard_size (why shard groups are refused)."""
    cfg = json.loads(export("deepspeed", GPT2, MATRIX["gpt2-zero3-op-full"][2](), A2))
    cfg["zero_optimization"]["mics_shard_size"] = 4
    with pytest.raises(ds_config.DeepSpeedConfigError, match="MiCS"):
        run(cfg, 16)


REFUSALS = {
    "fp8 training switch": lambda: (LLAMA, H8, op(fsdp(LLAMA, H8, Layout(zero_stage=3, fp8=True)))),
    "removed MiCS": lambda: (GPT2, A2, fsdp(GPT2, A2, Layout(zero_stage=3, shard_group=8, gather_unit="op"))),
    "gathers module by module": lambda: (GPT2, A2, fsdp(GPT2, A2, Layout(zero_stage=3))),
    "without an AutoTP preset": lambda: (GPT2, A2, build_layout(GPT2, A2, Layout(tp=2, zero_stage=2))),
    "sequence parallelism": lambda: (LLAMA, H8, build_layout(LLAMA, H8, Layout(tp=2, sequence_parallel=True,
                                                                               zero_stage=2))),
    "experts over the tp ranks": lambda: (MIXTRAL, H8, op(build_layout(MIXTRAL, H8, Layout(tp=2, ep=4, zero_stage=3,
                                                                                           sequence_parallel=True)))),
    "pipeline / context": lambda: (GPT2, A2, build_layout(GPT2, A2, Layout(pp=2, micro_batch=1, zero_stage=1))),
    "NotImplementedError": lambda: (LLAMA, H8, replace(build_layout(LLAMA, H8, Layout()), overlap_grad_reduce=False)),
    "after the backward": lambda: (GPT2, A2, data_parallel(GPT2, A2)),
    "BF16_Optimizer": lambda: (LLAMA, H8, build_layout(LLAMA, H8, Layout(zero_stage=1))),
    "overlap_param_gather": lambda: (GPT2, A2, build_layout(GPT2, A2, Layout(zero_stage=1, overlap_param_gather=True))),
    "selective recomputation": lambda: (GPT2, A2, build_layout(GPT2, A2, Layout(zero_stage=1, recompute="selective"))),
    "nvme_path": lambda: (GPT2, A2, fsdp(GPT2, A2, Layout(zero_stage=3, gather_unit="op", offload_params="nvme"))),
    "fp32 master weights and fp32 Adam moments": lambda: (LLAMA, H8, fsdp(LLAMA, H8, Layout(
        zero_stage=3, gather_unit="op", optimizer_state="bf16"))),
    "cpu_checkpointing": lambda: (LLAMA, H8, fsdp(LLAMA, H8, Layout(zero_stage=3, gather_unit="op",
                                                                   offload_activations=2))),
}


@pytest.mark.parametrize("why", sorted(REFUSALS))
def test_refusals_name_the_reason(why):
    g, c, s = REFUSALS[why]()
    with pytest.raises(ValidationError, match=f"deepspeed: .*{why}.*; "):
        export("deepspeed", g, s, c)


def test_hand_made_layout_without_the_graph_keeps_the_old_call():
    lay = Layout(dp=16, micro_batch=2, global_batch=32, zero_stage=2)
    from engine.export import to_deepspeed
    cfg = to_deepspeed(lay, "fp32")
    assert run(cfg, 16).gradient_accumulation_steps == 1 and "bf16" not in cfg


def test_autotp_preset_follows_the_imported_family_not_the_name():
    """Issue 44: the Hub-named Llama-3.1-8B was refused (no preset by its name) while
    ``llama3-8b`` was accepted; the preset follows the family the config was imported as."""
    from engine.models.hf import from_hf_config

    cfg = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 1024, "max_position_embeddings": 2048,
           "torch_dtype": "bfloat16", "_name_or_path": "meta-llama/Llama-3.1-8B"}
    g = from_hf_config(cfg, batch=32)
    s = build_layout(g, A2, Layout(tp=2, zero_stage=2))
    ds_cfg = json.loads(export("deepspeed", g, s, A2))
    assert ds_cfg["tensor_parallel"]["autotp_size"] == 2 and ds_cfg["tensor_parallel"]["preset_model"] == "llama"
    lookalike = from_hf_config({**cfg, "model_type": "mistral", "_name_or_path": "llama-lookalike"}, batch=32)
    with pytest.raises(ValidationError, match="without an AutoTP preset"):
        export("deepspeed", lookalike, build_layout(lookalike, A2, Layout(tp=2, zero_stage=2)), A2)
