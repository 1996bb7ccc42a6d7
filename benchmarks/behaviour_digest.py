"""A digest of what soapbox computes, through its command line only, to show that a change
of structure changed no result.

The engine's module paths move in a refactor; its command line does not. This script runs
``soapbox`` sub-commands in process (``engine.cli.main``) on a fixed list of cases that cover
the simulator's paths (data, model and expert parallelism on FlexFlow's models, Megatron
layouts with pipelines, interleaving, sequence and context parallelism, recomputation, ZeRO
1-3, offload, fp8, mixture-of-experts with ep/etp, a heterogeneous cluster, a steady-state
pipeline), the seeded searches with proposal budgets (MCMC serial and on a backend, PaSE, the
pipeline planner, the differentiable search, auto), the exports, a what-if and a sweep, and
prints one line per case: its name and a SHA-256 of everything the command wrote (stdout
and output files), with the wall-clock fields removed (``wall_s``, search times). Two trees
that print the same lines compute the same numbers, bit for bit (floats are printed by
``repr``, so one ulp shows).

Usage::

    python benchmarks/behaviour_digest.py [--only NAME,...] [--show NAME] > digest.txt

Run it on both trees (e.g. ``git worktree add /tmp/before HEAD~1``) and ``diff`` the outputs.
``--show NAME`` prints that case's normalised output instead of its hash.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from engine.cli import main as soapbox  # noqa: E402

#: name -> the command's arguments; ``{out}`` is a temporary file whose content is digested,
#: ``{strategy}`` the strategy file written by the case named in :data:`NEEDS`
SIM = ["simulate", "--json"]
CASES: dict[str, list[str]] = {
    "alexnet-dp-p100": SIM + ["--model", "alexnet", "--cluster", "p100-4x4", "--strategy", "data-parallel"],
    "alexnet-expert-p100": SIM + ["--model", "alexnet", "--cluster", "p100-4x4", "--strategy", "expert"],
    "alexnet-mp-p100": SIM + ["--model", "alexnet", "--cluster", "p100-4x4", "--strategy", "model-parallel"],
    "inception-expert-p100": SIM + ["--model", "inception_v3", "--cluster", "p100-4x4", "--strategy", "expert"],
    "resnet101-dp-hetero": SIM + ["--model", "resnet101", "--cluster", "hetero-demo", "--strategy", "data-parallel"],
    "rnntc-expert-k80": SIM + ["--model", "rnntc", "--cluster", "k80-16x4", "--strategy", "expert"],
    "nmt-expert-p100": SIM + ["--model", "nmt", "--cluster", "p100-4x4", "--strategy", "expert"],
    "rnnlm-dp-p100-mb": SIM + ["--model", "rnnlm", "--cluster", "p100-4x4", "--strategy", "data-parallel",
                               "--micro-batch", "2"],
    "transformer-expert-p100": SIM + ["--model", "transformer", "--cluster", "p100-4x4", "--strategy", "expert"],
    "gpt2-megatron-vpp-sp": SIM + ["--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--strategy", "megatron",
                                   "--tp", "2", "--pp", "2", "--vpp", "2", "--recompute", "selective",
                                   "--sequence-parallel"],
    "gpt2-megatron-cp-zero1-fp8": SIM + ["--model", "gpt2", "--cluster", "dgx-h100:1", "--strategy", "megatron",
                                         "--tp", "2", "--cp", "2", "--zero-stage", "1", "--precision", "fp8",
                                         "--sequence-parallel", "--tp-comm-overlap"],
    "gpt2-fsdp-zero3-op": SIM + ["--model", "gpt2", "--cluster", "dgx-a100-80gb:2", "--strategy", "fsdp",
                                 "--zero-stage", "3", "--gather-unit", "op", "--micro-batch", "2", "--batch", "32"],
    "gpt2-fsdp-hsdp": SIM + ["--model", "gpt2", "--cluster", "dgx-a100-80gb:2", "--strategy", "fsdp",
                             "--zero-stage", "2", "--shard-group", "4", "--batch", "32"],
    "llama2-7b-megatron-offload": SIM + ["--model", "llama2-7b", "--cluster", "dgx-a100-80gb:2", "--strategy",
                                         "megatron", "--tp", "4", "--pp", "2", "--recompute", "full",
                                         "--zero-stage", "2", "--offload-optimizer", "cpu"],
    "llama2-7b-fsdp-offload-params": SIM + ["--model", "llama2-7b", "--cluster", "dgx-h100:1", "--strategy", "fsdp",
                                            "--zero-stage", "3", "--offload-params", "cpu", "--offload-optimizer",
                                            "cpu"],
    "gpt3-175b-steady": SIM + ["--model", "gpt3-175b", "--cluster", "dgx-a100-80gb:128", "--strategy", "megatron",
                               "--tp", "8", "--pp", "16", "--micro-batch", "1", "--sequence-parallel"],
    "mixtral-ep-etp": SIM + ["--model", "mixtral-8x7b", "--cluster", "dgx-h100:4", "--strategy", "megatron",
                             "--tp", "2", "--pp", "2", "--ep", "4", "--etp", "2", "--sequence-parallel",
                             "--zero-stage", "1", "--moe-comm-overlap"],
    "qwen3-moe-skew": SIM + ["--model", "qwen3-30b-a3b", "--cluster", "dgx-h100:2", "--strategy", "megatron",
                             "--ep", "8", "--routing-skew", "1.2", "--recompute", "selective",
                             "--recompute-modules", "moe_act,layernorm"],
    "deepseek-v3-small-mesh": SIM + ["--model", "deepseek-v3", "--cluster", "dgx-h100:32", "--strategy",
                                     "megatron", "--tp", "2", "--pp", "8", "--ep", "16", "--sequence-parallel",
                                     "--zero-stage", "1", "--micro-batch", "1", "--precision", "fp8"],
    "gpt2-trace": ["simulate", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--strategy", "megatron",
                   "--tp", "2", "--pp", "2", "--trace", "{out}"],
    "gpt2-baseline-file": ["baseline", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--kind", "megatron",
                           "--tp", "2", "--pp", "2", "--micro-batch", "1", "-o", "{out}"],
    "export-megatron": ["export", "--format", "megatron", "{strategy}"],
    "export-deepspeed": ["export", "--format", "deepspeed", "{strategy}"],
    "export-torchtitan": ["export", "--format", "torchtitan", "{strategy}"],
    "gpt2-fsdp-file": ["baseline", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--kind", "fsdp",
                       "--tp", "2", "--zero-stage", "3", "-o", "{out}"],
    "export-deepspeed-fsdp": ["export", "--format", "deepspeed", "{strategy}"],
    "export-torchtitan-fsdp": ["export", "--format", "torchtitan", "{strategy}"],
    "whatif-gpu": ["whatif", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--strategy", "{strategy}",
                   "--fail", "gpu:3", "--budget", "0", "--json"],
    "experts": ["experts", "--model", "mixtral-8x7b", "--cluster", "dgx-h100:1", "--ep", "8", "--routing-skew",
                "0.8", "--json"],
    "sweep-serial": ["sweep", "--model", "gpt2", "--grid", "tp=1,2", "pp=1,2", "mb=1,2", "--clusters",
                     "dgx-a100-80gb:1", "--backend", "serial", "-o", "{out}.csv"],
    "search-mcmc": ["search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc", "--budget", "200",
                    "--seed", "3", "--json", "-o", "{out}"],
    "search-mcmc-backend": ["search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc", "--budget",
                            "120", "--seed", "2", "--chains", "2", "--backend", "serial", "--json", "-o", "{out}"],
    "search-pase": ["search", "--model", "transformer", "--cluster", "p100-4x4", "--algo", "pase", "--budget", "1",
                    "--json", "-o", "{out}"],
    "search-pipeline": ["search", "--model", "gpt2", "--cluster", "dgx-a100-80gb:2", "--algo", "pipeline",
                        "--budget", "8", "--json", "-o", "{out}"],
    "search-differentiable": ["search", "--model", "inception_v3", "--cluster", "p100-4x4", "--algo",
                              "differentiable", "--budget", "40", "--seed", "1", "--json", "-o", "{out}"],
    "search-auto": ["search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "auto", "--budget", "150",
                    "--seed", "4", "--json", "-o", "{out}"],
    "search-auto-llm": ["search", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--algo", "auto", "--budget",
                        "60", "--seed", "0", "--json", "-o", "{out}"],
}
#: cases that read the strategy file another case wrote
NEEDS = {"export-megatron": "gpt2-baseline-file", "export-deepspeed": "gpt2-baseline-file",
         "export-torchtitan": "gpt2-baseline-file", "whatif-gpu": "gpt2-baseline-file",
         "export-deepspeed-fsdp": "gpt2-fsdp-file", "export-torchtitan-fsdp": "gpt2-fsdp-file"}

#: JSON keys whose values are wall-clock times or paths, not results
_VOLATILE = {"wall_s", "elapsed_s", "search_time_s", "time_to_best_s", "seconds", "started", "finished",
             "time_s_to_1pct", "search_s", "setup_s", "build_s", "simulate_s", "elapsed", "path", "written",
             "trace", "budget_s", "time_to_within_1pct_s", "dp_seconds", "setup_seconds"}
_TIMES = re.compile(r"\d+(\.\d+)? layouts/s|\d+(\.\d+)?\s?(s|ms) (wall|search|elapsed)|in \d+(\.\d+)? ?s\b|after \d+(\.\d+)? ?s\b")


def _scrub(value):
    """``value`` without wall-clock fields (recursively) or the temporary folder's name."""
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, str):
        return _TIMES.sub("<time>", re.sub(r"/tmp/[^\s\"']+", "<tmp>", value))
    return value


