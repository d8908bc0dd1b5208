"""Run a spec's contracts against its implementation, then its mutants; build the receipt predicate.

Order, as mutation testers do it: the unmutated baseline runs first, for every
seed and dtype; then every mutant runs through the contracts the spec says
kill it. A mutant that survives fails the run, and so does a contract that no
mutant could make fail (it has not shown it can fail).
"""

from __future__ import annotations

import contextlib
import dataclasses
import platform
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from engine.spec import registry as registry_mod
from engine.run.context import DTYPES, BudgetExceeded, CheckContext, ContractViolation, Meter
from engine.run import run_audit, sourceonly, unimplemented
from engine.run.binding import numeric_environment
from engine.run.devices import describe
from engine.errors import BudgetError, UsageError
from engine.run.expect import applies, evaluate
from engine.tiers import TIERS, tier_counts, tier_of
from engine.run.expect import describe as describe_expectation
from engine.paths import project_root
from engine.store.receipts import statement, subjects, utc_now
from engine.spec.loader import Spec

PASSED, FAILED, ERROR, INTERRUPTED = "passed", "failed", "error", "interrupted"
# For an implementation that lacks some interface functions (an adapted framework loss): a contract whose every
# expectation it can be held to held, some not being measurable on it (PARTIAL), or none measurable (NOT_APPLICABLE).
# Neither is ever "passed": the gate counts only PASSED, and a run with either is PARTIAL at best.
PARTIAL, NOT_APPLICABLE = "partial", "not_applicable"
RESULT_STATUSES = (PASSED, FAILED, ERROR, PARTIAL, NOT_APPLICABLE)


class Interrupted(Exception):
    """SIGINT/SIGTERM during a run: finish nothing more, keep what is done."""


