"""soapbox's model importers on real architectures (issue 27), in process: ONNX and ``--torch``.

Models (seeded, every parameter drawn at random as the tests do: the exporters' optimizers drop a
zero bias or a unit gain, and the parameter with it):

* ResNet-50: torchvision's architecture written in plain torch (the classes of
  ``tests/models/test_import_onnx_exact.py`` at torchvision's widths, 64 and 1,000 classes, for ONNX;
  those of ``tests/models/test_import_torch_exact.py``, in-place ReLUs and ``out += identity``, for
  ``--torch``), input 2 x 3 x 224 x 224;
* LLaMA with grouped-query attention (transformers' ``LlamaForCausalLM``: 4 layers, hidden 512,
  8 query heads and 2 key/value heads, MLP 1,376, vocabulary 32,000), input ids 2 x 128;
* BERT-base (``BertForMaskedLM`` with BERT-base's shape: 12 layers, hidden 768, 12 heads, MLP
  3,072, vocabulary 30,522; ``--bert-layers`` for fewer), input ids 2 x 128.

The transformers models use eager attention (two matmuls that ``FlopCounterMode`` counts).

1. ONNX: each model exported once with each of torch's exporters (TorchScript, ``dynamo=False``;
   dynamo, ``dynamo=True``, weights inside the file) by ``tests/models/test_import_onnx_exact.py``'s own
   ``export`` (its ``find_packed_sequence_indices`` patch included; ResNet in training mode, so
   that TorchScript keeps BatchNorm apart from the convolutions); the export is not timed. Then
   ``import_onnx(bytes)`` is timed ``--runs`` times, interleaved run by run with the baseline
   ("before": ONNX's shape inference on the whole model, weights included, as soapbox ran it
   before ``engine.models.onnx_shapes.infer_shapes_light`` set the large initializers' values
   aside), and the ratio of the medians.
2. ``--torch``: ``import_torch(factory)`` (what ``soapbox import --torch module:factory`` calls:
   the factory run on the meta device, ``torch.export``, the mapping and its own FlopCounterMode
   cross-check) timed ``--runs`` times.

Each row: wall time (median of the runs, and the runs), the peak resident memory the import adds
(Linux: the peak is reset through ``/proc/self/clear_refs`` before each run; the largest of the
runs), soapbox's parameter count against ``sum(p.numel() for p in model.parameters())`` (a shared
tensor once) with the difference the tests document, and soapbox's forward GEMM FLOPs (``linear``,
``batch_matmul``, ``conv2d``, and ``attention`` for ``--torch``) against
``torch.utils.flop_counter.FlopCounterMode``'s count of one forward pass on CPU. A row that fails
prints its error and the run goes on.

Usage: python benchmarks/bench_imports.py [--runs 3] [--only onnx|torch]
                                          [--models resnet50,llama-gqa,bert-base] [--bert-layers 12]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from functools import partial
from unittest import mock
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

import pytest  # noqa: E402  (the test modules' monkeypatch)
import torch  # noqa: E402
from torch import nn  # noqa: E402

import test_import_onnx_exact as OX  # noqa: E402
import test_import_torch_exact as TX  # noqa: E402
import engine.models.onnx_import as OI  # noqa: E402
from engine.models.onnx_import import import_onnx  # noqa: E402
from engine.models.torch_import import import_torch  # noqa: E402

MODELS = ("resnet50", "llama-gqa", "bert-base")
BATCH, SEQ, IMAGE = 2, 128, 224


# -- models -----------------------------------------------------------------------------------
def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(num_hidden_layers=4, hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
                      intermediate_size=1376, vocab_size=32000, max_position_embeddings=1024, use_cache=False)
    return LlamaForCausalLM(cfg)


def _bert(layers: int):
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(num_hidden_layers=layers, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                     vocab_size=30522, max_position_embeddings=512)
    return BertForMaskedLM(cfg)


def hf(make) -> nn.Module:
    m = make()
    m.set_attn_implementation("eager")
    return m


def onnx_model(name: str, bert_layers: int) -> tuple[nn.Module, torch.Tensor]:
    """(the model exported to ONNX, its input): the tests' classes and wrappers."""
    torch.manual_seed(0)
    if name == "resnet50":
        m = OX.ResNet(OX.Bottleneck, [3, 4, 6, 3], width=64, classes=1000)
        return OX.randomized(m).eval(), torch.randn(BATCH, 3, IMAGE, IMAGE)
    m = hf(_llama) if name == "llama-gqa" else hf(lambda: _bert(bert_layers))
    return OX.Logits(OX.randomized(m).eval()), torch.randint(0, m.config.vocab_size, (BATCH, SEQ))


