"""Hostile and malformed inputs (issue 10): every file, mapping or argument ends in a
ValidationError naming the file and field (or the CLI's one-line error), or in a finite,
valid result; never a traceback, a hang, or a read without bound.

The fuzz tests drive the mutations of ``benchmarks/fuzz_inputs.py`` (which runs 10,000 cases
with per-case timeouts) from hypothesis, on small seeds; the classes below pin each fault
class found by hand or by that script.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import signal
import threading
import time
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.formats as formats
from engine.cli import main
from engine.cluster import DEVICE_TYPES, MAX_DEVICES, Cluster, NodeSpec, preset
from engine.costs import CostModel, ProfileTable
from engine.errors import OutputError, ValidationError
from engine.formats import (
    MAX_JSON_DEPTH,
    atomic_writer,
    check_json_data,
    load_cluster,
    load_model,
    load_profile,
    load_strategy,
    parse_json_text,
    read_json,
    resolve_cluster,
    resolve_model,
    save_json,
    schema,
    validate_file,
)
from engine.graph import GraphBuilder
from engine.sim.report import finite_json, json_text, simulate_strategy
from engine.search.baselines import data_parallel, make_baseline
from engine.search.api import Budget, MCMCOptions, SearchResult, parse_options
from engine.strategy import Config, Strategy

_spec = importlib.util.spec_from_file_location(
    "fuzz_inputs", Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz_inputs.py")
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)

TWO = fuzz.TWO_GPUS


class _Hang(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    """Fail a case that runs longer than ``seconds`` (a hang) instead of waiting for ever."""
    def on_alarm(signum, frame):
        raise _Hang(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


class DataChooser:
    """The fuzzer's random choices drawn from hypothesis (so a failure shrinks)."""

    def __init__(self, data) -> None:
        self.data = data

    def randint(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def random(self) -> float:
        return self.data.draw(st.floats(0, 1, exclude_max=True))

    def choice(self, seq):
        return self.data.draw(st.sampled_from(list(seq)))


FUZZ = settings(max_examples=500, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


def _fuzz_one(kind: str, data, tmp_path) -> None:
    ch = DataChooser(data)
    label, seed_data, context = ch.choice(fuzz.seeds(small=True)[kind])
    kind, label, payload, context, as_file = fuzz.build_case(kind, label, seed_data, context, ch)
    with time_limit(20):
        outcome, detail = fuzz.classify(lambda: fuzz.evaluate(kind, payload, context, as_file, str(tmp_path)))
    assert outcome in ("valid", "ValidationError"), f"{outcome}: {detail}"
    if outcome == "ValidationError":
        assert detail.strip()  # a message that says what and where


@pytest.mark.parametrize("kind", fuzz.KINDS)
def test_fuzzed_files_end_in_a_validation_error_or_a_finite_result(kind, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp(f"fuzz-{kind}")

    @FUZZ
    @given(data=st.data())
    def check(data):
        _fuzz_one(kind, data, tmp_path)

    check()


@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_fuzzed_files_through_validate(data, tmp_path_factory):
    """``soapbox validate`` on fuzzed files: exit 0, 1 or 2 and a printable report."""
    ch = DataChooser(data)
    kind = ch.choice(fuzz.KINDS)
    label, seed_data, context = ch.choice(fuzz.seeds(small=True)[kind])
    raw = fuzz.encode(fuzz.mutate(seed_data, ch), ch)
    path = tmp_path_factory.mktemp("validate") / "f.json"
    path.write_bytes(raw)
    with time_limit(20):
        outcome, detail = fuzz.classify(lambda: fuzz.cli_validate(str(path)))
    assert outcome in ("valid", "refused"), f"{outcome}: {detail}"


# --------------------------------------------------------------------------- reading files


def problems(fn, *args) -> list[str]:
    with pytest.raises(ValidationError) as exc:
        fn(*args)
    return [str(p) for p in exc.value.problems]


class TestReadJson:
    def test_fifo_refused_without_blocking(self, tmp_path):
        # Regression: opening a FIFO for reading blocks until a writer comes.
        fifo = tmp_path / "pipe.json"
        os.mkfifo(fifo)
        result: list = []
        t = threading.Thread(target=lambda: result.append(problems(read_json, str(fifo))), daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), "read_json blocked on a FIFO"
        assert result == [["is a FIFO (named pipe), not a JSON file; give the path of a regular file"]]

    def test_dev_zero_refused(self):
        # Regression: st_size of /dev/zero is 0, so a cap that trusted it read without end.
        assert problems(read_json, "/dev/zero") == [
            "is a character device, not a JSON file; give the path of a regular file"]

    def test_folder_refused(self, tmp_path):
        assert problems(read_json, str(tmp_path)) == ["is a folder, not a JSON file"]

    def test_size_capped_while_reading_not_by_st_size(self, monkeypatch):
        # /proc files report st_size 0 whatever they hold
        path = "/proc/self/environ"
        if not os.path.exists(path) or os.stat(path).st_size != 0:
            pytest.skip("needs a /proc file that reports size 0")
        monkeypatch.setattr(formats.jsonio, "MAX_FILE_BYTES", 8)
        assert problems(read_json, path) == ["the file is larger than the limit of 0 MiB"]

    def test_too_large(self, tmp_path, monkeypatch):
        path = tmp_path / "big.json"
        path.write_text(json.dumps({"format": "soapbox.model/1", "pad": "x" * 4000}))
        monkeypatch.setattr(formats.jsonio, "MAX_FILE_BYTES", 2**10)
        assert problems(read_json, str(path)) == ["the file is larger than the limit of 0 MiB"]

    def test_nul_in_path(self):
        assert problems(read_json, "a\0b.json") == ["cannot read: embedded null byte"]


class TestNesting:
    def test_deep_file_refused_before_parsing(self, tmp_path):
        # Regression: 1,000-deep nesting (a 2 KB file) raised RecursionError while parsing.
        path = tmp_path / "deep.json"
        path.write_text('{"format": "soapbox.model/1", "ops": ' + "[" * 100_000 + "]" * 100_000 + "}")
        assert problems(load_model, str(path)) == [
            f"line 1 column {37 + MAX_JSON_DEPTH}: arrays and objects are nested more than 64 deep "
            "(soapbox files need a few levels)"]

    def test_limit_is_inclusive(self):
        ok = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
        assert parse_json_text('{"a": ' + ok + "}") is not None
        with pytest.raises(ValidationError):
            parse_json_text('{"a": [' + ok + "]}")

    def test_brackets_in_strings_do_not_count(self):
        text = json.dumps({"name": "[" * 500 + '\\"{' * 300, "b": ["]" * 100]})
        assert parse_json_text(text)["b"] == ["]" * 100]

    def test_escaped_quotes_do_not_hide_nesting(self):
        text = '{"a": "x\\"", "b": ' + "[" * 80 + "]" * 80 + "}"
        assert [p.split(":")[1] for p in problems(parse_json_text, text)] == [" arrays and objects are nested more "
                                                                               "than 64 deep (soapbox files need a "
                                                                               "few levels)"]

    def test_deep_attrs_in_a_mapping(self):
        # Regression: attributes nested 500 deep reached the schema library's recursion limit.
        deep = []
        node = deep
        for _ in range(500):
            node.append([])
            node = node[0]
        data = {"format": "soapbox.model/1", "name": "m", "ops": [{"name": "x", "kind": "input", "attrs": {"a": deep}}]}
        [p] = problems(load_model, data)
        assert p.startswith("ops[0] (x).attrs.a[0][0][0]")
        assert p.endswith(": arrays and objects are nested more than 64 deep (soapbox files need a few levels)")

    def test_a_large_strategy_scanned_in_chunks_agrees_with_a_parser_s_view(self):
        """The array-speed depth check on a 1,536-GPU GPT-3 strategy (~1.9 MB, many scan chunks)
        finds what a character-by-character scan finds: nothing in the file, and a deep array
        added at its end (or inside a string, where brackets do not count) at the same offset.
        (Its speed, ~3 ms, is timed by ``benchmarks/bench_refusals.py``.)"""
        g, c = resolve_model("gpt3-175b"), preset("dgx-a100-80gb:192")
        s = make_baseline("megatron", g, c, tp=8, pp=12, dp=16, micro_batch=1)
        raw = json.dumps(s.to_dict()).encode()
        deep = raw[:-1] + b', "deep": ' + b"[" * 70 + b"]" * 70 + b"}"
        quoted = raw[:-1] + b', "s": "' + b"\\\"[" * 70 + b'"}'  # brackets after escaped quotes
        assert len(raw) > 1_500_000
        for text in (raw, deep, quoted):
            assert formats.too_deep_at(text) == _first_too_deep(text.decode()), text[-200:]
        assert formats.too_deep_at(raw) is None and formats.too_deep_at(quoted) is None
        assert formats.too_deep_at(deep) == len(raw) - 1 + len(b', "deep": ') + MAX_JSON_DEPTH - 1


_JSON_VALUES = st.recursive(
    st.none() | st.integers(-5, 5) | st.text(alphabet='[]{}"\\ab,:', max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=4), inner,
                                                                max_size=3),
    max_leaves=40)


@given(_JSON_VALUES, st.integers(0, 6))
@settings(max_examples=400, deadline=None)
def test_the_depth_check_of_a_small_text_agrees_with_a_parser_s_view(value, limit):
    """Small texts (a request's body) are decided by bytes methods that keep the interpreter's
    lock, then the array scan says where: both as a character-by-character scan, on JSON
    whose strings hold brackets, quotes and backslashes, at every small limit."""
    text = json.dumps(value)
    assert formats.too_deep_at(text.encode(), limit) == _first_too_deep(text, limit)


@given(st.binary(max_size=200) | st.text(alphabet='[]{}"\\ ', max_size=200).map(str.encode), st.integers(0, 6))
@settings(max_examples=300, deadline=None)
def test_the_depth_check_answers_any_bytes(raw, limit):
    """Not JSON: some answer (an offset inside the text or None), never an exception."""
    at = formats.too_deep_at(raw, limit)
    assert at is None or (0 <= at < len(raw) and raw[at:at + 1] in (b"[", b"{"))


def _first_too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> int | None:
    """Offset of the first bracket nested deeper than ``limit``, scanning as a JSON parser
    reads: one character at a time, brackets inside strings (escapes honoured) not counted.
    The oracle for :func:`engine.formats.too_deep_at` (ASCII text: offsets in characters
    are offsets in bytes)."""
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return i
        elif ch in "]}":
            depth -= 1
    return None


class TestNumbersAndText:
    @pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])
    def test_non_finite_numbers_refused_with_their_place(self, token):
        text = '{"format": "soapbox.cluster/1",\n "x": ' + token + "}"
        assert problems(parse_json_text, text) == [
            f"line 2 column 7: {token} is not a finite number; write a number within +-1.8e308"]

    def test_integer_of_5000_digits(self):
        assert problems(parse_json_text, '{"a":\n ' + "9" * 5000 + "}") == [
            "line 2 column 2: invalid JSON: a number of more than 4,300 digits"]

    def test_integer_of_5000_digits_in_a_mapping(self):
        assert problems(check_json_data, {"a": [1, -10**5000]}) == ["a[1]: an integer of more than 4,300 digits"]

    def test_lone_surrogate_in_a_file(self, tmp_path):
        # Regression: a "\ud800" string raised UnicodeEncodeError in schema checking.
        path = tmp_path / "m.json"
        path.write_text('{"format": "soapbox.model/1", "name": "m", "ops": [{"name": "a\\ud800", "kind": "relu"}]}')
        assert problems(load_model, str(path)) == [
            "ops[0] (a\\ud800).name: text with a lone surrogate (such as \\ud800), which is not a character; "
            "write text as valid UTF-8"]

    def test_lone_surrogate_in_upload_text_and_keys(self):
        assert problems(parse_json_text, '{"\ud800": 1}') == [
            "\\ud800: text with a lone surrogate (such as \\ud800), which is not a character; write text as valid "
            "UTF-8"]

    @pytest.mark.parametrize("value, message", [
        (float("nan"), "nan is not a finite number"),
        (float("inf"), "inf is not a finite number"),
        ({1, 2}, "a set is not JSON data (objects, arrays, strings, numbers, true, false and null are)"),
        (b"x", "a bytes is not JSON data (objects, arrays, strings, numbers, true, false and null are)"),
    ])
    def test_mappings_hold_json_only(self, value, message):
        data = {"format": "soapbox.cluster/1", "name": "c", "nodes": [{"name": "n", "gpus": value}]}
        assert problems(load_cluster, data) == [f"nodes[0] (n).gpus: {message}"]

    def test_mapping_with_a_cycle(self):
        data = {"format": "soapbox.model/1", "name": "m", "ops": []}
        data["ops"].append(data)
        [p] = problems(load_model, data)
        assert p.endswith("arrays and objects are nested more than 64 deep, or a value contains itself")

    def test_mapping_with_a_tuple_key(self):
        assert problems(check_json_data, {"a": {(1, 2): 3}}) == ["a.(1, 2): a key must be a string, got a tuple"]

    def test_control_characters_are_escaped_in_reports(self):
        data = {"format": "soapbox.model/1", "name": "m", "ops": [{"name": "\x1b[31mx\n  - forged", "kind": 5}]}
        [p] = problems(load_model, data)
        assert "\x1b" not in p and "\n" not in p
        assert p.startswith("ops[0] (\\x1b[31mx\\n  - forged).kind:")

    def test_a_long_value_is_cut_in_the_report(self):
        data = {"format": "soapbox.model/1", "name": "m", "ops": [{"name": "x" * 100_000, "kind": "relu"}]}
        [p] = problems(load_model, data)
        assert len(p) < 1200 and "is 100,000 characters long; at most 256 are allowed" in p


