"""``soapbox simulate``: the human report, the ``--json`` object (and that it agrees with
:func:`engine.sim.report.simulate_strategy`), strategy files against baseline kinds, traces,
measured profile tables, and every error a user can make (exit 2, a message, no traceback)."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from engine.cli import main
from engine.cluster import preset
from engine.costs import CostModel, ProfileTable
from engine.formats import load_profile, read_json, resolve_model, save_json
from engine.sim.report import simulate_strategy
from engine.search.baselines import data_parallel
from engine.taskgraph import FWD

# A small GPT (see tests/cli/test_cli.py): 2 layers, hidden 64, 4 heads, seq 16, vocab 100, batch 8.
GPT_ARGS = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "16", "--vocab", "100", "--batch", "8"]
# A GPT whose fp16 mixed-precision Adam state alone (16 bytes per parameter, ~1.6e9
# parameters) is far beyond a 16 GB P100 under pure data parallelism.
BIG_GPT_ARGS = ["--layers", "2", "--hidden", "8192", "--heads", "64", "--seq-len", "16", "--vocab", "1000",
                "--batch", "16"]
ALEXNET_DP = ["simulate", "--model", "alexnet", "--cluster", "p100-4x4", "--strategy", "data-parallel"]
SUMMARY_KEYS = {"iteration_time_s", "throughput_samples_per_s", "feasible", "peak_memory_bytes", "comm_bytes",
                "num_tasks"}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_clean_error(rc: int, out: str, err: str) -> None:
    """A user error: exit 2, nothing on stdout, one ``soapbox: error:`` message, no traceback."""
    assert rc == 2
    assert out == ""
    assert err.startswith("soapbox: error: ")
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def gpt_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("sim") / "gpt.json"
    assert main(["model", "gpt", *GPT_ARGS, "-o", str(path)]) == 0
    return str(path)


@pytest.fixture(scope="module")
def big_gpt_file(tmp_path_factory) -> str:
    """A GPT that does not fit on p100-4x4 under data parallelism."""
    path = tmp_path_factory.mktemp("sim") / "big.json"
    assert main(["model", "gpt", *BIG_GPT_ARGS, "-o", str(path)]) == 0
    return str(path)


@pytest.fixture(scope="module")
def alexnet_dp_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("sim") / "dp.json"
    assert main(["baseline", "--model", "alexnet", "--cluster", "p100-4x4", "--kind", "data-parallel",
                 "-o", str(path)]) == 0
    return str(path)


# --------------------------------------------------------------------------- human report


class TestHumanReport:
    def test_every_line_is_there(self, capsys):
        rc, out, err = run(capsys, *ALEXNET_DP)
        assert rc == 0 and err == ""
        lines = out.splitlines()
        assert lines[0].startswith("alexnet on p100-4x4 (baseline:data-parallel): 16 of 16 GPUs, 1 microbatch(es)")
        labels = [ln.strip().split("   ")[0] for ln in lines[1:]]
        for want in ("iteration time", "throughput", "model FLOP/s/GPU", "critical path", "utilisation",
                     "communication", "peak memory", "feasible"):
            assert want in labels, (want, out)

    def test_numbers_agree_with_the_engine(self, capsys):
        g = resolve_model("alexnet")
        c = preset("p100-4x4")
        r = simulate_strategy(g, data_parallel(g, c), c)
        _, out, _ = run(capsys, *ALEXNET_DP)
        assert f"iteration time     {r.iteration_time_s * 1e3:.3f} ms" in out
        assert f"throughput         {r.throughput_samples_per_s:.2f} samples/s" in out
        assert f"{r.tasks.num_tasks:,} tasks" in out
        assert "feasible           yes: every device fits in memory" in out

    def test_infeasible_strategy_names_the_devices(self, capsys, big_gpt_file):
        rc, out, _ = run(capsys, "simulate", "--model", big_gpt_file, "--cluster", "p100-4x4",
                         "--strategy", "data-parallel")
        # The report is printed in full and the exit status says the strategy does not fit
        # (issue 10: it was 0, so scripts could not tell; now 3, documented in --help).
        assert rc == 3
        line = next(ln for ln in out.splitlines() if ln.strip().startswith("feasible"))
        assert "NO: over memory capacity on 16 device(s): device " in line
        assert "iteration time" in out

    def test_infeasible_json_says_so_in_words(self, capsys, big_gpt_file):
        rc, out, err = run(capsys, "simulate", "--model", big_gpt_file, "--cluster", "p100-4x4",
                           "--strategy", "data-parallel", "--json")
        assert rc == 3 and err == ""
        obj = json.loads(out)
        assert obj["feasible"] is False
        assert obj["memory"].startswith("does not fit in memory: over capacity on 16 device(s): device ")
        assert obj["notes"] == [f"the strategy {obj['memory']}"]


# --------------------------------------------------------------------------- --json


class TestJson:
    @pytest.fixture(scope="class")
    @staticmethod
    def summary():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main([*ALEXNET_DP, "--json"]) == 0
        return buf.getvalue()

    def test_prints_exactly_one_object(self, summary):
        obj = json.loads(summary)  # raises on anything else around the object
        assert isinstance(obj, dict)
        assert summary.count("\n") == 1

    def test_has_the_documented_fields(self, summary):
        obj = json.loads(summary)
        assert SUMMARY_KEYS <= set(obj)
        assert isinstance(obj["feasible"], bool)
        assert isinstance(obj["peak_memory_bytes"], list) and len(obj["peak_memory_bytes"]) == 16
        assert isinstance(obj["num_tasks"], int)

    def test_values_agree_with_simulate_strategy(self, summary):
        obj = json.loads(summary)
        g = resolve_model("alexnet")
        c = preset("p100-4x4")
        r = simulate_strategy(g, data_parallel(g, c), c)
        assert obj["iteration_time_s"] == r.iteration_time_s
        assert obj["throughput_samples_per_s"] == r.throughput_samples_per_s
        assert obj["feasible"] is r.memory.feasible
        assert obj["peak_memory_bytes"] == r.memory.peak_bytes.tolist()
        assert obj["comm_bytes"] == r.timeline.comm_bytes
        assert obj["num_tasks"] == r.tasks.num_tasks
        assert obj["throughput_samples_per_s"] == pytest.approx(g.batch_size / obj["iteration_time_s"])

    def test_carries_the_memory_breakdown_and_the_allocator_peaks(self, summary):
        """What PyTorch reports (``max_memory_allocated``, ``max_memory_reserved``) per GPU, and the
        busiest GPU's peak in its parts, which add up to its ``peak_memory_bytes``."""
        obj = json.loads(summary)
        peak = obj["peak_memory_bytes"]
        alloc, reserved = obj["max_memory_allocated_bytes"], obj["max_memory_reserved_bytes"]
        assert len(alloc) == len(reserved) == len(peak) == 16
        assert all(0 < a <= r <= p for a, r, p in zip(alloc, reserved, peak))
        b = obj["memory_breakdown"]
        d = b["device"]
        assert peak[d] == max(peak)
        assert sum(b["parts"].values()) == pytest.approx(peak[d], rel=1e-12)
        assert b["parts"]["weights"] > 0 and b["parts"]["activations"] > 0
        assert b["max_memory_allocated"] == alloc[d] and b["max_memory_reserved"] == reserved[d]
        assert b["host"] == 0 and b["nvme"] == 0  # nothing offloaded

    def test_trace_with_json_keeps_stdout_pure(self, capsys, tmp_path):
        path = tmp_path / "t.json"
        rc, out, _ = run(capsys, *ALEXNET_DP, "--json", "--trace", str(path))
        assert rc == 0
        json.loads(out)
        assert path.exists()


