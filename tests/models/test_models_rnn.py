"""Tests of FlexFlow's RNN benchmarks (engine.models.rnn): parameters, FLOPs, shapes, sharing."""

from __future__ import annotations

import doctest

import pytest

import engine.models.rnn as rnn_module
from engine.graph import OpGraph
from engine.models.rnn import nmt, rnnlm, rnntc

H = 1024
# One LSTM layer with a 1024-wide input: W (1024 x 4096) + U (1024 x 4096) + bias 4096
# = 4*1024*(1024 + 1024) + 4*1024 = 8,388,608 + 4,096.
LSTM_1024 = 8_392_704


@pytest.fixture(scope="module")
def graphs() -> dict[str, OpGraph]:
    return {"rnntc": rnntc(), "rnnlm": rnnlm(), "nmt": nmt()}


def test_lstm_layer_constant():
    assert LSTM_1024 == 4 * H * (H + H) + 4 * H


def test_doctests():
    result = doctest.testmod(rnn_module)
    assert result.attempted >= 3 and result.failed == 0


# --------------------------------------------------------------------------- parameters


class TestParamCount:
    def test_rnntc(self, graphs):
        # embedding 32768*1024 = 33,554,432; 4 LSTM layers 4*8,392,704 = 33,570,816;
        # classifier 1024*2 + 2 = 2,050.
        assert graphs["rnntc"].param_count == 33_554_432 + 33_570_816 + 2_050 == 67_127_298

    def test_rnnlm(self, graphs):
        # embedding 10000*1024 = 10,240,000; 2 LSTM layers 16,785,408;
        # output projection 1024*10000 + 10000 = 10,250,000.
        assert graphs["rnnlm"].param_count == 10_240_000 + 16_785_408 + 10_250_000 == 37_275_408

    def test_nmt(self, graphs):
        # source and target embeddings 2 * 32768*1024 = 67,108,864;
        # 2 encoder + 2 decoder LSTM layers 4*8,392,704 = 33,570,816;
        # attention projection 2048*1024 + 1024 = 2,098,176;
        # output projection 1024*32768 + 32768 = 33,587,200.
        assert graphs["nmt"].param_count == 67_108_864 + 33_570_816 + 2_098_176 + 33_587_200 == 136_365_056

    def test_each_lstm_op_holds_one_layer(self, graphs):
        for g in graphs.values():
            lstms = [op for op in g if op.kind == "lstm"]
            assert lstms and all(op.param_count == LSTM_1024 for op in lstms)

    @pytest.mark.parametrize("build", [rnntc, rnnlm, nmt])
    def test_does_not_grow_with_steps(self, build):
        assert build(steps=5).param_count == build(steps=40).param_count

    def test_small_hand_computed(self):
        # h=4, in=4: LSTM 4*4*8 + 16 = 144.
        assert rnntc(batch=2, steps=3, hidden=4, layers=2, vocab=10, classes=3).param_count == \
            10 * 4 + 2 * 144 + (4 * 3 + 3)
        assert rnnlm(batch=2, steps=3, hidden=4, layers=2, vocab=10).param_count == \
            10 * 4 + 2 * 144 + (4 * 10 + 10)
        assert nmt(batch=2, steps=3, hidden=4, layers=2, vocab=10).param_count == \
            2 * 10 * 4 + 4 * 144 + (8 * 4 + 4) + (4 * 10 + 10)


# --------------------------------------------------------------------------- sharing


class TestParamGroups:
    @pytest.mark.parametrize("name,prefix,layers", [
        ("rnntc", "lstm", 4), ("rnnlm", "lstm", 2), ("nmt", "encoder", 2), ("nmt", "decoder", 2),
    ])
    def test_all_steps_of_a_layer_share_one_group(self, graphs, name, prefix, layers):
        g = graphs[name]
        for layer in range(layers):
            groups = {g[f"{prefix}.l{layer}.t{t}"].param_group for t in range(40)}
            assert groups == {f"{prefix}.lstm{layer}"}

    def test_every_parametrised_op_but_the_singletons_is_grouped(self, graphs):
        for g in graphs.values():
            loose = {op.name for op in g if op.param_count and not op.param_group}
            assert loose <= {"input.embedding", "encoder.embedding", "decoder.embedding", "classifier"}

    def test_per_step_projections_share(self, graphs):
        assert {graphs["rnnlm"][f"output.t{t}.logits"].param_group for t in range(40)} == {"output.proj"}
        g = graphs["nmt"]
        assert {g[f"decoder.t{t}.logits"].param_group for t in range(40)} == {"decoder.output_proj"}
        assert {g[f"decoder.t{t}.attn_proj"].param_group for t in range(40)} == {"decoder.attn_proj"}

    def test_group_counts(self, graphs):
        def groups(g):
            return {op.param_group for op in g if op.param_group}

        assert len(groups(graphs["rnntc"])) == 4
        assert len(groups(graphs["rnnlm"])) == 3
        assert len(groups(graphs["nmt"])) == 6


