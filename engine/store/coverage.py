"""How much of its spec a receipt covers: `full`, or `partial ran/total` with why.

A run is partial when it selected contracts (`--only`), skipped the mutant phase
(`--no-mutants`), ran fewer seeds than the budget names, was interrupted or
stopped early, or (for a stale receipt) predates contracts the spec has now. A
partial run can say "passed" about what it ran; every summary (`list`, `verify`,
`check`, the TUI) shows its coverage beside that word, so it never reads like a
full pass. One place decides it, here, from the predicate alone or from the
small `facts` the receipt index keeps; give the spec when you have it, so
`total` counts the spec's contracts even when the run selected a few.

This module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, TypeVar

FACTS_KIND = "coverage-facts/v1"
T = TypeVar("T")


@dataclass(frozen=True)
class Coverage:
    """full: every contract, every mutant and every budget seed ran to the end. ran: contracts whose every
    requested seed x dtype cell has a result; total: the spec's contracts (None when the run selected some and
    no spec was given); why: what made it partial, each a short phrase ('--only clip_schedule', 'interrupted')."""

    full: bool
    ran: int
    total: Optional[int]
    why: tuple[str, ...] = field(default_factory=tuple)

    def label(self) -> str:
        """`full` or `partial 1/10` (`partial 1/?` when the spec's size is unknown)."""
        if self.full:
            return "full"
        return f"partial {self.ran}/{'?' if self.total is None else self.total}"

    def text(self) -> str:
        """The label with why: `partial 1/10: --only clip_schedule`."""
        return self.label() + (f": {'; '.join(self.why)}" if self.why and not self.full else "")

    def as_dict(self) -> dict:
        return {"full": self.full, "label": self.label(), "ran": self.ran, "total": self.total, "why": list(self.why)}


def _ids(xs: Any) -> list[str]:
    return [x for x in xs or [] if isinstance(x, str)] if isinstance(xs, list) else []


def _ints(xs: Any) -> list[int]:
    return [x for x in xs or [] if isinstance(x, int) and not isinstance(x, bool)] if isinstance(xs, list) else []


def facts(pred: dict) -> dict:
    """The few fields of a predicate that coverage needs, as plain JSON (what the receipt index stores).

    Defensive: a field of the wrong shape reads as absent, never raises.
    """
    if isinstance(pred, dict) and pred.get("kind") == FACTS_KIND:
        return pred
    pred = pred if isinstance(pred, dict) else {}
    req = pred.get("request") if isinstance(pred.get("request"), dict) else {}
    actual = pred.get("actual") if isinstance(pred.get("actual"), dict) else {}
    summary = pred.get("summary") if isinstance(pred.get("summary"), dict) else {}
    per = summary.get("contracts") if isinstance(summary.get("contracts"), dict) else {}
    requested = _ids(req.get("contracts")) or sorted(k for k in per if isinstance(k, str))
    seeds = set(_ints(req.get("seeds")))
    ran_seeds: dict[str, set] = {}
    for r in pred.get("results") if isinstance(pred.get("results"), list) else []:
        if isinstance(r, dict) and isinstance(r.get("contract"), str):
            ran_seeds.setdefault(r["contract"], set()).add(r.get("seed"))
    complete, held_in_part = [], []
    for cid in requested:
        s = per.get(cid)
        if isinstance(s, dict) and isinstance(s.get("requested"), int):
            done = sum(s.get(k) for k in ("passed", "failed", "error") if isinstance(s.get(k), int))
            # partial / not_applicable cells: the implementation could not be held to all of the contract
            # (an adapted framework loss); they finished, but they do not make the contract covered
            part = sum(s.get(k) for k in ("partial", "not_applicable") if isinstance(s.get(k), int))
            if s["requested"] > 0 and done >= s["requested"]:
                complete.append(cid)
            elif s["requested"] > 0 and done + part >= s["requested"]:
                held_in_part.append(cid)
        elif cid in ran_seeds and seeds <= ran_seeds[cid]:  # no count in the summary: a result for every seed
            complete.append(cid)
    budget = pred.get("budget") if isinstance(pred.get("budget"), dict) else {}
    mutation = pred.get("mutation") if isinstance(pred.get("mutation"), dict) else None
    only = req.get("only")
    skipped = pred.get("registered_only") if isinstance(pred.get("registered_only"), dict) else {}
    tiers = req.get("tiers")
    return {
        "kind": FACTS_KIND,
        "only": _ids(only) if isinstance(only, list) and only else None,
        "case": req.get("case") if isinstance(req.get("case"), int) else None,  # check --case N: one case each
        "tiers": _ids(tiers) if isinstance(tiers, list) and tiers else None,  # check --tier: some tiers only
        "seed_source": req.get("seed_source") if isinstance(req.get("seed_source"), str) else None,
        "contracts": requested,
        "complete": complete,
        "held_in_part": held_in_part,
        "mutants": _ids(req.get("mutants")),
        "mutants_run": actual.get("mutants_run") if isinstance(actual.get("mutants_run"), int) else None,
        "seeds": _ints(req.get("seeds")),
        "budget_seeds": _ints(budget.get("seeds")),
        "status": pred.get("status") if isinstance(pred.get("status"), str) else None,
        "mutation_complete": None if mutation is None else mutation.get("complete") is True,
        # a candidate's run: the contracts it is not held to (applies_to: registered), out of its scope
        "registered_only": _ids(skipped.get("skipped")),
    }


def _spec_data(spec: Any) -> Optional[dict]:
    data = getattr(spec, "data", spec)
    return data if isinstance(data, dict) and isinstance(data.get("contracts"), list) else None


def coverage(pred: dict, spec: Any = None) -> Coverage:
    """The coverage of one receipt: its predicate (or its index `facts`), and the spec (a loaded Spec or its data)
    when known. Without a spec the receipt's own request stands in: the budget it recorded, and the contracts it
    selected (so `total` is None after --only)."""
    f = facts(pred)
    data = _spec_data(spec)
    not_held = set(f.get("registered_only") or ())
    spec_contracts = [c.get("id") for c in data["contracts"] if isinstance(c, dict) and c.get("id") not in not_held] \
        if data else None
    requested = f["contracts"]
    total = len(spec_contracts) if spec_contracts is not None else (None if f["only"] else len(requested))
    scope = set(spec_contracts) if spec_contracts is not None else set(requested)
    ran = sum(1 for c in f["complete"] if c in scope)
    why: list[str] = []
    if f["only"]:
        why.append("--only " + ",".join(f["only"]))
    if f.get("case") is not None:
        why.append(f"--case {f['case']}")
    if f.get("tiers"):
        from engine.tiers import TIERS

        why.append(f"--tier {','.join(f['tiers'])} ({', '.join(t for t in TIERS if t not in f['tiers'])} not run)")
    status = f["status"]
    in_part = [c for c in f.get("held_in_part") or [] if c in scope]
    unfinished = len([c for c in requested if c not in f["complete"] and c not in in_part])
    if in_part:
        why.append(f"{len(in_part)} contract(s) not applicable to this implementation or measured in part")
    if status == "interrupted":
        why.append(f"interrupted after {len(f['complete'])} of {len(requested)} contracts" if unfinished
                   else "interrupted")
    elif unfinished:
        why.append(f"stopped early: {unfinished} of {len(requested)} contracts did not finish")
    if f["mutation_complete"] is not None:  # a `contracts mutate` receipt: its mutants are source edits
        if not f["mutation_complete"]:
            why.append("mutate on a selection (--max-mutants, --only-file or --operators)")
    else:
        if data is not None:
            chosen = set(requested)
            expected = [m for m in data.get("mutants") or [] if isinstance(m, dict)
                        and chosen.intersection(m.get("killed_by") or [])]
        else:
            expected = None
        if not f["mutants"] and (expected if expected is not None else True):
            why.append("--no-mutants")
        elif f["mutants"] and isinstance(f["mutants_run"], int) and f["mutants_run"] < len(f["mutants"]) \
                and status != "interrupted":
            why.append(f"{f['mutants_run']} of {len(f['mutants'])} mutants ran")
    budget_seeds = [s for s in (data or {}).get("budget", {}).get("seeds", []) if isinstance(s, int)] \
        if data else f["budget_seeds"]
    missing = [s for s in budget_seeds if s not in f["seeds"]]
    # A `contracts mutate` run plants source edits and runs its baseline on one seed by design: what it claims is
    # its score over the mutants, so the budget's other seeds do not make it partial (it is full when it judged
    # every mutant); the gate counts its seeds apart, with the check receipts'.
    if missing and f["mutation_complete"] is None:
        drawn = "fresh seeds" if f.get("seed_source") == "fresh" else "seeds"
        why.append(f"{drawn} {','.join(map(str, f['seeds'])) or 'none'} of the budget's "
                   f"{','.join(map(str, budget_seeds))}" if drawn == "seeds" else
                   f"{drawn} {','.join(map(str, f['seeds']))}, not the budget's {','.join(map(str, budget_seeds))}")
    if spec_contracts is not None and not f["only"]:
        from engine.tiers import tier_of

        left_out = set() if not f.get("tiers") else \
            {c.get("id") for c in data["contracts"] if isinstance(c, dict) and tier_of(c) not in f["tiers"]}
        absent = [c for c in spec_contracts if c not in requested and c not in left_out]
        if absent:
            why.append(f"{len(absent)} contract(s) of the spec are not in this run (added since)")
    full = not why and total is not None and ran == total
    if not full and not why:
        why.append(f"{ran} of {total} contracts have a result for every cell")
    return Coverage(full=full, ran=ran, total=total, why=tuple(why))


def _summary_of(item: Any) -> dict:
    return item if isinstance(item, dict) else {}


def _device_of(s: dict) -> Optional[str]:
    if isinstance(s.get("device"), str):  # an index summary
        return s["device"]
    env = s.get("environment") if isinstance(s.get("environment"), dict) else {}
    dev = env.get("device") if isinstance(env.get("device"), dict) else {}
    return dev.get("kind") if isinstance(dev.get("kind"), str) else None


def _facts_of(s: dict) -> dict:
    return s["coverage"] if isinstance(s.get("coverage"), dict) and s["coverage"].get("kind") == FACTS_KIND else s


def previous_full(current: T, candidates: Iterable[T], spec: Any = None,
                  summary: Callable[[T], dict] = _summary_of) -> Optional[T]:
    """The newest candidate older than `current`, on the same device kind, whose coverage is full: what a diff of
    `current` should compare it with by default. Items are predicates or receipt index summaries (whose
    `coverage` holds `facts`); `summary` maps an item to one, e.g. `lambda row: row.entry` in the TUI."""
    cur = summary(current)
    when, device = cur.get("created_at"), _device_of(cur)
    best, best_at = None, None
    for item in candidates:
        s = summary(item)
        at = s.get("created_at")
        if item is current or s is cur or not isinstance(at, str) or not isinstance(when, str) or at >= when:
            continue
        if _device_of(s) != device or not coverage(_facts_of(s), spec).full:
            continue
        if best_at is None or at > best_at:
            best, best_at = item, at
    return best
