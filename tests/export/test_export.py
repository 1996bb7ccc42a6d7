"""Issue 15: plans a framework can run. A Megatron-shaped strategy exports to Megatron-LM
flags, a DeepSpeed config and a torchtitan launch line; parsed back they give the same layout (the
same configs, op for op); what a framework cannot express is refused with the reason."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine.cli import main
from engine.cluster import preset
from engine.errors import ValidationError
from engine.layout.build import build_layout
from engine.export import (export, infer_layout, layout_from_deepspeed, layout_from_megatron, layout_from_torchtitan,
    to_deepspeed, to_megatron, to_torchtitan)
from engine.export.megatron import megatron_flags
from engine.formats import resolve_model
from engine.search.baselines import data_parallel
from engine.layout.build import fsdp
from engine.strategy import Config
from engine.layout import Layout, build_layout

G, C = resolve_model("gpt2", batch=32), preset("dgx-a100-80gb:2")

LAYOUTS = {
    "tp2-pp2-sp-selective-zero1": lambda: build_layout(G, C, Layout(tp=2, pp=2, micro_batch=1, sequence_parallel=True,
                                                                    recompute="selective", zero_stage=1)),
    "tp4-pp4-uneven": lambda: build_layout(G, C, Layout(tp=4, pp=4, micro_batch=1, layers_per_stage=[2, 4, 4, 2])),
    "pp2-vpp2": lambda: build_layout(G, C, Layout(pp=2, vpp=2, micro_batch=1)),
    "fsdp-zero3-full": lambda: fsdp(G, C, Layout(zero_stage=3, micro_batch=1, recompute="full")),
    "fsdp-zero2": lambda: fsdp(G, C, Layout(zero_stage=2)),
    "dp": lambda: data_parallel(G, C),
    "tp2-sp-cp2": lambda: build_layout(G, C, Layout(tp=2, cp=2, sequence_parallel=True, micro_batch=1)),
}


def same_configs(a, b):
    assert a.pipeline == b.pipeline and a.recompute == b.recompute and a.zero_stage == b.zero_stage
    assert a.sequence_parallel == b.sequence_parallel and dict(a.stage_of) == dict(b.stage_of)
    for op in G.ops:
        assert a.configs[op.name] == b.configs[op.name], op.name


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_round_trips(name):
    s = LAYOUTS[name]()
    lay = infer_layout(G, s, C)
    same_configs(build_layout(G, C, lay), s)
    done = 0
    try:
        flags = to_megatron(lay)
        same_configs(build_layout(G, C, layout_from_megatron(flags, lay)), s)
        done += 1
    except ValidationError as e:
        assert lay.zero_stage >= 2, e
    try:
        cfg = json.loads(json.dumps(to_deepspeed(lay, G.precision)))
        same_configs(build_layout(G, C, layout_from_deepspeed(cfg, lay)), s)
        done += 1
    except ValidationError as e:
        assert lay.tp > 1 or lay.pp > 1 or lay.cp > 1 or lay.recompute == "selective" or lay.zero_stage in (0, 3), e
    try:
        text = to_torchtitan(lay, G.precision, 1024, G)
        same_configs(build_layout(G, C, layout_from_torchtitan(text, lay)), s)
        done += 1
    except ValidationError as e:  # (ZeRO-1; gpt2's tied weights under pp; DDP's per-step reduction; cp without ZeRO)
        assert lay.zero_stage == 1 or lay.pp > 1 or lay.microbatches > 1 or lay.cp > 1, e
    assert done >= 1


def test_megatron_flags_read_like_megatron_lm():
    s = LAYOUTS["tp2-pp2-sp-selective-zero1"]()
    text = export("megatron", G, s, C)
    assert megatron_flags(text) == ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                            "--sequence-parallel", "--recompute-granularity", "selective",
                            "--use-distributed-optimizer", "--overlap-grad-reduce", "--micro-batch-size", "1",
                            "--global-batch-size", "32",  # (gradient reduction overlapped, as simulated)
                            # GPT-2's shape: learned positions, LayerNorm, GeLU, biases, tied head, dropout 0.1,
                            # attention simulated unfused
                            "--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12",
                            "--ffn-hidden-size", "3072", "--seq-length", "1024", "--max-position-embeddings", "1024",
                            "--attention-dropout", "0.1", "--hidden-dropout", "0.1", "--attention-backend", "unfused"]


def test_a_per_op_split_is_refused_with_the_ops_that_break_it():
    s = build_layout(G, C, Layout(tp=2, micro_batch=1))
    odd = s.with_config("layers.3.mlp.fc1", Config({"sample": 8}, tuple(range(8))))
    with pytest.raises(ValidationError) as e:
        export("megatron", G, odd, C)
    msg = str(e.value)
    assert "not a Megatron-shaped layout" in msg and "layers.3.mlp.fc1" in msg


def test_what_a_framework_cannot_express_is_refused_with_the_alternative():
    assert "--use-megatron-fsdp" in megatron_flags(export("megatron", G, fsdp(G, C, Layout(zero_stage=3)),
                                                          C))  # (core_v0.19.0 has ZeRO-3)
    with pytest.raises(ValidationError, match="without an AutoTP preset.*megatron"):
        export("deepspeed", G, build_layout(G, C, Layout(tp=2)), C)
    with pytest.raises(ValidationError, match="ZeRO-1.*use-distributed-optimizer"):
        export("torchtitan", G, build_layout(G, C, Layout(tp=2, sequence_parallel=True, zero_stage=1)), C)


def test_a_model_without_layers_is_refused():
    g = resolve_model("alexnet")
    with pytest.raises(ValidationError, match="no numbered transformer layers"):
        export("megatron", g, data_parallel(g, preset("p100-4x4")), preset("p100-4x4"))


def test_cli(tmp_path, capsys):
    path = tmp_path / "s.json"
    assert main(["baseline", "--model", "gpt2", "--cluster", "dgx-a100-80gb:2", "--kind", "fsdp", "--batch", "32", "-o",
                 str(path)]) == 0
    capsys.readouterr()
    assert main(["export", "--format", "torchtitan", str(path), "--batch", "32"]) == 0
    out = capsys.readouterr().out
    assert "--parallelism.data_parallel_shard_degree 16" in out and "activation-checkpoint:none" in out
    assert main(["export", "--format", "megatron", str(path), "--batch", "32"]) == 0
    assert "--data-parallel-sharding-strategy optim_grads_params" in capsys.readouterr().out
    assert main(["export", "--format", "deepspeed", str(path), "--batch", "32", "-o", str(tmp_path / "ds.json")]) == 2
    assert "gathers module by module" in capsys.readouterr().err  # (FSDP's block gathers: not DeepSpeed's)



def test_switches_reach_the_exports():
    """Issue 25's switches: what each format can say, said; what it cannot, refused with the reason."""
    s = LAYOUTS["tp2-pp2-sp-selective-zero1"]()
    off = replace(s, overlap_grad_reduce=False)
    assert "--overlap-grad-reduce" not in export("megatron", G, off, C)
    gather = replace(s, overlap_param_gather=True)
    assert "--overlap-param-gather" in megatron_flags(export("megatron", G, gather, C))
    with pytest.raises(ValidationError, match="per-op selective"):
        export("megatron", G, replace(s, recompute="selective-op"), C)
    with pytest.raises(ValidationError, match="deepspeed"):
        export("megatron", G, replace(s, offload_optimizer="cpu"), C)
    z = fsdp(G, C, Layout(zero_stage=2, offload_optimizer="cpu"))
    cfg = json.loads(export("deepspeed", G, z, C))
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert cfg["zero_optimization"]["overlap_comm"] is True
    with pytest.raises(ValidationError, match="nvme_path"):
        export("deepspeed", G, fsdp(G, C, Layout(zero_stage=3, offload_params="nvme")), C)
    t = export("torchtitan", G, fsdp(G, C, Layout(zero_stage=3, recompute="selective-op")), C)
    assert t.rstrip().endswith("activation-checkpoint:selective")
