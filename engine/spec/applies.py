"""Which contracts a candidate implementation is held to (a contract's `applies_to`), torch-free.

A contract holds the paper, and then it binds every implementation (`applies_to: any`, the default). A contract
that tests how this repository's own implementation is built (a fused fast path against its composed form, a
chunked path against the unchunked one) says `applies_to: registered`: it runs on the registered implementation
and its mutants only, never for a candidate (`check --impl`, the evolve evaluator), whose gate does not ask for
it either. The candidate meets the paper's contracts on the same branch-covering inputs instead.
"""

from __future__ import annotations

from typing import Any

ANY, REGISTERED = "any", "registered"
APPLIES_TO = (ANY, REGISTERED)


def applies_to(contract: dict) -> str:
    """`any` (the default) or `registered`."""
    value = contract.get("applies_to", ANY)
    return value if value in APPLIES_TO else ANY


def for_candidates(contracts: list[dict]) -> list[dict]:
    """The contracts a candidate is held to, in spec order."""
    return [c for c in contracts if applies_to(c) == ANY]


def registered_only(data: dict) -> list[str]:
    """Ids of the contracts that run on the registered implementation only."""
    return [c["id"] for c in data.get("contracts") or [] if isinstance(c, dict) and applies_to(c) == REGISTERED]


def candidate_mutants(data: dict) -> list[dict]:
    """The spec's mutants, each with `killed_by` restricted to contracts a candidate is held to; a mutant that only
    registered-only contracts kill is left out (it plants a bug in a path only the registered implementation has)."""
    held = {c["id"] for c in for_candidates(data.get("contracts") or [])}
    out = []
    for m in data.get("mutants") or []:
        killers = [cid for cid in m.get("killed_by") or [] if cid in held]
        if killers:
            out.append({**m, "killed_by": killers})
    return out


def candidate_view(data: dict) -> dict[str, Any]:
    """Spec data as a candidate's gate reads it: only the contracts and mutants that apply to a candidate."""
    return {**data, "contracts": for_candidates(data["contracts"]), "mutants": candidate_mutants(data)}
