"""`contracts gate`: may this method be promoted?"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.colour import bad
from engine.cli.common import (
    JsonOpt,
    NoCacheOpt,
    ReceiptsOpt,
    SpecsOpt,
    TrustOpt,
    SealedSpecs,
    _dirs,
    _flags,
    _out,
    _print_json,
    _sealed,
    _store_name,
    _trust_policy,
    receipt_shown,
    shown_path,
    app,
    handles_errors,
)
from engine.paths import spec_path
from engine.text import term_safe


def _print_gate(result: dict) -> None:
    """Plain lines (no wrapping, no markup): one per requirement; an unmet one ends with the command that meets it."""
    head = "PROMOTABLE" if result["promotable"] else "NOT PROMOTABLE"
    unit = "" if result.get("implementation", "default") == "default" else \
        f" (implementation id {result['implementation'][5:17]})"
    _out(f"{result['method']}{unit}: {head} (state {result['state']}, review {result['review']})")
    for r in result["requirements"]:
        if r["required"]:
            # the colour codes are ours; everything after the word is data, made terminal-safe
            typer.echo(f"  {'met  ' if r['met'] else bad('UNMET')} " + term_safe(f"{r['id']}: {r['detail']}"
                       + ("" if r["met"] else f" -> {r['fix']}")))
    ev = result.get("evidence") or {}
    if ev.get("unsigned"):
        what = [f"{len(ev['receipts'])} receipt(s)"] if ev["receipts"] else []
        what += ["the review"] if ev.get("review") else []
        _out(f"  unsigned: {' and '.join(what)} counted without a trust policy, so not verified (anyone who can "
             "write the store could have written it; gate --trust POLICY.yaml verifies)")
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
    impl: Annotated[Optional[str], typer.Option("--impl", metavar="TARGET", help="Gate this implementation (path/to/file.py, "
                                                                "package.module or module:attribute) instead of the "
                                                                "registered one: only receipts of its exact files "
                                                                "count.")] = None,
    trust: TrustOpt = None,
) -> None:
    """May this method be promoted? Exit 0 when every requirement is met by fresh receipts, 1 when not.

    The verdict is derived from the files (the spec, every receipt's bytes, the working tree): the store's
    validation cache and index, which anyone who can write the store can edit, are never read here; what the same
    bytes were judged as before may come from the user's sealed cache (not under a trust policy or --no-cache).
    """
    from engine.store.overview import Overview

    specs_dir, receipts_dir = _dirs(specs, receipts)
    policy = _trust_policy(trust, receipts_dir)
    unit, flags = "default", _flags(specs, receipts)
    if impl is not None:  # [impl] hook: (method, implementation) is the unit; the target is hashed, never run
        import shlex

        from engine.run.impl_loader import SUBJECT_PREFIX, identity, parse_target

        unit = SUBJECT_PREFIX + identity(parse_target(impl))["digest"]
        flags += f" --impl {shlex.quote(impl)}"
    # every receipt and the spec are read and hashed; what these exact bytes were judged before comes from this
    # user's sealed cache (never the store's files), freshness and signatures are decided now
    sealed = _sealed(no_cache, policy)
    overview = Overview(specs_dir, receipts_dir, _paths.project_root(), policy=policy, flags=flags,
                        shown=receipt_shown(receipts_dir), store=_store_name(receipts_dir), sealed=sealed)
    spec = SealedSpecs(sealed).load_spec(spec_path(specs_dir, method), _paths.project_root())
    overview.require_store(shown_path)
    result = dict(overview.verdict(spec, unit).result)
    if json_out:
        from engine.gate.verdict import published

        _print_json(published(result))
    else:
        _print_gate(result)
    raise typer.Exit(E.EXIT_OK if result["promotable"] else E.EXIT_FAILED)