def _normalise(text: str) -> str:
    try:
        return json.dumps(_scrub(json.loads(text)), sort_keys=True, indent=1)
    except ValueError:
        return "\n".join(_scrub(line) for line in text.splitlines())


def run_case(name: str, folder: Path, written: dict[str, Path]) -> str:
    out = folder / name
    args = [a.replace("{out}", str(out)) for a in CASES[name]]
    if name in NEEDS:
        args = [a.replace("{strategy}", str(written[NEEDS[name]])) for a in args]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = soapbox(args)
    parts = [f"exit {status}", _normalise(stdout.getvalue()), _normalise(stderr.getvalue())]
    for path in sorted(folder.glob(name + "*")):
        written[name] = path
        parts.append(f"file {path.name[len(name):]}:\n{_normalise(path.read_text())}")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated case names (and the cases they need)")
    ap.add_argument("--show", help="print this case's normalised output instead of its hash")
    args = ap.parse_args(argv)
    names = list(CASES)
    if args.only or args.show:
        wanted = set((args.only or args.show).split(","))
        wanted |= {NEEDS[n] for n in wanted if n in NEEDS}
        names = [n for n in names if n in wanted]
    written: dict[str, Path] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            text = run_case(name, Path(tmp), written)
            if args.show == name:
                sys.stdout.write(text + "\n")
            elif not args.show:
                print(f"{name:32s} {hashlib.sha256(text.encode()).hexdigest()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
