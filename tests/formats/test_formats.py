"""Versioned JSON formats: round trips, sample files against their builders, schemas, and
every way a bad file is reported (path in the file and message, never another exception)."""

from __future__ import annotations

import json
import os
from functools import cache

import jsonschema
import pytest

from engine.cluster import preset
from engine.errors import ValidationError
from engine.formats import (
    FORMATS,
    dumps,
    load_cluster,
    load_model,
    load_strategy,
    read_json,
    save_json,
    schema,
    schema_problems,
)
from engine.graph import OpGraph
from engine.models import SAMPLE_MODELS, build_sample, sample_dir
from engine.models.transformer import GPTConfig, gpt
from engine.search.baselines import make_baseline

SAMPLES = list(SAMPLE_MODELS)
PRESETS = ["p100-4x4", "k80-16x4", "dgx-a100-80gb:2", "dgx-a100-40gb:1", "dgx-h100:2", "v100-dgx2:1", "hetero-demo"]


@cache
def sample(name: str) -> OpGraph:
    """Built once per session (gpt3-175b takes a noticeable fraction of a second)."""
    return build_sample(name)


def model(*ops, **top) -> dict:
    return {"format": "soapbox.model/1", "name": "m", "ops": list(ops), **top}


def inp(name: str, shape: list[int]) -> dict:
    return {"name": name, "kind": "input", "attrs": {"shape": shape}}


def op(name: str, kind: str, *inputs: str, **extra) -> dict:
    return {"name": name, "kind": kind, "inputs": list(inputs), **extra}


def problems(fn, data, *args) -> list[str]:
    """Every problem a failing load reports, as ``path: message`` lines."""
    with pytest.raises(ValidationError) as exc:
        fn(data, *args)
    return [str(p) for p in exc.value.problems]


def write(tmp_path, text: str | bytes, name: str = "f.json") -> str:
    p = tmp_path / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return str(p)


# --------------------------------------------------------------------------- round trips


class TestRoundTrip:
    @pytest.mark.parametrize("name", SAMPLES)
    def test_model(self, name):
        g = sample(name)
        back = load_model(g.to_dict())
        assert back.fingerprint == g.fingerprint
        assert back.to_dict() == g.to_dict()
        assert back.param_count == g.param_count

    @pytest.mark.parametrize("name", PRESETS)
    def test_cluster_file(self, tmp_path, name):
        c = preset(name)
        path = tmp_path / "c.json"
        save_json(c.to_dict(), path)
        back = load_cluster(str(path))
        assert back.devices == c.devices
        assert back.links == c.links
        assert back.to_dict() == c.to_dict()

    def test_data_parallel_strategy_file(self, tmp_path):
        g, c = sample("alexnet"), preset("p100-4x4")
        s = make_baseline("data-parallel", g, c)
        save_json(s.to_dict(), tmp_path / "s.json")
        back = load_strategy(str(tmp_path / "s.json"), g, c)
        assert back.to_dict() == s.to_dict()
        assert back == s

    def test_pipelined_strategy_keeps_stages(self, tmp_path):
        g = gpt(GPTConfig(layers=4, hidden=64, heads=4, seq_len=16, vocab=100, batch=8))
        c = preset("dgx-a100-80gb:1")
        s = make_baseline("megatron", g, c, tp=2, pp=2, vpp=2, micro_batch=1)
        save_json(s.to_dict(), tmp_path / "s.json")
        back = load_strategy(str(tmp_path / "s.json"), g, c)
        assert back.to_dict() == s.to_dict()
        assert (back.pipeline.stages, back.pipeline.virtual_stages, back.pipeline.schedule) == (2, 2, "interleaved")
        assert set(back.stage_of.values()) == {0, 1, 2, 3}


class TestSampleFiles:
    def test_one_file_per_sample(self):
        assert sorted(p.stem for p in sample_dir().glob("*.json")) == sorted(SAMPLES)

    @pytest.mark.parametrize("name", SAMPLES)
    def test_file_equals_builder(self, name):
        on_disk = json.loads((sample_dir() / f"{name}.json").read_text("utf-8"))
        # Regenerate with `soapbox models --write sample_models` when a builder changes on purpose.
        assert on_disk == json.loads(dumps(sample(name).to_dict()))

    @pytest.mark.parametrize("name", SAMPLES)
    def test_file_validates_and_loads(self, name):
        path = sample_dir() / f"{name}.json"
        data = read_json(path)
        assert schema_problems(data, "soapbox.model/1") == []
        assert load_model(path).fingerprint == sample(name).fingerprint