def torch_factory(name: str, bert_layers: int):
    """The ``--torch`` factory: (module, example input), as a user's ``module:factory`` returns it."""
    if name == "resnet50":
        return lambda: (TX.ResNet(TX.Bottleneck, [3, 4, 6, 3]), torch.randn(BATCH, 3, IMAGE, IMAGE))
    make = _llama if name == "llama-gqa" else (lambda: _bert(bert_layers))
    return lambda: (hf(make), torch.zeros(BATCH, SEQ, dtype=torch.long))


def documented(name: str, dynamo: bool | None, model: nn.Module) -> list[tuple[int, str]]:
    """The differences (torch's count minus soapbox's, why) that the tests document, each one
    that may apply. ``dynamo`` None: ``--torch``."""
    named = dict(model.named_parameters())
    less, why = 0, []
    if name == "resnet50" and dynamo:
        less += sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.BatchNorm2d))
        why.append("BatchNorm folded into convs")
    if name != "bert-base" or not dynamo:  # (BERT's decoder bias is a bias op: counted since issue 27)
        return [(less, ", ".join(why) or "equal")]
    # (the tests' tables are folded into constants; the exporter folds small ones only)
    tables = sum(p.numel() for n, p in named.items() if "position" in n or "token_type" in n)
    options = [(tables, "constant-id tables folded"), (0, "constant-id tables kept, not folded")]
    return options


# -- measuring --------------------------------------------------------------------------------
def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # (Linux >= 4.0: VmHWM back to the current RSS)
        return True
    except OSError:
        return False


def timed(fn, runs: int):
    """(last result, [seconds], largest peak RSS increase in MB or None)."""
    times, peak, out = [], None, None
    for _ in range(runs):
        out = None
        gc.collect()
        ok = _reset_peak()
        base = _status_kb("VmRSS")
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
        hwm = _status_kb("VmHWM")
        if ok and base is not None and hwm is not None:
            peak = max(peak or 0.0, (hwm - base) / 1024)
    return out, times, peak


def plain_inference(model, **options):
    """The baseline: ONNX's shape inference on the whole model, weights included (soapbox before
    ``engine.models.onnx_shapes.infer_shapes_light``)."""
    from onnx import shape_inference

    return shape_inference.infer_shapes(model, **options)


def import_before(data: bytes):
    with mock.patch.object(OI, "infer_shapes_light", plain_inference):
        return import_onnx(data)


def timed_pair(now, before, runs: int):
    """``timed`` of ``now`` and of ``before``, interleaved run by run (the same load on both)."""
    out, a, b, pa, pb = None, [], [], None, None
    for _ in range(runs):
        out, t, p = timed(now, 1)
        a += t
        pa = max(pa or 0.0, p or 0.0) if p is not None else pa
        _, t, p = timed(before, 1)
        b += t
        pb = max(pb or 0.0, p or 0.0) if p is not None else pb
    return out, a, pa, b, pb


def gemm(g, kinds=OX.GEMM_KINDS) -> float:
    return sum(op.fwd_flops for op in g.ops if op.kind in kinds)


