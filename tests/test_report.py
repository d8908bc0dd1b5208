"""What people read after a check: headroom instead of margin, grouped failures with a repro command, colour
that NO_COLOR turns off, --version, "did you mean", and the summary line of `check --all`."""

from __future__ import annotations

import io
import math
import re
import shlex
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app
from engine.cli.failure_report import failure_report
from engine.run.expect import describe, evaluate, format_headroom, worst_expectation
from engine.store.index import contract_digest
from engine.suggest import closest

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "tapo-trajectory.yaml"
LOOSE = "      - {metric: max_rel_err, dtype: float32, le: 1.0e-5}\n"
TIGHT = "      - {metric: max_rel_err, dtype: float32, le: 1.0e-9}\n"
ESC = "\x1b["


def invoke(*args: str, **kw):
    return CliRunner().invoke(app, list(args), **kw)


@pytest.fixture
def tight_specs(tmp_path):
    """The TAPO spec with prefix_ratio_forward's float32 tolerance tightened past what float32 can meet."""
    text = SPEC.read_text()
    assert text.count(LOOSE) == 1
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / SPEC.name).write_text(text.replace(LOOSE, TIGHT))
    line = 1 + text.splitlines().index("  - id: prefix_ratio_forward")
    return specs, tmp_path / "receipts", line


# --- headroom --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("expect, measured, headroom, shown", [
    ({"metric": "err", "le": 1e-12}, 1e-15, 1e3, "10^3.0x"),
    ({"metric": "err", "lt": 1e-12}, 6.3e-16, 1e-12 / 6.3e-16, "10^3.2x"),
    ({"metric": "err", "le": 1e-12}, 0.356, 1e-12 / 0.356, "10^-11.6x"),
    ({"metric": "err", "le": 1e-6}, 2.5e-7, 4.0, "4x"),
    ({"metric": "n", "ge": 48}, 96, 2.0, "2x"),  # a lower bound: measured / limit
    ({"metric": "n", "gt": 10}, 1, 0.1, "0.1x"),
    ({"metric": "err", "le": 1e-12}, 0.0, math.inf, "exact"),
])
def test_headroom_is_the_ratio_to_the_limit_shown_in_decades(expect, measured, headroom, shown):
    r = evaluate(expect, {expect["metric"]: measured}, "float64")
    assert r["headroom"] == pytest.approx(headroom)
    assert format_headroom(r["headroom"]) == shown
    assert "margin" in r  # kept for older readers


@pytest.mark.parametrize("expect, measured", [
    ({"metric": "updates", "eq": 3}, 3), ({"metric": "ok", "eq": True}, True), ({"metric": "g", "gt": 0}, 2.0),
    ({"metric": "err", "le": 1e-12}, float("nan")),
])
def test_equality_and_zero_limits_have_no_headroom_number(expect, measured):
    assert evaluate(expect, {expect["metric"]: measured}, "float64")["headroom"] is None


def test_a_failure_reads_as_a_true_statement():
    r = evaluate({"metric": "max_rel_err", "le": 1e-12}, {"max_rel_err": 0.356}, "float64")
    assert describe(r) == "max_rel_err 0.356 > limit 1e-12"
    assert describe(evaluate({"metric": "n", "ge": 48}, {"n": 3}, "float64")) == "n 3 < limit 48"
    assert describe(evaluate({"metric": "updates", "eq": 3}, {"updates": 3}, "float64")) == "updates 3 = 3 (held)"
    assert describe(evaluate({"metric": "updates", "eq": 3}, {"updates": 2}, "float64")) == \
        "updates 2 != 3 (not held)"


def _result(contract, records, status="passed", seed=42, dtype="float64"):
    return {"contract": contract, "kind": "value", "seed": seed, "dtype": dtype, "status": status,
            "expectations": records, "message": None}


def test_worst_skips_equality_sanity_checks():
    sanity = evaluate({"metric": "updates", "eq": 3}, {"updates": 3}, "float64")  # margin 0: the old "worst"
    err = evaluate({"metric": "max_abs_err", "le": 1e-12}, {"max_abs_err": 3e-16}, "float64")
    nonzero = evaluate({"metric": "grad_norm", "gt": 0}, {"grad_norm": 1e-9}, "float64")
    assert sanity["margin"] < err["margin"]
    assert worst_expectation([sanity, nonzero, err]) is err
    (d,) = contract_digest([_result("c", [sanity, nonzero, err])]).values()
    assert d[4][:3] == ["max_abs_err", 3e-16, "le"] and d[4][4] == pytest.approx(1e-12 / 3e-16)
    # a failed sanity check is the worst there is; with nothing scaled, the sanity check is all there is
    broken = evaluate({"metric": "updates", "eq": 3}, {"updates": 2}, "float64")
    assert worst_expectation([err, broken]) is broken
    assert worst_expectation([sanity]) is sanity


