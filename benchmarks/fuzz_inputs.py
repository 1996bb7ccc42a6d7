"""Fuzz soapbox's loaders with mutated real files: every case must end in a ValidationError
(or the CLI's one-line error), or in a finite, valid result. Prints the outcome counts.

Seeds: sample model files (``sample_models/``), preset clusters as ``soapbox cluster`` writes
them, baseline strategies (data parallel, expert, model parallel, Megatron with a pipeline,
FSDP) and a measured profile table. Each case applies 1 to 3 structural mutations (most
often one) to one
seed (a field deleted, replaced by a hostile value: a wrong type, 0, -1, 5.0, 2**63, 10**30,
1e308, 5e-324, NaN, a string of 100,000 characters, a lone surrogate, deep nesting; a
number nudged; a list item repeated or dropped), then, for some cases, a byte-level one
(truncated, bytes flipped or inserted, nesting prefixed, random bytes), and loads it as a
file or, like the app, as a mapping already in memory (which may also hold values JSON
cannot: tuples, sets, cycles, non-string keys). A loaded model is simulated data-parallel
on 2 GPUs, a cluster runs a small model, a strategy runs on its model and cluster, a profile
times a model's ops; the result must have a finite makespan > 0 and print as strict JSON.
Some cases also run ``soapbox validate`` on the file.

Every case runs in a worker process with a per-case timeout (a hang is counted as a hang and
the worker replaced) and a memory limit (reading without bound shows as MemoryError).

Usage: python benchmarks/fuzz_inputs.py [--cases 10000] [--seed 0] [--workers 2]
                                        [--timeout-s 20] [--memory-gb 6] [--show 5]

``tests/formats/test_fuzz_inputs.py`` drives the same mutations from hypothesis.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import random
import select
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from functools import lru_cache
from typing import Any, Callable, Protocol, Sequence

from engine.cli import main as cli_main
from engine.cluster import preset
from engine.costs import CostModel, ProfileTable
from engine.errors import SoapboxError, ValidationError
from engine.formats import load_cluster, load_model, load_profile, load_strategy, read_json
from engine.graph import GraphBuilder
from engine.models import sample_dir
from engine.models.transformer import GPTConfig, gpt
from engine.sim.report import format_summary, json_text, simulate_strategy
from engine.search.baselines import data_parallel, make_baseline

KINDS = ("model", "cluster", "strategy", "profile")
#: Sample models mutated (the small and medium ones: a case must stay cheap to simulate).
SEED_MODELS = ("alexnet", "inception_v3", "rnntc", "transformer", "gpt2")
SEED_CLUSTERS = ("p100-4x4", "k80-16x4", "dgx-a100-80gb:2", "dgx-h100:1", "v100-dgx2:1", "hetero-demo")
TWO_GPUS = {"format": "soapbox.cluster/1", "name": "two", "nodes": [{"name": "n", "gpus": 2,
                                                                     "device_type": "A100-SXM4-80GB"}]}


class Chooser(Protocol):
    """Where a mutation's random choices come from: ``random.Random`` for the benchmark,
    hypothesis's ``data.draw`` in the test (which then shrinks a failing case)."""

    def randint(self, lo: int, hi: int) -> int: ...

    def random(self) -> float: ...

    def choice(self, seq: Sequence[Any]) -> Any: ...


# --------------------------------------------------------------------------- seeds


@lru_cache(maxsize=None)
def tiny_gpt():
    """A 2-layer GPT (60 ops) for strategies with a pipeline and for profiles."""
    return gpt(GPTConfig(layers=2, hidden=64, heads=4, seq_len=16, vocab=100, batch=8))


def tiny_llama():
    """LLaMA's shape in small (RMSNorm, SwiGLU, grouped-query fused attention, bf16)."""
    return gpt(GPTConfig(layers=2, hidden=64, heads=4, seq_len=16, vocab=100, batch=8, kv_heads=2, swiglu=True,
                         norm="rmsnorm", positions="rotary", bias=False, tie_embeddings=False, dropout=0.0,
                         flash_attention=True, precision="bf16", name="tiny-llama"))


