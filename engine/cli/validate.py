"""`contracts validate`: YAML safety, JSON Schema, registered names, cross-references; `--coverage`: which
promise of each spec's interface no contract case exercises (engine/spec/coverage.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Annotated, Optional

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.common import (
    JsonOpt,
    SpecsOpt,
    _dirs,
    _err,
    _out,
    _print_json,
    app,
    handles_errors,
)
from engine.spec.loader import display_path, spec_files, validate_file

WIDTH = 80


@app.command()
@handles_errors
def validate(
    paths: Annotated[Optional[list[Path]], typer.Argument(help="Spec files (default: every spec).")] = None,
    specs: SpecsOpt = None,
    coverage: Annotated[bool, typer.Option("--coverage", help="Also list each interface promise (function, knob, "
                                           "mode, dtype, junk and mask convention, refusal, metric key) that no "
                                           "contract case exercises; exit 1 when one is left.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Validate specs: YAML safety, JSON Schema, registered names, cross-references, dependencies."""
    from engine.spec import depends

    specs_dir, _ = _dirs(specs, None)
    files = list(paths) if paths else spec_files(specs_dir)
    if not files:
        raise E.NothingSelected(f"no spec files in {display_path(specs_dir)}/")
    root = _paths.project_root()
    report, total, valid = [], 0, []
    for f in files:
        spec, errs = validate_file(f, root)
        if spec is not None:
            valid.append(spec)
        report.append({"file": display_path(f, root), "valid": not errs,
                       "errors": [e.as_dict() | {"line_text": e.line()} for e in errs]})
    # across the folder(s): a dependency with no spec there, a dependency cycle (each at its file and line)
    folders = sorted({Path(f).parent for f in files})
    for err in (e for d in folders for e in depends.folder_errors(spec_files(d), root)):
        entry = next((r for r in report if r["file"] == err.file), None)
        if entry is None:
            continue  # a cycle through a file that was not asked for is that file's to report
        entry["valid"] = False
        entry["errors"].append(err.as_dict() | {"line_text": err.line()})
        valid = [s for s in valid if s.display != err.file]
    for r in report:
        total += len(r["errors"])
        if not json_out:
            for e in r["errors"]:
                _err(e["line_text"])
    cov = [_coverage(s) for s in valid] if coverage else None
    if json_out:
        doc = {"files": report, "errors": total}
        if cov is not None:
            doc["coverage"] = cov
        _print_json(doc)
    else:
        ok = sum(r["valid"] for r in report)
        if cov is not None:
            for c in cov:
                _print_coverage(c)
        _err(f"{ok}/{len(report)} spec(s) valid" + (f", {total} error(s)" if total else "")
             + ("" if cov is None else f"; interface coverage: " + _summary(cov)))
    if total:
        raise typer.Exit(E.EXIT_USAGE)
    if cov is not None and any(c["gaps"] for c in cov):
        raise typer.Exit(E.EXIT_FAILED)


def _coverage(spec) -> dict:
    from engine.spec.coverage import report

    return {"file": spec.display, **report(spec.data).as_dict()}


def _summary(cov: list[dict]) -> str:
    full = sum(not c["gaps"] for c in cov)
    gaps = sum(len(c["gaps"]) for c in cov)
    return f"{full}/{len(cov)} spec(s) at 100%" + (f", {gaps} gap(s)" if gaps else "")


def _print_coverage(c: dict) -> None:
    if not c["interface"]:
        _out(f"{c['method']}: no interface section, nothing to cover")
        return
    head = f"{c['method']}: {_pct(c['percent'])} of {c['promises']} interface promises exercised"
    _out(head + (f", {len(c['gaps'])} gap(s)" if c["gaps"] else ""))
    for g in c["gaps"]:
        lines = textwrap.wrap(g["id"], WIDTH, initial_indent=f"  gap {g['category']:<8} ",
                              subsequent_indent=" " * 15, break_long_words=True)
        lines += textwrap.wrap(g["text"], WIDTH, initial_indent=" " * 15, subsequent_indent=" " * 15)
        for line in lines:
            _out(line)


def _pct(p: float) -> str:
    return "100%" if p >= 100.0 else f"{min(p, 99.9):.1f}%"