# --------------------------------------------------------------------------- strategy files


class TestStrategyFile:
    MEGATRON = ("--tp", "2", "--pp", "2", "--micro-batch", "2")

    def test_file_from_baseline_equals_the_kind(self, capsys, tmp_path, gpt_file):
        path = tmp_path / "mt.json"
        assert main(["baseline", "--model", gpt_file, "--cluster", "dgx-a100-80gb:1", "--kind", "megatron",
                     *self.MEGATRON, "-o", str(path)]) == 0
        capsys.readouterr()
        rc, out, _ = run(capsys, "simulate", "--model", gpt_file, "--cluster", "dgx-a100-80gb:1",
                         "--strategy", str(path), "--json")
        assert rc == 0
        from_file = json.loads(out)
        rc, out, _ = run(capsys, "simulate", "--model", gpt_file, "--cluster", "dgx-a100-80gb:1",
                         "--strategy", "megatron", *self.MEGATRON, "--json")
        assert rc == 0
        from_kind = json.loads(out)
        assert from_file["iteration_time_s"] == from_kind["iteration_time_s"]
        assert from_file["num_tasks"] == from_kind["num_tasks"]
        assert from_file["peak_memory_bytes"] == from_kind["peak_memory_bytes"]
        assert from_file["microbatches"] == from_kind["microbatches"] == 2

    @pytest.mark.parametrize("options, flags", [
        (["--tp", "2"], "--tp"),
        (["--micro-batch", "4", "--sequence-parallel"], "--micro-batch, --sequence-parallel"),
    ])
    def test_baseline_options_with_a_file_exit_2(self, capsys, alexnet_dp_file, options, flags):
        rc, out, err = run(capsys, "simulate", "--model", "alexnet", "--cluster", "p100-4x4",
                           "--strategy", alexnet_dp_file, *options)
        assert_clean_error(rc, out, err)
        assert f"baseline options ({flags}) apply to a baseline kind" in err
        assert alexnet_dp_file in err

    def test_invalid_file_lists_every_problem(self, capsys, tmp_path, alexnet_dp_file):
        d = read_json(alexnet_dp_file)
        d["ops"]["conv1"] = {"degrees": {"sample": 3}, "devices": [0, 1, 99]}
        path = tmp_path / "bad.json"
        save_json(d, path)
        rc, out, err = run(capsys, "simulate", "--model", "alexnet", "--cluster", "p100-4x4", "--strategy", str(path))
        assert rc in (1, 2) and out == ""
        assert "Traceback" not in err
        assert f"{path}: 2 problems found:" in err
        assert "ops.conv1.degrees.sample: 3 does not divide sample (256)" in err
        assert "ops.conv1.devices[2]: device 99 does not exist; p100-4x4 has devices 0..15" in err

    def test_file_for_another_cluster_is_rejected(self, capsys, alexnet_dp_file):
        rc, out, err = run(capsys, "simulate", "--model", "alexnet", "--cluster", "dgx-a100-80gb:1",
                           "--strategy", alexnet_dp_file)
        assert_clean_error(rc, out, err)
        assert "does not exist" in err

    def test_missing_file(self, capsys, tmp_path):
        rc, out, err = run(capsys, "simulate", "--model", "alexnet", "--cluster", "p100-4x4",
                           "--strategy", str(tmp_path / "nope.json"))
        assert_clean_error(rc, out, err)
        assert "nope.json" in err and "file not found" in err

    def test_option_the_kind_does_not_take(self, capsys):
        rc, out, err = run(capsys, *ALEXNET_DP, "--tp", "2")
        assert_clean_error(rc, out, err)
        assert "data-parallel does not take --tp" in err


