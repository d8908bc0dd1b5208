"""The promotion gate, promote/demote with the ledger, list's gate column, and torch-free read commands."""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.cli as cli
from engine.store import ledger
from engine.gate.verdict import evaluate
from engine.paths import default_specs_dir, project_root
from engine.gate.promote import StateNotFound, rewrite_state, with_state
from engine.spec.loader import load_spec, spec_files
from engine.gate.stats import paired_t_interval, t_quantile
from tests import gate_support as G

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def layout(tmp_path, monkeypatch):
    """A checkout in tmp with the toy spec, approved in the store's ledger; the static registry knows the toy
    names."""
    root, specs, receipts = G.toy_project(tmp_path, monkeypatch)
    G.approve(root, specs, receipts)
    return root, specs, receipts


def _gate(root, specs, receipts) -> dict:
    return evaluate(load_spec(specs / "toy.yaml", root), receipts, root, specs)


def _req(result: dict, rid: str) -> dict:
    return next(r for r in result["requirements"] if r["id"] == rid)


def _set_requires(specs: Path, old: str, new: str) -> None:
    """Edit the spec and review the edit (these tests are about other requirements; test_review.py about that)."""
    p = specs / "toy.yaml"
    text = p.read_text()
    assert old in text
    p.write_text(text.replace(old, new))
    G.approve(specs.parent, specs, specs.parent / "receipts")


def _invoke(*args: str):
    return CliRunner().invoke(cli.app, list(args))


# --- requirements, one by one ------------------------------------------------------


def test_no_receipts_closes_the_gate_with_a_reason_and_command_for_each(layout):
    root, specs, receipts = layout
    r = _gate(root, specs, receipts)
    assert not r["promotable"] and r["verdict"] == "not promotable" and r["justified_by"] == []
    assert _req(r, "review")["met"]
    assert _req(r, "device:cpu")["detail"] == "no fresh cpu receipt"
    assert _req(r, "device:cpu")["fix"] == "contracts check toy --device cpu"
    assert _req(r, "formal_comparison")["detail"].startswith("no formal comparison in any fresh cpu receipt")
    assert [x.split(":")[0] for x in r["reasons"]] == ["device", "mutants_killed", "formal_comparison"]
    assert all(" -> contracts check toy --device cpu" in x for x in r["reasons"])


def test_complete_fresh_evidence_opens_the_gate(layout):
    root, specs, receipts = layout
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    r = _gate(root, specs, receipts)
    rid = json.loads(path.read_bytes())["predicate"]["receipt_id"]
    assert r["promotable"] and r["reasons"] == [] and r["justified_by"] == [rid]
    ci = _req(r, "formal_comparison")["comparisons"][0]["ci"]
    assert ci["n"] == 3 and ci["low"] > 0


def test_review_not_done_closes_the_gate(layout):
    root, specs, receipts = layout
    _set_requires(specs, "review: DONE   # reviewed by hand", "review: IN-REVIEW")
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    r = _gate(root, specs, receipts)
    assert not r["promotable"] and len(r["reasons"]) == 1 and r["reasons"][0].startswith(
        "review: review is IN-REVIEW; the gate needs DONE; ledger entry 2 approves this spec -> finish the review, "
        "set promotion.review: DONE in ")


def test_a_required_cuda_receipt_cannot_be_replaced_by_cpu_ones(layout):
    root, specs, receipts = layout
    _set_requires(specs, "devices: [cpu]", "devices: [cpu, cuda]")
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    r = _gate(root, specs, receipts)
    assert _req(r, "device:cpu")["met"] and not _req(r, "device:cuda")["met"]
    assert _req(r, "device:cuda")["detail"] == "no fresh cuda receipt"
    assert "device:cuda: no fresh cuda receipt -> contracts check toy --device cuda" in r["reasons"]
    G.write(root, receipts, specs / "toy.yaml", device="cuda", comparisons=G.ahead())
    assert _gate(root, specs, receipts)["promotable"]


def test_missing_budget_seed_and_a_failure_elsewhere_both_block(layout):
    root, specs, receipts = layout
    G.write(root, receipts, specs / "toy.yaml", seeds=(1, 2), comparisons=G.ahead())
    dev = _req(_gate(root, specs, receipts), "device:cpu")
    assert not dev["met"]
    assert {(m["contract"], m["seed"], m["dtype"]) for m in dev["missing"]} == {
        ("double-value", 3, "float64"), ("double-value", 3, "float32"), ("mechanism", 3, "float32")}
    assert dev["detail"] == ("math 6/9, budget none, scale none; 3/9 contract results never passed in a fresh cpu "
                             "receipt: "
                             "double-value (seed 3 x float64,float32), mechanism (seed 3 x float32)")
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())  # complete, passing
    assert _req(_gate(root, specs, receipts), "device:cpu")["met"]
    G.write(root, receipts, specs / "toy.yaml", fail={("double-value", 2, "float32")}, comparisons=G.ahead())
    dev = _req(_gate(root, specs, receipts), "device:cpu")
    assert not dev["met"] and dev["missing"] == []  # a fresh failure blocks even beside a fresh pass
    assert [(f["contract"], f["seed"], f["dtype"], f["status"]) for f in dev["failed"]] == [
        ("double-value", 2, "float32", "failed")]


