"""Issue 15: sweeps of layouts x cluster sizes on one process, a process pool and Ray (local
mode): the same table on each; infeasible points kept with the reason; the Pareto front."""

from __future__ import annotations

import csv
import json

import pytest

from engine.cli import main
from engine.studies.sweep import pareto, parse_clusters, parse_grid, points, run_sweep

GRID = parse_grid(["tp=1,2,4", "pp=1,2", "mb=1,2"])
CLUSTERS = parse_clusters("dgx-a100-80gb:1,2")
PTS = points(GRID, CLUSTERS)  # 3 x 2 x 2 x 2 = 24


def test_grid_and_clusters():
    assert len(PTS) == 24 and PTS[0] == {"cluster": "dgx-a100-80gb:1", "mb": 1, "pp": 1, "tp": 1}
    assert parse_clusters("dgx-a100-80gb:4,8 p100-4x4") == ["dgx-a100-80gb:4", "dgx-a100-80gb:8", "p100-4x4"]
    for bad in (["tp"], ["tp=a"], ["xx=1"], ["tp=0"], ["recompute=some"], ["tp=1", "tp=2"]):
        with pytest.raises(ValueError):
            parse_grid(bad)
    with pytest.raises(ValueError, match="whole numbers"):
        parse_clusters("dgx-a100-80gb:x")


@pytest.fixture(scope="module")
def serial_rows():
    return run_sweep("gpt2", PTS, backend="serial", batch=32)


def test_rows_say_why_a_point_is_infeasible(serial_rows):
    assert len(serial_rows) == 24
    assert [(r["cluster"], r["tp"], r["pp"], r["mb"]) for r in serial_rows] == \
        [(p["cluster"], p["tp"], p["pp"], p["mb"]) for p in PTS]
    ok = [r for r in serial_rows if r["feasible"]]
    assert ok and all(r["iteration_time_s"] > 0 and r["throughput_per_s"] > 0 for r in ok)
    assert all(r["why"] for r in serial_rows if not r["feasible"])
    assert all(r["tp"] * r["pp"] * r["dp"] == r["gpus"] for r in ok)
    front = pareto(serial_rows)
    assert front and all(f in ok for f in front)
    for f in front:  # nothing feasible beats a front point on all three
        assert not any(o["iteration_time_s"] < f["iteration_time_s"] and o["gpus"] <= f["gpus"] and
                       o["peak_memory_bytes"] <= f["peak_memory_bytes"] for o in ok)


def test_pool_gives_the_same_table(serial_rows):
    assert run_sweep("gpt2", PTS, backend="pool", workers=2, batch=32) == serial_rows


def test_ray_local_mode_gives_the_same_table(serial_rows):
    assert run_sweep("gpt2", PTS, backend="ray", workers=2, batch=32) == serial_rows


