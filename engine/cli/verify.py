"""`contracts verify`: integrity, schema and freshness of every receipt, and the ledger."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.common import (
    JsonOpt,
    NoCacheOpt,
    ReceiptsOpt,
    SpecsOpt,
    TrustOpt,
    SealedSpecs,
    _dirs,
    _err,
    _out,
    _print_json,
    _sealed,
    _spec_states,
    _trust_policy,
    app,
    handles_errors,
    receipt_shown,
    shown_path,
)
from engine.spec.loader import spec_files


@app.command()
@handles_errors
def verify(
    method: Annotated[Optional[str], typer.Argument(help="Only this method's receipts (default: all).")] = None,
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    strict: Annotated[bool, typer.Option("--strict", help="Count stale receipts as a problem too.")] = False,
    json_out: JsonOpt = False,
    no_cache: NoCacheOpt = False,
    trust: TrustOpt = None,
) -> None:
    """Integrity, schema and freshness of every receipt, and the promotion ledger. Exit 1 on any problem.

    Every verdict comes from the files (never the store's validation cache; what the same bytes were judged as
    before may come from the user's sealed cache, except under a trust policy or with --no-cache). Under a trust policy each receipt also
    says whether it would count: a bad signature is a problem; unsigned or untrusted-key receipts are one with
    --strict.
    """
    from engine.spec.loader import check_key
    from engine.store.coverage import coverage
    from engine.store.overview import Overview

    specs_dir, receipts_dir = _dirs(specs, receipts)
    if method is not None:
        check_key(method)
        if not (receipts_dir / method).is_dir() and not (specs_dir / f"{method}.yaml").is_file():
            known = sorted({p.stem for p in spec_files(specs_dir)} |
                           ({p.name for p in receipts_dir.iterdir() if p.is_dir()} if receipts_dir.is_dir() else set()))
            raise E.UsageError(f"no receipts and no spec for method {method!r}; known: {', '.join(known) or '(none)'}")
    policy = _trust_policy(trust, receipts_dir)
    # every file is read and hashed; what these exact bytes were judged before comes from this user's sealed cache
    # (engine/store/sealed.py; never the store's files), freshness and signatures are decided now
    sealed = _sealed(no_cache, policy)
    overview = Overview(specs_dir, receipts_dir, _paths.project_root(), policy=policy, sealed=sealed)
    overview.require_store(shown_path)  # "0 receipts, OK" would pass a store that is not there (a typo, a lost mount)
    cache = SealedSpecs(sealed)
    states, state_problems = _spec_states(specs_dir, method, cache)
    started = time.perf_counter()
    report = overview.store_report(method, states)  # every file read and hashed, whatever the index says
    took = time.perf_counter() - started
    report.ledger.problems.extend(state_problems)
    counts = report.counts()
    shown = receipt_shown(receipts_dir)
    specs_by_key = _specs(specs_dir, {r.method for r in report.receipts if r.predicate is not None}, cache)
    coverages = {id(r): None if r.predicate is None else coverage(r.predicate, specs_by_key.get(r.method))
                 for r in report.receipts}
    judged = [r for r in report.receipts if r.trust is not None and r.state in ("fresh", "stale")]
    trust_counts = {w: sum(r.trust == w for r in judged) for w in ("trusted", "unsigned", "untrusted key",
                                                                    "bad signature", "unsandboxed",
                                                                    "checked in candidate")}
    bad = counts["tampered"] + counts["invalid"] + (counts["stale"] if strict else 0) + trust_counts["bad signature"] \
        + ((trust_counts["unsigned"] + trust_counts["untrusted key"] + trust_counts["unsandboxed"]
            + trust_counts["checked in candidate"]) if strict else 0)
    ok = not bad and not report.ledger.problems
    if json_out:
        ledger = {**report.ledger.as_dict(), "file": shown(report.ledger.file)}
        _print_json({"receipts": [{**r.as_dict(), "file": shown(r.file),
                                   "coverage": None if coverages[id(r)] is None else coverages[id(r)].as_dict()}
                                  for r in report.receipts], "counts": counts,
                     "leftovers": [shown(f) for f in report.leftovers], "ledger": ledger, "strict": strict, "ok": ok,
                     "trust": None if policy is None else {**policy.as_dict(), "counts": trust_counts}})
    else:
        for r in report.receipts:
            tail = f"  {r.message}" if r.message else ""
            if r.trust is not None and r.state in ("fresh", "stale"):
                tail += f"  [{r.trust_message}]"
            elif r.signed_by and r.state in ("fresh", "stale"):
                tail += f"  [signed by {', '.join(k[:16] for k in r.signed_by)}; not checked: no --trust policy]"
            cov = coverages[id(r)]
            status = (r.status or "-") + ("" if cov is None else f", {cov.text()}")
            _out(f"{r.state:<8} {shown(r.file)}  {status}{tail}")
        for f in report.leftovers:
            _out(f"leftover {shown(f)}  temporary file of an interrupted write; never a receipt, safe to delete")
        led = report.ledger
        _out(f"ledger   {shown(led.file)}  {len(led.entries)} entr{'y' if len(led.entries) == 1 else 'ies'}, "
                   + ("ok" if not led.problems else f"{len(led.problems)} problem(s)"))
        for p in led.problems:
            _out(f"  {p}")
        _err(f"{len(report.receipts)} receipt(s): " + ", ".join(f"{n} {s}" for s, n in counts.items())
             + ("" if policy is None else " (under " + policy.file + ": " + ", ".join(
                 f"{n} {s}" for s, n in trust_counts.items()) + ")")
             + ("; OK" if ok else "; PROBLEMS FOUND"))
    # verify grows with the store (it reads every byte): say by how much, on stderr in both modes
    n = len(report.receipts)
    _err(f"verify: {n} receipt file(s) read and judged in {took:.2f} s"
         + (f" ({took / n * 1e3:.2f} ms per receipt)" if n else ""))
    raise typer.Exit(E.EXIT_OK if ok else E.EXIT_FAILED)


def _specs(specs_dir, keys: set, cache) -> dict:
    """The valid spec of each method key (for coverage's totals); a key whose spec is missing or broken is left
    out, and its receipts' coverage comes from what they recorded."""
    from engine.spec.loader import KEY_RE

    out = {}
    for key in sorted(k for k in keys if isinstance(k, str) and KEY_RE.match(k)):
        path = specs_dir / f"{key}.yaml"
        if path.is_file():
            try:
                spec, _ = cache.validate_file(path, _paths.project_root())
            except Exception:  # noqa: BLE001 - e.g. no methods package to check names against: no total, no harm
                spec = None
            if spec is not None:
                out[key] = spec
    return out
