"""From assessed receipts to what OpenEvolve reads: `combined_score`, the other metrics, and the artifacts.

combined_score, by what the evidence shows for the cells a stage needs (engine/evolve/stages.py):

  0.0   some cell failed or raised, or has no usable receipt (the candidate breaks a contract, or could
        not be checked): whatever else it does, it scores nothing;
  0.5   stage 1 held;                      these two are OpenEvolve's default cascade thresholds, so a
  0.75  stage 2 held;                      candidate that holds a stage goes on to the next one;
  0.9 + 0.1 x the spec's score             stage 3 (every contract) held: `evolve.score` in the spec, a
        (1.0 without one)                  measurement mapped from its `range` onto [0, 1] (flipped when
                                           higher_is_better is false), averaged over the budget seeds.

So a candidate checked further never ranks below one checked less, and every
candidate that holds every contract ranks above every one that does not.
Only receipts that are fresh, trusted (under a trust policy), of this device
kind and bound to this candidate's exact bytes count (`usable`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from engine.evolve import stages as S

STAGE_SCORES = {1: 0.5, 2: 0.75}
FULL_FLOOR = 0.9
MAX_FAILURE_LINES = 40


@dataclass
class Evidence:
    """One receipt that counts: where it is and what it recorded."""

    file: str
    receipt_id: str
    predicate: dict


@dataclass
class Verdict:
    stage: int
    needed: list
    passed: set = field(default_factory=set)
    broken: list = field(default_factory=list)  # (cell, result, receipt_id)
    missing: list = field(default_factory=list)
    receipts: list = field(default_factory=list)  # ids of the receipts the verdict rests on

    @property
    def holds(self) -> bool:
        return not self.broken and not self.missing


def usable(a: Any, ident: dict, device_kind: str, policy: Any) -> str | None:
    """Why an assessed receipt (engine.store.verify.Assessed) cannot count for this candidate; None when it can."""
    from engine.run.impl_loader import SUBJECT_PREFIX, unit_of

    if a.state != "fresh":
        return f"{a.state}: {a.message}" if a.message else a.state
    if policy is not None and a.trust != "trusted":
        return f"not trusted: {a.trust_message or a.trust}"
    if unit_of(a.predicate) != f"{SUBJECT_PREFIX}{ident['digest']}":
        return "measured another implementation"
    bound = sorted((s.get("name"), (s.get("digest") or {}).get("sha256")) for s in a.subject or []
                   if isinstance(s, dict) and str(s.get("name", "")).startswith(SUBJECT_PREFIX))
    if bound != sorted((s["name"], s["digest"]["sha256"]) for s in ident["subjects"]):
        return "does not bind this candidate's files"
    if a.device != device_kind:
        return f"ran on {a.device}, not {device_kind}"
    return None


def judge(spec_data: dict, stage: int, evidence: list[Evidence], seeds: list[int] | None = None,
          needed: list | None = None) -> Verdict:
    """What the usable receipts show for each cell the stage needs (`needed`, default the stage's cells on `seeds`):
    passed, broken, or not measured yet."""
    needed = S.cells(spec_data, stage, seeds) if needed is None else list(needed)
    want = set(needed)
    v = Verdict(stage=stage, needed=needed)
    seen: dict[tuple, list] = {}
    for ev in evidence:
        for r in ev.predicate.get("results") or []:
            cell = (r.get("contract"), r.get("seed"), r.get("dtype"))
            if cell in want:
                seen.setdefault(cell, []).append((r, ev.receipt_id))
    used: set[str] = set()
    for cell in needed:
        records = seen.get(cell)
        if not records:
            v.missing.append(cell)
            continue
        bad = [(r, rid) for r, rid in records if r.get("status") != "passed"]
        if bad:
            v.broken.append((cell, bad[0][0], bad[0][1]))
            used.add(bad[0][1])
        else:
            v.passed.add(cell)
            used.update(rid for _r, rid in records)
    v.receipts = [ev.receipt_id for ev in evidence if ev.receipt_id in used]
    return v


def spec_score(spec_data: dict, evidence: list[Evidence], seeds: list[int] | None = None
               ) -> tuple[float | None, float | None, str | None]:
    """(raw score, score mapped onto [0, 1], problem) from `evolve.score`, averaged over `seeds` (default the
    budget's); (None, None, None) without one."""
    decl = (spec_data.get("evolve") or {}).get("score")
    if decl is None:
        return None, None, None
    seeds = list(seeds or spec_data["budget"]["seeds"])
    per_seed: dict[int, list[float]] = {}
    for ev in evidence:
        for r in ev.predicate.get("results") or []:
            if r.get("contract") == decl["contract"] and r.get("seed") in seeds and r.get("status") == "passed":
                value = (r.get("measurements") or {}).get(decl["metric"])
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    per_seed.setdefault(r["seed"], []).append(float(value))
    missing = [s for s in seeds if s not in per_seed]
    if missing:
        return None, None, (f"evolve.score: contract {decl['contract']} reported no finite {decl['metric']!r} "
                            f"for seed(s) {', '.join(map(str, missing))}")
    raw = sum(sum(v) / len(v) for v in per_seed.values()) / len(per_seed)
    lo, hi = float(decl["range"][0]), float(decl["range"][1])
    unit = min(1.0, max(0.0, (raw - lo) / (hi - lo)))
    if decl.get("higher_is_better", True) is False:
        unit = 1.0 - unit
    return raw, unit, None


def combined(stage: int, verdict: Verdict, unit_score: float | None, declared: bool = False) -> float:
    """The combined_score (see the module docstring); a declared score that could not be read gives the floor."""
    if not verdict.holds:
        return 0.0
    if stage < S.FULL:
        return STAGE_SCORES[stage]
    if unit_score is None:
        return FULL_FLOOR if declared else 1.0
    return FULL_FLOOR + (1.0 - FULL_FLOOR) * unit_score


def _num(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def failure_records(verdict: Verdict) -> list[dict]:
    """One record per broken cell and failed expectation: measured value against its tolerance."""
    out = []
    for (cid, seed, dtype), r, rid in verdict.broken:
        base = {"contract": cid, "seed": seed, "dtype": dtype, "status": r.get("status"), "receipt_id": rid}
        failed = [e for e in r.get("expectations") or [] if not e.get("passed")]
        if not failed:
            out.append({**base, "message": str(r.get("message") or "did not pass")})
        for e in failed:
            out.append({**base, "metric": e.get("metric"), "measured": e.get("value"), "op": e.get("op"),
                        "limit": e.get("threshold"), "tolerance_source": e.get("tolerance_source"),
                        "message": e.get("message")})
    return out


def failure_lines(spec: Any, verdict: Verdict) -> list[str]:
    """The broken contracts, each with where it is in the spec and its failed cells, for the LLM to read."""
    from engine.run.expect import describe

    by_contract: dict[str, list] = {}
    for cell, r, rid in verdict.broken:
        by_contract.setdefault(cell[0], []).append((cell, r, rid))
    lines: list[str] = []
    index = {c["id"]: (i, c) for i, c in enumerate(spec.data["contracts"])}
    for cid, items in by_contract.items():
        i, c = index[cid]
        line, _ = spec.locate(["contracts", i])
        total = sum(1 for cell in verdict.needed if cell[0] == cid)
        lines.append(f"{cid} ({spec.path.name}:{line}, {c['kind']}): {len(items)} of {total} cells did not pass; "
                     f"{c['description']}")
        for (_cid, seed, dtype), r, rid in items:
            failed = [e for e in r.get("expectations") or [] if not e.get("passed")]
            what = "; ".join(describe(e) for e in failed) if failed else f"{r.get('status')}: {r.get('message')}"
            lines.append(f"  seed {seed} {dtype}: {what} (receipt {rid[:12]})")
    if len(lines) > MAX_FAILURE_LINES:
        lines = lines[:MAX_FAILURE_LINES] + [f"... {len(lines) - MAX_FAILURE_LINES} more lines in failures_json"]
    return lines


def report(spec: Any, stage: int, verdict: Verdict, evidence: list[Evidence], refused: list[str],
           wall_s: float, written: list[str], seeds: list[int] | None = None, fresh: bool = False) -> tuple[dict, dict]:
    """(metrics, artifacts) for OpenEvolve: metrics are floats; artifacts are text."""
    raw, unit, problem = (spec_score(spec.data, evidence, seeds) if stage == S.FULL and verdict.holds
                          else (None, None, None))
    score = combined(stage, verdict, unit, declared=bool((spec.data.get("evolve") or {}).get("score")))
    broken_contracts = list(dict.fromkeys(cell[0] for cell, _r, _rid in verdict.broken))
    metrics = {
        "combined_score": float(score),
        f"stage{stage}_passed": 1.0 if verdict.holds else 0.0,
        "cells_passed": float(len(verdict.passed)),
        "cells_total": float(len(verdict.needed)),
        "contracts_broken": float(len(broken_contracts)),
        "eval_seconds": round(float(wall_s), 3),
    }
    if raw is not None:
        metrics["score"] = float(raw)
    word = "HOLDS" if verdict.holds else "BROKEN" if verdict.broken else "NOT CHECKED"
    what = S.describe(spec.data, stage, seeds) + (", drawn fresh" if fresh else "")
    head = (f"{spec.key} stage {stage} ({what}): {word}; {len(verdict.passed)} of "
            f"{len(verdict.needed)} cells passed; combined_score {score:g}")
    if broken_contracts:
        head += f"; broken: {', '.join(broken_contracts)}"
    if raw is not None:
        decl = spec.data["evolve"]["score"]
        head += f"; score {decl['contract']}.{decl['metric']} = {raw:.6g}"
    artifacts = {"verdict": head, f"stage{stage}_verdict": head,
                 "receipts": ", ".join(verdict.receipts), f"stage{stage}_receipts": ", ".join(verdict.receipts),
                 "receipt_id": written[-1] if written else (verdict.receipts[-1] if verdict.receipts else "")}
    if verdict.broken:
        artifacts["failures"] = "\n".join(failure_lines(spec, verdict))
        artifacts["failures_json"] = json.dumps(failure_records(verdict), default=str)
    if verdict.missing:
        cells = ", ".join(f"{c} seed {s} {d}" for c, s, d in verdict.missing[:6])
        more = f", +{len(verdict.missing) - 6} more" if len(verdict.missing) > 6 else ""
        artifacts["not_checked"] = f"no usable receipt for {cells}{more}"
    if refused:
        artifacts["evidence_refused"] = "\n".join(refused)
    if problem:
        artifacts["score_problem"] = problem
    return metrics, artifacts