# --------------------------------------------------------------------------- --trace


def test_trace_writes_a_chrome_trace(capsys, tmp_path):
    path = tmp_path / "out.json"
    rc, out, _ = run(capsys, *ALEXNET_DP, "--trace", str(path))
    assert rc == 0
    data = json.loads(path.read_text(encoding="utf-8"))
    n = len(data["traceEvents"])
    assert f"wrote {path}: {n:,} trace events" in out
    assert any(e["ph"] == "X" for e in data["traceEvents"])
    assert "iteration time" in out  # the report still follows


# --------------------------------------------------------------------------- --profile


def _dp_profile(g, c, op_names, fwd_s, bwd_s, microbatches=1) -> ProfileTable:
    """A table whose entries match ``op_names``' partitions under data parallelism over
    every device with ``microbatches`` microbatches (the sample dim is then split
    ``devices x microbatches`` ways, as the task graph's partitions are)."""
    s = data_parallel(g, c)
    table = ProfileTable()
    dtype = c.device_type(0).name
    for name in op_names:
        op = g[name]
        degrees = dict(s.configs[name].degrees)
        degrees["sample"] = degrees.get("sample", 1) * microbatches
        ins, outs, params = op.partition_shapes(degrees)
        table.add(op.kind, ins, outs, params, g.precision, dtype, fwd_s, bwd_s)
    return table


