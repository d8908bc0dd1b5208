"""Contract tiers: `math` (the paper's equations hold), `budget` (a memory or time limit against the problem
size) and `scale` (the paper's equations at the sizes users train at: 32k-token rows, batches of hundreds of
thousands of tokens, the page's vocabulary, counts past 2^15 and 2^16, the implementation's chunk boundaries).
Every report counts them apart, so a verdict says whether the maths, a budget or the maths at scale failed; a
run may select tiers (`check --tier math`), and is then partial. No torch here: the read-only verbs use it."""

from __future__ import annotations

TIERS = ("math", "budget", "scale")


def parse_tiers(values: list[str] | None) -> list[str] | None:
    """`--tier math --tier scale` or `--tier math,scale` as tiers in their canonical order; None: every tier.
    ValueError naming the valid tiers for anything else."""
    if not values:
        return None
    asked = [t.strip() for v in values for t in v.split(",") if t.strip()]
    bad = [t for t in asked if t not in TIERS and t != "all"]
    if bad or not asked:
        raise ValueError(f"--tier {', '.join(bad) or '(empty)'}: the tiers are {', '.join(TIERS)} (or all)")
    if "all" in asked:
        return None
    return [t for t in TIERS if t in asked]


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
