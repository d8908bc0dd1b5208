"""The TAPO contracts and mutants as the tests use them, read from the spec.

specs/tapo-trajectory.yaml (the lead's, authoritative) when it exists, else the helper's
proposal methods/tapo/spec_proposal.yaml. Expectations are judged with the engine's own
`engine.expect.evaluate`, so the tests and `contracts check` cannot disagree on a verdict.
"""

from __future__ import annotations

from pathlib import Path

from ruamel.yaml import YAML

from engine.expect import applies, evaluate

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "tapo-trajectory.yaml"
PROPOSAL = ROOT / "methods" / "tapo" / "spec_proposal.yaml"
SOURCE = SPEC if SPEC.is_file() else PROPOSAL

DATA = YAML(typ="safe", pure=True).load(SOURCE.read_text(encoding="utf-8"))
CONTRACTS = {c["id"]: c for c in DATA["contracts"]}
BY_CHECK = {c["check"]: c for c in DATA["contracts"]}
MUTANTS = {m["mutant"]: m for m in DATA["mutants"]}


def violations(contract: dict, dtype: str, measurements: dict) -> list[str]:
    """Every expectation of `contract` in `dtype` that `measurements` break (NaN breaks any)."""
    records = [evaluate(e, measurements, dtype) for e in contract["expect"] if applies(e, dtype)]
    if not records:
        return [f"no expectation applies to {dtype}"]
    return [
        r.get("message") or f"{r['metric']}={r['value']!r} not {r['op']} {r['threshold']!r}"
        for r in records
        if not r["passed"]
    ]
