"""One read model (engine/store/overview.py, engine/store/browse.py): list, show, gate and the TUI say the same
about the same store, and an --impl candidate's receipts are a row of their own everywhere."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import engine.cli as cli
from engine.store import receipts as R
from engine.store.records import Receipt, describe
from tests import gate_support as G

CANDIDATE = "c" * 64


@pytest.fixture
def layout(tmp_path, monkeypatch):
    root, specs, receipts = G.toy_project(tmp_path, monkeypatch)
    G.approve(root, specs, receipts)  # a review of the spec as it is: the gate's review requirement
    return root, specs, receipts


def _invoke(*args: str) -> tuple[int, dict]:
    res = CliRunner().invoke(cli.app, list(args))
    return res.exit_code, json.loads(res.stdout)


def write_candidate(root, receipts, spec_path, **kw):
    """A receipt of an --impl candidate (engine/run/impl_loader.py's shape): its files are `impl:` subjects."""
    pred = G.predicate(spec_path, **kw)
    pred["implementation"] = {"kind": "external", "name": "toy", "target": "my_toy.py", "digest": CANDIDATE,
                              "files": ["impl:my_toy.py"]}
    subject = [{"name": "impl:my_toy.py", "digest": {"sha256": "d" * 64}},
               {"name": "src/toy.py", "digest": {"sha256": R.sha256_file(root / "src" / "toy.py")}},
               {"name": f"specs/{spec_path.name}", "digest": {"sha256": R.sha256_file(spec_path)}}]
    return R.write_receipt(receipts, R.statement(subject, pred))


def test_list_show_gate_and_the_tui_say_the_same_and_keep_a_candidate_apart(layout):
    root, specs, receipts = layout
    spec = specs / "toy.yaml"
    G.write(root, receipts, spec, comparisons=G.ahead(), created_at="2026-01-01T00:00:00.000000Z")
    # newer, failing, and of a candidate: it must not show as the registered implementation's newest or count for it
    write_candidate(root, receipts, spec, fail={("double-value", 1, "float64")}, created_at="2026-01-02T00:00:00.000000Z")
    where = ["--specs", str(specs), "--receipts", str(receipts)]

    code, listed = _invoke("list", *where, "--json")
    assert code == 0
    rows = {r["implementation"]: r for r in listed["methods"]}
    assert list(rows) == ["default", f"impl:{CANDIDATE}"]
    own, cand = rows["default"], rows[f"impl:{CANDIDATE}"]
    assert own["latest_receipt"]["count"] == 1 and cand["latest_receipt"]["count"] == 1
    assert own["latest_receipt"]["status"] == "passed" and cand["latest_receipt"]["status"] == "failed"
    assert cand["implementation_label"] == f"--impl my_toy.py ({CANDIDATE[:12]})"

    gate_code, gate = _invoke("gate", "toy", *where, "--json")
    assert gate_code == 0 and gate["promotable"] is True
    assert own["gate"] == {"promotable": gate["promotable"], "unmet": [r["id"] for r in gate["requirements"]
                                                                        if r["required"] and not r["met"]]}
    assert cand["gate"]["promotable"] is False and "device:cpu" in cand["gate"]["unmet"]

    _, shown = _invoke("show", "toy", *where, "--json")
    assert [(g["implementation"], g["promotable"], g["unmet"]) for g in shown["gate"]] == [
        (r["implementation"], r["gate"]["promotable"], r["gate"]["unmet"]) for r in listed["methods"]]
    outcomes = {r["implementation"]: r["outcome"] for r in shown["receipts"]}
    assert outcomes == {u: r["latest_receipt"]["outcome"] for u, r in rows.items()}

    code, tui = _invoke("tui", *where, "--json")
    assert code == 0
    by_unit = {m["implementation"]: m for m in tui["methods"]}
    assert list(by_unit) == ["default", f"impl:{CANDIDATE}"]
    for unit, m in by_unit.items():
        assert m["receipts"] == rows[unit]["latest_receipt"]["count"]
        assert m["newest_receipt"]["outcome"] == rows[unit]["latest_receipt"]["outcome"]
        assert m["newest_receipt"]["evidence"] == rows[unit]["latest_receipt"]["state"]
        assert (m["gate"]["verdict"] == "open") == rows[unit]["gate"]["promotable"]
        assert [u["what"].split(": ", 1)[0] for u in m["gate"]["unmet"]] == rows[unit]["gate"]["unmet"]
    # the registered implementation's view holds none of the candidate's failures
    assert all(c["status"] == "passed" for c in by_unit["default"]["contracts"])
    assert by_unit["default"]["summary"].startswith(f"{len(G.CONTRACTS)}/{len(G.CONTRACTS)} contracts passed")
    assert by_unit[f"impl:{CANDIDATE}"]["method"] == f"toy --impl my_toy.py ({CANDIDATE[:12]})"

    doc = _invoke("list", *where, "--json")[1]
    assert doc == listed  # reading changes nothing


def test_a_mutate_receipt_is_described_alike_in_list_and_the_tui(layout):
    root, specs, receipts = layout
    spec = specs / "toy.yaml"
    pred = G.predicate(spec, seeds=(1,))
    pred["mutation"] = {"mutants": 3, "killed": 3, "survived": 0, "timeout": 0, "equivalent": 0, "score": 1.0,
                        "threshold": 0.9, "passed": True, "complete": True, "survivors": [], "results": []}
    subject = [{"name": "src/toy.py", "digest": {"sha256": R.sha256_file(root / "src" / "toy.py")}},
               {"name": "specs/toy.yaml", "digest": {"sha256": R.sha256_file(spec)}}]
    R.write_receipt(receipts, R.statement(subject, pred))
    where = ["--specs", str(specs), "--receipts", str(receipts)]
    listed = _invoke("list", *where, "--json")[1]["methods"][0]["latest_receipt"]
    tui = _invoke("tui", *where, "--json")[1]["methods"][0]["newest_receipt"]
    assert listed["outcome"] == tui["outcome"] == "mutate 1.000 (full)"
    assert listed["coverage"]["label"] == tui["coverage"]["label"] == "full"


def test_the_typed_receipt_reads_what_the_file_says(layout):
    root, specs, receipts = layout
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), fail={("double-value", 2, "float64")})
    data = json.loads(path.read_bytes())
    rec = Receipt.from_statement(data)
    pred = data["predicate"]
    assert rec.receipt_id == pred["receipt_id"] and rec.device == "cpu" and rec.unit == "default"
    assert [(r.contract, r.seed, r.dtype, r.status) for r in rec.results] == [
        (r["contract"], r["seed"], r["dtype"], r["status"]) for r in pred["results"]]
    assert {m.id: m.killed for m in rec.mutants} == {m["id"]: m["killed"] for m in pred["mutants"]}
    assert rec.bound == {s["name"]: s["digest"]["sha256"] for s in data["subject"]}
    assert [c.formal for run in rec.mechanism for c in run.comparisons] == [True, True, True]
    assert describe(rec.status, rec.mutation, rec.coverage()).status == "failed"
    del data["predicate"]["results"][0]["dtype"]  # a field the verdict reads: the record refuses, never guesses
    with pytest.raises(KeyError):
        Receipt.from_statement(data)
