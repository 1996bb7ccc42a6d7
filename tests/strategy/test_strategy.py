"""Tests of engine.strategy: configs, partition order, strategies, serialisation, validation.

Most tests use one small hand-built graph (``tiny``):

    data [64, 3, 32, 32] -> conv1 (16 channels, 3x3, padding 1) -> relu1 -> flat [64, 16384]
    -> fc (10 outputs) -> loss (softmax cross-entropy against labels [64])

on FlexFlow's P100 cluster (``p100-4x4``: 16 devices, 0..15). The last section checks, on
random small ops, that the FLOPs of an op's partitions add up to the op's FLOPs (the
multiplicativity the module docstring of engine/ops/__init__.py promises).
"""

from __future__ import annotations

import json
import math
from dataclasses import FrozenInstanceError, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.cluster import preset
from engine.errors import Problem, ValidationError
from engine.graph import GraphBuilder, Op, OpGraph
from engine.strategy import (
    RECOMPUTE,
    SCHEDULES,
    Config,
    PipelineSettings,
    Strategy,
    check_strategy,
    partition_coords,
    strategy_from_dict,
    validate_strategy,
)
from engine.layout import Layout, build_layout

OP_NAMES = ("data", "conv1", "relu1", "flat", "fc", "labels", "loss")


def build_tiny(precision: str = "fp32") -> OpGraph:
    b = GraphBuilder("tiny", precision=precision)
    x = b.input("data", [64, 3, 32, 32])
    y = b.add("conv2d", "conv1", [x], out_channels=16, kernel=3, padding=1)  # [64, 16, 32, 32]
    y = b.add("relu", "relu1", [y])
    y = b.add("reshape", "flat", [y], shape=[64, -1])  # [64, 16384]
    y = b.add("linear", "fc", [y], out_features=10)  # [64, 10]
    labels = b.input("labels", [64], dtype="int64")
    b.add("softmax_cross_entropy", "loss", [y, labels])  # [64]
    return b.build()


@pytest.fixture(scope="module")
def tiny() -> OpGraph:
    return build_tiny()


@pytest.fixture(scope="module")
def p100():
    return preset("p100-4x4")


def single(device: int = 0) -> Strategy:
    """Every op of ``tiny`` whole on one device: valid."""
    return Strategy({name: Config.single(device) for name in OP_NAMES})


def data_parallel(n: int) -> Strategy:
    """Every op of ``tiny`` split along sample over devices 0..n-1."""
    return Strategy({name: Config({"sample": n}, tuple(range(n))) for name in OP_NAMES})


def two_stages(**stage_override: int) -> Strategy:
    """data, conv1, relu1 on device 0 (stage 0); flat, fc, labels, loss on device 1 (stage 1)."""
    stage_of = {"data": 0, "conv1": 0, "relu1": 0, "flat": 1, "fc": 1, "labels": 1, "loss": 1}
    configs = {name: Config.single(s) for name, s in stage_of.items()}
    stage_of.update(stage_override)  # devices stay put: callers move them with with_config
    return Strategy(configs, PipelineSettings(2, 2), stage_of)


def interleaved(microbatches: int) -> Strategy:
    """2 stages x 2 virtual stages: chunks 0 and 2 on device 0, chunks 1 and 3 on device 1."""
    chunk = {"data": 0, "conv1": 0, "relu1": 1, "flat": 2, "fc": 2, "labels": 3, "loss": 3}
    configs = {name: Config.single(c % 2) for name, c in chunk.items()}
    return Strategy(configs, PipelineSettings(2, microbatches, "interleaved", 2), chunk)


# =========================================================================== Config


class TestConfig:
    def test_degree_one_entries_are_dropped(self):
        c = Config({"sample": 2, "feature": 1, "replica": 1}, [0, 1])
        assert dict(c.degrees) == {"sample": 2}
        assert c.devices == (0, 1)

    def test_degrees_are_sorted_by_name(self):
        c = Config({"sample": 2, "channel": 2, "height": 2}, range(8))
        assert list(c.degrees) == ["channel", "height", "sample"]

    def test_empty_config_is_one_partition(self):
        c = Config({}, (3,))
        assert dict(c.degrees) == {}
        assert c.num_partitions == 1

    def test_num_partitions_is_the_product_of_the_degrees(self):
        assert Config({"sample": 2, "feature": 4, "replica": 3}, range(24)).num_partitions == 24

    def test_degree_of_a_dim_not_split_is_1(self):
        c = Config({"sample": 4}, range(4))
        assert c.degree("sample") == 4
        assert c.degree("feature") == 1
        assert c.degree("no-such-dim") == 1

    def test_single(self):
        assert Config.single(5) == Config({}, (5,))
        assert Config.single(5).num_partitions == 1

    def test_equality_ignores_degree_order_and_degree_one_entries(self):
        a = Config({"sample": 2, "feature": 2}, (0, 1, 2, 3))
        b = Config({"feature": 2, "sample": 2, "replica": 1}, [0, 1, 2, 3])
        assert a == b
        assert hash(a) == hash(b)
        assert len({a, b}) == 1

    def test_inequality(self):
        a = Config({"sample": 2}, (0, 1))
        assert a != Config({"sample": 2}, (1, 0))  # same degrees, devices in another order
        assert a != Config({"feature": 2}, (0, 1))
        assert a != Config({"sample": 2, "feature": 1, "replica": 2}, (0, 1, 2, 3))
        assert a != {"degrees": {"sample": 2}, "devices": [0, 1]}

    def test_is_immutable(self):
        c = Config({"sample": 2}, (0, 1))
        with pytest.raises(TypeError):
            c.degrees["sample"] = 4  # type: ignore[index]
        with pytest.raises(FrozenInstanceError):
            c.devices = (2, 3)  # type: ignore[misc]

    def test_does_not_alias_the_callers_mapping(self):
        degrees = {"sample": 2}
        c = Config(degrees, [0, 1])
        degrees["sample"] = 4
        assert c.degree("sample") == 2

    def test_to_dict(self):
        c = Config({"sample": 2, "feature": 1, "channel": 2}, (4, 5, 6, 7))
        assert c.to_dict() == {"degrees": {"channel": 2, "sample": 2}, "devices": [4, 5, 6, 7]}

    def test_non_integer_degree_is_reported_not_truncated(self, tiny, p100):
        s = single().with_config("conv1", Config({"sample": 2.5}, (0, 1)))
        assert s["conv1"].degree("sample") == 2.5
        assert Problem("ops.conv1.degrees.sample", "degree must be a positive integer, got 2.5") in \
            validate_strategy(s, tiny, p100)


