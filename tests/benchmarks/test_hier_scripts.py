"""The composed prediction's benchmark scripts (issue 43): hier_equality counts what it compares,
bench_reference_stages gives the same answer under both rules, and hier_layer_steps reads unit
blocks that grow by one step a layer (what a reference of fewer layers would rely on)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_hier_equality_counts_every_layout(monkeypatch):
    monkeypatch.chdir(ROOT)  # (the generator is read from the tree it runs in)
    import hier_equality

    r = hier_equality.run(0, 6)
    assert r["built"] == 6 and r["exact"] + r["refused"] == 6 and r["exact"] >= 2
    assert r["differ"] == [] and sum(r["reference"].values()) == r["exact"]


def test_reference_stage_rules_agree(capsys):
    import bench_reference_stages

    assert bench_reference_stages.main(["--only", "8", "--rounds", "1"]) == 0  # (1T on 512 GPUs)
    out = capsys.readouterr().out
    assert "4 x 6" in out and "3 x 5" in out and "| yes |" in out


def test_unit_blocks_grow_by_one_step_a_layer():
    from engine.cluster import preset
    from engine.formats import resolve_model
    from engine.layout import Layout
    from hier_layer_steps import check_at, units_at

    g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:3")
    lay = Layout.from_options(dict(tp=4, pp=3, dp=2, micro_batch=1))
    u = [units_at(g, c, lay, k)[0] for k in (1, 2, 3)]
    assert u[0].keys() == u[1].keys() == u[2].keys()
    alike = 0
    for t in u[0]:
        a, b, d = (x[t].coef for x in u)
        if a.shape != b.shape or b.shape != d.shape:
            continue  # (a last backward: each layer's gradient collectives are its entries and exits)
        fin = np.isfinite(a)
        assert np.array_equal(fin, np.isfinite(d))
        assert np.allclose(b[fin] - a[fin], d[fin] - b[fin], rtol=0, atol=1e-12)
        assert np.all(b[fin] > a[fin])
        alike += 1
    assert alike == len(u[0]) - 3  # (every unit but the 3 last backwards)
    assert check_at(g, c, lay, 4, {1: u[0], 2: u[1]}) == 0  # (four layers a stage: the block extrapolated)


def test_layer_block_predicts_the_first_stages_forwards():
    """hier_layer_block: a forward unit of the first stage, for a stage of 4 layers, from the
    layer block read between two cuts of a 3-layer reference (equal to its own 4-layer read)."""
    from engine.cluster import preset
    from engine.formats import resolve_model
    from engine.layout import Layout
    from hier_layer_block import predict, reference

    g, c = resolve_model("gpt2", batch=24), preset("dgx-a100-80gb:3")
    lay = Layout.from_options(dict(tp=4, pp=3, dp=2, micro_batch=1))
    r3, r4 = reference(g, c, lay, 3), reference(g, c, lay, 4)
    exact = 0
    for u in (0, 2, 4):  # (the first stage's forwards of its first microbatches)
        got = predict(r3, u, 4)
        assert not isinstance(got, str), got
        real = r4["units"][u].coef
        fin = np.isfinite(real)
        assert np.array_equal(fin, np.isfinite(got[0]))
        exact += bool(np.abs(got[0][fin] - real[fin]).max() <= 1e-12)
    assert exact == 3


def test_hier_equality_reads_the_uneven_generator(monkeypatch):
    monkeypatch.chdir(ROOT)
    import hier_equality

    r = hier_equality.run(0, 3, hier_equality.TU)
    assert r["built"] == 3 and r["exact"] + r["refused"] == 3 and r["differ"] == []


def test_bench_uneven_compares_both_ways():
    """bench_uneven's measurement of one point (GPT-2's 12 layers on 8 stages of 8 GPUs: 1, 1, 1,
    2, 2, 2, 2, 1): composed from four stages, the same answer as the full simulation."""
    import bench_uneven

    pt = {"cluster": "dgx-a100-80gb:8", "tp": 4, "pp": 8, "cp": 1, "mb": 1, "recompute": "selective", "zero": 1,
          "sp": True}
    r = bench_uneven.measure("gpt2", pt, composed_first=True, batch=64)
    assert "refused" not in r, r.get("refused")
    assert r["how"].startswith("composed from a reference of 4 stages")
    assert r["time_err"] <= 1e-9 and r["memory_err"] <= 1e-9 and r["full_s"] > 0 and r["composed_s"] > 0


def test_the_cp_grid_is_the_surveyed_one():
    """hier_cp_grid's layouts: cp 2 or 4 on 512 and 1,024 GPUs, every GPU used, at least pp
    microbatches, Megatron-LM's settings; 217 of them (as its docstring says)."""
    import hier_cp_grid

    grid = hier_cp_grid.layouts()
    assert len(grid) == 217
    for cl, o in grid:
        gpus = int(cl.split(":")[1]) * 8
        assert o["cp"] in (2, 4) and o["tp"] * o["cp"] * o["pp"] * o["dp"] == gpus
        assert 1536 // (o["dp"] * o["micro_batch"]) >= o["pp"] and 1536 % (o["dp"] * o["micro_batch"]) == 0
        assert (o["zero_stage"], o["recompute"], o["sequence_parallel"]) == (1, "selective", True)