class TestProfile:
    FWD_S, BWD_S = 1.25e-3, 2.5e-3
    OPS = ("conv1", "conv2")

    @pytest.fixture(scope="class")
    @staticmethod
    def setup(tmp_path_factory):
        g = resolve_model("alexnet")
        c = preset("p100-4x4")
        table = _dp_profile(g, c, TestProfile.OPS, TestProfile.FWD_S, TestProfile.BWD_S)
        path = tmp_path_factory.mktemp("prof") / "profile.json"
        path.write_text(json.dumps(table.to_dict()), encoding="utf-8")
        return g, c, table, path

    def test_profiled_ops_take_the_measured_time(self, setup):
        g, c, _, path = setup
        r = simulate_strategy(g, data_parallel(g, c), c, CostModel(profile=load_profile(path)))
        tg = r.tasks
        for name in self.OPS:
            oi = g.ops.index(g[name])
            assert np.all(tg.dur_s[(tg.kind == FWD) & (tg.op == oi)] == self.FWD_S)
        # an op without an entry keeps its roofline time
        base = simulate_strategy(g, data_parallel(g, c), c)
        oi = g.ops.index(g["conv3"])
        sel = (tg.kind == FWD) & (tg.op == oi)
        assert np.array_equal(tg.dur_s[sel], base.tasks.dur_s[(base.tasks.kind == FWD) & (base.tasks.op == oi)])

    def test_cli_profile_changes_the_ops_times(self, capsys, setup, tmp_path):
        path = setup[3]
        trace = tmp_path / "t.json"
        rc, out, _ = run(capsys, *ALEXNET_DP, "--profile", str(path), "--json", "--trace", str(trace))
        assert rc == 0
        with_profile = json.loads(out)
        _, out, _ = run(capsys, *ALEXNET_DP, "--json")
        without = json.loads(out)
        assert with_profile["iteration_time_s"] != without["iteration_time_s"]
        events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
        for name in self.OPS:
            durs = {e["dur"] for e in events if e["ph"] == "X" and e["name"] == f"{name} fwd"}
            assert durs == {round(self.FWD_S * 1e6, 3)}
            durs = {e["dur"] for e in events if e["ph"] == "X" and e["name"] == f"{name} bwd"}
            assert durs == {round(self.BWD_S * 1e6, 3)}

    def test_entries_are_keyed_by_microbatch_partitions(self, capsys, tmp_path):
        """With 4 microbatches a partition holds 256 / (16 x 4) = 4 samples: an entry for
        16-sample partitions no longer matches, one for 4-sample partitions does."""
        g = resolve_model("alexnet")
        c = preset("p100-4x4")
        s = data_parallel(g, c, micro_batch=4)
        assert s.pipeline.microbatches == 4
        oi = g.ops.index(g["conv1"])
        for m, hit in ((1, False), (4, True)):
            table = _dp_profile(g, c, ["conv1"], self.FWD_S, self.BWD_S, microbatches=m)
            tg = simulate_strategy(g, s, c, CostModel(profile=table)).tasks
            durs = tg.dur_s[(tg.kind == FWD) & (tg.op == oi)]
            assert durs.size == 16 * 4
            assert bool(np.all(durs == self.FWD_S)) is hit

    @pytest.mark.parametrize("content, expect", [
        ('{"format": "soapbox.profile/1", "entries": [{"kind": "linear"}]}', 'entries[0]: "fwd_s" is a required property'),
        (('{"format": "soapbox.profile/1", "entries": [{"kind": "linear", "inputs": [[1]], "outputs": [[1]], '
          '"precision": "fp16", "device_type": "x", "fwd_s": -1, "bwd_s": 1}]}'),
         "entries[0].fwd_s: must be at least 0 (s), got -1"),
        ('{"format": "soapbox.model/1", "entries": []}', "this is a soapbox.model/1 file; expected soapbox.profile/1"),
        ('{"format": "soapbox.profile/1", ', ""),
    ], ids=["missing-field", "negative-time", "wrong-format", "not-json"])
    def test_malformed_profile_is_a_clear_error(self, capsys, tmp_path, content, expect):
        path = tmp_path / "bad_profile.json"
        path.write_text(content, encoding="utf-8")
        rc, out, err = run(capsys, *ALEXNET_DP, "--profile", str(path))
        assert_clean_error(rc, out, err)
        assert str(path) in err
        assert expect in err

    def test_entries_that_are_not_a_list(self, capsys, tmp_path):
        path = tmp_path / "bad_profile.json"
        path.write_text('{"format": "soapbox.profile/1", "entries": {"conv1": 1}}', encoding="utf-8")
        rc, out, err = run(capsys, *ALEXNET_DP, "--profile", str(path))
        assert_clean_error(rc, out, err)
        assert 'entries: {"conv1":1} is not of type "array"' in err

    def test_bad_shape_names_the_field(self, capsys, tmp_path):
        path = tmp_path / "bad_profile.json"
        path.write_text('{"format": "soapbox.profile/1", "entries": [{"kind": "linear", "inputs": 5, '
                        '"outputs": [[1]], "precision": "fp16", "device_type": "x", "fwd_s": 1, "bwd_s": 1}]}',
                        encoding="utf-8")
        rc, out, err = run(capsys, *ALEXNET_DP, "--profile", str(path))
        assert_clean_error(rc, out, err)
        assert "entries[0].inputs" in err

    def test_missing_profile_file(self, capsys, tmp_path):
        rc, out, err = run(capsys, *ALEXNET_DP, "--profile", str(tmp_path / "none.json"))
        assert_clean_error(rc, out, err)
        assert "file not found" in err