# =========================================================================== partition_coords


class TestPartitionCoords:
    def test_unsplit_op_has_one_partition(self, tiny):
        assert partition_coords(tiny["conv1"], Config.single(0)) == [{}]

    def test_one_dim(self, tiny):
        assert partition_coords(tiny["fc"], Config({"sample": 4}, range(4))) == [
            {"sample": 0}, {"sample": 1}, {"sample": 2}, {"sample": 3}]

    def test_row_major_over_op_dims_not_over_sorted_degree_names(self, tiny):
        # conv2d dims: sample, height, width, channel, replica. Config sorts its degrees
        # alphabetically (channel before sample); partitions follow the op's dims.
        coords = partition_coords(tiny["conv1"], Config({"channel": 2, "sample": 2}, range(4)))
        assert coords == [{"sample": 0, "channel": 0}, {"sample": 0, "channel": 1},
                          {"sample": 1, "channel": 0}, {"sample": 1, "channel": 1}]
        assert all(list(c) == ["sample", "channel"] for c in coords)

    def test_three_dims_last_fastest(self, tiny):
        coords = partition_coords(tiny["conv1"], Config({"width": 2, "sample": 2, "height": 2}, range(8)))
        assert [(c["sample"], c["height"], c["width"]) for c in coords] == [
            (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]

    def test_replica_dim_is_last(self, tiny):
        coords = partition_coords(tiny["fc"], Config({"replica": 2, "feature": 2}, range(4)))
        assert coords == [{"feature": 0, "replica": 0}, {"feature": 0, "replica": 1},
                          {"feature": 1, "replica": 0}, {"feature": 1, "replica": 1}]

    def test_uneven_degrees(self, tiny):
        coords = partition_coords(tiny["fc"], Config({"sample": 2, "in_feature": 3}, range(6)))
        assert [(c["sample"], c["in_feature"]) for c in coords] == [
            (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]

    def test_one_entry_per_partition(self, tiny):
        c = Config({"sample": 4, "feature": 2, "replica": 2}, range(16))
        assert len(partition_coords(tiny["fc"], c)) == c.num_partitions == 16

    def test_dims_the_op_lacks_are_ignored(self, tiny):
        # validate_strategy reports the unknown dim; the coordinates only cover real ones.
        assert partition_coords(tiny["relu1"], Config({"vocab": 2}, (0, 1))) == [{}]


# =========================================================================== Strategy


class TestStrategy:
    def test_getitem(self):
        s = data_parallel(4)
        assert s["fc"] == Config({"sample": 4}, (0, 1, 2, 3))
        with pytest.raises(KeyError):
            s["ghost"]

    def test_devices_used(self):
        assert single(3).devices_used() == {3}
        assert data_parallel(4).devices_used() == {0, 1, 2, 3}
        assert Strategy({}).devices_used() == set()

    def test_defaults(self):
        s = Strategy({})
        assert s.pipeline == PipelineSettings(1, 1, "1f1b", 1)
        assert (s.recompute, s.zero_stage, s.sequence_parallel) == ("none", 0, False)
        assert dict(s.stage_of) == {} and dict(s.cost) == {} and dict(s.found_by) == {}


class TestWithConfig:
    def test_returns_a_copy_and_leaves_the_original_alone(self):
        s = replace(single(), cost={"iteration_time_s": 1.5}, recompute="full", zero_stage=2)
        new = Config({"sample": 2}, (0, 1))
        t = s.with_config("fc", new)
        assert t is not s
        assert t["fc"] == new
        assert s["fc"] == Config.single(0)
        assert t.configs is not s.configs
        assert all(t[n] == s[n] for n in OP_NAMES if n != "fc")

    def test_clears_the_cost_keeps_the_rest(self):
        s = replace(single(), cost={"iteration_time_s": 1.5}, recompute="full", zero_stage=2,
                    model_name="tiny", found_by={"algorithm": "x"})
        t = s.with_config("fc", Config.single(1))
        assert dict(t.cost) == {}
        assert dict(s.cost) == {"iteration_time_s": 1.5}
        assert (t.recompute, t.zero_stage, t.model_name, dict(t.found_by)) == ("full", 2, "tiny", {"algorithm": "x"})

    def test_can_add_an_op(self):
        t = single().with_config("ghost", Config.single(0))
        assert "ghost" in t.configs and "ghost" not in single().configs

    def test_strategy_is_frozen(self):
        with pytest.raises(FrozenInstanceError):
            single().recompute = "full"  # type: ignore[misc]


class TestSerialisation:
    def test_to_dict_small(self):
        s = Strategy({"a": Config({"sample": 2}, (0, 1)), "b": Config.single(1)},
                     model_name="m", model_fingerprint="f" * 16, cluster_name="c", cluster_devices=2,
                     found_by={"algorithm": "baseline:x"}, cost={"iteration_time_s": 0.5})
        assert s.to_dict() == {
            "format": "soapbox.strategy/1",
            "model": {"name": "m", "fingerprint": "f" * 16},
            "cluster": {"name": "c", "devices": 2},
            "found_by": {"algorithm": "baseline:x"},
            "cost": {"iteration_time_s": 0.5},
            "pipeline": {"stages": 1, "microbatches": 1, "schedule": "1f1b", "virtual_stages": 1},
            "recompute": "none",
            "zero_stage": 0,
            "sequence_parallel": False,
            "ops": {"a": {"degrees": {"sample": 2}, "devices": [0, 1]},
                    "b": {"degrees": {}, "devices": [1]}},
        }

    def test_stage_written_per_op_only_with_pipeline_stages(self):
        assert "stage" not in single().to_dict()["ops"]["fc"]
        d = two_stages().to_dict()
        assert {n: e["stage"] for n, e in d["ops"].items()} == {
            "data": 0, "conv1": 0, "relu1": 0, "flat": 1, "fc": 1, "labels": 1, "loss": 1}

    @pytest.mark.parametrize("make", [
        lambda: single(),
        lambda: data_parallel(16),
        lambda: replace(two_stages(), recompute="selective", zero_stage=3, sequence_parallel=True,
                        model_name="tiny", model_fingerprint="0" * 16, cluster_name="p100-4x4",
                        cluster_devices=16, found_by={"algorithm": "a", "options": {"k": 1}},
                        cost={"iteration_time_s": 2.0}),
        lambda: interleaved(4),
    ], ids=["single", "data-parallel", "pipeline", "interleaved"])
    def test_round_trip_through_json(self, make):
        s = make()
        back = strategy_from_dict(json.loads(json.dumps(s.to_dict())))
        assert back == s
        assert back.to_dict() == s.to_dict()

    def test_round_trip_keeps_virtual_stages_and_chunks(self):
        back = strategy_from_dict(interleaved(4).to_dict())
        assert back.pipeline == PipelineSettings(2, 4, "interleaved", 2)
        assert dict(back.stage_of) == {"data": 0, "conv1": 0, "relu1": 1, "flat": 2, "fc": 2, "labels": 3, "loss": 3}

    def test_from_minimal_dict_uses_defaults(self):
        s = strategy_from_dict({"ops": {"a": {"devices": [0]}}})
        assert s == Strategy({"a": Config.single(0)})

    def test_stages_dropped_when_the_pipeline_has_one_stage(self):
        s = strategy_from_dict({"ops": {"a": {"devices": [0], "stage": 0}}})
        assert dict(s.stage_of) == {}


# =========================================================================== validate_strategy


class TestValidateStrategy:
    # -- valid -------------------------------------------------------------------------
    def test_valid_single_device(self, tiny, p100):
        assert validate_strategy(single(), tiny, p100) == []

    def test_valid_data_parallel_over_all_devices(self, tiny, p100):
        assert validate_strategy(data_parallel(16), tiny, p100) == []

    def test_valid_mixed_with_replica(self, tiny, p100):
        s = data_parallel(16).with_config("fc", Config({"feature": 2, "in_feature": 2, "replica": 4}, range(16)))
        assert validate_strategy(s, tiny, p100) == []

    def test_valid_pipeline(self, tiny, p100):
        assert validate_strategy(two_stages(), tiny, p100) == []

    def test_valid_interleaved(self, tiny, p100):
        assert validate_strategy(interleaved(4), tiny, p100) == []

    def test_valid_matching_metadata(self, tiny, p100):
        s = replace(single(), model_name="tiny", model_fingerprint=tiny.fingerprint,
                    cluster_name="p100-4x4", cluster_devices=16)
        assert validate_strategy(s, tiny, p100) == []

    def test_every_recompute_and_zero_stage_accepted(self, tiny, p100):
        for r in RECOMPUTE:
            for z in (0, 1, 2, 3):
                assert validate_strategy(replace(single(), recompute=r, zero_stage=z), tiny, p100) == []

    # -- degrees -----------------------------------------------------------------------
    def test_degree_that_does_not_divide(self, tiny, p100):
        s = single().with_config("conv1", Config({"sample": 3}, (0, 1, 2)))
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.conv1.degrees.sample", "3 does not divide sample (64)")]

    def test_degree_that_does_not_divide_a_parameter_dim(self, tiny, p100):
        s = single().with_config("fc", Config({"feature": 4}, (0, 1, 2, 3)))
        assert validate_strategy(s, tiny, p100) == [Problem("ops.fc.degrees.feature", "4 does not divide feature (10)")]

    def test_unknown_dim_lists_the_valid_ones(self, tiny, p100):
        s = single().with_config("conv1", Config({"vocab": 2}, (0, 1)))
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.conv1.degrees.vocab",
                    "conv2d 'conv1' has no dim 'vocab'; valid: sample, height, width, channel, replica")]

    def test_zero_degree(self, tiny, p100):
        s = single().with_config("conv1", Config({"sample": 0}, (0,)))
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.conv1.degrees.sample", "degree must be a positive integer, got 0"),
            Problem("ops.conv1.devices", "1 device(s) for 0 partition(s) (the product of the degrees)"),
        ]

    def test_negative_degree(self, tiny, p100):
        s = single().with_config("conv1", Config({"sample": -2, "channel": -2}, (0, 1, 2, 3)))
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.conv1.degrees.channel", "degree must be a positive integer, got -2"),
            Problem("ops.conv1.degrees.sample", "degree must be a positive integer, got -2"),
        ]
    def test_zero_degree_with_microbatches_is_reported_not_raised(self, tiny, p100):
        s = replace(single(), pipeline=PipelineSettings(1, 2)).with_config("conv1", Config({"sample": 0}, (0,)))
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.conv1.degrees.sample", "degree must be a positive integer, got 0"),
            Problem("ops.conv1.devices", "1 device(s) for 0 partition(s) (the product of the degrees)"),
        ]

    def test_replica_takes_any_degree(self, tiny, p100):
        s = single().with_config("relu1", Config({"replica": 7}, range(7)))
        assert validate_strategy(s, tiny, p100) == []

    # -- devices -----------------------------------------------------------------------
    def test_too_few_devices(self, tiny, p100):
        s = single().with_config("conv1", Config({"sample": 4}, (0, 1, 2)))
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.conv1.devices", "3 device(s) for 4 partition(s) (the product of the degrees)")]

    def test_too_many_devices(self, tiny, p100):
        s = single().with_config("relu1", Config({}, (0, 1)))
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.relu1.devices", "2 device(s) for 1 partition(s) (the product of the degrees)")]

    def test_device_that_does_not_exist(self, tiny, p100):
        s = single().with_config("conv1", Config({"sample": 4}, (0, 16, -1, 3)))
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.conv1.devices[1]", "device 16 does not exist; p100-4x4 has devices 0..15"),
            Problem("ops.conv1.devices[2]", "device -1 does not exist; p100-4x4 has devices 0..15"),
        ]

    def test_device_used_twice(self, tiny, p100):
        s = single().with_config("conv1", Config({"sample": 4}, (3, 5, 3, 3)))
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.conv1.devices[2]", "device 3 runs two partitions of this op"),
            Problem("ops.conv1.devices[3]", "device 3 runs two partitions of this op"),
        ]

    # -- ops -----------------------------------------------------------------------------
    def test_missing_config(self, tiny, p100):
        configs = dict(single().configs)
        del configs["relu1"]
        assert validate_strategy(Strategy(configs), tiny, p100) == [Problem("ops.relu1", "no config for this op")]

    def test_empty_strategy_misses_every_op(self, tiny, p100):
        assert validate_strategy(Strategy({}), tiny, p100) == [
            Problem(f"ops.{n}", "no config for this op") for n in OP_NAMES]

    def test_config_for_unknown_op(self, tiny, p100):
        s = single().with_config("ghost", Config.single(0))
        assert validate_strategy(s, tiny, p100) == [Problem("ops.ghost", "no op named 'ghost' in model 'tiny'")]

    # -- microbatches ---------------------------------------------------------------------
    def test_microbatches_that_divide_the_partition_batch(self, tiny, p100):
        # 64 samples / 16 partitions = 4 per partition; 4 microbatches of 1.
        assert validate_strategy(replace(data_parallel(16), pipeline=PipelineSettings(1, 4)), tiny, p100) == []

    def test_microbatches_not_dividing_the_partition_batch(self, tiny, p100):
        # 8 divides the global batch of 64, but not the 4 samples each partition holds.
        s = replace(data_parallel(16), pipeline=PipelineSettings(1, 8))
        msg = "8 microbatches of 4 samples per partition do not divide evenly (batch 64, sample degree 16)"
        assert validate_strategy(s, tiny, p100) == [Problem(f"ops.{n}.degrees.sample", msg) for n in OP_NAMES]

    def test_microbatches_not_dividing_the_unsplit_batch(self, tiny, p100):
        s = replace(single(), pipeline=PipelineSettings(1, 3))
        msg = "3 microbatches of 64 samples per partition do not divide evenly (batch 64, sample degree 1)"
        assert validate_strategy(s, tiny, p100) == [Problem(f"ops.{n}.degrees.sample", msg) for n in OP_NAMES]

    def test_non_dividing_sample_degree_reported_once(self, tiny, p100):
        s = replace(single(), pipeline=PipelineSettings(1, 2)).with_config("conv1", Config({"sample": 3}, (0, 1, 2)))
        assert validate_strategy(s, tiny, p100) == [Problem("ops.conv1.degrees.sample", "3 does not divide sample (64)")]

    @pytest.mark.parametrize("field_", ["stages", "microbatches", "virtual_stages"])
    @pytest.mark.parametrize("value", [0, -1])
    def test_non_positive_pipeline_settings(self, tiny, p100, field_, value):
        s = replace(single(), pipeline=replace(PipelineSettings(), **{field_: value}))
        problems = validate_strategy(s, tiny, p100)
        assert problems[0] == Problem(f"pipeline.{field_}", f"must be a positive integer, got {value}")

    # -- schedule ---------------------------------------------------------------------------
    def test_every_schedule_name_accepted(self, tiny, p100):
        for sched in ("gpipe", "1f1b"):
            assert validate_strategy(replace(single(), pipeline=PipelineSettings(1, 1, sched)), tiny, p100) == []
        assert SCHEDULES == ("gpipe", "1f1b", "interleaved")

    def test_unknown_schedule(self, tiny, p100):
        s = replace(single(), pipeline=PipelineSettings(1, 1, "zigzag"))
        assert validate_strategy(s, tiny, p100) == [
            Problem("pipeline.schedule", "unknown schedule 'zigzag'; valid: gpipe, 1f1b, interleaved")]

    def test_interleaved_without_virtual_stages(self, tiny, p100):
        s = replace(single(), pipeline=PipelineSettings(1, 1, "interleaved", 1))
        assert validate_strategy(s, tiny, p100) == [
            Problem("pipeline.virtual_stages", "the interleaved schedule needs virtual_stages >= 2")]

    def test_interleaved_microbatches_not_a_multiple_of_stages(self, tiny, p100):
        assert validate_strategy(interleaved(1), tiny, p100) == [
            Problem("pipeline.microbatches",
                    "the interleaved schedule needs microbatches (1) to be a multiple of stages (2) "
                    "(Narayanan et al. SC'21 §2.2.2)")]

    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_virtual_stages_without_interleaved(self, tiny, p100, schedule):
        s = replace(single(), pipeline=PipelineSettings(1, 1, schedule, 2))
        assert validate_strategy(s, tiny, p100) == [
            Problem("pipeline.virtual_stages", f"virtual_stages > 1 needs schedule 'interleaved', got {schedule!r}")]

    # -- recompute, ZeRO ------------------------------------------------------------------
    def test_unknown_recompute(self, tiny, p100):
        assert validate_strategy(replace(single(), recompute="some"), tiny, p100) == [
            Problem("recompute", "unknown recompute 'some'; valid: none, selective, full, selective-op")]

    @pytest.mark.parametrize("stage", [4, -1])
    def test_bad_zero_stage(self, tiny, p100, stage):
        assert validate_strategy(replace(single(), zero_stage=stage), tiny, p100) == [
            Problem("zero_stage", f"must be 0, 1, 2 or 3, got {stage}")]

    # -- stages ---------------------------------------------------------------------------
    def test_stage_out_of_range(self, tiny, p100):
        # loss on device 2, so no stage shares a device with another (only the range fails)
        s = two_stages(loss=2).with_config("loss", Config.single(2))
        assert validate_strategy(s, tiny, p100) == [Problem("ops.loss.stage", "stage 2 is out of range 0..1")]

    def test_negative_stage(self, tiny, p100):
        # -1 is also earlier than the stage of loss's producers
        s = two_stages(loss=-1).with_config("loss", Config.single(2))
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.loss.stage", "stage -1 is out of range 0..1"),
            Problem("ops.loss.stage", "stage -1 reads 'fc' from a later stage 1"),
            Problem("ops.loss.stage", "stage -1 reads 'labels' from a later stage 1"),
        ]

    def test_stage_range_counts_virtual_stages(self, tiny, p100):
        s = interleaved(4)
        s = replace(s, stage_of={**s.stage_of, "loss": 4}).with_config("loss", Config.single(0))
        assert validate_strategy(s, tiny, p100) == [Problem("ops.loss.stage", "stage 4 is out of range 0..3")]

    def test_missing_stage(self, tiny, p100):
        s = two_stages()
        s = replace(s, stage_of={k: v for k, v in s.stage_of.items() if k != "fc"})
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.fc.stage", "no pipeline stage given (the strategy has 2 stages)")]

    def test_consumer_in_an_earlier_stage_than_its_producer(self, tiny, p100):
        # relu1 moves to stage 1 (device 1); flat, which reads it, to stage 0 (device 0)
        s = two_stages(relu1=1, flat=0).with_config("relu1", Config.single(1)).with_config("flat", Config.single(0))
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops.flat.stage", "stage 0 reads 'relu1' from a later stage 1")]

    def test_two_stages_sharing_a_device(self, tiny, p100):
        s = two_stages().with_config("fc", Config.single(0))
        assert validate_strategy(s, tiny, p100) == [Problem("ops", "stages 0 and 1 share device(s) [0]")]

    def test_chunks_of_one_stage_may_share_devices(self, tiny, p100):
        # chunks 0 and 2 both run on device 0, chunks 1 and 3 on device 1
        assert validate_strategy(interleaved(2), tiny, p100) == []

    def test_chunks_of_different_stages_may_not_share_devices(self, tiny, p100):
        s = interleaved(2).with_config("fc", Config.single(1))  # chunk 2 (stage 0) on device 1
        assert validate_strategy(s, tiny, p100) == [
            Problem("ops", "stages 1 and 2 share device(s) [1]"),
            Problem("ops", "stages 2 and 3 share device(s) [1]"),
        ]

    # -- what the strategy was made for ---------------------------------------------------
    def test_fingerprint_mismatch(self, tiny, p100):
        s = replace(single(), model_name="other", model_fingerprint="0123456789abcdef")
        assert validate_strategy(s, tiny, p100) == [
            Problem("model.fingerprint",
                    f"the strategy was made for model 'other' with fingerprint 0123456789abcdef, "
                    f"but 'tiny' has {tiny.fingerprint}")]

    def test_empty_fingerprint_is_not_checked(self, tiny, p100):
        assert validate_strategy(replace(single(), model_name="other"), tiny, p100) == []

    def test_cluster_device_count_mismatch(self, tiny, p100):
        s = replace(single(), cluster_name="dgx-a100-80gb:1", cluster_devices=8)
        assert validate_strategy(s, tiny, p100) == [
            Problem("cluster.devices",
                    "the strategy was made for 8 devices (dgx-a100-80gb:1), but p100-4x4 has 16")]

    @pytest.mark.parametrize("cluster, device_type", [("p100-4x4", "P100-SXM2-16GB"), ("k80-16x4", "K80-GK210")])
    def test_bf16_model_on_a_cluster_without_bf16(self, cluster, device_type):
        g = build_tiny("bf16")
        assert validate_strategy(single(), g, preset(cluster)) == [
            Problem("cluster", f"{device_type} has no bf16 peak; the model 'tiny' runs in bf16")]

    def test_fp16_model_on_k80(self):
        assert validate_strategy(single(), build_tiny("fp16"), preset("k80-16x4")) == []

    def test_bf16_model_on_a100(self):
        assert validate_strategy(single(), build_tiny("bf16"), preset("dgx-a100-80gb:1")) == []

    # -- several problems -------------------------------------------------------------------
    def test_every_problem_is_reported_in_order(self, tiny, p100):
        configs = dict(single().configs)
        del configs["relu1"]
        configs["ghost"] = Config.single(0)
        configs["conv1"] = Config({"sample": 3}, (0, 1, 2))
        configs["fc"] = Config({"feature": 2}, (0, 0))
        s = Strategy(configs, PipelineSettings(1, 1, "zigzag"), recompute="some", zero_stage=4,
                     model_name="other", model_fingerprint="0123456789abcdef", cluster_name="x", cluster_devices=8)
        assert validate_strategy(s, tiny, p100) == [
            Problem("model.fingerprint", f"the strategy was made for model 'other' with fingerprint "
                                         f"0123456789abcdef, but 'tiny' has {tiny.fingerprint}"),
            Problem("cluster.devices", "the strategy was made for 8 devices (x), but p100-4x4 has 16"),
            Problem("ops.ghost", "no op named 'ghost' in model 'tiny'"),
            Problem("pipeline.schedule", "unknown schedule 'zigzag'; valid: gpipe, 1f1b, interleaved"),
            Problem("recompute", "unknown recompute 'some'; valid: none, selective, full, selective-op"),
            Problem("zero_stage", "must be 0, 1, 2 or 3, got 4"),
            Problem("ops.conv1.degrees.sample", "3 does not divide sample (64)"),
            Problem("ops.relu1", "no config for this op"),
            Problem("ops.fc.devices[1]", "device 0 runs two partitions of this op"),
        ]


