"""Issue 14: models from ONNX files. Small graphs are built here with onnx.helper; an imported
MLP, CNN and transformer block equal the hand-built soapbox models (shapes, FLOPs, parameters)
and simulate; unknown ops are listed; malformed and hostile files are refused."""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engine.cli import main
from engine.cluster import preset
from engine.errors import ValidationError
from engine.formats import load_model
from engine.graph import GraphBuilder
from engine.models.onnx_import import import_onnx
from engine.sim.report import simulate_strategy
from engine.search.baselines import data_parallel


def w(name, *shape, dtype=np.float32):
    return numpy_helper.from_array(np.zeros(shape, dtype), name)


def shape_const(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def model(nodes, inputs, outputs, inits, opset=17) -> bytes:
    g = helper.make_graph(nodes, "test", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def same(a, b):
    """Ops of ``a`` equal ``b``'s in kind, output shapes, FLOPs and parameters, in order."""
    ka = [(o.kind, [t.shape for t in o.out_tensors], o.fwd_flops, o.bwd_flops, o.param_count) for o in a.ops]
    kb = [(o.kind, [t.shape for t in o.out_tensors], o.fwd_flops, o.bwd_flops, o.param_count) for o in b.ops]
    assert ka == kb
    assert a.param_count == b.param_count


def test_mlp_equals_the_hand_built_model():
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
             helper.make_node("Relu", ["h"], ["a"], name="relu"),
             helper.make_node("MatMul", ["a", "w2"], ["m"], name="fc2"),
             helper.make_node("Add", ["m", "b2"], ["y"], name="fc2.bias")]
    data = model(nodes, [vi("x", ["N", 784])], [vi("y", ["N", 10])],
                 [w("w1", 256, 784), w("b1", 256), w("w2", 256, 10), w("b2", 10)])
    g, notes = import_onnx(data, batch=32)
    b = GraphBuilder("mlp")
    x = b.input("x", [32, 784])
    h = b.add("relu", "relu", [b.add("linear", "fc1", [x], out_features=256)])
    b.add("linear", "fc2", [h], out_features=10)
    same(g, b.build())
    assert g.param_count == 784 * 256 + 256 + 256 * 10 + 10
    assert any("N=32" in n for n in notes)


def test_cnn_equals_the_hand_built_model():
    nodes = [helper.make_node("Conv", ["x", "c1", "c1b"], ["a"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["a", "g", "bb", "mu", "var"], ["bn"], name="bn1"),
             helper.make_node("Relu", ["bn"], ["r"], name="relu1"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "c2"], ["c"], name="conv2", kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["gp"], name="gap"),
             helper.make_node("Flatten", ["gp"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1)]
    data = model(nodes, [vi("x", ["N", 3, 32, 32])], [vi("y", ["N", 10])],
                 [w("c1", 16, 3, 3, 3), w("c1b", 16), w("g", 16), w("bb", 16), w("mu", 16), w("var", 16),
                  w("c2", 32, 16, 3, 3), w("fw", 10, 32), w("fb", 10)])
    g, _ = import_onnx(data, batch=8)
    b = GraphBuilder("cnn")
    x = b.input("x", [8, 3, 32, 32])
    a = b.add("conv2d", "conv1", [x], out_channels=16, kernel=[3, 3], stride=[1, 1], padding=[1, 1], bias=True)
    r = b.add("relu", "relu1", [b.add("batchnorm", "bn1", [a])])
    p = b.add("pool2d", "pool1", [r], mode="max", kernel=[2, 2], stride=[2, 2], padding=[0, 0])
    c = b.add("conv2d", "conv2", [p], out_channels=32, kernel=[3, 3], stride=[2, 2], padding=[1, 1], bias=False)
    gp = b.add("pool2d", "gap", [c], mode="avg", **{"global": True})
    f = b.add("reshape", "flatten", [gp], shape=[8, 32])
    b.add("linear", "fc", [f], out_features=10)
    same(g, b.build())
    c100 = preset("p100-4x4")
    r = simulate_strategy(g, data_parallel(g, c100), c100)
    assert r.iteration_time_s > 0


def transformer_block(batch="B", seq="S", d=64, heads=4, ffn=256) -> bytes:
    hd = d // heads
    n = []

    def lin(name, x, out, din):
        n.append(helper.make_node("MatMul", [x, f"{name}.w"], [f"{name}.mm"], name=name))
        n.append(helper.make_node("Add", [f"{name}.mm", f"{name}.b"], [f"{name}.y"], name=f"{name}.bias"))
        inits.extend([w(f"{name}.w", din, out), w(f"{name}.b", out)])
        return f"{name}.y"

    inits = [w("ln1.g", d), w("ln1.b", d), w("ln2.g", d), w("ln2.b", d),
             shape_const("heads_shape", [0, 0, heads, hd]), shape_const("merge_shape", [0, 0, d])]
    n.append(helper.make_node("LayerNormalization", ["x", "ln1.g", "ln1.b"], ["h1"], name="ln1", axis=-1))
    q, k, v = (lin(f"attn.{t}", "h1", d, d) for t in "qkv")
    for t, src in (("q", q), ("k", k), ("v", v)):
        n.append(helper.make_node("Reshape", [src, "heads_shape"], [f"{t}.4d"], name=f"attn.{t}.split"))
    n.append(helper.make_node("Transpose", ["q.4d"], ["qh"], name="attn.q.t", perm=[0, 2, 1, 3]))
    n.append(helper.make_node("Transpose", ["k.4d"], ["kh"], name="attn.k.t", perm=[0, 2, 3, 1]))
    n.append(helper.make_node("Transpose", ["v.4d"], ["vh"], name="attn.v.t", perm=[0, 2, 1, 3]))
    n.append(helper.make_node("MatMul", ["qh", "kh"], ["scores"], name="attn.scores"))
    n.append(helper.make_node("Softmax", ["scores"], ["probs"], name="attn.softmax", axis=-1))
    n.append(helper.make_node("MatMul", ["probs", "vh"], ["ctx"], name="attn.context"))
    n.append(helper.make_node("Transpose", ["ctx"], ["ctx.t"], name="attn.ctx.t", perm=[0, 2, 1, 3]))
    n.append(helper.make_node("Reshape", ["ctx.t", "merge_shape"], ["ctx.m"], name="attn.merge"))
    o = lin("attn.out", "ctx.m", d, d)
    n.append(helper.make_node("Add", ["x", o], ["r1"], name="residual1"))
    n.append(helper.make_node("LayerNormalization", ["r1", "ln2.g", "ln2.b"], ["h2"], name="ln2", axis=-1))
    f1 = lin("mlp.fc1", "h2", ffn, d)
    n.append(helper.make_node("Gelu", [f1], ["act"], name="mlp.act", domain=""))
    f2 = lin("mlp.fc2", "act", d, ffn)
    n.append(helper.make_node("Add", ["r1", f2], ["y"], name="residual2"))
    return model(n, [vi("x", [batch, seq, d])], [vi("y", [batch, seq, d])], inits, opset=20)


def test_transformer_block_counts_and_simulates():
    d, ffn = 64, 256
    g, notes = import_onnx(transformer_block(d=d, ffn=ffn), batch=4, seq_len=32)
    kinds = [o.kind for o in g.ops]
    assert kinds.count("linear") == 6 and kinds.count("batch_matmul") == 2 and kinds.count("layernorm") == 2
    assert g.param_count == 4 * (d * d + d) + (d * ffn + ffn) + (ffn * d + d) + 2 * 2 * d
    assert g["attn.scores"].out_tensors[0].shape == (4, 4, 32, 32)
    # the linears' FLOPs are 2 x tokens x in x out (the bias add not counted), as soapbox's own
    # transformer builder counts them
    assert g["mlp.fc1"].fwd_flops == 2 * 4 * 32 * d * ffn
    c = preset("dgx-a100-80gb:1")
    assert simulate_strategy(g, data_parallel(g, c), c).iteration_time_s > 0
    # and op for op, the block built by hand
    b = GraphBuilder("block")
    x = b.input("x", [4, 32, d])
    h1 = b.add("layernorm", "ln1", [x])
    heads = {}
    for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        y = b.add("linear", f"attn.{t}", [h1], out_features=d)
        r = b.add("reshape", f"attn.{t}.split", [y], shape=[4, 32, 4, 16])
        heads[t] = r, perm
    ts = {t: b.add("transpose", f"attn.{t}.t", [r], perm=perm) for t, (r, perm) in heads.items()}
    probs = b.add("softmax", "attn.softmax", [b.add("batch_matmul", "attn.scores", [ts["q"], ts["k"]])], axis=-1)
    ctx = b.add("batch_matmul", "attn.context", [probs, ts["v"]])
    m = b.add("reshape", "attn.merge", [b.add("transpose", "attn.ctx.t", [ctx], perm=[0, 2, 1, 3])], shape=[4, 32, d])
    r1 = b.add("add", "residual1", [x, b.add("linear", "attn.out", [m], out_features=d)])
    f1 = b.add("gelu", "mlp.act", [b.add("linear", "mlp.fc1", [b.add("layernorm", "ln2", [r1])], out_features=ffn)])
    b.add("add", "residual2", [r1, b.add("linear", "mlp.fc2", [f1], out_features=d)])
    hand = b.build()
    assert sorted(o.name for o in hand.ops if o.kind != "input") == sorted(o.name for o in g.ops if o.kind != "input")
    for o in hand.ops[1:]:
        got = g[o.name]
        assert (got.kind, got.out_tensors[0].shape, got.fwd_flops, got.param_count) == \
            (o.kind, o.out_tensors[0].shape, o.fwd_flops, o.param_count), o.name


def unknown_ops_model() -> bytes:
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1", transB=1),
             helper.make_node("Celu", ["h"], ["c"], name="celu1"),
             helper.make_node("HardSwish", ["c"], ["s"], name="hs1"),
             helper.make_node("Celu", ["s"], ["y"], name="celu2")]
    return model(nodes, [vi("x", [8, 16])], [vi("y", [8, 32])], [w("w1", 32, 16)])


def test_unknown_ops_are_listed_with_counts_and_names():
    with pytest.raises(ValidationError) as e:
        import_onnx(unknown_ops_model())
    msg = str(e.value)
    assert "3 node(s) soapbox cannot map" in msg and "Celu x 2 (e.g. celu1, celu2)" in msg and "HardSwish x 1" in msg
    assert "--unknown elementwise" in msg


def test_unknown_ops_as_elementwise_say_so():
    g, notes = import_onnx(unknown_ops_model(), unknown="elementwise")
    assert [o.kind for o in g.ops] == ["input", "linear", "elementwise", "elementwise", "elementwise"]
    assert g["celu1"].attrs["label"] == "Celu" and g["celu1"].fwd_flops == 8 * 32
    assert any("Celu x 2" in n and "HardSwish x 1" in n for n in notes)


def test_deterministic():
    data = transformer_block()
    a, _ = import_onnx(data, batch=2, seq_len=16)
    b, _ = import_onnx(data, batch=2, seq_len=16)
    assert a.to_dict() == b.to_dict() and a.fingerprint == b.fingerprint


@pytest.mark.parametrize("data, match", [
    (b"\x00\x01garbage" * 10, "not an ONNX model"),
    (b"", "no nodes"),
])
def test_not_onnx(data, match):
    with pytest.raises(ValidationError, match=match):
        import_onnx(data)


def test_unbound_symbolic_dimension_is_named():
    with pytest.raises(ValidationError, match=r"'S' is not bound.*--dim S=N"):
        import_onnx(transformer_block(), batch=2)
    g, notes = import_onnx(transformer_block(), batch=2, dims={"S": 8})
    assert g["attn.scores"].out_tensors[0].shape == (2, 4, 8, 8)


def test_huge_declared_tensors_are_refused():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="r")]
    data = model(nodes, [vi("x", [2**31 - 1, 2**31 - 1, 2**31 - 1])], [vi("y", [2**31 - 1, 2**31 - 1, 2**31 - 1])], [])
    with pytest.raises(ValidationError, match="over the limits"):
        import_onnx(data)


