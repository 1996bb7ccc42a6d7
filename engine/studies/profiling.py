"""FlexFlow's "measure each distinct operator once" (Jia et al. SysML'19 §5.1: operators are
predictable and few are distinct, so each (kind, partition shape) is measured once and reused).

:func:`needed_keys` lists the distinct profile keys (op kind, partition input / output /
parameter shapes, precision, device type) that a strategy, or every config a search may try,
needs; :func:`measure` times one key's forward and backward with PyTorch on the local device
(warm-up, repeats, median and spread; CUDA events on a GPU); :class:`MeasurementCache` keeps
measurements across runs in SQLite, keyed by the profile key, the local device's name and the
torch version. :func:`coverage` says which share of a simulation's compute time came from
measured entries.

A measurement is labelled with the device type it was made on and applies only to that type
(:class:`engine.costs.ProfileTable` matches the type's name): measured on this machine's CPU,
it is used only on a cluster whose device type has that name. Some attributes are not in the
key (a pooling's mode, a convolution's stride and padding, a softmax's axis): they are
recovered from the shapes where they can be (stride and padding from the output size) and
otherwise take the common case (max pooling, last axis), as the key shares them.

The engine runs without torch; only this module's measuring imports it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sqlite3
import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..cluster import Cluster
from ..costs import CostModel, ProfileTable
from ..graph import OpGraph
from ..strategy import Strategy

__all__ = ["needed_keys", "measure", "Measurement", "MeasurementCache", "coverage", "local_device_name",
           "MEASURABLE_KINDS"]

#: kinds :func:`measure` can time (the others keep the roofline: inputs take no time, views none)
MEASURABLE_KINDS = frozenset({
    "linear", "conv2d", "batch_matmul", "attention", "softmax", "layernorm", "rmsnorm", "batchnorm", "pool2d",
    "embedding", "relu", "gelu", "silu", "tanh", "sigmoid", "dropout", "add", "mul", "elementwise", "transpose",
    "concat", "softmax_cross_entropy"})

Key = tuple  # ProfileTable.key(...)


def needed_keys(graph: OpGraph, strategies: Iterable[Strategy], cluster: Cluster) -> list[Key]:
    """The distinct profile keys the strategies' op partitions need, in first-use order
    (kinds :func:`measure` cannot time are left out)."""
    seen: dict[Key, None] = {}
    for s in strategies:
        for op in graph.ops:
            if op.kind not in MEASURABLE_KINDS:
                continue
            cfg = s.configs[op.name]
            ins, outs, params = op.partition_shapes(cfg.degrees)
            prec = "fp8" if s.fp8 and op.kind == "linear" else graph.precision
            for t in sorted({cluster.devices[d].type for d in cfg.devices}):
                seen.setdefault(ProfileTable.key(op.kind, ins, outs, params, prec, t), None)
    return list(seen)


def all_config_keys(graph: OpGraph, cluster: Cluster, max_degrees: int | None = None) -> list[Key]:
    """Every key the SOAP search space may need: each op under each candidate config's degrees
    (:func:`engine.search.chains.candidate_configs`, ``max_degrees`` combinations an op: by
    default the searches' own number) on each device type."""
    from ..search.chains import CANDIDATE_COMBOS, candidate_configs

    max_degrees = CANDIDATE_COMBOS if max_degrees is None else max_degrees

    types = sorted({d.type for d in cluster.devices})
    seen: dict[Key, None] = {}
    for op in graph.ops:
        if op.kind not in MEASURABLE_KINDS:
            continue
        for degrees in {tuple(sorted(c.degrees.items())) for c in candidate_configs(op, cluster.num_devices, 1,
                                                                                   max_degrees)}:
            ins, outs, params = op.partition_shapes(dict(degrees))
            for t in types:
                seen.setdefault(ProfileTable.key(op.kind, ins, outs, params, graph.precision, t), None)
    return list(seen)


def local_device_name(device: str) -> str:
    """The name measurements on ``device`` ("cpu" or "cuda") are labelled with by default:
    the GPU's name, or the CPU's model name (``/proc/cpuinfo``) with its core count."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:  # (a fixed system path)
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"CPU {model} x{os.cpu_count()}"[:200]


@dataclass(frozen=True)
class Measurement:
    """Median forward and backward seconds of one key, and their spread (max - min over the
    repeats, seconds)."""

    fwd_s: float
    bwd_s: float
    fwd_spread_s: float
    bwd_spread_s: float
    repeats: int


_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8": "bfloat16"}


def _conv_geometry(x: Sequence[int], w: Sequence[int], y: Sequence[int]) -> tuple[list[int], list[int]]:
    """Stride and padding giving output ``y`` from input ``x`` and kernel ``w`` (NCHW)."""
    stride, pad = [], []
    for i in (2, 3):
        k, n_in, n_out = w[i], x[i], y[i]
        s = max(1, (n_in - k + 2 * (k // 2)) // max(1, n_out - 1)) if n_out > 1 else max(1, n_in)
        p = max(0, math.ceil(((n_out - 1) * s + k - n_in) / 2))
        stride.append(s)
        pad.append(p)
    return stride, pad


def _kernel(kind: str, ins, outs, params, dtype, device):
    """(forward closure, tensors whose gradients backward computes) for one key."""
    import torch
    import torch.nn.functional as F

    def t(shape, grad=True):
        return torch.randn(*shape, dtype=dtype, device=device, requires_grad=grad)

    if kind == "linear":
        x, W = t(ins[0]), t(params[0])
        b = t(params[1]) if len(params) > 1 else None
        return (lambda: F.linear(x, W, b)), [x, W]
    if kind == "conv2d":
        x, W = t(ins[0]), t(params[0])
        b = t(params[1]) if len(params) > 1 else None
        stride, pad = _conv_geometry(ins[0], params[0], outs[0])
        groups = max(1, ins[0][1] // params[0][1])
        return (lambda: F.conv2d(x, W, b, stride=stride, padding=pad, groups=groups)), [x, W]
    if kind == "batch_matmul":
        a, b2 = t(ins[0]), t(ins[1])
        trans = ins[1][-1] == ins[0][-1] and ins[1][-2] == outs[0][-1] and ins[1][-2] != ins[0][-1]
        return (lambda: torch.matmul(a, b2.transpose(-1, -2) if trans else b2)), [a, b2]
    if kind == "attention":
        q, k, v = (t(s) for s in ins[:3])
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=ins[0][-2] == ins[1][-2])), [q, k, v]
    if kind == "embedding":
        ids = torch.randint(0, params[0][0], tuple(ins[0]), device=device)
        table = t(params[0])
        return (lambda: F.embedding(ids, table)), [table]
    if kind == "softmax_cross_entropy":
        logits = t(ins[0])
        labels = torch.randint(0, ins[0][-1], tuple(ins[1]), device=device)
        return (lambda: F.cross_entropy(logits.reshape(-1, ins[0][-1]).float(), labels.reshape(-1))), [logits]
    x = t(ins[0])
    one = {
        "softmax": lambda: torch.softmax(x, dim=-1),
        "layernorm": lambda: F.layer_norm(x, x.shape[-1:]),
        "rmsnorm": lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
        "batchnorm": lambda: F.batch_norm(x, None, None, training=True),
        "pool2d": lambda: F.adaptive_max_pool2d(x, tuple(outs[0][2:])),
        "relu": lambda: torch.relu(x), "gelu": lambda: F.gelu(x), "silu": lambda: F.silu(x),
        "tanh": lambda: torch.tanh(x), "sigmoid": lambda: torch.sigmoid(x),
        "dropout": lambda: F.dropout(x, 0.1, training=True), "elementwise": lambda: x * 1.5,
        "transpose": lambda: x.transpose(-1, -2).contiguous(),
    }
    if kind in one:
        return one[kind], [x]
    if kind in ("add", "mul", "concat"):
        others = [t(s) for s in ins[1:]]
        if kind == "concat":
            axis = next((i for i in range(len(outs[0])) if outs[0][i] != ins[0][i]), 0)
            return (lambda: torch.cat([x, *others], dim=axis)), [x, *others]
        return ((lambda: x + others[0]) if kind == "add" else (lambda: x * others[0])), [x, *others]
    raise ValueError(f"cannot measure {kind!r}")


def measure(key: Key, device: str = "cpu", repeats: int = 10, warmup: int = 3,
            max_seconds: float = 5.0) -> Measurement:
    """Time one key's forward and backward on the local ``device`` (repeats after a warm-up;
    medians; fewer repeats when one run is slow, so that a key takes about ``max_seconds``).

    The backward time is that of ``torch.autograd.grad`` of the output with respect to the
    inputs and parameters (one pass, as the simulator's backward task)."""
    import torch

    kind, ins, outs, params, precision, _ = key
    dtype = getattr(torch, _TORCH_DTYPES[precision])
    if device == "cpu" and dtype is torch.float16:
        dtype = torch.float32  # (CPU half-precision GEMMs are emulated: slower than fp32, not representative)
    dev = torch.device(device)
    fwd, grads = _kernel(kind, ins, outs, params, dtype, dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def once() -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
        y = fwd()
        sync()
        t1 = time.perf_counter()
        g = torch.ones_like(y)
        torch.autograd.grad(y, grads, g, allow_unused=True)
        sync()
        return t1 - t0, time.perf_counter() - t1

    start = time.perf_counter()
    for _ in range(warmup):
        once()
        if time.perf_counter() - start > max_seconds / 2:
            break
    f_times, b_times = [], []
    for _ in range(repeats):
        f, b = once()
        f_times.append(f)
        b_times.append(b)
        if time.perf_counter() - start > max_seconds and len(f_times) >= 3:
            break
    return Measurement(statistics.median(f_times), statistics.median(b_times), max(f_times) - min(f_times),
                       max(b_times) - min(b_times), len(f_times))


class MeasurementCache:
    """Measurements kept across runs (SQLite), keyed by the profile key, the local device's
    name and the torch version: a key measured once is not measured again."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.db = sqlite3.connect(path)
            self.db.execute("CREATE TABLE IF NOT EXISTS measurements (key TEXT PRIMARY KEY, fwd_s REAL, "
                            "bwd_s REAL, fwd_spread_s REAL, bwd_spread_s REAL, repeats INTEGER, measured_at REAL)")
            cols = {r[1] for r in self.db.execute("PRAGMA table_info(measurements)")}
        except sqlite3.Error as e:  # (not an SQLite file, a folder, one that cannot be written)
            raise ValueError(f"--cache {path}: not a measurement cache soapbox can use ({e}); give a new file "
                             "name or the default") from None
        if not {"key", "fwd_s", "bwd_s", "fwd_spread_s", "bwd_spread_s", "repeats"} <= cols:
            self.db.close()
            raise ValueError(f"--cache {path}: an SQLite file with another 'measurements' table (columns "
                             f"{', '.join(sorted(cols))[:120]}); give a new file name or the default")

    @staticmethod
    def _text(key: Key, device_name: str, torch_version: str) -> str:
        return json.dumps([key[0], key[1], key[2], key[3], key[4], device_name, torch_version])

    def get(self, key: Key, device_name: str, torch_version: str) -> Measurement | None:
        row = self.db.execute("SELECT fwd_s, bwd_s, fwd_spread_s, bwd_spread_s, repeats FROM measurements "
                              "WHERE key = ?", (self._text(key, device_name, torch_version),)).fetchone()
        return Measurement(*row) if row else None

    def put(self, key: Key, device_name: str, torch_version: str, m: Measurement) -> None:
        self.db.execute("INSERT OR REPLACE INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (self._text(key, device_name, torch_version), m.fwd_s, m.bwd_s, m.fwd_spread_s,
                         m.bwd_spread_s, m.repeats, time.time()))
        self.db.commit()

    def close(self) -> None:
        self.db.close()


def coverage(graph: OpGraph, strategy: Strategy, cluster: Cluster, cost: CostModel) -> dict[str, Any]:
    """Which share of the strategy's compute (forward + backward time of every op partition,
    per microbatch) comes from measured profile entries rather than the roofline."""
    measured = total = 0.0
    hits = parts = 0
    for op in graph.ops:
        if op.kind == "input":
            continue
        cfg = strategy.configs[op.name]
        ins, outs, params = op.partition_shapes(cfg.degrees)
        prec = "fp8" if strategy.fp8 and op.kind == "linear" else graph.precision
        for d in cfg.devices:
            dt = cluster.device_type(d)
            f, b = cost.partition_times_s(op, cfg.degrees, graph.precision, dt, strategy.fp8)
            total += f + b
            parts += 1
            if cost.profile is not None and \
                    cost.profile.get(ProfileTable.key(op.kind, ins, outs, params, prec, dt.name)) is not None:
                measured += f + b
                hits += 1
    return {"measured_share_of_compute": measured / total if total > 0 else 0.0, "measured_partitions": hits,
            "partitions": parts}
