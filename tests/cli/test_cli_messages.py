"""The CLI's messages (issue 24 part 8).

A strategy made for another model (or batch, or cluster) says why first, in a few lines with
a count: before, ``soapbox simulate`` of AlexNet's strategy on Inception-v3 printed 202 lines
and a strategy for another batch named only two fingerprints. And no Python message reaches
a user from a flag's text: before, ``sweep --grid tp=²`` answered ``invalid literal for int()
with base 10: '²'`` and ``whatif --slow gpu:1=0.5.5`` ``could not convert string to float:
'0.5.5'``; every flag's text is fuzzed here.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.cli.commands as commands
import engine.cli.search as cli_search
import engine.studies.sweep as sweep
from engine.cli import main
from toys import run_cli  # tests/toys.py
from engine.cluster import preset
from engine.errors import Problem, ValidationError, problems_summary
from engine.formats import load_strategy, resolve_model, save_json
from engine.search.baselines import make_baseline
from engine.strategy import validate_strategy


run = run_cli  # (tests/toys.py)


@pytest.fixture(scope="module")
def alexnet_expert(tmp_path_factory) -> str:
    """AlexNet's expert strategy on p100-4x4, at AlexNet's own batch (256)."""
    path = tmp_path_factory.mktemp("messages") / "alexnet-expert.json"
    g, c = resolve_model("alexnet"), preset("p100-4x4")
    save_json(make_baseline("expert", g, c).to_dict(), path)
    return str(path)


# --------------------------------------------------------------------------- another model


class TestAStrategyForAnotherModel:
    def test_another_batch_is_named_and_is_the_whole_message(self, capsys, alexnet_expert):
        rc, out, err = run(capsys, "simulate", "--model", "alexnet", "--batch", "128", "--cluster", "p100-4x4",
                           "--strategy", alexnet_expert)
        made, here = resolve_model("alexnet"), resolve_model("alexnet", batch=128)
        assert (rc, out) == (2, "")
        assert err == (f"soapbox: error: {alexnet_expert}: the strategy was made for model 'alexnet' with batch "
                       f"256; this model has batch 128 (fingerprint {made.fingerprint}; this model's is "
                       f"{here.fingerprint})\n")

    def test_another_model_root_cause_first_then_a_few_and_a_count(self, capsys, alexnet_expert):
        rc, out, err = run(capsys, "simulate", "--model", "inception_v3", "--cluster", "p100-4x4",
                           "--strategy", alexnet_expert)
        problems = validate_strategy(load_strategy(alexnet_expert), resolve_model("inception_v3"), preset("p100-4x4"))
        others = [p for p in problems if p.path != "model.fingerprint"]
        assert len(others) > 300  # (every op of AlexNet is missing: 202 lines were printed before)
        lines = err.splitlines()
        assert (rc, out, len(lines)) == (2, "", 9), err
        assert lines[0].startswith(f"soapbox: error: {alexnet_expert}: the strategy was made for model 'alexnet' "
                                   "(batch 256), not for 'inception_v3' (batch 64) (fingerprint ")
        assert lines[1] == f"  {len(others):,} other problems follow from it, e.g.:"
        assert lines[2:7] == [f"  - {p}" for p in others[:5]]
        assert lines[7] == f"  ... and {len(others) - 5:,} more"
        assert lines[8] == "  (`soapbox validate FILE` lists every problem)"

    def test_another_cluster_size_is_the_root_cause(self, capsys, alexnet_expert):
        rc, _, err = run(capsys, "simulate", "--model", "alexnet", "--cluster", "dgx-a100-80gb:1",
                         "--strategy", alexnet_expert)
        lines = err.splitlines()
        assert rc == 2 and lines[0] == (f"soapbox: error: {alexnet_expert}: the strategy was made for 16 devices "
                                        "(p100-4x4), but dgx-a100-80gb:1 has 8")
        assert re.fullmatch(r"  [\d,]+ other problems follow from it, e.g.:", lines[1]) and len(lines) == 9

    def test_validate_still_lists_every_problem(self, capsys, alexnet_expert):
        rc, _, err = run(capsys, "validate", alexnet_expert, "--model", "inception_v3", "--cluster", "p100-4x4")
        n = len(validate_strategy(load_strategy(alexnet_expert), resolve_model("inception_v3"), preset("p100-4x4")))
        assert rc == 1 and err.startswith(f"{alexnet_expert}: {n} problems found:\n  - model.fingerprint: ")

    def test_another_precision_is_named(self, capsys, tmp_path):
        g = resolve_model("gpt2")
        path = tmp_path / "gpt2-bf16.json"
        other = resolve_model("gpt2", precision="bf16")
        save_json(make_baseline("data-parallel", other, preset("dgx-a100-80gb:1")).to_dict(), path)
        rc, _, err = run(capsys, "simulate", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--strategy", str(path))
        assert rc == 2 and err == (f"soapbox: error: {path}: the strategy was made for model 'gpt2' in bf16; this "
                                   f"model is in {g.precision} (fingerprint {other.fingerprint}; this model's is "
                                   f"{g.fingerprint})\n")

    def test_same_name_batch_and_precision_but_another_sequence_length(self):
        g, c = resolve_model("gpt2"), preset("dgx-a100-80gb:1")
        s = make_baseline("data-parallel", g, c).to_dict()
        with pytest.raises(ValidationError) as e:
            load_strategy(s, resolve_model("gpt2", seq_len=512), c)
        assert e.value.problems[0].message.startswith(
            f"the strategy was made for model 'gpt2' with batch {g.batch_size} but another shape (sequence length, "
            "layers)")

    def test_a_model_file_keeps_the_fingerprints(self, capsys, tmp_path):
        """A model that is not a sample cannot be built at other sizes: the fingerprints are named."""
        path = tmp_path / "m.json"
        assert main(["model", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq-len", "32",
                     "--vocab", "100", "--batch", "8", "-o", str(path)]) == 0
        g, c = resolve_model(str(path), allow_path=True), preset("p100-4x4")
        d = make_baseline("data-parallel", g, c).to_dict()
        d["model"]["fingerprint"] = "0123456789abcdef"
        with pytest.raises(ValidationError) as e:
            load_strategy(d, g, c)
        assert e.value.problems[0].message == (f"the strategy was made for model 'gpt' with fingerprint "
                                               f"0123456789abcdef, but 'gpt' has {g.fingerprint}")


class TestProblemsSummary:
    def test_few_problems_and_no_root_cause_are_the_error_itself(self):
        e = ValidationError([Problem("a", "x"), Problem("b", "y")], "f.json")
        assert problems_summary(e) == str(e)

    def test_the_count_is_of_what_is_left_out(self):
        e = ValidationError([Problem(f"p{i}", "x") for i in range(7)], "f.json")
        assert problems_summary(e, shown=5).splitlines() == [
            "f.json: 7 problems found:", *[f"  - p{i}: x" for i in range(5)], "  ... and 2 more"]

    def test_two_root_causes_share_the_first_line(self):
        e = ValidationError([Problem("cluster.devices", "16 devices, not 8"), Problem("model.fingerprint", "batch"),
                             Problem("ops.a", "missing")])
        assert problems_summary(e).splitlines() == ["16 devices, not 8; batch",
                                                    "  1 other problem follows from it, e.g.:", "  - ops.a: missing"]


# --------------------------------------------------------------------------- flags


class TestFlagMessages:
    """Each parse site's message names the flag, the value and what would be valid."""

    @pytest.mark.parametrize("argv, last_line", [
        (["sweep", "--model", "gpt2", "--grid", "tp=²", "--clusters", "dgx-a100-80gb:1", "-o", "x.csv"],
         "soapbox: error: --grid tp='²': a positive whole number up to 1,048,576"),
        (["sweep", "--model", "gpt2", "--grid", "zero=-1", "--clusters", "dgx-a100-80gb:1", "-o", "x.csv"],
         "soapbox: error: --grid zero='-1': a non-negative whole number up to 1,048,576"),
        (["sweep", "--model", "gpt2", "--grid", "tp=1", "--clusters", "dgx-a100-80gb:²", "-o", "x.csv"],
         "soapbox: error: --clusters 'dgx-a100-80gb:²': sizes must be whole numbers (dgx-a100-80gb:4,8,16)"),
        (["whatif", "--model", "alexnet", "--cluster", "p100-4x4", "--slow", "gpu:1=0.5.5"],
         "soapbox: error: --slow 'gpu:1=0.5.5': expected gpu:N=F with 0 < F <= 1 (the speed it keeps)"),
        (["whatif", "--model", "alexnet", "--cluster", "p100-4x4", "--fail", "gpu:²"],
         "soapbox: error: --fail 'gpu:²': gpu index must be a whole number"),
        (["whatif", "--model", "alexnet", "--cluster", "p100-4x4", "--fail", "gpu:1", "--mtbf-hours", "abc"],
         "soapbox whatif: error: argument --mtbf-hours: 'abc' is not a number from 0.001 to 1e+12"),
        (["whatif", "--model", "alexnet", "--cluster", "p100-4x4", "--fail", "gpu:1", "--restart-min", "nan"],
         "soapbox whatif: error: argument --restart-min: 'nan' is not a number from 0 to 1e+12"),
        (["search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc", "--option", "chains=²"],
         "soapbox: error: option chains='²': expected a whole number (int)"),
        (["search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc", "--option", "beta=1.2.3"],
         "soapbox: error: option beta='1.2.3': not a finite number (write one such as 0.5 or 1e-3; float | None)"),
        (["baseline", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--kind", "megatron", "--pp", "2",
          "--layers-per-stage", "6,²", "-o", "x.json"],
         "soapbox baseline: error: argument --layers-per-stage: '6,²' is not a list of positive layer counts "
         "(e.g. 7,8,8,7)"),
        (["baseline", "--model", "gpt2", "--cluster", "dgx-a100-80gb:1", "--kind", "fsdp", "--zero-stage", "x",
          "-o", "x.json"],
         "soapbox baseline: error: argument --zero-stage: 'x' is not a whole number (from 1 to 3)"),
        (["import", "missing.onnx", "--dim", "n=²", "-o", "x.json"],
         "soapbox: error: --dim 'n=²': expected NAME=N with N a positive whole number"),
    ])
    def test_message(self, capsys, tmp_path, monkeypatch, argv, last_line):
        monkeypatch.chdir(tmp_path)
        rc, out, err = run(capsys, *argv)
        assert (rc, out, err.splitlines()[-1]) == (2, "", last_line)


