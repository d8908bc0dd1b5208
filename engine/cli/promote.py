"""`contracts promote` and `contracts demote`: change promotion.state behind the gate; ledger it."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Optional

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.common import (
    JsonOpt,
    ReceiptsOpt,
    SpecsOpt,
    TrustOpt,
    _dirs,
    _err,
    _flags,
    _out,
    _print_json,
    _store_name,
    _trust_policy,
    receipt_shown,
    app,
    handles_errors,
)
from engine.cli.gate import _print_gate
from engine.paths import spec_path


def _check_reason(reason: str) -> str:
    text = reason.strip()
    if not text:
        raise E.UsageError("--reason is empty; say why, e.g. --reason 'fresh CUDA receipts and a formal comparison'")
    if len(text) > 2000:
        raise E.UsageError(f"--reason is {len(text)} characters; keep it under 2000")
    return text


def _change_state(method: str, new_state: str, reason: str, by: Optional[str], specs: Optional[Path],
                  receipts: Optional[Path], json_out: bool, trust: Optional[Path] = None,
                  allow_unsigned: bool = False) -> None:
    from engine.gate.promote import rewrite_state
    from engine.gate.verdict import evaluate
    from engine.spec.memo import load_spec
    from engine.store import ledger
    from engine.store.receipts import ensure_writable, git_revision

    reason = _check_reason(reason)
    action = "promote" if new_state == "promoted" else "demote"
    specs_dir, receipts_dir = _dirs(specs, receipts)
    policy = _trust_policy(trust, receipts_dir)
    if action == "promote" and policy is None and not allow_unsigned:
        # without a policy nothing is verified: anyone who can write the store could have written the evidence
        raise E.UsageError("promote without a trust policy would count unsigned receipts and an unsigned review: "
                           "give --trust POLICY.yaml (or CONTRACTS_TRUST), or --allow-unsigned to promote on "
                           "unverified evidence anyway")
    path = spec_path(specs_dir, method)
    spec = load_spec(path, _paths.project_root())  # as the gate reads it
    result = evaluate(spec, receipts_dir, _paths.project_root(), specs_dir, _flags(specs, receipts),
                      policy=policy, store=_store_name(receipts_dir), shown=receipt_shown(receipts_dir))
    old_state = spec.data["promotion"]["state"]
    from engine.gate.verdict import published

    out = {"method": spec.key, "action": action, "changed": False, "old_state": old_state, "new_state": new_state,
           "ledger_entry": None, "gate": published(result)}
    if action == "promote" and not result["promotable"]:
        if json_out:
            _print_json(out)
        else:
            _print_gate(result)
            _err(f"not promoted: the gate is closed ({len(result['reasons'])} unmet requirement(s))")
        raise typer.Exit(E.EXIT_FAILED)
    if old_state == new_state:
        if json_out:
            _print_json(out)
        else:
            _err(f"{spec.key} is already {new_state}; nothing changed, nothing ledgered")
        raise typer.Exit(E.EXIT_OK)
    ensure_writable(receipts_dir)  # the ledger must be writable before the spec changes
    old, new = rewrite_state(path, new_state, expect_sha256=spec.sha256)
    try:
        entry = ledger.append(
            receipts_dir, method=spec.key, action=action, old_state=old_state, new_state=new_state, reason=reason,
            by=by, receipts=result["justified_by"] if action == "promote" else [],
            gate={"promotable": result["promotable"], "unmet": [r["id"] for r in result["requirements"] if not r["met"]]},
            spec={"file": f"specs/{path.name}", "sha256_before": spec.sha256,
                  "sha256_after": hashlib.sha256(new).hexdigest()},
            git=git_revision(_paths.project_root()),
            trust=None if policy is None else {"file": policy.file, "sha256": policy.sha256},
            unsigned=bool(result["evidence"]["unsigned"]) if action == "promote" else False,
            review=(result["evidence"]["review"] or {}).get("seq") if action == "promote" else None)
    except BaseException:
        path.write_bytes(old)  # no ledger entry, no state change
        raise
    out.update(changed=True, ledger_entry=entry)
    if json_out:
        _print_json(out)
    else:
        _out(f"{spec.key}: promotion.state {old_state} -> {new_state} in {spec.display}; ledger entry "
                   f"{entry['seq']}" + (f" (receipts {', '.join(r[:12] for r in entry['receipts'])})"
                                        if entry["receipts"] else ""))


def _locked_change(method: str, new_state: str, reason: str, by: Optional[str], specs: Optional[Path],
                   receipts: Optional[Path], json_out: bool, trust: Optional[Path] = None,
                   allow_unsigned: bool = False) -> None:
    """`_change_state` with the store's promotion lock held, so concurrent promote/demote take turns."""
    from engine.spec.loader import check_key
    from engine.store.locking import PROMOTION_LOCK, exclusive

    check_key(method)  # a path trick is refused before any file (the lock file included) is touched
    with exclusive(_dirs(specs, receipts)[1], PROMOTION_LOCK):
        _change_state(method, new_state, reason, by, specs, receipts, json_out, trust, allow_unsigned)


ReasonOpt = Annotated[str, typer.Option("--reason", metavar="TEXT", help="Why (recorded in the ledger).")]
ByOpt = Annotated[Optional[str], typer.Option("--by", metavar="NAME", help="Who decided (recorded in the ledger; e.g. evolve).")]


@app.command()
@handles_errors
def promote(
    method: Annotated[str, typer.Argument(help="Method key.")],
    reason: ReasonOpt,
    by: ByOpt = None,
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
    trust: TrustOpt = None,
    allow_unsigned: Annotated[bool, typer.Option("--allow-unsigned", help="Promote without a trust policy: the "
                                                                          "receipts and the review counted are not "
                                                                          "verified (recorded in the ledger).")] = False,
) -> None:
    """Set promotion.state: promoted, only when the gate is open; ledger the change."""
    _locked_change(method, "promoted", reason, by, specs, receipts, json_out, trust, allow_unsigned)


@app.command()
@handles_errors
def demote(
    method: Annotated[str, typer.Argument(help="Method key.")],
    reason: ReasonOpt,
    by: ByOpt = None,
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
    trust: TrustOpt = None,
) -> None:
    """Set promotion.state: not-promoted (always allowed); ledger the change."""
    _locked_change(method, "not-promoted", reason, by, specs, receipts, json_out, trust)
