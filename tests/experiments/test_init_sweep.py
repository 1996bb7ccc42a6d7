"""Parallel random initialisation (issue 28 item 6): the halving schedule, the selection rule,
equal compute across the arms, determinism for a seed, and the ``init-sweep`` command."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from engine.cli.init_sweep import parse_seeds
from engine.experiments.init_sweep import (ARMS, InitSweepConfig, Phase, halving_schedule, run_experiment, select,
    split_budget, spiral, summarise)
from toys import run_cli  # tests/toys.py

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="init-sweep trains with PyTorch, which is not installed")

#: a tiny run: seconds on one core
TINY = InitSweepConfig(inits=4, budget_steps=60, target_loss=0.6, hidden=(8,), points_per_class=20)


# --------------------------------------------------------------------------- halving_schedule

class TestHalvingSchedule:
    def test_exact_small_case(self):
        # 8 sampled, 4 kept, 4 perturbed and scored, one rung of 4 x 2 steps, 2 share the 80 left
        assert halving_schedule(8, 100, eta=2, keep=2, rung_steps=2) == [
            Phase("sample", 8, 1, 4), Phase("narrow", 4, 1, 4), Phase("rung", 4, 2, 2), Phase("final", 2, 40, 2)]

    def test_rungs_halve_and_steps_multiply_by_eta(self):
        phases = halving_schedule(32, 10_000, eta=2, keep=1, rung_steps=3)
        rungs = [p for p in phases if p.name == "rung"]
        assert [(p.members, p.steps, p.survivors) for p in rungs] == [(16, 3, 8), (8, 6, 4), (4, 12, 2), (2, 24, 1)]
        assert phases[-1] == Phase("final", 1, 10_000 - 32 - 16 - 4 * (16 * 3), 1)

    def test_eta_three_rounds_up(self):
        phases = halving_schedule(10, 1000, eta=3, keep=1, rung_steps=1)
        assert [(p.name, p.members, p.survivors) for p in phases] == [
            ("sample", 10, 4), ("narrow", 6, 4), ("rung", 4, 2), ("rung", 2, 1), ("final", 1, 1)]

    @pytest.mark.parametrize("inits,budget,eta,keep,narrow", [
        (1, 5, 2, 2, True), (2, 9, 2, 2, True), (7, 101, 2, 2, True), (16, 2000, 2, 2, True), (16, 2000, 4, 1, False),
        (33, 1999, 3, 3, True), (64, 5000, 2, 5, False)])
    def test_budget_is_spent_exactly(self, inits, budget, eta, keep, narrow):
        phases = halving_schedule(inits, budget, eta=eta, keep=keep, narrow=narrow)
        final = phases[-1]
        left = budget - sum(p.cost_steps for p in phases[:-1])
        assert sum(split_budget(left, final.members)) == left
        assert sum(p.cost_steps for p in phases) + left % final.members == budget
        assert final.members == min(keep, inits) and final.steps >= 1

    def test_no_narrowing_leaves_the_phase_out(self):
        assert [p.name for p in halving_schedule(8, 100, rung_steps=2, narrow=False)] == ["sample", "rung", "final"]

    def test_one_init_is_one_score_then_training(self):
        assert halving_schedule(1, 10) == [Phase("sample", 1, 1, 1), Phase("final", 1, 9, 1)]

    def test_a_budget_too_small_says_what_it_needs(self):
        with pytest.raises(ValueError, match=r"budget of 10 steps cannot pay for 8 inits.*needs at least 22"):
            halving_schedule(8, 10, rung_steps=2)


class TestSplitBudget:
    def test_equal_shares_remainder_first(self):
        assert split_budget(10, 4) == [3, 3, 2, 2]
        assert split_budget(8, 4) == [2, 2, 2, 2]

    def test_too_few_steps(self):
        with pytest.raises(ValueError, match="3 steps cannot give each of 4 runs one step"):
            split_budget(3, 4)


class TestSelect:
    def test_rank_sum_of_loss_and_gradient(self):
        # loss ranks [2, 0, 3, 1]; gradient ranks (largest first) [0, 3, 2, 1]; sums [2, 3, 5, 2]
        assert select([0.5, 0.4, 0.9, 0.4], [2.0, 0.1, 0.5, 1.0], 2) == [3, 0]

    def test_loss_alone(self):
        assert select([0.5, 0.4, 0.9, 0.4], [2.0, 0.1, 0.5, 1.0], 3, grad_weight=0.0) == [1, 3, 0]

    def test_nan_loss_ranks_last(self):
        assert select([math.nan, 1.0, 2.0], [9.0, 0.0, 0.0], 3, grad_weight=0.0) == [1, 2, 0]

    def test_ties_go_to_the_lower_index(self):
        assert select([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], 2) == [0, 1]


class TestConfig:
    @pytest.mark.parametrize("field,value,words", [
        ("inits", 0, "inits must be at least 1, got 0"), ("target_loss", 0.0, "target_loss must be a number above 0"),
        ("target_loss", -1.0, "target_loss"), ("target_loss", math.nan, "target_loss"), ("eta", 1, "eta"),
        ("budget_steps", 0, "budget_steps")])
    def test_bad_values_one_line(self, field, value, words):
        with pytest.raises(ValueError, match=words) as e:
            InitSweepConfig(**{field: value})
        assert "\n" not in str(e.value)

    def test_spiral_shape_and_labels(self):
        x, y = spiral(3, 5, 0.2, 0)
        assert x.shape == (15, 2) and y.tolist() == [0] * 5 + [1] * 5 + [2] * 5


# --------------------------------------------------------------------------- the experiment

@needs_torch
class TestExperiment:
    @pytest.fixture(scope="class")
    def rows(self):
        return run_experiment(TINY, [0, 1], workers=1)

    def test_every_arm_spends_the_same_compute(self, rows):
        assert {r["compute_examples"] for r in rows} == {TINY.budget_steps * TINY.examples}
        assert [r["arm"] for r in rows] == list(ARMS) * 2

    def test_sequential_steps_follow_the_parallelism(self, rows):
        depth = {r["arm"]: r["sequential_steps"] for r in rows if r["seed"] == 0}
        assert depth["single"] == TINY.budget_steps and depth["independent"] == TINY.budget_steps // TINY.inits
        assert depth["independent"] < depth["sweep"] < depth["single"]

    def test_hits_are_within_the_budget(self, rows):
        for r in rows:
            if r["compute_to_target_examples"] is not None:
                assert 0 < r["compute_to_target_examples"] <= r["compute_examples"]
                assert 0 < r["steps_to_target"] <= r["sequential_steps"]
                assert r["compute_to_target_examples"] % TINY.examples == 0

    def test_same_seed_same_rows_serial_and_on_the_pool(self, rows):
        again = run_experiment(TINY, [1], workers=2)
        strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in rows if r["seed"] == 1]
        assert [{k: v for k, v in r.items() if k != "wall_s"} for r in again] == strip

    def test_ray_gives_the_same_rows_as_the_pool(self, rows):
        """Issue 28: the members on Ray (a local Ray of 2 CPUs, as ``soapbox sweep``'s test) give
        the pool's numbers, seed for seed."""
        pytest.importorskip("ray", reason="Ray is a test extra (pip install soapbox[test])")
        on_ray = run_experiment(TINY, [1], workers=2, backend="ray")
        strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in rows if r["seed"] == 1]
        assert [{k: v for k, v in r.items() if k != "wall_s"} for r in on_ray] == strip

    def test_the_curve_reaches_the_target_where_the_row_says(self, rows):
        with_curve = run_experiment(TINY, [0], workers=1, curve_points=TINY.budget_steps)  # (a point per step)
        for r, plain in zip(with_curve, rows):
            assert {k: v for k, v in r.items() if k not in ("wall_s", "curve")} == \
                {k: v for k, v in plain.items() if k != "wall_s"}  # (recording the curve changes nothing)
            x, y = r["curve"]["compute_examples"], r["curve"]["best_loss"]
            assert x == [float(k * TINY.examples) for k in range(1, TINY.budget_steps + 1)]
            known = [v for v in y if v is not None]
            assert known == sorted(known, reverse=True) and y[-1] is not None  # the lowest loss so far
            hit = next((xi for xi, yi in zip(x, y) if yi is not None and yi <= TINY.target_loss), None)
            assert hit == r["compute_to_target_examples"], r["arm"]
        assert with_curve[2]["curve"]["best_loss"][0] is not None  # (one run: a loss after its first step)
        assert with_curve[0]["curve"]["best_loss"][0] is None  # (the sweep: 4 inits scored cost 4 steps)

    def test_without_ray_the_ray_backend_is_one_line(self, monkeypatch, capsys):
        monkeypatch.setitem(__import__("sys").modules, "ray", None)  # (import ray raises ImportError)
        with pytest.raises(ValueError, match=r"^--backend ray needs Ray: pip install ray$"):
            run_experiment(TINY, [0], backend="ray")
        rc, out, err = run_cli(capsys, "init-sweep", "--backend", "ray", "--seeds", "0", "--inits", "4",
                               "--budget-steps", "60")
        assert (rc, out, err) == (2, "", "soapbox: error: --backend ray needs Ray: pip install ray\n")

    def test_bad_backend_and_curve_points(self):
        with pytest.raises(ValueError, match="backend must be pool or ray, got 'dask'"):
            run_experiment(TINY, [0], backend="dask")
        with pytest.raises(ValueError, match="curve_points must be 0 to 100,000, got -1"):
            run_experiment(TINY, [0], curve_points=-1)

    def test_another_seed_differs(self, rows):
        assert rows[0]["final_loss"] != rows[3]["final_loss"]

    def test_training_lowers_the_loss(self, rows):
        from engine.experiments.init_sweep import run_member

        r = run_member({"cfg": TINY, "init_seed": 3, "steps": 30})
        assert r["losses"].shape == (30,) and r["final_loss"] < r["losses"][0]

    def test_premise_scores_the_sweeps_own_inits(self, rows):
        from engine.experiments.init_sweep import premise

        check = premise(TINY, 0, workers=1)
        assert len(check["steps_to_target"]) == TINY.inits
        assert all(1 <= s <= TINY.budget_steps + 1 for s in check["steps_to_target"])
        assert all(-1.0 <= check[k] <= 1.0 or math.isnan(check[k]) for k in ("rho_loss", "rho_minus_grad"))
        assert check == premise(TINY, 0, workers=1)

    def test_summary_medians(self, rows):
        s = {x["arm"]: x for x in summarise(rows)}
        finals = sorted(r["final_loss"] for r in rows if r["arm"] == "single")
        assert s["single"]["seeds"] == 2 and s["single"]["final_loss"] == {
            "median": (finals[0] + finals[1]) / 2, "min": finals[0], "max": finals[1]}


