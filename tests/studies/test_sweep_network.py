"""Issue 43: the co-design sweep's network axis (``soapbox sweep --network``): NICs a node, their
rate, a fabric of oversubscribed pods; each point on each network, the rows saying which."""

from __future__ import annotations

import csv

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cli import main
from engine.cluster import preset
from engine.cluster.network import network_label, network_of, parse_variant, with_network
from engine.errors import ValidationError
from engine.studies.network import network_points, parse_network
from engine.studies.sweep import parse_clusters, parse_grid, points, run_sweep, sweep_points


def test_parse_network_checks_every_value():
    assert parse_network(["nics=4,8,4", "nic_gbps=200", "pod=256", "oversub=1,2.5"]) == \
        {"nics": [4, 8], "nic_gbps": [200.0], "pod": [256], "oversub": [1.0, 2.5]}
    assert parse_network([]) == {}
    for bad, says in ((["nics"], "KEY=V1,V2"), (["wires=2"], "KEY=V1,V2"), (["nics=0"], "NICs a node"),
                      (["nics=2.5"], "whole number"), (["nic_gbps=nan"], "Gb/s"), (["nic_gbps=-1"], "Gb/s"),
                      (["oversub=0.5", "pod=8"], "oversubscription"),
                      (["nics=1", "nics=2"], "given twice"), (["nics=" + ",".join(map(str, range(1, 300)))], "256")):
        with pytest.raises(ValueError, match=says):
            parse_network(bad)


def test_points_on_every_network_points_outermost():
    pts = [{"cluster": "a:1", "tp": 1}, {"cluster": "a:1+nic_gbps=100+nics=2", "tp": 2}]
    out = network_points(pts, {"nics": [1, 8], "oversub": [1.0]})
    assert out == [{"cluster": "a:1+nics=1+oversub=1", "tp": 1}, {"cluster": "a:1+nics=8+oversub=1", "tp": 1},
                   {"cluster": "a:1+nics=1+nic_gbps=100+oversub=1", "tp": 2},  # (the name's own nics replaced)
                   {"cluster": "a:1+nics=8+nic_gbps=100+oversub=1", "tp": 2}]
    assert network_points(pts, {}) is pts
    with pytest.raises(ValueError, match="more than the 3"):
        network_points(pts, {"nics": [1, 2]}, max_points=3)
    assert parse_clusters("dgx-h100:8,16+nics=4 p100-4x4+nic_gbps=25") == \
        ["dgx-h100:8+nics=4", "dgx-h100:16+nics=4", "p100-4x4+nic_gbps=25"]


def test_a_preset_named_with_its_network():
    c = preset("dgx-h100:16+oversub=2+pod=64")
    assert c.name == "dgx-h100:16+pod=64+oversub=2" and (c.pod_gpus, c.oversubscription) == (64, 2.0)
    assert parse_variant("nics=4+nic_gbps=12.5", "x") == {"nics": 4, "nic_gbps": 12.5}
    for bad, says in (("dgx-h100:16+nics", "not KEY=VALUE"), ("dgx-h100:16+wires=2", "not a network key"),
                      ("dgx-h100:16+nics=0", "NICs a node must be a whole number from 1"),
                      ("dgx-h100:16+nics=1+nics=2", "given twice"), ("dgx-h100:16+oversub=2", "needs pod=GPUS"),
                      ("dgx-h100:16+nics=16", "at most one NIC per GPU"), ("nope:2+nics=1", "unknown cluster 'nope:2'"),
                      ("dgx-h100:16+nic_gbps=inf", "Gb/s")):
        with pytest.raises(ValueError, match=says):
            preset(bad)


def test_with_network_sets_the_nics_and_their_rate():
    """dgx-a100-80gb:2 (8 NICs of 200 Gb/s a node) with 2 NICs of 400 Gb/s: 2 up and 2 down links
    a node at 50 GB/s each; GPUs 0-3 on NIC 0, 4-7 on NIC 1; the nodes and GPUs as they were."""
    base = preset("dgx-a100-80gb:2")
    c = with_network(base, nics=2, nic_gbps=400)
    net = [lk for lk in c.links if lk.kind == "network"]
    assert len(net) == 2 * 2 * 2 and all(lk.bw_bytes_per_s == 50e9 for lk in net)
    assert len([lk for lk in base.links if lk.kind == "network"]) == 2 * 2 * 8
    assert c.num_devices == base.num_devices and c.gpus_per_node == base.gpus_per_node
    assert network_of(c) == {"nics": 2, "nic_gbps": 400.0, "pod_gpus": 0, "oversub": 1.0}
    assert network_of(base) == {"nics": 8, "nic_gbps": 200.0, "pod_gpus": 0, "oversub": 1.0}
    assert c.name == "dgx-a100-80gb:2+nics=2+nic_gbps=400" and with_network(base).name == base.name
    assert network_label({"nics": 1, "nic_gbps": 12.5, "pod_gpus": 0, "oversub": 1.0}) == "1 NIC, 12.5 Gb/s"
    with pytest.raises(ValidationError, match="nics.count.*at most one NIC per GPU"):
        with_network(base, nics=16)
    with pytest.raises(ValidationError, match="pods of 4 GPUs split a node"):
        with_network(base, pod_gpus=4)


