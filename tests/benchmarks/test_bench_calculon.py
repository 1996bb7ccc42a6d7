"""benchmarks/bench_calculon.py: its runs match on both sides, its errors are one line, its table
and soapbox's side of a run (Calculon itself is not installed here: the script imports it from
a checkout named on the command line)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/
sys.path.insert(0, str(HERE.parent / "benchmarks"))

import bench_calculon as bc  # noqa: E402
from published import megatron_flops  # noqa: E402

from engine.cluster import preset  # noqa: E402


class TestCalculonPath:
    def test_missing_folder_is_one_line(self, tmp_path, capsys):
        where = tmp_path / "nowhere"
        assert bc.main(["--calculon", str(where)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and str(where) in err and "no such folder" in err

    def test_folder_without_calculon(self, tmp_path, capsys):
        assert bc.main(["--calculon", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "not a Calculon checkout" in err and "calculon/llm/llm.py" in err

    def test_calculon_that_fails_to_import(self, tmp_path, capsys, monkeypatch):
        pkg = tmp_path / "calculon"
        (pkg / "llm").mkdir(parents=True)
        (pkg / "llm" / "llm.py").write_text("")
        (pkg / "__init__.py").write_text("raise ImportError('no module named numpy (test)')\n")
        monkeypatch.setattr(sys, "path", list(sys.path))
        monkeypatch.delitem(sys.modules, "calculon", raising=False)
        assert bc.main(["--calculon", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "importing Calculon failed" in err and "numpy (test)" in err

    def test_calculon_required_without_table(self, capsys):
        assert bc.main([]) == 2
        assert capsys.readouterr().err.strip() == ("bench_calculon: --calculon PATH is required (a checkout of "
                                                   "github.com/calculon-ai/calculon)")

    def test_model_file_calculon_cannot_use(self, tmp_path, capsys, monkeypatch):
        """A checkout whose model file lacks a field: one line naming the file (the fake
        Calculon's Application reads the field as Calculon's does, cfg['hidden'])."""
        pkg = tmp_path / "calculon"
        (pkg / "llm").mkdir(parents=True)
        (pkg / "__init__.py").write_text("class System:\n    def __init__(self, cfg):\n        pass\n")
        (pkg / "llm" / "__init__.py").write_text("from .llm import Llm\n")
        (pkg / "llm" / "llm.py").write_text("class Llm:\n    class Application:\n        def __init__(self, cfg):\n"
                                             "            self.hidden = cfg['hidden']\n")
        (tmp_path / "models").mkdir()
        (tmp_path / "models" / "gpt3-175B.json").write_text("{}")
        (tmp_path / "systems").mkdir()
        (tmp_path / "systems" / "a100_80g.json").write_text("{}")
        monkeypatch.setattr(sys, "path", list(sys.path))
        for m in ("calculon", "calculon.llm", "calculon.llm.llm"):
            monkeypatch.delitem(sys.modules, m, raising=False)
        assert bc.main(["--calculon", str(tmp_path), "--only", "1024"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "gpt3-175B.json: Calculon cannot use it (KeyError" in err
        for m in ("calculon", "calculon.llm", "calculon.llm.llm"):
            sys.modules.pop(m, None)

    def test_rounds_below_one(self, tmp_path, capsys):
        assert bc.main(["--calculon", str(tmp_path), "--rounds", "0"]) == 2
        assert "--rounds 0" in capsys.readouterr().err


class TestRuns:
    def test_ten_runs(self):
        assert len(bc.RUNS) == 10
        assert sum(r.gpus == 1024 for r in bc.RUNS) == 2
        assert sorted(r.published_s for r in bc.RUNS if r.published_s) == sorted(bc.KORTHIKANTI_TABLE5_S.values())

    @pytest.mark.parametrize("run", bc.RUNS, ids=lambda r: r.name)
    def test_layout_fills_its_cluster(self, run):
        lay = run.layout
        assert lay["tp"] * lay["pp"] * lay["dp"] == run.gpus == preset(run.cluster).num_devices
        assert run.global_batch % (lay["dp"] * lay["micro_batch"]) == 0
        assert lay["overlap_grad_reduce"] is False  # Calculon's data_par_overlap is false in its tab5 files

    def test_1024_runs_change_calculon_to_the_same_layout(self):
        for run in (r for r in bc.RUNS if r.gpus == 1024):
            ch, lay = run.calculon_changes, run.layout
            assert (ch["num_procs"], ch["pipeline_par"], ch["data_par"], ch["batch_size"]) == (
                run.gpus, lay["pp"], lay["dp"], run.global_batch)
            # Calculon's sequence parallelism is its reduce-scatter / all-gather tensor-parallel comm
            assert (ch.get("tensor_par_comm_type") == "rs_ag") == lay["sequence_parallel"]
            assert lay["recompute"] == "full"

    def test_korthikanti_modes(self):
        for run in (r for r in bc.RUNS if r.gpus != 1024):
            seqsel = run.calculon_exe.endswith("_seqsel.json")
            assert run.layout["sequence_parallel"] is seqsel
            assert run.layout["recompute"] == ("selective" if seqsel else "full")
            assert run.calculon_changes == {}


class TestPublished:
    def test_no_row_for_the_1024_gpu_runs(self):
        assert bc.published_from_csv(bc.RUNS[0]) == (None, "")

    def test_row_found_and_converted(self):
        # Narayanan et al. SC'21 Table 1, GPT-145B: 80 layers, h 12288, 1536 GPUs, tp 8, pp 8,
        # batch 2304, 148 TFLOP/s per GPU (row 7 of the CSV)
        run = bc.Run("145B", "", "", {}, 80, 12288, 96, 2304, 1536, dict(tp=8, pp=8, dp=24, micro_batch=2))
        t, where = bc.published_from_csv(run)
        assert where == "published_runs_public.csv row 7"
        assert t == pytest.approx(megatron_flops(2304, 2048, 80, 12288, 51200, True) / (148e12 * 1536))
        # the same row's aggregate 227.1 PFLOP/s (its metric2) gives the same time to rounding
        assert t == pytest.approx(megatron_flops(2304, 2048, 80, 12288, 51200, True) / 227.1e15, rel=0.01)


class TestTable:
    def test_rows_dashes_and_errors(self):
        a = bc.Result("a", calculon_pred_s=0.004, soapbox_pred_s=1.5, calculon_iter_s=11.0, soapbox_iter_s=9.0,
                      calculon_cpu_s=0.0035, soapbox_cpu_s=1.25,
                      published_s=10.0, calculon_mem_gib=20.0, soapbox_peak_gib=30.0, soapbox_tasks=1234)
        b = bc.Result("b", problem="Calculon: Error: too big.")
        text = bc.markdown_table([a, b])
        lines = text.splitlines()
        assert lines[2] == ("| a | 4.0 (3.5) | 1.50 (1.25) | - | 10.00 | 11.00 (+10.0%) | 9.00 (-10.0%) | 20.0 | 30.0 "
                            "| 1,234 |")
        assert lines[3] == "| b | - | - | - | - | - (-) | - (-) | - | - | - |"
        assert lines[-1] == "b: Calculon: Error: too big."
        assert "Calculon: 0.004-0.004 s (0.0035-0.0035 s CPU) per prediction over 1 runs; median |error| 10.0% " \
               "over the 1 with a published time" in text

    def test_summary_median_error(self):
        rs = [bc.Result(str(i), soapbox_pred_s=p, soapbox_iter_s=it, published_s=pub)
              for i, (p, it, pub) in enumerate([(1.0, 11.0, 10.0), (3.0, 7.0, 10.0), (2.0, 13.0, 10.0),
                                                 (5.0, 9.0, None)])]
        assert bc.summary_lines(rs) == ["\nsoapbox: 1-5 s per prediction over 4 runs; median |error| 30.0% over the 3 "
                                        "with a published time"]
        assert bc.summary_lines([bc.Result("x")]) == []


class TestSoapboxSide:
    def test_megatron_22b_sequence_parallel_selective_beats_full_recompute(self):
        """Korthikanti et al.'s Table 5 relationship (1.10 s < 1.42 s) on soapbox's side: less
        recomputation, shorter iteration; and the predictor reports tasks and memory."""
        full, seqsel = (r for r in bc.RUNS if "megatron-22B" in r.name)
        graph = bc.soapbox_model(full)
        t_full, mem_full, n_full = bc.soapbox_predictor(graph, full)()
        t_sel, mem_sel, n_sel = bc.soapbox_predictor(graph, seqsel)()
        assert 0 < t_sel < t_full
        assert mem_full > 0 and mem_sel > 0 and n_full > 0 and n_sel > 0
        assert graph.batch_size == 4


class TestSavedTable:
    def test_round_trip(self, tmp_path, capsys):
        import json
        from dataclasses import asdict
        head = {"engine": "/e", "calculon": "/c", "host": "h", "cpus": 2, "python": "3", "date_utc": "d",
                "load_1_5_15": [1, 2, 3], "rounds": 5}
        r = bc.Result("a", calculon_pred_s=0.004, soapbox_iter_s=9.0, published_s=10.0)
        p = tmp_path / "out.json"
        p.write_text(json.dumps({"setup": head, "results": [asdict(r)]}))
        assert bc.main(["--table", str(p)]) == 0
        out = capsys.readouterr().out
        assert "soapbox engine /e; Calculon /c" in out and bc.markdown_table([r]) in out

    def test_not_a_saved_file(self, tmp_path, capsys):
        p = tmp_path / "x.json"
        p.write_text('{"setup": {}}')
        assert bc.main(["--table", str(p)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and str(p) in err and "not a file bench_calculon --save wrote" in err
