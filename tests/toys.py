"""Small hand-sized models, clusters and an ideal cost model, shared by the simulator's and the
memory model's tests (every figure in them can be computed by hand), and the checks and
drawings several packages' tests share (two task graphs or timelines equal bit for bit; a
Megatron layout a hypothesis test drew)."""

from __future__ import annotations

import numpy as np

from engine.cluster import Cluster, DeviceType, NodeSpec
from engine.costs import CostModel
from engine.graph import GraphBuilder
from engine.layout import Layout, build_layout
from engine.strategy import Strategy
from engine.taskgraph import TaskGraph

TOY = DeviceType("toy", {"fp32": 1e12}, 1e18, 10**12)  # 1 TFLOP/s, memory never the bottleneck
#: Ideal costs: peak FLOP/s and link rates reached exactly, no launch overhead, free optimizer.
IDEAL = CostModel(matmul_efficiency=1.0, gemm_k_half=0.0, sustained_fractions=(), bmm_efficiency=1.0, pointwise_efficiency=1.0, memory_efficiency=1.0,
                  kernel_overhead_s=0.0, link_efficiency=1.0, link_shares=(), optimizer_bytes_per_param=0.0)


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


def unrolled(steps: int = 4):
    """``steps`` alike linear layers sharing one weight (an unrolled RNN's time steps, without
    the recurrence), each with its own input and loss, on :func:`tiny`'s 4 toy devices: from data
    parallelism no single step's config beats it by much, the same config on every step does."""
    b = GraphBuilder("unrolled")
    for k in range(steps):
        y = b.add("linear", f"step.t{k}", [b.input(f"x{k}", [16, 64])], out_features=64, param_group="w")
        b.add("softmax_cross_entropy", f"loss.t{k}", [y, b.input(f"labels{k}", [16], dtype="int64")])
    return b.build(), tiny()[1]

#: every array of a TaskGraph, and of a Timeline
TASK_ARRAYS = ("kind", "op", "part", "mb", "device", "dur_s", "size_bytes", "flops", "coll", "link", "res_ptr",
               "res_idx", "succ_ptr", "succ_idx", "npred", "chain_next", "chain_lag_s")


def assert_same_graph(a: TaskGraph, b: TaskGraph) -> None:
    for key in TASK_ARRAYS:
        x, y = getattr(a, key), getattr(b, key)
        assert x.dtype == y.dtype and np.array_equal(x, y), key
    assert a.comm_bytes == b.comm_bytes
    ptr_a, dev_a, coll_a = a.info["coll_devices"]
    ptr_b, dev_b, coll_b = b.info["coll_devices"]
    assert np.array_equal(ptr_a, ptr_b) and np.array_equal(dev_a, dev_b) and np.array_equal(coll_a, coll_b)


def assert_same_timeline(a, b) -> None:
    """Task for task, bit for bit (NaN nowhere: every task runs)."""
    for key in ("start_s", "end_s", "order", "resource_pred"):
        assert np.array_equal(getattr(a, key), getattr(b, key)), key
    assert np.array_equal(a.extra["ready_s"], b.extra["ready_s"])


def random_moves(sim, rng, steps):
    """Up to ``steps`` random single-op moves valid for ``sim`` (a delta simulator): (op, config)
    pairs, each drawn from ``sim``'s strategy as it is when drawn (the caller makes or undoes it)."""
    from engine.search.chains import random_config

    names = [op.name for op in sim.graph.ops]
    for _ in range(steps):
        name = rng.choice(names)
        config = random_config(sim.graph[name], sim.cluster.num_devices, rng)
        if not sim.check(name, config):
            yield name, config


def drawn_megatron(g, c, tp, pp, vpp, mb, sp, zero, recompute, overlap):
    """The Megatron layout a hypothesis test drew (one the builder refuses is not drawn)."""
    from hypothesis import assume

    try:
        return build_layout(g, c, Layout(tp=tp, pp=pp, vpp=vpp if pp > 1 else 1, micro_batch=mb,
                                         sequence_parallel=sp and tp > 1, zero_stage=zero, recompute=recompute,
                                         overlap_grad_reduce=overlap, overlap_param_gather=overlap and zero > 0))
    except ValueError:
        assume(False)
