"""OpenEvolve itself, offline, with the evaluator `contracts evolve-evaluator` writes.

OpenEvolve's library API (`run_evolution`) runs a few iterations in a process of its own against a loopback
OpenAI-compatible stub (tests/openai_stub.py, 127.0.0.1 only, started and stopped here) that proposes canned
SEARCH/REPLACE diffs of a plain-torch TAPO: two break a contract (the ratio scaled by 1.01; max instead of min in
the surrogate), two do not. Needs the [evolve] extra.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from engine.cli import app
from tests import evolve_support as es

# Found, not imported: OpenEvolve runs in a process of its own (evolve_support.run_openevolve), and importing it here
# (openai's types with it) cost every worker that collects this module about 2 CPU-s for one test.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("openevolve") is None,
                                reason="needs the [evolve] extra: pip install -e '.[evolve]'")

BROKEN = {"1.01 * prefix": "prefix_ratio_forward", "surrogate = torch.maximum(": "loss_forward"}


def _breaks(code: str) -> list[str]:
    return [contract for edit, contract in BROKEN.items() if edit in code]


@pytest.mark.slow
def test_openevolve_keeps_contract_breakers_at_zero_and_its_best_program_holds_every_contract(tmp_path):
    evaluator = tmp_path / "evaluator.py"
    # one seed keeps stages 2 and 3 short; stage 1 is what stops the broken candidates
    r = CliRunner().invoke(app, ["evolve-evaluator", "tapo-trajectory", "--out", str(evaluator), "--seeds", "42"])
    assert r.exit_code == 0, r.output
    iterations = 4
    with es.stub_server(tmp_path, es.REPLIES) as (port, log):
        data = es.run_openevolve(tmp_path, evaluator, port, iterations)
        requests = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(requests) == iterations and {q["model"] for q in requests} == {"stub"}

    programs = data["programs"]
    children = [p for p in programs if p.get("parent_id")]
    assert len(programs) == len(children) + 1 and len(children) >= 3, [p["metrics"] for p in programs]
    broken = [p for p in children if _breaks(p["code"])]
    holding = [p for p in programs if not _breaks(p["code"])]
    assert broken and len(holding) >= 2, "the canned diffs should give both kinds"
    for p in broken:
        assert p["metrics"]["combined_score"] == 0.0, p["metrics"]
        assert p["metrics"]["stage1_passed"] == 0.0 and "stage2_passed" not in p["metrics"]  # stopped at stage 1
        # the stage stops at its first broken contract (cheapest first): a child carrying both canned breaks names
        # the one that ran first, and only contracts it breaks
        named = [c for c in _breaks(p["code"]) if c in p["artifacts"]["failures"]]
        assert named, p["artifacts"]
        assert not [c for c in BROKEN.values() if c in p["artifacts"]["failures"] and c not in _breaks(p["code"])]
        assert "limit" in p["artifacts"]["failures"] and p["artifacts"]["receipt_id"]
    for p in holding:  # through all three stages
        m = p["metrics"]
        assert m["stage1_passed"] == m["stage2_passed"] == m["stage3_passed"] == 1.0, m
        assert 0.9 <= m["combined_score"] <= 1.0 and "failures" not in p["artifacts"]
    assert not _breaks(data["best_code"]) and data["best_score"] >= 0.9
    assert data["best_score"] == max(p["metrics"]["combined_score"] for p in programs)
    # every verdict is backed by a receipt in the evaluator's store
    store = tmp_path / "evolve-receipts" / "tapo-trajectory"
    ids = {json.loads(f.read_text())["predicate"]["receipt_id"] for f in store.glob("*.json")}
    assert {p["artifacts"]["receipt_id"] for p in programs} <= ids
