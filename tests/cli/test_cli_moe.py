"""Mixture of experts from the command line (issue 26, items 2 and 3): ``--ep`` / ``--etp``,
the routing-imbalance what-if (``--routing-skew``, ``--routing-histogram``), the MoE lines of
the simulate summary, and ``soapbox experts``.

Most runs use a two-layer MoE model of 8 experts (top-2) written to a file (a simulation takes
a fraction of a second); the Mixtral sample pins the messages the issue quotes.
"""

from __future__ import annotations

import json
import re

import pytest

from toys import run_cli  # tests/toys.py
from engine.formats import load_strategy, resolve_model, save_json
from engine.models.moe import MoEConfig, moe_gpt
from engine.moe import MAX_HISTOGRAM_BYTES, expert_loads, gate_factor, parse_histogram

#: a Python message or a traceback reaching the user
RAW = re.compile(r"Traceback|invalid literal|could not convert|object has no attribute|NoneType|KeyError")


run = run_cli  # (tests/toys.py)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A two-layer MoE decoder: hidden 64, 4 heads, sequence 64, 8 experts of width 64, top-2,
    batch 8 (on 8 GPUs: dp 8, one sample a rank, one microbatch)."""
    path = tmp_path_factory.mktemp("moe") / "tiny-moe.json"
    save_json(moe_gpt(MoEConfig(2, 64, 4, 64, 100, 8, 8, 2, 64, name="tiny-moe")).to_dict(), path)
    return str(path)


def simulate_json(capsys, tiny: str, *flags: str) -> dict:
    rc, out, err = run(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "megatron",
                       "--json", *flags)
    assert rc == 0, err
    return json.loads(out)


def error_of(capsys, *argv: str) -> str:
    """The one-line message of a run that must fail with status 2, no output, no traceback
    (after argparse's usage lines, for a flag's bad text)."""
    rc, out, err = run(capsys, *argv)
    assert (rc, out) == (2, ""), (rc, out, err)
    assert not RAW.search(err), err
    *usage, last = err.strip().splitlines()
    assert not usage or usage[0].startswith("usage: "), err
    return last


# --------------------------------------------------------------------------- --ep / --etp


class TestExpertParallelFlags:
    def test_flags_are_layout_fields(self):
        import argparse

        from engine.cli.common import add_strategy_options, strategy_options
        from engine.layout import Layout

        p = argparse.ArgumentParser()
        add_strategy_options(p)
        opts = strategy_options(p.parse_args(["--tp", "2", "--ep", "4", "--etp", "2"]))
        lay = Layout.from_options(opts)
        assert (lay.tp, lay.ep, lay.etp) == (2, 4, 2)
        assert strategy_options(p.parse_args([]))["ep"] is None  # (not given: the baseline's default)

    def test_help_names_megatron_flags_and_the_folding_rule(self, capsys, monkeypatch):
        monkeypatch.setenv("COLUMNS", "1000")  # (argparse would break lines at the flags' hyphens)
        rc, out, _ = run(capsys, "simulate", "--help")
        text = " ".join(out.split())
        assert rc == 0
        assert "--expert-model-parallel-size" in text and "--expert-tensor-parallel-size" in text
        assert "folding" in text and "tp x cp x dp / (ep x etp)" in text

    def test_simulate_with_ep_reports_it(self, capsys, tiny):
        for ep in (1, 2, 8):
            s = simulate_json(capsys, tiny, "--ep", str(ep))
            assert (s["moe"]["ep"], s["moe"]["etp"], s["moe"]["routing"]) == (ep, 1, "balanced")
            assert s["moe"]["rank_load_max_over_mean"] == 1.0

    def test_etp_with_tensor_parallelism(self, capsys, tiny):
        s = simulate_json(capsys, tiny, "--tp", "2", "--sequence-parallel", "--ep", "4", "--etp", "2")
        assert (s["moe"]["ep"], s["moe"]["etp"]) == (4, 2)

    def test_ep_that_does_not_divide_the_experts(self, capsys):
        # the example: Mixtral on 64 GPUs (the layout is refused before any simulation)
        msg = error_of(capsys, "simulate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100:8", "--strategy",
                       "megatron", "--ep", "3")
        assert msg == "soapbox: error: ep 3 does not divide the 8 experts of 'mixtral-8x7b'"

    @pytest.mark.parametrize("flags, words", [
        (["--tp", "2", "--sequence-parallel", "--etp", "3"], "etp 3 must divide tp 2"),
        (["--tp", "2", "--ep", "2"], "needs sequence parallelism"),
        (["--ep", "16"], "ep 16 does not divide the 8 experts of 'tiny-moe'"),
        (["--dp", "2", "--ep", "4"], "ep 4 does not fold onto dp 2 x 1 sequence shards"),  # (2 of the 8 GPUs)
    ])
    def test_layout_rules_speak(self, capsys, tiny, flags, words):
        msg = error_of(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "megatron",
                       *flags)
        assert msg.startswith("soapbox: error: ") and words in msg, msg

    def test_ep_that_does_not_fold_onto_the_mesh(self, capsys, tiny):
        # 8 GPUs, tp 1: ep 8 folds onto dp 8, but with dp 4 (pp 2) ep 8 neither divides the one
        # sequence shard nor divides dp
        msg = error_of(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "megatron",
                       "--pp", "2", "--ep", "8")
        assert "ep 8 does not fold onto dp 4" in msg

    def test_fsdp_lays_out_experts(self, capsys, tiny):
        """torchtitan's FSDP + EP: the fsdp baseline folds ep like megatron and ZeRO-3 shards the
        experts over their expert data-parallel ranks."""
        rc, out, err = run(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "fsdp",
                           "--ep", "2", "--json")
        assert rc == 0, err
        data = json.loads(out)
        assert data["moe"]["ep"] == 2 and data["strategy"] == "baseline:fsdp"
        msg = error_of(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "fsdp",
                       "--ep", "3")
        assert "ep 3 does not divide the 8 experts" in msg

    def test_other_kinds_refuse(self, capsys, tiny):
        msg = error_of(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "data-parallel",
                       "--etp", "2")
        assert msg == ("soapbox: error: data-parallel does not take --etp: expert parallelism is a megatron or fsdp "
                       "layout (--strategy megatron or fsdp)")

    def test_megatron_still_refuses_an_option_it_does_not_take(self, capsys, tiny):
        msg = error_of(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "megatron",
                       "--ep", "2", "--gather-unit", "op")
        assert "megatron does not take --gather-unit" in msg

    def test_dense_model(self, capsys):
        msg = error_of(capsys, "simulate", "--model", "gpt2", "--batch", "8", "--cluster", "dgx-h100:1",
                       "--strategy", "megatron", "--ep", "2")
        assert "needs a mixture-of-experts model; 'gpt2' has no experts" in msg

    def test_ep_with_a_strategy_file_is_refused(self, capsys, tiny, tmp_path):
        path = tmp_path / "s.json"
        assert run(capsys, "baseline", "--model", tiny, "--cluster", "dgx-h100:1", "--kind", "megatron", "--ep", "4",
                   "-o", str(path))[0] == 0
        msg = error_of(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", str(path),
                       "--ep", "2")
        assert "baseline options (--ep) apply to a baseline kind" in msg

    @pytest.mark.parametrize("text", ["0", "-1", "x", "²", "1.5", "9" * 40])
    def test_bad_numbers_are_usage_errors(self, capsys, tiny, text):
        msg = error_of(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "megatron",
                       f"--ep={text}")
        assert msg.startswith("soapbox simulate: error: argument --ep: ")


# --------------------------------------------------------------------------- routing what-if


def zipf_counts(n: int, skew: float) -> list[float]:
    """Token counts by Zipf's law, at a scale of a measured histogram."""
    return [1e6 / (i + 1) ** skew for i in range(n)]


