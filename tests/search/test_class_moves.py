"""The polish's class moves (:mod:`engine.search.polish`): one config given to a class of alike
ops at once (an unrolled RNN's time steps), each candidate priced whole."""

from __future__ import annotations

import pytest

from engine.formats import resolve_model
from engine.search.api import price
from engine.search.baselines import data_parallel
from engine.search.chains import candidate_configs
from engine.search.polish import (CLASS_TRIES, alike_classes, class_tries, coordinate_descent, distinct_first,
                                  visit_order)
from engine.strategy import Config, validate_strategy
from toys import tiny, unrolled  # tests/toys.py


def priced(g, s, c) -> float:
    return price(g, s, c).cost_s


def first_visit(tries: int):
    """The toy's first visit from data parallelism, by brute force: the first op's class, its
    candidates spanning every device, each priced alone ((time, order, config), fastest first),
    and the first ``tries`` of those that beat the start in :func:`class_tries`' order: what a
    class move tries."""
    g, c = unrolled()
    s = data_parallel(g, c)
    base = priced(g, s, c)
    first = visit_order(g)[0]
    wide = [x for x in candidate_configs(g[first], c.num_devices)
            if len(x.devices) == c.num_devices and x != s[first]]
    alone = sorted((priced(g, s.with_config(first, x), c), i, x) for i, x in enumerate(wide))
    tried = class_tries([a for a in alone if a[0] < base])[:tries]
    return g, c, s, alike_classes(g)[first], wide, alone, tried


class TestAlikeClasses:
    def test_an_unrolled_rnns_steps_are_classes(self):
        g = resolve_model("rnnlm")
        classes = alike_classes(g)
        logits = classes["output.t0.logits"]
        assert logits == tuple(f"output.t{k}.logits" for k in range(40))
        assert all(classes[name] is logits for name in logits)
        assert classes["lstm.l0.t5"] != classes["lstm.l1.t5"]  # (each layer its own weights)
        assert "input.embedding" not in classes  # (no twin)

    def test_every_member_alike_and_every_op_in_at_most_one(self):
        g = resolve_model("nmt")
        classes = alike_classes(g)
        for name, members in classes.items():
            assert name in members and len(members) > 1
            assert {(g[m].signature, g[m].param_group) for m in members} == {(g[name].signature, g[name].param_group)}
        assert alike_classes(tiny()[0]) == {}


class TestDistinctFirst:
    def test_a_round_visits_one_op_of_each_class_before_any_twin(self, monkeypatch):
        """On the toy (4 classes of 4: inputs, labels, steps, losses), the descent's first four
        visits are one op of each class, the heaviest (the steps) first."""
        import engine.search.polish as M

        visits = []
        real = M.candidate_configs

        def candidates(op, *a, **k):
            visits.append(op.name)
            return real(op, *a, **k)

        monkeypatch.setattr(M, "candidate_configs", candidates)
        g, c = unrolled()
        classes = alike_classes(g)
        coordinate_descent(g, c, data_parallel(g, c), global_moves=False, max_evals=200)
        assert visits[0] == "step.t0" and len({classes[name] for name in visits[:4]}) == 4

    def test_the_order_is_a_permutation_that_keeps_relative_order(self):
        g = resolve_model("rnntc")
        order = visit_order(g)
        classes = alike_classes(g)
        out = distinct_first(order, classes)
        assert sorted(out) == sorted(order)
        firsts = [name for name in out if name not in classes or classes[name][0] == name]
        assert out[:len(firsts)] == [name for name in order if name in firsts]
        assert out.index("classifier") < len(firsts) == out.index("lstm.l3.t39")  # (t0 has no twin, t1 is first)
        # the twins last in the order first (an unrolled recurrence's steps nearest its output)
        assert out[len(firsts):] == [name for name in order if name not in firsts][::-1]
        assert out[-1] == "lstm.l0.t2"
        assert distinct_first(order, {}) == order


class TestClassTries:
    def test_the_fastest_of_each_batch_degree_first_then_the_fastest_of_the_rest(self):
        """Pinned by hand: the best alone of each batch (``sample``) degree, in the order of their
        times alone, then the fastest others up to :data:`CLASS_TRIES` in all."""
        cfg = {k: Config(d, tuple(range(8))) for k, d in {
            "f8": {"feature": 8}, "f4s2": {"feature": 4, "sample": 2}, "f2s4": {"feature": 2, "sample": 4},
            "f4i2": {"feature": 4, "in_feature": 2}, "s8": {"sample": 8}, "i8": {"in_feature": 8},
            "f2i2s2": {"feature": 2, "in_feature": 2, "sample": 2}, "i2s4": {"in_feature": 2, "sample": 4}}.items()}
        alone = [(1.0, 0, cfg["f8"]), (1.1, 1, cfg["f4i2"]), (1.2, 2, cfg["i8"]), (1.3, 3, cfg["f4s2"]),
                 (1.4, 4, cfg["f2i2s2"]), (1.5, 5, cfg["f2s4"]), (1.6, 6, cfg["i2s4"]), (1.7, 7, cfg["s8"])]
        want = ["f8", "f4s2", "f2s4", "s8", "f4i2", "i8"]  # (degrees 1, 2, 4, 8; then the two fastest left)
        assert class_tries(alone[::-1]) == [cfg[k] for k in want]
        assert CLASS_TRIES == 6 and class_tries([]) == []
        many = [(float(i), i, Config({"sample": 2 ** i} if i else {"feature": 8}, tuple(range(2 ** max(i, 3)))))
                for i in range(8)]  # (eight batch degrees: one each, more than CLASS_TRIES)
        assert class_tries(many) == [c for _, _, c in many]


