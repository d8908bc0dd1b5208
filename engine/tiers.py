"""Contract tiers: `math` (the paper's equations hold) and `budget` (a memory or time limit against the problem
size). Every report counts them apart, so a verdict says whether the maths or a budget failed. No torch here:
the read-only verbs use it."""

from __future__ import annotations

TIERS = ("math", "budget")


def tier_of(contract: dict) -> str:
    """A spec contract's (or a receipt summary entry's) tier; receipts written before tiers held maths only."""
    tier = contract.get("tier") if isinstance(contract, dict) else None
    return tier if tier in TIERS else "math"


def tier_counts(summary: dict) -> dict[str, dict]:
    """Per tier (both, even with no contract): contracts, those that held in every cell requested (held), those with a failed or
    errored cell (failed), and the rest (other: partial, not applicable, not all run). From a receipt's summary
    (`summary.contracts`), old receipts included."""
    out: dict[str, dict] = {t: {"contracts": 0, "held": 0, "failed": 0, "other": 0} for t in TIERS}
    for s in (summary.get("contracts") or {}).values():
        t = out[tier_of(s)]
        t["contracts"] += 1
        if s.get("failed") or s.get("error"):
            t["failed"] += 1
        elif s.get("passed") == s.get("requested"):
            t["held"] += 1
        else:
            t["other"] += 1
    return out