def _err(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return f"**fails**: {type(e).__name__}: {first}".replace("|", "\\|")


def _wall(times: list[float]) -> tuple[str, str]:
    return f"{statistics.median(times):.2f} s", ", ".join(f"{t:.2f}" for t in times)


def _mb(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f} MB"


def _params(mine: int, theirs: int, options: list[tuple[int, str]]) -> str:
    d = mine - theirs
    if d == 0:
        return "equal"
    why = next((w for less, w in options if d == -less), None)
    if why is not None:
        return f"{d:+,} ({why}: documented)"
    return f"{d:+,} (**not documented**; documented: {' or '.join(f'{-less:+,}' for less, _ in options)})"


def _flops(mine: float, theirs: float) -> str:
    return f"{mine / 1e9:,.2f} / {theirs / 1e9:,.2f}" + (" (equal)" if mine == theirs else " (**differ**)")


def export_bytes(model: nn.Module, x, dynamo: bool, training: bool) -> bytes:
    """(the exporters' progress lines and warnings kept out of the table)"""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp, \
                contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return OX.export(model, x, dynamo, Path(d), mp, training=training)
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


# -- the two parts ----------------------------------------------------------------------------
def bench_onnx(models, runs: int, bert_layers: int) -> None:
    print(f"\nONNX import, `import_onnx(bytes)`, median of {runs} (export not timed)\n")
    print("| model | exporter | file | export | import wall | runs (s) | peak RSS added | before: wall, runs, peak "
          "| ratio | ops | parameters soapbox | torch | soapbox - torch | GEMM GFLOPs soapbox / FlopCounterMode |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in models:
        label = name if name != "bert-base" or bert_layers == 12 else f"bert-base ({bert_layers} layers)"
        try:
            model, x = onnx_model(name, bert_layers)
            params, flops = OX.torch_counts(model, x)
        except Exception as e:  # noqa: BLE001 - one row each, the run goes on
            print(f"| {label} | both | | | {_err(e)} | | | | | | | |", flush=True)
            continue
        for dynamo in (False, True):
            exporter = "dynamo" if dynamo else "TorchScript"
            try:
                t = time.perf_counter()
                data = export_bytes(model, x, dynamo, training=name == "resnet50")
                exp = time.perf_counter() - t
            except Exception as e:  # noqa: BLE001
                print(f"| {label} | {exporter} | | | {_err(e)} | | | | | {params:,} | | |", flush=True)
                continue
            head = f"| {label} | {exporter} | {len(data) / 1e6:,.0f} MB | {exp:.0f} s"
            try:
                (g, _notes), times, peak, old, old_peak = timed_pair(partial(import_onnx, data),
                                                                     partial(import_before, data), runs)
            except Exception as e:  # noqa: BLE001
                print(f"{head} | {_err(e)} | | | | | {params:,} | | |", flush=True)
                continue
            med, each = _wall(times)
            old_med, old_each = _wall(old)
            ratio = statistics.median(old) / statistics.median(times)
            options = documented(name, dynamo, model)
            print(f"{head} | {med} | {each} | {_mb(peak)} | {old_med}, {old_each}, {_mb(old_peak)} | {ratio:.2f}x "
                  f"| {len(g.ops):,} | {g.param_count:,} | {params:,} "
                  f"| {_params(g.param_count, params, options)} | {_flops(gemm(g), flops)} |", flush=True)
            del g, data
        del model
        gc.collect()


def bench_torch(models, runs: int, bert_layers: int) -> None:
    print(f"\n`--torch` import, `import_torch(factory)`, median of {runs}\n")
    print("| model | import wall | runs (s) | peak RSS added | ops | parameters soapbox | torch "
          "| soapbox - torch | GEMM GFLOPs soapbox / FlopCounterMode |")
    print("|---|---|---|---|---|---|---|---|---|")
    kinds = OX.GEMM_KINDS + ("attention",)
    for name in models:
        label = name if name != "bert-base" or bert_layers == 12 else f"bert-base ({bert_layers} layers)"
        factory = torch_factory(name, bert_layers)
        try:
            torch.manual_seed(0)
            model, x = factory()  # (on CPU: torch's own counts)
            params, flops = OX.torch_counts(model.eval(), x)
            options = documented(name, None, model)
            del model
        except Exception as e:  # noqa: BLE001
            print(f"| {label} | {_err(e)} | | | | | | | |", flush=True)
            continue
        try:
            (g, _notes), times, peak = timed(partial(import_torch, factory, source=f"bench_imports:{name}"), runs)
        except Exception as e:  # noqa: BLE001
            print(f"| {label} | {_err(e)} | | | | | {params:,} | | |", flush=True)
            continue
        med, each = _wall(times)
        print(f"| {label} | {med} | {each} | {_mb(peak)} | {len(g.ops):,} | {g.param_count:,} | {params:,} "
              f"| {_params(g.param_count, params, options)} | {_flops(gemm(g, kinds), flops)} |", flush=True)
        del g
        gc.collect()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", choices=["onnx", "torch"])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--bert-layers", type=int, default=12, help="BERT-base's 12, or fewer to save time")
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        ap.error(f"unknown model(s) {', '.join(bad)}; choose from {', '.join(MODELS)}")
    import transformers
    print(f"# {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
          f"torch threads {torch.get_num_threads()}")
    t0 = time.perf_counter()
    if args.only != "torch":
        bench_onnx(models, args.runs, args.bert_layers)
    if args.only != "onnx":
        bench_torch(models, args.runs, args.bert_layers)
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
