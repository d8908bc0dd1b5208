"""`contracts tui`: the Textual app, loaded lazily here at the front door (the engine never imports tui)."""

from __future__ import annotations

import sys
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
    _print_json,
    _trust_policy,
    app,
    handles_errors,
)


@app.command()
@handles_errors
def tui(
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    keys: Annotated[Optional[str], typer.Option(
        "--keys", metavar="ID=KEY,...", envvar="CONTRACTS_TUI_KEYS",
        help="Remap keys by binding id, e.g. 'copy=c,failures=x' (ids are listed under ? in the app).")] = None,
    poll: Annotated[float, typer.Option(
        "--poll", min=0.0, metavar="SECONDS", help="Seconds between checks for new receipts and edited specs (0: only on r).")] = 3.0,
    json_out: JsonOpt = False,
    trust: TrustOpt = None,
) -> None:
    """Browse methods, contracts, receipts and gate verdicts in the terminal.

    With --json, print what the first screen would show (per method: review,
    promotion, gate verdict, contract statuses per device) and exit.
    """
    from tui.app import binding_ids, create_app, parse_keys

    from pathlib import Path

    from engine.cli.common import shown_path
    from engine.store.overview import Overview

    specs_dir, receipts_dir = _dirs(specs, receipts)
    Overview(specs_dir, receipts_dir, _paths.project_root()).require_store(shown_path)  # exit 2, as every reader
    policy = _trust_policy(trust, receipts_dir)  # a bad policy is a usage error here, before the app starts
    trust_file = Path(policy.file) if policy is not None else None  # the Gate tab reads it afresh each time
    try:
        keymap = parse_keys(keys)
    except ValueError as err:
        raise E.UsageError(f"--keys: {err}") from None
    unknown = sorted(set(keymap) - binding_ids())
    if unknown:
        raise E.UsageError(f"--keys: no binding with id {', '.join(unknown)}; valid ids: {', '.join(sorted(binding_ids()))}")
    if json_out:
        from engine.store.index import Freshness, ReceiptIndex
        from engine.store.browse import build_model, model_as_dict

        model = build_model(specs_dir, receipts_dir, _paths.project_root(), ReceiptIndex(receipts_dir),
                            Freshness(_paths.project_root(), specs_dir), gates=True, trust=trust_file)
        _print_json(model_as_dict(model))
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise E.EnvironmentProblem("contracts tui needs an interactive terminal; for scripts use "
                                   "contracts tui --json or contracts list --json")
    browser = create_app(specs_dir, receipts_dir, _paths.project_root(), poll_seconds=poll or None, keymap=keymap,
                         trust=trust_file)
    browser.run()
    if browser.return_code:  # the app stopped on an error (Textual printed it): not a clean exit
        raise typer.Exit(E.EXIT_INTERNAL)