def op_zoo():
    """The kinds no seed above holds, with every optional attribute set once."""
    b = GraphBuilder("zoo")
    x = b.input("x", [8, 4, 6, 6])
    c = b.add("conv2d", "conv", [x], out_channels=8, kernel=[3, 1], stride=[1, 2], padding=[1, 0], groups=2,
              bias=False)
    n = b.add("batchnorm", "bn", [c])
    p = b.add("pool2d", "pool", [n], mode="avg", kernel=2, stride=1, padding=0)
    g = b.add("pool2d", "gpool", [p], mode="max", **{"global": True})
    f = b.add("reshape", "flat", [g], shape=[8, -1])
    s = b.add("sigmoid", "sig", [f])
    t = b.add("tanh", "tanh", [f])
    halves = b.add("split", "split", [b.add("mul", "gate", [s, t])], axis=1, sizes=[4, 4])
    cat = b.add("concat", "cat", halves, axis=1)
    q = b.add("reshape", "heads", [cat], shape=[8, 2, 4, 1], axes=["sample", "head", "length", "dim"])
    k = b.add("transpose", "kt", [q], perm=[0, 1, 2, 3])
    a = b.add("batch_matmul", "scores", [q, k], transpose_b=True)
    b.add("softmax", "probs", [a], axis=-1)
    return b.build()


@lru_cache(maxsize=None)
def seeds(small: bool = False) -> dict[str, list[tuple[str, Any, Any]]]:
    """kind -> [(label, data, context)]: context is what a loaded file is run against
    (a strategy's (graph, cluster); a profile's (graph, cluster))."""
    models = ("alexnet",) if small else SEED_MODELS
    out: dict[str, list[tuple[str, Any, Any]]] = {k: [] for k in KINDS}
    for name in models:
        out["model"].append((name, read_json(sample_dir() / f"{name}.json"), None))
    out["model"].append(("tiny-gpt", tiny_gpt().to_dict(), None))
    out["model"].append(("op zoo", op_zoo().to_dict(), None))
    if not small:
        out["model"].append(("tiny-llama", tiny_llama().to_dict(), None))
    for name in (SEED_CLUSTERS[:3] if small else SEED_CLUSTERS):
        out["cluster"].append((name, preset(name).to_dict(), None))
    alex, p100 = load_model(sample_dir() / "alexnet.json"), preset("p100-4x4")
    g, a100 = tiny_gpt(), preset("dgx-a100-80gb:1")
    plans = [("alexnet dp", alex, p100, "data-parallel", {}), ("alexnet expert", alex, p100, "expert", {}),
             ("gpt megatron pp2", g, a100, "megatron", {"tp": 2, "pp": 2, "micro_batch": 2}),
             ("gpt fsdp", g, a100, "fsdp", {"zero_stage": 3})]
    if not small:
        plans.append(("alexnet model-parallel", alex, p100, "model-parallel", {}))
    for label, graph, cluster, kind, opts in plans:
        out["strategy"].append((label, make_baseline(kind, graph, cluster, **opts).to_dict(), (graph, cluster)))
    two = load_cluster(TWO_GPUS)
    s = data_parallel(g, two)
    table = ProfileTable()
    for op in g.ops[:12]:
        ins, outs, params = op.partition_shapes(s.configs[op.name].degrees)
        table.add(op.kind, ins, outs, params, g.precision, two.device_type(0).name, 1.5e-5, 3e-5)
    out["profile"].append(("tiny-gpt profile", table.to_dict(), (g, two)))
    return out


# --------------------------------------------------------------------------- mutations

_LONG = "a" * 100_000


def _deep(depth: int, leaf: Any = 1, as_dict: bool = False) -> Any:
    v = leaf
    for _ in range(depth):
        v = {"a": v} if as_dict else [v]
    return v


def nasty_value(ch: Chooser) -> Any:
    """A value a hostile or careless file might hold where another was expected."""
    k = ch.randint(0, 37)
    table: list[Callable[[], Any]] = [
        lambda: None, lambda: True, lambda: False, lambda: 0, lambda: -1, lambda: 1, lambda: 2, lambda: 3,
        lambda: 5.0, lambda: 0.5, lambda: -0.0, lambda: 2**31, lambda: 2**31 - 1, lambda: 2**53 + 1,
        lambda: 2**63, lambda: 2**64 + 7, lambda: 10**30, lambda: -10**30, lambda: int("9" * 400),
        lambda: 1e308, lambda: -1e308, lambda: 5e-324, lambda: 1e-300, lambda: float("nan"),
        lambda: float("inf"), lambda: "", lambda: "x", lambda: _LONG, lambda: "\ud800",
        lambda: "\x1b[31mred\n- forged line", lambda: "1.5", lambda: [], lambda: {}, lambda: [1, 2, 3],
        lambda: {"a": 1}, lambda: _deep(ch.choice([10, 70, 500, 2000]), as_dict=ch.random() < 0.5),
        lambda: [0] * ch.choice([1000, 100_000]), lambda: "é\u2028\U0001F600",
    ]
    return table[k]()


