"""The ``soapbox`` command: listings, validate, model, baseline, and its error exits
(2 for a usage or input error, 1 for an invalid file under ``validate``; never a traceback)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from engine.cluster.presets import preset_names

from engine.cli import main
from engine.cluster import preset
from engine.formats import load_model, load_strategy, read_json, save_json
from engine.models import SAMPLE_MODELS
from engine.search.baselines import BASELINES

# A small GPT (learned positions, biases, tied output layer): layers 2, hidden 64, heads 4,
# seq 16, vocab 100, batch 8.
GPT_ARGS = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "16", "--vocab", "100", "--batch", "8"]
# Parameters, with h = 64, s = 16, V = 100:
#   per layer: QKV 3(h^2 + h) + out (h^2 + h) + fc1 (4h^2 + 4h) + fc2 (4h^2 + h) + 2 LayerNorms 4h
#            = 12h^2 + 13h = 49,152 + 832 = 49,984;  x 2 layers = 99,968
#   embeddings: tokens V*h = 6,400 + positions s*h = 1,024; final LayerNorm 2h = 128
#   output layer tied to the token embedding: 0
#   total 99,968 + 7,424 + 128 = 107,520
GPT_PARAMS = 107_520


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def gpt_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cli") / "gpt.json"
    assert main(["model", "gpt", *GPT_ARGS, "-o", str(path)]) == 0
    return str(path)


@pytest.fixture(scope="module")
def alexnet_strategy(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cli") / "dp.json"
    assert main(["baseline", "--model", "alexnet", "--cluster", "p100-4x4", "--kind", "data-parallel",
                 "-o", str(path)]) == 0
    return str(path)


class TestListings:
    def test_models(self, capsys):
        rc, out, err = run(capsys, "models")
        assert rc == 0 and err == ""
        lines = out.splitlines()
        assert lines[0].split() == ["name", "ops", "parameters", "fwd", "FLOPs", "batch", "description"]
        assert [ln.split()[0] for ln in lines[1:]] == list(SAMPLE_MODELS)
        assert len(lines) == 1 + len(SAMPLE_MODELS) == 17  # header + the samples (5 mixture-of-experts)
        assert "61,100,840" in lines[1]  # AlexNet, torchvision's count
        assert "46,702,792,704" in out  # Mixtral 8x7B, transformers' count
        assert "174,615,846,912" in out  # GPT-3 175B

    def test_models_json(self, capsys):
        rc, out, _ = run(capsys, "models", "--json")
        assert rc == 0
        rows = json.loads(out)
        assert len(rows) == 16
        assert [r["name"] for r in rows] == list(SAMPLE_MODELS)
        assert all(isinstance(r["parameters"], int) and r["parameters"] > 0 for r in rows)
        by_name = {r["name"]: r for r in rows}
        assert by_name["alexnet"]["parameters"] == 61_100_840
        assert by_name["gpt2"]["parameters"] == 124_439_808
        assert by_name["alexnet"]["batch"] == 256 and by_name["alexnet"]["ops"] == 24

    def test_models_write_makes_the_sample_files_from_the_builders(self, capsys, tmp_path):
        """``soapbox models --write`` is how ``sample_models/`` is made (it replaced
        ``python -m engine.models``): every file, byte for byte the one in the checkout."""
        from engine.models import sample_dir

        rc, out, err = run(capsys, "models", "--write", str(tmp_path / "out"))
        assert rc == 0 and err == ""
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(f"{n}.json" for n in SAMPLE_MODELS)
        for name in ("alexnet", "gpt2"):
            assert (tmp_path / "out" / f"{name}.json").read_bytes() == (sample_dir() / f"{name}.json").read_bytes()
        assert out.splitlines()[0].startswith("alexnet: 24 ops, 61,100,840 parameters -> ")

    def test_clusters(self, capsys):
        rc, out, _ = run(capsys, "clusters")
        assert rc == 0
        assert out.splitlines()[0].split()[:3] == ["p100-4x4", "16", "GPUs"]
        assert len(out.splitlines()) == len(preset_names()) + 1
        assert out.splitlines()[-1].startswith("another network after a preset's name: +nics=N")

    def test_clusters_json(self, capsys):
        rc, out, _ = run(capsys, "clusters", "--json")
        assert rc == 0
        rows = {r["name"]: r for r in json.loads(out)}
        assert list(rows)[:7] == ["p100-4x4", "k80-16x4", "dgx-a100-80gb:N", "dgx-a100-40gb:N", "dgx-h100:N",
                                  "dgx-h200:N", "v100-dgx2:N"]
        assert list(rows) == preset_names()  # every preset, the listing's order
        assert {"dgx-b200:N", "gb200-nvl72:N", "gh200:N", "grand-teton:N", "rtx4090:N"} <= set(rows)
        assert rows["p100-4x4"]["gpus"] == 16
        assert rows["k80-16x4"]["gpus"] == 64
        assert rows["dgx-h100:N"]["gpus_per_node"] == 8
        assert rows["v100-dgx2:N"]["gpus_per_node"] == 16
        assert rows["hetero-demo"]["device_types"] == ["A100-SXM4-40GB", "H100-SXM5-80GB", "V100-SXM2-32GB"]

    def test_console_script(self):
        exe = shutil.which("soapbox")
        cmd = [exe, "models"] if exe else [sys.executable, "-m", "engine.cli", "models"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        assert len(proc.stdout.splitlines()) == 17
        assert "gpt3-175b" in proc.stdout and "deepseek-v3" in proc.stdout


class TestValidate:
    def test_valid_strategy(self, capsys, alexnet_strategy):
        rc, out, _ = run(capsys, "validate", alexnet_strategy)
        assert rc == 0
        assert out == f"{alexnet_strategy}: valid soapbox.strategy/1 for alexnet on p100-4x4 (24 ops)\n"

    def test_valid_model(self, capsys, gpt_file):
        rc, out, _ = run(capsys, "validate", gpt_file)
        assert rc == 0
        assert out == f"{gpt_file}: valid soapbox.model/1: gpt, 60 ops, 107,520 parameters\n"

    def test_valid_cluster(self, capsys, tmp_path):
        path = tmp_path / "c.json"
        save_json(preset("p100-4x4").to_dict(), path)
        rc, out, _ = run(capsys, "validate", str(path))
        assert rc == 0
        assert out == f"{path}: valid soapbox.cluster/1: p100-4x4, 4 node(s), 16 GPUs (16 x P100-SXM2-16GB)\n"

    def test_strategy_for_an_unknown_model_checks_structure_only(self, capsys, tmp_path, gpt_file):
        path = tmp_path / "s.json"
        assert main(["baseline", "--model", gpt_file, "--cluster", "dgx-a100-80gb:1", "--kind", "data-parallel",
                     "-o", str(path)]) == 0
        capsys.readouterr()
        rc, out, _ = run(capsys, "validate", str(path))
        assert rc == 0
        assert out.startswith(f"{path}: valid soapbox.strategy/1 structure (60 ops); not checked against a model "
                              "and cluster: unknown model 'gpt'")

    def test_invalid_strategy_lists_every_problem(self, capsys, tmp_path, alexnet_strategy):
        d = read_json(alexnet_strategy)
        d["ops"]["conv1"] = {"degrees": {"sample": 3}, "devices": [0, 1, 99]}
        path = tmp_path / "bad.json"
        save_json(d, path)
        rc, out, err = run(capsys, "validate", str(path))
        assert rc == 1 and out == ""
        assert err == (f"{path}: 2 problems found:\n"
                       "  - ops.conv1.degrees.sample: 3 does not divide sample (256)\n"
                       "  - ops.conv1.devices[2]: device 99 does not exist; p100-4x4 has devices 0..15\n")

    def test_invalid_model(self, capsys, tmp_path):
        path = tmp_path / "m.json"
        path.write_text(json.dumps({"format": "soapbox.model/1", "name": "m", "ops": [
            {"name": "x", "kind": "input", "attrs": {"shape": [2, 3]}},
            {"name": "a", "kind": "relu", "inputs": ["nope"]},
            {"name": "x", "kind": "relu", "inputs": ["x"]}]}))
        rc, _, err = run(capsys, "validate", str(path))
        assert rc == 1
        assert "ops[1] (a).inputs[0]: refers to unknown op 'nope'" in err
        assert "ops[2] (x).name: duplicate op name 'x' (first used by ops[0])" in err
        assert "Traceback" not in err

    def test_malformed_json(self, capsys, tmp_path):
        path = tmp_path / "m.json"
        path.write_text("{")
        rc, _, err = run(capsys, "validate", str(path))
        assert rc == 1
        assert err.startswith(f"{path}: 1 problem found:\n  - line 1 column 2: invalid JSON")

    def test_missing_file(self, capsys, tmp_path):
        rc, _, err = run(capsys, "validate", str(tmp_path / "none.json"))
        assert rc == 1 and err == f"{tmp_path / 'none.json'}: 1 problem found:\n  - file not found\n"

    def test_format_of_the_wrong_type(self, capsys, tmp_path):
        path = tmp_path / "m.json"
        path.write_text('{"format": ["soapbox.model/1"]}')
        rc, _, _ = run(capsys, "validate", str(path))
        assert rc == 1


class TestModel:
    def test_gpt(self, capsys, tmp_path):
        path = tmp_path / "g.json"
        rc, out, _ = run(capsys, "model", "gpt", *GPT_ARGS, "-o", str(path))
        assert rc == 0
        assert out.startswith(f"wrote {path}: gpt, 60 ops, 107,520 parameters, ")
        g = load_model(str(path))
        assert g.param_count == GPT_PARAMS
        assert (g.batch_size, g.precision) == (8, "fp16")

    def test_swiglu_and_gqa(self, capsys, tmp_path):
        path = tmp_path / "l.json"
        rc, _, _ = run(capsys, "model", "gpt", "--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads",
                       "2", "--ffn-hidden", "128", "--swiglu", "--seq-len", "16", "--vocab", "100", "--batch", "2",
                       "--precision", "bf16", "--name", "tiny-llama", "-o", str(path))
        assert rc == 0
        g = load_model(str(path))
        # q 64*64, k and v 64*32 each, out 64*64; gate, up 64*128 and down 128*64; 2 RMSNorms 2*64;
        # token embedding 100*64, final RMSNorm 64, untied output layer 64*100
        assert g.param_count == (2 * 4096 + 2 * 2048) + 3 * 8192 + 128 + 6400 + 64 + 6400
        assert (g.name, g.precision) == ("tiny-llama", "bf16")

    def test_inconsistent_shape_exits_2(self, capsys, tmp_path):
        rc, out, err = run(capsys, "model", "gpt", "--layers", "1", "--hidden", "64", "--heads", "3", "--seq-len",
                           "4", "--vocab", "10", "--batch", "1", "-o", str(tmp_path / "g.json"))
        assert rc == 2 and out == ""
        assert err == "soapbox: error: heads (3) must divide hidden (64) unless head_dim is given\n"
        assert not (tmp_path / "g.json").exists()

    def test_non_positive_size_is_a_usage_error(self, capsys, tmp_path):
        with pytest.raises(SystemExit) as exc:
            main(["model", "gpt", *GPT_ARGS[:-1], "0", "-o", str(tmp_path / "g.json")])
        assert exc.value.code == 2
        assert "argument --batch: 0 must be at least 1" in capsys.readouterr().err

    def test_source_records_the_command(self, capsys, tmp_path, monkeypatch):
        monkeypatch.setattr(sys, "argv", ["pytest", "-q"])
        path = tmp_path / "g.json"
        argv = ["model", "gpt", *GPT_ARGS, "-o", str(path)]
        assert main(argv) == 0
        assert load_model(str(path)).source == "soapbox " + " ".join(argv)


BASELINE_ARGS = {
    "data-parallel": [],
    "model-parallel": [],
    "expert": [],
    "megatron": ["--tp", "2", "--pp", "2", "--micro-batch", "1"],
    "fsdp": ["--tp", "2", "--zero-stage", "2"],
}


class TestBaseline:
    def test_every_kind_is_covered(self):
        assert sorted(BASELINE_ARGS) == sorted(BASELINES)

    @pytest.mark.parametrize("kind", list(BASELINE_ARGS))
    def test_writes_a_valid_strategy(self, capsys, tmp_path, gpt_file, kind):
        path = tmp_path / "s.json"
        rc, out, _ = run(capsys, "baseline", "--model", gpt_file, "--cluster", "dgx-a100-80gb:1", "--kind", kind,
                         *BASELINE_ARGS[kind], "-o", str(path))
        assert rc == 0
        assert out.startswith(f"wrote {path}: {kind} strategy for gpt (60 ops) on dgx-a100-80gb:1, ")
        assert out.endswith("; valid\n")
        rc, out, _ = run(capsys, "validate", str(path), "--model", gpt_file, "--cluster", "dgx-a100-80gb:1")
        assert rc == 0
        assert out == f"{path}: valid soapbox.strategy/1 for gpt on dgx-a100-80gb:1 (60 ops)\n"
        s = load_strategy(str(path), load_model(gpt_file), preset("dgx-a100-80gb:1"))
        assert s.found_by["algorithm"] == f"baseline:{kind}"

    def test_json_summary(self, capsys, tmp_path, gpt_file):
        rc, out, _ = run(capsys, "baseline", "--model", gpt_file, "--cluster", "dgx-a100-80gb:1", "--kind",
                         "megatron", "--tp", "2", "--pp", "2", "--micro-batch", "1", "--json",
                         "-o", str(tmp_path / "s.json"))
        assert rc == 0
        summary = json.loads(out)
        assert summary["devices_used"] == 8 and summary["devices"] == 8
        # dp = 8 devices / (tp 2 x pp 2) = 2; batch 8 / (micro-batch 1 x dp 2) = 4 microbatches
        assert summary["pipeline"] == {"stages": 2, "microbatches": 4, "schedule": "1f1b", "virtual_stages": 1}
        assert summary["options"]["tp"] == 2 and summary["options"]["dp"] == 2

    def test_option_the_kind_does_not_take(self, capsys, tmp_path):
        rc, out, err = run(capsys, "baseline", "--model", "alexnet", "--cluster", "p100-4x4", "--kind",
                           "data-parallel", "--tp", "2", "-o", str(tmp_path / "s.json"))
        assert rc == 2 and out == ""
        assert err == "soapbox: error: data-parallel does not take --tp; it takes --micro-batch\n"
        assert not (tmp_path / "s.json").exists()

    def test_option_it_cannot_honour(self, capsys, tmp_path):
        rc, _, err = run(capsys, "baseline", "--model", "alexnet", "--cluster", "p100-4x4", "--kind", "megatron",
                         "--tp", "3", "-o", str(tmp_path / "s.json"))
        assert rc == 2
        assert err == "soapbox: error: tp (3) x pp (1) does not divide the 16 devices of p100-4x4\n"

    def test_unknown_model(self, capsys, tmp_path):
        rc, _, err = run(capsys, "baseline", "--model", "gpt5", "--cluster", "p100-4x4", "--kind", "expert",
                         "-o", str(tmp_path / "s.json"))
        assert rc == 2
        assert err == ("soapbox: error: unknown model 'gpt5': not a sample (alexnet, inception_v3, resnet101, "
                       "rnntc, rnnlm, nmt, transformer, gpt2, gpt3-175b, bert-large, llama2-7b, mixtral-8x7b, "
                       "deepseek-v3, qwen3-30b-a3b, qwen3-235b-a22b, gpt-oss-120b) nor a file\n")
        assert "Traceback" not in err

    def test_unknown_cluster(self, capsys, tmp_path):
        rc, _, err = run(capsys, "baseline", "--model", "alexnet", "--cluster", "tpu-pod", "--kind", "expert",
                         "-o", str(tmp_path / "s.json"))
        assert rc == 2
        assert err == (f"soapbox: error: unknown cluster 'tpu-pod'; presets: {', '.join(preset_names())} "
                       "(or a cluster file)\n")
        assert err.count(":N") == len(preset_names()) - 3  # all but the three fixed-size presets

    def test_cluster_without_count(self, capsys, tmp_path):
        rc, _, err = run(capsys, "baseline", "--model", "alexnet", "--cluster", "dgx-h100", "--kind", "expert",
                         "-o", str(tmp_path / "s.json"))
        assert rc == 2
        assert err == "soapbox: error: cluster 'dgx-h100' needs a node count: dgx-h100:N, e.g. dgx-h100:2\n"

    def test_missing_model_file(self, capsys, tmp_path):
        missing = tmp_path / "nope.json"
        rc, _, err = run(capsys, "baseline", "--model", str(missing), "--cluster", "p100-4x4", "--kind", "expert",
                         "-o", str(tmp_path / "s.json"))
        assert rc == 2
        assert err == f"soapbox: error: {missing}: 1 problem found:\n  - file not found\n"

    def test_unknown_kind_is_a_usage_error(self, capsys, tmp_path):
        with pytest.raises(SystemExit) as exc:
            main(["baseline", "--model", "alexnet", "--cluster", "p100-4x4", "--kind", "zero", "-o",
                  str(tmp_path / "s.json")])
        assert exc.value.code == 2
        assert "argument --kind: invalid choice: 'zero'" in capsys.readouterr().err


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "the following arguments are required: COMMAND" in capsys.readouterr().err


class TestClusterAndSchema:
    def test_cluster_writes_an_editable_file(self, capsys, tmp_path):
        out = tmp_path / "c.json"
        assert main(["cluster", "dgx-h100:2", "-o", str(out)]) == 0
        data = json.loads(out.read_text())
        assert data["format"] == "soapbox.cluster/1" and data["nodes"][0]["repeat"] == 2
        assert main(["validate", str(out)]) == 0
        assert "dgx-h100:2, 2 node(s), 16 GPUs (16 x H100-SXM5-80GB)" in capsys.readouterr().out

    def test_cluster_unknown_preset(self, capsys, tmp_path):
        assert main(["cluster", "tpu-v5", "-o", str(tmp_path / "c.json")]) == 2
        assert "unknown cluster 'tpu-v5'" in capsys.readouterr().err
        assert not (tmp_path / "c.json").exists()

    @pytest.mark.parametrize("kind", ["model", "cluster", "strategy"])
    def test_schema(self, capsys, kind):
        assert main(["schema", kind]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["properties"]["format"] == {"const": f"soapbox.{kind}/1"}


class TestLayoutOptions:
    """Issue 12: the distributed optimizer and uneven pipeline stages from the command line."""

    def test_megatron_with_zero_and_layers_per_stage(self, capsys, tmp_path):
        out_path = tmp_path / "s.json"
        rc, out, err = run(capsys, "baseline", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--kind", "megatron",
                           "--tp", "2", "--pp", "2", "--micro-batch", "1", "--zero-stage", "1",
                           "--layers-per-stage", "5,7", "--json", "-o", str(out_path))
        assert rc == 0 and err == ""
        summary = json.loads(out)
        assert summary["options"]["zero_stage"] == 1 and summary["pipeline"]["stages"] == 2
        s = load_strategy(str(out_path))
        assert s.zero_stage == 1
        assert sorted(set(s.stage_of.values())) == [0, 1]

    @pytest.mark.parametrize("text", ["5,x", "0,12", "", "5,-7"])
    def test_bad_layer_counts(self, capsys, text):
        with pytest.raises(SystemExit):
            main(["baseline", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--kind", "megatron",
                  "--layers-per-stage", text, "-o", "x.json"])
        assert "is not a list of positive layer counts" in capsys.readouterr().err


def test_sample_model_sequence_length_and_precision(capsys):
    """Issue 16: --seq-len and --model-precision for a sample model (the page's header has them
    too); a CNN has no sequence length: refused naming it."""
    from engine.cli import main as cli

    assert cli(["simulate", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--strategy", "data-parallel",
                "--seq-len", "512", "--model-precision", "bf16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    full = cli(["simulate", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--strategy", "data-parallel", "--json"])
    assert full == 0
    base = json.loads(capsys.readouterr().out)
    assert out["iteration_time_s"] < base["iteration_time_s"]  # half the tokens, in bf16 on an A100
    assert cli(["simulate", "--model", "alexnet", "--cluster", "p100-4x4", "--strategy", "data-parallel",
                "--seq-len", "512"]) != 0
    assert "alexnet has no sequence length to set" in capsys.readouterr().err