def test_oversubscribed_pods_slow_a_collective_across_them_by_the_ratio():
    """An all-reduce group of GPU 0 and GPU 8 (two nodes): with pods of 8 GPUs at 1:4 its rate
    through the NICs is a quarter; within one pod the ratio changes nothing."""
    base = preset("dgx-a100-80gb:4")
    flat = base.collective_group([0, 8])
    over = with_network(base, pod_gpus=8, oversubscription=4.0).collective_group([0, 8])
    same_pod = with_network(base, pod_gpus=16, oversubscription=4.0).collective_group([0, 8])
    assert over.bw_bytes_per_s == flat.bw_bytes_per_s / 4 and over.inter_bw_bytes_per_s == flat.inter_bw_bytes_per_s / 4
    assert (same_pod.bw_bytes_per_s, same_pod.inter_bw_bytes_per_s) == (flat.bw_bytes_per_s, flat.inter_bw_bytes_per_s)


def test_rows_on_each_network():
    """GPT-2 data parallel over two nodes (tp 2, dp 8): one NIC a node is slower than eight and
    100 Gb/s than 400; a network the nodes cannot have (16 NICs for 8 GPUs) is a row saying why,
    with its point's layout, the other rows still priced."""
    pts = sweep_points("gpt2", ["tp=2"], "dgx-a100-80gb:2", ["nics=1,8,16", "nic_gbps=100,400"], batch=32)
    rows = run_sweep("gpt2", pts, backend="serial", batch=32)
    assert [(r["nics"], r["nic_gbps"]) for r in rows[:4]] == [(1, 100.0), (1, 400.0), (8, 100.0), (8, 400.0)]
    assert [r["cluster"] for r in rows[4:]] == ["dgx-a100-80gb:2+nics=16+nic_gbps=100",
                                                "dgx-a100-80gb:2+nics=16+nic_gbps=400"]
    t = {(r["nics"], r["nic_gbps"]): r["iteration_time_s"] for r in rows}
    assert t[(1, 100.0)] > t[(1, 400.0)] > t[(8, 400.0)] and t[(1, 100.0)] > t[(8, 100.0)] > t[(8, 400.0)]
    for r in rows[4:]:
        assert r["feasible"] is False and r["iteration_time_s"] is None and r["tp"] == 2 and r["gpus"] == 16
        assert "at most one NIC per GPU" in r["why"]
    assert all(r["pod_gpus"] == 0 and r["oversub"] == 1.0 for r in rows[:4])
    with pytest.raises(ValueError, match="--clusters .nope:2.: unknown cluster"):  # (no preset: said at once)
        sweep_points("gpt2", ["tp=2"], "nope:2", ["nics=1"], batch=32)


def test_rows_on_other_networks_equal_the_full_simulation():
    """A pipeline longer than the reference keeps (GPT-2, pp 6 on six nodes), on 2 and 4 NICs of
    50 Gb/s a node: every row holds its cluster's full simulation's figures. Where one NIC
    carries several data-parallel replicas' transfers (tp 1 on 2 or 4 NICs, tp 2 on 2) the
    composed reference does not keep their queue in order, so those rows are simulated and say
    why; tp 2 on 4 NICs is composed (engine.sim.hier)."""
    from engine.formats import resolve_model
    from engine.layout import Layout
    from engine.layout.build import build_layout
    from engine.sim.report import simulate_strategy

    pts = network_points(points(parse_grid(["tp=1,2", "pp=6", "mb=1"]), parse_clusters("dgx-a100-80gb:6")),
                         parse_network(["nics=2,4", "nic_gbps=50"]))
    rows = run_sweep("gpt2", pts, backend="serial", batch=48)
    assert [(r["tp"], r["nics"], r["predicted_by"] == "composed") for r in rows] == \
        [(1, 2, False), (1, 4, False), (2, 2, False), (2, 4, True)]
    assert all("the reference composed from its blocks takes" in r["predicted_by"] for r in rows[:3])
    g = resolve_model("gpt2", batch=48)
    own = preset("dgx-a100-80gb:6")
    for r in rows:
        c = with_network(own, nics=r["nics"], nic_gbps=50)
        lay = Layout.from_options(dict(tp=r["tp"], pp=r["pp"], micro_batch=r["mb"]))
        full = simulate_strategy(g, build_layout(g, c, lay), c, check=False)
        assert r["iteration_time_s"] == pytest.approx(full.iteration_time_s, rel=1e-9)
        assert r["peak_memory_bytes"] == pytest.approx(float(full.memory.peak_bytes.max()), rel=1e-9)
        # (the slower network shows: the preset's 8 NICs of 200 Gb/s a node are faster)
        assert r["iteration_time_s"] > simulate_strategy(g, build_layout(g, own, lay), own, check=False).iteration_time_s