def test_the_device_requirement_counts_math_and_budget_apart_and_may_require_only_one(layout):
    """A verdict says whether the maths or a budget failed; a spec's promotion.requires.tiers may leave a tier
    reported but not required. The tiers come from the spec (older receipts record none)."""
    root, specs, receipts = layout
    _set_requires(specs, "    kind: mechanism\n    tier: math", "    kind: mechanism\n    tier: budget")
    G.write(root, receipts, specs / "toy.yaml", fail={("mechanism", 2, "float32")}, comparisons=G.ahead())
    dev = _req(_gate(root, specs, receipts), "device:cpu")
    assert not dev["met"]
    assert dev["tiers"] == {"math": {"cells": 6, "passed": 6, "required": True},
                            "budget": {"cells": 3, "passed": 2, "required": True},
                            "scale": {"cells": 0, "passed": 0, "required": True}}  # the toy has no scale contract
    assert dev["detail"].startswith("math 6/6, budget 2/3, scale none; ") and \
        "mechanism seed 2 float32 failed" in dev["detail"]
    _set_requires(specs, "    all_budget_seeds: true", "    all_budget_seeds: true\n    tiers: [math]")
    G.write(root, receipts, specs / "toy.yaml", fail={("mechanism", 2, "float32")}, comparisons=G.ahead())
    dev = _req(_gate(root, specs, receipts), "device:cpu")
    assert dev["met"], dev["detail"]  # the budget failure is reported, not required
    assert dev["detail"].startswith("8/9 contract results passed on cpu (math 6/6, budget 2/3 (not required), "
                                    "scale none (not required); ")
    _set_requires(specs, "    tiers: [math]", "    tiers: [math, budget]")
    assert not _req(_gate(root, specs, receipts), "device:cpu")["met"]


def test_a_candidate_needs_a_fresh_seed_receipt(layout):
    """The budget's seeds are public: beside them an --impl candidate needs a receipt on seeds drawn at run time
    in which every contract held; the registered implementation only when the spec asks (fresh_seeds: true)."""
    root, specs, receipts = layout
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    own = _req(_gate(root, specs, receipts), "fresh_seeds")
    assert own["met"] and not own["required"] and "registered implementation" in own["detail"]
    spec = load_spec(specs / "toy.yaml", root)
    cand = _req(evaluate(spec, receipts, root, specs, implementation="impl:" + "0" * 64), "fresh_seeds")
    assert cand["required"] and not cand["met"] and cand["argv"][-2:] == ["--seeds", "fresh"]
    _set_requires(specs, "    all_budget_seeds: true", "    all_budget_seeds: true\n    fresh_seeds: true")
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    r = _gate(root, specs, receipts)
    assert not _req(r, "fresh_seeds")["met"] and _req(r, "device:cpu")["met"]  # the budget seeds alone: not enough
    assert "no fresh cpu receipt with seeds drawn at run time" in _req(r, "fresh_seeds")["detail"]
    G.write(root, receipts, specs / "toy.yaml", seeds=(9001, 9002), seed_source="given")  # chosen, not drawn
    assert not _req(_gate(root, specs, receipts), "fresh_seeds")["met"]
    G.write(root, receipts, specs / "toy.yaml", seeds=(3952690999, 17), seed_source="fresh")
    r = _gate(root, specs, receipts)
    assert _req(r, "fresh_seeds")["met"] and "fresh seeds 3952690999,17" in _req(r, "fresh_seeds")["detail"], _req(r, "fresh_seeds")
    assert r["promotable"], r["reasons"]
    # a failure on a drawn seed is a failure: the device requirement closes, whatever else passed
    G.write(root, receipts, specs / "toy.yaml", seeds=(555,), seed_source="fresh", fail={("double-value", 555,
                                                                                           "float32")})
    assert not _req(_gate(root, specs, receipts), "device:cpu")["met"]


