"""An interrupted ``soapbox search`` (Ctrl-C, SIGTERM) writes the best strategy found so far to
``-o`` (issue 28: it exited cleanly but wrote nothing). The interruption is raised in process
from the progress consumer, where a real signal's exception would surface."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import engine.cli.search as cli_search
from engine.cli import main
from engine.cli.common import Terminated
from engine.cluster import preset
from engine.formats import load_strategy, resolve_model
from engine.search.api import price

ARGS = ["search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc", "--budget", "100000",
        "--seed", "3"]


def interrupt_after(rows: int, exc: type[BaseException], seen: list):
    """A progress bar that raises ``exc`` at its ``rows``-th row (keeping the rows it saw)."""
    def make(budget):
        def show(p):
            seen.append(p)
            if len(seen) >= rows:
                raise exc()
        return show
    return make


@pytest.fixture()
def bar(monkeypatch):
    monkeypatch.setenv("SOAPBOX_PROGRESS", "1")

    def install(rows, exc):
        seen: list = []
        monkeypatch.setattr(cli_search, "_progress_bar", interrupt_after(rows, exc, seen))
        return seen
    return install


@pytest.mark.parametrize("exc, status, how", [(KeyboardInterrupt, 130, "interrupted"), (Terminated, 143, "terminated")])
def test_writes_the_best_so_far(bar, tmp_path, capsys, exc, status, how):
    seen = bar(30, exc)
    out = tmp_path / "best.json"
    assert main(ARGS + ["-o", str(out)]) == status
    err = capsys.readouterr().err.strip().split("\n")[-1]
    best_cost_s = min(p.best_cost_s for p in seen if p.best is not None)
    assert math.isfinite(best_cost_s)
    assert err.startswith(f"soapbox: {how}: wrote the best strategy found so far ({best_cost_s * 1e3:.3f} ms")
    assert err.endswith(f"to {out}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json"]  # (atomic: no temporary file left)
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    s = load_strategy(str(out), g, c)
    assert s.found_by["interrupted"] is True and s.found_by["algorithm"] == "mcmc"
    assert s.cost["iteration_time_s"] == pytest.approx(best_cost_s, rel=1e-12)
    p = price(g, s, c)  # what was written is what the search priced
    assert p.feasible and p.time_s == pytest.approx(best_cost_s, rel=1e-9)


def test_the_best_written_is_the_best_of_the_rows_not_the_last(bar, tmp_path, capsys):
    seen = bar(60, KeyboardInterrupt)
    out = tmp_path / "best.json"
    assert main(ARGS + ["-o", str(out)]) == 130
    s = load_strategy(str(out), resolve_model("alexnet"), preset("p100-4x4"))
    assert s.cost["iteration_time_s"] == min(p.best_cost_s for p in seen)
    assert s.found_by["proposals"] <= seen[-1].iteration


def test_nothing_found_yet_writes_nothing_and_says_so(monkeypatch, tmp_path, capsys):
    def interrupted_at_once(graph, cluster, budget, **kwargs):
        raise KeyboardInterrupt()

    import engine.search.mcmc

    monkeypatch.setattr(engine.search.mcmc, "mcmc", interrupted_at_once)
    out = tmp_path / "best.json"
    assert main(ARGS + ["-o", str(out), "--quiet"]) == 130
    assert capsys.readouterr().err == (f"soapbox: interrupted: nothing written to {out} (no strategy found so far "
                                       "fits in memory)\n")
    assert not out.exists()


def test_without_output_the_interruption_is_as_before(bar, capsys):
    bar(3, KeyboardInterrupt)
    assert main(ARGS) == 130
    assert capsys.readouterr().err.endswith("soapbox: interrupted\n")


def test_a_real_ctrl_c_after_the_first_progress_row(tmp_path):
    """End to end: SIGINT to a running ``soapbox search`` once its progress bar has drawn."""
    import os
    import signal
    import subprocess
    import sys

    out = tmp_path / "best.json"
    env = dict(os.environ, SOAPBOX_PROGRESS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    # Ctrl-C as a terminal's foreground job gets it: a test run started in the background by a
    # shell without job control has SIGINT ignored, a child inherits that, and Python then
    # installs no KeyboardInterrupt handler (as a shell intends for its background jobs)
    child = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             f"sys.argv = ['soapbox', *{[*ARGS, '--budget', '10m', '-o', str(out)]!r}]; "
             "runpy.run_module('engine.cli', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", child], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            env=env, text=True)
    try:
        seen = ""
        while "proposals" not in seen:
            ch = proc.stderr.read(1)
            assert ch, f"the search ended before its first progress row: {seen!r}"
            seen += ch
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "soapbox: interrupted: wrote the best strategy found so far (" in err
    assert load_strategy(str(out), resolve_model("alexnet"), preset("p100-4x4")).found_by["interrupted"] is True
