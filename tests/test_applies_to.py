"""A contract about how the registered implementation is built (`applies_to: registered`) never binds a candidate:
its plan, its evolve stages, its gate and its receipt's coverage leave it out, and `show`, `interface` and the
receipt say so. `show` prints each contract's parameters as YAML within 80 columns, and `interface` lists every
rule the contracts hold an implementation to, generated from the spec."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from engine.cli import app
from engine.spec.loader import load_spec

ROOT = Path(__file__).resolve().parent.parent
METHODS = ["grpo", "gspo", "mrtpo", "tapo-trajectory", "tar-adaptive-replay"]
INTERNAL = {"tapo-trajectory": {"fused_matches_composed"}, "mrtpo": {"js_column_blocks", "weights_from_logits"}}
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def _spec(method: str):
    return load_spec(ROOT / "specs" / f"{method}.yaml", ROOT)


def _raw(method: str) -> dict:
    return YAML(typ="safe").load((ROOT / "specs" / f"{method}.yaml").read_text())


# --- the spec says whom a contract binds --------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_show_json_marks_every_contract_applies_to(method):
    data = json.loads(invoke("show", method, "--json").stdout)
    marks = {c["id"]: c["applies_to"] for c in data["spec"]["contracts"]}
    assert set(marks.values()) <= {"any", "registered"}
    assert {c for c, v in marks.items() if v == "registered"} == INTERNAL.get(method, set())
    assert data["applies_to"]["registered"] == sorted(INTERNAL.get(method, set()), key=list(marks).index)
    assert data["applies_to"]["any"] == [c for c, v in marks.items() if v == "any"]


def test_an_unknown_applies_to_is_a_spec_error(tmp_path):
    text = (ROOT / "specs" / "tapo-trajectory.yaml").read_text().replace("applies_to: registered", "applies_to: mine")
    (tmp_path / "tapo-trajectory.yaml").write_text(text)
    r = invoke("validate", str(tmp_path / "tapo-trajectory.yaml"))
    assert r.exit_code == 2 and "applies_to" in r.output


# --- a candidate's run, stages, gate and coverage -------------------------------------------------------------------


def test_a_candidate_plan_runs_no_registered_only_contract_nor_the_mutants_only_they_kill():
    from engine.errors import NothingSelected
    from engine.run.runner import for_candidate, plan_run

    spec = _spec("tapo-trajectory")
    plan = for_candidate(plan_run(spec))
    assert "fused_matches_composed" not in {c["id"] for c in plan.contracts}
    assert plan.registered_only == ["fused_matches_composed"]
    assert all("fused_matches_composed" not in m["killed_by"] for m in plan.mutants)
    # a mutant that another contract kills too stays, with its other killers
    kept = {m["id"]: m["killed_by"] for m in plan.mutants}
    assert kept["fused_empty_rows_count"] == ["zero_advantage_rejection"]
    # selected or not, the spec's registered-only contracts are named as not run (the coverage leaves them out)
    assert for_candidate(plan_run(spec, only=["loss_forward"])).registered_only == ["fused_matches_composed"]
    with pytest.raises(NothingSelected, match="applies_to: registered"):
        for_candidate(plan_run(spec, only=["fused_matches_composed"]))
    # the registered implementation's own plan keeps it
    assert "fused_matches_composed" in {c["id"] for c in plan_run(spec).contracts}


def test_check_impl_of_only_a_registered_contract_selects_nothing(tmp_path):
    r = invoke("check", "tapo-trajectory", "--impl", str(ROOT / "tests" / "fixtures" / "my_tapo.py"),
               "--only", "fused_matches_composed", "--receipts", str(tmp_path / "r"))
    assert r.exit_code == 5, r.output
    assert "applies_to: registered" in r.output and not (tmp_path / "r" / "tapo-trajectory").exists()


def test_evolve_stages_never_need_a_registered_only_contract():
    from engine.evolve import stages

    data = _spec("mrtpo").data
    for stage in stages.STAGES:
        ids = set(stages.contract_ids(data, stage))
        assert ids and not ids & INTERNAL["mrtpo"]
    assert set(stages.contract_ids(data, 3)) == {c["id"] for c in data["contracts"]} - INTERNAL["mrtpo"]


def test_a_candidates_gate_and_coverage_do_not_ask_for_registered_only_contracts():
    from engine.gate.verdict import _device, _mutants
    from engine.spec.applies import candidate_view
    from engine.store.coverage import coverage

    spec = _spec("tapo-trajectory")
    held = candidate_view(spec.data)
    assert "fused_matches_composed" not in {c["id"] for c in held["contracts"]}
    assert "fused_no_overflow_fallback" in {m["id"] for m in held["mutants"]}  # overflow_gradient kills it too

    class Cmd:  # the suggested commands are not under test here
        def check(self, device):
            return ["contracts", "check"]

        def signing(self, device):
            return None

    req = _device(spec, "cpu", [], [], Cmd(), data=held)
    assert all(m["contract"] != "fused_matches_composed" for m in req["missing"])
    assert len(req["missing"]) == sum(len(c["dtypes"]) for c in held["contracts"]) * len(spec.data["budget"]["seeds"])
    # the registered implementation's gate still asks for it
    assert any(m["contract"] == "fused_matches_composed" for m in _device(spec, "cpu", [], [], Cmd())["missing"])
    mut = _mutants(spec, [], ["cpu"], Cmd(), data=held)
    assert "fused_matches_composed" not in mut["unproven"]
    # a candidate receipt that ran every contract it is held to is full, not "partial 14/15"
    ids = [c["id"] for c in held["contracts"]]
    pred = {"request": {"contracts": ids, "seeds": [42, 43, 44], "mutants": ["x"]}, "actual": {"mutants_run": 1},
            "summary": {"contracts": {c: {"requested": 1, "passed": 1} for c in ids}}, "status": "passed",
            "budget": {"seeds": [42, 43, 44]}, "registered_only": {"skipped": ["fused_matches_composed"]}}
    cov = coverage(pred, spec)
    assert cov.full and cov.total == len(ids), cov
    del pred["registered_only"]
    assert not coverage(pred, spec).full


# --- show: parameters as YAML ----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_show_prints_contract_parameters_as_yaml_within_80_columns(method, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    text = invoke("show", method).stdout
    section = text.split("contract parameters\n", 1)[1].split("\nmutants", 1)[0]
    spec = _raw(method)
    blocks = ("\n" + section).split("\n- ")[1:]
    assert len(blocks) == len(spec["contracts"])
    for c, block in zip(spec["contracts"], blocks):
        head, *rest = block.split("\n")
        assert head == f"{c['id']} ({c['kind']}, applies to {c.get('applies_to', 'any')})", head
        why = [line[len("    # "):] for line in rest if line.startswith("    # ")]
        if c.get("why"):
            assert " ".join(why) == f"why bespoke: {c['why']}"
        body = [line for line in rest if line.strip() and not line.startswith("    # ")]
        params = c.get("params") or {}
        if not params:
            assert body == ["    (no parameters)"]
            continue
        parsed = YAML(typ="safe").load("\n".join(line[4:] for line in body))
        assert json.loads(json.dumps(parsed)) == json.loads(json.dumps(params)), c["id"]
    long = [line for line in section.splitlines() if len(line) > 80 and " " in line.strip()]
    assert not long, long[:3]


def test_a_registered_only_contract_cannot_score_evolve_candidates(tmp_path):
    text = (ROOT / "specs" / "tapo-trajectory.yaml").read_text()
    text = text.replace("    contract: mechanism\n    metric: tapo_val_acc", "    contract: fused_matches_composed\n"
                        "    metric: tapo_val_acc")
    (tmp_path / "tapo-trajectory.yaml").write_text(text)
    r = invoke("validate", str(tmp_path / "tapo-trajectory.yaml"))
    assert r.exit_code == 2 and "a candidate never runs (applies_to: registered)" in r.output, r.output