def test_one_seed_is_enough_when_all_budget_seeds_is_false(layout):
    root, specs, receipts = layout
    _set_requires(specs, "all_budget_seeds: true", "all_budget_seeds: false")
    _set_requires(specs, "formal_comparison: true", "formal_comparison: false")
    G.write(root, receipts, specs / "toy.yaml", seeds=(2,))
    r = _gate(root, specs, receipts)
    assert r["promotable"], r["reasons"]
    assert not _req(r, "formal_comparison")["required"]


def test_run_level_error_blocks(layout):
    root, specs, receipts = layout
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), errors=["budget: wall time over"],
            status="failed")
    dev = _req(_gate(root, specs, receipts), "device:cpu")
    assert not dev["met"] and "run errors" in dev["detail"]


def test_a_surviving_mutant_blocks(layout):
    root, specs, receipts = layout
    G.write(root, receipts, specs / "toy.yaml", mutants={"off-by-a-bit": False}, comparisons=G.ahead())
    m = _req(_gate(root, specs, receipts), "mutants_killed")
    assert not m["met"] and m["survived"] == ["off-by-a-bit"]
    assert m["unproven"] == ["double-value", "mechanism"]
    assert "survived every fresh cpu receipt: off-by-a-bit" in m["detail"]


# --- the formal comparison -------------------------------------------------------------


def _formal(root, specs, receipts, comparisons) -> dict:
    G.write(root, receipts, specs / "toy.yaml", comparisons=comparisons)
    return _req(_gate(root, specs, receipts), "formal_comparison")


def test_diagnostic_comparisons_never_count(layout):
    root, specs, receipts = layout
    f = _formal(root, specs, receipts, {s: [G.comparison(0.9, 0.1, formal=False)] for s in (1, 2, 3)})
    assert not f["met"] and f["diagnostic_only"] == 3 and f["comparisons"] == []
    assert "3 diagnostic-only comparison(s) recorded: they never count" in f["detail"]


def test_a_ci_that_includes_zero_does_not_count(layout):
    root, specs, receipts = layout
    diffs = {1: 0.10, 2: -0.05, 3: 0.20}
    f = _formal(root, specs, receipts, {s: [G.comparison(0.5 + d, 0.5)] for s, d in diffs.items()})
    ci = f["comparisons"][0]["ci"]
    mean, sd = 0.25 / 3, (((0.1 - 0.25 / 3) ** 2 + (-0.05 - 0.25 / 3) ** 2 + (0.2 - 0.25 / 3) ** 2) / 2) ** 0.5
    assert ci["low"] == pytest.approx(mean - 4.3026527 * sd / 3 ** 0.5) and ci["low"] < 0 < ci["high"]
    assert not f["met"] and "includes zero" in f["detail"]


def test_control_ahead_is_reported_as_such(layout):
    root, specs, receipts = layout
    f = _formal(root, specs, receipts, {s: [G.comparison(0.4 - 0.01 * s, 0.6)] for s in (1, 2, 3)})
    assert not f["met"] and "below zero: the control is ahead" in f["detail"]


def test_seeds_outside_the_budget_do_not_count(layout):
    root, specs, receipts = layout
    f = _formal(root, specs, receipts, G.ahead(seeds=(4, 5, 6)))
    assert not f["met"] and "budget seed(s) 1,2,3 not recorded" in f["detail"]


def test_lower_is_better_flips_the_difference(layout):
    root, specs, receipts = layout
    comps = {s: [dict(G.comparison(0.2 + 0.01 * s, 0.5), higher_is_better=False)] for s in (1, 2, 3)}
    f = _formal(root, specs, receipts, comps)
    assert f["met"] and f["comparisons"][0]["ci"]["mean_diff"] == pytest.approx(0.28)


def test_one_losing_formal_comparison_outweighs_a_winning_one(layout):
    root, specs, receipts = layout
    comps = {s: [G.comparison(0.9, 0.5 - 0.01 * s), G.comparison(0.5, 0.9 - 0.01 * s, name="other")]
             for s in (1, 2, 3)}
    f = _formal(root, specs, receipts, comps)
    assert not f["met"] and [c["ahead"] for c in f["comparisons"]] == [True, False]


def test_paired_t_interval_by_hand():
    ci = paired_t_interval([0.10, 0.20, 0.15])  # mean 0.15, sd 0.05, t(0.975, 2) = 4.302653
    half = 4.3026527 * 0.05 / 3 ** 0.5
    assert (ci["low"], ci["high"], ci["df"]) == (pytest.approx(0.15 - half), pytest.approx(0.15 + half), 2)
    with pytest.raises(ValueError):
        paired_t_interval([0.1])


def test_t_quantiles_match_tables():
    for df, table in [(1, 12.7062047), (2, 4.3026527), (4, 2.7764451), (10, 2.2281389), (30, 2.0422725)]:
        assert t_quantile(0.975, df) == pytest.approx(table, abs=1e-6)


