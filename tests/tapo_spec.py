"""The TAPO contracts and mutants as the tests use them, read from the spec.

specs/tapo-trajectory.yaml, loaded through the engine's own validator. Expectations are judged with the engine's own
`engine.run.expect.evaluate`, so the tests and `contracts check` cannot disagree on a verdict.
"""

from __future__ import annotations

from pathlib import Path

from engine.run.expect import applies, evaluate
from engine.spec.loader import load_spec

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "tapo-trajectory.yaml"
DATA = load_spec(SPEC).data
CONTRACTS = {c["id"]: c for c in DATA["contracts"]}
# bespoke contracts by their registered check (contracts a generic kind measures have check "kind:NAME")
BY_CHECK = {c["check"]: c for c in DATA["contracts"] if not c["check"].startswith("kind:")}
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