# --------------------------------------------------------------------------- FLOPs


class TestFlops:
    def test_lstm_step(self, graphs):
        # 2*b*(in+h)*4h multiply-adds + 9*b*h pointwise = 2*64*2048*4096 + 9*64*1024.
        op = graphs["rnntc"]["lstm.l0.t0"]
        assert op.fwd_flops == 1_073_741_824 + 589_824 == 1_074_331_648
        # the first step reads no state but costs the same (zero state still multiplied)
        assert graphs["rnntc"]["lstm.l3.t17"].fwd_flops == op.fwd_flops
        assert op.bwd_flops == 2 * op.fwd_flops

    def test_vocab_projection(self, graphs):
        assert graphs["nmt"]["decoder.t0.logits"].fwd_flops == 2 * 64 * 1024 * 32768

    def test_attention(self, graphs):
        g = graphs["nmt"]
        assert g["decoder.t0.scores"].fwd_flops == 2 * 64 * 1 * 40 * 1024
        assert g["decoder.t0.context"].fwd_flops == 2 * 64 * 1 * 1024 * 40

    def test_flops_grow_linearly_with_steps(self):
        assert rnnlm(steps=40).fwd_flops == pytest.approx(8 * rnnlm(steps=5).fwd_flops)


# --------------------------------------------------------------------------- shapes


def shape(g: OpGraph, name: str, i: int = 0) -> tuple[int, ...]:
    return g[name].out_tensors[i].shape


class TestShapes:
    def test_rnntc(self, graphs):
        g = graphs["rnntc"]
        assert shape(g, "input.embedding") == (64, 40, 1024)
        assert len(g["input.split"].out_tensors) == 40
        assert shape(g, "input.split", 39) == (64, 1024)
        assert shape(g, "lstm.l3.t39", 1) == (64, 1024)
        assert shape(g, "classifier") == (64, 2)
        assert shape(g, "loss") == (64,)
        assert g["classifier"].inputs[0].op == "lstm.l3.t39"

    def test_rnnlm(self, graphs):
        g = graphs["rnnlm"]
        assert shape(g, "labels.split", 7) == (64,)
        assert shape(g, "output.t7.logits") == (64, 10000)
        assert shape(g, "output.t7.loss") == (64,)

    def test_nmt(self, graphs):
        g = graphs["nmt"]
        assert shape(g, "encoder.states") == (64, 40 * 1024)
        assert shape(g, "encoder.memory") == (64, 40, 1024)
        assert shape(g, "decoder.t3.query") == (64, 1, 1024)
        assert shape(g, "decoder.t3.scores") == (64, 1, 40)
        assert shape(g, "decoder.t3.weights") == (64, 1, 40)
        assert shape(g, "decoder.t3.context") == (64, 1, 1024)
        assert shape(g, "decoder.t3.context2d") == (64, 1024)
        assert shape(g, "decoder.t3.concat") == (64, 2048)
        assert shape(g, "decoder.t3.attn_proj") == (64, 1024)
        assert shape(g, "decoder.t3.logits") == (64, 32768)
        assert shape(g, "decoder.t3.loss") == (64,)

    def test_dtypes(self, graphs):
        g = graphs["nmt"]
        assert g["source"].out_tensors[0].dtype == "int64"
        assert g["labels.split"].out_tensors[0].dtype == "int64"
        assert g["decoder.t0.logits"].out_tensors[0].dtype == "fp32"
        assert nmt(steps=2, precision="bf16")["decoder.t0.logits"].out_tensors[0].dtype == "bf16"


# --------------------------------------------------------------------------- structure


