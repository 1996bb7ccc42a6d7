"""Cheap size checks before an ONNX import (issue 24 part 7: a 7.3 MB upload cost 17 CPU-s
before it was refused). ``import_onnx`` checks ``max_bytes`` from the length and ``max_nodes``
from protobuf's wire format (:func:`onnx_node_count`) before it parses or builds anything.
"""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

import engine.models.onnx_import as OI
from engine.errors import ValidationError
from engine.models.onnx_import import import_onnx
from engine.models.onnx_wire import onnx_node_count
from test_import_onnx import transformer_block, unknown_ops_model


def relu_chain(n: int) -> bytes:
    """An ONNX model of ``n`` Relu nodes in a chain (about 37 bytes a node)."""
    nodes = [helper.make_node("Relu", ["x" if i == 0 else f"t{i - 1}"], [f"t{i}"], name=f"relu_{i}")
             for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])],
                          [helper.make_tensor_value_info(f"t{n - 1}", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def parsed_nodes(data: bytes) -> int:
    m = onnx.ModelProto()
    m.ParseFromString(data)
    return len(m.graph.node)


class TestOnnxNodeCount:
    @pytest.mark.parametrize("make", [transformer_block, unknown_ops_model, lambda: relu_chain(1),
                                      lambda: relu_chain(3000)], ids=["block", "unknown", "one", "chain"])
    def test_equals_protobuf_s_own_count(self, make):
        data = make()
        assert onnx_node_count(data) == parsed_nodes(data) > 0

    def test_a_graph_given_twice_is_merged_as_protobuf_merges_it(self):
        data = relu_chain(5) + relu_chain(7)  # (protobuf: the graph fields merge, node lists concatenate)
        assert onnx_node_count(data) == parsed_nodes(data) == 12

    def test_stops_counting_past_the_limit(self):
        assert onnx_node_count(relu_chain(500), stop_after=10) == 11

    def test_empty_bytes_hold_no_node(self):
        assert onnx_node_count(b"") == 0

    @pytest.mark.parametrize("data", [b"\xff" * 40, b"\x3a\xff\xff\xff\xff\x0f", b"\x0b", relu_chain(10)[:-3]],
                             ids=["varint", "too-long", "group", "cut"])
    def test_broken_encodings_raise_value_error(self, data):
        with pytest.raises(ValueError):
            onnx_node_count(data)


class TestImportRefusesBeforeBuilding:
    @pytest.fixture
    def nothing_parsed_or_built(self, monkeypatch):
        """Parsing, shape inference and building fail the test should they start."""
        def boom(*a, **k):
            raise AssertionError("parsed or built a model that the size checks refuse")

        monkeypatch.setattr(onnx, "ModelProto", boom)
        monkeypatch.setattr(onnx.shape_inference, "infer_shapes", boom)
        monkeypatch.setattr(OI, "GraphBuilder", boom)

    def test_too_many_nodes(self, nothing_parsed_or_built):
        data = relu_chain(25_000)
        with pytest.raises(ValidationError, match=r"graph: more than 20,000 nodes, the most a model may have here"):
            import_onnx(data, batch=32, max_nodes=20_000, source="big.onnx")

    def test_too_many_bytes(self, nothing_parsed_or_built):
        data = relu_chain(100)
        with pytest.raises(ValidationError, match=rf"{len(data):,} bytes, more than the 1,000 an ONNX file"):
            import_onnx(data, batch=32, max_bytes=1000)

    def test_broken_protobuf(self, nothing_parsed_or_built):
        with pytest.raises(ValidationError, match="not an ONNX model"):
            import_onnx(b"\xff" * 64, batch=32)

    def test_the_default_limit_is_the_model_format_s(self, nothing_parsed_or_built, monkeypatch):
        monkeypatch.setattr(OI, "MAX_ONNX_NODES", 3)  # (the defaults were bound at definition: unchanged)
        data = relu_chain(OI.MAX_ONNX_NODES + 1)
        with pytest.raises(ValidationError, match="more than 3 nodes"):
            import_onnx(data, batch=32, max_nodes=OI.MAX_ONNX_NODES)


def test_a_model_within_the_limits_imports_as_before():
    data = relu_chain(50)
    g, _ = import_onnx(data, batch=32, max_nodes=50, max_bytes=len(data))
    assert len(g.ops) >= 50
    with pytest.raises(ValidationError, match="more than 49 nodes"):
        import_onnx(data, batch=32, max_nodes=49)


class TestMaxOps:
    def test_the_build_stops_past_max_ops(self):
        with pytest.raises(ValidationError, match=r"graph: more than 100 operators, the most a model may have here"):
            import_onnx(relu_chain(300), batch=32, max_ops=100)

    def test_folded_nodes_are_not_operators(self):
        data = transformer_block()
        g, _ = import_onnx(data, batch=4, seq_len=8)
        assert len(g.ops) < onnx_node_count(data)  # (shape arithmetic and constants fold away)
        g2, _ = import_onnx(data, batch=4, seq_len=8, max_ops=len(g.ops))
        assert len(g2.ops) == len(g.ops)
        with pytest.raises(ValidationError, match="operators"):
            import_onnx(data, batch=4, seq_len=8, max_ops=len(g.ops) // 2)