class TestSchema:
    @pytest.mark.parametrize("fmt", list(FORMATS))
    def test_valid_draft_2020_12(self, fmt):
        s = schema(fmt)
        assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(s)
        assert s["properties"]["format"] == {"const": fmt}

    def test_preset_and_strategy_dicts_validate(self):
        assert schema_problems(preset("hetero-demo").to_dict(), "soapbox.cluster/1") == []
        s = make_baseline("expert", sample("alexnet"), preset("p100-4x4"))
        assert schema_problems(s.to_dict(), "soapbox.strategy/1") == []

    def test_problems_sorted_numerically(self):
        ops = [op(f"r{i}", "relu", "x") for i in range(12)]
        ops[10]["kind"], ops[2]["kind"] = 1, 2
        assert [p.path for p in schema_problems(model(*ops), "soapbox.model/1")] == [
            "ops[2] (r2).kind", "ops[10] (r10).kind"]


# --------------------------------------------------------------------------- bad files


class TestBadJson:
    def test_malformed(self, tmp_path):
        path = write(tmp_path, '{"format": "soapbox.model/1",\n "name": x}')
        with pytest.raises(ValidationError) as exc:
            load_model(path)
        assert str(exc.value) == f"{path}: 1 problem found:\n  - line 2 column 10: invalid JSON: Expecting value"

    def test_truncated(self, tmp_path):
        path = write(tmp_path, '{"format": "soapbox.model/1",\n "name": "m", "ops": [')
        assert problems(load_model, path) == [
            "line 2 column 23: invalid JSON: Expecting value (the file looks truncated)"]

    def test_truncated_mid_object(self, tmp_path):
        path = write(tmp_path, '{"format": "soapbox.model/1",\n "ops": [{"name"\n')
        assert problems(load_model, path) == [
            "line 3 column 1: invalid JSON: Expecting ':' delimiter (the file looks truncated)"]

    @pytest.mark.parametrize("text", ["", "  \n\t"])
    def test_empty(self, tmp_path, text):
        path = write(tmp_path, text)
        with pytest.raises(ValidationError) as exc:
            load_model(path)
        assert str(exc.value) == f"{path}: 1 problem found:\n  - empty file: expected a JSON object"

    def test_not_an_object(self, tmp_path):
        assert problems(load_model, write(tmp_path, "[1, 2]")) == [
            "expected a JSON object at the top level, got list"]

    def test_not_utf8(self, tmp_path):
        path = write(tmp_path, b'{"format": "soapbox.model/1", "name": "\xff"}')
        assert problems(load_model, path) == ["not UTF-8 text (byte 39)"]

    def test_not_found(self, tmp_path):
        path = str(tmp_path / "missing.json")
        with pytest.raises(ValidationError) as exc:
            load_model(path)
        assert str(exc.value) == f"{path}: 1 problem found:\n  - file not found"

    def test_directory(self, tmp_path):
        with pytest.raises(ValidationError) as exc:
            load_cluster(str(tmp_path))
        assert str(exc.value) == f"{tmp_path}: 1 problem found:\n  - is a folder, not a JSON file"


class TestBadFormat:
    def test_missing(self):
        assert problems(load_model, {"name": "m"}) == ["format: missing; expected 'soapbox.model/1'"]

    def test_wrong_version(self):
        assert problems(load_model, model(format="soapbox.model/2")) == [
            "format: version 'soapbox.model/2' is not supported; this soapbox reads soapbox.model/1"]

    def test_unknown(self):
        assert problems(load_strategy, {"format": "soapbox.graph/1"}) == [
            "format: unknown format 'soapbox.graph/1'; known: soapbox.model/1, soapbox.cluster/1, soapbox.strategy/1, soapbox.profile/1"]

    def test_model_file_given_to_load_cluster(self, tmp_path):
        path = tmp_path / "m.json"
        save_json(sample("alexnet").to_dict(), path)
        with pytest.raises(ValidationError) as exc:
            load_cluster(str(path))
        assert str(exc.value) == (f"{path}: 1 problem found:\n"
                                  "  - format: this is a soapbox.model/1 file; expected soapbox.cluster/1")

    def test_source_is_data_for_mappings(self):
        with pytest.raises(ValidationError) as exc:
            load_model({"name": "m"})
        assert exc.value.source == "<data>"

    @pytest.mark.parametrize("fmt", [["soapbox.model/1"], {"v": 1}])
    def test_unhashable_format(self, fmt):
        with pytest.raises(ValidationError):
            load_model(model(format=fmt))