# --- receipts that do not count ----------------------------------------------------------


def test_stale_and_tampered_receipts_do_not_count_and_are_named(layout):
    root, specs, receipts = layout
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    forged = path.parent / "20990101T000000000000Z_toy_forged.json"
    forged.write_bytes(path.read_bytes().replace(b'"status": "passed"', b'"status": "passeD"', 1))
    (root / "src" / "toy.py").write_text("def double(x):\n    return x * 2\n")
    r = _gate(root, specs, receipts)
    assert not r["promotable"]
    assert _req(r, "device:cpu")["detail"] == "no fresh cpu receipt (1 stale cpu receipt(s) no longer count)"
    assert r["receipts"]["stale"][0]["changed"] == ["src/toy.py"]
    assert any(w.startswith(f"stale receipt toy/{path.name}") and "src/toy.py" in w for w in r["warnings"])
    assert any(w.startswith("tampered receipt toy/20990101T000000000000Z_toy_forged.json") for w in r["warnings"])


def test_promoted_spec_with_a_closed_gate_warns(layout):
    root, specs, receipts = layout
    _set_requires(specs, 'state: "not-promoted"', 'state: "promoted"')
    r = _gate(root, specs, receipts)
    assert any("says promoted but the gate is closed: contracts demote toy" in w for w in r["warnings"])


# --- CLI: gate, promote, demote, list ----------------------------------------------------------


def test_gate_cli_exit_codes_and_json_match_the_published_schema(layout):
    from jsonschema import Draft202012Validator

    root, specs, receipts = layout
    schema = json.loads((REPO / "engine" / "schemas" / "gate.schema.json").read_text())
    args = ["gate", "toy", "--specs", str(specs), "--receipts", str(receipts)]
    closed = _invoke(*args, "--json")
    assert closed.exit_code == 1
    Draft202012Validator(schema).validate(json.loads(closed.stdout))
    assert f"--receipts {receipts}" in json.loads(closed.stdout)["reasons"][0]  # the fix names the same store
    text = _invoke(*args)
    assert text.exit_code == 1 and text.stdout.startswith("toy: NOT PROMOTABLE")
    unmet = [ln for ln in text.stdout.splitlines() if ln.startswith("  UNMET ")]
    assert len(unmet) == 3 and all(" -> contracts check toy --device cpu" in ln for ln in unmet)
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    opened = _invoke(*args, "--json")
    assert opened.exit_code == 0 and json.loads(opened.stdout)["promotable"] is True
    Draft202012Validator(schema).validate(json.loads(opened.stdout))


def _parses(argv: list[str]) -> None:
    """argv names a verb of this CLI and options it takes, as typer/click would parse them (nothing runs)."""
    import typer.main

    group = typer.main.get_command(cli.app)
    assert argv[0] == "contracts" and len(argv) > 2, argv
    ctx = group.context_class(group, info_name="contracts")
    verb = group.get_command(ctx, argv[1])
    assert verb is not None, argv
    verb.make_context(argv[1], list(argv[2:]), parent=ctx)  # raises on an unknown option or a missing value


def _fixes(doc: dict) -> list[dict]:
    return [r for r in doc["requirements"] if not r["met"]] + doc["receipts"].get("refused", [])


