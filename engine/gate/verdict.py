"""The promotion gate: the spec's `promotion.requires` against fresh, intact receipts only.

Requirements, each met or not, each with what is missing and the command that
would produce it:

  review              promotion.review is DONE and the newest intact ledger review of the
                      method approves the spec's reviewed fields as they are now (signed
                      by a reviewer key of the policy, under one): engine/gate/review.py.
  device:<kind>       for every device in requires.devices: every contract passed
                      for every budget seed (any one seed when all_budget_seeds
                      is false) and every dtype, in fresh receipts of that device
                      kind; no fresh receipt of that kind records a failure or an
                      error for any of those cells, or a run-level error.
  fresh_seeds         (requires.fresh_seeds; by default for an --impl candidate only) a fresh receipt
                      on a required device whose seeds were drawn from the operating system at
                      run time (`check --seeds fresh`) and in which every contract of the
                      required tiers passed for each of its seeds and dtypes: the budget's
                      seeds are public, so a candidate could recognise them.
  mutants_killed      every mutant of the spec killed, and every contract shown
                      able to fail (killed some mutant), in a fresh receipt on a
                      required device.
  formal_comparison   a fresh receipt on a required device holds at least one
                      comparison recorded with formal: true, over the budget's
                      seeds, and every such comparison shows the method ahead:
                      the CI_METHOD interval of the per-seed difference lies
                      above zero. Diagnostic comparisons (formal: false) never count.
  signed              (when requires.signed is true) a trust policy was given. Under
                      a policy, whatever the spec says, only receipts whose DSSE
                      signature verifies against a key trusted for their device
                      kind count for any requirement; the rest are listed with why.
  policy:<kind>       only when requires.policy is set (the page's evidence is a real model): a
                      fresh receipt on a required device in which the named contracts trained
                      that kind of policy (--policy hf:DIR) and passed: engine/gate/policy_evidence.py.
  mutation_score      only when requires.mutation_score is set: the newest fresh,
                      complete `contracts mutate` receipt on a required device has
                      a score (killed / (mutants - timeout - equivalent)) at least
                      that threshold.

The output shape (GATE_SCHEMA, engine/schemas/gate.schema.json) is what evolve
reads; keep it stable. Each unmet requirement's `fix` there is `{"argv": [...]}`, a
command a pipeline can run as it is, or null when no command can meet it (an edit,
a review, a change to the method); `note` says what else is needed either way.
`evaluate` gives the same verdict with `fix` as one line of text for people (and
`argv`, `note` beside it); `published` turns it into the GATE_SCHEMA shape.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Callable, Optional

from engine.store.receipts import utc_now
from engine.tiers import TIERS, tier_of
from engine.spec.loader import Spec
from engine.gate.stats import paired_t_interval
from engine.store.verify import Assessed, assess_receipts

GATE_SCHEMA = "paper-contracts/gate/v2"  # v2: fix is {"argv": [...]} or null, with note
GATE_SCHEMA_VERSION = 2
CI_LEVEL = 0.95
CI_METHOD = (
    "paired-t, 95%, two-sided: per budget seed s, d_s = mean(method_values) - mean(control_values) "
    "(negated when the comparison says higher_is_better: false); interval = mean(d) +/- t(0.975, n-1) * sd(d) / sqrt(n) "
    "over the n >= 2 budget seeds; the method is ahead when the interval's lower bound is above zero"
)
_SHOW = 6  # items shown per text line before "+N more"
MAX_WARNINGS = 20  # warnings listed in a verdict; warnings_total counts every one


def _more(items: list[str], n: int = _SHOW) -> str:
    return ", ".join(items[:n]) + (f", +{len(items) - n} more" if len(items) > n else "")


def _short(rid: str | None) -> str:
    return (rid or "?")[:12]


def _cells(cells: list[dict]) -> str:
    """'seeds 42,43,44 x float32,float64' when the missing cells are a full product, else the first few."""
    seeds = sorted({c["seed"] for c in cells if c["seed"] is not None})
    dtypes = list(dict.fromkeys(c["dtype"] for c in cells))
    if not seeds:
        return ",".join(dtypes)
    if len(cells) == len(seeds) * len(dtypes):
        return f"seed{'s' if len(seeds) > 1 else ''} {','.join(map(str, seeds))} x {','.join(dtypes)}"
    return _more([f"seed {c['seed']} {c['dtype']}" for c in cells], 3)


def fix(argv: Optional[list[str]] = None, note: str = "") -> dict:
    """What would meet a requirement: a runnable command (argv) or none, and a note; `fix` is both as one line."""
    text = shlex.join(argv) if argv else ""
    if note:
        text = f"{text} ({note})" if text else note
    return {"fix": text, "argv": list(argv) if argv else None, "note": note}


_NONE = {"fix": "", "argv": None, "note": ""}


def _req(rid: str, met: bool, detail: str, how: Optional[dict] = None, required: bool = True, **extra) -> dict:
    return {"id": rid, "required": required, "met": met, "detail": detail, **(_NONE if met or how is None else how),
            **extra}


# --- requirements -----------------------------------------------------------


def _review(spec: Spec, receipts_dir: Path, policy, flags: str) -> dict:
    """Met only by a ledger review of this very spec (engine.gate.review), signed under a policy."""
    from engine.gate import review

    return review.requirement(spec, receipts_dir, policy, flags, (_req, fix))


def _signed(spec: Spec, policy, untrusted: list[Assessed], flags: str) -> dict:
    required = bool(spec.data["promotion"]["requires"].get("signed", False))
    if policy is None:
        return _req("signed", not required, "the spec requires signed receipts and no trust policy was given"
                    if required else "not required by the spec",
                    fix(note=f"give a trust policy: contracts gate {spec.key} --trust POLICY.yaml{flags} (or set "
                        "CONTRACTS_TRUST); it names the runner keys trusted per device kind"),
                    required=required)
    detail = f"only receipts signed by a key {policy.file} trusts for their device kind count"
    if untrusted:
        detail += f" ({len(untrusted)} receipt(s) not counted)"
    return _req("signed", True, detail, required=required)


def _device(spec: Spec, device: str, fresh: list[Assessed], stale: list[Assessed], cmd: "_Command",
            untrusted: list[Assessed] = (), refused: list[tuple[Assessed, list[str]]] = (),
            data: dict | None = None) -> dict:
    data = spec.data if data is None else data  # a candidate's: the contracts it is held to
    all_seeds = data["promotion"]["requires"]["all_budget_seeds"]
    seeds = list(data["budget"]["seeds"])
    on_dev = [a for a in fresh if a.device == device]
    stale_dev = [a for a in stale if a.device == device]
    # Receipts read from the sealed index share one results table when their results are the same
    # (engine/store/summary.py): what a table passed and failed is worked out once per table, not per receipt.
    tables: dict[int, _Table] = {}
    failed: list[dict] = []
    for a in on_dev:
        table = _Table.of(tables, a.receipt.results)
        table.receipts.append(a.receipt_id)
        for r in table.failed:
            failed.append({"contract": r.contract, "seed": r.seed, "dtype": r.dtype, "status": r.status,
                           "receipt_id": a.receipt_id, "message": r.message})
    passed = set().union(*(t.passed for t in tables.values()))
    missing: list[dict] = []
    if all_seeds:
        needed = {(c["id"], seed, dtype) for c in data["contracts"] for dtype in c["dtypes"] for seed in seeds}
    else:
        passed = {(cid, dt) for cid, _s, dt in passed}
        needed = {(c["id"], dtype) for c in data["contracts"] for dtype in c["dtypes"]}
    for c in data["contracts"]:
        for dtype in c["dtypes"]:
            for seed in seeds if all_seeds else [None]:
                if ((c["id"], seed, dtype) if all_seeds else (c["id"], dtype)) not in passed:
                    missing.append({"contract": c["id"], "seed": seed, "dtype": dtype})
    used: set[str] = set()
    for t in tables.values():  # a receipt counts when it passed a cell the spec needs
        cells = t.passed if all_seeds else {(cid, dt) for cid, _s, dt in t.passed}
        if not needed.isdisjoint(cells):
            used.update(t.receipts)
    run_errors = [{"receipt_id": a.receipt_id, "errors": list(a.receipt.errors)} for a in on_dev
                  if a.receipt.errors and a.receipt.status != "interrupted"]
    total = sum(len(c["dtypes"]) * (len(seeds) if all_seeds else 1) for c in data["contracts"])
    # the spec's tiers, not the receipts' (older receipts have none; a fresh receipt binds this very spec)
    tier = {c["id"]: tier_of(c) for c in data["contracts"]}
    needed = list(data["promotion"]["requires"].get("tiers") or TIERS)
    tiers = _tier_cells(data, all_seeds, seeds, tier, missing, failed, needed)
    missing_needed = [m for m in missing if tier[m["contract"]] in needed]
    failed_needed = [f for f in failed if tier.get(f["contract"], "math") in needed]
    met = bool(on_dev) and not missing_needed and not failed_needed and not run_errors
    tiers_text = ", ".join((f"{t} {n['passed']}/{n['cells']}" if n["cells"] else f"{t} none")
                           + ("" if n["required"] else " (not required)") for t, n in tiers.items())
    seed_text = f"budget seeds {','.join(map(str, seeds))}" if all_seeds else "at least one seed"
    untrusted_dev = [a for a in untrusted if a.device == device and a.state == "fresh"]
    if not on_dev:
        detail = f"no fresh {device} receipt"
        if untrusted_dev:
            whys = sorted({a.trust for a in untrusted_dev})
            detail = (f"no fresh trusted {device} receipt ({len(untrusted_dev)} fresh {device} receipt(s) not "
                      f"counted: {', '.join(whys)})")
        if stale_dev:
            detail += f" ({len(stale_dev)} stale {device} receipt(s) no longer count)"
        refused_dev = [a for a, _ in refused if a.device == device]
        if refused_dev:
            detail += f" ({len(refused_dev)} fresh {device} receipt(s) refused: see the warnings)"
    elif met:
        detail = (f"{sum(n['passed'] for n in tiers.values())}/{total} contract results passed on {device} "
                  f"({tiers_text}; {seed_text}) in {len(used)} fresh receipt(s)")
    else:
        parts = [tiers_text]
        if missing:
            by_contract: dict[str, list[dict]] = {}
            for m in missing:
                by_contract.setdefault(m["contract"], []).append(m)
            parts.append(f"{len(missing)}/{total} contract results never passed in a fresh {device} receipt: "
                         + _more([f"{cid} ({_cells(v)})" for cid, v in by_contract.items()], 4))
        if failed:
            # partial / not_applicable: an implementation held to only some of a contract (or none of it)
            kinds = "failed or errored" if {f["status"] for f in failed} <= {"failed", "error"} else "did not pass"
            parts.append(f"{len(failed)} {kinds} in fresh {device} receipts: " + _more(
                [f"{f['contract']} seed {f['seed']} {f['dtype']} {f['status']} in {_short(f['receipt_id'])}"
                 for f in failed], 3))
        if run_errors:
            parts.append("run errors in " + _more([f"{_short(e['receipt_id'])} ({e['errors'][0]})" for e in run_errors], 2))
        detail = "; ".join(parts)
    if failed or run_errors:  # they stay fresh, and so keep the gate closed, until what measured changes
        how = fix(note=f"fresh {device} receipts record failures: fix the implementation or the spec (which makes "
                       f"those receipts stale), commit, then run {shlex.join(cmd.check(device))}")
    else:
        how = fix(cmd.check(device), cmd.signing(device))
    return _req(f"device:{device}", met, detail, how,
                device=device, receipts=sorted(used) if met else sorted({a.receipt_id for a in on_dev}),
                missing=missing, failed=failed, run_errors=run_errors, tiers=tiers)


def _fresh_seeds(spec: Spec, relevant: list[Assessed], devices: list[str], cmd: "_Command",
                 implementation: str) -> dict:
    """At least one fresh receipt on a required device with seeds drawn at run time, every cell of it passed."""
    requires = spec.data["promotion"]["requires"]
    required = bool(requires.get("fresh_seeds", implementation != "default"))
    argv = cmd.check(devices[0]) + ["--seeds", "fresh"]
    if not required:
        return _req("fresh_seeds", True, "not required by the spec" if "fresh_seeds" in requires else
                    "not required for the registered implementation (promotion.requires.fresh_seeds)",
                    required=False, receipts=[])
    needed = list(requires.get("tiers") or TIERS)
    wanted = [(c["id"], d) for c in spec.data["contracts"] if tier_of(c) in needed for d in c["dtypes"]]
    drawn = [a for a in relevant if a.receipt.seed_source == "fresh"]
    complete, lacking = [], []
    for a in drawn:
        ok = {(r.contract, r.seed, r.dtype) for r in a.receipt.results if r.status == "passed"}
        seeds = a.receipt.seeds
        holes = [(cid, s, d) for cid, d in wanted for s in seeds if (cid, s, d) not in ok]
        if seeds and not holes and not a.receipt.errors:
            complete.append(a)
        else:
            lacking.append((a, holes))
    if complete:
        newest = max(complete, key=lambda a: (a.created_at or "", a.receipt_id or ""))
        seeds = ",".join(map(str, newest.receipt.seeds))
        return _req("fresh_seeds", True, f"every contract passed on fresh seeds {seeds} ({newest.device}) in "
                                         f"{_short(newest.receipt_id)}", receipts=[a.receipt_id for a in complete])
    if not drawn:
        detail = f"no fresh {'/'.join(devices)} receipt with seeds drawn at run time (the budget's are public)"
    else:
        a, holes = lacking[0]
        detail = (f"{len(drawn)} fresh-seed receipt(s), none complete: {_short(a.receipt_id)} lacks a pass for "
                  + _more([f"{cid} seed {s} {d}" for cid, s, d in holes], 3))
    return _req("fresh_seeds", False, detail, fix(argv, "; ".join(n for n in (
        "seeds drawn from the operating system when the run starts, recorded in its receipt",
        cmd.signing(devices[0])) if n)), receipts=[])


class _Table:
    """One results table (a receipt's `results`, shared by every record of the sealed index with the same ones):
    the cells it passed, the results that did not pass, and the receipts holding it."""

    __slots__ = ("results", "passed", "failed", "receipts")

    def __init__(self, results) -> None:
        self.results = results  # held, so that its id stays its own while it is a key
        self.passed = {(r.contract, r.seed, r.dtype) for r in results if r.status == "passed"}
        self.failed = [r for r in results if r.status != "passed"]
        self.receipts: list[str] = []

    @classmethod
    def of(cls, tables: dict, results) -> "_Table":
        table = tables.get(id(results))
        if table is None:
            table = tables[id(results)] = cls(results)
        return table


def _tier_cells(data: dict, all_seeds: bool, seeds: list, tier: dict[str, str], missing: list[dict],
                failed: list[dict], needed: list[str]) -> dict[str, dict]:
    """Per tier: the cells required (contract x dtype x budget seed, or x one seed), those that passed (in a fresh
    receipt and failed in none), and whether the spec requires the tier (promotion.requires.tiers, default both)."""
    cells = {(c["id"], seed, dtype) for c in data["contracts"] for dtype in c["dtypes"]
             for seed in (seeds if all_seeds else [None])}
    bad = {(m["contract"], m["seed"], m["dtype"]) for m in missing}
    bad |= {(f["contract"], f["seed"] if all_seeds else None, f["dtype"]) for f in failed}
    out = {t: {"cells": 0, "passed": 0, "required": t in needed} for t in TIERS}
    for cell in cells:
        n = out[tier[cell[0]]]
        n["cells"] += 1
        n["passed"] += cell not in bad
    return out


def _mutants(spec: Spec, relevant: list[Assessed], devices: list[str], cmd: "_Command",
             data: dict | None = None) -> dict:
    data = spec.data if data is None else data  # a candidate's: its contracts, and the mutants they kill
    required = data["promotion"]["requires"]["mutants_killed"]
    if not required:
        return _req("mutants_killed", True, "not required by the spec", required=False, receipts=[],
                    survived=[], unproven=[])
    seen: set[str] = set()
    killed: set[str] = set()
    proven: set[str] = set()
    used: set[str] = set()
    groups: dict[tuple, tuple] = {}  # records of the sealed index share their mutant verdicts: worked out once
    for a in relevant:
        rec = a.receipt
        key = (id(rec.mutants), id(rec.contracts_proven))
        g = groups.get(key)
        if g is None:
            g = groups[key] = (rec.mutants, rec.contracts_proven, {m.id for m in rec.mutants},
                               {m.id for m in rec.mutants if m.killed},
                               {cid for cid, ms in rec.contracts_proven.items() if ms}, [])
            seen |= g[2]
            killed |= g[3]
            proven |= g[4]
        if g[3] or g[4]:  # it killed a mutant or proved a contract: it is part of what met this requirement
            g[5].append(a.receipt_id)
    for g in groups.values():
        used.update(g[5])
    mutant_ids = [m["id"] for m in data["mutants"]]
    survived = [m for m in mutant_ids if m not in killed]
    unproven = [c["id"] for c in data["contracts"] if c["id"] not in proven]
    met = not survived and not unproven
    where = "/".join(devices)
    if met:
        detail = f"{len(mutant_ids)}/{len(mutant_ids)} mutants killed; every contract killed at least one"
    else:
        parts = []
        never_run = [m for m in survived if m not in seen]
        lived = [m for m in survived if m in seen]
        if lived:
            parts.append(f"survived every fresh {where} receipt: {_more(lived)}")
        if never_run:
            parts.append(f"not run in any fresh {where} receipt: {_more(never_run)}")
        if unproven:
            parts.append(f"contracts never shown to fail on a mutant: {_more(unproven)}")
        detail = "; ".join(parts)
    used = sorted(used)
    if not met and not [m for m in survived if m not in seen] and relevant:
        # every mutant ran on this code and the verdict is what it is: running it again kills nothing new
        how = fix(note="strengthen the contracts until each mutant fails one of its killed_by contracts (and each "
                       "contract fails on some mutant), then run " + shlex.join(cmd.check(devices[0])))
    else:
        how = fix(cmd.check(devices[0]), "; ".join(n for n in ("without --no-mutants", cmd.signing(devices[0])) if n))
    return _req("mutants_killed", met, detail, how, receipts=used, survived=survived, unproven=unproven)


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def _formal(spec: Spec, relevant: list[Assessed], devices: list[str], cmd: "_Command") -> dict:
    required = spec.data["promotion"]["requires"]["formal_comparison"]
    if not required:
        return _req("formal_comparison", True, "not required by the spec", required=False, receipts=[],
                    comparisons=[], diagnostic_only=0, ci_method=CI_METHOD)
    seeds = list(spec.data["budget"]["seeds"])
    groups: dict[tuple, dict] = {}
    diagnostic = 0
    runs: dict[int, tuple] = {}  # records of the sealed index share their mechanism runs: counted once
    for a in relevant:
        mech = a.receipt.mechanism
        counted = runs.get(id(mech))
        if counted is None:
            counted = runs[id(mech)] = (mech, sum(not c.formal for rec in mech for c in rec.comparisons),
                                        [(rec, c) for rec in mech for c in rec.comparisons if c.formal])
        diagnostic += counted[1]
        for rec, comp in counted[2]:
            key = (a.receipt_id, rec.contract, rec.dtype, comp.name, comp.metric)
            g = groups.setdefault(key, {"receipt_id": a.receipt_id, "device": a.device, "contract": rec.contract,
                                        "dtype": rec.dtype, "name": comp.name, "metric": comp.metric,
                                        "method": comp.method, "control": comp.control,
                                        "higher_is_better": comp.higher_is_better,
                                        "per_seed": {}, "problems": []})
            mv = [_number(v) for v in comp.method_values]
            cv = [_number(v) for v in comp.control_values]
            seed = rec.seed
            if not mv or not cv or None in mv or None in cv:
                g["problems"].append(f"seed {seed}: values empty or not finite numbers")
            elif str(seed) in g["per_seed"]:
                g["problems"].append(f"seed {seed} recorded twice")
            else:
                d = sum(mv) / len(mv) - sum(cv) / len(cv)
                g["per_seed"][str(seed)] = d if g["higher_is_better"] else -d
    evaluations = []
    for g in groups.values():
        have = [s for s in seeds if str(s) in g["per_seed"]]
        lacking = [s for s in seeds if str(s) not in g["per_seed"]]
        if lacking:
            g["problems"].append(f"budget seed(s) {','.join(map(str, lacking))} not recorded")
        if len(seeds) < 2:
            g["problems"].append(f"the budget has {len(seeds)} seed; a confidence interval needs at least 2")
        g["ci"] = None
        if len(have) >= 2:
            g["ci"] = paired_t_interval([g["per_seed"][str(s)] for s in have], CI_LEVEL)
        g["ahead"] = bool(not g["problems"] and g["ci"] is not None and g["ci"]["low"] > 0)
        evaluations.append(g)
    met = bool(evaluations) and all(g["ahead"] for g in evaluations)
    where = "/".join(devices)
    if not evaluations:
        detail = f"no formal comparison in any fresh {where} receipt"
        if diagnostic:
            detail += f" ({diagnostic} diagnostic-only comparison(s) recorded: they never count)"
    else:
        lines = []
        for g in evaluations:
            label = f"{g['name']} ({g['metric']}, {g['method']} vs {g['control']}) in {_short(g['receipt_id'])}"
            ci = g["ci"]
            if ci is not None:
                label += f": mean diff {ci['mean_diff']:+.4g}, 95% CI [{ci['low']:+.4g}, {ci['high']:+.4g}] over n={ci['n']}"
            if g["problems"]:
                label += " (" + "; ".join(g["problems"]) + ")"
            elif not g["ahead"]:
                label += " includes zero" if ci["high"] >= 0 else " is below zero: the control is ahead"
            lines.append(label)
        detail = ("every formal comparison shows the method ahead: " if met else
                  "a formal comparison does not show the method ahead: ") + "; ".join(
            lines if met else [ln for ln, g in zip(lines, evaluations) if not g["ahead"]])
    record = (f"a mechanism check must record ctx.record_comparison(..., formal=True) for the budget seeds "
              f"{','.join(map(str, seeds))}")
    mechanisms_ran = any(a.receipt.mechanism for a in relevant)
    if not evaluations and mechanisms_ran:  # the checks ran and record none: no run of this code adds one
        how = fix(note=f"the fresh receipts' mechanism runs record no formal comparison: {record} (a change to "
                       "the method's checks), then run " + shlex.join(cmd.check(devices[0])))
    elif evaluations and all(not g["problems"] for g in evaluations):  # complete, and not ahead: rerunning the
        how = fix(note="the method is not ahead of its control on the budget seeds, and rerunning the same code "
                       "measures the same: improve the method, then run " + shlex.join(cmd.check(devices[0])))
    else:  # nothing ran yet, or seeds are missing: a full run on a required device can meet it
        how = fix(cmd.check(devices[0]), "; ".join(n for n in (record, cmd.signing(devices[0])) if n))
    comparisons = [{k: g[k] for k in ("receipt_id", "device", "contract", "dtype", "name", "metric", "method",
                                      "control", "higher_is_better", "per_seed", "ci", "ahead", "problems")}
                   for g in evaluations]
    return _req("formal_comparison", met, detail, how, receipts=sorted({g["receipt_id"] for g in evaluations if g["ahead"]}),
                comparisons=comparisons, diagnostic_only=diagnostic, ci_method=CI_METHOD)


# --- what a receipt must be to count ------------------------------------------------


def refusal(a: Assessed, impl_file: str | None) -> list[str]:
    """Why a fresh receipt cannot count (empty when it can): it must come from committed code (git clean) and
    bind the spec it names and the implementation it ran (the file that registers it, when methods/ has one)."""
    rec = a.receipt
    why: list[str] = []
    git = rec.git
    if git is None:
        why.append("not run in a git checkout: whether its code was committed is unknown")
    elif git.dirty is not False:
        files = [f"untracked {n}" for n in git.untracked] + [f"modified {n}" for n in git.modified]
        why.append("ran with uncommitted code" + (f" ({_more(files, 4)})" if files else ""))
    bound = rec.bound
    if rec.spec_name not in bound:  # its digest is what freshness compares with the spec on disk
        why.append(f"does not bind its spec {rec.spec_name}")
    impl = rec.implementation
    if not impl.files_named:
        why.append("does not name the files of its implementation")
    else:
        unbound = [f for f in impl.files if f not in bound]
        if unbound:
            why.append(f"does not bind its implementation's {_more(unbound, 3)}")
    if impl_file is not None and impl_file not in bound:
        why.append(f"does not bind {impl_file}, which registers implementation {rec.spec_implementation}")
    return why


def _mutation(spec: Spec, relevant: list[Assessed], devices: list[str], cmd: "_Command",
              of_contracts: bool = False) -> dict:
    """The newest fresh, complete `contracts mutate` receipt on a required device must meet the threshold
    (`of_contracts`: an --impl unit's gate, held to the registered implementation's run, and saying so)."""
    req = _mutation_requirement(spec, relevant, devices, cmd)
    if of_contracts:
        req["detail"] = "the contracts' score, measured on the registered implementation: " + req["detail"]
    return req


def _mutation_requirement(spec: Spec, relevant: list[Assessed], devices: list[str], cmd: "_Command") -> dict:
    threshold = float(spec.data["promotion"]["requires"]["mutation_score"])
    argv = cmd.mutate()
    every = "every mutant: no --max-mutants, --only-file or --operators"
    runs = [a for a in relevant if a.receipt.mutation is not None]
    complete = [a for a in runs if a.receipt.mutation.complete]
    where = "/".join(devices)
    if not complete:
        detail = f"no fresh, complete mutation receipt on {where}"
        if runs:
            detail += f" ({len(runs)} fresh partial run(s) judged a selection of the mutants: they do not count)"
        return _req("mutation_score", False, detail, fix(argv, every), receipts=[], score=None, threshold=threshold)
    newest = max(complete, key=lambda a: (a.created_at or "", a.receipt_id or ""))
    m = newest.receipt.mutation
    score = _number(m.score)
    met = score is not None and score >= threshold
    counts = (f"{m.killed} killed, {m.survived} survived, {m.timeout} timeout, "
              f"{m.equivalent} equivalent of {m.mutants} mutants")
    shown = "n/a" if score is None else f"{score:.3f}"
    detail = (f"mutation score {shown} {'>=' if met else 'is below'} {threshold:g} in {_short(newest.receipt_id)} "
              f"({counts})")
    if not met and m.survivors:
        detail += "; survivors: " + _more(list(m.survivors), 3)
    how = fix(note="strengthen the contracts, or list a judged equivalent under equivalent_mutants with its reason, "
                   f"then run {shlex.join(argv)} ({every})")
    return _req("mutation_score", met, detail, how, receipts=[newest.receipt_id] if met else [],
                score=score, threshold=threshold)


# --- the verdict --------------------------------------------------------------


def _refusal_fix(why: list[str], cmd: "_Command", device: str) -> dict:
    run = cmd.check(device)
    if any(w.startswith(("ran with uncommitted", "not run in a git")) for w in why):
        # running it as it is writes one more receipt of the same uncommitted code
        return fix(note=f"commit (or remove) the files named, then {shlex.join(run)}")
    return fix(run, "the engine's receipts bind the spec and the implementation")


class _Command:
    """The commands a fix suggests, as argv, with the folder (and --impl) options the gate was given."""

    def __init__(self, key: str, flags: str, policy) -> None:
        self.key, self.flags, self.policy = key, shlex.split(flags), policy

    def check(self, device: str) -> list[str]:
        return ["contracts", "check", self.key, "--device", device, *self.flags]

    def mutate(self) -> list[str]:
        """`contracts mutate` plants its edits in the registered implementation: it takes no --impl."""
        out, rest = [], iter(self.flags)
        for tok in rest:
            if tok == "--impl":
                next(rest, None)
            elif not tok.startswith("--impl="):
                out.append(tok)
        return ["contracts", "mutate", self.key, *out]

    def signing(self, device: str) -> str:
        """Under a policy only a signed run counts: with what (the key itself is the pipeline's, never named here)."""
        if self.policy is None:
            return ""
        return (f"sign it with a key {self.policy.file} trusts for {device}: --sign-key FILE or "
                "$CONTRACTS_SIGNING_KEY")


def _counted(assessed: list[Assessed], spec_name: str, unit: str, policy, impl_file: str | None):
    """(usable, untrusted, fresh, refused) receipts of one (spec, implementation) unit: usable are the trusted
    ones of the unit; fresh those of them that are fresh and not refused; refused holds (receipt, reasons)."""
    # [impl] hook: (method, implementation) is the unit; a receipt of another implementation never counts here.
    usable = [a for a in assessed if a.receipt is not None and a.receipt.spec_name == spec_name
              and a.receipt.unit == unit]
    # Under a policy a receipt that is not trusted counts nowhere, not even as stale evidence.
    untrusted = [a for a in usable if policy is not None and a.trust != "trusted"]
    usable = [a for a in usable if a not in untrusted]
    refused, fresh = [], []
    why_of: dict[tuple, tuple] = {}  # records of the sealed index share what refusal reads: asked once per kind
    for a in usable:
        if a.state != "fresh":
            continue
        rec = a.receipt
        if rec.bound_map is None:  # read from its file: nothing shared
            why = refusal(a, impl_file)
        else:
            git = rec.git
            key = (id(rec.implementation), id(rec.bound_map), rec.spec_name, rec.spec_implementation,
                   None if git is None else (git.dirty, id(git.untracked), id(git.modified)))
            held = why_of.get(key)
            if held is None:  # the objects whose ids are the key are held with the answer
                held = why_of[key] = (refusal(a, impl_file), rec.implementation, rec.bound_map, git)
            why = list(held[0])
        if why:
            refused.append((a, why))
        else:
            fresh.append(a)
    return usable, untrusted, fresh, refused


def evaluate(spec: Spec, receipts_dir: Path, root: Path, specs_dir: Path, flags: str = "",
             assessed: list[Assessed] | None = None, cache=None, implementation: str = "default", policy=None,
             store: str | None = None, shown: Optional[Callable[[str], str]] = None,
             assessed_of: Optional[Callable[[str], list[Assessed]]] = None,
             validate: Optional[Callable] = None) -> dict:
    """The gate verdict for one valid spec (see GATE_SCHEMA); never imports torch.

    `flags` are appended to every suggested command (e.g. ' --receipts DIR')
    so the fix works for the store that was evaluated. `cache` (engine.store.cache)
    is passed on to `assess_receipts`: only `list` passes one, for display; the
    verbs that decide (gate, promote, verify) and the TUI's Gate tab pass none, so
    every verdict comes from the bytes on disk. `implementation` is the unit evaluated:
    'default' (the spec's registered implementation) or 'impl:<digest>' (an --impl
    target, engine.run.impl_loader.unit_of); only its receipts count. `policy`
    (engine.store.trust) counts only receipts signed by a key it trusts for their
    device kind; `store` is how the receipts folder is named in the output, and `shown` how a receipt file
    (its name inside the store, `<method>/<file>`) is: the CLI names it by its path (docs/cli.md, "Paths").
    `assessed_of(key)` gives a dependency's assessed receipts (a read model that has them already), and
    `validate(path, root)` validates a dependency's spec as `spec` was validated (a reading verb's sealed cache,
    engine.store.sealed.validate_spec; by default engine.spec.memo.validate_file).
    """
    shown = shown or (lambda rel: rel)
    key = spec.key
    promo = spec.data["promotion"]
    requires = promo["requires"]
    if assessed is None:
        assessed, _ = assess_receipts(receipts_dir, root, specs_dir, key, cache=cache, policy=policy)
    from engine.spec.applies import candidate_view
    from engine.spec.registry import implementation_file

    spec_name = f"specs/{spec.path.name}"
    impl_file = implementation_file(spec.data["implementation"])
    usable, untrusted, fresh, refused = _counted(assessed, spec_name, implementation, policy, impl_file)
    stale = [a for a in usable if a.state == "stale"]
    broken = [a for a in assessed if a.state in ("tampered", "invalid")]
    devices = list(requires["devices"])
    cmd = _Command(key, flags, policy)
    relevant = [a for a in fresh if a.device in devices]

    # A candidate is held to the contracts that apply to it: never to one about how the registered implementation
    # is built (applies_to: registered), which its check does not run.
    held = spec.data if implementation == "default" else candidate_view(spec.data)
    requirements = [_review(spec, receipts_dir, policy, flags)]
    requirements += [_device(spec, dev, fresh, stale, cmd, untrusted, refused, data=held) for dev in devices]
    requirements.append(_fresh_seeds(spec, relevant, devices, cmd, implementation))
    requirements.append(_mutants(spec, relevant, devices, cmd, data=held))
    requirements.append(_formal(spec, relevant, devices, cmd))
    requirements.append(_signed(spec, policy, untrusted, flags))
    if requires.get("mutation_score") is not None:  # only when the spec asks: older verdicts keep their shape
        measured = relevant
        if implementation != "default":
            # The score measures the contracts (bugs planted in the registered implementation, caught or not);
            # `contracts mutate` takes no --impl, so a candidate is held to the contracts' own fresh score.
            own_fresh = _counted(assessed, spec_name, "default", policy, impl_file)[2]
            measured = [a for a in own_fresh if a.device in devices]
        requirements.append(_mutation(spec, measured, devices, cmd, of_contracts=implementation != "default"))
    if requires.get("policy") is not None:  # the page's evidence is a real model: shown on one (policy_evidence)
        from engine.gate import policy_evidence

        requirements.append(policy_evidence.requirement(spec, relevant, devices, cmd, _req, fix, _short))
    # the specs this method's evidence rests on (depends_on: the control arm's grpo): each holds on this tree
    from engine.gate import dependencies

    requirements += dependencies.requirements(
        spec, receipts_dir, root, specs_dir, flags, policy, _req, fix, _counted, _device, _mutants, _Command,
        assessed_of or (lambda key: assess_receipts(receipts_dir, root, specs_dir, key, cache=cache, policy=policy)[0]),
        validate)
    promotable = all(r["met"] for r in requirements)

    reasons = [f"{r['id']}: {r['detail']} -> {r['fix']}" for r in requirements if not r["met"]]
    warnings = []
    newest_first = sorted(stale, key=lambda a: a.created_at or "", reverse=True)
    if len(stale) == 1:
        a = stale[0]
        warnings.append(f"stale receipt {shown(a.file)} ({a.device}, {a.created_at}) does not count; changed: "
                        f"{_more(a.changed, 4)}")
    elif stale:  # one line however many: the store only grows, the verdict must not
        a = newest_first[0]
        warnings.append(f"{len(stale)} stale receipts do not count (the newest, {shown(a.file)} ({a.device}, "
                        f"{a.created_at}), changed: {_more(a.changed, 4)}); contracts verify {key}{flags} names "
                        "each")
    for a, why in refused:
        warnings.append(f"refused receipt {shown(a.file)} ({a.device}) does not count: {'; '.join(why)} -> "
                        f"{_refusal_fix(why, cmd, a.device or devices[0])['fix']}")
    for a in untrusted[:_SHOW]:
        warnings.append(f"receipt {shown(a.file)} ({a.device}, {a.state}) is not counted: {a.trust_message}")
    if len(untrusted) > _SHOW:
        warnings.append(f"+{len(untrusted) - _SHOW} more receipt(s) not counted under {policy.file}")
    for a in broken:
        warnings.append(f"{a.state} receipt {shown(a.file)} is ignored: {a.message} (see contracts verify {key}{flags})")
    if promo["state"] == "promoted" and not promotable:
        warnings.append(f"{spec.display} says promoted but the gate is closed: "
                        f"contracts demote {key} --reason TEXT{flags}")
    justified = sorted({rid for r in requirements if r["met"] and r["required"] for rid in r.get("receipts", [])})
    return {
        "schema": GATE_SCHEMA,
        "schema_version": GATE_SCHEMA_VERSION,
        "method": key,
        "implementation": implementation,
        "spec": {"file": spec.display, "sha256": spec.sha256},
        "store": store if store is not None else str(receipts_dir),
        "trust": policy.as_dict() if policy is not None else None,
        "verdict": "promotable" if promotable else "not promotable",
        "promotable": promotable,
        "state": promo["state"],
        "review": promo["review"],
        "requires": dict(requires),
        "requirements": requirements,
        "reasons": reasons,
        "warnings": warnings[:MAX_WARNINGS],  # a store full of junk files must not make the verdict megabytes long
        "warnings_total": len(warnings),
        "receipts": {
            "fresh": [a.receipt_id for a in fresh],
            "stale": [{"file": shown(a.file), "receipt_id": a.receipt_id, "device": a.device, "changed": a.changed}
                      for a in stale],
            "refused": [{"file": shown(a.file), "receipt_id": a.receipt_id, "device": a.device, "reasons": why,
                         **_refusal_fix(why, cmd, a.device or devices[0])} for a, why in refused],
            "tampered": [{"file": shown(a.file), "message": a.message} for a in broken if a.state == "tampered"],
            "invalid": [{"file": shown(a.file), "message": a.message} for a in broken if a.state == "invalid"],
            "untrusted": [{"file": shown(a.file), "receipt_id": a.receipt_id, "device": a.device, "state": a.state,
                           "why": a.trust, "message": a.trust_message} for a in untrusted],
        },
        "justified_by": justified if promotable else [],
        "evidence": _evidence(requirements, fresh, policy),
        "ci_method": CI_METHOD,
        "evaluated_at": utc_now(),
    }


def _evidence(requirements: list[dict], fresh: list[Assessed], policy) -> dict:
    """What the met requirements counted and whether it is signed: without a policy nothing is verified."""
    counted = sorted({rid for r in requirements if r["met"] and r["required"] for rid in r.get("receipts", [])})
    by_id = {a.receipt_id: a for a in fresh}

    def state(rid: str) -> str:
        if policy is not None:
            return "trusted"  # under a policy only trusted receipts count at all
        return "unverified" if by_id.get(rid) is not None and by_id[rid].signed_by else "unsigned"

    review = next((r.get("review") for r in requirements if r["id"] == "review" and r["met"]), None)
    receipts = [{"receipt_id": rid, "signature": state(rid)} for rid in counted]
    unsigned = any(x["signature"] != "trusted" for x in receipts) or (
        review is not None and review["signature"] != "trusted")
    return {"trust_policy": policy is not None, "unsigned": unsigned, "receipts": receipts,
            "review": None if review is None else {"seq": review["seq"], "signature": review["signature"]}}


def published(result: dict) -> dict:
    """The verdict as GATE_SCHEMA publishes it (`gate --json`): every `fix` is {"argv": [...]} or null, `note` beside
    it; the one-line text stays in `reasons` and the warnings."""

    def one(item: dict) -> dict:
        out = {k: v for k, v in item.items() if k not in ("fix", "argv", "note")}
        out["fix"] = {"argv": list(item["argv"])} if item.get("argv") else None
        out["note"] = item.get("note") or ""
        return out

    doc = dict(result)
    doc["requirements"] = [one(r) for r in result["requirements"]]
    doc["receipts"] = {**result["receipts"], "refused": [one(r) for r in result["receipts"].get("refused", [])]}
    return doc
