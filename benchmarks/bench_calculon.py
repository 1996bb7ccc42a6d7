"""soapbox's prediction time side by side with Calculon's, on the same Megatron runs (issue 28).

Calculon (Isaev et al., "Calculon: a methodology and tool for high-level co-design of systems
and large language models", SC'23; github.com/calculon-ai/calculon) is an analytic model of
LLM training in pure Python. It is not on PyPI and none of its code or JSON is copied here:
``--calculon PATH`` names a checkout, which is imported in this process, and every Calculon
input is read from it:

* models: ``models/gpt3-175B.json``, ``models/megatron-22B.json``, ``models/turing-530B.json``,
  ``models/megatron-1T.json``;
* system: ``systems/a100_80g.json`` (the one its Table 5 validation uses);
* executions: ``validation/seqsel/tab5/<model>_{full,seqsel}.json`` (Korthikanti et al. 2022,
  arXiv 2205.05198, Table 5: full recomputation, and sequence parallelism + selective
  recomputation). The 1,024-GPU runs start from ``tab5/gpt3-175B_full.json`` and change only
  the layout (num_procs 1024, pipeline_par 16, data_par 8, batch_size 1536,
  pipeline_interleaving 1) and, with sequence parallelism, ``tensor_par_comm_type`` ``rs_ag``
  (Calculon's sequence parallelism: ``Llm.Execution._sequence_par``).

soapbox runs the same layouts: model ``gpt3-175b`` (``engine.models.build_sample``) or a
``GPTConfig`` of Korthikanti et al.'s Table 3 shapes with Megatron's GPT conventions, preset
``dgx-a100-80gb:<nodes>``, ``engine.layout.Layout`` -> ``engine.search.baselines.build_layout``
-> ``engine.sim.report.simulate_strategy(check=False)``, whose memory report is made inside
(``account_memory`` on). Both sides: fp16, no ZeRO / optimizer sharding, data-parallel gradient
reduction not overlapped with the backward (Calculon's ``data_par_overlap`` false in those
files; soapbox ``overlap_grad_reduce`` off), no tensor-parallel communication overlap.
Differences that stay: Calculon has no embedding or output layer (soapbox's models have a
51,200-word vocabulary); Calculon's time is a formula, soapbox's a simulated timeline.

What is timed, per prediction:

* Calculon: ``Llm.Execution.from_json`` + ``Llm(app)`` + ``compile`` + ``run`` +
  ``get_stats_json`` (the application and system objects made once, as its validation does);
* soapbox: ``resolved`` (the layout filled in) + ``build_layout`` + ``simulate_strategy`` (task-graph build,
  simulation, memory report). The model graph and the cluster are made once per run; the
  graph's build time is shown on its own (``model build s``).

One process; for each run one warm-up call of each (numba compiles, caches fill), then
``--rounds`` rounds, each one Calculon call then one soapbox call; the medians are reported.
The published iteration time is Korthikanti et al.'s Table 5 for their eight runs, and a row of
``validation/published_runs_public.csv`` with the same model, GPUs, layout and batch where one
exists (converted by Megatron's FLOPs count, ``published.megatron_flops``); ``-`` otherwise.

Usage::

    PYTHONPATH=. python benchmarks/bench_calculon.py --calculon /path/to/calculon [--rounds 5]
        [--only 1024|korthikanti] [--steady] [--json] [--save out.json]
    python benchmarks/bench_calculon.py --table out.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["RUNS", "Run", "Result", "load_calculon", "markdown_table", "summary_lines", "main"]

#: Korthikanti et al. 2022 (arXiv 2205.05198), Table 5: seconds per iteration measured on
#: Selene (DGX A100 80GB), "full" = full recomputation, "seqsel" = sequence parallelism +
#: selective recomputation ("present work").
KORTHIKANTI_TABLE5_S = {
    ("megatron-22B", "full"): 1.42, ("megatron-22B", "seqsel"): 1.10,
    ("gpt3-175B", "full"): 18.13, ("gpt3-175B", "seqsel"): 13.75,
    ("turing-530B", "full"): 49.05, ("turing-530B", "seqsel"): 37.83,
    ("megatron-1T", "full"): 94.42, ("megatron-1T", "seqsel"): 71.49,
}

#: Korthikanti et al. 2022, Table 3 (model shapes; sequence 2048) and the layouts of Calculon's
#: tab5 files: name -> (layers, hidden, heads, tp, pp, vpp, GPUs, global batch, micro-batch)
KORTHIKANTI_RUNS = {
    "megatron-22B": (48, 6144, 64, 8, 1, 1, 8, 4, 4),
    "gpt3-175B": (96, 12288, 96, 8, 8, 3, 64, 64, 1),
    "turing-530B": (105, 20480, 128, 8, 35, 3, 280, 280, 1),
    "megatron-1T": (128, 25600, 160, 8, 64, 1, 512, 512, 1),
}
SEQ_LEN = 2048
#: GPT-2's 50,257 words padded to 51,200 (Megatron-LM's --make-vocab-size-divisible-by 128 x tp 8)
VOCAB = 51200
GPUS_PER_NODE = 8  # DGX A100
CALCULON_SYSTEM = "systems/a100_80g.json"
TAB5 = "validation/seqsel/tab5"
#: soapbox builds above this many estimated tasks are refused (the machine's memory: a 1T-parameter
#: run with sequence parallelism and no symmetry reduction took over 12 GB before it was stopped)
MAX_TASKS = 20_000_000


@dataclass(frozen=True)
class Run:
    """One training run both tools predict."""

    name: str
    #: Calculon: model file, execution file (under the checkout), and the fields changed in it
    calculon_model: str
    calculon_exe: str
    calculon_changes: dict[str, Any]
    #: soapbox: model (layers, hidden, heads, global batch), GPUs and layout options
    layers: int
    hidden: int
    heads: int
    global_batch: int
    gpus: int
    layout: dict[str, Any]
    #: published seconds per iteration and where from; None: none known
    published_s: float | None = None
    published_from: str = ""

    @property
    def cluster(self) -> str:
        """soapbox's cluster preset: whole DGX A100 80GB nodes."""
        return f"dgx-a100-80gb:{self.gpus // GPUS_PER_NODE}"