class TestCheckStrategy:
    def test_returns_the_strategy_when_valid(self, tiny, p100):
        s = data_parallel(16)
        assert check_strategy(s, tiny, p100) is s

    def test_raises_listing_every_problem(self, tiny, p100):
        s = replace(single(), recompute="some").with_config("conv1", Config({"sample": 3}, (0, 1, 2)))
        with pytest.raises(ValidationError) as info:
            check_strategy(s, tiny, p100, "plan.json")
        assert info.value.problems == [
            Problem("recompute", "unknown recompute 'some'; valid: none, selective, full, selective-op"),
            Problem("ops.conv1.degrees.sample", "3 does not divide sample (64)"),
        ]
        assert info.value.source == "plan.json"
        assert str(info.value) == (
            "plan.json: 2 problems found:\n"
            "  - recompute: unknown recompute 'some'; valid: none, selective, full, selective-op\n"
            "  - ops.conv1.degrees.sample: 3 does not divide sample (64)")

    def test_without_source(self, tiny, p100):
        with pytest.raises(ValidationError, match=r"^1 problem found:\n  - ops.relu1: no config for this op$"):
            check_strategy(Strategy({n: Config.single(0) for n in OP_NAMES if n != "relu1"}), tiny, p100)

    def test_is_a_value_error(self, tiny, p100):
        with pytest.raises(ValueError):
            check_strategy(Strategy({}), tiny, p100)