def test_an_integer_limit_is_a_count_held_not_a_headroom_of_1x():
    from engine.run.expect import is_sanity

    picks = evaluate({"metric": "max_picks_per_prompt", "le": 3}, {"max_picks_per_prompt": 3}, "float64")
    cases = evaluate({"metric": "binding_cases", "ge": 1}, {"binding_cases": 1}, "float64")
    err = evaluate({"metric": "max_rel_err", "le": 1e-6}, {"max_rel_err": 2e-7}, "float64")
    assert picks["headroom"] == 1.0  # the receipt keeps the ratio; only the choice of "worst" skips it
    assert is_sanity(picks) and is_sanity(cases) and not is_sanity(err)
    assert worst_expectation([picks, cases, err]) is err
    over = evaluate({"metric": "max_picks_per_prompt", "le": 3}, {"max_picks_per_prompt": 4}, "float64")
    assert worst_expectation([over, err]) is over and describe(over) == "max_picks_per_prompt 4 > limit 3"


def test_the_tuis_latest_value_is_the_error_against_the_reference(tmp_path, monkeypatch):
    from tui import data

    sanity = evaluate({"metric": "updates", "eq": 3}, {"updates": 3}, "float64")
    err = evaluate({"metric": "max_abs_err", "le": 1e-12}, {"max_abs_err": 3e-16}, "float64")
    (d,) = contract_digest([_result("c", [sanity, err])]).values()
    assert data.describe(data._expectation_record(d[4])) == "max_abs_err 3e-16 <= 1e-12 (10^3.5x headroom)"
    assert data._worst_cell(data._expectation_record(d[4]), {"cpu": ("passed", "fresh")}) == "10^3.5x"
    (only_sanity,) = contract_digest([_result("c", [sanity])]).values()
    assert data._worst_cell(data._expectation_record(only_sanity[4]), {}) == "held"


# --- the grouped failure report ----------------------------------------------------------------------------------


def test_a_planted_failure_prints_one_block_whose_repro_fails_alone(tight_specs, monkeypatch):
    specs, receipts, line = tight_specs
    monkeypatch.setenv("COLUMNS", "300")  # the header whole on one line, whatever the terminal running the suite
    r = invoke("check", "tapo-trajectory", "--only", "prefix_ratio_forward", "--seeds", "42,43",
               "--specs", str(specs), "--receipts", str(receipts))
    assert r.exit_code == 1, r.output
    err = r.stderr
    blocks = [l for l in err.splitlines() if l.startswith("FAILED")]
    assert blocks == [f"FAILED math prefix_ratio_forward ({specs / SPEC.name}:{line}, formula prefix_ratio): "
                      "did not hold, 2 of 8 seed x dtype cells failed"], err
    # the summary counts the tiers apart: the maths failed, no budget was run
    assert "tiers: math 0/1 contracts held (1 failed); budget none" in r.stdout, r.stdout
    assert re.search(r"^  max_rel_err \S+ \.\. \S+ > limit 1e-09 \(2 cells; float32\)$", err, re.M), err
    assert "<=" not in err and "seed 42 float32" not in err  # no true-looking rule, no line per cell
    assert err.count("survived") <= 1 and "survived: mutant" not in err  # consequences: one sentence at most
    (repro,) = [l.split("repro: ", 1)[1] for l in err.splitlines() if "repro: " in l]
    argv = shlex.split(repro)
    assert argv[:6] == ["contracts", "check", "tapo-trajectory", "--only", "prefix_ratio_forward", "--seeds"]
    # the first failing case of the kind's run: the repro reruns just that case
    assert argv[6] == "42" and argv[7] == "--case" and argv[8].isdigit()
    assert argv[9:] == ["--specs", str(specs), "--receipts", str(receipts)]
    again = invoke(*argv[1:])
    assert again.exit_code == 1, again.output
    assert "1 of 4 seed x dtype cells failed" in again.stderr


def _pred(**over):
    pred = {"method": "m", "status": "failed", "spec": {"name": "specs/m.yaml"}, "request": {"device": "cpu"},
            "results": [], "mutants": [], "unproven_contracts": [], "summary": {"contracts": {}}}
    return {**pred, **over}


def test_consequences_are_one_sentence_and_an_interrupt_lists_no_contract_that_never_ran():
    bad = [_result("a", [evaluate({"metric": "e", "le": 1e-9}, {"e": 1.0}, "float64")], "failed", seed=s)
           for s in (1, 2)]
    mutants = [{"id": f"m{i}", "description": "d", "killed": False, "killed_by": [], "expected_killers": ["a"],
                "results": [{"contract": "a", "baseline_passed": False}]} for i in range(5)]
    lines = failure_report(_pred(results=bad, mutants=mutants, unproven_contracts=["a"],
                                 summary={"contracts": {"a": {"requested": 2}}}))
    text = "\n".join(lines)
    assert sum("m0" in l for l in lines) == 1 and "5 mutants survived (m0, m1, m2, m3, m4)" in text
    assert "1 contract stayed unproven (a)" in text
    # interrupted before the mutant phase reached b and c: nothing is claimed about them
    lines = failure_report(_pred(status="interrupted", unproven_contracts=["b", "c"]))
    text = "\n".join(lines)
    assert "UNPROVEN" not in text and "never ran" in text