def test_external_data_is_imported_from_its_dims_without_opening_anything():
    """A weight stored as external data (here naming /etc/passwd as its file) imports from its
    dims and type; no file is opened. A small integer constant stored outside is not read either:
    the reshape it feeds cannot be folded, so the import names that node instead."""
    def external(name, dims, dtype=TensorProto.FLOAT):
        t = onnx.TensorProto()
        t.name, t.data_type = name, dtype
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        e = t.external_data.add()
        e.key, e.value = "location", "/etc/passwd"
        return t

    nodes = [helper.make_node("Gemm", ["x", "w1"], ["y"], name="fc1", transB=1)]
    data = model(nodes, [vi("x", [8, 16])], [vi("y", [8, 32])], [external("w1", [32, 16])])
    opened = []

    def audit(event, args):
        if event == "open":
            opened.append(str(args[0]))

    sys.addaudithook(audit)
    g, notes = import_onnx(data)
    assert g.param_count == 32 * 16
    assert any(n.startswith("1 initializer(s) stored as external data") for n in notes)
    shaped = model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="view")], [vi("x", [8, 16])],
                   [vi("y", None)], [external("shape", [2], TensorProto.INT64)])
    with pytest.raises(ValidationError, match="view|shape"):
        import_onnx(shaped)
    assert not any("passwd" in p for p in opened)


