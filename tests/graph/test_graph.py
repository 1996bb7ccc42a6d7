"""OpGraph: building, validation of loaded graphs (every problem at once), shared
parameters, array and networkx views, fingerprints."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ValidationError
from engine.graph import GraphBuilder, TensorRef, graph_from_dict
from engine.ops import OpError


def mlp():
    b = GraphBuilder("mlp")
    x = b.input("x", [8, 16])
    h = b.add("relu", "act", [b.add("linear", "fc1", [x], out_features=32)])
    y = b.add("linear", "fc2", [h], out_features=4)
    b.add("softmax_cross_entropy", "loss", [y, b.input("labels", [8], dtype="int64")])
    return b.build()


def model_dict(ops):
    return {"format": "soapbox.model/1", "name": "m", "ops": ops}


class TestTensorRef:
    def test_parse_and_str(self):
        assert TensorRef.parse("lstm:1") == TensorRef("lstm", 1)
        assert TensorRef.parse("a:b") == TensorRef("a:b", 0)  # a colon without a number is part of the name
        assert str(TensorRef("x", 0)) == "x" and str(TensorRef("x", 2)) == "x:2"


class TestBuilder:
    def test_totals(self):
        g = mlp()
        assert len(g) == 6
        assert g.param_count == (16 * 32 + 32) + (32 * 4 + 4)
        assert g.fwd_flops == 2 * 8 * 16 * 32 + 8 * 32 + 2 * 8 * 32 * 4 + 6 * 8 * 4
        assert g.batch_size == 8
        assert g.consumers("fc1") == ["act"]

    def test_duplicate_name(self):
        b = GraphBuilder("t")
        b.input("x", [2])
        with pytest.raises(OpError, match="duplicate op name 'x'"):
            b.input("x", [2])

    def test_unknown_and_later_inputs(self):
        b = GraphBuilder("t")
        with pytest.raises(OpError, match="refers to 'nope', which is not an earlier op"):
            b.add("relu", "r", ["nope"])

    def test_missing_output_index(self):
        b = GraphBuilder("t")
        b.input("x", [2, 3])
        with pytest.raises(OpError, match="'x' has 1 output\\(s\\); output 1 does not exist"):
            b.add("relu", "r", ["x:1"])

    def test_bad_precision(self):
        with pytest.raises(ValueError, match="precision must be one of fp32, tf32, fp16, bf16, got 'fp64'"):
            GraphBuilder("t", "fp64")


class TestParamGroups:
    def test_shared_parameters_counted_once(self):
        b = GraphBuilder("rnn")
        x = b.input("x", [4, 8])
        h, c = b.add("lstm", "t0", [x], hidden_size=8, param_group="lstm")
        b.add("lstm", "t1", [x, h, c], hidden_size=8, param_group="lstm")
        g = b.build()
        assert g.param_count == g["t0"].param_count == 8 * 32 + 8 * 32 + 32  # W, U, bias

    def test_tied_embedding_transposed(self):
        b = GraphBuilder("lm")
        e = b.add("embedding", "emb", [b.input("ids", [2, 3], dtype="int64", axes=["sample", "length"])],
                  num_embeddings=10, embedding_dim=4, param_group="tie")
        b.add("linear", "head", [e], out_features=10, bias=False, param_group="tie")
        assert b.build().param_count == 40

    def test_mismatched_group(self):
        b = GraphBuilder("bad")
        x = b.input("x", [4, 8])
        b.add("linear", "a", [x], out_features=3, param_group="g")
        b.add("linear", "b", [x], out_features=5, param_group="g")
        with pytest.raises(ValidationError) as exc:
            b.build()
        assert [str(p) for p in exc.value.problems] == [
            "ops[2] (b).param_group: shares 'g' with 'a', but its parameters have shapes [[5, 8], [5]] "
            "against [[3, 8], [3]]"]

    def test_group_without_parameters(self):
        b = GraphBuilder("bad")
        b.add("relu", "r", [b.input("x", [4])], param_group="g")
        with pytest.raises(ValidationError, match="relu has no parameters to share"):
            b.build()


class TestGraphFromDict:
    def test_order_is_topological_even_when_the_file_is_not(self):
        g = graph_from_dict(model_dict([
            {"name": "r", "kind": "relu", "inputs": ["x"]},
            {"name": "x", "kind": "input", "attrs": {"shape": [2, 3]}},
        ]))
        assert [op.name for op in g.ops] == ["x", "r"]

    def test_cycle(self):
        with pytest.raises(ValidationError) as exc:
            graph_from_dict(model_dict([
                {"name": "x", "kind": "input", "attrs": {"shape": [2]}},
                {"name": "a", "kind": "add", "inputs": ["x", "b"]},
                {"name": "b", "kind": "relu", "inputs": ["a"]},
            ]))
        assert [str(p) for p in exc.value.problems] == ["ops: the graph has a cycle: a -> b -> a"]

    def test_every_problem_is_reported_once(self):
        with pytest.raises(ValidationError) as exc:
            graph_from_dict(model_dict([
                {"name": "x", "kind": "input", "attrs": {"shape": [2, 3]}},
                {"name": "y", "kind": "input", "attrs": {"shape": [2, 4]}},
                {"name": "sum", "kind": "add", "inputs": ["x", "y"]},
                {"name": "after", "kind": "relu", "inputs": ["sum"]},  # not re-reported
                {"name": "ghost", "kind": "relu", "inputs": ["missing"]},
                {"name": "x", "kind": "relu", "inputs": ["y"]},
                {"name": "fc", "kind": "linear", "inputs": ["y"], "attrs": {"out_features": 2},
                 "out_shapes": [[2, 3]]},
            ]))
        assert [str(p) for p in exc.value.problems] == [
            "ops[5] (x).name: duplicate op name 'x' (first used by ops[0])",
            "ops[4] (ghost).inputs[0]: refers to unknown op 'missing'",
            "ops[2] (sum).inputs[1]: input shapes differ: [2, 3] vs [2, 4] (no broadcasting)",
            "ops[6] (fc).out_shapes: file says [[2, 3]], but the inputs and attributes give [[2, 2]]",
        ]


class TestViews:
    def test_arrays(self):
        g = mlp()
        a = g.arrays
        assert a["edge_src"].tolist() == [0, 1, 2, 3, 4] and a["edge_dst"].tolist() == [1, 2, 3, 5, 5]
        assert a["edge_bytes"].tolist() == [8 * 16 * 4, 8 * 32 * 4, 8 * 32 * 4, 8 * 4 * 4, 8 * 8]
        assert a["fwd_flops"].dtype == np.float64 and a["fwd_flops"].sum() == g.fwd_flops
        with pytest.raises(ValueError):
            a["fwd_flops"][0] = 1.0  # read-only views

    def test_networkx(self):
        g = mlp().to_networkx()
        assert g.number_of_nodes() == 6 and g.number_of_edges() == 5
        assert g.nodes["fc1"]["kind"] == "linear"
        assert g.edges["fc1", "act", 0]["size_bytes"] == 8 * 32 * 4

    def test_fingerprint_depends_on_structure_only(self):
        g = mlp()
        d = g.to_dict()
        d["name"], d["description"] = "renamed", "other words"
        assert graph_from_dict(d).fingerprint == g.fingerprint
        d["ops"][1]["attrs"]["out_features"] = 33  # fc1
        for op in d["ops"]:
            op.pop("out_shapes")
        assert graph_from_dict(d).fingerprint != g.fingerprint

    def test_round_trip(self):
        g = mlp()
        assert graph_from_dict(g.to_dict()).to_dict() == g.to_dict()
