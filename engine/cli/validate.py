"""`contracts validate`: YAML safety, JSON Schema, registered names, cross-references."""

from __future__ import annotations

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
    _print_json,
    app,
    handles_errors,
)
from engine.spec.loader import display_path, spec_files, validate_file


@app.command()
@handles_errors
def validate(
    paths: Annotated[Optional[list[Path]], typer.Argument(help="Spec files (default: every spec).")] = None,
    specs: SpecsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Validate specs: YAML safety, JSON Schema, registered names, cross-references."""
    specs_dir, _ = _dirs(specs, None)
    files = list(paths) if paths else spec_files(specs_dir)
    if not files:
        raise E.NothingSelected(f"no spec files in {display_path(specs_dir)}/")
    report, total = [], 0
    for f in files:
        _, errs = validate_file(f, _paths.project_root())
        total += len(errs)
        report.append({"file": display_path(f, _paths.project_root()), "valid": not errs,
                       "errors": [e.as_dict() | {"line_text": e.line()} for e in errs]})
        if not json_out:
            for e in errs:
                _err(e.line())
    if json_out:
        _print_json({"files": report, "errors": total})
    else:
        ok = sum(r["valid"] for r in report)
        _err(f"{ok}/{len(report)} spec(s) valid" + (f", {total} error(s)" if total else ""))
    if total:
        raise typer.Exit(E.EXIT_USAGE)