def _runs() -> list[Run]:
    out = []
    base = dict(recompute="full", micro_batch=1, overlap_grad_reduce=False)
    for sp in (False, True):
        changes: dict[str, Any] = dict(num_procs=1024, pipeline_par=16, data_par=8, batch_size=1536,
                                       pipeline_interleaving=1)
        if sp:
            changes["tensor_par_comm_type"] = "rs_ag"
        out.append(Run(f"GPT-3 175B 1024 GPUs tp8 pp16 dp8 full{' + sp' if sp else ''}", "models/gpt3-175B.json",
                       f"{TAB5}/gpt3-175B_full.json", changes, 96, 12288, 96, 1536, 1024,
                       dict(base, tp=8, pp=16, dp=8, sequence_parallel=sp)))
    for model, (L, h, a, tp, pp, vpp, gpus, batch, mb) in KORTHIKANTI_RUNS.items():
        for mode in ("full", "seqsel"):
            lay = dict(tp=tp, pp=pp, dp=gpus // (tp * pp), vpp=vpp, micro_batch=mb, overlap_grad_reduce=False,
                       recompute="full" if mode == "full" else "selective", sequence_parallel=mode == "seqsel")
            out.append(Run(f"Korthikanti T5 {model} {mode}", f"models/{model}.json", f"{TAB5}/{model}_{mode}.json",
                           {}, L, h, a, batch, gpus, lay, KORTHIKANTI_TABLE5_S[(model, mode)],
                           "Korthikanti et al. 2022 Table 5"))
    return out


RUNS = _runs()