class TestStructure:
    def test_op_counts(self, graphs):
        # rnntc: 2 inputs, embedding, split, 4*40 LSTM, classifier, loss = 4*40 + 6.
        assert len(graphs["rnntc"]) == 166
        # rnnlm: 2 inputs, embedding, 2 splits, 2*40 LSTM, 40*(logits + loss) = 5 + 80 + 80.
        assert len(graphs["rnnlm"]) == 165
        # nmt: 3 inputs, 2 embeddings, 3 splits; 2*40 encoder LSTM; concat + reshape;
        # 2*40 decoder LSTM; 40 * 10 attention/output ops = 8 + 80 + 2 + 80 + 400.
        assert len(graphs["nmt"]) == 570

    def test_op_kinds_nmt(self, graphs):
        kinds: dict[str, int] = {}
        for op in graphs["nmt"]:
            kinds[op.kind] = kinds.get(op.kind, 0) + 1
        assert kinds == {
            "input": 3, "embedding": 2, "split": 3, "lstm": 160, "concat": 41, "reshape": 81,
            "batch_matmul": 80, "softmax": 40, "linear": 80, "tanh": 40, "softmax_cross_entropy": 40,
        }

    def test_recurrence(self, graphs):
        g = graphs["rnntc"]
        first, later = g["lstm.l1.t0"], g["lstm.l1.t5"]
        assert [str(r) for r in first.inputs] == ["lstm.l0.t0"]
        assert [str(r) for r in later.inputs] == ["lstm.l0.t5", "lstm.l1.t4", "lstm.l1.t4:1"]

    def test_decoder_starts_from_encoder_state(self, graphs):
        g = graphs["nmt"]
        for layer in range(2):
            assert [str(r) for r in g[f"decoder.l{layer}.t0"].inputs][1:] == \
                [f"encoder.l{layer}.t39", f"encoder.l{layer}.t39:1"]

    def test_memory_is_ordered_by_step(self, graphs):
        assert [str(r) for r in graphs["nmt"]["encoder.states"].inputs] == [f"encoder.l1.t{t}" for t in range(40)]

    def test_attention_reads_top_decoder_layer(self, graphs):
        g = graphs["nmt"]
        assert [str(r) for r in g["decoder.t9.query"].inputs] == ["decoder.l1.t9"]
        assert [str(r) for r in g["decoder.t9.concat"].inputs] == ["decoder.t9.context2d", "decoder.l1.t9"]
        assert g["decoder.t9.scores"].attrs["transpose_b"] is True

    def test_blocks(self, graphs):
        g = graphs["nmt"]
        assert g["encoder.l1.t12"].block == "encoder.t12"
        assert {op.block for op in g if op.name.startswith("decoder.t3.")} == {"decoder.t3"}
        assert g["decoder.l0.t3"].block == "decoder.t3"
        per_block = sum(1 for op in g if op.block == "decoder.t3")
        assert per_block == 2 + 10
        assert graphs["rnnlm"]["output.t5.loss"].block == "lstm.t5"

    def test_names_unique(self, graphs):
        for g in graphs.values():
            assert len({op.name for op in g}) == len(g)

    def test_metadata(self, graphs):
        g = graphs["nmt"]
        assert g.name == "nmt" and g.precision == "fp32" and g.batch_size == 64
        assert g.source.startswith("engine.models.rnn.nmt(batch=64, steps=40")
        assert "attention" in g.description

    def test_single_step(self):
        g = nmt(batch=2, steps=1, hidden=4, layers=1, vocab=10)
        assert "encoder.states" not in g
        assert shape(g, "encoder.memory") == (2, 1, 4)
        assert len(rnntc(steps=1)) == 4 * 1 + 6


class TestDeterminism:
    @pytest.mark.parametrize("build", [rnntc, rnnlm, nmt])
    def test_fingerprint(self, build):
        assert build(steps=6).fingerprint == build(steps=6).fingerprint

    def test_fingerprints_differ(self):
        assert nmt(steps=6).fingerprint != nmt(steps=7).fingerprint
        assert rnnlm(steps=6).fingerprint != rnnlm(steps=6, precision="fp16").fingerprint


class TestErrors:
    @pytest.mark.parametrize("kwargs", [{"steps": 0}, {"batch": -1}, {"hidden": 2.5}, {"layers": True}])
    def test_bad_sizes(self, kwargs):
        with pytest.raises(ValueError, match="positive integer"):
            nmt(**kwargs)

    def test_bad_precision(self):
        with pytest.raises(ValueError, match="precision"):
            rnntc(precision="fp64")