class TestRoutingWhatIf:
    def test_more_skew_is_never_faster(self, capsys, tiny):
        times = [simulate_json(capsys, tiny, "--ep", "8", "--routing-skew", str(k))["iteration_time_s"]
                 for k in (0, 0.5, 1, 2, 4)]
        assert times == sorted(times) and times[-1] > times[0] * 1.2, times

    def test_skew_without_expert_parallelism_still_gates_nothing(self, capsys, tiny):
        # ep 1: one rank holds every expert; the imbalance moves no work between ranks
        a = simulate_json(capsys, tiny, "--ep", "1")["iteration_time_s"]
        b = simulate_json(capsys, tiny, "--ep", "1", "--routing-skew", "2")
        assert b["iteration_time_s"] == pytest.approx(a, rel=1e-12) and b["moe"]["rank_load_max_over_mean"] == 1.0

    def test_summary_states_the_gate(self, capsys, tiny):
        s = simulate_json(capsys, tiny, "--ep", "4", "--routing-skew", "1")["moe"]
        gate = gate_factor(expert_loads(8, 1.0), 4)
        assert s["routing"] == "what-if" and s["rank_load_max_over_mean"] == pytest.approx(gate)
        # ranks hold experts (0, 1), (2, 3), ...: rank 0 gets (1 + 1/2) / H_8 of the tokens
        h8 = sum(1 / (i + 1) for i in range(8))
        assert s["rank_loads"][0] == pytest.approx(1.5 / h8) and sum(s["rank_loads"]) == pytest.approx(1.0)
        assert gate == pytest.approx(4 * 1.5 / h8)

    def test_text_summary(self, capsys, tiny):
        rc, out, _ = run(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "megatron",
                         "--ep", "4", "--routing-skew", "1")
        assert rc == 0
        assert "mixture of experts 243,520 parameters, 96,064 active a token (top-2 of 8 experts); ep 4 x etp 1" in out
        assert re.search(r"all-to-all +in flight [0-9.]+ ms, [0-9.]+% of the iteration", out)
        assert "max/mean 2.21" in out and "published MoE runs are measured with balanced routing" in out
        rc, out, _ = run(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "megatron",
                         "--ep", "4")
        assert "routing            balanced (published MoE runs are measured with balanced routing)" in out

    def test_dense_summary_has_no_moe_lines(self, capsys):
        rc, out, _ = run(capsys, "simulate", "--model", "gpt2", "--batch", "8", "--cluster", "dgx-h100:1",
                         "--strategy", "data-parallel", "--json")
        assert rc == 0 and "moe" not in json.loads(out)

    def test_histogram_of_zipf_counts_equals_the_skew(self, capsys, tiny, tmp_path):
        path = tmp_path / "h.json"
        path.write_text(json.dumps(zipf_counts(8, 1.0)))
        a = simulate_json(capsys, tiny, "--ep", "8", "--routing-skew", "1")["iteration_time_s"]
        b = simulate_json(capsys, tiny, "--ep", "8", "--routing-histogram", str(path))["iteration_time_s"]
        assert b == pytest.approx(a, rel=1e-9)

    @pytest.mark.parametrize("text", ["[5, 5, 5, 5, 5, 5, 5, 5]", "5\n5\n5\n5\n5\n5\n5\n5\n",
                                      "5,5,5,5,\n5,5,5,5", "# tokens per expert, layer 7\n" + "5\n" * 8])
    def test_balanced_histogram_in_every_form_equals_balanced(self, capsys, tiny, tmp_path, text):
        path = tmp_path / "h.txt"
        path.write_text(text)
        a = simulate_json(capsys, tiny, "--ep", "8")["iteration_time_s"]
        s = simulate_json(capsys, tiny, "--ep", "8", "--routing-histogram", str(path))
        assert s["iteration_time_s"] == pytest.approx(a, rel=1e-12) and s["moe"]["routing"] == "what-if"

    def test_a_strategy_file_carries_the_loads(self, capsys, tiny, tmp_path):
        path = tmp_path / "s.json"
        assert run(capsys, "baseline", "--model", tiny, "--cluster", "dgx-h100:1", "--kind", "megatron", "--ep", "8",
                   "--routing-skew", "2", "-o", str(path))[0] == 0
        s = load_strategy(str(path), resolve_model(tiny, allow_path=True))
        assert s.expert_loads == pytest.approx(tuple(expert_loads(8, 2.0)))
        direct = simulate_json(capsys, tiny, "--ep", "8", "--routing-skew", "2")["iteration_time_s"]
        rc, out, err = run(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", str(path),
                           "--json")
        assert rc == 0, err
        assert json.loads(out)["iteration_time_s"] == pytest.approx(direct, rel=1e-12)

    def test_dense_model_is_refused(self, capsys):
        msg = error_of(capsys, "simulate", "--model", "gpt2", "--batch", "8", "--cluster", "dgx-h100:1",
                       "--strategy", "data-parallel", "--routing-skew", "1")
        assert msg.startswith("soapbox: error: --routing-skew: the routing-imbalance what-if needs a "
                              "mixture-of-experts model; 'gpt2' has no experts")

    @pytest.mark.parametrize("text", ["-0.5", "4.01", "nan", "inf", "x", ""])
    def test_skew_out_of_range(self, capsys, tiny, text):
        msg = error_of(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "megatron",
                       f"--routing-skew={text}")
        assert msg.startswith("soapbox simulate: error: argument --routing-skew: ") and "from 0 to 4" in msg

    def test_skew_and_histogram_exclude_each_other(self, capsys, tiny):
        msg = error_of(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "megatron",
                       "--routing-skew", "1", "--routing-histogram", "h.txt")
        assert "not allowed with argument" in msg


