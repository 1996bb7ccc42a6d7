"""The collective model against published nccl-tests bus bandwidths (issue 42: a term checked
on its own measurement before it touches an end-to-end row), and the per-kind link shares."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

from engine.cluster import preset
from engine.costs import CostModel, group_collective_time_s
from engine.costs.collectives import LINK_SHARE, LinkShares, group_rates

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from check_nccl_tests import rows  # noqa: E402


def test_every_published_bus_bandwidth_within_12_percent():
    res = rows()
    assert len(res) >= 5
    bad = [(r["row_id"], r["error_pct"]) for r in res if abs(r["error_pct"]) > 12.0]
    assert not bad, f"rows off by more than 12%: {bad}"
    assert statistics.median(abs(r["error_pct"]) for r in res) <= 5.0


def test_a_ring_across_nodes_takes_each_link_at_its_own_share():
    """DGX A100 x 2: the ring's NVLink hops (300 GB/s x 0.80 = 240) and its node's eight HDR
    NICs (8 x 25 GB/s x 0.96 = 192) and their PCIe attach (8 x 31.5 x 0.85 = 214.2): 192 GB/s."""
    group = preset("dgx-a100-80gb:2").collective_group(range(16))
    bw, intra, inter = group_rates(group, CostModel().links)
    assert bw == pytest.approx(8 * 25e9 * 0.96, rel=1e-12)
    assert intra == pytest.approx(300e9 * 0.80, rel=1e-12)
    assert inter == pytest.approx(25e9 * 0.96, rel=1e-12)  # a rank's share of its node's NICs


def test_one_number_for_every_link_is_still_accepted():
    group = preset("dgx-a100-80gb:1").collective_group(range(8))
    a = group_collective_time_s("all_gather", 1e9, group, 0.8)
    b = group_collective_time_s("all_gather", 1e9, group, LinkShares({"nvlink": 0.8}, 0.5))
    assert a == b
    assert LinkShares.of(0.7)("nvlink") == 0.7 and LinkShares()("network") == LINK_SHARE["network"]


def test_a_slower_nic_share_slows_only_collectives_that_cross_nodes():
    c = preset("dgx-a100-80gb:2")
    slow = CostModel(link_shares=(("nvlink", 0.80), ("network", 0.48)))
    one, two = c.collective_group(range(8)), c.collective_group(range(16))
    assert group_collective_time_s("all_reduce", 1e9, one, slow.links) == \
        group_collective_time_s("all_reduce", 1e9, one, CostModel().links)
    assert group_collective_time_s("all_reduce", 1e9, two, slow.links) > \
        1.5 * group_collective_time_s("all_reduce", 1e9, two, CostModel().links)


def test_medium_sizes_of_a_one_process_per_gpu_sweep_within_15_percent():
    """nccl-tests from 32 MB to 1 GB on 8 A100s, one process per GPU (NCCL 2.16;
    validation/collectives/nccl_tests_sizes.csv): a regression bound on today's +2.2..+14.7%, every
    size predicted faster than measured (the medium-size rates of NCCL's pipeline are not
    modelled). The single-process sweep beside it (launches serialised on one thread: +69% at
    8 MB) is reported by ``check_nccl_tests.py --sizes``, not bounded."""
    from check_nccl_tests import SIZES_CSV

    res = [r for r in rows(SIZES_CSV) if r["sweep"] == "gcm-a100-80gb"]
    assert len(res) == 6
    assert {r["row_id"]: r["error_pct"] for r in res if abs(r["error_pct"]) > 15.0} == {}