def test_cli_network_axis(tmp_path, capsys):
    out, rep = tmp_path / "r.csv", tmp_path / "r.html"
    assert main(["sweep", "--model", "gpt2", "--batch", "32", "--grid", "tp=2", "--clusters", "dgx-a100-80gb:2",
                 "--network", "nics=1,8", "--backend", "serial", "-o", str(out), "--report", str(rep)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["nics"] for r in rows] == ["1", "8"] and all(r["nic_gbps"] == "200.0" for r in rows)
    assert [r["cluster"] for r in rows] == ["dgx-a100-80gb:2+nics=1", "dgx-a100-80gb:2+nics=8"]
    html = rep.read_text()
    assert "dgx-a100-80gb (1 NIC)" in html and "dgx-a100-80gb (8 NICs)" in html
    assert "2 layouts" in capsys.readouterr().out
    assert main(["sweep", "--model", "gpt2", "--grid", "tp=2", "--clusters", "dgx-a100-80gb:2",
                 "--network", "oversub=2", "-o", str(out)]) == 2
    assert "--network: oversub needs pod=GPUS" in capsys.readouterr().err


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(suffix=st.text(alphabet="nicspodvergbu_=+.,-0123456789e ", max_size=40))
def test_any_network_text_is_a_cluster_or_a_message(suffix):
    """Fuzzed text after a preset's ``+``: a cluster named as asked, or a ValueError that says
    what (never another exception)."""
    try:
        c = preset("dgx-h100:2+" + suffix)
    except ValueError as e:
        assert str(e)
    else:
        assert c.name.startswith("dgx-h100:2+") and c.num_devices == 16
        assert preset(c.name).name == c.name  # (the canonical name reads back the same)


def test_oversub_needs_pods_the_asked_or_the_clusters_own():
    """Issue 43's review: ``oversub`` without ``pod`` was refused even where the preset has pods
    (Grand Teton: 3,072 GPUs at 1:7); now it is refused only where no cluster of the sweep has
    pods, and a preset's own oversubscription goes with its pods (``pod=0``: none)."""
    assert [p["cluster"] for p in sweep_points("gpt2", ["tp=4"], "grand-teton:512", ["oversub=1,2"])] == \
        ["grand-teton:512+oversub=1", "grand-teton:512+oversub=2"]
    assert preset("grand-teton:2+oversub=2").oversubscription == 2.0
    assert preset("grand-teton:2+pod=0").oversubscription == 1.0
    for bad in ("dgx-h100:2+oversub=2", "grand-teton:2+pod=0+oversub=2"):
        with pytest.raises(ValueError, match=r"oversub needs pod=GPUS"):
            preset(bad)
    with pytest.raises(ValueError, match=r"^--network: oversub needs pod=GPUS"):
        sweep_points("gpt2", ["tp=4"], "dgx-h100:2", ["oversub=2"])


@pytest.mark.parametrize("value", ["123.4567", "1000000.5", "0.125", "9999999.75"])
def test_a_variants_name_builds_the_same_network(value):
    """Issue 43's review: a rate written with six digits (``%g``) renamed 123.4567 Gb/s 123.457
    and 1000000.5 ``1e+06``, whose ``+`` then ended the value. The name now holds the exact
    value and builds the same cluster again; the base is named as the preset names itself."""
    c = preset(f"dgx-h100:2+nic_gbps={value}")
    assert c.name == f"dgx-h100:2+nic_gbps={value}"
    rate = float(value) * 1e9 / 8
    assert preset(c.name).node_specs[0].nic_bw_bytes_per_s == c.node_specs[0].nic_bw_bytes_per_s == rate
    assert preset("dgx-h100:02+nics=4").name == "dgx-h100:2+nics=4"


def test_cluster_files_in_a_sweep(tmp_path):
    """Issue 43's review: a cluster file whose path holds a ``+`` was split there and refused;
    ``--network`` on a cluster file named variants no one could build (every row infeasible).
    The file is taken whole, and a network on it is refused up front."""
    import json

    path = tmp_path / "a+b.json"
    path.write_text(json.dumps(preset("dgx-h100:2").to_dict()))
    assert [p["cluster"] for p in sweep_points("gpt2", ["tp=4"], str(path))] == [str(path)]
    with pytest.raises(ValueError, match=r"^--network: .* is a cluster file"):
        sweep_points("gpt2", ["tp=4"], str(path), ["nics=4"])
