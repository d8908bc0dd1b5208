"""`contracts review METHOD`: whether a ledger review approves the spec as it is; `--approve` records one."""

from __future__ import annotations

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
    _flags,
    _out,
    _print_json,
    _trust_policy,
    app,
    handles_errors,
)
from engine.paths import spec_path


def _text(value: Optional[str], option: str, example: str, limit: int) -> str:
    text = (value or "").strip()
    if not text:
        raise E.UsageError(f"{option} is empty; give it, e.g. {option} {example}")
    if len(text) > limit:
        raise E.UsageError(f"{option} is {len(text)} characters; keep it under {limit}")
    return text


@app.command()
@handles_errors
def review(
    method: Annotated[str, typer.Argument(help="Method key.")],
    approve: Annotated[bool, typer.Option("--approve", help="Approve the spec's reviewed fields as they are now: "
                                                            "append a review to the ledger.")] = False,
    reviewer: Annotated[Optional[str], typer.Option("--reviewer", metavar="NAME",
                                                    help="Who reviewed (recorded; with --approve).")] = None,
    note: Annotated[Optional[str], typer.Option("--note", metavar="TEXT",
                                                help="What was checked (recorded; with --approve).")] = None,
    sign_key: Annotated[Optional[Path], typer.Option("--sign-key", metavar="FILE",
                                                     help="The reviewer's ed25519 private key (contracts keys "
                                                          "generate); under a trust policy only reviews signed by a "
                                                          "key it lists under reviewers: count.")] = None,
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
    trust: TrustOpt = None,
) -> None:
    """Show whether a ledger review approves METHOD's spec as it is now (exit 0) or not (exit 1, naming the fields
    changed since the last review); with --approve, record a review of it (the spec file is not touched)."""
    from engine.gate import review as rv
    from engine.spec.memo import load_spec

    specs_dir, receipts_dir = _dirs(specs, receipts)
    policy = _trust_policy(trust, receipts_dir)
    spec = load_spec(spec_path(specs_dir, method), _paths.project_root())
    if not approve:
        if reviewer is not None or note is not None or sign_key is not None:
            raise E.UsageError("--reviewer, --note and --sign-key record a review: add --approve")
        j = rv.judge(spec, receipts_dir, policy)
        if json_out:
            _print_json({"method": spec.key, "spec": spec.display, **j})
        else:
            _out(f"{spec.key}: reviewed fields sha256 {j['digest']}")
            if j["counted"]:
                c = j["counted"]
                _out(f"  approved by ledger entry {c['seq']} ({c['reviewer']}, {c['reviewed_at']}), {c['message']}")
            elif j["changed"]:
                _out(f"  stale: changed since ledger entry {j['newest']['seq']}: {rv.describe(j['changed'], 50)}")
            else:
                _out("  no review in the ledger approves this spec")
            for n in j["not_counted"][:6]:
                _out(f"  not counted: entry {n['seq']}: {n['why']}")
            if not j["counted"]:
                _out(f"  -> {rv.review_command(spec.key, _flags(specs, receipts), policy)}")
        raise typer.Exit(E.EXIT_OK if j["counted"] else E.EXIT_FAILED)
    from engine.store.receipts import ensure_writable, git_revision

    who = _text(reviewer, "--reviewer", "'A. Reviewer'", 200)
    why = _text(note, "--note", "'checked every tolerance against the page'", 2000)
    ensure_writable(receipts_dir)
    entry = rv.record(spec, receipts_dir, who, why, sign_key, git_revision(_paths.project_root()))
    signature = entry["signature"]
    summary = {"seq": entry["seq"], "reviewed_sha256": entry["review"]["spec"]["reviewed_sha256"],
               "signed_by": signature["keyid"] if signature else None}
    if json_out:
        _print_json({"method": spec.key, "recorded": summary})
    else:
        _out(f"{spec.key}: review by {who} recorded in ledger entry {entry['seq']} (reviewed fields sha256 "
             f"{summary['reviewed_sha256'][:12]}, " + (f"signed by {signature['keyid'][:16]})" if signature else
                                                        "unsigned: no trust policy will count it)"))
