"""Issue 14: models from PyTorch modules, built on the meta device (no weights) and captured
with torch.export; imported MLP, CNN and transformer block equal the hand-built soapbox models,
and soapbox's GEMM FLOPs equal torch.utils.flop_counter's."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn as nn

from engine.cli import main
from engine.cluster import preset
from engine.errors import ValidationError
from engine.formats import load_model
from engine.graph import GraphBuilder
from engine.models.torch_import import import_torch, load_factory
from engine.sim.report import simulate_strategy
from engine.search.baselines import data_parallel


def mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)), torch.randn(32, 784)


def cnn():
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(32, 10))
    return m, torch.randn(8, 3, 32, 32)


class Block(nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, s, d = x.shape
        h = self.ln1(x)
        q, k, v = (f(h).view(b, s, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


def block():
    return Block(), torch.randn(2, 16, 64)


def kinds(g):
    return [o.kind for o in g.ops]


def test_mlp_equals_the_hand_built_model():
    g, notes = import_torch(mlp)
    b = GraphBuilder("mlp")
    x = b.input("x", [32, 784])
    b.add("linear", "fc2", [b.add("relu", "r", [b.add("linear", "fc1", [x], out_features=256)])], out_features=10)
    hand = b.build()
    assert [(o.kind, o.out_tensors[0].shape, o.fwd_flops, o.param_count) for o in g.ops] == \
        [(o.kind, o.out_tensors[0].shape, o.fwd_flops, o.param_count) for o in hand.ops]
    assert g.param_count == sum(p.numel() for p in mlp()[0].parameters())
    assert any("flop_counter 1.301e+07, soapbox 1.301e+07" in n for n in notes)


def test_cnn_equals_the_hand_built_model():
    g, notes = import_torch(cnn)
    assert kinds(g) == ["input", "conv2d", "batchnorm", "relu", "pool2d", "conv2d", "pool2d", "reshape", "linear"]
    assert g.param_count == sum(p.numel() for p in cnn()[0].parameters())
    b = GraphBuilder("cnn")
    x = b.input("x", [8, 3, 32, 32])
    a = b.add("conv2d", "c1", [x], out_channels=16, kernel=[3, 3], stride=[1, 1], padding=[1, 1], bias=True)
    p = b.add("pool2d", "p", [b.add("relu", "r", [b.add("batchnorm", "bn", [a])])], mode="max", kernel=[2, 2],
              stride=[2, 2], padding=[0, 0])
    c = b.add("conv2d", "c2", [p], out_channels=32, kernel=[3, 3], stride=[2, 2], padding=[1, 1], bias=False)
    f = b.add("reshape", "f", [b.add("pool2d", "gap", [c], mode="avg", **{"global": True})], shape=[8, 32])
    b.add("linear", "fc", [f], out_features=10)
    hand = b.build()
    assert [(o.kind, o.out_tensors[0].shape, o.fwd_flops, o.bwd_flops) for o in g.ops] == \
        [(o.kind, o.out_tensors[0].shape, o.fwd_flops, o.bwd_flops) for o in hand.ops]
    assert not any("differ" in n for n in notes)


def test_transformer_block_flops_and_parameters():
    g, notes = import_torch(block)
    assert kinds(g).count("linear") == 6 and kinds(g).count("attention") == 1 and kinds(g).count("layernorm") == 2
    assert g.param_count == sum(p.numel() for p in Block().parameters())
    att = next(o for o in g.ops if o.kind == "attention")
    assert att.attrs["causal"] is True and att.out_tensors[0].shape == (2, 4, 16, 16)
    assert any("flop_counter" in n and "differ" not in n for n in notes)
    c = preset("dgx-a100-80gb:1")
    assert simulate_strategy(g, data_parallel(g, c), c).iteration_time_s > 0


def test_unknown_aten_ops_are_listed_then_imported_as_elementwise():
    class Odd(nn.Module):
        def forward(self, x):
            return torch.cumsum(torch.relu(x), dim=-1)

    with pytest.raises(ValidationError, match=r"1 ATen call\(s\) soapbox cannot map: cumsum x 1"):
        import_torch(lambda: (Odd(), torch.randn(4, 8)))
    g, notes = import_torch(lambda: (Odd(), torch.randn(4, 8)), unknown="elementwise")
    assert kinds(g) == ["input", "relu", "elementwise"] and any("cumsum x 1" in n for n in notes)


def test_bad_factories_are_refused():
    with pytest.raises(ValidationError, match="must return"):
        import_torch(lambda: nn.Linear(2, 2))
    for spec in ("no colon", "a:b:c", "../x:y", "os:path;rm"):
        with pytest.raises(ValueError, match="expected MODULE:FUNCTION"):
            load_factory(spec)
    with pytest.raises(ValueError, match="cannot import"):
        load_factory("surely_not_a_module_xyz:f")


def test_cli_import_torch(tmp_path, monkeypatch, capsys):
    (tmp_path / "mymodels.py").write_text(textwrap.dedent('''
        import torch, torch.nn as nn
        def build():
            return nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128)), torch.randn(64, 128)
    '''))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "m.json"
    assert main(["import", "--torch", "mymodels:build", "--name", "ffn", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "flop_counter" in printed
    g = load_model(str(out))
    assert g.name == "ffn" and g.param_count == 128 * 512 + 512 + 512 * 128 + 128
    assert main(["simulate", "--model", str(out), "--cluster", "p100-4x4", "--strategy", "data-parallel",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] > 0