class CheckTimeout(BaseException):
    """A check ran past budget.per_contract_timeout_seconds.

    A BaseException, like KeyboardInterrupt, so that a check's own
    `except Exception:` cannot swallow it and run on past the limit.
    """


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """Interrupt a check that runs too long (main thread only: that is where signals land)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):  # noqa: ARG001
        raise CheckTimeout(f"check ran past the per-contract limit of {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class Plan:
    spec: Spec
    seeds: list[int]
    contracts: list[dict]
    mutants: list[dict]  # spec mutants, killed_by restricted to the selected contracts
    only: list[str] | None
    case: int | None = None  # check --case N: every selected contract runs its case N alone
    # A candidate's run (for_candidate): the selected contracts it is not held to (`applies_to: registered`)
    registered_only: list[str] = field(default_factory=list)
    seed_source: str = "budget"  # budget | given | fresh (drawn from the OS at run time: engine/run/seeds.py)
    tiers: list[str] | None = None  # --tier: the tiers selected (None: every tier)


def plan_run(spec: Spec, seeds: list[int] | None = None, only: list[str] | None = None,
             mutants: bool = True, fresh: int | bool = False, tiers: list[str] | None = None) -> Plan:
    """Select what runs and refuse, before anything runs, a request over the budget. `fresh`: draw the seeds from
    the operating system now (True: as many as the budget lists; an int: that many); `tiers`: only the contracts
    of these tiers (engine/tiers.py), the run then partial."""
    budget = spec.data["budget"]
    if fresh:
        from engine.run import seeds as seeds_mod

        seeds, source = seeds_mod.resolve(seeds_mod.SeedRequest(fresh=True, count=None if fresh is True else
                                                                int(fresh)), budget)
    else:
        source = "given" if seeds else "budget"
        seeds = list(budget["seeds"]) if not seeds else list(seeds)
    if len(set(seeds)) != len(seeds):
        raise UsageError(f"--seeds lists a seed twice: {seeds}")
    if len(seeds) > budget["max_seeds"]:
        raise BudgetError(
            f"{len(seeds)} seeds requested but {spec.display} budget.max_seeds is {budget['max_seeds']}; "
            "ask for fewer seeds or raise the budget in the spec"
        )
    contracts = spec.data["contracts"]
    if only:
        for cid in only:
            spec.contract(cid)  # raises with the valid ids
        contracts = [c for c in contracts if c["id"] in only]
    if tiers is not None:
        tiers = [t for t in TIERS if t in tiers]  # the canonical order, each once
        contracts = [c for c in contracts if tier_of(c) in tiers]
    chosen = {c["id"] for c in contracts}
    planned = []
    if mutants:
        for m in spec.data["mutants"]:
            killers = [cid for cid in m["killed_by"] if cid in chosen]
            if killers:
                planned.append({**m, "killed_by": killers})
    return Plan(spec=spec, seeds=seeds, contracts=contracts, mutants=planned, only=only, seed_source=source,
                tiers=tiers)


def for_candidate(plan: Plan) -> Plan:
    """The plan a candidate implementation runs (`check --impl`, the evolve evaluator): without the contracts that
    test how the registered implementation is built (`applies_to: registered`), which it is never held to, and
    without the mutants only they kill. `registered_only` names the contracts left out, for the receipt."""
    from engine.errors import NothingSelected
    from engine.spec.applies import registered_only

    internal = registered_only(plan.spec.data)  # the spec's, selected or not: none of them is a candidate's
    if not internal or plan.registered_only == internal:
        return plan
    held = [c for c in plan.contracts if c["id"] not in internal]
    if not held:
        raise NothingSelected(f"{', '.join(c['id'] for c in plan.contracts)} test(s) how "
                              f"{plan.spec.data['implementation']!r} is built (applies_to: registered) and never run "
                              f"for --impl; select a contract a candidate is held to (contracts interface "
                              f"{plan.spec.key} lists them)")
    mutants = [{**m, "killed_by": [k for k in m["killed_by"] if k not in internal]} for m in plan.mutants]
    return dataclasses.replace(plan, contracts=held, mutants=[m for m in mutants if m["killed_by"]],
                               registered_only=internal)


def _plain_measurements(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise TypeError(f"check returned {type(raw).__name__}, not a dict of measurements")
    out = {}
    for k, v in raw.items():
        if isinstance(v, torch.Tensor):
            if v.numel() != 1:
                raise TypeError(f"measurement {k!r} is a tensor of shape {tuple(v.shape)}, not a scalar")
            v = v.item()
        if isinstance(v, bool):
            out[str(k)] = v
        elif isinstance(v, int):
            out[str(k)] = int(v)
        elif isinstance(v, float):
            out[str(k)] = float(v)
        elif hasattr(v, "item") and callable(v.item):  # numpy scalars
            out[str(k)] = v.item()
        else:
            raise TypeError(f"measurement {k!r} is {type(v).__name__}, not a number or bool")
    return out


MAX_FAILING_CASES = 3


def failing_cases(case_log: list[dict], failed: list[dict], dtype: str) -> list[dict]:
    """The first cases whose own measurement breaks a failed expectation (seed, case, shapes, argument, where)."""
    out = []
    for entry in case_log:
        for e in failed:
            if e["metric"] not in entry["metrics"]:
                continue
            spec = {"metric": e["metric"], e["op"]: e["threshold"]}
            if evaluate(spec, entry["metrics"], dtype)["passed"]:
                continue
            case = {k: entry[k] for k in ("seed", "case", "shapes", "argument") if k in entry}
            case["metric"] = e["metric"]
            case["value"] = entry["metrics"][e["metric"]]
            where = (entry.get("where") or {}).get(e["metric"])
            if where is not None:
                case["where"] = where
            out.append(case)
            break
        if len(out) >= MAX_FAILING_CASES:
            break
    return out


def describe_case(c: dict) -> str:
    """`seed 42 case 3 (logp [2, 7], mask [2, 7]) max_abs_err 0.5 at [1, 4]; junk nan`."""
    shapes = ", ".join(f"{k} {v}" for k, v in (c.get("shapes") or {}).items())
    text = f"seed {c.get('seed')} case {c.get('case')}" + (f" ({shapes})" if shapes else "")
    text += f" {c.get('metric')} {c.get('value'):.3g}" if isinstance(c.get("value"), float) else \
        f" {c.get('metric')} {c.get('value')}"
    if c.get("where") is not None:
        text += f" at {c['where']}"
    if c.get("argument"):
        text += f"; {c['argument']}"
    return text


def _gradient_audit(result: dict, audit: run_audit.RunAudit | None, crossed: int = 0) -> None:
    """A check whose runs let a gradient into the supervisor's policy had each such update audited: the result
    says how many, and an update outside the tolerances fails it (an error stays an error), naming where. A
    candidate's vector-Jacobian product that reached the checks' objects (`crossed` times) in a check whose runs
    audited nothing fails it too: a run that trains through a handle without the audit is a defect of the run."""
    if crossed and (audit is None or not (audit.entries or audit.delegated)) and result["status"] != ERROR:
        text = (f"gradient audit: a candidate's vector-Jacobian product reached the checks' policy {crossed} "
                "time(s) and no update of this contract's runs was audited (every backward through a policy handle "
                "goes through methods.common.audited.backward)")
        result["message"] = f"{result['message']}; {text}" if result["status"] == FAILED and result["message"] \
            else text
        result["status"] = FAILED
        return
    if audit is None or not audit.entries:
        return
    bad = audit.failures()
    result["gradient_audit"] = {"updates": len(audit.entries), "failures": len(bad)}
    if not bad or result["status"] == ERROR:
        return
    first = bad[0]
    text = f"gradient audit: {len(bad)} of {len(audit.entries)} update(s) outside the tolerances; first: " \
        + run_audit.RunAudit.describe(first)
    result["message"] = f"{result['message']}; {text}" if result["status"] == FAILED and result["message"] else text
    result["status"] = FAILED
    at = f"arm {first['arm']}, update {first['update']}" + (f" ({first['where']})" if first["where"] else "")
    figure, value = first["broken"][0]
    result["failing_cases"] = [{"seed": first["seed"], "case": 0, "metric": f"gradient_audit {figure}",
                                "value": value, "where": at},
                               *result.get("failing_cases", [])][:MAX_FAILING_CASES]


def _where(exc: BaseException) -> str:
    """The innermost frame inside the project, as a repository-relative path: no absolute paths."""
    root = project_root()
    frames = traceback.extract_tb(exc.__traceback__)
    for fr in reversed(frames):
        try:
            rel = Path(fr.filename).resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        return f"{rel}:{fr.lineno}"
    return ""


class Runner:
    """Runs one plan on one device; `on_result` is called after every check call (progress)."""

    def __init__(self, plan: Plan, device: torch.device, on_result: Callable[[dict], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, policy: Any = None):
        self.plan = plan
        # Optional stand-in for the mechanism runs' tiny policies (`--policy`, engine/run/policy.py).
        self.policy = policy
        self.policy_used_by: set[str] = set()
        self.device = device
        self.on_result = on_result or (lambda r: None)
        self.should_stop = should_stop or (lambda: False)
        sourceonly.install()  # before the methods are imported: they run from source, never a planted .pyc
        self.registry = registry_mod.load()
        self.budget = plan.spec.data["budget"]
        # The gradient audit's tolerances hold in every contract's runs, not only the gradient_audit contract's:
        # a candidate must not be able to behave in the run that is audited and not in the one that is judged.
        # (A worker beside a candidate gets a plan without the spec's contracts: the defaults, which the specs
        # restate, hold there.)
        self.audit_tolerances = run_audit.tolerances_of(plan.spec.data.get("contracts") or [])
        self.results: list[dict] = []
        self.mutant_results: list[dict] = []
        self.mechanism: list[dict] = []
        self.errors: list[str] = []
        self.status: str | None = None
        self.t0 = time.perf_counter()

    # -- one check call -----------------------------------------------------

    def call(self, impl, contract: dict, seed: int, dtype: str, record_mechanism: bool) -> dict:
        if self.should_stop():
            raise Interrupted()
        elapsed = time.perf_counter() - self.t0
        if elapsed > self.budget["max_wall_seconds"]:
            raise BudgetExceeded(
                f"run wall time {elapsed:.1f}s is over budget.max_wall_seconds {self.budget['max_wall_seconds']}")
        check = self.registry.get_check(contract["check"])
        meter = Meter(max_updates=self.budget["max_updates_per_seed"], max_tokens=self.budget["max_tokens_per_seed"])
        ctx = CheckContext(device=self.device, dtype=DTYPES[dtype], seed=seed, cases=contract["cases"],
                           params=dict(contract.get("params") or {}), meter=meter,
                           policy_factory=self._policy_factory(contract["id"]), only_case=self.plan.case,
                           audit=run_audit.RunAudit(self.audit_tolerances, seed=seed))
        result = {"contract": contract["id"], "kind": contract["kind"], "tier": tier_of(contract),
                  "check": contract["check"], "seed": seed,
                  "dtype": dtype, "status": ERROR, "measurements": {}, "expectations": [], "message": None,
                  "cases_requested": contract["cases"], "wall_s": 0.0}
        torch.manual_seed(seed)
        crossed = run_audit.handle_gradients(impl)
        unimplemented.take()  # what an earlier call noted is not this one's
        start = time.perf_counter()
        limit = self.budget.get("per_contract_timeout_seconds")
        try:
            with _time_limit(limit):
                raw = check(impl, ctx)
            if limit and time.perf_counter() - start > limit:  # it caught the alarm itself and ran on
                raise CheckTimeout(f"check ran past the per-contract limit of {limit} s")
            measurements = _plain_measurements(raw)
            result["measurements"] = measurements
            records = [_expectation_record(e, measurements, dtype, ctx.not_measured)
                       for e in contract["expect"] if applies(e, dtype)]
            result["expectations"] = records
            if ctx.skipped_calls:  # the receipt names what was never called, whatever the metrics say
                result["skipped_calls"] = dict(ctx.skipped_calls)
            measured = [r for r in records if "not_applicable" not in r]
            # A metric that a skipped call would also have fed was measured on the other calls only: held there,
            # it still is no pass (a loss-only adapter's masked_junk says partial, never passed).
            in_part = [r for r in measured if "measured_in_part" in r] or list(ctx.skipped_calls)
            if not records:
                result["message"] = f"no expectation applies to dtype {dtype}"
                result["status"] = ERROR
            else:
                failed = [r for r in measured if not r["passed"]]
                result["status"] = FAILED if failed else PARTIAL if len(measured) < len(records) or in_part \
                    else PASSED
                if not measured:
                    result["status"] = NOT_APPLICABLE
                if failed:
                    # Worded as true statements ("max_rel_err 0.356 > limit 1e-12"), never as the rule it broke.
                    result["message"] = "; ".join(r.get("message") or describe_expectation(r) for r in failed)
                    cases = failing_cases(ctx.case_log, failed, dtype)
                    if cases:
                        result["failing_cases"] = cases
                        result["message"] += "; first failing case: " + describe_case(cases[0])
                elif len(measured) < len(records) or in_part:
                    result["message"] = _not_measured_message(records, ctx.skipped_calls)
        except (ContractViolation, BudgetExceeded, CheckTimeout) as exc:
            result["status"] = FAILED
            result["message"] = f"{type(exc).__name__}: {exc}"
        except registry_mod.NotProvided as exc:  # the check needs a function this implementation does not have
            result["status"] = NOT_APPLICABLE
            result["message"] = f"not applicable: {exc}"
        except (KeyboardInterrupt, Interrupted):
            raise
        except BaseException as exc:  # a raising check (even sys.exit() in one) is recorded, and the run goes on
            # raised in the candidate's own process (engine/run/boundary.py): its file:line crossed with it
            where = f"{exc.candidate_where} in the candidate" if getattr(exc, "candidate_where", None) \
                else _where(exc)
            result["status"] = ERROR
            result["message"] = f"{type(exc).__name__}: {exc}" + (f" (at {where})" if where else "")
        finally:
            result["wall_s"] = round(time.perf_counter() - start, 6)
            result["cost"] = {"optimizer_updates": meter.updates, "sampled_tokens": meter.tokens}
            noted = unimplemented.take()
            if noted:  # a stub measured nothing, even where the check caught its exception
                result["status"] = ERROR
                result["not_implemented"] = noted
                result["message"] = unimplemented.message(noted)
        _gradient_audit(result, ctx.audit, run_audit.handle_gradients(impl) - crossed)
        if record_mechanism and (ctx.steps or ctx.comparisons):
            self.mechanism.append({"contract": contract["id"], "seed": seed, "dtype": dtype,
                                   "steps": ctx.steps, "comparisons": ctx.comparisons})
        return result

    def _policy_factory(self, contract_id: str) -> Callable[..., Any] | None:
        """The provider's `build`, noting which contracts really used it (the receipt says so)."""
        if self.policy is None:
            return None

        def build(**kwargs: Any) -> Any:
            self.policy_used_by.add(contract_id)
            return self.policy.build(**kwargs)

        return build

    # -- phases --------------------------------------------------------------

    def run_baseline(self) -> None:
        impl = self.registry.get_implementation(self.plan.spec.data["implementation"])
        for contract in self.plan.contracts:
            for seed in self.plan.seeds:
                for dtype in contract["dtypes"]:
                    r = self.call(impl, contract, seed, dtype, record_mechanism=True)
                    self.results.append(r)
                    self.on_result({"phase": "baseline", **r})

    def run_mutants(self) -> None:
        seed = self.plan.seeds[0]
        by_id = {c["id"]: c for c in self.plan.contracts}
        # partial: the expectations the implementation could be held to held, so a kill there is a kill
        baseline_ok = {(r["contract"], r["dtype"]) for r in self.results
                       if r["seed"] == seed and r["status"] in (PASSED, PARTIAL)}
        na = self.not_applicable_contracts()
        for m in self.plan.mutants:
            entry = self.registry.get_mutant(m["mutant"])
            record = {"id": m["id"], "mutant": m["mutant"], "description": m["description"],
                      "expected_killers": list(m["killed_by"]), "killed_by": [], "killed": False,
                      "seed": seed, "results": []}
            if all(cid in na for cid in m["killed_by"]):
                record["not_applicable"] = "every contract that kills it is not applicable to this implementation"
                self.mutant_results.append(record)
                continue
            try:
                impl = entry.factory()
            except Exception as exc:
                record["error"] = f"mutant factory raised {type(exc).__name__}: {exc}"
                self.mutant_results.append(record)
                continue
            for cid in m["killed_by"]:
                if cid in na:
                    continue
                contract = by_id[cid]
                for dtype in contract["dtypes"]:
                    if cid in record["killed_by"]:
                        # One dtype that kills is the proof that this contract can fail on this mutant (as
                        # mutation testers stop at the first killing test); the receipt names what was not run.
                        record.setdefault("not_run_after_kill", []).append({"contract": cid, "dtype": dtype})
                        self.on_result({"phase": "mutant", "mutant": m["id"], "contract": cid, "seed": seed,
                                        "dtype": dtype, "status": "not run (killed)", "skipped": True})
                        continue
                    r = self.call(impl, contract, seed, dtype, record_mechanism=False)
                    counts = (cid, dtype) in baseline_ok
                    killed_here = r["status"] in (FAILED, ERROR) and counts
                    record["results"].append({
                        "contract": cid, "dtype": dtype, "status": r["status"], "message": r["message"],
                        "baseline_passed": counts, "kills": killed_here,
                        "failed_metrics": [e["metric"] for e in r["expectations"] if not e["passed"]],
                    })
                    if killed_here and cid not in record["killed_by"]:
                        record["killed_by"].append(cid)
                    self.on_result({"phase": "mutant", "mutant": m["id"], **r})
            record["killed"] = bool(record["killed_by"])
            self.mutant_results.append(record)

    # -- all ------------------------------------------------------------------

    def run(self) -> None:
        try:
            self.run_baseline()
            self.run_mutants()
        except (KeyboardInterrupt, Interrupted):
            self.status = INTERRUPTED
            self.errors.append("interrupted: the run was stopped; results finished so far are kept")
        except BudgetExceeded as exc:
            self.errors.append(f"budget: {exc}")
            self.status = FAILED

    def not_applicable_contracts(self) -> set[str]:
        """Contracts none of whose results could be measured on this implementation (every one not_applicable)."""
        by: dict[str, set] = {}
        for r in self.results:
            by.setdefault(r["contract"], set()).add(r["status"])
        return {cid for cid, st in by.items() if st == {NOT_APPLICABLE}}

    def proven(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {c["id"]: [] for c in self.plan.contracts}
        for m in self.mutant_results:
            for cid in m["killed_by"]:
                out.setdefault(cid, []).append(m["id"])
        return out

    def verdict(self) -> str:
        if self.status == INTERRUPTED:
            return INTERRUPTED
        statuses = {r["status"] for r in self.results}
        if ERROR in statuses or any("error" in m for m in self.mutant_results):
            return ERROR
        if FAILED in statuses or self.status == FAILED:
            return FAILED
        if any(not m["killed"] and "not_applicable" not in m for m in self.mutant_results):
            return FAILED
        na = self.not_applicable_contracts()
        if self.plan.mutants and any(not v for cid, v in self.proven().items() if cid not in na):
            return FAILED
        if statuses & {PARTIAL, NOT_APPLICABLE}:
            return PARTIAL  # everything it could be held to held; the rest was not measurable on it
        return PASSED

    def applicability(self) -> dict:
        """Which contracts this implementation could be held to: complete, or the not-applicable contracts and the
        partially measured ones with their unmeasured metrics and why."""
        na: dict[str, str] = {}
        partial: dict[str, dict] = {}
        for r in self.results:
            if r["status"] == NOT_APPLICABLE:
                na.setdefault(r["contract"], r.get("message") or "")
            elif any("not_applicable" in e or "measured_in_part" in e for e in r["expectations"]):
                # held or not, it was measured in part: metrics with no value, and metrics some calls never fed
                entry = partial.setdefault(r["contract"], {"not_measured": [], "reasons": []})
                for e in r["expectations"]:
                    for key, names in (("not_applicable", "not_measured"), ("measured_in_part", "measured_in_part")):
                        if key not in e:
                            continue
                        if e["metric"] not in entry.setdefault(names, []):
                            entry[names].append(e["metric"])
                        if e[key] not in entry["reasons"]:
                            entry["reasons"].append(e[key])
                for fn in r.get("skipped_calls") or {}:
                    if fn not in entry.setdefault("skipped_calls", []):
                        entry["skipped_calls"].append(fn)
        return {"complete": not na and not partial, "not_applicable": na, "partial": partial}

    def implementation_files(self) -> list[str]:
        try:
            return implementation_files(self.registry.get_implementation(self.plan.spec.data["implementation"]))
        except Exception:  # noqa: BLE001 - an unknown implementation is the run's error, recorded elsewhere
            return []

    def predicate(self) -> dict:
        spec = self.plan.spec
        contracts = {}
        for c in self.plan.contracts:
            rs = [r for r in self.results if r["contract"] == c["id"]]
            contracts[c["id"]] = {
                "tier": tier_of(c),
                "passed": sum(r["status"] == PASSED for r in rs),
                "failed": sum(r["status"] == FAILED for r in rs),
                "error": sum(r["status"] == ERROR for r in rs),
                "requested": len(self.plan.seeds) * len(c["dtypes"]),
            }
            for s in (PARTIAL, NOT_APPLICABLE):  # only where they occur: receipts of full implementations keep their shape
                n = sum(r["status"] == s for r in rs)
                if n:
                    contracts[c["id"]][s] = n
        proven = self.proven()
        na = self.not_applicable_contracts()  # unproven there says nothing about this implementation
        unproven = sorted(cid for cid, ms in proven.items() if not ms and cid not in na) if self.plan.mutants else []
        wall = time.perf_counter() - self.t0
        return {
            "method": spec.key,
            "spec": {"name": f"specs/{spec.path.name}", "sha256": spec.sha256, "spec_version": spec.data["spec_version"],
                     "level": spec.data["level"], "implementation": spec.data["implementation"],
                     "review": spec.data["promotion"]["review"], "promotion_state": spec.data["promotion"]["state"]},
            "environment": {
                "python": platform.python_version(),
                "torch": torch.__version__,
                "platform": f"{platform.system()}-{platform.machine()}",
                "device": describe(self.device),
                "torch_threads": torch.get_num_threads(),
                **numeric_environment(),
            },
            "implementation": {"name": spec.data["implementation"], "files": self.implementation_files()},
            "isolation": {"sandbox": "none", "candidate": False},  # engine/run/sandbox.py: candidates say more
            "policy": None if self.policy is None else {**self.policy.describe(),
                                                        "used_by": sorted(self.policy_used_by)},
            "request": {"device": str(self.device), "seeds": list(self.plan.seeds), "only": self.plan.only,
                        "seed_source": getattr(self.plan, "seed_source", "budget"),
                        **({} if self.plan.case is None else {"case": self.plan.case}),
                        **({} if getattr(self.plan, "tiers", None) is None else {"tiers": list(self.plan.tiers)}),
                        "contracts": [c["id"] for c in self.plan.contracts],
                        "mutants": [m["id"] for m in self.plan.mutants]},
            "actual": {
                "seeds": sorted({r["seed"] for r in self.results}),
                "results": len(self.results),
                "cases": sum(r["cases_requested"] for r in self.results if r["status"] != ERROR),
                "mutants_run": len(self.mutant_results),
            },
            "results": self.results,
            "mutants": self.mutant_results,
            "contracts_proven": proven,
            "unproven_contracts": unproven,
            "mechanism": self.mechanism,
            "budget": dict(spec.data["budget"]),
            "cost": {
                "wall_s": round(wall, 3),
                "optimizer_updates": sum(r["cost"]["optimizer_updates"] for r in self.results),
                "sampled_tokens": sum(r["cost"]["sampled_tokens"] for r in self.results),
                "max_optimizer_updates_per_seed": _max_per_seed(self.results, "optimizer_updates"),
            },
            "summary": {
                "contracts": contracts,
                "results": {s: n for s in RESULT_STATUSES
                            if (n := sum(r["status"] == s for r in self.results)) or s in (PASSED, FAILED, ERROR)},
                "tiers": tier_counts({"contracts": contracts}),
                "mutants": {"killed": sum(m["killed"] for m in self.mutant_results),
                            "survived": sum(not m["killed"] and "not_applicable" not in m
                                            for m in self.mutant_results),
                            **({"not_applicable": n} if (n := sum("not_applicable" in m
                                                                  for m in self.mutant_results)) else {})},
            },
            "errors": self.errors,
            "status": self.verdict(),
            **({} if (cov := self.applicability())["complete"] else {"applicability": cov}),
        }


def _expectation_record(e: dict, measurements: dict, dtype: str, not_measured: dict[str, str]) -> dict:
    """One expectation's record: not measurable (no value), measured on some of its calls only, or measured."""
    reason = not_measured.get(e["metric"])
    if reason is not None and e["metric"] not in measurements:
        return _not_measured(e, reason)
    record = evaluate(e, measurements, dtype)
    if reason is not None:
        record["measured_in_part"] = reason
    return record


def _not_measured(expectation: dict, reason: str) -> dict:
    """The receipt record of an expectation this implementation cannot be held to: no value, never passed."""
    op = next((k for k in ("le", "lt", "ge", "gt", "eq") if k in expectation), "le")
    return {"metric": expectation["metric"], "op": op, "threshold": expectation.get(op),
            "tolerance_source": "spec", "value": None, "margin": None, "headroom": None, "passed": False,
            "not_applicable": reason}


def _not_measured_message(records: list[dict], skipped: dict[str, str] | None = None) -> str:
    reasons: dict[tuple, list[str]] = {}
    for r in records:
        if "not_applicable" in r:
            reasons.setdefault(("not measured", r["not_applicable"]), []).append(r["metric"])
        elif "measured_in_part" in r:
            reasons.setdefault(("measured in part", r["measured_in_part"]), []).append(r["metric"])
    parts = [f"{', '.join(ms)} {what} ({why})" for (what, why), ms in reasons.items()]
    if skipped:
        parts.append("not called: " + ", ".join(skipped))
    return "partial: " + "; ".join(parts)


def _max_per_seed(results: list[dict], key: str) -> int:
    per: dict[tuple, int] = {}
    for r in results:
        k = (r["contract"], r["seed"], r["dtype"])
        per[k] = per.get(k, 0) + r["cost"][key]
    return max(per.values(), default=0)


def implementation_files(impl: Any) -> list[str]:
    """Repository-relative files of the modules that define an implementation's functions."""
    import sys

    root = project_root()
    out = set()
    for name in impl.functions:
        fn = getattr(impl, name)
        module = getattr(fn, "__module__", None) or getattr(getattr(fn, "func", None), "__module__", None)
        origin = getattr(sys.modules.get(module or ""), "__file__", None)
        if origin:
            try:
                out.add(Path(origin).resolve().relative_to(root).as_posix())
            except ValueError:
                continue
    return sorted(out)


def build_statement(runner: Runner, created_at: str) -> dict:
    """The in-toto statement for a finished (or interrupted) run."""
    from engine.run.binding import git_state, imported_files
    import importlib

    # It shapes the receipt: in sys.modules (and so bound) before the list is read. import_module, because a
    # `from engine.store import redact` is satisfied by the package attribute even when sys.modules lost it.
    importlib.import_module("engine.store.redact")

    root = project_root()
    plan = runner.plan
    # What measured: the checkout modules this process imported (front doors left out), or, for a run in
    # cells, the union of the driver's and every worker's (engine/run/executors.py merge).
    files = getattr(runner, "bound_files", None) or imported_files(root)
    subj = subjects(root, [f for f in files if (root / f).is_file()])  # a vanished module: dirty, see git_state
    subj.append({"name": f"specs/{plan.spec.path.name}", "digest": {"sha256": plan.spec.sha256}})
    extra = getattr(runner, "extra_subjects", None)  # [impl] hook: an --impl candidate's files (impl:<name>)
    if extra is not None:
        subj += extra()
    if runner.policy is not None:  # its code and, for a checkpoint, its weight and config files
        known = {s["name"] for s in subj}
        subj += [s for s in runner.policy.subjects() if s["name"] not in known]
    pred = {"schema": "paper-contracts/receipt/v1", "created_at": created_at, "finished_at": utc_now(),
            "git": git_state(root, files), **runner.predicate()}
    return statement(sorted(subj, key=lambda s: s["name"]), pred)