# --------------------------------------------------------------------------- the command

class TestCommand:
    @needs_torch
    def test_tiny_run_table_and_json(self, capsys, tmp_path):
        out_file = tmp_path / "r.json"
        argv = ["init-sweep", "--inits", "4", "--seeds", "0,1", "--workers", "1", "--budget-steps", "60",
                "--target-loss", "0.9"]
        rc, out, err = run_cli(capsys, *argv, "-o", str(out_file))
        assert rc == 0, err
        lines = out.splitlines()
        assert lines[0].startswith("init-sweep: 4 inits, 60 steps x 300 examples per arm")
        assert [ln.split()[0] for ln in lines[2:5]] == list(ARMS)
        doc = json.loads(out_file.read_text())
        assert doc["format"] == "soapbox.init-sweep/1" and len(doc["rows"]) == 6 and doc["seeds"] == [0, 1]
        rc, out2, _ = run_cli(capsys, *argv, "--json")
        again = json.loads(out2)
        assert rc == 0 and [r["final_loss"] for r in again["rows"]] == [r["final_loss"] for r in doc["rows"]]

    @pytest.mark.parametrize("flag,value,message", [
        ("--inits", "0", "soapbox: error: init-sweep: inits must be at least 1, got 0\n"),
        ("--target-loss", "0", "soapbox: error: init-sweep: target_loss must be a number above 0, got 0.0\n"),
        ("--target-loss", "-2", "soapbox: error: init-sweep: target_loss must be a number above 0, got -2.0\n"),
        ("--seeds", "a,b", "soapbox: error: --seeds: 'a,b' is not a list of whole numbers (e.g. 0,1,2 or 0-4)\n"),
        ("--address", "auto", "soapbox: error: --address is a Ray cluster's: give --backend ray with it\n"),
        ("--budget-steps", "5", "soapbox: error: init-sweep: a budget of 5 steps cannot pay for 16 inits' scoring "
                                "and halving (needs at least"),
    ])
    def test_bad_input_is_one_line(self, capsys, flag, value, message):
        rc, out, err = run_cli(capsys, "init-sweep", flag, value, "--workers", "1")
        assert (rc, out) == (2, "") and err.startswith(message) and err.count("\n") == 1