# =========================================================================== partition FLOPs


class TestPartitionFlopsSmall:
    """Hand-computed values on ``tiny``'s fc: x [64, 16384] @ W [16384, 10]."""

    def test_whole_op(self, tiny):
        fc = tiny["fc"]
        assert fc.fwd_flops == 2 * 64 * 10 * 16384 == 20_971_520
        assert fc.bwd_flops == 2 * fc.fwd_flops
        assert fc.partition_flops({}) == (fc.fwd_flops, fc.bwd_flops)

    def test_sample_and_in_feature(self, tiny):
        # 16 samples, 8192 input features per partition: 2 * 16 * 10 * 8192
        assert tiny["fc"].partition_flops({"sample": 4, "in_feature": 2}) == (2_621_440.0, 5_242_880.0)

    def test_replica_does_not_divide_the_work(self, tiny):
        fc = tiny["fc"]
        assert fc.partition_flops({"replica": 4}) == (fc.fwd_flops, fc.bwd_flops)

    def test_partition_shapes(self, tiny):
        ins, outs, params = tiny["fc"].partition_shapes({"sample": 4, "feature": 2})
        assert ins == [(16, 16384)]
        assert outs == [(16, 5)]
        assert params == [(5, 16384), (5,)]  # weight (out, in)

    def test_partition_shapes_reduction_dim_keeps_the_output_whole(self, tiny):
        ins, outs, params = tiny["fc"].partition_shapes({"in_feature": 4})
        assert (ins, outs, params) == ([(64, 4096)], [(64, 10)], [(10, 4096), (10,)])

    def test_partition_shapes_degree_that_does_not_divide(self, tiny):
        with pytest.raises(ValueError, match=r"^fc: degree 3 does not divide feature \(10\)$"):
            tiny["fc"].partition_shapes({"feature": 3})


