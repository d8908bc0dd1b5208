"""`contracts gate`: may this method be promoted?"""

from __future__ import annotations

from typing import Annotated

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.common import (
    JsonOpt,
    NoCacheOpt,
    ReceiptsOpt,
    SpecsOpt,
    _dirs,
    _flags,
    _out,
    _print_json,
    _spec_cache,
    app,
    handles_errors,
)
from engine.paths import spec_path


def _print_gate(result: dict) -> None:
    """Plain lines (no wrapping, no markup): one per requirement; an unmet one ends with the command that meets it."""
    head = "PROMOTABLE" if result["promotable"] else "NOT PROMOTABLE"
    _out(f"{result['method']}: {head} (state {result['state']}, review {result['review']})")
    for r in result["requirements"]:
        if r["required"]:
            _out(f"  {'met  ' if r['met'] else 'UNMET'} {r['id']}: {r['detail']}"
                       + ("" if r["met"] else f" -> {r['fix']}"))
    for w in result["warnings"]:
        _out(f"  warning: {w}")
    more = result.get("warnings_total", 0) - len(result["warnings"])
    if more > 0:
        _out(f"  warning: +{more} more (contracts verify {result['method']} lists every receipt)")


@app.command()
@handles_errors
def gate(
    method: Annotated[str, typer.Argument(help="Method key, e.g. tapo-trajectory.")],
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
    no_cache: NoCacheOpt = False,
) -> None:
    """May this method be promoted? Exit 0 when every requirement is met by fresh receipts, 1 when not."""
    from engine.gate.verdict import evaluate

    specs_dir, receipts_dir = _dirs(specs, receipts)
    cache = _spec_cache(receipts_dir, use=not no_cache)
    spec = cache.load_spec(spec_path(specs_dir, method), _paths.project_root())
    result = evaluate(spec, receipts_dir, _paths.project_root(), specs_dir, _flags(specs, receipts), cache=cache)
    if json_out:
        _print_json(result)
    else:
        _print_gate(result)
    raise typer.Exit(E.EXIT_OK if result["promotable"] else E.EXIT_FAILED)