def test_a_cycle_or_out_of_order_graph_is_refused():
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["b"], name="second")]
    data = model(nodes, [vi("x", [4, 4])], [vi("b", [4, 4])], [])
    with pytest.raises(ValidationError, match="before any node produces it"):
        import_onnx(data)


def test_cli_import_then_simulate(tmp_path, capsys):
    path = tmp_path / "block.onnx"
    path.write_bytes(transformer_block())
    out = tmp_path / "block.json"
    assert main(["import", str(path), "--batch", "8", "--seq-len", "64", "--name", "block", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "note: symbolic dimensions bound: B=8, S=64" in printed
    g = load_model(str(out))
    assert g.name == "block" and g.batch_size == 8
    assert main(["simulate", "--model", str(out), "--cluster", "p100-4x4", "--strategy", "data-parallel",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["feasible"] is True


def test_cli_refuses_a_folder_and_bad_dims(tmp_path, capsys):
    assert main(["import", str(tmp_path), "-o", str(tmp_path / "x.json")]) == 2
    assert "is a folder, not an ONNX file" in capsys.readouterr().err
    path = tmp_path / "block.onnx"
    path.write_bytes(transformer_block())
    assert main(["import", str(path), "--dim", "S=abc", "-o", str(tmp_path / "x.json")]) == 2
    assert "expected NAME=N" in capsys.readouterr().err