SIZES = st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def small_ops(draw) -> Op:
    """One random small op of a kind whose FLOPs formula the partitioning must respect."""
    kind = draw(st.sampled_from(["linear", "conv2d", "batch_matmul", "lstm", "softmax_cross_entropy", "layernorm"]))
    b = GraphBuilder("p")
    if kind == "linear":
        shape = [draw(SIZES) for _ in range(draw(st.sampled_from([2, 3])))]
        x = b.input("x", shape)
        b.add("linear", "op", [x], out_features=draw(SIZES), bias=draw(st.booleans()))
    elif kind == "conv2d":
        groups = draw(st.sampled_from([1, 1, 2]))
        c = groups * draw(st.sampled_from([1, 2, 3]))
        k = groups * draw(st.sampled_from([1, 2, 4]))
        kernel = draw(st.sampled_from([1, 2, 3]))
        x = b.input("x", [draw(SIZES), c, draw(st.integers(4, 12)), draw(st.integers(4, 12))])
        b.add("conv2d", "op", [x], out_channels=k, kernel=kernel, stride=draw(st.sampled_from([1, 2])),
              padding=draw(st.sampled_from([0, 1])), groups=groups, bias=draw(st.booleans()))
    elif kind == "batch_matmul":
        n, m, kk, nn = (draw(SIZES) for _ in range(4))
        heads_b = draw(SIZES)
        heads = heads_b * draw(st.sampled_from([1, 1, 2]))  # grouped-query when b has fewer heads
        tb = draw(st.booleans())
        a = b.input("a", [n, heads, m, kk])
        bb = b.input("b", [n, heads_b, nn, kk] if tb else [n, heads_b, kk, nn])
        b.add("batch_matmul", "op", [a, bb], transpose_b=tb)
    elif kind == "lstm":
        batch, hidden = draw(SIZES), draw(SIZES)
        ins = [b.input("x", [batch, draw(SIZES)])]
        if draw(st.booleans()):
            ins += [b.input("h", [batch, hidden]), b.input("c", [batch, hidden])]
        b.add("lstm", "op", ins, hidden_size=hidden)
    elif kind == "softmax_cross_entropy":
        lead = [draw(SIZES) for _ in range(draw(st.sampled_from([1, 2])))]
        logits = b.input("logits", lead + [draw(SIZES)])
        labels = b.input("labels", lead, dtype="int64")
        b.add("softmax_cross_entropy", "op", [logits, labels])
    else:
        x = b.input("x", [draw(SIZES), draw(SIZES), draw(SIZES)])
        b.add("layernorm", "op", [x])
    return b.build()["op"]


