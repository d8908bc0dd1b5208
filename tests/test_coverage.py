"""Coverage of a receipt (engine/store/coverage.py): `full`, or `partial ran/total` with why, from the predicate
alone or from the receipt index's facts; and the receipt a diff compares with by default."""

from __future__ import annotations

import pytest

from engine.store.coverage import Coverage, coverage, facts, previous_full

SPEC = {"contracts": [{"id": c} for c in ("a", "b", "c")],
        "mutants": [{"id": "ma", "killed_by": ["a"]}, {"id": "mb", "killed_by": ["b", "c"]}],
        "budget": {"seeds": [42, 43]}}


def _pred(contracts=("a", "b", "c"), complete=None, only=None, mutants=("ma", "mb"), mutants_run=None,
          seeds=(42, 43), status="passed", device="cpu", created_at="2026-01-01T00:00:00Z", mutation=None):
    complete = contracts if complete is None else complete
    summary = {c: {"passed": 2 if c in complete else 1, "failed": 0, "error": 0, "requested": 2} for c in contracts}
    pred = {"request": {"seeds": list(seeds), "only": list(only) if only else None, "contracts": list(contracts),
                        "mutants": list(mutants)},
            "actual": {"mutants_run": len(mutants) if mutants_run is None else mutants_run},
            "summary": {"contracts": summary}, "budget": {"seeds": [42, 43]}, "status": status,
            "environment": {"device": {"kind": device}}, "created_at": created_at}
    if mutation is not None:
        pred["mutation"] = mutation
    return pred


def test_a_complete_run_is_full_with_or_without_the_spec():
    for spec in (None, SPEC):
        c = coverage(_pred(), spec)
        assert c == Coverage(full=True, ran=3, total=3, why=()) and c.label() == "full" and c.text() == "full"


@pytest.mark.parametrize("pred, label, why", [
    (_pred(contracts=("a",), only=("a",), mutants=("ma",)), "partial 1/3", "--only a"),
    (_pred(mutants=()), "partial 3/3", "--no-mutants"),
    (_pred(complete=("a",), status="interrupted"), "partial 1/3", "interrupted after 1 of 3 contracts"),
    (_pred(status="interrupted", mutants_run=1), "partial 3/3", "interrupted"),
    (_pred(mutants_run=1), "partial 3/3", "1 of 2 mutants ran"),
    (_pred(complete=("a", "b"), status="error"), "partial 2/3", "stopped early: 1 of 3 contracts did not finish"),
    (_pred(seeds=(42,)), "partial 3/3", "seeds 42 of the budget's 42,43"),
    (_pred(contracts=("a", "b")), "partial 2/3", "1 contract(s) of the spec are not in this run (added since)"),
])
def test_each_way_of_being_partial_is_named(pred, label, why):
    c = coverage(pred, SPEC)
    assert not c.full and c.label() == label and why in c.why, c
    assert c.text().startswith(label + ": ")
    assert coverage(facts(pred), SPEC) == c  # the index keeps facts: the same answer


def test_without_the_spec_a_selection_has_no_known_total():
    c = coverage(_pred(contracts=("a",), only=("a",), mutants=("ma",)))
    assert c.label() == "partial 1/?" and c.total is None


def test_only_on_a_contract_no_mutant_targets_is_not_called_no_mutants():
    spec = {**SPEC, "mutants": [{"id": "ma", "killed_by": ["a"]}]}
    c = coverage(_pred(contracts=("b",), only=("b",), mutants=()), spec)
    assert c.why == ("--only b",)


def test_mutate_receipts_are_judged_by_their_own_completeness():
    assert coverage(_pred(mutants=(), mutation={"complete": True}), SPEC).full
    # its baseline runs on one seed by design: not a partial run for that (list and the TUI say the same)
    one_seed = coverage(_pred(mutants=(), seeds=(42,), mutation={"complete": True}), SPEC)
    assert one_seed.full and one_seed.label() == "full"
    assert "seeds 42" in coverage(_pred(mutants=(), seeds=(42,)), SPEC).text()
    c = coverage(_pred(mutants=(), mutation={"complete": False}), SPEC)
    assert not c.full and "mutate on a selection" in c.text()


def test_odd_shapes_never_raise():
    for junk in ({}, {"request": "x", "summary": [], "actual": None}, {"summary": {"contracts": {"a": 3}}}):
        assert not coverage(junk, SPEC).full
    assert coverage({}).label() == "partial 0/0"


def test_previous_full_skips_partial_runs_other_devices_and_newer_receipts():
    old_full = _pred(created_at="2026-01-01T00:00:00Z")
    cuda_full = _pred(created_at="2026-01-02T00:00:00Z", device="cuda")
    newer_full = _pred(created_at="2026-01-03T00:00:00Z")
    partial = _pred(contracts=("a",), only=("a",), mutants=("ma",), created_at="2026-01-04T00:00:00Z")
    current = _pred(created_at="2026-01-05T00:00:00Z")
    later = _pred(created_at="2026-01-06T00:00:00Z")
    every = [old_full, cuda_full, newer_full, partial, current, later]
    assert previous_full(current, every, SPEC) is newer_full
    assert previous_full(newer_full, every, SPEC) is old_full
    assert previous_full(old_full, every, SPEC) is None
    # index summaries: device and created_at at the top, the facts under "coverage"
    rows = [{"device": _dev(p), "created_at": p["created_at"], "coverage": facts(p), "name": i}
            for i, p in enumerate(every)]
    assert previous_full(rows[4], rows, SPEC)["name"] == 2
    wrapped = [type("Row", (), {"entry": r})() for r in rows]
    assert previous_full(wrapped[4], wrapped, SPEC, summary=lambda row: row.entry) is wrapped[2]


def _dev(p):
    return p["environment"]["device"]["kind"]
