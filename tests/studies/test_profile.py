"""Issue 14: FlexFlow's "measure each distinct operator once" (``soapbox profile``): the
distinct keys a strategy needs, measured with PyTorch on this CPU, cached across runs, used by
simulate only on the device type they were measured on."""

from __future__ import annotations

import json

import pytest

from engine.cli import main
from engine.cluster import preset
from engine.costs import ProfileTable
from engine.formats import resolve_model
from engine.graph import GraphBuilder
from engine.studies.profiling import MeasurementCache, measure, needed_keys
from engine.search.baselines import data_parallel
from engine.layout import Layout, build_layout


def test_repeated_layers_share_their_keys():
    g, c = resolve_model("gpt2"), preset("p100-4x4")
    keys = needed_keys(g, [build_layout(g, c, Layout(tp=2))], c)
    assert len(keys) < 40 < len(g.ops)  # 12 identical layers: each distinct partition once
    assert len(set(keys)) == len(keys)
    assert all(k[5] == "P100-SXM2-16GB" and k[4] == g.precision for k in keys)
    assert {k[0] for k in keys} >= {"linear", "batch_matmul", "softmax", "layernorm", "embedding"}


def test_hetero_cluster_keys_carry_each_device_type():
    g, c = resolve_model("alexnet"), preset("hetero-demo")
    s = data_parallel(g, c)  # (batch 256 on 12 GPUs: data parallel uses 8, the H100s and A100s)
    keys = needed_keys(g, [s], c)
    assert {k[5] for k in keys} == {c.devices[d].type for d in s.devices_used()} == {"H100-SXM5-80GB",
                                                                                     "A100-SXM4-40GB"}


@pytest.mark.parametrize("key", [
    ("linear", ((8, 32),), ((8, 16),), ((16, 32), (16,))),
    ("conv2d", ((2, 3, 16, 16),), ((2, 8, 8, 8),), ((8, 3, 3, 3),)),
    ("batch_matmul", ((2, 4, 16, 8), (2, 4, 8, 16)), ((2, 4, 16, 16),), ()),
    ("batch_matmul", ((2, 4, 16, 8), (2, 4, 16, 8)), ((2, 4, 16, 16),), ()),  # a @ b^T
    ("attention", ((2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8)), ((2, 4, 16, 8),), ()),
    ("softmax", ((4, 64),), ((4, 64),), ()),
    ("layernorm", ((4, 64),), ((4, 64),), ((64,), (64,))),
    ("embedding", ((4, 8),), ((4, 8, 16),), ((100, 16),)),
    ("pool2d", ((2, 3, 8, 8),), ((2, 3, 4, 4),), ()),
    ("concat", ((2, 3), (2, 5)), ((2, 8),), ()),
    ("transpose", ((4, 6),), ((6, 4),), ()),
    ("softmax_cross_entropy", ((4, 10), (4,)), ((4,),), ()),
])
def test_measure_times_forward_and_backward(key):
    kind, ins, outs, params = key
    m = measure((kind, ins, outs, params, "fp32", "cpu"), "cpu", repeats=3, warmup=1)
    assert m.fwd_s > 0 and m.bwd_s > 0 and m.repeats == 3
    assert m.fwd_spread_s >= 0 and m.bwd_spread_s >= 0


def test_cache_round_trip(tmp_path):
    key = ProfileTable.key("relu", [(4, 4)], [(4, 4)], [], "fp32", "cpu")
    cache = MeasurementCache(str(tmp_path / "m.sqlite"))
    assert cache.get(key, "cpu", "2.13") is None
    m = measure(key, repeats=3, warmup=1)
    cache.put(key, "cpu", "2.13", m)
    cache.close()
    again = MeasurementCache(str(tmp_path / "m.sqlite"))
    assert again.get(key, "cpu", "2.13") == m
    assert again.get(key, "cpu", "2.14") is None  # another torch version measures again


@pytest.fixture()
def mlp_file(tmp_path):
    b = GraphBuilder("mlp")
    x = b.input("x", [64, 256])
    h = b.add("relu", "act", [b.add("linear", "fc1", [x], out_features=512)])
    b.add("linear", "fc2", [h], out_features=256)
    path = tmp_path / "mlp.json"
    path.write_text(json.dumps(b.build().to_dict()))
    return str(path)


def test_cli_measures_once_then_reads_the_cache_and_simulate_reports_the_share(tmp_path, mlp_file, capsys):
    cache, out = str(tmp_path / "m.sqlite"), str(tmp_path / "profile.json")
    base = ["profile", "--model", mlp_file, "--cluster", "p100-4x4", "--cache", cache, "--repeats", "3",
            "--device-type", "P100-SXM2-16GB", "-o", out]
    assert main(base) == 0
    first = capsys.readouterr().out
    assert "3 distinct op partitions" in first and "3 measured now, 0 from the cache" in first
    assert main(base) == 0
    assert "0 measured now, 3 from the cache" in capsys.readouterr().out
    entries = json.loads(open(out).read())["entries"]
    assert {e["kind"] for e in entries} == {"linear", "relu"} and all(e["device_type"] == "P100-SXM2-16GB"
                                                                      for e in entries)
    assert main(["simulate", "--model", mlp_file, "--cluster", "p100-4x4", "--strategy", "data-parallel",
                 "--profile", out, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["profile"]["measured_share_of_compute"] == pytest.approx(1.0)


def test_measurements_apply_only_to_their_device_type(tmp_path, mlp_file, capsys):
    out = str(tmp_path / "profile.json")
    assert main(["profile", "--model", mlp_file, "--cluster", "p100-4x4", "--cache", "none", "--repeats", "3",
                 "-o", out]) == 0  # labelled with this machine's CPU
    capsys.readouterr()
    assert main(["simulate", "--model", mlp_file, "--cluster", "p100-4x4", "--strategy", "data-parallel",
                 "--profile", out]) == 0
    text = capsys.readouterr().out
    assert "measured compute   0.0% of compute time" in text