class TestTally:
    def test_hand_computed_phase(self):
        """Two members in lockstep for 3 and 2 steps, after 10 steps spent: the lowest loss per
        step is 0.8, 0.6, 0.4 after 12, 14, 15 steps' compute; the target 0.5 is first met at 15."""
        from engine.experiments.init_sweep import _Tally

        cfg = InitSweepConfig(inits=2, budget_steps=20, target_loss=0.5, points_per_class=1)  # 3 examples a step
        t = _Tally(cfg)
        t.phase([{"losses": [1.0] * 10}], [10])
        t.phase([{"losses": [0.9, 0.6, 0.4]}, {"losses": [0.8, float("nan")]}], [3, 2])
        assert t.hit == (15 * 3, 10 + 3) and (t.compute_steps, t.depth) == (15, 13)
        c = t.curve(4)  # at 5, 10, 15, 20 steps' compute
        assert c == {"compute_examples": [15.0, 30.0, 45.0, 60.0], "best_loss": [1.0, 1.0, 0.4, 0.4]}


def test_parse_seeds():
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4] and parse_seeds(" 3 , 1") == [3, 1]
    with pytest.raises(ValueError, match="--seeds"):
        parse_seeds("-1")


# --------------------------------------------------------------------------- the Learn tab's figure

def _doc(curves: dict[str, list[list]], target: float = 0.5) -> dict:
    """A measurement with one problem: label -> one curve (lowest loss at 1, 2, 3 k examples) per seed."""
    rows = [{"arm": label.split(" (")[0], "label": label, "seed": k,
             "curve": {"compute_examples": [1000.0, 2000.0, 3000.0], "best_loss": c}}
            for label, cs in curves.items() for k, c in enumerate(cs)]
    return {"format": "soapbox.init-sweep-bench/1", "seeds": [0, 1, 2],
            "problems": [{"name": "toy", "config": {"target_loss": target}, "rows": rows}]}