def _nudge(v: Any, ch: Chooser) -> Any:
    """A number changed the way a careless edit does."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    ops: list[Callable[[Any], Any]] = [lambda x: x * 2, lambda x: x + 1, lambda x: -x, lambda x: 0,
                                       lambda x: x * 10**6, lambda x: float(x), lambda x: x + 0.5,
                                       lambda x: x // 3 if isinstance(x, int) else x / 3, lambda x: x * 1e300]
    try:
        return ch.choice(ops)(v)
    except OverflowError:
        return v


def _pick(data: Any, ch: Chooser, stop: float = 0.15) -> list[Any]:
    """A path to a random node: descend, stopping with probability ``stop`` at each level
    below the top (0: down to a leaf)."""
    path: list[Any] = []
    node = data
    while isinstance(node, (dict, list)) and node and (not path or ch.random() >= stop):
        if isinstance(node, dict):
            # mostly into containers: the fields that matter (ops, nodes, entries) sit below
            inner = [k for k, v in node.items() if isinstance(v, (dict, list)) and v]
            key = ch.choice(inner if inner and ch.random() < 0.85 else list(node))
        else:
            key = ch.randint(0, len(node) - 1)
        path.append(key)
        node = node[key]
    return path


def _get(data: Any, path: list[Any]) -> Any:
    for k in path:
        data = data[k]
    return data


def _with(data: Any, path: list[Any], fn: Callable[[Any], Any]) -> Any:
    """``data`` with the node at ``path`` replaced by ``fn(node)``; containers on the path are
    copied (the seed is never changed). ``fn`` returning ``_DELETE`` removes the node."""
    nodes = [data]
    for key in path:
        nodes.append(nodes[-1][key])
    new = fn(nodes[-1])
    for parent, key in zip(reversed(nodes[:-1]), reversed(path)):  # rebuild upwards (any depth)
        copy = dict(parent) if isinstance(parent, dict) else list(parent)
        if new is _DELETE:
            del copy[key]
        else:
            copy[key] = new
        new = copy
    return new


_DELETE = object()


def mutate(data: Any, ch: Chooser) -> Any:
    """One structural mutation of a JSON tree (numbers deep in the tree most often: they are
    what a careless or hostile edit changes and what the simulator computes with)."""
    k = ch.randint(0, 99)
    inputs = [i for i, op in enumerate(data.get("ops", [])) if isinstance(op, dict) and op.get("kind") == "input"
              and isinstance(op.get("attrs"), dict) and isinstance(op["attrs"].get("shape"), list) and op["attrs"]["shape"]] \
        if isinstance(data, dict) and isinstance(data.get("ops"), list) else []
    if k < 12 and inputs:  # a model's inputs grown or shrunk by a power of two: valid, extreme sizes
        scale = 2 ** (ch.randint(-4, 6) if ch.random() < 0.7 else ch.randint(7, 40))
        grow = lambda v: max(1, int(v * scale)) if isinstance(v, int) and not isinstance(v, bool) else v  # noqa: E731
        if ch.random() < 0.6:  # the batch of every input alike (the model stays consistent)
            for i in inputs:
                data = _with(data, ["ops", i, "attrs", "shape", 0], grow)
            return data
        i = ch.choice(inputs)
        return _with(data, ["ops", i, "attrs", "shape", ch.randint(0, len(data["ops"][i]["attrs"]["shape"]) - 1)],
                     grow)
    if k < 35:  # a leaf: nudge a number, else a hostile value
        path = _pick(data, ch, stop=0.0)
        return _with(data, path, lambda v: _nudge(v, ch) if isinstance(v, (int, float)) and not isinstance(v, bool)
                     else nasty_value(ch))
    path = _pick(data, ch)
    node = _get(data, path)
    if k < 55:  # replace with a hostile value
        return _with(data, path, lambda _: nasty_value(ch))
    if k < 65 and path:  # delete
        return _with(data, path, lambda _: _DELETE)
    if k < 73 and isinstance(node, dict):  # add a field
        return _with(data, path, lambda d: {**d, ch.choice(["extra", "name", "repeat", "kind", "degrees", "x" * 300]):
                                            nasty_value(ch)})
    if k < 80:  # nest it deeper
        return _with(data, path, lambda v: _deep(ch.choice([1, 2, 3, 64, 1000]), v))
    if k < 88:  # a string leaf
        path = _pick(data, ch, stop=0.0)
        return _with(data, path, lambda v: ch.choice([v + "\ud800", "", v * 50, v + "\x00", v.upper(), v + ":1",
                                                      v[: len(v) // 2]]) if isinstance(v, str) else v)
    if k < 95 and isinstance(node, list) and node:  # repeat or drop items
        i = ch.randint(0, len(node) - 1)
        return _with(data, path, lambda lst: ch.choice([lst + [lst[i]], lst[:i] + lst[i + 1:], lst[::-1],
                                                        lst * 2 if len(lst) < 5000 else lst]))
    if isinstance(node, dict) and node:  # rename a key
        old = ch.choice(list(node))
        return _with(data, path, lambda d: {(k2 + "_" if k2 == old else k2): v for k2, v in d.items()})
    return _with(data, path, lambda _: nasty_value(ch))


def python_only(data: Any, ch: Chooser) -> Any:
    """A value JSON cannot hold, as a request handler or a caller might pass in memory."""
    path = _pick(data, ch)
    cyc: list[Any] = []
    cyc.append(cyc)
    value = ch.choice([(1, 2), {1, 2}, b"bytes", {1: "int key"}, {(1, 2): "tuple key"}, cyc, object(),
                       float("nan"), {"\ud800": 1}, range(3), 10**5000])
    return _with(data, path, lambda _: value)


def encode(data: Any, ch: Chooser) -> bytes:
    """``data`` as file bytes, sometimes damaged at the byte level."""
    try:
        raw = json.dumps(data).encode("utf-8")  # ASCII: a lone surrogate becomes \ud800, NaN stays NaN
    except (ValueError, TypeError, RecursionError):
        raw = b"{}"
    if ch.random() < 0.85:
        return raw
    k = ch.randint(0, 8)
    n = len(raw)
    if k == 0:
        return raw[: ch.randint(0, max(0, n - 1))]  # truncated
    if k == 1 and n:
        i = ch.randint(0, n - 1)
        return raw[:i] + bytes([ch.randint(0, 255)]) + raw[i + 1:]  # a byte flipped
    if k == 2:
        i = ch.randint(0, n)
        return raw[:i] + bytes(ch.randint(0, 255) for _ in range(ch.randint(1, 8))) + raw[i:]
    if k == 3:
        return b"[" * ch.choice([65, 1000, 100_000]) + raw
    if k == 4:
        return bytes(ch.randint(0, 255) for _ in range(ch.randint(0, 64)))  # noise
    if k == 5:
        return b"\xef\xbb\xbf" + raw  # a byte-order mark
    if k == 6:
        return raw.decode("utf-8").encode("utf-16")
    if k == 7:
        i = ch.randint(0, n)
        return raw[:i] + ch.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"9" * 5000, b"\\ud800"]) + raw[i:]
    return raw.replace(b"\"", b"'", 1)


# --------------------------------------------------------------------------- running a case


class NotFinite(AssertionError):
    """A loaded input gave a result that is not a finite, valid simulation."""


def check_result(graph, strategy, cluster, cost: CostModel | None = None) -> str:
    """Simulate; the makespan must be finite and > 0 and the summary strict JSON."""
    r = simulate_strategy(graph, strategy, cluster, cost)
    t = r.iteration_time_s
    if not (math.isfinite(t) and t > 0):
        raise NotFinite(f"iteration time {t!r}")
    json_text(r.summary())  # strict JSON (allow_nan=False): raises on Infinity/NaN
    format_summary(r)
    return "valid"


def evaluate(kind: str, payload: Any, context: Any, as_file: bool, tmpdir: str) -> str:
    """Load ``payload`` (bytes written to a file, or a mapping) as ``kind`` and, when it
    loads, simulate with it. Returns ``"valid"``; raises what the engine raised."""
    if as_file:
        path = os.path.join(tmpdir, f"case.{kind}.json")
        with open(path, "wb") as f:
            f.write(payload)
        src: Any = path
    else:
        src = payload
    if kind == "model":
        g = load_model(src)
        two = load_cluster(TWO_GPUS)
        try:
            s = data_parallel(g, two)
        except (ValueError, SoapboxError):
            s = make_baseline("model-parallel", g, two)
        return check_result(g, s, two)
    if kind == "cluster":
        c = load_cluster(src)
        g = tiny_gpt()
        return check_result(g, data_parallel(g, c), c)
    if kind == "strategy":
        g, c = context
        return check_result(g, load_strategy(src, g, c), c)
    g, c = context
    table = load_profile(src)
    return check_result(g, data_parallel(g, c), c, CostModel(profile=table))


def cli_validate(path: str) -> str:
    """``soapbox validate PATH``: exit 0 or 1, no traceback, printable output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(["validate", path])
    text = out.getvalue() + err.getvalue()
    if rc not in (0, 1, 2) or "Traceback" in text:
        raise NotFinite(f"validate exit {rc}: {text[:200]}")
    text.encode("utf-8")  # printable (no lone surrogate)
    return "valid" if rc == 0 else "refused"