def test_cli_writes_csv_json_and_report(tmp_path, capsys):
    out, rep = tmp_path / "r.csv", tmp_path / "r.html"
    assert main(["sweep", "--model", "gpt2", "--batch", "32", "--grid", "tp=1,2", "pp=1,2", "--clusters",
                 "dgx-a100-80gb:1", "--backend", "serial", "-o", str(out), "--report", str(rep)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 4 and rows[0]["cluster"] == "dgx-a100-80gb:1"
    assert "Pareto front" in rep.read_text()
    assert "4 layouts" in capsys.readouterr().out
    js = tmp_path / "r.json"
    assert main(["sweep", "--model", "gpt2", "--batch", "32", "--grid", "tp=3", "--clusters", "dgx-a100-80gb:1",
                 "--backend", "serial", "-o", str(js)]) == 0
    row = json.loads(js.read_text())["rows"][0]
    assert row["feasible"] is False and "does not divide the 8 devices" in row["why"]


def test_a_point_sure_not_to_fit_is_not_simulated_unless_asked():
    """GPT-3 175B on one DGX A100 node, tp 8 pp 1 (a pipeline the composed prediction does not
    take): its weights, gradients and Adam state alone are over 80 GiB a GPU. The row says so,
    with the floor, and no time; with ``time_all`` it is simulated, and does not fit either,
    with more memory than the floor under it."""
    from engine.studies.sweep import evaluate

    pt = {"cluster": "dgx-a100-80gb:1", "tp": 8, "pp": 1, "mb": 1}
    row = evaluate("gpt3-175b", pt, 8)
    assert row["feasible"] is False and row["iteration_time_s"] is None and row["peak_memory_bytes"] is None
    assert row["predicted_by"] == "memory floor (not simulated)" and row["dp"] == 1
    assert row["why"].startswith("does not fit in memory: GPU ") and "needs at least" in row["why"]
    timed = evaluate("gpt3-175b", pt, 8, time_all=True)
    assert timed["feasible"] is False and timed["iteration_time_s"] > 0 and timed["memory_floor_bytes"] is None
    assert timed["peak_memory_bytes"] >= row["memory_floor_bytes"]
    assert run_sweep("gpt3-175b", [pt], backend="serial", batch=8, time_all=True) == [timed]


class TestSmallestFit:
    """The smallest cluster on which a layout fits (issue 16: what comparable tools show)."""

    def test_stops_at_the_first_fit_and_says_why_before(self):
        from engine.cluster import preset
        from engine.formats import resolve_model
        from engine.studies.sweep import smallest_fit

        g = resolve_model("gpt2")
        sizes = [preset(f"dgx-a100-80gb:{n}") for n in (1, 2, 4)]
        rows = smallest_fit(g, "megatron", {"tp": 4, "pp": 4, "micro_batch": 1}, sizes)
        assert [r["cluster"] for r in rows] == ["dgx-a100-80gb:1", "dgx-a100-80gb:2"]
        assert rows[0]["feasible"] is False and "divide" in rows[0]["why"] and rows[0]["peak_memory_bytes"] is None
        assert rows[1]["feasible"] is True and rows[1]["why"] is None and rows[1]["gpus"] == 16
        assert 0 < rows[1]["peak_memory_bytes"] <= rows[1]["capacity_bytes"] and rows[1]["iteration_time_s"] > 0

    def test_fsdp_memory_halves_as_the_data_parallel_degree_doubles(self):
        """ZeRO-3 shards weights, gradients and optimizer state over dp, and each GPU holds
        batch/dp samples' activations: with nothing else on a GPU, doubling the GPUs halves it.
        Each size is sure not to fit by its memory floor (engine.sim.memory_floor), so none is
        simulated: the floor halves."""
        from engine.cluster import preset
        from engine.formats import resolve_model
        from engine.studies.sweep import smallest_fit

        g = resolve_model("llama2-7b")
        seen = []
        rows = smallest_fit(g, "fsdp", {"recompute": "none"}, [preset(f"dgx-a100-80gb:{n}") for n in (1, 2, 4)],
                            progress=seen.append)
        assert seen == rows and len(rows) == 3 and not any(r["feasible"] for r in rows)
        assert all(r["peak_memory_bytes"] is None and r["iteration_time_s"] is None for r in rows)
        p = [r["memory_floor_bytes"] for r in rows]
        assert p[1] / p[0] == pytest.approx(0.5, rel=0.01) and p[2] / p[1] == pytest.approx(0.5, rel=0.01)
        assert all(r["why"].startswith("does not fit in memory: GPU ") for r in rows)
        # stop() ends the scan before the next size
        assert smallest_fit(g, "fsdp", {}, [preset("dgx-a100-80gb:1")], stop=lambda: True) == []


def test_rows_composed_where_exact_equal_the_full_simulation():
    """Issue 43: a row of a pipeline longer than the reference keeps (engine.sim.hier) says it
    was composed and holds the full simulation's figures; one it refuses is simulated and says
    why; a short pipeline is simulated whole."""
    from engine.cluster import preset
    from engine.formats import resolve_model
    from engine.layout import Layout
    from engine.layout.build import build_layout
    from engine.sim.report import simulate_strategy

    rows = run_sweep("gpt2", points(parse_grid(["tp=1,2", "pp=2,6", "mb=1"]), parse_clusters("dgx-a100-80gb:3,6")),
                     backend="serial", batch=48)
    composed = [r for r in rows if r["predicted_by"] == "composed"]
    assert len(composed) >= 3 and all(r["pp"] == 6 for r in composed)
    assert all(r["predicted_by"] == "composed" or r["predicted_by"].startswith("simulated (")
               for r in rows if r["iteration_time_s"] is not None)
    g = resolve_model("gpt2", batch=48)
    for r in composed:
        c = preset(r["cluster"])
        s = build_layout(g, c, Layout.from_options(dict(tp=r["tp"], pp=r["pp"], micro_batch=r["mb"])))
        full = simulate_strategy(g, s, c, check=False)
        assert r["iteration_time_s"] == pytest.approx(full.iteration_time_s, rel=1e-9)
        assert r["peak_memory_bytes"] == pytest.approx(float(full.memory.peak_bytes.max()), rel=1e-9)


def test_training_front_by_hand():
    """Days and GPU-hours for 1e9 tokens: 8 GPUs at 1e4 tokens/s take 1e5 s (1.157 days, 222.2
    GPU-hours); 16 GPUs at 1.5e4 take 66,667 s (0.772 days, 296.3 GPU-hours): both on the front;
    16 GPUs at 1e4 is beaten by the first on both, and an infeasible row is never on it."""
    from engine.studies.sweep import training_front

    rows = [dict(cluster="a:1", gpus=8, feasible=True, throughput_per_s=1e4),
            dict(cluster="a:2", gpus=16, feasible=True, throughput_per_s=1.5e4),
            dict(cluster="a:2", gpus=16, feasible=True, throughput_per_s=1e4),
            dict(cluster="a:4", gpus=32, feasible=False, throughput_per_s=1e6)]
    front = training_front(rows, 1e9)
    assert [(r["gpus"], r["throughput_per_s"]) for r in front] == [(16, 1.5e4), (8, 1e4)]
    assert front[1]["days"] == pytest.approx(1e5 / 86400) and front[1]["gpu_hours"] == pytest.approx(8e5 / 3600)
    assert front[0]["days"] == pytest.approx(1e9 / 1.5e4 / 86400)
    assert front[0]["gpu_hours"] == pytest.approx(1e9 / 1.5e4 / 3600 * 16)


def test_report_prices_a_training_run(tmp_path, serial_rows):
    from engine.studies.sweep_files import write_report

    out = tmp_path / "r.html"
    write_report(serial_rows, str(out), "gpt2", tokens=1e9)
    html = out.read_text()
    assert "days against GPU-hours for 1e+09 tokens" in html and "per GPU by GPUs" in html  # (JSON escapes the slash)


# ---------------------------------------------------------------- bad input, caught before the work
# (found by fuzzing the command line, 2026-12-01: each ran the whole sweep, or forked or built
# without bound, before saying no)


def test_output_paths_are_checked_before_the_sweep(tmp_path, monkeypatch, capsys):
    """A wrong extension, a folder, or a report that is not HTML: refused before any point runs."""
    import engine.studies.sweep as SW
    import engine.studies.sweep_files as SF

    ran = []
    monkeypatch.setattr(SW, "run_sweep", lambda *a, **k: ran.append(1) or [])
    (tmp_path / "a.csv").mkdir()
    args = ["sweep", "--model", "gpt2", "--batch", "32", "--grid", "tp=1", "--clusters", "dgx-a100-80gb:1",
            "--backend", "serial"]
    for out, report, says in ((tmp_path / "late.txt", None, "write .csv, .json or .parquet"),
                              (tmp_path / "a.csv", None, "is a folder"),
                              (tmp_path / "ok.csv", tmp_path / "r.txt", "write .html or .htm")):
        assert main(args + ["-o", str(out)] + (["--report", str(report)] if report else [])) == 2
        assert says in capsys.readouterr().err
    assert not ran
    with pytest.raises(ValueError, match="is a file, not a folder"):
        (tmp_path / "f").write_text("x")
        SF.check_output(str(tmp_path / "f" / "x.csv"), (".csv",), "-o")


def test_parquet_into_new_folders(tmp_path):
    pytest.importorskip("pyarrow")
    from engine.studies.sweep_files import write_rows

    out = tmp_path / "new" / "deep" / "r.parquet"
    write_rows([{"cluster": "a", "gpus": 8}], str(out))
    assert out.stat().st_size > 0 and not [p for p in out.parent.iterdir() if p.name.endswith(".tmp")]


def test_the_grid_is_counted_before_it_is_made():
    """Three keys of 400 values on one cluster: 64 M points, refused without making them."""
    many = ",".join(str(i) for i in range(1, 401))
    with pytest.raises(ValueError, match="64,000,000 points"):
        points(parse_grid([f"tp={many}", f"pp={many}", f"cp={many}"]), ["dgx-a100-80gb:1"])
    with pytest.raises(ValueError, match="stands alone"):
        parse_grid(["auto", "tp=1"])


def test_clusters_are_capped_and_their_networks_read_first():
    from engine.studies.sweep import MAX_CLUSTERS, sweep_points

    with pytest.raises(ValueError, match=f"more than the {MAX_CLUSTERS}"):
        parse_clusters("dgx-h100:" + ",".join(str(i) for i in range(1, MAX_CLUSTERS + 2)))
    for bad, says in (("dgx-h100:1+nics=abc", "NICs a node"), ("dgx-h100:1+foo=3", "not a network key"),
                      ("dgx-h100:1+", "not KEY=VALUE")):
        with pytest.raises(ValueError, match=says):
            sweep_points("gpt2", ["tp=1"], bad, batch=32)


def test_workers_at_most_one_a_task(monkeypatch):
    """--workers 3000 on one point starts one process (a pool starts all it is given at once)."""
    import engine.search.processes as P

    seen = []

    class Spy(P.Backend):
        def __init__(self, name, context=None, workers=None, address=None, **kw):
            seen.append(workers)
            super().__init__("serial", context=context, workers=workers, address=address, **kw)

    monkeypatch.setattr(P, "Backend", Spy)
    rows = run_sweep("gpt2", PTS[:1], backend="pool", workers=3000, batch=32)
    assert len(rows) == 1 and seen == [1]


def test_sequence_length_and_precision_reach_the_rows(tmp_path):
    """--seq-len and --model-precision make the model as `soapbox simulate` does (they were
    dropped: every row was the default model's)."""
    def time_of(*extra):
        out = tmp_path / "r.csv"
        assert main(["sweep", "--model", "gpt2", "--batch", "32", "--grid", "tp=1", "--clusters", "dgx-h100:1",
                     "--backend", "serial", "-o", str(out), *extra]) == 0
        return float(next(csv.DictReader(out.open()))["iteration_time_s"])

    default, short, half = time_of(), time_of("--seq-len", "512"), time_of("--model-precision", "bf16")
    assert short < default and half < default
    # (the workers get the model by name, as pickled: a graph does not pickle)
    from engine.studies.sweep import ModelRef

    ref = ModelRef("gpt2", seq_len=512)
    assert run_sweep(ref, PTS[:2], backend="pool", workers=2, batch=32) == \
        run_sweep(ref, PTS[:2], backend="serial", batch=32)
    with pytest.raises(SystemExit):  # (argparse: a sweep compares cluster sizes at one batch)
        main(["sweep", "--model", "gpt2", "--grid", "tp=1", "--clusters", "dgx-h100:1", "--batch-per-gpu", "4",
              "-o", str(tmp_path / "x.csv")])


def test_a_report_of_samples_says_samples(tmp_path):
    rep = tmp_path / "r.html"
    assert main(["sweep", "--model", "alexnet", "--grid", "tp=1", "--clusters", "dgx-h100:1", "--backend", "serial",
                 "-o", str(tmp_path / "r.csv"), "--report", str(rep)]) == 0
    html = rep.read_text()
    assert "samples\\u002fs per GPU" in html and "tokens\\u002fs" not in html
