"""The operator catalogue: S/A/P/R dims of every kind, exact FLOPs/bytes/params of small
hand-computed cases, partition FLOPs adding up, and the exact error of each bad input."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.graph import GraphBuilder
from engine.ops import OP_KINDS, OpError, op_kind


def build(fn, precision="fp32"):
    b = GraphBuilder("t", precision)
    fn(b)
    return b.build()


def dims_of(op):
    return {d.name: d.kind for d in op.dims}


# ----------------------------------------------------------------------------- S/A/P dims
# FlexFlow Table 1 (Jia et al. SysML'19): conv2d S = sample, A = height & width, P = channel;
# pooling S and A (channel is an attribute: no parameters); matmul S = sample, P = channel.
# Reductions (R) are the contracted axes (Megatron's row-parallel linear); every op also has
# the replica dim (C).
DIM_CASES = {
    "conv2d": (lambda b: b.add("conv2d", "op", [b.input("x", [2, 3, 8, 8])], out_channels=4, kernel=3),
               {"sample": "S", "height": "A", "width": "A", "channel": "P", "replica": "C"}),
    "pool2d": (lambda b: b.add("pool2d", "op", [b.input("x", [2, 3, 8, 8])], kernel=2),
               {"sample": "S", "channel": "A", "height": "A", "width": "A", "replica": "C"}),
    "linear": (lambda b: b.add("linear", "op", [b.input("x", [4, 16])], out_features=8),
               {"sample": "S", "feature": "P", "in_feature": "R", "replica": "C"}),
    "linear3d": (lambda b: b.add("linear", "op", [b.input("x", [4, 5, 16])], out_features=8),
                 {"sample": "S", "length": "A", "feature": "P", "in_feature": "R", "replica": "C"}),
    "batch_matmul": (lambda b: b.add("batch_matmul", "op",
                                     [b.input("a", [2, 3, 5, 7], axes=["sample", "head", "length", "head_dim"]),
                                      b.input("c", [2, 3, 7, 4], axes=["sample", "head", "head_dim", "length"])]),
                     {"sample": "S", "head": "A", "length": "A", "length2": "A", "inner": "R", "replica": "C"}),
    "embedding": (lambda b: b.add("embedding", "op", [b.input("ids", [4, 6], dtype="int64", axes=["sample", "length"])],
                                  num_embeddings=100, embedding_dim=8),
                  {"sample": "S", "length": "A", "feature": "P", "vocab": "R", "replica": "C"}),
    "lstm": (lambda b: b.add("lstm", "op", [b.input("x", [2, 3])], hidden_size=4),
             {"sample": "S", "feature": "P", "replica": "C"}),
    "layernorm": (lambda b: b.add("layernorm", "op", [b.input("x", [2, 3, 4])]),
                  {"sample": "S", "length": "A", "replica": "C"}),
    "rmsnorm": (lambda b: b.add("rmsnorm", "op", [b.input("x", [2, 3, 4])]),
                {"sample": "S", "length": "A", "replica": "C"}),
    "batchnorm": (lambda b: b.add("batchnorm", "op", [b.input("x", [2, 3, 4, 4])]),
                  {"sample": "S", "channel": "P", "height": "A", "width": "A", "replica": "C"}),
    "softmax": (lambda b: b.add("softmax", "op", [b.input("x", [2, 3, 4])], axis=-1),
                {"sample": "S", "length": "A", "replica": "C"}),
    "relu": (lambda b: b.add("relu", "op", [b.input("x", [2, 3, 4])]),
             {"sample": "S", "length": "A", "feature": "A", "replica": "C"}),
    "elementwise": (lambda b: b.add("elementwise", "op", [b.input("x", [2, 3, 4])], flops_per_element=2.0,
                                    label="Erf"),
                    {"sample": "S", "length": "A", "feature": "A", "replica": "C"}),
    "bias": (lambda b: b.add("bias", "op", [b.input("x", [2, 3, 4])]),
             {"sample": "S", "length": "A", "feature": "P", "replica": "C"}),
    "scale": (lambda b: b.add("scale", "op", [b.input("x", [2, 3, 4])]),
              {"sample": "S", "length": "A", "feature": "P", "replica": "C"}),
    "add": (lambda b: b.add("add", "op", [b.input("x", [2, 4]), b.input("y", [2, 4])]),
            {"sample": "S", "feature": "A", "replica": "C"}),
    "concat": (lambda b: b.add("concat", "op", [b.input("x", [2, 4]), b.input("y", [2, 6])], axis=1),
               {"sample": "S", "replica": "C"}),
    "split": (lambda b: b.add("split", "op", [b.input("x", [2, 6])], axis=1, sizes=[2, 4]),
              {"sample": "S", "replica": "C"}),
    "reshape": (lambda b: b.add("reshape", "op", [b.input("x", [8, 16, 4, 4])], shape=[8, -1]),
                {"sample": "S", "feature": "A", "replica": "C"}),
    "transpose": (lambda b: b.add("transpose", "op", [b.input("x", [2, 3, 4])], perm=[0, 2, 1]),
                  {"sample": "S", "feature": "A", "length": "A", "replica": "C"}),
    "attention": (lambda b: b.add("attention", "op", [b.input(n, [2, 4, 8, 16], axes=["sample", "head", "length",
                                                                                    "head_dim"]) for n in "qkv"],
                                  causal=True),
                  {"sample": "S", "head": "A", "length": "A", "replica": "C"}),
    "softmax_cross_entropy": (lambda b: b.add("softmax_cross_entropy", "op",
                                              [b.input("x", [4, 10]), b.input("y", [4], dtype="int64")]),
                              {"sample": "S", "vocab": "R", "replica": "C"}),
    "broadcast": (lambda b: b.add("broadcast", "op", [b.input("x", [2, 3, 1, 4], axes=["sample", "length", "head",
                                                                                        "head_dim"])], axis=2, size=5),
                  {"sample": "S", "length": "A", "head": "A", "head_dim": "A", "replica": "C"}),
    "router": (lambda b: b.add("router", "op", [b.input("x", [2, 3, 4])], num_experts=8, top_k=2),
               {"sample": "S", "length": "A", "replica": "C"}),
    "experts": (lambda b: b.add("experts", "op", [b.input("x", [2, 3, 4]), b.input("p", [2, 3, 8])],
                                num_experts=8, top_k=2, ffn_hidden=6),
                {"sample": "S", "expert": "E", "length": "A", "expert_seq": "E", "ffn": "R", "replica": "C"}),
}


@pytest.mark.parametrize("case", sorted(DIM_CASES))
def test_parallel_dims_per_kind(case):
    fn, want = DIM_CASES[case]
    g = build(fn)
    assert dims_of(g["op"]) == want


def test_every_kind_is_covered_by_a_dims_case():
    elementwise = {"gelu", "silu", "tanh", "sigmoid", "dropout", "mul"}  # same code path as relu/add
    assert set(OP_KINDS) - set(DIM_CASES) - elementwise - {"input"} == set()


def test_linear_weight_layout_and_dims():
    g = build(DIM_CASES["linear"][0])
    assert g["op"].params[0].shape == (8, 16)  # (out, in) as PyTorch's nn.Linear
    red = g["op"].dim("in_feature")
    assert red.needs_reduction and red.out_axis is None
    assert red.in_axes == (1,) and red.param_axes == (1, None)  # weight columns; bias not split
    col = g["op"].dim("feature")
    assert col.param_axes == (0, 0)  # weight rows and bias


# ----------------------------------------------------------------------------- exact values


class TestConv2d:
    def test_shape_params_flops_bytes(self):
        g = build(lambda b: b.add("conv2d", "c", [b.input("x", [2, 3, 8, 8])], out_channels=4, kernel=3, padding=1))
        op = g["c"]
        assert op.out_tensors[0].shape == (2, 4, 8, 8)
        assert op.param_count == 4 * 3 * 3 * 3 + 4 == 112
        # 2 * (2*4*8*8 outputs) * (3 in channels * 3 * 3)
        assert op.fwd_flops == 2 * 512 * 27 == 27648
        assert op.bwd_flops == 2 * 27648
        assert op.fwd_bytes_read == (2 * 3 * 8 * 8 + 112) * 4
        assert op.fwd_bytes_written == 512 * 4

    def test_stride_and_groups(self):
        g = build(lambda b: b.add("conv2d", "c", [b.input("x", [1, 4, 9, 9])], out_channels=8, kernel=3,
                                  stride=2, groups=2, bias=False))
        assert g["c"].out_tensors[0].shape == (1, 8, 4, 4)
        assert g["c"].param_count == 8 * 2 * 3 * 3
        assert "channel" not in g["c"].dim_names  # grouped convs offer no channel split

    @pytest.mark.parametrize("kwargs, field, message", [
        ({"out_channels": 4, "kernel": 9}, "attrs.kernel", "height 8 with kernel 9, stride 1, padding 0 gives an empty output"),
        ({"out_channels": 4, "kernel": 3, "groups": 2}, "attrs.groups", "groups 2 must divide in channels 3 and out channels 4"),
        ({"kernel": 3}, "attrs.out_channels", "missing required attribute"),
        ({"out_channels": 0, "kernel": 3}, "attrs.out_channels", "must be a positive integer, got 0"),
        ({"out_channels": 4, "kernel": [3, 3, 3]}, "attrs.kernel", "expected an integer or a pair of integers, got [3, 3, 3]"),
    ])
    def test_errors(self, kwargs, field, message):
        b = GraphBuilder("t")
        x = b.input("x", [2, 3, 8, 8])
        with pytest.raises(OpError) as exc:
            b.add("conv2d", "c", [x], **kwargs)
        assert (exc.value.field, str(exc.value)) == (field, message)

    def test_rank_error(self):
        b = GraphBuilder("t")
        with pytest.raises(OpError, match=r"input must be \(batch, channel, height, width\), got shape \[2, 3\]"):
            b.add("conv2d", "c", [b.input("x", [2, 3])], out_channels=4, kernel=1)


class TestPool2d:
    def test_max_pool(self):
        g = build(lambda b: b.add("pool2d", "p", [b.input("x", [1, 1, 4, 4])], kernel=2))
        assert g["p"].out_tensors[0].shape == (1, 1, 2, 2)
        assert g["p"].fwd_flops == 4 * 4  # 4 outputs x 2x2 window
        assert g["p"].param_count == 0

    def test_global_pool(self):
        g = build(lambda b: b.add("pool2d", "p", [b.input("x", [2, 3, 5, 5])], mode="avg", **{"global": True}))
        assert g["p"].out_tensors[0].shape == (2, 3, 1, 1)
        assert g["p"].fwd_flops == 2 * 3 * 25

    def test_bad_mode(self):
        b = GraphBuilder("t")
        with pytest.raises(OpError, match="mode must be 'max' or 'avg', got 'min'"):
            b.add("pool2d", "p", [b.input("x", [1, 1, 4, 4])], kernel=2, mode="min")


class TestLinear:
    def test_exact(self):
        g = build(lambda b: b.add("linear", "fc", [b.input("x", [4, 16])], out_features=8))
        op = g["fc"]
        assert op.param_count == 16 * 8 + 8 == 136
        assert op.fwd_flops == 2 * 4 * 8 * 16 == 1024  # multiply-adds only
        assert op.bwd_flops == 2048
        assert op.fwd_bytes_read == (4 * 16 + 136) * 4 == 800
        assert op.fwd_bytes_written == 4 * 8 * 4 == 128
        assert op.bwd_bytes_read == (4 * 8 + 4 * 16 + 136) * 4
        assert op.bwd_bytes_written == (4 * 16 + 136) * 4

    def test_half_precision_halves_bytes(self):
        g = build(lambda b: b.add("linear", "fc", [b.input("x", [4, 16])], out_features=8), precision="bf16")
        assert g["fc"].fwd_bytes_read == 400 and g["fc"].param_bytes == 272

    def test_float_input_required(self):
        b = GraphBuilder("t")
        with pytest.raises(OpError, match="input 0 must be a floating-point tensor, got int64"):
            b.add("linear", "fc", [b.input("x", [4, 16], dtype="int64")], out_features=8)


class TestBatchMatmul:
    def test_exact(self):
        g = build(lambda b: b.add("batch_matmul", "m", [b.input("a", [2, 3, 5, 7]), b.input("c", [2, 3, 7, 4])]))
        assert g["m"].out_tensors[0].shape == (2, 3, 5, 4)
        assert g["m"].fwd_flops == 2 * (2 * 3 * 5 * 4) * 7 == 1680

    def test_transpose_b_and_grouped_heads(self):
        # 4 query heads share 2 key heads (grouped-query attention)
        g = build(lambda b: b.add("batch_matmul", "m", [b.input("q", [2, 4, 5, 8]), b.input("k", [2, 2, 6, 8])],
                                  transpose_b=True))
        assert g["m"].out_tensors[0].shape == (2, 4, 5, 6)

    @pytest.mark.parametrize("a, c, tb, message", [
        ([2, 3, 5, 7], [2, 3, 6, 4], False, "inner dimensions differ: [2, 3, 5, 7] x [2, 3, 6, 4]: 7 != 6"),
        ([2, 4, 5, 8], [2, 3, 6, 8], True, "batch axis 1 differs: 4 vs 3 (b's must equal a's or divide it)"),
        ([5, 7], [7, 4], False, "inputs must have the same rank >= 3, got shapes [5, 7] and [7, 4]"),
    ])
    def test_errors(self, a, c, tb, message):
        b = GraphBuilder("t")
        with pytest.raises(OpError) as exc:
            b.add("batch_matmul", "m", [b.input("a", a), b.input("c", c)], transpose_b=tb)
        assert str(exc.value) == message


class TestEmbedding:
    def test_exact(self):
        g = build(lambda b: b.add("embedding", "e", [b.input("ids", [4, 6], dtype="int64", axes=["sample", "length"])],
                                  num_embeddings=100, embedding_dim=8))
        assert g["e"].out_tensors[0].shape == (4, 6, 8)
        assert g["e"].param_count == 800 and g["e"].fwd_flops == 0

    def test_needs_integer_ids(self):
        b = GraphBuilder("t")
        with pytest.raises(OpError, match="input must be integer ids, got fp32"):
            b.add("embedding", "e", [b.input("x", [4])], num_embeddings=10, embedding_dim=2)


class TestLstm:
    def test_exact(self):
        g = build(lambda b: b.add("lstm", "l", [b.input("x", [2, 3])], hidden_size=4))
        op = g["l"]
        assert [t.shape for t in op.out_tensors] == [(2, 4), (2, 4)]
        assert op.param_count == 3 * 16 + 4 * 16 + 16 == 128
        # gates: 2 * b * (in + h) * 4h; pointwise: 9 per unit
        assert op.fwd_flops == 2 * 2 * 7 * 16 + 9 * 2 * 4 == 520

    def test_state_shape_checked(self):
        b = GraphBuilder("t")
        x = b.input("x", [2, 3])
        with pytest.raises(OpError, match=r"state input 1 must have shape \[2, 4\], got \[2, 5\]"):
            b.add("lstm", "l", [x, b.input("h", [2, 5]), b.input("c", [2, 4])], hidden_size=4)


class TestPointwise:
    def test_norms(self):
        g = build(lambda b: [b.add("layernorm", "ln", [b.input("x", [2, 3, 4])]), b.add("rmsnorm", "rms", ["x"])])
        assert g["ln"].param_count == 8 and g["rms"].param_count == 4
        assert g["ln"].fwd_flops == 8 * 24 and g["ln"].bwd_flops == 2 * 8 * 24
        assert g["rms"].fwd_flops == 5 * 24

    def test_softmax_and_loss(self):
        g = build(lambda b: b.add("softmax_cross_entropy", "loss",
                                  [b.add("softmax", "sm", [b.input("x", [2, 5])]), b.input("y", [2], dtype="int64")]))
        assert g["sm"].fwd_flops == 5 * 10
        assert g["loss"].fwd_flops == 6 * 10
        assert g["loss"].out_tensors[0].shape == (2,)

    def test_elementwise_shapes_must_match(self):
        b = GraphBuilder("t")
        with pytest.raises(OpError, match=r"input shapes differ: \[2, 3\] vs \[2, 4\] \(no broadcasting\)"):
            b.add("add", "a", [b.input("x", [2, 3]), b.input("y", [2, 4])])

    def test_dropout_rate(self):
        b = GraphBuilder("t")
        with pytest.raises(OpError, match=r"must be in \[0, 1\), got 1.5"):
            b.add("dropout", "d", [b.input("x", [2, 3])], rate=1.5)

    def test_labels_shape(self):
        b = GraphBuilder("t")
        with pytest.raises(OpError, match=r"labels shape \[3\] must equal logits shape without its class axis \[2\]"):
            b.add("softmax_cross_entropy", "l", [b.input("x", [2, 5]), b.input("y", [3], dtype="int64")])


class TestShapeOps:
    def test_concat_split(self):
        g = build(lambda b: b.add("split", "s", [b.add("concat", "c", [b.input("x", [2, 4]), b.input("y", [2, 6])],
                                                        axis=1)], axis=1, sizes=[5, 5]))
        assert g["c"].out_tensors[0].shape == (2, 10)
        assert [t.shape for t in g["s"].out_tensors] == [(2, 5), (2, 5)]

    def test_split_squeeze(self):
        g = build(lambda b: b.add("split", "s", [b.input("x", [2, 3, 4])], axis=1, sizes=[1, 1, 1], squeeze=True))
        assert [t.shape for t in g["s"].out_tensors] == [(2, 4)] * 3

    def test_reshape_heads_dim(self):
        g = build(lambda b: b.add("reshape", "r", [b.input("x", [8, 128, 1024])], shape=[8, 128, 16, 64],
                                  axes=["sample", "length", "head", "head_dim"]))
        op = g["r"]
        head = op.dim("head")
        assert (head.size, head.out_axis, head.in_axes) == (16, 2, (2,))
        assert "head_dim" not in op.dim_names  # inner axis of a split group cannot be partitioned
        assert op.fwd_bytes_read == 0 and op.fwd_flops == 0  # a view moves nothing
        assert op.partition_shapes({"head": 4}) == ([(8, 128, 256)], [(8, 128, 4, 64)], [])

    def test_flatten_default_axes(self):
        g = build(DIM_CASES["reshape"][0])
        assert g["op"].out_tensors[0].axes == ("sample", "feature")
        assert g["op"].dim("feature").size == 16  # splits follow the channel axis

    @pytest.mark.parametrize("kind, attrs, inshape, message", [
        ("reshape", {"shape": [3, 5]}, [2, 6], "shape [3, 5] holds 15 elements, the input [2, 6] holds 12"),
        ("reshape", {"shape": [5, -1]}, [2, 6], "cannot infer -1: 12 elements are not a multiple of 5"),
        ("split", {"axis": 1, "sizes": [2, 3]}, [2, 6], "sizes add up to 5, but axis 1 has 6"),
        ("transpose", {"perm": [0, 0]}, [2, 6], "must be a permutation of 0..1, got [0, 0]"),
        ("softmax", {"axis": 2}, [2, 6], "axis 2 is out of range for a rank-2 tensor"),
    ])
    def test_errors(self, kind, attrs, inshape, message):
        b = GraphBuilder("t")
        with pytest.raises(OpError) as exc:
            b.add(kind, "op", [b.input("x", inshape)], **attrs)
        assert str(exc.value) == message

    def test_concat_mismatch(self):
        b = GraphBuilder("t")
        with pytest.raises(OpError, match=r"shape \[3, 4\] does not match \[2, 4\] outside axis 1"):
            b.add("concat", "c", [b.input("x", [2, 4]), b.input("y", [3, 4])], axis=1)


class TestRegistry:
    def test_unknown_kind_lists_valid(self):
        with pytest.raises(OpError, match="unknown op kind 'conv3d'; valid: add, attention, batch_matmul"):
            op_kind("conv3d")

    def test_aliases(self):
        assert op_kind("flatten").name == "reshape" and op_kind("matmul").name == "linear"

    def test_unknown_attribute(self):
        b = GraphBuilder("t")
        with pytest.raises(OpError, match="unknown attribute\\(s\\) stride for linear; valid: out_features, bias"):
            b.add("linear", "fc", [b.input("x", [2, 3])], out_features=2, stride=1)


# ----------------------------------------------------------------------------- properties


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def op_and_degrees(draw):
    kind = draw(st.sampled_from(["linear", "conv2d", "batch_matmul", "lstm", "layernorm", "softmax_cross_entropy"]))
    b = GraphBuilder("p")
    n = draw(st.sampled_from([2, 4, 6, 8, 12]))
    if kind == "linear":
        b.add("linear", "op", [b.input("x", [n, draw(st.sampled_from([4, 6, 8])), draw(st.sampled_from([4, 8, 12]))])],
              out_features=draw(st.sampled_from([2, 4, 6, 8])))
    elif kind == "conv2d":
        b.add("conv2d", "op", [b.input("x", [n, 3, 8, 8])], out_channels=draw(st.sampled_from([2, 4, 6])),
              kernel=draw(st.sampled_from([1, 3])), padding=1)
    elif kind == "batch_matmul":
        b.add("batch_matmul", "op", [b.input("a", [n, 4, 6, 8]), b.input("c", [n, 4, 8, 4])])
    elif kind == "lstm":
        b.add("lstm", "op", [b.input("x", [n, 6]), b.input("h", [n, 8]), b.input("c", [n, 8])], hidden_size=8)
    elif kind == "layernorm":
        b.add("layernorm", "op", [b.input("x", [n, 6, 8])])
    else:
        b.add("softmax_cross_entropy", "op", [b.input("x", [n, 6, 12]), b.input("y", [n, 6], dtype="int64")])
    op = b.build()["op"]
    degrees = {d.name: draw(st.sampled_from(_divisors(d.size))) for d in op.dims if not d.is_replica}
    return op, degrees


@settings(max_examples=150, deadline=None)
@given(op_and_degrees())
def test_partition_flops_add_up_to_the_op(case):
    """FLOPs of an op's partitions add up exactly to the op's (ARCHITECTURE invariant)."""
    op, degrees = case
    parts = math.prod(degrees.values())
    fwd, bwd = op.partition_flops(degrees)
    assert math.isclose(fwd * parts, op.fwd_flops, rel_tol=1e-12)
    assert math.isclose(bwd * parts, op.bwd_flops, rel_tol=1e-12)
    # output volumes multiply back when no reduction dim is split
    if not any(op.dim(n).needs_reduction and k > 1 for n, k in degrees.items()):
        _, outs, _ = op.partition_shapes(degrees)
        assert math.prod(outs[0]) * parts == op.out_tensors[0].numel


def test_replica_partitions_redo_the_whole_op():
    g = build(DIM_CASES["linear"][0])
    fwd, _ = g["op"].partition_flops({"replica": 3})
    assert fwd == g["op"].fwd_flops


class TestReviewRegressions:
    """Pinned after the semantic review of the catalogue (issue 2)."""

    def test_grouped_heads_degree_must_align_with_kv_groups(self):
        # 12 query heads over 6 key/value heads: degree 4 would give a partition query heads
        # 0-2, straddling kv heads 0 and 1.
        bhsd = ["sample", "head", "length", "head_dim"]
        g = build(lambda b: b.add("batch_matmul", "m", [b.input("q", [2, 12, 5, 8], axes=bhsd),
                                                        b.input("k", [2, 6, 5, 8], axes=bhsd)], transpose_b=True))
        head = g["m"].dim("head")
        assert head.group == 6
        assert head.degree_problem(4) == ("4 splits the 12 heads across their 6 key/value groups; "
                                          "use a degree that divides 6 or is a multiple of it")
        assert head.degree_problem(3) is None and head.degree_problem(12) is None
        assert g["m"].partition_shapes({"head": 3})[0] == [(2, 4, 5, 8), (2, 2, 5, 8)]
        assert g["m"].partition_shapes({"head": 12})[0] == [(2, 1, 5, 8), (2, 1, 5, 8)]

    def test_embedding_moves_only_gathered_rows(self):
        g = build(lambda b: b.add("embedding", "e", [b.input("ids", [4, 6], dtype="int64", axes=["sample", "length"])],
                                  num_embeddings=1000, embedding_dim=8))
        op = g["e"]
        out = 4 * 6 * 8 * 4
        assert op.fwd_bytes_read == 4 * 6 * 8 + out  # ids + gathered rows, not the 32 kB table
        assert op.bwd_bytes_read == out  # output gradient only
        assert op.bwd_bytes_written == out  # scatter into the gathered rows

    def test_add_backward_reads_no_saved_inputs(self):
        g = build(lambda b: b.add("add", "a", [b.input("x", [2, 4]), b.input("y", [2, 4])]))
        assert g["a"].bwd_bytes_read == 2 * 4 * 4  # the output gradient only

    def test_softmax_backward_factor(self):
        g = build(lambda b: b.add("softmax", "s", [b.input("x", [2, 5])]))
        assert g["s"].bwd_flops == g["s"].fwd_flops  # no weight gradient: 1x


class TestFusedAttention:
    def test_flops_and_bytes(self):
        bhsd = ["sample", "head", "length", "head_dim"]
        g = build(lambda b: b.add("attention", "a", [b.input(n, [2, 4, 8, 16], axes=bhsd) for n in "qkv"],
                                  causal=True))
        op = g["a"]
        # QK^T and PV: 4 * b*h*s * s_kv * d, halved by the causal mask
        assert op.fwd_flops == 4 * 2 * 4 * 8 * 8 * 16 / 2 == 16384
        assert op.bwd_flops == 2.5 * 16384  # FlashAttention-2's backward: five matmuls to two
        # no s x s matrix in memory: q, k, v read and o written
        assert op.fwd_bytes_read == 3 * 2 * 4 * 8 * 16 * 4 and op.fwd_bytes_written == 2 * 4 * 8 * 16 * 4

    def test_grouped_query_and_errors(self):
        bhsd = ["sample", "head", "length", "head_dim"]
        g = build(lambda b: b.add("attention", "a", [b.input("q", [2, 8, 8, 16], axes=bhsd),
                                                     b.input("k", [2, 2, 8, 16], axes=bhsd),
                                                     b.input("v", [2, 2, 8, 16], axes=bhsd)]))
        assert g["a"].dim("head").group == 2
        b = GraphBuilder("t")
        with pytest.raises(OpError, match="3 key/value heads must divide 8 query heads"):
            b.add("attention", "a", [b.input("q", [2, 8, 8, 16]), b.input("k", [2, 3, 8, 16]),
                                     b.input("v", [2, 3, 8, 16])])