# --------------------------------------------------------------------------- bounds


def model(*ops) -> dict:
    return {"format": "soapbox.model/1", "name": "m", "ops": list(ops)}


def inp(shape) -> dict:
    return {"name": "x", "kind": "input", "attrs": {"shape": shape}}


def conv(**attrs) -> dict:
    return {"name": "c", "kind": "conv2d", "inputs": ["x"], "attrs": {"out_channels": 4, "kernel": 3, **attrs}}


class TestModelBounds:
    @pytest.mark.parametrize("attrs, message", [
        ({"stride": 0}, "ops[1] (c).attrs.stride: must be between 1 and 2,147,483,647, got 0"),  # ZeroDivisionError
        ({"kernel": 0}, "ops[1] (c).attrs.kernel: must be between 1 and 2,147,483,647, got 0"),
        ({"kernel": [3, -1]}, "ops[1] (c).attrs.kernel: must be between 1 and 2,147,483,647, got [3, -1]"),
        ({"padding": -1}, "ops[1] (c).attrs.padding: must be between 0 and 2,147,483,647, got -1"),
        ({"bias": "yes"}, "ops[1] (c).attrs.bias: must be true or false, got 'yes'"),
        ({"bias": 1}, "ops[1] (c).attrs.bias: must be true or false, got 1"),
        ({"kernel": True}, "ops[1] (c).attrs.kernel: expected an integer or a pair of integers, got True"),
        ({"out_channels": 2**31}, "ops[1] (c).attrs.out_channels: must be at most 2,147,483,647, got 2147483648"),
    ])
    def test_conv_attrs(self, attrs, message):
        assert problems(load_model, model(inp([1, 3, 8, 8]), conv(**attrs))) == [message]

    def test_pool_stride_zero(self):
        pool = {"name": "p", "kind": "pool2d", "inputs": ["x"], "attrs": {"kernel": 2, "stride": [1, 0]}}
        assert problems(load_model, model(inp([1, 3, 8, 8]), pool)) == [
            "ops[1] (p).attrs.stride: must be between 1 and 2,147,483,647, got [1, 0]"]

    @pytest.mark.parametrize("op, field", [
        ({"kind": "linear", "attrs": {"out_features": 4, "bias": "no"}}, "bias"),
        ({"kind": "split", "attrs": {"sizes": [4], "squeeze": 0}}, "squeeze"),
        ({"kind": "pool2d", "attrs": {"global": "true"}}, "global"),
    ])
    def test_flags_must_be_booleans(self, op, field):
        [p] = problems(load_model, model(inp([2, 3, 4, 4]), {"name": "o", "inputs": ["x"], **op}))
        assert p.startswith(f"ops[1] (o).attrs.{field}: must be true or false, got ")

    def test_batch_too_large_for_int64(self):
        # Regression: a batch of 10**30 passed and overflowed at simulation (OverflowError).
        assert problems(load_model, model(inp([10**30, 3]), {"name": "r", "kind": "relu", "inputs": ["x"]})) == [
            "ops[0] (x).attrs.shape: must be a list of 1 to 16 sizes from 1 to 2,147,483,647, got "
            "[1000000000000000000000000000000, 3]"]

    def test_tensor_too_large(self):
        [p] = problems(load_model, model(inp([2**31 - 1, 2**31 - 1]), {"name": "r", "kind": "relu", "inputs": ["x"]}))
        assert p.startswith("ops[0] (x).attrs: output 0 of shape [2147483647, 2147483647] has ")
        assert p.endswith("the limits are 17,592,186,044,416 (2**44) elements and 16 axes")

    def test_input_only_model_refused(self):
        # Regression: iteration time 0 and throughput inf.
        assert problems(load_model, model(inp([4, 3]))) == [
            "ops: the model computes nothing: every op is an input or a reshape; add the layers that use the inputs"]

    def test_integral_floats_read_as_integers(self):
        g = load_model(model(inp([4.0, 3]), {"name": "c", "kind": "linear", "inputs": ["x"],
                                             "attrs": {"out_features": 2.0}, "out_shapes": [[4.0, 2]]}))
        assert g["x"].out_tensors[0].shape == (4, 3) and g["c"].attrs["out_features"] == 2
        assert all(type(v) is int for v in g["c"].out_tensors[0].shape)
        with pytest.raises(ValidationError):
            load_model(model(inp([4.5, 3]), {"name": "r", "kind": "relu", "inputs": ["x"]}))

    def test_dropout_rate_stays_a_float(self):
        g = load_model(model(inp([4, 3]), {"name": "d", "kind": "dropout", "inputs": ["x"], "attrs": {"rate": 0.0}}))
        assert type(g["d"].attrs["rate"]) is float