def _reached(*a, **k):
    """Stands in where a command would start its work: the flags were read without a complaint."""
    raise ValueError("reached the command")


#: Fragments of Python's own messages, and argparse's fallback that names a Python function
RAW = re.compile(r"Traceback|invalid literal|could not convert|base 10|object has no attribute|NoneType|"
                 r"not subscriptable|unsupported operand|is not iterable|unhashable|index out of range|"
                 r"Exceeds the limit|invalid \w+ value|referenced before assignment|positional argument")

#: flag -> (argv with the fuzzed text at {}, the words its message must contain)
FLAGS = {
    "--grid": (["sweep", "--model", "gpt2", "--grid={}", "--clusters", "p100-4x4", "-o", "x.csv"], "--grid"),
    "--clusters": (["sweep", "--model", "gpt2", "--grid", "tp=1", "--clusters={}", "-o", "x.csv"], "--clusters"),
    "--network": (["sweep", "--model", "gpt2", "--grid", "tp=1", "--clusters", "p100-4x4", "--network={}", "-o",
                   "x.csv"], "--network"),
    "--fail": (["whatif", "--model", "alexnet", "--cluster", "p100-4x4", "--fail={}"], "--fail"),
    "--slow": (["whatif", "--model", "alexnet", "--cluster", "p100-4x4", "--slow={}"], "--slow"),
    "--mtbf-hours": (["whatif", "--model", "alexnet", "--cluster", "p100-4x4", "--fail", "gpu:0", "--mtbf-hours={}"],
                     "--mtbf-hours"),
    "--storage-gbps": (["whatif", "--model", "alexnet", "--cluster", "p100-4x4", "--fail", "gpu:0",
                        "--storage-gbps={}"], "--storage-gbps"),
    "--budget": (["search", "--model", "alexnet", "--cluster", "p100-4x4", "--budget={}"], "budget"),
    "--option": (["search", "--model", "alexnet", "--cluster", "p100-4x4", "--algo", "mcmc", "--option={}"],
                 "option"),
    "--seed": (["search", "--model", "alexnet", "--cluster", "p100-4x4", "--seed={}"], "--seed"),
    "--chains": (["search", "--model", "alexnet", "--cluster", "p100-4x4", "--chains={}"], "--chains"),
    "--layers-per-stage": (["baseline", "--model", "gpt2", "--cluster", "p100-4x4", "--kind", "megatron",
                            "--layers-per-stage={}", "-o", "x.json"], "--layers-per-stage"),
    "--tp": (["baseline", "--model", "gpt2", "--cluster", "p100-4x4", "--kind", "megatron", "--tp={}", "-o",
              "x.json"], "--tp"),
    "--zero-stage": (["baseline", "--model", "gpt2", "--cluster", "p100-4x4", "--kind", "fsdp", "--zero-stage={}",
                      "-o", "x.json"], "--zero-stage"),
    "--batch": (["baseline", "--model", "gpt2", "--cluster", "p100-4x4", "--kind", "fsdp", "--batch={}", "-o",
                 "x.json"], "--batch"),
    "--dim": (["import", "missing.onnx", "--dim={}", "-o", "x.json"], "--dim"),
    "--model": (["simulate", "--model={}", "--cluster", "p100-4x4", "--strategy", "expert"], "model"),
    "--cluster": (["simulate", "--model", "alexnet", "--cluster={}", "--strategy", "expert"], "cluster"),
}

