"""One `contracts mutate` run: baseline under coverage, mutants of executed lines, verdicts, score, receipt.

score = killed / (mutants - timeout - equivalent). A survivor the spec lists
under `equivalent_mutants` (by id, with the reason it was judged equivalent)
leaves the denominator and is reported as equivalent; a listed mutant that is
killed counts as killed (the listing was wrong or the code changed) and is
reported so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from engine.errors import ContractsError, EXIT_FAILED, UsageError
from engine.run.mutate.execute import KILLED, SURVIVED, TIMEOUT, Job, WorkerFailed, run_baseline, run_mutants
from engine.run.mutate.generate import Mutant, Target, mutants_of, spread
from engine.run.mutate.operators import OPERATORS

DEFAULT_THRESHOLD = 0.9
EQUIVALENT = "equivalent"


class BaselineFailed(ContractsError):
    """The unmutated code does not pass its contracts: no mutant can be judged against it."""

    exit_code = EXIT_FAILED


@dataclass
class Options:
    seeds: list[int]
    device: str = "cpu"
    jobs: int = 1
    timeout_s: float | None = None  # per mutant; None: from the baseline's time
    max_mutants: int | None = None
    only_files: list[str] = field(default_factory=list)
    operators: frozenset[str] = frozenset(OPERATORS)
    sys_path: list[str] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)


def threshold_of(spec) -> tuple[float, str]:
    value = spec.data["promotion"]["requires"].get("mutation_score")
    if value is None:
        return DEFAULT_THRESHOLD, "default"
    return float(value), "spec"


def _rel(path: str, root: Path) -> str:
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return Path(path).name


def baseline(spec, root: Path, opts: Options) -> tuple[dict, list[Target]]:
    """Run the unmutated contracts under coverage; the targets with their executed lines."""
    include = [str(root / "methods" / "*")] + [str(Path(p) / "*") for p in opts.sys_path]
    job = Job(spec_path=str(spec.path), root=str(root), seeds=opts.seeds, device=opts.device,
              spec_data=spec.data, spec_sha256=spec.sha256,
              sys_path=opts.sys_path, imports=opts.imports, coverage_include=include)
    limit = float(spec.data["budget"]["max_wall_seconds"])
    try:
        base = run_baseline(job, timeout_s=limit)
    except WorkerFailed as exc:
        raise BaselineFailed(f"the baseline run of {spec.key} could not finish: {str(exc).splitlines()[0]}") from None
    bad = [r for r in base["results"] if r["status"] != "passed"]
    if bad:
        shown = "; ".join(f"{r['contract']} seed {r['seed']} {r['dtype']} {r['status']}: {r['message']}"
                          for r in bad[:3])
        raise BaselineFailed(f"the unmutated {spec.key} fails {len(bad)} contract result(s), so no mutant can be "
                             f"judged: {shown}; fix them first (contracts check {spec.key})")
    targets = []
    for m, p in base["targets"]:
        lines = {int(k): v for k, v in base["executed"].get(p, {}).items()}
        targets.append(Target(module=m, path=p, display=_rel(p, root), executed=frozenset(lines), contexts=lines))
    return base, targets


def select_targets(targets: list[Target], only_files: list[str]) -> list[Target]:
    if not only_files:
        return targets
    chosen = [t for t in targets if t.display in only_files or Path(t.display).name in only_files]
    unknown = [f for f in only_files if not any(f in (t.display, Path(t.display).name) for t in targets)]
    if unknown:
        raise UsageError(f"--only-file {', '.join(unknown)}: not a mutated file of this method; choose from "
                         + ", ".join(t.display for t in targets))
    return chosen


def generate(targets: list[Target], operators: frozenset[str]) -> list[Mutant]:
    out: list[Mutant] = []
    for t in targets:
        out += mutants_of(t, Path(t.path).read_text(encoding="utf-8"), operators)
    return out


def contract_order(results: list[dict]) -> list[str]:
    """Cheapest contracts first (the baseline's time per contract), so most mutants are caught early."""
    wall: dict[str, float] = {}
    for r in results:
        wall[r["contract"]] = wall.get(r["contract"], 0.0) + r["wall_s"]
    return sorted(wall, key=lambda c: (wall[c], c))


def judge(spec, root: Path, mutants: list[Mutant], order: list[str], opts: Options, timeout_s: float,
          on_done: Callable[[Mutant, dict], None] | None = None) -> list[dict]:
    # A contract that never ran a mutant's statement behaves exactly as on the original code (everything it does
    # before reaching that statement is unchanged, and it never reaches it): only those that ran it are asked.
    jobs = [Job(spec_path=str(spec.path), root=str(root), seeds=opts.seeds, device=opts.device,
                spec_data=spec.data, spec_sha256=spec.sha256,
                order=[c for c in order if m.contracts is None or c in m.contracts],
                sys_path=opts.sys_path, imports=opts.imports, module=m.module, path=m.path, source=m.source)
            for m in mutants]
    outcomes = run_mutants(jobs, opts.jobs, timeout_s,
                           on_done=None if on_done is None else (lambda i, r: on_done(mutants[i], r)))
    records = []
    for m, r in zip(mutants, outcomes):
        records.append({"id": m.id, "file": m.display, "line": m.line, "operator": m.operator,
                        "description": m.description, "status": r["status"], "killed_by": r.get("killed_by"),
                        "seed": r.get("seed"), "dtype": r.get("dtype"), "message": r.get("message"),
                        "calls": r.get("calls"), "wall_s": r.get("wall_s"), "diff": m.diff,
                        "contracts": order if m.contracts is None else [c for c in order if c in m.contracts]})
    return records


def score(records: list[dict], equivalents: list[dict]) -> dict:
    """Counts, the score and the lists a report shows; survivors listed as equivalent leave the denominator."""
    listed = {e["id"]: e["reason"] for e in equivalents}
    seen = {r["id"] for r in records}
    for r in records:
        if r["status"] == SURVIVED and r["id"] in listed:
            r["status"] = EQUIVALENT
            r["reason"] = listed[r["id"]]
    n = len(records)
    k = sum(r["status"] == KILLED for r in records)
    s = sum(r["status"] == SURVIVED for r in records)
    t = sum(r["status"] == TIMEOUT for r in records)
    e = sum(r["status"] == EQUIVALENT for r in records)
    denominator = n - t - e
    return {
        "mutants": n, "killed": k, "survived": s, "timeout": t, "equivalent": e,
        "score": (k / denominator) if denominator else None,
        "survivors": [_brief(r) for r in records if r["status"] == SURVIVED],
        "equivalents": [{**_brief(r), "reason": r["reason"]} for r in records if r["status"] == EQUIVALENT],
        "timeouts": [_brief(r) for r in records if r["status"] == TIMEOUT],
        # Listed as equivalent yet killed: the listing no longer holds (re-judge it).
        "listed_but_killed": sorted(r["id"] for r in records if r["status"] == KILLED and r["id"] in listed),
        # Listed, but no such mutant was generated in this run (code changed, or --only-file/--max-mutants).
        "listed_not_run": sorted(i for i in listed if i not in seen),
    }


def _brief(r: dict) -> dict:
    return {k: r[k] for k in ("id", "file", "line", "operator", "description", "diff")}


def timeout_for(base_results: list[dict], given: float | None) -> float:
    """Per mutant: the baseline's contract time, many times over, plus start-up; at least a minute."""
    if given is not None:
        return given
    return max(60.0, 10.0 * sum(r["wall_s"] for r in base_results) + 20.0)


def run(spec, root: Path, opts: Options, on_start: Callable[[int], None] | None = None,
        on_done: Callable[[Mutant, dict], None] | None = None) -> dict:
    """Everything but the receipt: the mutation section and the baseline it was judged against."""
    t0 = time.perf_counter()
    base, targets = baseline(spec, root, opts)
    base_wall = time.perf_counter() - t0
    chosen = select_targets(targets, opts.only_files)
    candidates = generate(chosen, opts.operators)
    mutants = spread(candidates, opts.max_mutants)
    if on_start is not None:
        on_start(len(mutants))
    timeout_s = timeout_for(base["results"], opts.timeout_s)
    order = contract_order(base["results"])
    records = judge(spec, root, mutants, order, opts, timeout_s, on_done) if mutants else []
    counts = score(records, list(spec.data.get("equivalent_mutants") or []))
    threshold, source = threshold_of(spec)
    complete = not opts.only_files and len(mutants) == len(candidates) and opts.operators == frozenset(OPERATORS)
    section = {
        **{k: counts[k] for k in ("mutants", "killed", "survived", "timeout", "equivalent", "score")},
        "threshold": threshold, "threshold_source": source,
        "passed": counts["score"] is not None and counts["score"] >= threshold,
        "complete": complete,
        "seeds": list(opts.seeds), "jobs": opts.jobs, "timeout_s": timeout_s,
        "operators": sorted(opts.operators), "contract_order": order,
        "selection": {"candidates": len(candidates), "run": len(mutants), "max_mutants": opts.max_mutants,
                      "only_files": list(opts.only_files)},
        "files": [{"file": t.display, "executed_lines": len(t.executed),
                   "mutants": sum(m.display == t.display for m in mutants)} for t in chosen],
        "survivors": counts["survivors"], "equivalents": counts["equivalents"], "timeouts": counts["timeouts"],
        "listed_but_killed": counts["listed_but_killed"], "listed_not_run": counts["listed_not_run"],
        "results": [{k: v for k, v in r.items() if k != "diff"} for r in records],
        "baseline_wall_s": round(base_wall, 3),
        "wall_s": round(time.perf_counter() - t0, 3),
    }
    return {"mutation": section, "baseline": base}


def predicate(spec, outcome: dict, opts: Options, created_at: str, git: dict | None) -> dict:
    """The receipt predicate: a check receipt's fields (the baseline's results) plus `mutation`."""
    from engine.store.receipts import utc_now

    base, section = outcome["baseline"], outcome["mutation"]
    results = base["results"]
    contracts = {}
    for c in spec.data["contracts"]:
        rs = [r for r in results if r["contract"] == c["id"]]
        contracts[c["id"]] = {"passed": sum(r["status"] == "passed" for r in rs),
                              "failed": sum(r["status"] == "failed" for r in rs),
                              "error": sum(r["status"] == "error" for r in rs),
                              "requested": len(opts.seeds) * len(c["dtypes"])}
    return {
        "schema": "paper-contracts/receipt/v1", "created_at": created_at, "finished_at": utc_now(), "git": git,
        "method": spec.key,
        "spec": {"name": f"specs/{spec.path.name}", "sha256": spec.sha256, "spec_version": spec.data["spec_version"],
                 "level": spec.data["level"], "implementation": spec.data["implementation"],
                 "review": spec.data["promotion"]["review"], "promotion_state": spec.data["promotion"]["state"]},
        "environment": base["environment"],
        "policy": None,
        "request": {"device": opts.device, "seeds": list(opts.seeds), "only": None,
                    "contracts": [c["id"] for c in spec.data["contracts"]], "mutants": []},
        "actual": {"seeds": sorted({r["seed"] for r in results}), "results": len(results),
                   "cases": sum(r["cases_requested"] for r in results if r["status"] != "error"), "mutants_run": 0},
        "results": results,
        "mutants": [],
        "contracts_proven": {},
        "unproven_contracts": [],
        "mechanism": [],
        "budget": dict(spec.data["budget"]),
        "cost": {"wall_s": section["wall_s"],
                 "optimizer_updates": sum(r["cost"]["optimizer_updates"] for r in results),
                 "sampled_tokens": sum(r["cost"]["sampled_tokens"] for r in results),
                 "max_optimizer_updates_per_seed": 0},
        "summary": {"contracts": contracts,
                    "results": {s: sum(r["status"] == s for r in results) for s in ("passed", "failed", "error")},
                    "mutants": {"killed": 0, "survived": 0}},
        "errors": [],
        "status": "passed" if section["passed"] else "failed",
        "mutation": section,
    }


def statement(spec, root: Path, outcome: dict, opts: Options, created_at: str) -> dict:
    from engine.run.binding import git_state
    from engine.store.receipts import statement as make_statement, subjects

    # What measured: the checkout modules the baseline worker imported (engine.run.binding), as `check` binds them
    files = [f for f in outcome["baseline"]["source_files"] if (root / f).is_file()]
    subj = subjects(root, files)
    subj.append({"name": f"specs/{spec.path.name}", "digest": {"sha256": spec.sha256}})
    pred = predicate(spec, outcome, opts, created_at, git_state(root, files))
    pred["implementation"] = {"name": spec.data["implementation"],
                              "files": outcome["baseline"].get("implementation_files") or []}
    pred["isolation"] = {"sandbox": "none", "candidate": False}  # source mutants of the registered code
    return make_statement(sorted(subj, key=lambda s: s["name"]), pred)