class TestSchemaViolations:
    def test_all_listed_at_once(self):
        data = model(inp("x", [2, 3]), {"name": "conv1", "kind": 7, "extra": 1}, {"name": "", "kind": "relu"},
                     {"kind": "relu", "inputs": "x"}, precision="fp64", bogus=1)
        assert problems(load_model, data) == [
            ("(top level): Additional properties are not allowed ('bogus' was unexpected); "
             "allowed: description, format, name, ops, precision, source"),
            ("ops[1] (conv1): Additional properties are not allowed ('extra' was unexpected); "
             "allowed: attrs, block, inputs, kind, name, out_shapes, param_group"),
            'ops[1] (conv1).kind: 7 is not of type "string"',
            'ops[2] ().name: "" is shorter than 1 character',
            'ops[3]: "name" is a required property',
            'ops[3].inputs: "x" is not of type "array"',
            'precision: "fp64" is not one of "fp32", "tf32", "fp16" or "bf16"',
        ]

    def test_no_ops(self):
        assert problems(load_model, model()) == ["ops: [] has less than 1 item"]

    def test_cluster(self):
        data = {"format": "soapbox.cluster/1", "name": "c",
                "nodes": [{"name": "n", "gpus": 0, "device_type": "X",
                           "intra": {"bw_bytes_per_s": 0, "latency_s": -1}, "nics": {"count": -1}}]}
        assert problems(load_cluster, data) == [
            "nodes[0] (n).gpus: must be at least 1, got 0",
            "nodes[0] (n).intra.bw_bytes_per_s: must be at least 1,000,000 (bytes/s), got 0",
            "nodes[0] (n).intra.latency_s: must be at least 0 (s), got -1",
            "nodes[0] (n).nics.count: must be at least 0, got -1",
        ]

    def test_strategy(self):
        data = {"format": "soapbox.strategy/1", "ops": {"a": {"degrees": {"sample": 0}, "devices": []}, "b": {}},
                "pipeline": {"stages": 0, "schedule": "x"}}
        assert problems(load_strategy, data) == [
            "ops.a.degrees.sample: must be at least 1, got 0",
            "ops.a.devices: [] has less than 1 item",
            'ops.b: "devices" is a required property',
            'pipeline.schedule: "x" is not one of "gpipe", "1f1b" or "interleaved"',
            "pipeline.stages: must be at least 1, got 0",
        ]


class TestModelMeaning:
    def test_cycle(self):
        assert problems(load_model, model(op("a", "relu", "b"), op("b", "relu", "a"))) == [
            "ops: the graph has a cycle: a -> b -> a"]

    def test_self_loop(self):
        assert problems(load_model, model(inp("x", [2]), op("a", "relu", "a"))) == [
            "ops: the graph has a cycle: a -> a"]

    def test_unknown_input(self):
        assert problems(load_model, model(inp("x", [2, 3]), op("a", "relu", "nope"))) == [
            "ops[1] (a).inputs[0]: refers to unknown op 'nope'"]

    def test_mismatched_shapes(self):
        data = model(inp("x", [2, 3]), inp("y", [2, 4]), op("s", "add", "x", "y"))
        assert problems(load_model, data) == [
            "ops[2] (s).inputs[1]: input shapes differ: [2, 3] vs [2, 4] (no broadcasting)"]

    def test_out_shapes_disagree(self):
        data = model(inp("x", [2, 3]), op("r", "relu", "x", out_shapes=[[2, 4]]))
        assert problems(load_model, data) == [
            "ops[1] (r).out_shapes: file says [[2, 4]], but the inputs and attributes give [[2, 3]]"]

    def test_duplicate_names(self):
        assert problems(load_model, model(inp("x", [2, 3]), inp("x", [2, 3]))) == [
            "ops[1] (x).name: duplicate op name 'x' (first used by ops[0])"]

    def test_several_at_once(self):
        data = model(inp("x", [2, 3]), inp("y", [2, 4]), op("s", "add", "x", "y"), op("t", "relu", "ghost"),
                     op("u", "relu", "x", out_shapes=[[3, 2]]), op("v", "relu", "s"))
        # v reads the failed s and is not reported again
        assert problems(load_model, data) == [
            "ops[3] (t).inputs[0]: refers to unknown op 'ghost'",
            "ops[2] (s).inputs[1]: input shapes differ: [2, 3] vs [2, 4] (no broadcasting)",
            "ops[4] (u).out_shapes: file says [[3, 2]], but the inputs and attributes give [[2, 3]]",
        ]

    def test_producers_may_come_later_in_the_file(self):
        g = load_model(model(op("r", "relu", "x"), inp("x", [2, 3])))
        assert [o.name for o in g.ops] == ["x", "r"]


