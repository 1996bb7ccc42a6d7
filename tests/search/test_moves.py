"""One strategy space (issue 13): MCMC's global moves (settings, the layer split, a block's
degrees, whole layouts) are checked whole by the loader's own check, and the final polish
leaves a strategy no move of any kind improves."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from engine.cluster import DEVICE_TYPES, Cluster, NodeSpec
from engine.costs import CostModel
from engine.sim.delta import DeltaSimulator
from engine.errors import ValidationError
from engine.formats import load_strategy
from engine.models.transformer import GPTConfig, gpt
from engine.search import Budget
from engine.search.api import MCMCOptions, price
from engine.search.baselines import data_parallel
from engine.search.chains import candidate_configs
from engine.search.polish import local_polish
from engine.search.mcmc import mcmc
from engine.search.moves import GLOBAL_KINDS, Space
from engine.strategy import validate_strategy
from engine.layout import Layout, build_layout


def tiny_gpt(layers: int = 4, batch: int = 16) -> object:
    return gpt(GPTConfig(layers=layers, hidden=128, heads=4, seq_len=64, vocab=512, batch=batch, name="tiny"))


def small_cluster(nodes: int = 2, gpus: int = 4) -> Cluster:
    spec = NodeSpec("node", gpus, "P100-SXM2-16GB", "mesh", 20e9, nics=1, nic_bw_bytes_per_s=12.5e9,
                    attach_bw_bytes_per_s=16e9, repeat=nodes)
    return Cluster(f"small-{nodes}x{gpus}", [spec], DEVICE_TYPES, "test cluster")


def loader_verdict(strategy, graph, cluster) -> bool:
    """Whether the strategy, written and read back, is accepted by the loader."""
    try:
        load_strategy(json.loads(json.dumps(strategy.to_dict())), graph, cluster)
    except ValidationError:
        return False
    return True


def test_every_move_kind_is_validated_as_the_loader_validates():
    g, c = tiny_gpt(), small_cluster()
    space = Space(g, c)
    starts = [data_parallel(g, c), build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1)),
              build_layout(g, c, Layout(pp=2, vpp=2, micro_batch=2)), build_layout(g, c, Layout(tp=2, micro_batch=2,
                                                                                                zero_stage=1))]
    valid = {k: 0 for k in GLOBAL_KINDS}
    refused = 0
    rng = random.Random(0)
    for s in starts:
        for kind in space.kinds(s):
            cands = list(space.neighbours(s, kind)) + [space.propose(s, kind, rng) for _ in range(5)]
            for cand in cands:
                if cand is None:
                    continue
                ok = not validate_strategy(cand, g, c)
                assert ok == loader_verdict(cand, g, c), (kind, validate_strategy(cand, g, c)[:2])
                valid[kind] += ok
                refused += not ok
                if ok and valid[kind] <= 3:  # (a few of each simulate: pricing all takes long)
                    assert math.isfinite(price(g, cand, c).time_s)
    assert all(valid[k] > 0 for k in GLOBAL_KINDS), valid  # every kind made valid moves
    assert refused > 0  # and some were refused (block degrees that do not divide the microbatches)


def test_a_layer_moved_across_a_stage_boundary_keeps_its_stage_devices():
    g, c = tiny_gpt(), small_cluster()
    s = build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1))
    moves = list(Space(g, c).neighbours(s, "split"))
    assert len(moves) == 2  # the last layer of stage 0 forward, the first of stage 1 back
    for m in moves:
        assert not validate_strategy(m, g, c)
        for name, stage in m.stage_of.items():
            devs = set(m.configs[name].devices)
            assert devs <= set(range(4 * stage, 4 * stage + 4)), (name, stage, devs)
    counts = sorted(sum(1 for n, st in m.stage_of.items() if st == 0 and n.endswith(".attn.q")) for m in moves)
    assert counts == [1, 3]  # 2 + 2 layers became 1 + 3 and 3 + 1


def test_mcmc_global_moves_only_reach_valid_strategies():
    g, c = tiny_gpt(), small_cluster()
    r = mcmc(g, c, Budget(iterations=60), seed=2, options=MCMCOptions(global_share=1.0, polish=False))
    assert not validate_strategy(r.best, g, c)
    assert r.best_cost_s <= min(r.baselines.values())
    assert loader_verdict(r.best, g, c)


def test_global_share_is_checked():
    g, c = tiny_gpt(), small_cluster()
    with pytest.raises(ValueError, match="global_share"):
        mcmc(g, c, Budget(iterations=5), options=MCMCOptions(global_share=1.5))


def test_mcmc_finds_a_pipeline_where_data_parallel_does_not_fit():
    """With memory the binding constraint (a model too large for data parallelism), global
    moves reach a strategy that fits: ZeRO, recomputation, stages or tensor parallelism."""
    g = gpt(GPTConfig(layers=16, hidden=2048, heads=16, seq_len=1024, vocab=8192, batch=16, name="wide"))
    c = small_cluster()
    dp = price(g, data_parallel(g, c), c)
    assert not dp.feasible
    r = mcmc(g, c, Budget(iterations=40), seed=0, options=MCMCOptions(global_share=0.9, polish=False, chains=2))
    assert r.feasible, r.notes
    assert not validate_strategy(r.best, g, c)


def test_local_optimality_under_every_move_kind():
    """After the polish no single-op config and no move of any global kind improves the
    strategy (checked here by trying every one of them again)."""
    g, c = tiny_gpt(layers=2, batch=8), small_cluster(nodes=2, gpus=2)
    cost = CostModel()
    start = mcmc(g, c, Budget(iterations=80), seed=1, options=MCMCOptions(polish=False)).best
    best, best_cost, done = local_polish(g, c, start, cost)
    assert done
    assert best_cost == pytest.approx(price(g, best, c, cost).cost_s, rel=1e-9)
    sim = DeltaSimulator(g, best, c, cost)
    m = max(1, best.pipeline.microbatches)
    tried = 0
    for op in g.ops:
        for config in candidate_configs(op, c.num_devices, m):
            if config == sim.strategy[op.name] or sim.check(op.name, config):
                continue
            sim.change(op.name, config)
            assert price(g, sim.strategy, c, cost, timeline=sim.timeline).cost_s >= best_cost * (1 - 1e-9), op.name
            sim.revert()
            tried += 1
    space = Space(g, c)
    for kind in space.kinds(best):
        for cand in space.neighbours(best, kind):
            if validate_strategy(cand, g, c):
                continue
            assert price(g, cand, c, cost).cost_s >= best_cost * (1 - 1e-9), kind
            tried += 1
    assert tried > 100


@pytest.mark.parametrize("model", ["alexnet", "rnntc"])
def test_the_memory_bound_answers_as_the_full_report(model):
    """fits_in_memory (a bound first, the timeline only when the bound does not fit) equals
    memory_report(...).feasible, on random strategies and on tight capacities."""
    from dataclasses import replace as dc_replace

    from engine.cluster import preset
    from engine.formats import resolve_model
    from engine.sim.memory import fits_in_memory, memory_report
    from engine.search.chains import random_config
    from engine.sim.full import simulate
    from engine.taskgraph import build_task_graph

    g, c = resolve_model(model), preset("p100-4x4")
    rng = random.Random(5)
    s = data_parallel(g, c)
    answers = set()
    for k in range(12):
        configs = dict(s.configs)
        for op in rng.sample(g.ops, 6):
            configs[op.name] = random_config(op, c.num_devices, rng)
        t = dc_replace(s, configs=configs, recompute=rng.choice(["none", "full"]), zero_stage=rng.choice([0, 3]))
        tl = simulate(build_task_graph(g, t, c))
        report = memory_report(g, t, c, tl)
        # a capacity between the static memory and the peak makes the bound and the report differ
        cap = float(np.max(report.static_bytes) + 0.9 * np.max(report.activations_peak_bytes)) if k % 2 else None
        cc = c if cap is None else _with_capacity(c, cap)
        want = memory_report(g, t, cc, tl).feasible
        assert fits_in_memory(g, t, cc, tl) == want
        answers.add(want)
    assert answers == {True, False}


def _with_capacity(cluster, capacity_bytes: float):
    from dataclasses import replace as dc_replace

    types = {n: dc_replace(t, memory_bytes=capacity_bytes) for n, t in cluster.device_types.items()}
    return Cluster(cluster.name, cluster.node_specs, types, cluster.description)
