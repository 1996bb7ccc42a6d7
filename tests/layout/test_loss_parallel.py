"""The loss on vocabulary shards or on gathered logits (``Layout.loss_parallel``; issue 42:
KempnerForge gathers its output head's logits to every tensor-parallel rank for the loss)."""

from __future__ import annotations

import pytest

from engine.cluster import preset
from engine.errors import ValidationError
from engine.export import export
from engine.export.infer import infer_layout
from engine.layout import Layout, build_layout
from engine.models.transformer import GPTConfig, gpt
from engine.sim.report import simulate_strategy

VOCAB, SEQ = 32000, 2048
G = gpt(GPTConfig(4, 1024, 8, SEQ, VOCAB, 8, swiglu=True, norm="rmsnorm", positions="rotary", bias=False,
                  dropout=0.0, flash_attention=True, precision="bf16", tie_embeddings=False))
C = preset("dgx-h100:1")
LOSS = next(op.name for op in G.ops if op.kind == "softmax_cross_entropy")
HEAD = next(op.name for op in G.ops if op.kind == "linear" and op.out_tensors[0].shape[-1] == VOCAB)


def built(loss_parallel: bool):
    return build_layout(G, C, Layout(tp=4, dp=2, micro_batch=1, loss_parallel=loss_parallel))


def test_the_loss_is_on_vocabulary_shards_or_replicated_over_tp():
    on, off = built(True), built(False)
    assert dict(on.configs[LOSS].degrees) == {"sample": 2, "vocab": 4}
    assert dict(off.configs[LOSS].degrees) == {"sample": 2, "replica": 4}
    # the output head stays column-parallel either way: only the loss reads whole logits
    assert on.configs[HEAD].degree("feature") == off.configs[HEAD].degree("feature") == 4


def test_gathered_logits_cost_their_memory_and_their_all_gather():
    on, off = simulate_strategy(G, built(True), C), simulate_strategy(G, built(False), C)
    # one sample of SEQ tokens per data-parallel rank: the loss's 4-byte buffer over its logits
    assert on.memory.logits_bytes[0] == 4 * SEQ * VOCAB // 4
    assert off.memory.logits_bytes[0] == 4 * SEQ * VOCAB
    assert off.iteration_time_s > on.iteration_time_s
    gathers = [t for t in range(off.tasks.num_tasks) if off.tasks.op[t] == G.index[LOSS] and off.tasks.coll[t] >= 0]
    assert gathers  # the logits reach every rank in an all-gather over the tensor-parallel group


def test_the_layout_is_inferred_back_and_the_frameworks_that_cannot_say_it_refuse():
    assert infer_layout(G, built(False), C).loss_parallel is False
    assert infer_layout(G, built(True), C).loss_parallel is True
    for fmt, why in (("megatron", "vocabulary-parallel"), ("torchtitan", "whenever tp > 1")):
        with pytest.raises(ValidationError, match=why):
            export(fmt, G, built(False), C)
