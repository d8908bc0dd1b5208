"""The gate's `policy:<kind>` requirement: the page's evidence is a real model, so the method is shown on one.

A spec whose paper reports its results on a real checkpoint says so in `promotion.requires.policy`
(`{kind: hf, contracts: [mechanism]}`): then, beside the tiny policies' runs, the gate needs a fresh receipt on
a required device whose mechanism runs trained that kind of policy (`contracts check METHOD --only mechanism
--policy hf:DIR`), in which every named contract ran on that policy and passed for each seed it ran (every
budget seed when `all_budget_seeds`), with no failure or error among them. The checkpoint is the researcher's
(a folder on their disk): no command can name it, so the fix is a note with the command to complete.
"""

from __future__ import annotations

import shlex
from typing import Callable


def requirement(spec, relevant: list, devices: list[str], cmd, req: Callable, fix: Callable, short: Callable) -> dict:
    """`policy:<kind>` for `spec` (whose promotion.requires has `policy`) over the fresh receipts on the required
    devices (`relevant`, of the unit being gated). `req`, `fix` and `short` are the verdict module's helpers."""
    want = spec.data["promotion"]["requires"]["policy"]
    kind = want["kind"]
    contracts = list(want["contracts"])
    all_seeds = bool(spec.data["promotion"]["requires"]["all_budget_seeds"])
    rid = f"policy:{kind}"
    on_kind = [a for a in relevant if a.receipt.policy_kind == kind]
    complete, lacking = [], []
    for a in on_kind:
        rec = a.receipt
        passed = {(r.contract, r.seed) for r in rec.results if r.status == "passed"}
        bad = [r for r in rec.results if r.contract in contracts and r.status not in ("passed", "not_applicable")]
        seeds = list(rec.budget_seeds or rec.seeds) if all_seeds else sorted({r.seed for r in rec.results if r.contract in contracts
                                                                    and r.status == "passed"})[:1]
        holes = [f"{c} seed {s}" for c in contracts for s in seeds if (c, s) not in passed]
        unused = [c for c in contracts if c not in rec.policy_used_by]
        if seeds and not holes and not bad and not unused and not rec.errors:
            complete.append(a)
        else:
            why = ([f"{c} did not train the {kind} policy" for c in unused]
                   + [f"{r.contract} seed {r.seed} {r.status}" for r in bad] + [f"no pass for {h}" for h in holes]
                   + (["a run-level error"] if rec.errors else []) + ([] if seeds else ["no seed ran"]))
            lacking.append((a, why))
    template = shlex.join([*cmd.check(devices[0]), *(t for c in contracts for t in ("--only", c))]) \
        + f" --policy {kind}:DIR --lora-rank 8"
    if complete:
        newest = max(complete, key=lambda a: (a.created_at or "", a.receipt_id or ""))
        return req(rid, True, f"{', '.join(contracts)} passed on a {kind} policy in {short(newest.receipt_id)} "
                              f"({newest.device})", receipts=[a.receipt_id for a in complete], kind=kind,
                   contracts=contracts)
    if not on_kind:
        detail = (f"the page's evidence is a real model: no fresh {'/'.join(devices)} receipt whose "
                  f"{', '.join(contracts)} trained a {kind} policy")
    else:
        a, why = max(lacking, key=lambda x: (x[0].created_at or "", x[0].receipt_id or ""))  # the newest says most
        detail = f"{len(on_kind)} fresh {kind} receipt(s), none complete: {short(a.receipt_id)}: {'; '.join(why[:3])}"
    note = (f"run {template} with DIR a local checkpoint folder (a causal LM and its tokenizer, e.g. the page's "
            "public checkpoint)")
    signing = cmd.signing(devices[0])
    return req(rid, False, detail, fix(None, "; ".join(n for n in (note, signing) if n)), receipts=[], kind=kind,
               contracts=contracts)
