"""``--batch`` / ``--batch-per-gpu`` for sample models (FlexFlow's weak scaling: 64 samples per
GPU), in simulate, baseline and search; refused for model files with the reason."""

from __future__ import annotations

import json

import pytest

from engine.cli import main
from engine.formats import load_strategy, resolve_model
from engine.models import build_sample
from engine.cluster import preset


def test_sample_builders_take_a_batch():
    assert build_sample("inception_v3", 1024).batch_size == 1024
    assert resolve_model("rnnlm", batch=128).batch_size == 128
    assert build_sample("alexnet").batch_size == 256  # the default is unchanged
    with pytest.raises(ValueError, match="batch must be a whole number of samples"):
        build_sample("alexnet", 0)


def test_cli_batch_per_gpu(tmp_path, capsys):
    out = tmp_path / "dp.json"
    assert main(["baseline", "--model", "alexnet", "--cluster", "p100-4x4", "--kind", "data-parallel",
                 "--batch-per-gpu", "64", "-o", str(out)]) == 0
    g = resolve_model("alexnet", batch=64 * 16)
    s = load_strategy(out, g, preset("p100-4x4"))  # made for the 1,024-sample model (its fingerprint)
    assert s.configs["data"].degree("sample") == 16
    capsys.readouterr()
    assert main(["simulate", "--model", "alexnet", "--cluster", "p100-4x4", "--strategy", "data-parallel",
                 "--batch", "512", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "alexnet"
    assert main(["search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc", "--budget", "10",
                 "--batch", "128", "--quiet"]) == 0


def test_a_model_file_keeps_its_batch(tmp_path, capsys):
    f = tmp_path / "m.json"
    assert main(["model", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "32",
                 "--vocab", "100", "--batch", "8", "-o", str(f)]) == 0
    capsys.readouterr()
    assert main(["simulate", "--model", str(f), "--cluster", "p100-4x4", "--strategy", "data-parallel",
                 "--batch", "16"]) == 2
    assert "a batch can be set for a sample model" in capsys.readouterr().err