def _long_report(width):
    bad = [_result("prefix_ratio_forward", [evaluate({"metric": "max_rel_err", "le": 1e-9}, {"max_rel_err": 6e-8},
                                                     "float32")], "failed", seed=s) for s in (42, 43)]
    mutants = [{"id": f"fused_empty_rows_count_{i}", "description": "d", "killed": False, "killed_by": [],
                "expected_killers": ["prefix_ratio_forward"],
                "results": [{"contract": "prefix_ratio_forward", "baseline_passed": False}]} for i in range(6)]
    pred = _pred(results=bad, mutants=mutants, unproven_contracts=["prefix_ratio_forward"],
                 summary={"contracts": {"prefix_ratio_forward": {"requested": 12}}},
                 spec={"name": "/tmp/a/long/folder/for/the/tight/specs/tapo-trajectory.yaml"})
    return failure_report(pred, None, " --specs /tmp/a/long/folder/for/the/tight/specs --receipts /tmp/r", width=width)


def test_at_80_columns_the_report_wraps_its_prose_but_never_a_word_or_the_repro_command():
    whole, wrapped = _long_report(None), _long_report(80)
    assert any(len(l) > 80 for l in whole) and len(wrapped) > len(whole)
    (repro,) = [l for l in wrapped if l.startswith("  repro: ")]
    assert repro in whole and len(repro) > 80  # one line, to copy
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", l) for l in wrapped]  # the failure words may be coloured
    for line in plain:
        if line != repro and len(line) > 80:  # only a word longer than a line may overflow it
            assert " " not in line.strip(), line
    # only whitespace changed, and every line that does not begin one of the report's lines is an indented
    # continuation of the one before
    assert " ".join(" ".join(wrapped).split()) == " ".join(" ".join(whole).split())
    starts = [l.split()[0] for l in whole]
    cont = [l for l in wrapped if l.split()[0] not in starts or l.startswith("    ")]
    assert cont and all(l.startswith("  ") for l in cont)
    assert [l for l in plain if l.startswith("FAILED")] == ["FAILED math prefix_ratio_forward"]
    assert "fused_empty_rows_count_3" in "\n".join(wrapped)  # ids are never split at their underscores


def test_the_report_width_is_columns_else_the_terminal_and_nothing_when_piped(monkeypatch):
    from engine.cli import failure_report as F

    monkeypatch.setenv("COLUMNS", "93")
    assert F.report_width() == 93
    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr(F.sys, "stderr", io.StringIO())  # piped: logs are read whole
    assert F.report_width() is None


# --- colour, version, did you mean, --all ---------------------------------------------------------------------


def test_no_color_produces_no_escape_codes(tmp_path, monkeypatch):
    store = tmp_path / "receipts"
    store.mkdir()  # empty: the gate is closed (a store that is not there is exit 2)
    monkeypatch.delenv("NO_COLOR", raising=False)
    coloured = invoke("gate", "tapo-trajectory", "--receipts", str(store), color=True)
    assert coloured.exit_code == 1 and ESC in coloured.output  # UNMET is coloured on a terminal
    monkeypatch.setenv("NO_COLOR", "1")
    plain = invoke("gate", "tapo-trajectory", "--receipts", str(store), color=True)
    assert plain.exit_code == 1 and "UNMET" in plain.output and ESC not in plain.output
    bad = [_result("a", [evaluate({"metric": "e", "le": 1e-9}, {"e": 1.0}, "float64")], "failed")]
    assert not any(ESC in l for l in failure_report(_pred(results=bad)))


def test_version_prints_the_package_version():
    r = invoke("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"contracts (paper-contracts) {version('paper-contracts')}"


@pytest.mark.parametrize("args, hint", [
    (("check", "tapo-trajectory", "--only", "clip-schedule"), "did you mean 'clip_schedule'?"),
    (("check", "tapo_trajectory"), "did you mean 'tapo-trajectory'?"),
    (("check", "tapo-trajectroy"), "did you mean 'tapo-trajectory'?"),
])
def test_did_you_mean(args, hint):
    r = invoke(*args)
    assert r.exit_code == 2 and hint in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_closest_keeps_unrelated_names_unsuggested():
    assert closest("loss-forward", ["loss_forward", "clip_schedule"]) == "loss_forward"
    assert closest("banana", ["loss_forward", "clip_schedule"]) is None


def test_check_all_ends_with_a_summary_line(tight_specs):
    specs, receipts, _ = tight_specs
    r = invoke("check", "--all", "--seeds", "42", "--no-mutants", "--specs", str(specs), "--receipts", str(receipts))
    assert r.exit_code == 1, r.output
    assert r.stdout.rstrip().splitlines()[-1] == "checked 1 method: 0 passed, 1 failed; 1 receipt written (1 partial)"