class TestHistogramFile:
    """Each bad file: exit status 2, one line naming the flag, the file and (for its content)
    the line."""

    def message(self, capsys, tiny, path) -> str:
        return error_of(capsys, "simulate", "--model", tiny, "--cluster", "dgx-h100:1", "--strategy", "megatron",
                        "--ep", "8", "--routing-histogram", str(path))

    @pytest.mark.parametrize("text, where, words", [
        ("1\n2\nabc\n", "line 3", "'abc' is not a token count"),
        ("1, 2, 3, 4\n5, 6, 7, x8\n", "line 2", "'x8' is not a token count"),
        ("[1, 2, 3, 4, 5, 6, 7, -8]", "line 1", "'-8': a token count cannot be negative"),
        ("1\n2\n3\n4\n5\n6\n7\n1e999\n", "line 8", "too large a token count"),
        ("1\n2\n3\n4\n5\n6\n7\nnan\n", "line 8", "'nan' is not a token count"),
        ("1\n2\n3\n4\n5\n6\n7\n__import__('os')\n", "line 8", "is not a token count"),
        ("1_000\n", "line 1", "'1_000' is not a token count"),
        ("[1, [2], 3]", "line 1", "'[2]' is not a token count"),
    ])
    def test_bad_content_names_the_line(self, capsys, tiny, tmp_path, text, where, words):
        path = tmp_path / "h.txt"
        path.write_text(text)
        msg = self.message(capsys, tiny, path)
        assert msg.startswith(f"soapbox: error: --routing-histogram {path}, {where}: ") and words in msg, msg

    @pytest.mark.parametrize("text, words", [
        ("", "no token counts"),
        ("# only a comment\n\n", "no token counts"),
        ("[]", "no token counts"),
        ("[1, 2", "a JSON list must end with ']'"),
        ("1\n2\n3\n", "the routing histogram lists 3 experts; the model has 8"),
        ("0,0,0,0,0,0,0,0", "all zero"),
    ])
    def test_bad_file(self, capsys, tiny, tmp_path, text, words):
        path = tmp_path / "h.txt"
        path.write_text(text)
        msg = self.message(capsys, tiny, path)
        assert msg.startswith(f"soapbox: error: --routing-histogram {path}: ") and words in msg, msg

    def test_huge_file_is_not_read(self, capsys, tiny, tmp_path):
        path = tmp_path / "h.txt"
        path.write_bytes(b"1\n" * (MAX_HISTOGRAM_BYTES // 2 + 1))
        msg = self.message(capsys, tiny, path)
        assert msg == f"soapbox: error: --routing-histogram {path}: the file is larger than the limit of 1 MiB"

    def test_too_many_counts(self, capsys, tiny, tmp_path):
        path = tmp_path / "h.txt"
        path.write_text("1\n" * 5000)
        assert "more than 4,096 token counts" in self.message(capsys, tiny, path)

    def test_missing_folder_and_binary(self, capsys, tiny, tmp_path):
        assert self.message(capsys, tiny, tmp_path / "nope.txt").endswith("nope.txt: file not found")
        assert self.message(capsys, tiny, tmp_path).endswith(": is a folder, not a routing histogram")
        path = tmp_path / "h.bin"
        path.write_bytes(b"1\n\xff\xfe\n")
        assert self.message(capsys, tiny, path).endswith("h.bin: not UTF-8 text (byte 2)")

    def test_parse_histogram_forms(self):
        assert parse_histogram("[1, 2.5, 3e2]") == [1.0, 2.5, 300.0]
        assert parse_histogram("1\n\n2 # a comment\n3,4\n") == [1.0, 2.0, 3.0, 4.0]
        assert parse_histogram("[\n 1,\n 2\n]\n") == [1.0, 2.0]
        with pytest.raises(ValueError, match=r"^f, line 3: 'x' is not"):
            parse_histogram("[\n1,\nx]", "f")


# --------------------------------------------------------------------------- soapbox experts


class TestExpertsCommand:
    def test_balanced_table_by_hand(self, capsys, tiny):
        # 8 GPUs, dp 8, ep 4: two expert data-parallel groups of 4 ranks, each with 4 samples x 64
        # tokens x top-2 = 512 routed copies per microbatch; 128 a rank when balanced
        rc, out, err = run(capsys, "experts", "--model", tiny, "--cluster", "dgx-h100:1", "--ep", "4", "--json")
        assert rc == 0, err
        t = json.loads(out)
        assert (t["num_experts"], t["top_k"], t["ep"], t["etp"], t["layers"], t["microbatches"]) == (8, 2, 4, 1, 2, 1)
        assert t["tokens_per_microbatch"] == 512.0
        assert t["rank_experts"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert t["rank_tokens"] == [128.0] * 4 and (t["gate"], t["balanced"]) == (1.0, True)

    def test_skewed_table(self, capsys, tiny):
        rc, out, _ = run(capsys, "experts", "--model", tiny, "--cluster", "dgx-h100:1", "--ep", "4",
                         "--routing-skew", "1")
        assert rc == 0
        h8 = sum(1 / (i + 1) for i in range(8))
        assert re.search(r"^ +0  0-1 +55\.2% +283  <- busiest$", out, re.M), out
        assert f"{512 * 1.5 / h8:,.0f}" == "283"
        assert "gate 2.21: the busiest rank receives 2.21x the mean rank's tokens" in out
        assert out.count("<- busiest") == 1

    def test_microbatches_divide_the_tokens(self, capsys, tiny):
        # pp 2: dp 4, micro-batch 1, 2 microbatches; ep 4 over dp 4: one group of 4 ranks, each
        # with 1 sample a microbatch -> 4 x 64 x 2 copies
        rc, out, err = run(capsys, "experts", "--model", tiny, "--cluster", "dgx-h100:1", "--pp", "2", "--ep", "4",
                           "--json")
        assert rc == 0, err
        t = json.loads(out)
        assert (t["microbatches"], t["tokens_per_microbatch"]) == (2, 512.0)

    def test_many_ranks_are_elided(self, capsys):
        rc, out, err = run(capsys, "experts", "--model", "qwen3-30b-a3b", "--batch", "64", "--cluster", "dgx-h100:8",
                           "--ep", "64", "--max-rows", "3")
        assert rc == 0, err
        rows = [ln for ln in out.splitlines() if re.match(r"^ +\d+  \d+-\d+ ", ln)]
        assert [int(r.split()[0]) for r in rows] == [0, 1, 2, 61, 62, 63]
        assert "(58 ranks not shown; --max-rows)" in out

    def test_dense_model(self, capsys):
        msg = error_of(capsys, "experts", "--model", "gpt2", "--batch", "8", "--cluster", "dgx-h100:1")
        assert msg == "soapbox: error: 'gpt2' has no mixture-of-experts layers: no experts to show"
