"""The configs a search considers for an op (issue 43): past the limit on degree combinations,
every product of degrees keeps its share, so an op on 64 GPUs can still be put on all 64 (data
parallel) by a single-op move."""

from __future__ import annotations

import math
from itertools import product as iproduct

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.models import build_sample
from engine.search.chains import CANDIDATE_COMBOS, candidate_configs, degree_combos


def all_combos(options: list[list[int]], n: int) -> list[tuple[int, ...]]:
    return sorted((ks for ks in iproduct(*options) if n % math.prod(ks) == 0), key=lambda ks: (math.prod(ks), ks))


class TestDegreeCombos:
    def test_under_the_limit_every_combination_in_product_order(self):
        # 2 dims, each 1, 2 or 4, on 8 devices: 1 | 2 2 | 4 4 4 | 8 8 (16 does not divide 8)
        got = degree_combos([[1, 2, 4], [1, 2, 4]], 8, 100)
        assert got == [(1, 1), (1, 2), (2, 1), (1, 4), (2, 2), (4, 1), (2, 4), (4, 2)]

    def test_over_the_limit_each_product_keeps_a_share(self):
        # 4 dims of 1..64 on 64 GPUs: products 1, 2, 4, 8, 16, 32, 64 have 1, 4, 10, 20, 35, 56, 84
        # combinations (210); 24 places: 1 + 4 to the first two, then 4, 4, 4, 4, 3 (in turn)
        opts = [[1, 2, 4, 8, 16, 32, 64]] * 4
        got = degree_combos(opts, 64, 24)
        by = {}
        for ks in got:
            by[math.prod(ks)] = by.get(math.prod(ks), 0) + 1
        assert by == {1: 1, 2: 4, 4: 4, 8: 4, 16: 4, 32: 4, 64: 3}
        # within a product: fewest split dims first, the earlier dims split more
        assert {ks for ks in got if math.prod(ks) == 64} == {(64, 1, 1, 1), (1, 64, 1, 1), (1, 1, 64, 1)}
        assert {ks for ks in got if math.prod(ks) == 4} == {(4, 1, 1, 1), (1, 4, 1, 1), (1, 1, 4, 1), (1, 1, 1, 4)}
        assert (2, 2, 2, 2) not in got and (8, 8, 1, 1) not in got
        assert got == sorted(got, key=lambda ks: (math.prod(ks), ks))

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.lists(st.sampled_from([1, 2, 3, 4, 8, 16]), min_size=1, max_size=4, unique=True),
                    min_size=1, max_size=5),
           st.sampled_from([1, 4, 12, 16, 64]), st.integers(1, 120))
    def test_a_fair_subset(self, options, n, limit):
        full = all_combos(options, n)
        got = degree_combos(options, n, limit)
        assert len(got) == min(limit, len(full))
        assert len(set(got)) == len(got) and set(got) <= set(full)
        assert got == sorted(got, key=lambda ks: (math.prod(ks), ks))
        # the places are shared in turns: no product has more than one place above a product
        # that did not get all of its combinations
        have = {p: sum(math.prod(ks) == p for ks in got) for p in {math.prod(ks) for ks in full}}
        total = {p: sum(math.prod(ks) == p for ks in full) for p in have}
        short = [have[p] for p in have if have[p] < total[p]]
        if short:
            assert all(have[p] <= min(short) + 1 for p in have)


class TestCandidateConfigs:
    def test_a_convolution_on_64_gpus_can_go_data_parallel(self):
        g = build_sample("alexnet")
        for name in ("data", "conv1", "conv5.maxpool"):
            configs = candidate_configs(g[name], 64)
            assert any(dict(c.degrees) == {"sample": 64} and c.devices == tuple(range(64)) for c in configs), name

    def test_the_searches_and_the_profile_share_one_space(self):
        from engine.cluster import preset
        from engine.studies.profiling import all_config_keys
        g, c = build_sample("alexnet"), preset("dgx-a100-40gb:8")
        assert all_config_keys(g, c) == all_config_keys(g, c, CANDIDATE_COMBOS)
        assert len(all_config_keys(g, c)) > len(all_config_keys(g, c, 16))