def make_case(seed: int, i: int, small: bool = False) -> tuple[str, str, Any, Any, bool]:
    """Case ``i`` of run ``seed``: (kind, seed label, payload, context, as_file)."""
    ch = random.Random(f"{seed}:{i}")
    kind = KINDS[i % len(KINDS)]
    label, data, context = ch.choice(seeds(small)[kind])
    return build_case(kind, label, data, context, ch)


def build_case(kind: str, label: str, data: Any, context: Any, ch: Chooser) -> tuple[str, str, Any, Any, bool]:
    if kind == "model" and ch.random() < 0.7:  # without out_shapes a changed shape flows on to the simulator
        data = {**data, "ops": [{k: v for k, v in op.items() if k != "out_shapes"} for op in data["ops"]]}
    for _ in range(ch.choice([1, 1, 1, 2, 3])):
        data = mutate(data, ch)
    if ch.random() < 0.3:  # in memory, as the app passes parsed state
        if ch.random() < 0.3:
            data = python_only(data, ch)
        return kind, label, data, context, False
    return kind, label, encode(data, ch), context, True


def classify(fn: Callable[[], str]) -> tuple[str, str]:
    """(outcome, detail): valid, ValidationError, refused (a ValueError or SoapboxError a
    command prints as one line), not finite, or traceback: TYPE."""
    try:
        return fn(), ""
    except ValidationError as exc:
        return "ValidationError", str(exc).splitlines()[-1][:200]
    except NotFinite as exc:
        return "not finite", str(exc)[:300]
    except (SoapboxError, ValueError) as exc:
        # the CLI prints these as one line; the message says what (kept to inspect)
        return f"refused: {type(exc).__name__}", str(exc)[:200]
    except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
        return f"traceback: {type(exc).__name__}", "".join(traceback.format_exception(exc))[-1500:]


