"""ZeRO-Offload and ZeRO-Infinity (Ren et al. ATC'21; Rajbhandari et al. SC'21): offloaded
optimizer state and parameters leave the GPU for host memory (or NVMe), the optimizer step
runs on the host, and a host too small makes the plan infeasible."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.cluster import preset
from engine.costs.offload import CPU_ADAM_PARAMS_PER_S, NVME_BW_BYTES_PER_S, host_optimizer_time_s
from engine.formats import resolve_model
from engine.sim.memory_static import HOST_MEMORY_BYTES_PER_GPU, OFFLOAD_STATE_BYTES_PER_PARAM
from engine.sim.report import simulate_strategy
from engine.search.baselines import data_parallel
from engine.layout.build import fsdp
from engine.taskgraph import UPDATE
from toys import IDEAL, mlp, toy_cluster
from engine.layout import Layout, build_layout

#: the toy MLP's parameters (2 layers of 1000 x 1000 + 1000 biases) and their ZeRO shard on
#: each of the toy cluster's 2 GPUs
PARAMS = 2 * (1000 * 1000 + 1000)
SHARD = PARAMS / 2


def _toy(host_memory_bytes: int = 0):
    """The toy cluster's 2 GPUs with a 10 GB/s host link each and ``host_memory_bytes`` of host
    memory per GPU (0: unstated), set here so the cases do not hang on the cluster's defaults."""
    c = toy_cluster()
    c.host_bw_bytes_per_s = lambda d: 1e10
    c.host_memory_bytes = lambda d: host_memory_bytes
    return c


def _run(zero=1, offload_optimizer="none", offload_params="none", cluster=None):
    g = mlp(bias=True)  # fp32
    c = cluster or _toy()
    s = replace(data_parallel(g, c), zero_stage=zero, offload_optimizer=offload_optimizer,
                offload_params=offload_params)
    return simulate_strategy(g, s, c, IDEAL)


def _update_s(r) -> list[float]:
    """The optimizer steps' seconds of the devices simulated (a mirrored device's is 0)."""
    tg = r.tasks
    dur = tg.dur_s[tg.kind == UPDATE]
    return dur[dur > 0].tolist()


class TestOptimizerOffloadMemory:
    def test_frees_the_optimizer_state_and_moves_it_to_the_host(self):
        on, off = _run(), _run(offload_optimizer="cpu")
        assert on.memory.optimizer_bytes.tolist() == [8 * SHARD] * 2  # fp32 Adam: two moments
        assert off.memory.optimizer_bytes.tolist() == [0.0] * 2
        np.testing.assert_array_equal(off.memory.weights_bytes, on.memory.weights_bytes)
        np.testing.assert_array_equal(off.memory.grads_bytes, on.memory.grads_bytes)
        # freed on the GPU: exactly 8 bytes per parameter of the shard (plus the fragmentation
        # allowance on them)
        freed = on.memory.allocated_peak_bytes - off.memory.allocated_peak_bytes
        assert freed.tolist() == [8 * SHARD] * 2
        # on the host: fp32 master weight, gradient, momentum, variance
        assert off.memory.host_bytes.tolist() == [OFFLOAD_STATE_BYTES_PER_PARAM * SHARD] * 2
        assert on.memory.host_bytes.tolist() == [0.0] * 2
        # a cluster that states no host memory: the stated default (1 TiB per 8-GPU node)
        assert off.memory.host_capacity_bytes.tolist() == [HOST_MEMORY_BYTES_PER_GPU] * 2

    def test_nvme_keeps_the_state_off_the_host(self):
        r = _run(offload_optimizer="nvme")
        assert r.memory.host_bytes.tolist() == [0.0] * 2
        assert r.memory.nvme_bytes.tolist() == [16 * SHARD] * 2

    def test_a_host_too_small_is_infeasible_and_says_host_memory(self):
        r = _run(offload_optimizer="cpu", cluster=_toy(host_memory_bytes=1_000_000))  # 1 MB per GPU
        assert not r.memory.feasible and r.memory.over_capacity() == []
        assert r.memory.over_host_capacity()[0] == (0, 16 * SHARD - 1_000_000)
        assert "host memory" in r.memory.host_message()
        assert not r.feasible
        assert "host memory" in " ".join(r.summary()["notes"])


class TestOptimizerOffloadTime:
    def test_the_step_runs_on_the_host(self):
        """Gradients down (4 B), CPU-Adam at half the host (2 GPUs share it), params up (4 B)
        over the toy's 10 GB/s host link."""
        want = SHARD * (4 + 4) / 1e10 + SHARD * 2 / CPU_ADAM_PARAMS_PER_S
        assert want == pytest.approx(0.00124124, abs=1e-12)  # 0.8008 ms of copies + 0.44044 ms of CPU-Adam
        off = _run(offload_optimizer="cpu")
        assert _update_s(off) == pytest.approx([want], rel=1e-12)
        assert _update_s(_run()) == []  # (IDEAL prices the GPU's step at 0)

    def test_nvme_adds_reading_and_writing_the_state(self):
        on_host = _update_s(_run(offload_optimizer="cpu"))
        nvme = _update_s(_run(offload_optimizer="nvme"))
        extra = SHARD * 2 * 16 * 2 / NVME_BW_BYTES_PER_S  # read + write, the node's NVMe shared by 2
        assert nvme == pytest.approx([t + extra for t in on_host], rel=1e-12)

    def test_host_optimizer_time_formula(self):
        assert host_optimizer_time_s(0) == 0.0
        # 1e9 params, 25 GB/s: 4 GB of copies (0.16 s) + 0.22 s of CPU-Adam (ZeRO-Offload's figure)
        assert host_optimizer_time_s(1e9, 25e9) == pytest.approx(0.38, rel=1e-12)


class TestParameterOffload:
    def test_zero3_parameters_leave_the_gpu(self):
        on, off = _run(zero=3), _run(zero=3, offload_params="cpu")
        assert on.memory.weights_bytes.tolist() == [4 * SHARD] * 2
        assert off.memory.weights_bytes.tolist() == [0.0] * 2
        assert off.memory.host_bytes.tolist() == [4 * SHARD] * 2
        np.testing.assert_array_equal(off.memory.gathered_bytes, on.memory.gathered_bytes)  # the working set stays
        # every gather (forward and backward, one microbatch) first fetches the shard from the host
        fetch = 2 * SHARD * 4 / 1e10
        assert _update_s(on) == [] and _update_s(off) == pytest.approx([fetch], rel=1e-12)  # (IDEAL: the GPU's step is 0)


class TestValidation:
    def test_offload_needs_zero(self):
        g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
        with pytest.raises(ValueError, match="ZeRO stage 1"):
            build_layout(g, c, Layout(tp=2, offload_optimizer="cpu"))
        s = fsdp(g, c, Layout(zero_stage=3, offload_optimizer="cpu"))
        assert s.offload_optimizer == "cpu"

    def test_cli(self, capsys):
        from engine.cli import main

        rc = main(["simulate", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--strategy", "fsdp",
                   "--offload-optimizer", "cpu"])
        out = capsys.readouterr().out
        assert rc == 0 and "host memory" in out and "optimizer state" not in out.split("peak memory")[1].split("\n")[0]
        rc = main(["simulate", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--strategy", "megatron",
                   "--offload-optimizer", "cpu"])
        assert rc == 2 and "needs ZeRO stage 1" in capsys.readouterr().err