def cluster(**node) -> dict:
    return {"format": "soapbox.cluster/1", "name": "c",
            "nodes": [{"name": "n", "gpus": 2, "device_type": "A100-SXM4-80GB", **node}]}


def _count_devices(monkeypatch) -> list:
    """A list that grows by one for every device a :class:`Cluster` makes from now on."""
    import engine.cluster.topology as topology

    made, real = [], topology.Device

    def counting(*a, **kw):
        made.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(topology, "Device", counting)
    return made


class TestClusterBounds:
    def test_huge_repeat_refused_at_once(self, monkeypatch):
        # Regression: a 150-byte file with repeat 10**8 built a name per node before any check.
        made = _count_devices(monkeypatch)
        assert problems(load_cluster, cluster(repeat=10**8)) == [
            "nodes[0] (n).repeat: must be at most 16,384, got 100000000"]
        assert problems(load_cluster, cluster(repeat=16384, gpus=16384)) == [
            "nodes: 268,435,456 GPUs is over the limit of 16,384"]
        with pytest.raises(ValidationError, match="repeat: must be an integer from 1 to 16,384, got 100000000"):
            Cluster("c", [NodeSpec("n", 1, "A100-SXM4-80GB", "switch", 300e9, repeat=10**8)], DEVICE_TYPES)
        with pytest.raises(ValidationError, match="25,000,000 GPUs is over the limit"):
            Cluster("c", [NodeSpec("n", 2500, "A100-SXM4-80GB", "switch", 300e9, repeat=10**4)], DEVICE_TYPES)
        assert made == []  # refused before a node was expanded

    def test_preset_size_checked_before_building(self, monkeypatch):
        made = _count_devices(monkeypatch)
        with pytest.raises(ValidationError, match="800,000,000 GPUs is over the limit of 16,384"):
            preset("dgx-h100:100000000")
        with pytest.raises(ValueError, match="unknown cluster"):
            preset("dgx-h100:" + "9" * 5000)  # (no 5,000-digit number is converted)
        assert made == []
        preset("dgx-h100:2")  # (the counter counts)
        assert len(made) == 16

    def test_mesh_links_bounded(self):
        assert problems(load_cluster, cluster(gpus=1024, intra={"topology": "mesh"})) == [
            "nodes: 1,047,552 links is over the limit of 262,144 (a mesh node of n GPUs has n(n-1) links; use a switch)"]

    @pytest.mark.parametrize("where, value, message", [
        ({"intra": {"bw_bytes_per_s": 5e-324}}, None,
         "nodes[0] (n).intra.bw_bytes_per_s: must be at least 1,000,000 (bytes/s), got 5e-324"),
        ({"nics": {"latency_s": 1e308}}, None, "nodes[0] (n).nics.latency_s: must be at most 1 (s), got 1e+308"),
        ({"intra": {"bw_bytes_per_s": 1e300}}, None,
         "nodes[0] (n).intra.bw_bytes_per_s: must be at most 1e+15 (bytes/s), got 1e+300"),
    ])
    def test_rates_in_physical_ranges(self, where, value, message):
        assert problems(load_cluster, cluster(**where)) == [message]

    def test_device_type_ranges(self):
        data = cluster(device_type="T")
        data["device_types"] = {"T": {"peak_flops_per_s": {"fp32": 1e-300, "fp16": 1e30},
                                      "mem_bw_bytes_per_s": 0.5, "memory_bytes": 10}}
        assert problems(load_cluster, data) == [
            "device_types.T.mem_bw_bytes_per_s: must be at least 1,000,000 (bytes/s), got 0.5",
            "device_types.T.memory_bytes: must be at least 1,048,576 (bytes), got 10",
            "device_types.T.peak_flops_per_s.fp16: must be at most 1e+18 (FLOP/s), got 1e+30",
            "device_types.T.peak_flops_per_s.fp32: must be at least 1,000,000,000 (FLOP/s), got 1e-300",
        ]

    def test_fp32_peak_required(self):
        data = cluster(device_type="T")
        data["device_types"] = {"T": {"peak_flops_per_s": {"fp16": 1e14}, "mem_bw_bytes_per_s": 1e12,
                                      "memory_bytes": 2**34}}
        assert problems(load_cluster, data) == ['device_types.T.peak_flops_per_s: "fp32" is a required property']

    def test_integral_floats_read_as_integers(self):
        c = load_cluster(cluster(gpus=2.0, repeat=2.0, nics={"count": 1.0}))
        assert c.num_devices == 4