# Inputs that must fail with ValidationError (and nothing else) for the given loader.
_BAD = [
    ("model-list", load_model, []),
    ("model-str", load_model, "not json"),
    ("model-int", load_model, 3),
    ("model-format-int", load_model, model(format=1)),
    ("model-nan-shape", load_model, model({"name": "x", "kind": "input", "attrs": {"shape": [float("nan")]}})),
    ("model-unknown-kind", load_model, model(inp("x", [2]), op("r", "frobnicate", "x"))),
    ("model-missing-attr", load_model, model(inp("x", [2, 3]), op("r", "linear", "x"))),
    ("model-bad-attr", load_model, model(inp("x", [2, 3]), op("r", "linear", "x", attrs={"out_features": "a"}))),
    ("model-bad-output-index", load_model, model(inp("x", [2, 3]), op("r", "relu", "x:1"))),
    ("cluster-empty", load_cluster, {"format": "soapbox.cluster/1"}),
    ("cluster-semantic", load_cluster, {"format": "soapbox.cluster/1", "name": "c", "nodes": [
        {"name": "n", "gpus": 2, "device_type": "X", "repeat": 2, "nics": {"count": 0}}]}),
    ("strategy-no-ops", load_strategy, {"format": "soapbox.strategy/1", "ops": {}}),
]


@pytest.mark.parametrize("fn, data", [b[1:] for b in _BAD], ids=[b[0] for b in _BAD])
def test_failing_load_raises_validation_error(fn, data):
    with pytest.raises(ValidationError):
        fn(data)


_ATTR_BUGS = [
    ("input-dtype-list", model({"name": "x", "kind": "input", "attrs": {"shape": [2, 3], "dtype": ["fp32"]}})),
    ("input-axes-nested", model({"name": "x", "kind": "input", "attrs": {"shape": [2, 3], "axes": [["a"], "b"]}})),
    ("reshape-shape-int", model(inp("x", [2, 3]), op("r", "reshape", "x", attrs={"shape": 6}))),
    ("transpose-perm-str", model(inp("x", [2, 3]), op("t", "transpose", "x", attrs={"perm": [1, "0"]}))),
]


@pytest.mark.parametrize("data", [b[1] for b in _ATTR_BUGS], ids=[b[0] for b in _ATTR_BUGS])
def test_wrongly_typed_attrs_raise_validation_error(data):
    with pytest.raises(ValidationError):
        load_model(data)


class TestClusterAndStrategyMeaning:
    def test_cluster_file_problems_name_the_file(self, tmp_path):
        path = tmp_path / "c.json"
        save_json({"format": "soapbox.cluster/1", "name": "c",
                   "nodes": [{"name": "n", "gpus": 2, "device_type": "A100-SXM4-80GB", "repeat": 2,
                              "nics": {"count": 0}}]}, path)
        with pytest.raises(ValidationError) as exc:
            load_cluster(str(path))
        assert str(exc.value) == (f"{path}: 1 problem found:\n  - nodes[0] (n).nics.count: a cluster of 2 nodes "
                                  "needs at least one NIC per node, got 0")

    def test_strategy_checked_against_model_and_cluster(self):
        g, c = sample("alexnet"), preset("p100-4x4")
        d = make_baseline("data-parallel", g, c).to_dict()
        d["ops"]["conv1"] = {"degrees": {"sample": 3}, "devices": [0, 1, 99]}
        assert load_strategy(d).configs["conv1"].devices == (0, 1, 99)  # structure alone is fine
        assert problems(load_strategy, d, g, c) == [
            "ops.conv1.degrees.sample: 3 does not divide sample (256)",
            "ops.conv1.devices[2]: device 99 does not exist; p100-4x4 has devices 0..15",
        ]


# --------------------------------------------------------------------------- saving


class TestDumps:
    def test_layout(self):
        assert dumps({"format": "x", "ops": [{"a": 1}, {"b": [1, 2]}]}) == (
            '{\n "format": "x",\n "ops": [\n  {"a": 1},\n  {"b": [1, 2]}\n ]\n}\n')

    def test_ops_mapping(self):
        assert dumps({"ops": {"a": {"devices": [0]}}}) == '{\n "ops": {\n  "a": {"devices": [0]}\n }\n}\n'

    def test_empty(self):
        assert dumps({}) == "{\n\n}\n"
        assert json.loads(dumps({"ops": []})) == {"ops": []}


class TestSaveJson:
    def test_writes_and_creates_folders(self, tmp_path):
        path = tmp_path / "a" / "b" / "x.json"
        save_json({"format": "soapbox.model/1", "n": 1.5}, path)
        assert read_json(path) == {"format": "soapbox.model/1", "n": 1.5}
        assert os.listdir(path.parent) == ["x.json"]

    def test_failure_keeps_the_old_file(self, tmp_path):
        path = tmp_path / "keep.json"
        path.write_bytes(b'{"old": true}\n')
        with pytest.raises(TypeError):
            save_json({"format": "x", "bad": object()}, path)
        assert path.read_bytes() == b'{"old": true}\n'
        assert os.listdir(tmp_path) == ["keep.json"]  # no temp file left behind

    def test_overwrite(self, tmp_path):
        path = tmp_path / "x.json"
        save_json({"v": 1}, path)
        save_json({"v": 2}, path)
        assert read_json(path) == {"v": 2}
        assert os.listdir(tmp_path) == ["x.json"]