def test_every_fix_is_a_command_to_run_as_it_is_or_null_with_a_note(layout, tmp_path):
    from jsonschema import Draft202012Validator

    root, specs, receipts = layout
    schema = json.loads((REPO / "engine" / "schemas" / "gate.schema.json").read_text())
    args = ["gate", "toy", "--specs", str(specs), "--receipts", str(receipts), "--json"]
    seen: dict[str, object] = {}

    def gate(*extra):
        res = _invoke(*args, *extra)
        assert res.exit_code == 1, res.output
        doc = json.loads(res.stdout)
        Draft202012Validator(schema).validate(doc)
        for r in _fixes(doc):
            assert r["fix"] is None or set(r["fix"]) == {"argv"}, r
            if r["fix"] is None:
                assert r["note"], r  # no command: the note says what would meet it
            else:
                _parses(r["fix"]["argv"])
                assert r["fix"]["argv"][5 if r["fix"]["argv"][1] == "check" else 3:][:4] == [
                    "--specs", str(specs), "--receipts", str(receipts)]
            seen.setdefault(r.get("id", "refused"), r["fix"])
        return doc

    nothing = gate()  # no receipts at all: running the check meets each requirement
    assert {r["id"]: r["fix"]["argv"][:5] for r in _fixes(nothing)} == {
        rid: ["contracts", "check", "toy", "--device", "cpu"] for rid in ("device:cpu", "mutants_killed",
                                                                         "formal_comparison")}
    _set_requires(specs, "review: DONE   # reviewed by hand", "review: IN-REVIEW")
    review = _req(gate(), "review")
    assert review["fix"] is None and review["note"].startswith("finish the review")
    _set_requires(specs, "review: IN-REVIEW", "review: DONE")
    # the mechanism ran and recorded only a diagnostic comparison: running the same code again adds none
    G.write(root, receipts, specs / "toy.yaml", comparisons={s: [G.comparison(0.9, 0.5, formal=False)]
                                                             for s in (1, 2, 3)})
    formal = _req(gate(), "formal_comparison")
    assert formal["fix"] is None and "formal=True" in formal["note"]
    # a failure in a fresh receipt keeps the gate closed until what measured changes
    G.write(root, receipts, specs / "toy.yaml", fail=[("double-value", 1, "float64")], comparisons=G.ahead())
    cpu = _req(gate(), "device:cpu")
    assert cpu["fix"] is None and "fix the implementation or the spec" in cpu["note"]
    text = _invoke(*args[:-1])  # people read the same as one line: the command, or the note
    assert "UNMET device:cpu: " in text.stdout
    assert "-> fresh cpu receipts record failures: fix the implementation or the spec" in text.stdout
    _set_requires(specs, "    formal_comparison: true\n", "    formal_comparison: true\n    mutation_score: 0.9\n")
    mutate = _req(gate("--impl", str(root / "src" / "toy.py")), "mutation_score")["fix"]["argv"]
    assert mutate[:3] == ["contracts", "mutate", "toy"] and "--impl" not in mutate  # mutate takes none
    assert set(seen) >= {"review", "device:cpu", "mutants_killed", "formal_comparison", "mutation_score"}