class TestStrategyBounds:
    @pytest.fixture(scope="class")
    @staticmethod
    def alex():
        g, c = resolve_model("alexnet"), preset("p100-4x4")
        return g, c, data_parallel(g, c).to_dict()

    def test_device_written_as_a_float(self, alex, capsys, tmp_path):
        # Regression: a device id written 5.0 passed the schema (JSON Schema's integer) and
        # raised IndexError while the result was printed.
        g, c, d = alex
        d = json.loads(json.dumps(d))
        d["ops"]["conv1"]["devices"] = [float(x) for x in d["ops"]["conv1"]["devices"]]
        s = load_strategy(d, g, c)
        assert all(type(x) is int for x in s.configs["conv1"].devices)
        path = tmp_path / "s.json"
        path.write_text(json.dumps(d))
        assert main(["simulate", "--model", "alexnet", "--cluster", "p100-4x4", "--strategy", str(path)]) == 0
        assert "iteration time" in capsys.readouterr().out

    def test_fractional_device_refused(self, alex):
        g, c, d = alex
        d = json.loads(json.dumps(d))
        d["ops"]["conv1"]["devices"][3] = 3.5
        assert problems(load_strategy, d, g, c) == ['ops.conv1.devices[3]: 3.5 is not of type "integer"']

    def test_microbatches_beyond_the_batch(self, alex):
        g, c, d = alex
        d = json.loads(json.dumps(d))
        d["pipeline"]["microbatches"] = 512
        assert "pipeline.microbatches: 512 microbatches: at most 256 (each holds at least one sample of the batch " \
               "of 256; the limit is 65,536)" in problems(load_strategy, d, g, c)

    def test_integer_bounds_in_the_schema(self, alex):
        g, c, d = alex
        d = json.loads(json.dumps(d))
        d["ops"]["conv1"]["devices"][0] = 2**63
        d["pipeline"]["microbatches"] = 10**30
        assert problems(load_strategy, d) == [
            "ops.conv1.devices[0]: must be at most 16,383, got 9223372036854775808",
            "pipeline.microbatches: must be at most 65,536, got 1000000000000000000000000000000"]