class TestPartitionFlopsProperty:
    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(op=small_ops(), data=st.data())
    def test_partitions_add_up_to_the_op(self, op, data):
        degrees = {d.name: data.draw(st.sampled_from([k for k in _divisors(d.size) if d.degree_problem(k) is None]),
                                     label=d.name)
                   for d in op.dims if not d.is_replica}
        config = Config(degrees, range(math.prod(degrees.values())))
        parts = partition_coords(op, config)
        assert len(parts) == config.num_partitions

        per = [op.partition_flops(config.degrees) for _ in parts]
        assert math.isclose(math.fsum(f for f, _ in per), op.fwd_flops, rel_tol=1e-12)
        assert math.isclose(math.fsum(b for _, b in per), op.bwd_flops, rel_tol=1e-12)

        # Output volumes: every non-reduction split divides the output; a reduction split
        # leaves each partition with a (partial) output of full size.
        _, outs, _ = op.partition_shapes(config.degrees)
        out_split = math.prod(config.degree(d.name) for d in op.dims if d.out_axis is not None)
        for part, full in zip(outs, op.out_tensors):
            assert math.prod(part) * out_split == full.numel

    @settings(max_examples=30, deadline=None)
    @given(op=small_ops(), replicas=st.integers(1, 8))
    def test_replica_partitions_each_do_the_whole_op(self, op, replicas):
        assert op.partition_flops({"replica": replicas}) == (op.fwd_flops, op.bwd_flops)
        _, outs, _ = op.partition_shapes({"replica": replicas})
        assert outs == [t.shape for t in op.out_tensors]


