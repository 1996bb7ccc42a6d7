"""The loss's buffer beyond the logits its op keeps, per stack (issue 42): Megatron-Core's fused
vocab-parallel loss and PyTorch's eager loss on a bf16 model keep 4 bytes an element of the
logits; a mixed-precision model's eager loss upcasts to fp32 (torchtitan's
``cross_entropy(pred.float())``): its log-softmax and, at the backward's peak, two gradients,
3 x 4 bytes less the 2-byte logits the loss op keeps."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.cluster import preset
from engine.layout import Layout, build_layout
from engine.models.transformer import GPTConfig, gpt
from engine.sim.memory_static import logits_bytes

VOCAB, SEQ = 32000, 2048
G = gpt(GPTConfig(2, 512, 8, SEQ, VOCAB, 8, swiglu=True, norm="rmsnorm", positions="rotary", bias=False,
                  dropout=0.0, flash_attention=True, precision="bf16", tie_embeddings=False))
C = preset("dgx-h100:1")
ELEMENTS = SEQ * VOCAB  # one sample per data-parallel rank


@pytest.mark.parametrize("kernels, state, per", [("fused", "fp32", 4), ("eager", "fp32", 10), ("eager", "bf16", 4),
                                                 ("fused", "bf16", 4)])
def test_bytes_per_logit_by_stack(kernels, state, per):
    s = build_layout(G, C, Layout(dp=8, micro_batch=1, kernels=kernels))
    s = replace(s, optimizer_state=state)
    assert logits_bytes(G, s, C.num_devices).tolist() == [per * ELEMENTS] * 8