class TestSchemasMatchTheEngine:
    def test_limits(self):
        from engine.cluster import BW_RANGE_BYTES_PER_S, FLOPS_RANGE_PER_S, MAX_LATENCY_S, MEMORY_RANGE_BYTES
        from engine.graph import MAX_OPS
        from engine.ops import MAX_DIM, MAX_OP_TENSORS, MAX_RANK
        from engine.strategy import MAX_MICROBATCHES, MAX_VIRTUAL_STAGES

        c = schema("soapbox.cluster/1")
        assert (c["$defs"]["bandwidth"]["minimum"], c["$defs"]["bandwidth"]["maximum"]) == BW_RANGE_BYTES_PER_S
        assert c["$defs"]["latency"]["maximum"] == MAX_LATENCY_S
        assert c["$defs"]["count"]["maximum"] == MAX_DEVICES
        dt = c["properties"]["device_types"]["additionalProperties"]["properties"]
        flops = dt["peak_flops_per_s"]["additionalProperties"]
        assert (flops["minimum"], flops["maximum"]) == FLOPS_RANGE_PER_S
        assert (dt["memory_bytes"]["minimum"], dt["memory_bytes"]["maximum"]) == MEMORY_RANGE_BYTES
        m = schema("soapbox.model/1")["properties"]["ops"]
        assert m["maxItems"] == MAX_OPS
        assert m["items"]["properties"]["inputs"]["maxItems"] == MAX_OP_TENSORS
        shapes = m["items"]["properties"]["out_shapes"]["items"]
        assert (shapes["maxItems"], shapes["items"]["maximum"]) == (MAX_RANK, MAX_DIM)
        pipe = schema("soapbox.strategy/1")["properties"]["pipeline"]["properties"]
        assert pipe["microbatches"]["maximum"] == MAX_MICROBATCHES
        assert pipe["virtual_stages"]["maximum"] == MAX_VIRTUAL_STAGES
        assert pipe["stages"]["maximum"] == MAX_DEVICES


