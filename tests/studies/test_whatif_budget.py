"""Issue 28, item 6: ``soapbox whatif --budget 0 -o FILE`` asks for no re-plan, so it writes
nothing (a file already at FILE is left as it was) and says so in one line; a budget that is
neither zero nor valid fails before any simulation, naming ``--budget``; the exit statuses are
in ``--help``."""

from __future__ import annotations

import json

import pytest

from engine.cli import main
from engine.studies.whatif import parse_replan_budget

ARGS = ["whatif", "--model", "gpt2", "--batch", "16", "--cluster", "dgx-a100-80gb:2", "--fail", "node:1"]


class TestParseReplanBudget:
    @pytest.mark.parametrize("text", ["0", "0s", "00", "0.0m", " 0 h", "0."])
    def test_zero_in_any_unit_is_no_replan(self, text):
        assert parse_replan_budget(text) is None

    def test_a_budget_is_parsed_as_the_search_parses_it(self):
        assert parse_replan_budget("2s").seconds == 2.0 and parse_replan_budget("100").iterations == 100

    @pytest.mark.parametrize("text", ["x", "-1", "0x", "1.5", "0.0.0", ""])
    def test_bad_text_names_the_flag(self, text):
        with pytest.raises(ValueError, match=r"^--budget "):
            parse_replan_budget(text)


@pytest.mark.parametrize("budget", ["0", "0s", "0.0m"])
def test_budget_0_writes_nothing_and_says_so(budget, tmp_path, capsys):
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    old.write_text("keep me")
    for path in (new, old):
        assert main(ARGS + ["--budget", budget, "-o", str(path)]) == 0
        out = capsys.readouterr().out
        said = [ln for ln in out.splitlines() if "nothing written" in ln]
        assert said == [f"  nothing written to {path}: --budget {budget} asks for no re-plan"], out
        assert "re-plan " not in out.replace("no re-plan", "")  # (no re-plan line was printed)
    assert not new.exists() and old.read_text() == "keep me"


def test_budget_0_with_json_keeps_stdout_json_and_says_so_on_stderr(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(ARGS + ["--budget", "0", "-o", str(path), "--json"]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert "replan" not in doc and doc["mapped"]["gpus_used"] == 8
    assert cap.err.strip().splitlines() == [f"soapbox: nothing written to {path}: --budget 0 asks for no re-plan"]
    assert not path.exists()


def test_budget_0_without_output_says_nothing_about_files(capsys):
    assert main(ARGS + ["--budget", "0"]) == 0
    assert "nothing written" not in capsys.readouterr().out


def test_a_bad_budget_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    import engine.studies.whatif as whatif

    def no_simulation(*a, **k):  # (the budget is checked before the strategy is simulated)
        raise AssertionError("simulated before the budget was checked")

    monkeypatch.setattr(whatif, "simulate_with_slow", no_simulation)
    assert main(ARGS + ["--budget", "soon", "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("soapbox: error: --budget 'soon' is not a number of proposals"), err
    assert not (tmp_path / "p.json").exists()


def test_help_documents_the_exit_statuses(capsys):
    with pytest.raises(SystemExit) as e:
        main(["whatif", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("exit status 0: done", "with --budget 0 no re-plan is run and -o writes nothing",
                  "3: the re-plan found no plan that fits in memory", "2: an error"):
        assert words in text
