"""Issue 44: exporting a strategy made for an imported model, or for a sample at another
sequence length or precision, says what to give (``--model FILE``, ``--seq-len`` ...) and then
exports."""

from __future__ import annotations

import json

import pytest

from engine.cli import main

LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 1000, "max_position_embeddings": 2048,
         "torch_dtype": "bfloat16"}


def test_an_imported_model_is_pointed_to_with_model_file(tmp_path, capsys):
    cfg, model, strategy = tmp_path / "config.json", tmp_path / "m.json", tmp_path / "s.json"
    cfg.write_text(json.dumps(LLAMA))
    assert main(["import", "--hf", str(cfg), "--batch", "64", "--name", "my-llama", "-o", str(model)]) == 0
    assert main(["baseline", "--model", str(model), "--cluster", "dgx-a100-80gb:1", "--kind", "megatron", "--tp", "2",
                 "-o", str(strategy)]) == 0
    capsys.readouterr()
    assert main(["export", "--format", "megatron", str(strategy)]) != 0
    err = capsys.readouterr().err
    assert "names model 'my-llama', which is not a sample: give the model file it was made for with --model FILE" in err
    assert main(["export", "--format", "megatron", "--model", str(model), str(strategy)]) == 0
    assert "--tensor-model-parallel-size 2" in capsys.readouterr().out


def test_a_sample_at_another_sequence_length_exports_with_it(tmp_path, capsys):
    strategy = tmp_path / "s.json"
    assert main(["baseline", "--model", "gpt2", "--seq-len", "512", "--cluster", "dgx-a100-80gb:1", "--kind",
                 "megatron", "--tp", "2", "-o", str(strategy)]) == 0
    capsys.readouterr()
    assert main(["export", "--format", "megatron", str(strategy)]) != 0
    assert "give the --batch, --seq-len and --model-precision it was made with" in capsys.readouterr().err
    assert main(["export", "--format", "megatron", "--seq-len", "512", str(strategy)]) == 0
    assert "--seq-length 512" in capsys.readouterr().out


def test_model_gpt_builds_a_mixture_of_experts(tmp_path, capsys):
    """Issue 44: ``soapbox model gpt`` had no MoE flags. Mixtral 8x7B's shape gives the sample's
    46,702,792,704 parameters; a half-given MoE shape is refused naming what is missing."""
    from engine.formats import load_model, resolve_model

    out = tmp_path / "mx.json"
    assert main(["model", "gpt", "--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8", "--seq-len",
                 "4096", "--vocab", "32000", "--batch", "256", "--experts", "8", "--top-k", "2", "--expert-ffn",
                 "14336", "--precision", "bf16", "-o", str(out)]) == 0
    g = load_model(str(out))
    assert g.param_count == resolve_model("mixtral-8x7b").param_count == 46_702_792_704
    assert sum(op.kind == "experts" for op in g.ops) == 32
    capsys.readouterr()
    assert main(["model", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "16", "--vocab",
                 "100", "--batch", "2", "--experts", "4", "-o", str(out)]) != 0
    assert "needs both --experts and --top-k" in capsys.readouterr().err