class TestProfileBounds:
    def test_times_bounded(self):
        data = {"format": "soapbox.profile/1", "entries": [
            {"kind": "relu", "inputs": [[2**40]], "outputs": [[1]], "precision": "fp16", "device_type": "x",
             "fwd_s": 1e308, "bwd_s": 5e-324}]}
        assert problems(load_profile, data) == [
            "entries[0].fwd_s: must be at most 86,400 (s), got 1e+308",
            "entries[0].inputs[0][0]: must be at most 2,147,483,647, got 1099511627776"]


# --------------------------------------------------------------------------- names


class TestNameResolution:
    @pytest.fixture
    def no_file_access(self, monkeypatch):
        def forbidden(*args, **kwargs):
            raise AssertionError(f"the file system was touched: {args}")

        monkeypatch.setattr(formats.jsonio, "_read_capped", forbidden)
        monkeypatch.setattr(formats.os.path, "exists", forbidden)

    def test_names_never_open_paths(self, no_file_access, tmp_path):
        with pytest.raises(ValueError, match=r"^unknown model '/etc/hostname': not a sample model \(alexnet, "):
            resolve_model("/etc/hostname")
        with pytest.raises(ValueError, match=r"^unknown model 'x.json': not a sample model"):
            resolve_model("x.json")
        with pytest.raises(ValueError, match=r"^unknown cluster '/etc/hostname'; presets: p100-4x4"):
            resolve_cluster("/etc/hostname")
        with pytest.raises(ValueError, match="a model name must be a string, got list"):
            resolve_model(["alexnet"])
        with pytest.raises(ValueError, match="a cluster name must be a string, got dict"):
            resolve_cluster({"name": "p100-4x4"})

    def test_samples_and_presets_resolve(self):
        assert resolve_model("alexnet").name == "alexnet"
        assert resolve_cluster("dgx-h100:2").num_devices == 16

    def test_paths_only_when_allowed(self, tmp_path):
        path = tmp_path / "m.json"
        save_json(resolve_model("alexnet").to_dict(), path)
        assert resolve_model(str(path), allow_path=True).name == "alexnet"
        with pytest.raises(ValueError, match="not a sample model"):
            resolve_model(str(path))
        save_json(preset("p100-4x4").to_dict(), tmp_path / "c.json")
        assert resolve_cluster(str(tmp_path / "c.json"), allow_path=True).num_devices == 16
        with pytest.raises(ValueError, match=r"^unknown cluster .*; presets: .* \(or a cluster file\)$"):
            resolve_cluster("nope", allow_path=True)

    def test_validate_does_not_open_what_a_strategy_names(self, tmp_path, monkeypatch):
        # Regression: validate opened the model and cluster named inside a strategy file.
        d = data_parallel(resolve_model("alexnet"), preset("p100-4x4")).to_dict()
        d["model"] = {"name": "/etc/hostname"}
        d["cluster"] = {"name": "/etc/hostname", "devices": 16}
        path = tmp_path / "s.json"
        save_json(d, path)
        opened = []
        from engine.formats import jsonio

        real = jsonio._read_capped
        monkeypatch.setattr(jsonio, "_read_capped", lambda p, src: opened.append(str(p)) or real(p, src))
        summary = validate_file(str(path))
        assert opened == [str(path)]
        assert summary == (f"{path}: valid soapbox.strategy/1 structure (24 ops); not checked against a model and "
                           "cluster: unknown model '/etc/hostname': not a sample model (alexnet, inception_v3, "
                           "resnet101, rnntc, rnnlm, nmt, transformer, gpt2, gpt3-175b, bert-large, llama2-7b, "
                           "mixtral-8x7b, deepseek-v3, qwen3-30b-a3b, qwen3-235b-a22b, gpt-oss-120b)")

    def test_validate_a_profile(self, tmp_path):
        path = tmp_path / "p.json"
        save_json({"format": "soapbox.profile/1", "entries": []}, path)
        assert validate_file(str(path)) == f"{path}: valid soapbox.profile/1: 0 entries"


