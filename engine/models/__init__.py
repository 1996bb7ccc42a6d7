"""The sample model library: builders for every model in ``sample_models/``.

Each sample is a builder call with the paper's sizes; ``sample_models/<name>.json`` holds
its output, written by ``soapbox models --write sample_models`` and checked against the
builders by the tests (so a file and its builder never drift apart).
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any, Callable

from ..graph import OpGraph
from ..graph.core import PRECISIONS

__all__ = ["SAMPLE_MODELS", "MAX_SAMPLE_BATCH", "MAX_SAMPLE_SEQ", "sample_names", "sample_sizes", "build_sample",
           "sample_dir"]

#: name -> (module, function, one-line description). Sizes are each builder's defaults.
SAMPLE_MODELS: dict[str, tuple[str, str, str]] = {
    "alexnet": ("cnn", "alexnet", "AlexNet (torchvision variant), batch 256, 224x224 (FlexFlow)"),
    "inception_v3": ("cnn", "inception_v3", "Inception-v3, batch 64, 299x299 (FlexFlow)"),
    "resnet101": ("cnn", "resnet101", "ResNet-101, batch 64, 224x224 (FlexFlow)"),
    "rnntc": ("rnn", "rnntc", "RNN text classification: 4 LSTM layers, 40 steps, batch 64 (FlexFlow)"),
    "rnnlm": ("rnn", "rnnlm", "RNN language model: 2 LSTM layers, 40 steps, vocab 10k, batch 64 (FlexFlow)"),
    "nmt": ("rnn", "nmt", "NMT: 2+2 LSTM layers, hidden 1024, attention, vocab 32k, 40 steps, batch 64 (FlexFlow)"),
    "transformer": ("transformer", "pase_transformer",
                    "Transformer 6+6 layers, d_model 1024, seq 256, vocab 50k, batch 64 (PaSE)"),
    "gpt2": ("transformer", "gpt2", "GPT-2 124M, seq 1024, batch 8"),
    "gpt3-175b": ("transformer", "gpt3_175b", "GPT-3 175B, seq 2048, batch 1536 (Megatron SC'21)"),
    "bert-large": ("transformer", "bert_large", "BERT-large 336M with MLM head, seq 512, batch 32"),
    "llama2-7b": ("transformer", "llama2_7b", "LLaMA-2 7B (SwiGLU, RMSNorm), seq 4096, batch 1024"),
    "mixtral-8x7b": ("moe", "mixtral_8x7b", "Mixtral 8x7B MoE 46.7B (8 experts, top-2), seq 4096, batch 256"),
    "deepseek-v3": ("moe", "deepseek_v3", "DeepSeek-V3 MoE 671B (MLA, 256+1 experts, top-8), seq 4096, batch 8192"),
    "qwen3-30b-a3b": ("moe", "qwen3_30b_a3b", "Qwen3-30B-A3B MoE (128 experts, top-8), seq 4096, batch 512"),
    "qwen3-235b-a22b": ("moe", "qwen3_235b_a22b", "Qwen3-235B-A22B MoE (128 experts, top-8), seq 4096, batch 2048"),
    "gpt-oss-120b": ("moe", "gpt_oss_120b", "GPT-OSS-120B MoE 117B (128 experts, top-4), seq 4096, batch 512"),
}


#: Largest global batch a sample model is built with (FlexFlow's weak scaling: 64 per GPU,
#: so 65,536 covers 1,024 GPUs; an LLM's 1,536-4,096 sequences fit easily).
MAX_SAMPLE_BATCH = 1 << 20
#: Longest sequence a sample language model is built with, in tokens (1 M: past any published
#: context length; attention's FLOPs grow with its square)
MAX_SAMPLE_SEQ = 1 << 20


def sample_names() -> list[str]:
    return list(SAMPLE_MODELS)


def builder(name: str) -> Callable[[], OpGraph]:
    """The builder function of sample ``name`` (``KeyError`` if unknown)."""
    module, func, _ = SAMPLE_MODELS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), func)


def sample_sizes(name: str) -> dict[str, Any]:
    """The sizes sample ``name``'s builder takes besides its batch, with their defaults
    (``{"seq_len": 1024, "precision": "fp32"}`` for GPT-2; ``{"precision": "fp32"}`` for a CNN)."""
    params = inspect.signature(builder(name)).parameters
    return {k: params[k].default for k in ("seq_len", "precision") if k in params}


def build_sample(name: str, batch: int | None = None, *, seq_len: int | None = None,
                 precision: str | None = None) -> OpGraph:
    """Build sample ``name`` with its builder's default sizes (``batch``: its global batch,
    in samples, ``seq_len``: a language model's sequence length in tokens, ``precision``: the
    training precision, instead of the defaults). ValueError names a size out of range or one
    the model does not have."""
    if name not in SAMPLE_MODELS:
        raise ValueError(f"unknown sample model {name!r}; samples: {', '.join(SAMPLE_MODELS)}")
    kw: dict[str, Any] = {}
    if batch is not None:
        if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= MAX_SAMPLE_BATCH:
            raise ValueError(f"batch must be a whole number of samples from 1 to {MAX_SAMPLE_BATCH:,}, got {batch!r}")
        kw["batch"] = batch
    sizes = sample_sizes(name)
    if seq_len is not None:
        if "seq_len" not in sizes:
            raise ValueError(f"{name} has no sequence length to set (it is not a language model)")
        if not isinstance(seq_len, int) or isinstance(seq_len, bool) or not 1 <= seq_len <= MAX_SAMPLE_SEQ:
            raise ValueError(f"sequence length must be a whole number of tokens from 1 to {MAX_SAMPLE_SEQ:,}, "
                             f"got {seq_len!r}")
        kw["seq_len"] = seq_len
    if precision is not None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {str(precision)[:20]!r}")
        kw["precision"] = precision
    return builder(name)(**kw)


def sample_dir() -> Path:
    """The ``sample_models/`` folder beside the package (present in a source checkout)."""
    return Path(__file__).resolve().parents[2] / "sample_models"