#: Text a user might type: near misses of valid values, other scripts' digits, and any text
TEXT = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="0123456789.,:=-+e ²³½٣١gpunodelinkictpsmh/x", max_size=24),
    st.sampled_from(["tp=²", "gpu:1=0.5.5", "gpu:²", "gpu:1=1e-3", "gpu:" + "9" * 5000, "node:٣", "1e400", "nan",
                     "inf", "-0", "0x10", "1_000", "٣", "tp=" + "9" * 5000, "chains=" + "9" * 5000, "beta=1e999",
                     "polish=maybe", "p100-4x4:" + "9" * 50, "dgx-h100:", ",", "=", "", " ", "\udcff", "a\x1b[31m"]))


@pytest.mark.parametrize("flag", list(FLAGS))
def test_fuzzed_flag_text_gets_a_message_not_a_traceback(flag, capsys, monkeypatch, tmp_path):
    """Any text given to a flag ends in exit status 2 and one message that names the flag,
    never a Python message (or the command starts: its work is stubbed out here)."""
    monkeypatch.chdir(tmp_path)  # (nothing is written: every run stops before the command's work)
    for where in (commands, cli_search):
        monkeypatch.setattr(where, "model_and_cluster", _reached)
    monkeypatch.setattr(commands, "make_baseline", _reached)
    monkeypatch.setattr(sweep, "run_sweep", _reached)
    monkeypatch.setattr(sweep, "layout_points", _reached)
    if flag in ("--model", "--cluster"):
        monkeypatch.undo()
        monkeypatch.chdir(tmp_path)
        monkeypatch.setattr(commands, "make_baseline", _reached)
    template, words = FLAGS[flag]

    @settings(max_examples=60, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(text=TEXT)
    def check(text):
        rc, out, err = run(capsys, *(a.replace("{}", text) if "{}" in a else a for a in template))
        assert rc == 2 and out == "", (text, rc, out, err)
        assert not RAW.search(err), err
        last = err.splitlines()[-1] if err else ""
        if last != "soapbox: error: reached the command":
            assert last.startswith(("soapbox: error: ", "soapbox ")) and words in err, err

    check()


def test_a_validation_error_crosses_processes_with_its_problems():
    """Issue 45: pickled (a worker's error), it printed one "problem" per character."""
    import pickle

    from engine.errors import Problem, ValidationError

    e = ValidationError([Problem("nodes", "too many"), Problem("gpus", "none")], "dgx-h100:99999999")
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == str(e) and back.problems == e.problems and back.source == e.source
    assert str(back).startswith("dgx-h100:99999999: 2 problems found:")


@pytest.mark.parametrize("content, said", [
    (b"not sqlite at all", "not a measurement cache soapbox can use (file is not a database)"),
    (None, "not a measurement cache soapbox can use"),  # a folder
])
def test_profile_cache_that_is_not_a_cache_is_one_line(tmp_path, capsys, content, said):
    from engine.cli import main

    path = tmp_path / "cache.sqlite"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    status = main(["profile", "--model", "gpt2", "--cluster", "dgx-h100:1", "--cache", str(path),
                   "-o", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert said in err