class TestLearnFigure:
    def test_median_line_and_band_over_the_seeds(self):
        from app.learn_figures import build_init_sweep_figure

        fig = build_init_sweep_figure(_doc({"single": [[0.9, 0.5, 0.2], [0.7, 0.6, 0.4], [0.8, 0.3, 0.1]],
                                            "sweep": [[None, 0.8, 0.3], [0.9, 0.7, 0.6], [1.0, 0.5, 0.5]]}))
        d = fig.to_dict()
        by_name = {t["name"]: t for t in d["data"] if t.get("name")}
        assert list(by_name) == ["init-sweep", "one run"]
        one = by_name["one run"]
        assert list(one["x"]) == [1.0, 2.0, 3.0] and list(one["y"]) == [0.8, 0.5, 0.2]  # median of each column
        hi, lo = d["data"][3], d["data"][4]  # (single's band: best to worst seed, filled between)
        assert list(hi["y"]) == [0.9, 0.6, 0.4] and list(lo["y"]) == [0.7, 0.3, 0.1] and lo["fill"] == "tonexty"
        assert list(by_name["init-sweep"]["x"]) == [2.0, 3.0]  # (no point until every seed has a loss)
        assert d["layout"]["yaxis"]["type"] == "log" and "3 seeds" in d["layout"]["title"]["text"]
        assert [s["y0"] for s in d["layout"]["shapes"]] == [0.5]  # the target, dashed
        assert d["layout"]["shapes"][0]["line"]["dash"] == "dash"

    def test_the_ablation_starts_hidden_in_the_legend(self):
        from app.learn_figures import build_init_sweep_figure

        d = build_init_sweep_figure(_doc({"sweep (no narrowing)": [[0.9, 0.5, 0.2]]})).to_dict()
        assert {t.get("visible") for t in d["data"]} == {"legendonly"}

    def test_the_committed_measurement_has_curves_for_every_row(self):
        from app.learn_figures import build_init_sweep_figure, load_init_sweep

        doc = load_init_sweep()
        assert doc is not None, "app/data/init_sweep.json is missing or has no loss curves"
        fig = build_init_sweep_figure(doc)
        assert len(doc["problems"]) == 2 and len(fig.to_dict()["layout"]["shapes"]) == 2
        for prob in doc["problems"]:
            for r in prob["rows"]:
                y = [v for v in r["curve"]["best_loss"] if v is not None]
                assert y == sorted(y, reverse=True)
                hit = r["compute_to_target_examples"]  # (the curve is sampled: it crosses at the next point)
                first = next((x for x, v in zip(r["curve"]["compute_examples"], r["curve"]["best_loss"])
                              if v is not None and v <= prob["config"]["target_loss"]), None)
                spacing = r["curve"]["compute_examples"][0]
                assert (hit is None) == (first is None) and (hit is None or 0 <= first - hit < spacing)

    def test_a_missing_measurement_is_one_line_on_the_page(self, monkeypatch, tmp_path):
        import app.learn_figures as lf
        from app.tabs.learn import topic_figure

        assert lf.load_init_sweep(tmp_path / "none.json") is None
        old = tmp_path / "old.json"  # (a measurement from before the curves were recorded)
        old.write_text(json.dumps({"format": "soapbox.init-sweep-bench/1", "problems": [{"rows": [{"arm": "x"}]}]}))
        assert lf.load_init_sweep(old) is None
        (graph,) = topic_figure("init-sweep")
        assert graph.id == "learn-init-sweep-graph" and graph.figure == lf.init_sweep_figure_json()
        monkeypatch.setattr(lf, "init_sweep_figure_json", lambda: None)
        (p,) = topic_figure("init-sweep")
        assert p.children.startswith("The measurement's figure needs app/data/init_sweep.json")
        assert topic_figure("soap") == []