# --------------------------------------------------------------------------- writing


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc, out, err, start: str) -> None:
    assert rc == 2 and out == ""
    assert err.startswith(f"soapbox: error: {start}") and err.count("\n") == 1, err
    assert "Traceback" not in err


class TestOutputs:
    BASELINE = ["baseline", "--model", "alexnet", "--cluster", "p100-4x4", "--kind", "data-parallel"]

    def test_output_is_a_folder(self, capsys, tmp_path):
        one_line_error(*run(capsys, *self.BASELINE, "-o", str(tmp_path)),
                       f"cannot write {tmp_path}: is a folder; give a file name")

    def test_output_below_a_file(self, capsys, tmp_path):
        (tmp_path / "f").write_text("x")
        one_line_error(*run(capsys, *self.BASELINE, "-o", str(tmp_path / "f" / "s.json")),
                       f"cannot write {tmp_path / 'f' / 's.json'}: '{tmp_path / 'f'}' is a file, not a folder")

    def test_trace_into_a_missing_folder(self, capsys, tmp_path):
        path = tmp_path / "no" / "t.json"
        one_line_error(*run(capsys, "simulate", "--model", "alexnet", "--cluster", "p100-4x4", "--strategy",
                            "data-parallel", "--trace", str(path)),
                       f"cannot write {path}: no such folder '{tmp_path / 'no'}'")

    def test_trace_keeps_an_existing_tmp_file(self, capsys, tmp_path):
        # Regression: --trace wrote PATH.tmp, clobbering a user's file of that name.
        keep = tmp_path / "t.json.tmp"
        keep.write_text("mine")
        rc, _, _ = run(capsys, "simulate", "--model", "alexnet", "--cluster", "p100-4x4", "--strategy",
                       "data-parallel", "--trace", str(tmp_path / "t.json"))
        assert rc == 0 and keep.read_text() == "mine"
        assert sorted(os.listdir(tmp_path)) == ["t.json", "t.json.tmp"]

    def test_interrupted_write_leaves_nothing(self, tmp_path):
        path = tmp_path / "x.json"
        path.write_text("old")
        for exc in (KeyboardInterrupt, SystemExit, RuntimeError):
            with pytest.raises(exc):
                with atomic_writer(path) as f:
                    f.write("partial")
                    raise exc()
        assert os.listdir(tmp_path) == ["x.json"] and path.read_text() == "old"

    def test_temp_name_holds_the_pid(self, tmp_path):
        with atomic_writer(tmp_path / "x.json") as f:
            [name] = [n for n in os.listdir(tmp_path)]
            assert name.startswith(f".x.json.{os.getpid()}.") and name.endswith(".tmp")
            f.write("{}")

    def test_stale_temp_files_of_dead_writers_swept(self, tmp_path):
        dead = tmp_path / ".x.json.99999999.abcd.tmp"  # no such pid
        alive = tmp_path / f".x.json.{os.getppid()}.abcd.tmp"  # the parent process is alive
        other = tmp_path / ".y.json.99999999.abcd.tmp"  # another file's
        for p in (dead, alive, other):
            p.write_text("")
        save_json({"a": 1}, tmp_path / "x.json")
        assert sorted(os.listdir(tmp_path)) == sorted(["x.json", alive.name, other.name])

    def test_sigterm_during_a_write_cleans_up(self, capsys, tmp_path, monkeypatch):
        path = tmp_path / "c.json"
        path.write_text("old")
        real_replace = os.replace

        def replace_then_terminated(src, dst):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
            real_replace(src, dst)

        monkeypatch.setattr(formats.os, "replace", replace_then_terminated)
        rc, _, err = run(capsys, "cluster", "dgx-h100:1", "-o", str(path))
        assert rc == 143 and err == "soapbox: terminated\n"
        assert os.listdir(tmp_path) == ["c.json"] and path.read_text() == "old"
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))

    def test_save_json_refuses_non_finite_numbers(self, tmp_path):
        with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
            save_json({"a": float("inf")}, tmp_path / "x.json")
        assert os.listdir(tmp_path) == []

    def test_strategy_cost_inf_written_as_null(self, tmp_path):
        g = resolve_model("alexnet")
        s = Strategy({op.name: Config.single(0) for op in g.ops}, cost={"iteration_time_s": math.inf},
                     found_by={"budget": {"seconds": math.nan}})
        save_json(s.to_dict(), tmp_path / "s.json")
        back = read_json(tmp_path / "s.json")
        assert back["cost"] == {"iteration_time_s": None} and back["found_by"] == {"budget": {"seconds": None}}


