"""Activations kept under context parallelism (issue 42: runs that ran were called out of
memory): with sequence parallelism a column-parallel linear keeps its tp shard of the cp
shard, and fused attention keeps its own rank's keys and values, not the gathered ones."""

from __future__ import annotations

import pytest

from engine.cluster import preset
from engine.layout import Layout, build_layout
from engine.models.transformer import GPTConfig, gpt
from engine.sim.memory import saved_activation_bytes

SEQ, H, HEADS, KV = 4096, 512, 8, 2
CFG = GPTConfig(2, H, HEADS, SEQ, 1024, 8, kv_heads=KV, swiglu=True, norm="rmsnorm", positions="rotary",
                bias=False, dropout=0.0, flash_attention=True, precision="bf16")


def saved(cp: int, tp: int = 2) -> dict[str, float]:
    g = gpt(CFG)
    s = build_layout(g, preset("dgx-h100:1"), Layout(tp=tp, cp=cp, dp=8 // (tp * cp), micro_batch=1,
                                                     sequence_parallel=True))
    b = saved_activation_bytes(g, s)
    return {op.name: b[i] for i, op in enumerate(g.ops) if op.name.startswith("layers.1.")}


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_a_column_parallel_linear_keeps_its_sequence_shard(cp):
    # one micro-batch of one sequence: SEQ / cp tokens on a cp rank, / tp under sp; bf16
    assert saved(cp)["layers.1.attn.q"] == SEQ // cp // 2 * H * 2


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_fused_attention_keeps_its_own_keys_and_values(cp):
    # per tp rank: Q of HEADS/2 heads and K, V of KV/2 heads, head width H / HEADS, for its
    # SEQ / cp queries and keys (its own chunk), bf16
    d = H // HEADS
    tokens = SEQ // cp
    assert saved(cp)["layers.1.attn.core"] == tokens * (HEADS // 2 + 2 * KV // 2) * d * 2


def test_a_layer_keeps_less_per_rank_with_more_context_parallelism():
    one, four = sum(saved(1).values()), sum(saved(4).values())
    assert four == pytest.approx(one / 4, rel=1e-9)
