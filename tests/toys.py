"""Small hand-sized models, clusters and an ideal cost model, shared by the simulator's and the
memory model's tests (every figure in them can be computed by hand)."""

from __future__ import annotations

from engine.cluster import Cluster, DeviceType, NodeSpec
from engine.costs import CostModel
from engine.graph import GraphBuilder
from engine.strategy import Strategy

TOY = DeviceType("toy", {"fp32": 1e12}, 1e18, 10**12)  # 1 TFLOP/s, memory never the bottleneck
#: Ideal costs: peak FLOP/s and link rates reached exactly, no launch overhead, free optimizer.
IDEAL = CostModel(matmul_efficiency=1.0, gemm_k_half=0.0, sustained_fractions=(), bmm_efficiency=1.0, pointwise_efficiency=1.0, memory_efficiency=1.0,
                  kernel_overhead_s=0.0, link_efficiency=1.0, optimizer_bytes_per_param=0.0)


def toy_cluster(gpus=2, nodes=1, bw=1e9, latency=1e-6, topology="mesh", nics=1, nic_bw=1e9):
    spec = NodeSpec("n", gpus, "toy", topology, bw, latency, "nvlink", nics=nics, nic_bw_bytes_per_s=nic_bw,
                    nic_latency_s=latency, attach_bw_bytes_per_s=nic_bw * 10, repeat=nodes)
    return Cluster("toy", [spec], {"toy": TOY})


def mlp(batch=4, width=1000, layers=2, bias=False):
    b = GraphBuilder("mlp")
    x = b.input("x", [batch, width])
    for i in range(layers):
        x = b.add("linear", f"fc{i + 1}", [x], out_features=width, bias=bias)
    return b.build()


def strategy(graph, placements, **kw):
    return Strategy({n: c for n, c in placements.items()}, **kw)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``soapbox ARGV`` in process (argparse's usage errors
    exit with status 2)."""
    from engine.cli import main

    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def tiny():
    """Two linear layers on 4 toy devices: few configs, so every single-op change can be checked by brute
    force and MCMC chains meet the same strategies."""
    b = GraphBuilder("tiny")
    x = b.input("x", [16, 64])
    h = b.add("relu", "act", [b.add("linear", "fc1", [x], out_features=256)])
    y = b.add("linear", "fc2", [h], out_features=64)
    b.add("softmax_cross_entropy", "loss", [y, b.input("labels", [16], dtype="int64")])
    t = DeviceType("toy", {"fp32": 1e12}, 1e11, 10**11)
    c = Cluster("toy", [NodeSpec("n", 4, "toy", "switch", 1e9, 1e-6, nics=1, nic_bw_bytes_per_s=1e9, repeat=1)],
                {"toy": t})
    return b.build(), c