class TestArguments:
    @pytest.mark.parametrize("budget, message", [
        ("9" * 400, "budget '9999999999999999999999999999999999999999...' is more than 1,000,000,000 proposals, "
                    "the most a search runs"),
        ("9" * 400 + "s", "budget '9999999999999999999999999999999999999999...' is more than 7 days (604,800 s), "
                          "the longest a search runs"),
        ("1e999s", "budget '1e999s' is not a number of proposals (5000) or a time (30s, 2m, 1h): at most "
                   "1,000,000,000 proposals or 7 days"),
        ("inf", "budget 'inf' is not a number of proposals (5000) or a time (30s, 2m, 1h): at most "
                "1,000,000,000 proposals or 7 days"),
        ("8d", "budget '8d' is not a number of proposals (5000) or a time (30s, 2m, 1h): at most "
               "1,000,000,000 proposals or 7 days"),
        ("200h", "budget '200h' is more than 7 days (604,800 s), the longest a search runs"),
    ])
    def test_budget(self, capsys, budget, message):
        # Regression: 400 nines raised OverflowError; with "s", a search that never ends.
        with pytest.raises(ValueError) as exc:
            Budget.parse(budget)
        assert str(exc.value) == message
        one_line_error(*run(capsys, "search", "--model", "alexnet", "--cluster", "p100-4x4", "--budget", budget),
                       message)

    @pytest.mark.parametrize("argv, message", [
        (["--chains", "1000000000"], "argument --chains: 1000000000 must be at most 256"),
        (["--tp", "99999"], "argument --tp: 99999 must be at most 16,384"),
        (["--seed", "9" * 50], f"argument --seed: '{'9' * 40}... (10 more characters)' is not a whole number (from "
                               "-9,223,372,036,854,775,808 to 9,223,372,036,854,775,807)"),
    ])
    def test_bounded_arguments(self, capsys, argv, message):
        with pytest.raises(SystemExit) as exc:
            main(["search", "--model", "alexnet", "--cluster", "p100-4x4", *argv])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err


class TestFiniteOutputs:
    def test_zero_time_iteration_has_null_throughput(self):
        b = GraphBuilder("m")
        x = b.input("x", [2, 4])
        b.add("relu", "r", [x])
        g = b.build()
        c = load_cluster(TWO)
        s = Strategy({op.name: Config.single(0) for op in g.ops})
        table = ProfileTable()
        ins, outs, params = g["r"].partition_shapes({})
        table.add("relu", ins, outs, params, "fp32", c.device_type(0).name, 0.0, 0.0)
        r = simulate_strategy(g, s, c, CostModel(profile=table))
        assert r.iteration_time_s == 0 and r.throughput_samples_per_s is None
        obj = json.loads(json_text(r.summary()))
        assert obj["throughput_samples_per_s"] is None
        assert "throughput_samples_per_s is null: the iteration takes 0 s" in obj["notes"][0]

    def test_finite_json(self):
        notes: list[str] = []
        assert finite_json({"a": [1.0, math.inf], "b": {"c": math.nan}}, "", notes) == {"a": [1.0, None],
                                                                                      "b": {"c": None}}
        assert notes == ["a[1] is not a finite number (inf); shown as null",
                         "b.c is not a finite number (nan); shown as null"]
        assert json.loads(json_text({"x": math.inf})) == {"x": None, "notes": [
            "x is not a finite number (inf); shown as null"]}

    def test_search_json_when_nothing_fits(self, capsys, monkeypatch):
        g, c = resolve_model("alexnet"), preset("p100-4x4")
        s = data_parallel(g, c)
        result = SearchResult(s, math.inf, {"data-parallel": math.inf, "expert": 0.02}, 3, 0.1, notes=[
            "baseline data-parallel does not fit in memory: no speedup over it is reported"])

        from engine.search import ALGORITHMS
        stub = types.SimpleNamespace(run=lambda *a, **k: result, options=MCMCOptions, description="stub",
                                     parse_options=lambda pairs: parse_options(MCMCOptions, pairs))
        monkeypatch.setitem(ALGORITHMS, "mcmc", stub)  # (the one registry: the command line reads it)
        rc, out, err = run(capsys, "search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc",
                           "--budget", "3", "--json")
        assert rc == 3 and err == ""
        obj = json.loads(out)  # strict: Python's json reads Infinity, so check the text too
        assert "Infinity" not in out and "NaN" not in out
        assert obj["best_cost_s"] is None and obj["baselines"] == {"data-parallel": None, "expert": 0.02}
        assert obj["speedup_vs_best_baseline"] is None
        from engine.cli.search import NOTHING_FITS_HINT

        assert obj["notes"] == ["no strategy found fits in memory: best_cost_s is null", NOTHING_FITS_HINT,
                                "baseline data-parallel does not fit in memory: no speedup over it is reported"]
        assert "--strategy fsdp --recompute full" in NOTHING_FITS_HINT
        rc, out, _ = run(capsys, "search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc",
                         "--budget", "3")
        assert rc == 3
        assert "best            none found fits in memory" in out
        assert "data-parallel   does not fit in memory" in out

    def test_help_documents_the_exit_status(self, capsys):
        with pytest.raises(SystemExit):
            main(["simulate", "--help"])
        out = capsys.readouterr().out
        assert "exit status 3: the strategy does not fit in memory" in " ".join(out.split())


def test_output_error_is_an_oserror():
    assert isinstance(OutputError("p", "r"), OSError) and str(OutputError("p", "r")) == "cannot write p: r"


def test_stdout_stays_printable_for_hostile_names(capsys, tmp_path):
    data = load_model(model(inp([2, 3]), {"name": "r", "kind": "relu", "inputs": ["x"]})).to_dict()
    data["name"] = "\x1b]0;owned\x07m"
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    with contextlib.redirect_stdout(io.StringIO()) as buf:
        assert main(["validate", str(path)]) == 0
    assert "\x1b" not in buf.getvalue() and "\\x1b]0;owned\\x07m" in buf.getvalue()