@dataclass
class Result:
    """One run's figures: wall seconds per prediction (median over rounds), predicted iteration
    seconds and memory per GPU (GiB) from each tool, the published iteration seconds."""

    run: str
    calculon_pred_s: float | None = None
    soapbox_pred_s: float | None = None
    soapbox_model_build_s: float | None = None
    calculon_iter_s: float | None = None
    soapbox_iter_s: float | None = None
    calculon_mem_gib: float | None = None
    soapbox_peak_gib: float | None = None
    published_s: float | None = None
    published_from: str = ""
    soapbox_tasks: int | None = None
    #: CPU seconds per prediction (this process's, all threads), median over the rounds
    calculon_cpu_s: float | None = None
    soapbox_cpu_s: float | None = None
    calculon_rounds_s: list[float] = field(default_factory=list)
    soapbox_rounds_s: list[float] = field(default_factory=list)
    calculon_cpu_rounds_s: list[float] = field(default_factory=list)
    soapbox_cpu_rounds_s: list[float] = field(default_factory=list)
    problem: str = ""
    #: with --hier: the full simulation (steady state extrapolated) timed in the same rounds, and
    #: its iteration time and peak memory, for the equality table
    full_pred_s: float | None = None
    full_cpu_s: float | None = None
    full_iter_s: float | None = None
    full_peak_gib: float | None = None
    full_rounds_s: list[float] = field(default_factory=list)
    how: str = ""


class BenchError(Exception):
    """A problem the user can act on, printed as one line."""