def test_gate_cli_user_errors_are_one_line(layout):
    root, specs, receipts = layout
    res = _invoke("gate", "nosuch", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 2 and "valid methods: toy" in res.stderr and "Traceback" not in res.output
    (specs / "toy.yaml").write_text(G.SPEC_TEXT.replace("level: L1", "level: L9"))
    res = _invoke("gate", "toy", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "$.level" in res.stderr


def test_promote_refused_while_the_gate_is_closed(layout):
    root, specs, receipts = layout
    before = (specs / "toy.yaml").read_bytes()
    lines = ledger.ledger_path(receipts).read_text()
    res = _invoke("promote", "toy", "--reason", "want it", "--specs", str(specs), "--receipts", str(receipts),
                  "--allow-unsigned")
    assert res.exit_code == 1 and "not promoted: the gate is closed" in res.stderr
    assert (specs / "toy.yaml").read_bytes() == before
    assert ledger.ledger_path(receipts).read_text() == lines  # the review only


def test_promote_rewrites_only_the_state_line_and_ledgers_then_demote(layout):
    root, specs, receipts = layout
    spec = specs / "toy.yaml"
    path = G.write(root, receipts, spec, comparisons=G.ahead())
    rid = json.loads(path.read_bytes())["predicate"]["receipt_id"]
    before = spec.read_text()
    args = ["--specs", str(specs), "--receipts", str(receipts)]
    res = _invoke("promote", "toy", "--reason", "all evidence fresh", "--by", "evolve", *args, "--json",
                  "--allow-unsigned")
    assert res.exit_code == 0, res.output
    after = spec.read_text()
    changed = [ln for ln in difflib.ndiff(before.splitlines(), after.splitlines()) if ln[:1] in "+-"]
    assert changed == ['-   state: "not-promoted"    # the gate decides; promote rewrites only this value',
                       '+   state: "promoted"    # the gate decides; promote rewrites only this value']
    entry = json.loads(ledger.ledger_path(receipts).read_text().splitlines()[1])  # after the review
    assert entry["review"] == 1 and entry["unsigned"] is True and entry["trust"] is None
    assert {k: entry[k] for k in ("seq", "method", "action", "old_state", "new_state", "reason", "by", "receipts")} == {
        "seq": 2, "method": "toy", "action": "promote", "old_state": "not-promoted", "new_state": "promoted",
        "reason": "all evidence fresh", "by": "evolve", "receipts": [rid]}
    assert entry["at"].endswith("Z") and "git" in entry and entry["spec"]["sha256_after"] == G.sha(spec)
    assert json.loads(res.stdout)["ledger_entry"] == entry

    # promoting changed the spec's bytes, yet the receipt still counts: only promotion.state differs
    assert _gate(root, specs, receipts)["promotable"]
    again = _invoke("promote", "toy", "--reason", "again", *args, "--allow-unsigned")
    assert again.exit_code == 0 and "already promoted" in again.stderr
    assert len(ledger.ledger_path(receipts).read_text().splitlines()) == 2

    (root / "src" / "toy.py").write_text("def double(x):\n    return x + x\n")  # gate closes; demote still works
    res = _invoke("demote", "toy", "--reason", "source changed", *args)
    assert res.exit_code == 0, res.output
    assert spec.read_text() == before
    lines = ledger.ledger_path(receipts).read_text().splitlines()
    assert [json.loads(ln)["action"] for ln in lines] == ["review", "promote", "demote"]
    assert json.loads(lines[2])["receipts"] == [] and json.loads(lines[2])["gate"]["promotable"] is False
    assert _invoke("verify", *args).exit_code == 0


def test_empty_reason_is_a_usage_error(layout):
    root, specs, receipts = layout
    res = _invoke("demote", "toy", "--reason", "  ", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 2 and "--reason is empty" in res.stderr


@pytest.mark.parametrize("written, expected", [
    ("  state: not-promoted\n", "  state: promoted\n"),
    ("  state: 'not-promoted'  # c\n", "  state: 'promoted'  # c\n"),
    ('  state: "not-promoted"\n', '  state: "promoted"\n'),
])
def test_with_state_keeps_quoting_and_comments(written, expected):
    text = f"a: 1\npromotion:\n  review: DONE\n{written}  reasons: []\n"
    assert with_state(text, "promoted") == f"a: 1\npromotion:\n  review: DONE\n{expected}  reasons: []\n"


@pytest.mark.parametrize("text", [
    "a: 1\npromotion:\n  review: DONE\n  state: not-promoted\n  reasons: []\n",
    "a: 1\npromotion:\n  state: 'not-promoted'  # c\n",
    't: "é ü 中"\npromotion:\n  state: "promoted"\n',
    "promotion: {review: DONE, state: promoted}\n",
    "x: 1\r\npromotion:\r\n  state: promoted\r\n",
    "promotion:\n  state: &s promoted\n",  # an anchor: not the plain subset, the round trip decides
])
def test_the_fast_state_position_is_the_round_trips_or_none(text, monkeypatch):
    from engine.gate import promote

    fast = promote._fast_state_span(text)
    monkeypatch.setattr(promote, "_fast_state_span", lambda t: None)
    try:
        slow = promote.state_span(text)
    except StateNotFound:
        slow = None
    assert fast is None or fast == slow, (fast, slow)
    assert fast is not None or "&s" in text or "\r" in text


def test_with_state_on_a_flow_mapping_and_crlf():
    assert with_state("promotion: {review: DONE, state: promoted}\n", "not-promoted") == \
        "promotion: {review: DONE, state: not-promoted}\n"
    assert with_state("x: 1\r\npromotion:\r\n  state: promoted\r\n", "not-promoted") == \
        "x: 1\r\npromotion:\r\n  state: not-promoted\r\n"


def test_rewrite_refuses_a_spec_changed_since_the_gate_read_it(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("promotion:\n  state: not-promoted\n")
    with pytest.raises(StateNotFound.__mro__[1]):
        rewrite_state(p, "promoted", expect_sha256="0" * 64)
    assert p.read_text() == "promotion:\n  state: not-promoted\n"


def test_list_shows_freshness_and_gate_verdict(layout):
    root, specs, receipts = layout
    args = ["list", "--specs", str(specs), "--receipts", str(receipts), "--json"]
    row = json.loads(_invoke(*args).stdout)["methods"][0]
    assert row["latest_receipt"] is None and row["gate"] == {
        "promotable": False, "unmet": ["device:cpu", "mutants_killed", "formal_comparison"]}
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    row = json.loads(_invoke(*args).stdout)["methods"][0]
    assert row["latest_receipt"]["state"] == "fresh" and row["gate"] == {"promotable": True, "unmet": []}
    (root / "src" / "toy.py").write_text("# edited\n")
    row = json.loads(_invoke(*args).stdout)["methods"][0]
    assert row["latest_receipt"]["state"] == "stale" and row["latest_receipt"]["changed"] == ["src/toy.py"]
    assert row["gate"]["promotable"] is False
    table = CliRunner().invoke(cli.app, ["list", "--specs", str(specs), "--receipts", str(receipts)],
                               env={"COLUMNS": "200"})
    assert "passed (full, stale)" in table.stdout and "closed (3 unmet)" in table.stdout


# --- the shipped specs ------------------------------------------------------------------------


@pytest.mark.parametrize("spec_file", spec_files(default_specs_dir()), ids=lambda p: p.stem)
def test_shipped_specs_are_not_promotable_and_say_why(spec_file):
    res = _invoke("gate", spec_file.stem, "--json")
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout)
    assert out["reasons"] and all(" -> " in r for r in out["reasons"])
    req = load_spec(spec_file, project_root()).data["promotion"]["requires"]
    unmet = {r["id"] for r in out["requirements"] if not r["met"]}
    if "cuda" in req["devices"]:
        assert "device:cuda" in unmet
    if req["formal_comparison"]:
        assert "formal_comparison" in unmet
    stale = out["receipts"]["stale"]
    lines = [w for w in out["warnings"] if "stale receipt" in w]  # one line however many: the store only grows
    assert len(lines) == min(len(stale), 1)
    if len(stale) > 1:
        assert lines[0].startswith(f"{len(stale)} stale receipts do not count (the newest, receipts/")
        assert lines[0].endswith(f"contracts verify {spec_file.stem} names each")
    for r in out["requirements"]:  # a pipeline runs argv as it is; with no command, the note says what would
        assert (r["fix"] is None) == (r["met"] or not r["fix"]) and (r["met"] or r["fix"] or r["note"])


# --- end to end, through the real runner, in a copy of the project -------------------------------


def _copy_project(dest: Path) -> Path:
    shutil.copytree(REPO / "engine", dest / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "methods").mkdir()
    shutil.copy(REPO / "methods" / "__init__.py", dest / "methods" / "__init__.py")
    shutil.copytree(REPO / "methods" / "common", dest / "methods" / "common",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "methods" / "toy").mkdir()
    (dest / "methods" / "toy" / "__init__.py").write_text(G.TOY_PACKAGE)
    (dest / "specs").mkdir()
    (dest / "specs" / "toy.yaml").write_text(G.SPEC_TEXT)
    return G.commit_all(dest)


def _contracts(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return G.contracts(cwd, *args, timeout=120)


@pytest.mark.slow
def test_end_to_end_gate_open_promote_then_stale_then_tampered(tmp_path):
    proj = _copy_project(tmp_path / "proj")
    run = _contracts(proj, "check", "toy", "--device", "cpu", "--json")
    assert run.returncode == 0, run.stderr
    assert _contracts(proj, "gate", "toy").returncode == 1  # no review in the ledger yet
    rev = _contracts(proj, "review", "toy", "--approve", "--reviewer", "R. Viewer", "--note", "read it")
    assert rev.returncode == 0 and "recorded in ledger entry 1" in rev.stdout, rev.stderr
    receipt = proj / json.loads(run.stdout)["runs"][0]["receipt"]
    rid = json.loads(receipt.read_bytes())["predicate"]["receipt_id"]

    # the real runner's receipt matches the published schema and opens the gate
    ver = _contracts(proj, "verify", "--json")
    assert ver.returncode == 0 and json.loads(ver.stdout)["counts"]["fresh"] == 1, ver.stdout
    gate = _contracts(proj, "gate", "toy", "--json")
    assert gate.returncode == 0, gate.stdout
    verdict = json.loads(gate.stdout)
    assert verdict["promotable"] and verdict["justified_by"] == [rid]
    formal = _req(verdict, "formal_comparison")
    assert formal["diagnostic_only"] == 3 and [c["name"] for c in formal["comparisons"]] == ["val-acc"]

    spec = proj / "specs" / "toy.yaml"
    before = spec.read_text()
    prom = _contracts(proj, "promote", "toy", "--reason", "toy evidence complete", "--allow-unsigned")
    assert prom.returncode == 0, prom.stderr
    diff = [ln for ln in difflib.ndiff(before.splitlines(), spec.read_text().splitlines()) if ln[:1] in "+-"]
    assert diff == ['-   state: "not-promoted"    # the gate decides; promote rewrites only this value',
                    '+   state: "promoted"    # the gate decides; promote rewrites only this value']
    entry = json.loads((proj / "receipts" / "ledger.jsonl").read_text().splitlines()[1])
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=proj, capture_output=True, text=True).stdout.strip()
    assert entry["receipts"] == [rid] and entry["git"]["commit"] == head and entry["new_state"] == "promoted"
    assert _contracts(proj, "gate", "toy").returncode == 0

    # one byte of a bound source file: the receipt goes stale and the gate closes
    src = proj / "methods" / "toy" / "__init__.py"
    original = src.read_bytes()
    src.write_bytes(original.replace(b"1e-3", b"2e-3"))
    closed = _contracts(proj, "gate", "toy")
    assert closed.returncode == 1
    assert "UNMET device:cpu: no fresh cpu receipt (1 stale cpu receipt(s) no longer count)" in closed.stdout
    assert f"warning: stale receipt receipts/toy/{receipt.name}" in closed.stdout and "methods/toy/__init__.py" in closed.stdout
    assert "says promoted but the gate is closed" in closed.stdout
    stale = _contracts(proj, "verify")
    assert stale.returncode == 0 and stale.stdout.startswith(f"stale    receipts/toy/{receipt.name}  passed, full")
    src.write_bytes(original)
    assert _contracts(proj, "gate", "toy").returncode == 0  # bound to content, not to time

    # one byte of the receipt: tampered
    raw = receipt.read_bytes()
    i = raw.index(b'"wall_s": ') + len(b'"wall_s": ')
    receipt.chmod(0o644)
    receipt.write_bytes(raw[:i] + (b"9" if raw[i:i + 1] != b"9" else b"8") + raw[i + 1:])
    tampered = _contracts(proj, "verify")
    assert tampered.returncode == 1 and tampered.stdout.startswith(f"tampered receipts/toy/{receipt.name}")
    assert "Traceback" not in tampered.stdout + tampered.stderr
    # and the ledger's entry now names a receipt that is no longer intact
    assert "names receipt(s) not in the store" in tampered.stdout
    assert _contracts(proj, "gate", "toy").returncode == 1


def test_read_only_commands_never_import_torch(tmp_path):
    root, specs, receipts = G.make_layout(tmp_path)
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    script = f"""
import sys
from typer.testing import CliRunner
from engine.spec import registry
from tests import gate_support as G
import engine.cli as cli
registry._STATIC = G.TOY_NAMES
from pathlib import Path
import engine.paths; engine.paths.project_root = lambda: Path({str(root)!r})
store = ["--specs", {str(specs)!r}, "--receipts", {str(receipts)!r}]
for args in (["verify", *store], ["gate", "toy", *store], ["list", *store], ["schema", "receipt"],
             ["gate", "toy", *store, "--json"], ["list", *store, "--json"]):
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code in (0, 1), (args, res.output)
    assert "torch" not in sys.modules, args
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def _write_on_policy(root, receipts, specs, kind, used_by=("mechanism",), **kw) -> Path:
    """A genuine receipt whose mechanism runs trained `kind` (`--policy hf:DIR`), as engine.run.runner records it."""
    from engine.store import receipts as R

    pred = G.predicate(specs / "toy.yaml", comparisons=G.ahead(), **kw)
    if kind is not None:
        pred["policy"] = {"kind": kind, "checkpoint": {"name": "tiny"}, "used_by": list(used_by)}
    subject = [{"name": n, "digest": {"sha256": R.sha256_file(p)}}
               for n, p in (("src/toy.py", root / "src" / "toy.py"), ("specs/toy.yaml", specs / "toy.yaml"))]
    return R.write_receipt(receipts, R.statement(subject, pred))


def test_a_page_whose_evidence_is_a_real_model_needs_a_passing_run_on_one(layout):
    """requires.policy: the tiny policies' receipts do not meet it; one whose mechanism trained an hf policy and
    passed every budget seed does; a failed seed, or a run in which the contract did not use the policy, does not."""
    root, specs, receipts = layout
    _set_requires(specs, "    formal_comparison: true\n",
                  "    formal_comparison: true\n    policy: {kind: hf, contracts: [mechanism]}\n")
    _write_on_policy(root, receipts, specs, None)
    req = _req(_gate(root, specs, receipts), "policy:hf")
    assert not req["met"] and "no fresh cpu receipt whose mechanism trained a hf policy" in req["detail"]
    assert req["argv"] is None and "--only mechanism --policy hf:DIR" in req["note"]
    _write_on_policy(root, receipts, specs, "hf", used_by=())  # --policy given, the mechanism not selected
    req = _req(_gate(root, specs, receipts), "policy:hf")
    assert not req["met"] and "mechanism did not train the hf policy" in req["detail"]
    _write_on_policy(root, receipts, specs, "hf", fail=[("mechanism", 2, "float32")])
    req = _req(_gate(root, specs, receipts), "policy:hf")
    assert not req["met"] and "mechanism seed 2 failed" in req["detail"]
    good = _write_on_policy(root, receipts, specs, "hf")
    result = _gate(root, specs, receipts)
    req = _req(result, "policy:hf")
    assert req["met"] and req["receipts"] and json.loads(good.read_text())["predicate"]["receipt_id"] in req["receipts"]
    assert req["contracts"] == ["mechanism"] and req["kind"] == "hf"
    # the sealed index the reading verbs use gives the same verdict
    res = _invoke("gate", "toy", "--specs", str(specs), "--receipts", str(receipts), "--json")
    doc = json.loads(res.stdout)
    assert _req(doc, "policy:hf")["met"] is True