class TestClassMove:
    def test_the_first_visit_ends_at_the_best_of_the_op_and_its_class(self):
        """From data parallelism, the first op's visit (its candidates that span every device,
        then the class move) ends at the best of: its own best pick, and its :data:`CLASS_TRIES`
        best picks given to all four steps, each priced whole (brute force here). On this model
        the class wins, with a config that is not the op's own best."""
        g, c, s, members, wide, alone, tried = first_visit(CLASS_TRIES)
        whole = {x: priced(g, s.with_configs(members, x), c) for x in tried}
        best = min(whole, key=whole.get)
        assert whole[best] < alone[0][0] and best != alone[0][2]
        r = coordinate_descent(g, c, s, max_evals=len(wide) + len(tried), global_moves=False)
        assert r.evals == len(wide) + len(tried)
        assert r.cost_s == pytest.approx(whole[best], rel=1e-12) == priced(g, r.strategy, c)
        assert all(r.strategy[m] == best for m in members)
        assert all(r.strategy[op.name] == s[op.name] for op in g.ops if op.name not in members)

    @pytest.mark.parametrize("tries", [0, 1, 2])
    def test_a_budget_that_ends_among_the_class_tries_keeps_the_best_so_far(self, tries):
        """Stopped after ``tries`` class candidates: the best of them when it beats the op's own
        pick, else that pick (the op's candidates all priced)."""
        g, c, s, members, wide, alone, tried = first_visit(tries)
        whole = [priced(g, s.with_configs(members, x), c) for x in tried]
        r = coordinate_descent(g, c, s, max_evals=len(wide) + tries, global_moves=False)
        assert not r.finished and r.evals == len(wide) + tries
        assert r.cost_s == pytest.approx(min([alone[0][0], *whole]), rel=1e-12) == priced(g, r.strategy, c)

    def test_the_descent_from_it_is_exact_and_a_local_optimum_of_single_ops(self):
        g, c = unrolled()
        s = data_parallel(g, c)
        r = coordinate_descent(g, c, s)
        assert r.finished and validate_strategy(r.strategy, g, c) == []
        assert r.cost_s == pytest.approx(priced(g, r.strategy, c), rel=1e-12)
        assert r.cost_s < priced(g, s, c)
        for op in g.ops:
            for config in candidate_configs(op, c.num_devices):
                if config != r.strategy[op.name]:
                    assert priced(g, r.strategy.with_config(op.name, config), c) >= r.cost_s * (1 - 1e-9)

    def test_where_no_config_helps_the_op_alone_only_the_aligned_class_is_priced(self, monkeypatch):
        """Of the configs for one op, only those that make it alone faster are tried for its
        class; besides them, each member split as its input's producer splits it
        (:func:`engine.search.class_moves.aligned_candidate`), where that is not the class's
        config already. From the descent's own answer (a local optimum of both), each round (the
        wide one, then the one over every candidate) prices at most that one candidate per class
        and moves nothing."""
        import engine.search.polish as M
        from engine.search.class_moves import aligned_candidate

        g, c = unrolled()
        r = coordinate_descent(g, c, data_parallel(g, c))
        classes = {m for m in alike_classes(g).values()}
        assert r.finished and len(classes) >= 2
        priced_classes = []  # (whole or by the delta simulator: every class candidate goes through priced())
        real = M._Descent.priced
        monkeypatch.setattr(M._Descent, "priced",
                            lambda d, cand, below: priced_classes.append(cand) or real(d, cand, below))
        again = coordinate_descent(g, c, r.strategy, global_moves=False)
        assert again.finished and again.cost_s == r.cost_s
        aligned = [cand for m in classes for cand in aligned_candidate(g, m, r.strategy)]
        assert 0 < len(priced_classes) <= again.rounds * len(aligned) and len(aligned) <= len(classes)
        assert all(any(p.configs == a.configs for a in aligned) for p in priced_classes)

    def test_a_class_candidate_the_strategy_wide_checks_refuse_is_not_priced(self):
        """Hybrid sharding (ZeRO-2 in groups of 4): forty logits ops each split over 2 GPUs break
        the rule that the group divides every op's batch split; each op alone passes its own
        check. Priced whole the candidate was refused; priced by the delta simulator it is too
        (a review found it priced before the strategy-wide checks were asked)."""
        import math
        from dataclasses import replace

        import engine.search.polish as M
        from engine.cluster import preset
        from engine.costs import CostModel

        g, c = resolve_model("rnnlm"), preset("dgx-a100-40gb:8")
        s = replace(data_parallel(g, c), zero_stage=2, shard_group=4)
        assert validate_strategy(s, g, c) == []
        cls = [op.name for op in g.ops if op.name.startswith("output.") and op.name.endswith(".logits")]
        cand = s.with_configs(cls, Config({"sample": 2}, (0, 1)))
        assert len(cls) == 40 and validate_strategy(cand, g, c)
        d = M._Descent(g, c, s, CostModel(), None, None, None, None, None, True)
        assert d.sim is not None and all(d.sim.check(n, cand[n]) == [] for n in cls)  # (each op alone passes)
        assert d.priced(cand, math.inf) is None

    def test_a_class_on_two_pipeline_stages_moves_on_one(self):
        """With a pipeline, only the members on the op's own stage get its config (stages own
        disjoint devices): steps 0-1 on GPUs 0-1, steps 2-3 on GPUs 2-3. From steps 0-1 split
        over their input features, data parallelism helps step 0 alone and both more."""
        from engine.strategy import Config, PipelineSettings, Strategy

        g, c = unrolled()
        stage = {op.name: int(op.name[-1]) // 2 for op in g.ops}
        configs = {op.name: Config({"sample": 2}, (2 * stage[op.name], 2 * stage[op.name] + 1)) for op in g.ops}
        configs.update(dict.fromkeys(("step.t0", "step.t1"), Config({"in_feature": 2}, (0, 1))))  # (a poor start)
        s = Strategy(configs, PipelineSettings(stages=2, microbatches=2), stage)
        assert validate_strategy(s, g, c) == []
        first = visit_order(g)[0]
        wide = [x for x in candidate_configs(g[first], c.num_devices, 2) if len(x.devices) >= 2]
        r = coordinate_descent(g, c, s, max_evals=len(wide) + CLASS_TRIES, global_moves=False)
        assert validate_strategy(r.strategy, g, c) == []
        assert r.strategy["step.t0"] == r.strategy["step.t1"] == Config({"sample": 2}, (0, 1))
        assert r.strategy["step.t2"] == s["step.t2"] and r.strategy["step.t3"] == s["step.t3"]
        assert r.cost_s == pytest.approx(priced(g, r.strategy, c), rel=1e-12)
        assert r.cost_s < priced(g, s, c)


class TestAlignedPass:
    def test_a_round_begins_with_each_class_aligned_to_its_producers_in_graph_order(self):
        """From data parallelism with the four steps on two of the four devices (the losses
        then gather their logits from them), the descent's first candidates are the classes aligned to their
        inputs' producers (:func:`engine.search.class_moves.aligned_candidate`), in graph order,
        each priced whole against the strategy as the ones before left it and taken when faster:
        the same strategy and time as that rule applied by brute force here."""
        from engine.search.class_moves import aligned_candidate

        g, c = unrolled()
        steps = alike_classes(g)["step.t0"]
        s = data_parallel(g, c).with_configs(steps, Config({"sample": 2}, (0, 1)))
        current, best, evals, seen = s, priced(g, s, c), 0, []
        for op in g.ops:
            members = alike_classes(g).get(op.name)
            if members is None or members in seen:
                continue
            seen.append(members)
            for cand in aligned_candidate(g, members, current):
                evals += 1
                if priced(g, cand, c) < best:
                    current, best = cand, priced(g, cand, c)
        assert evals == 2 and best < priced(g, s, c)  # (the steps' class is not taken, the losses' is)
        r = coordinate_descent(g, c, s, max_evals=evals, global_moves=False)
        assert r.evals == evals and r.strategy.configs == current.configs
        assert r.cost_s == pytest.approx(best, rel=1e-12)


class TestPending:
    @staticmethod
    def descent(g, c):
        seen = []

        def until(r):
            seen.append((r.evals, r.cost_s, r.pending_s))
            return True
        r = coordinate_descent(g, c, data_parallel(g, c), max_evals=400, until=until)
        assert r.improvements, "the toy improves from data parallelism"
        assert all(p == float("inf") or p < cost for _, cost, p in seen)
        at, _, first = r.improvements[0]
        before = [p for e, cost, p in seen if e < at and p < cost]
        after = [p for e, cost, p in seen if e == at]
        assert after and after[0] == float("inf")
        return before, first

    def test_what_a_visit_priced_is_pending_until_it_is_taken(self):
        """While an op is visited, ``pending_s`` is the fastest time it priced that beats the
        current cost (inf when none); the visit ends by taking it: the cost it moves to is the
        last pending time seen (no class here), and pending is inf again."""
        before, first = self.descent(*tiny())
        assert before and before[-1] == first

    def test_a_class_move_takes_what_beats_the_pending_pick(self):
        before, first = self.descent(*unrolled())
        assert before and min(before) >= first