class TestDeviceRuns:
    """Devices written as runs ('0-7,64-71'): the compact form the explorer keeps in the page."""

    @settings(deadline=None)
    @given(st.lists(st.integers(0, 16383), min_size=1, max_size=300))
    def test_round_trip(self, devs):
        from engine.strategy.runs import device_runs
        from engine.strategy.runs import parse_device_runs

        text = device_runs(devs)
        assert parse_device_runs(text) == tuple(devs)
        assert len(text.split(",")) == 1 + sum(b != a + 1 for a, b in zip(devs, devs[1:]))

    def test_exact(self):
        from engine.strategy.runs import device_runs
        from engine.strategy.runs import parse_device_runs

        assert device_runs([0, 1, 2, 3, 8, 9, 5]) == "0-3,8-9,5"
        assert parse_device_runs("4,0-2") == (4, 0, 1, 2)
        with pytest.raises(ValueError, match="counts down"):
            parse_device_runs("7-3")
        with pytest.raises(ValueError, match="more than 16384"):
            parse_device_runs("0-9999,0-9999")

    def test_a_strategy_file_may_use_runs_and_bad_runs_are_named(self):
        from engine.formats import load_strategy
        from engine.strategy.runs import compact_strategy_dict

        from engine.formats import resolve_model
        from engine.search.baselines import make_baseline

        g, c = resolve_model("alexnet"), preset("p100-4x4")
        s = make_baseline("data-parallel", g, c)
        assert load_strategy(compact_strategy_dict(s.to_dict()), g, c).configs == s.configs
        bad = compact_strategy_dict(s.to_dict())
        bad["ops"]["fc6"]["devices"] = "0-3,x"
        with pytest.raises(ValidationError, match=r"ops\.fc6\.devices"):
            load_strategy(bad, g, c)
        bad["ops"]["fc6"]["devices"] = "15-0"
        with pytest.raises(ValidationError, match=r"ops\.fc6\.devices.*counts down"):
            load_strategy(bad, g, c)