def run_case(seed: int, i: int, tmpdir: str, small: bool = False) -> dict[str, Any]:
    kind, label, payload, context, as_file = make_case(seed, i, small)
    outcome, detail = classify(lambda: evaluate(kind, payload, context, as_file, tmpdir))
    row = {"i": i, "kind": kind, "seed": label, "as_file": as_file, "outcome": outcome, "detail": detail,
           "cli": False}
    if as_file and i % 5 == 0:
        path = os.path.join(tmpdir, f"case.{kind}.json")
        c_outcome, c_detail = classify(lambda: cli_validate(path))
        row["cli"] = True
        if c_outcome.startswith(("traceback", "not finite")):
            row.update(outcome=f"cli {c_outcome}", detail=c_detail)
    return row


# --------------------------------------------------------------------------- workers


def _worker(seed: int, memory_gb: float, small: bool) -> None:
    """Read case numbers on stdin, answer one JSON line each."""
    import resource

    limit = int(memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with tempfile.TemporaryDirectory(prefix="soapbox-fuzz-") as tmpdir:
        seeds(small)
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            row = run_case(seed, int(line), tmpdir, small)
            print(json.dumps(row), flush=True)


class _Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        cmd = [sys.executable, __file__, "--worker", "--seed", str(args.seed), "--memory-gb", str(args.memory_gb)]
        self.proc = subprocess.Popen(cmd + (["--small"] if args.small else []), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        json.loads(self.proc.stdout.readline())  # ready (imports and seeds done)
        self.case: int | None = None
        self.started = 0.0

    def send(self, i: int) -> None:
        self.case, self.started = i, time.perf_counter()
        self.proc.stdin.write(f"{i}\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run(args: argparse.Namespace) -> tuple[Counter, dict[str, list[dict[str, Any]]], float]:
    counts: Counter = Counter()
    examples: dict[str, list[dict[str, Any]]] = {}
    todo = list(range(args.cases))[::-1]
    workers = [_Worker(args) for _ in range(args.workers)]
    t0 = time.perf_counter()
    done = 0

    def record(row: dict[str, Any]) -> None:
        nonlocal done
        counts[(row["kind"], row["outcome"])] += 1
        counts["from a file" if row["as_file"] else "from a mapping" if row["as_file"] is False else "?"] += 1
        counts["also through soapbox validate"] += bool(row.get("cli"))
        examples.setdefault(row["outcome"], []).append(row)
        done += 1
        if done % 500 == 0:
            print(f"  {done:,} cases, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    for w in workers:
        if todo:
            w.send(todo.pop())
    while any(w.case is not None for w in workers):
        busy = [w for w in workers if w.case is not None]
        ready, _, _ = select.select([w.proc.stdout for w in busy], [], [], 0.5)
        for w in busy:
            if w.proc.stdout in ready:
                line = w.proc.stdout.readline()
                if not line:  # the worker died (a crash, or killed for memory)
                    record({"i": w.case, "kind": KINDS[w.case % len(KINDS)], "outcome": "crash", "detail": "",
                            "seed": "", "as_file": None})
                    w.kill()
                    workers[workers.index(w)] = w = _Worker(args)
                else:
                    record(json.loads(line))
                    w.case = None
            elif time.perf_counter() - w.started > args.timeout_s:
                record({"i": w.case, "kind": KINDS[w.case % len(KINDS)], "outcome": "hang",
                        "detail": f"over {args.timeout_s} s", "seed": "", "as_file": None})
                w.kill()
                workers[workers.index(w)] = w = _Worker(args)
            if w.case is None and todo:
                w.send(todo.pop())
    for w in workers:
        w.proc.stdin.close()
        w.proc.wait()
    return counts, examples, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2)))
    p.add_argument("--timeout-s", type=float, default=20.0, help="per case; a case over it counts as a hang")
    p.add_argument("--memory-gb", type=float, default=6.0, help="address-space limit of a worker")
    p.add_argument("--small", action="store_true", help="only the small seeds (as the test suite uses)")
    p.add_argument("--show", type=int, default=3, help="examples printed per failing outcome")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args.seed, args.memory_gb, args.small)
        return
    print(f"fuzzing {args.cases:,} cases (seed {args.seed}, {args.workers} workers, {args.timeout_s:g} s a case)",
          file=sys.stderr)
    counts, examples, elapsed = run(args)
    outcomes = sorted({key[1] for key in counts if isinstance(key, tuple)})
    print(f"{args.cases:,} cases in {elapsed:.0f} s (seed {args.seed})\n")
    print(f"| outcome | {' | '.join(KINDS)} | total |")
    print(f"|---|{'---:|' * (len(KINDS) + 1)}")
    for o in outcomes:
        row = [counts[(k, o)] for k in KINDS]
        print(f"| {o} | {' | '.join(f'{n:,}' for n in row)} | {sum(row):,} |")
    total = [sum(counts[(k, o)] for o in outcomes) for k in KINDS]
    print(f"| **all** | {' | '.join(f'{n:,}' for n in total)} | {sum(total):,} |")
    print(f"\n{counts['from a file']:,} loaded from a file, {counts['from a mapping']:,} from a mapping in memory; "
          f"{counts['also through soapbox validate']:,} also through `soapbox validate`")
    bad = [o for o in outcomes if o.startswith(("traceback", "cli", "not finite")) or o in ("hang", "crash")]
    refused = Counter(r["detail"].split(":")[0][:60] for o in outcomes if o.startswith("refused")
                      for r in examples[o])
    if refused:
        print("\nrefused (ValueError/SoapboxError a command prints as one line), by message start:")
        for msg, n in refused.most_common(10):
            print(f"  {n:6,}  {msg}")
    for o in bad:
        print(f"\n{o}: {len(examples[o])} case(s), e.g.")
        for r in examples[o][: args.show]:
            print(f"  case {r['i']} ({r['kind']} from {r['seed']}, {'file' if r['as_file'] else 'mapping'}):\n"
                  f"    {r['detail'][-800:]}")
    print(f"\ntracebacks: {sum(len(examples[o]) for o in bad if o != 'hang')}, hangs: {len(examples.get('hang', []))}")


if __name__ == "__main__":
    main()