def load_calculon(path: str | os.PathLike) -> Any:
    """Import Calculon from the checkout at ``path`` (the folder holding ``calculon/``);
    :class:`BenchError` names the path and what is missing there."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise BenchError(f"--calculon {path}: no such folder (a checkout of github.com/calculon-ai/calculon)")
    if not (root / "calculon" / "llm" / "llm.py").is_file():
        raise BenchError(f"--calculon {path}: not a Calculon checkout (no calculon/llm/llm.py there)")
    sys.path.insert(0, str(root.resolve()))
    try:
        calculon = importlib.import_module("calculon")
        importlib.import_module("calculon.llm")
    except Exception as e:  # its own import failing (a missing dependency, a syntax error)
        raise BenchError(f"--calculon {path}: importing Calculon failed: {type(e).__name__}: {e}") from None
    return calculon


def _read_json(root: Path, rel: str) -> dict[str, Any]:
    p = root / rel
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except OSError:
        raise BenchError(f"{p}: missing from the Calculon checkout") from None
    except ValueError as e:
        raise BenchError(f"{p}: not JSON ({e})") from None


def calculon_predictor(calculon: Any, root: Path, run: Run) -> Callable[[], tuple[float, float]]:
    """A call returning Calculon's (iteration s, memory per GPU in bytes: tier-1 capacity
    required, ``proc_mem_tier1_cap_req``) for ``run``; the files read now."""
    from calculon.llm import Llm
    made = {}
    for rel, make in ((run.calculon_model, Llm.Application), (CALCULON_SYSTEM, calculon.System)):
        try:
            made[rel] = make(_read_json(root, rel))
        except BenchError:
            raise
        except Exception as e:  # Calculon's own constructors on a file it cannot use
            raise BenchError(f"{root / rel}: Calculon cannot use it ({type(e).__name__}: {e})") from None
    app, system = made[run.calculon_model], made[CALCULON_SYSTEM]
    cfg = dict(_read_json(root, run.calculon_exe), **run.calculon_changes)
    log = logging.getLogger("calculon")

    def predict() -> tuple[float, float]:
        exe = Llm.Execution.from_json(cfg)
        m = Llm(app, log)
        m.compile(system, exe)
        m.run(system)
        stats = m.get_stats_json(False)
        return float(stats["total_time"]), float(stats["proc_mem_tier1_cap_req"])
    return predict


def soapbox_model(run: Run):
    """soapbox's model of ``run``: the sample ``gpt3-175b`` for GPT-3's shape, else a GPT of
    Korthikanti et al.'s Table 3 shape with Megatron-LM's GPT conventions (learned positions,
    biases, tied embeddings, dropout 0.1; :class:`engine.models.transformer.GPTConfig`'s
    defaults), fp16, sequence 2048, vocabulary 51,200."""
    from engine.models import build_sample
    from engine.models.transformer import GPTConfig, gpt
    if (run.layers, run.hidden, run.heads) == (96, 12288, 96):
        return build_sample("gpt3-175b", batch=run.global_batch)
    return gpt(GPTConfig(run.layers, run.hidden, run.heads, SEQ_LEN, VOCAB, run.global_batch, precision="fp16",
                         name=Path(run.calculon_model).stem), source="benchmarks/bench_calculon.py")


def hier_predictor(graph: Any, run: Run, res: Result) -> Callable[[], tuple[float, float, int]]:
    """A call returning soapbox's (iteration s, peak memory of the worst GPU in bytes, tasks
    simulated) by the hierarchical prediction (``engine.sim.hier.predict_layout``: a reference
    run of a few stages and microbatches, its units composed); ``res.how`` says how."""
    from engine.cluster import preset
    from engine.layout import Layout
    from engine.sim.hier import predict_layout
    cluster = preset(run.cluster)
    lay = Layout.from_options(run.layout)

    def predict() -> tuple[float, float, int]:
        h = predict_layout(graph, cluster, lay)
        res.how = h.describe()
        return h.iteration_time_s, float(h.memory.peak_bytes.max()), h.reference_tasks + h.composed_tasks
    return predict


def soapbox_predictor(graph: Any, run: Run, max_tasks: int | None = None,
                      steady: bool = False) -> Callable[[], tuple[float, float, int]]:
    """A call returning soapbox's (iteration s, peak memory of the worst GPU in bytes, tasks)
    for ``run``: layout -> strategy -> build, simulate and memory report. The first call
    refuses (``engine.errors.TooLargeError``) a build of more than ``max_tasks`` estimated
    tasks, as the explorer does; the calls after it (the timed ones) skip that estimate.
    ``steady``: ``simulate_strategy(steady=True)`` (``engine.sim.steady``: a long pipeline's steady
    state simulated for a few microbatches and extrapolated; the tasks are the whole
    iteration's count)."""
    from engine.cluster import preset
    from engine.layout import Layout, resolved
    from engine.sim.report import simulate_strategy
    from engine.layout.build import build_layout
    cluster = preset(run.cluster)
    lay = Layout.from_options(run.layout)
    calls = []

    def predict() -> tuple[float, float, int]:
        s = build_layout(graph, cluster, resolved(lay, graph, cluster))
        r = simulate_strategy(graph, s, cluster, check=False, max_tasks=None if calls else max_tasks,
                              **({"steady": True} if steady else {}))
        calls.append(1)
        return r.iteration_time_s, float(r.memory.peak_bytes.max()), getattr(r, "num_tasks", r.tasks.num_tasks)
    return predict


def published_from_csv(run: Run) -> tuple[float | None, str]:
    """(seconds per iteration, row) of a ``validation/published_runs_public.csv`` row with
    ``run``'s layers, hidden, GPUs, tp, pp and global batch and a ``tflops_per_gpu`` metric
    (Megatron's count, Narayanan et al. SC'21 Eq. 3, with full recomputation); (None, "") when
    there is none."""
    from published import load_rows, megatron_flops
    from published_rows import cell_float, cell_int
    want = dict(layers=run.layers, hidden=run.hidden, gpus=run.gpus, tp=run.layout["tp"], pp=run.layout["pp"],
                global_batch=run.global_batch)
    for row in load_rows():
        if all(cell_int(row, k) == v for k, v in want.items()) and row.get("metric_name") == "tflops_per_gpu":
            tf = cell_float(row, "metric_value")
            if tf:
                F = megatron_flops(run.global_batch, SEQ_LEN, run.layers, run.hidden, cell_int(row, "vocab") or VOCAB,
                                   recompute=(row.get("recompute") or "").startswith("full"))
                return F / (tf * 1e12 * run.gpus), f"published_runs_public.csv row {row['row_id']}"
    return None, ""


def measure(run: Run, calc: Callable[[], tuple[float, float]], soap: Callable[[], tuple[float, float, int]],
            rounds: int, res: Result, full: Callable[[], tuple[float, float, int]] | None = None) -> Result:
    """Warm each tool up once, then ``rounds`` rounds of (Calculon call, soapbox call[, the full
    simulation's call: --hier]), each timed in wall seconds and in this process's CPU seconds."""
    outs: dict[str, Any] = {}
    calls = {"calculon": calc, "soapbox": soap, **({"full": full} if full is not None else {})}
    for name, call in calls.items():
        try:
            outs[name] = call()
        except Exception as e:  # Calculon refuses a layout with its own Error
            res.problem += f"{name}: {type(e).__name__}: {e}. "
    cpu_rounds: dict[str, list[float]] = {"calculon": res.calculon_cpu_rounds_s, "soapbox": res.soapbox_cpu_rounds_s,
                                          "full": []}
    for _ in range(rounds):
        for name, call in calls.items():
            if name not in outs:
                continue
            t, cpu = time.perf_counter(), time.process_time()
            outs[name] = call()
            getattr(res, f"{name}_rounds_s").append(time.perf_counter() - t)
            cpu_rounds[name].append(time.process_time() - cpu)
    if "calculon" in outs:
        res.calculon_iter_s, res.calculon_mem_gib = outs["calculon"][0], outs["calculon"][1] / 2**30
    if "soapbox" in outs:
        o = outs["soapbox"]
        res.soapbox_iter_s, res.soapbox_peak_gib, res.soapbox_tasks = o[0], o[1] / 2**30, o[2]
    if "full" in outs:
        res.full_iter_s, res.full_peak_gib = outs["full"][0], outs["full"][1] / 2**30
    for name in outs:
        if getattr(res, f"{name}_rounds_s"):
            setattr(res, f"{name}_pred_s", statistics.median(getattr(res, f"{name}_rounds_s")))
            setattr(res, f"{name}_cpu_s", statistics.median(cpu_rounds[name]))
    return res


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _pair(wall_s: float | None, cpu_s: float | None, scale: float, fmt: str) -> str:
    """``wall (cpu)`` scaled, or ``-``."""
    if wall_s is None:
        return "-"
    return format(wall_s * scale, fmt) + ("" if cpu_s is None else f" ({cpu_s * scale:{fmt}})")


def _err(pred: float | None, pub: float | None) -> str:
    return "-" if pred is None or not pub else f"{(pred - pub) / pub * 100:+.1f}%"


def markdown_table(results: list[Result]) -> str:
    """The results as a Markdown table (times per prediction, wall and (CPU), in ms for
    Calculon, s for soapbox; iteration times in s; memory in GiB per GPU; error against the
    published time)."""
    lines = ["| run | Calculon ms/prediction (CPU) | soapbox s/prediction (CPU) | soapbox model build s | "
             "published s/iter | Calculon s/iter (err) | soapbox s/iter (err) | Calculon GiB/GPU | soapbox peak GiB | "
             "soapbox tasks |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        calc = _pair(r.calculon_pred_s, r.calculon_cpu_s, 1e3, ".1f")
        lines.append(f"| {r.run} | {calc} | {_pair(r.soapbox_pred_s, r.soapbox_cpu_s, 1.0, '.2f')} | "
                     f"{_f(r.soapbox_model_build_s, '.2f')} | {_f(r.published_s, '.2f')} | "
                     f"{_f(r.calculon_iter_s, '.2f')} ({_err(r.calculon_iter_s, r.published_s)}) | "
                     f"{_f(r.soapbox_iter_s, '.2f')} ({_err(r.soapbox_iter_s, r.published_s)}) | "
                     f"{_f(r.calculon_mem_gib, '.1f')} | {_f(r.soapbox_peak_gib, '.1f')} | "
                     f"{'-' if r.soapbox_tasks is None else f'{r.soapbox_tasks:,}'} |")
    lines += summary_lines(results)
    if any(r.full_iter_s is not None for r in results):
        lines += ["", "Composed (engine.sim.hier) against the full simulation (steady state extrapolated), "
                      "timed in the same rounds:", "",
                  "| run | composed ms/prediction (CPU) | full s/prediction (CPU) | speed-up | composed s/iter | "
                  "full s/iter | rel. diff | composed peak GiB | full peak GiB | rel. diff | how |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in results:
            if r.full_iter_s is None or r.soapbox_iter_s is None:
                continue
            up = f"{r.full_pred_s / r.soapbox_pred_s:.1f}x" if r.full_pred_s and r.soapbox_pred_s else "-"
            lines.append(f"| {r.run} | {_pair(r.soapbox_pred_s, r.soapbox_cpu_s, 1e3, '.1f')} | "
                         f"{_pair(r.full_pred_s, r.full_cpu_s, 1.0, '.3f')} | {up} | {r.soapbox_iter_s:.6f} | "
                         f"{r.full_iter_s:.6f} | {abs(r.soapbox_iter_s / r.full_iter_s - 1):.1e} | "
                         f"{r.soapbox_peak_gib:.3f} | {r.full_peak_gib:.3f} | "
                         f"{abs(r.soapbox_peak_gib / r.full_peak_gib - 1):.1e} | {r.how} |")
    for r in results:
        if r.problem:
            lines.append(f"\n{r.run}: {r.problem.strip()}")
    return "\n".join(lines)


def summary_lines(results: list[Result]) -> list[str]:
    """Per tool, over the runs it predicted: the range of wall (and CPU) seconds per prediction
    and, over those with a published time, the median absolute error of the iteration time."""
    out = []
    for tool in ("calculon", "soapbox"):
        pred = [getattr(r, f"{tool}_pred_s") for r in results if getattr(r, f"{tool}_pred_s") is not None]
        cpu = [getattr(r, f"{tool}_cpu_s") for r in results if getattr(r, f"{tool}_cpu_s") is not None]
        cpu_text = f" ({min(cpu):.3g}-{max(cpu):.3g} s CPU)" if cpu else ""
        errs = [abs(getattr(r, f"{tool}_iter_s") / r.published_s - 1) * 100 for r in results
                if r.published_s and getattr(r, f"{tool}_iter_s") is not None]
        if pred:
            err = f"; median |error| {statistics.median(errs):.1f}% over the {len(errs)} with a published time" \
                if errs else ""
            out.append(f"\n{'Calculon' if tool == 'calculon' else 'soapbox'}: {min(pred):.3g}-{max(pred):.3g} s"
                       f"{cpu_text} per prediction over {len(pred)} runs{err}")
    return out


def _header(rounds: int, calculon_root: Path, steady: bool = False) -> dict[str, Any]:
    import engine
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "load_1_5_15": load,
            "engine": str(Path(engine.__file__).resolve().parent), "calculon": str(calculon_root.resolve()),
            "rounds": rounds, "steady": steady}


def _title(head: dict[str, Any]) -> str:
    load = head["load_1_5_15"]
    load = ", ".join(f"{x:.2f}" for x in load) if load else "unknown"
    return (f"soapbox engine {head['engine']}; Calculon {head['calculon']}; {head['host']}, {head['cpus']} CPUs, "
            f"Python {head['python']}, {head['date_utc']} UTC, load average {load}; "
            f"median of {head['rounds']} interleaved rounds after one warm-up each"
            f"{'; soapbox composed (engine.sim.hier)' if head.get('hier') else ''}"
            f"{'; soapbox with steady=True (engine.sim.steady)' if head.get('steady') and not head.get('hier') else ''}\n")


def print_saved(path: str) -> int:
    """Print the title and Markdown table of a JSON file ``--save`` wrote; 2 and one line for
    a file that is missing or not one."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        head, results = doc["setup"], [Result(**r) for r in doc["results"]]
        title = _title(head)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"bench_calculon: --table {path}: not a file bench_calculon --save wrote ({type(e).__name__}: {e})",
              file=sys.stderr)
        return 2
    print(title)
    print(markdown_table(results))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calculon", help="a checkout of github.com/calculon-ai/calculon (required unless --table)")
    ap.add_argument("--table", metavar="JSON", help="print the Markdown table of a file --save wrote; run nothing")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds after the warm-up (default 5)")
    ap.add_argument("--only", choices=("1024", "korthikanti"), help="only the 1,024-GPU runs or Korthikanti's eight")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the Markdown table")
    ap.add_argument("--save", metavar="PATH", help="also write the JSON to PATH")
    ap.add_argument("--steady", action="store_true",
                    help="soapbox extrapolates a long pipeline's steady state (simulate_strategy(steady=True))")
    ap.add_argument("--hier", action="store_true",
                    help="soapbox predicts by composition (engine.sim.hier.predict_layout); the full simulation "
                         "(steady state extrapolated) runs in the same rounds for the equality table")
    ap.add_argument("--max-tasks", type=int, default=MAX_TASKS,
                    help=f"refuse a soapbox build of more estimated tasks (default {MAX_TASKS:,}; 0: no cap)")
    args = ap.parse_args(argv)
    if args.table:
        return print_saved(args.table)
    if not args.calculon:
        print("bench_calculon: --calculon PATH is required (a checkout of github.com/calculon-ai/calculon)",
              file=sys.stderr)
        return 2
    if args.rounds < 1:
        print(f"bench_calculon: --rounds {args.rounds}: needs 1 or more", file=sys.stderr)
        return 2
    try:
        try:  # soapbox's engine first: from PYTHONPATH, never from this file's tree
            importlib.import_module("engine")
        except ImportError as e:
            raise BenchError(f"soapbox's engine is not importable ({e}): run with PYTHONPATH=<a soapbox tree>") \
                from None
        calculon = load_calculon(args.calculon)
        root = Path(args.calculon).expanduser()
        sys.path.insert(1, str(Path(__file__).resolve().parent))  # published.py, after the engine is chosen
        runs = [r for r in RUNS if args.only is None or (args.only == "1024") == (r.gpus == 1024)]
        preds = [calculon_predictor(calculon, root, r) for r in runs]  # every file read before any timing
    except BenchError as e:
        print(f"bench_calculon: {e}", file=sys.stderr)
        return 2
    head = _header(args.rounds, root, args.steady or args.hier)
    head["hier"] = args.hier
    results = []
    graphs: dict[tuple[int, int, int, int], Any] = {}
    for run, calc in zip(runs, preds):
        res = Result(run.name, published_s=run.published_s, published_from=run.published_from)
        key = (run.layers, run.hidden, run.heads, run.global_batch)
        t = time.perf_counter()
        graph = graphs.get(key) or soapbox_model(run)
        res.soapbox_model_build_s = None if key in graphs else time.perf_counter() - t
        graphs[key] = graph
        if res.published_s is None:
            res.published_s, res.published_from = published_from_csv(run)
        if args.hier:  # the composed prediction, and the full simulation in the same rounds
            results.append(measure(run, calc, hier_predictor(graph, run, res), args.rounds, res,
                                   soapbox_predictor(graph, run, args.max_tasks or None, True)))
        else:
            results.append(measure(run, calc, soapbox_predictor(graph, run, args.max_tasks or None, args.steady),
                                   args.rounds, res))
        if not args.json:
            print(f"  done: {run.name}", file=sys.stderr, flush=True)
    doc = json.dumps({"setup": head, "results": [asdict(r) for r in results]}, indent=1)
    if args.save:
        Path(args.save).write_text(doc + "\n", encoding="utf-8")
    if args.json:
        print(doc)
    else:
        print(_title(head))
        print(markdown_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