def test_repeated_layers_checked_once_still_report_every_problem():
    """validate_strategy checks a config of a repeated layer's op once (the signature, dims and
    degrees of one checked before, on a device tuple found valid), yet every op's own problems
    -- a device tuple of its own, a missing stage -- are still reported, with the op named."""
    from engine.models import build_sample
    from engine.strategy import Config, validate_strategy

    g, c = build_sample("gpt2", batch=16), preset("dgx-a100-80gb:1")
    s = build_layout(g, c, Layout(tp=2, pp=2, micro_batch=1))
    assert validate_strategy(s, g, c) == []
    fc = s["layers.9.mlp.fc1"]
    bad = Config(dict(fc.degrees), tuple(fc.devices[:-1]) + (99,))  # same degrees, a device that does not exist
    t = replace(s.with_config("layers.9.mlp.fc1", bad),
                stage_of={k: v for k, v in s.stage_of.items() if k != "layers.10.mlp.fc1"})
    found = {p.path for p in validate_strategy(t, g, c)}
    assert any(w.startswith("ops.layers.9.mlp.fc1.devices") for w in found), found
    assert "ops.layers.10.mlp.fc1.stage" in found


def test_parsing_shares_equal_device_tuples():
    """strategy_from_dict makes equal device lists one tuple (the ops of repeated layers share
    it, as in a strategy built in code): the same strategy, far fewer distinct objects."""
    from engine.models import build_sample
    from engine.strategy import strategy_from_dict

    g, c = build_sample("gpt2", batch=16), preset("dgx-a100-80gb:2")
    s = build_layout(g, c, Layout(tp=4, pp=2, micro_batch=1))
    p = strategy_from_dict(json.loads(json.dumps(s.to_dict())))
    assert p.configs == s.configs
    assert len({id(cf.devices) for cf in p.configs.values()}) == len({cf.devices for cf in s.configs.values()})
