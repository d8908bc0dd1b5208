"""`contracts conformance`: the framework zoo's policy losses against the paper specs they claim, from fresh receipts.

    contracts conformance                                  the matrix on the terminal (reads only; no torch)
    contracts conformance --write docs/conformance.md      the same, as the Markdown document
    contracts conformance --run --write docs/conformance.md
                                                           first check every claimed cell that has no fresh full
                                                           receipt (`contracts check SPEC --impl TARGET`), then write

Exit 0 whatever the frameworks do (their failures are the report's findings); 2 for a bad option or zoo table, 4
when the store cannot be written (with --run).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from engine.cli.common import JsonOpt, ReceiptsOpt, SpecsOpt, _dirs, _err, _out, _print_json, app, handles_errors

ZooOpt = Annotated[Optional[Path], typer.Option("--zoo", metavar="FILE", help="The framework zoo table (default: "
                                                "docs/conformance.yaml): frameworks, variants, the specs they "
                                                "claim, defect descriptions.")]
WriteOpt = Annotated[Optional[Path], typer.Option("--write", metavar="FILE", help="Write the matrix as Markdown "
                                                  "to FILE (docs/conformance.md).")]
RunOpt = Annotated[bool, typer.Option("--run", help="First run `contracts check SPEC --impl TARGET` for every "
                                      "claimed cell without a fresh full receipt (minutes: each imports its "
                                      "framework).")]
SeedsOpt = Annotated[Optional[str], typer.Option("--seeds", metavar="S,S", help="With --run: the seeds each check "
                                                 "runs (default: each spec's budget seeds).")]


@app.command()
@handles_errors
def conformance(specs: SpecsOpt = None, receipts: ReceiptsOpt = None, zoo: ZooOpt = None, write: WriteOpt = None,
                run: RunOpt = False, seeds: SeedsOpt = None, json_out: JsonOpt = False) -> None:
    """The conformance matrix: every framework variant against the paper spec it claims, from fresh receipts."""
    from engine import errors as E
    from engine.paths import project_root
    from engine.store import conformance as C

    specs_dir, receipts_dir = _dirs(specs, receipts)
    zoo_path = zoo or C.default_zoo()
    root = project_root()
    matrix = C.build(zoo_path, specs_dir, receipts_dir, root)
    if run:
        todo = [c for c in matrix.cells if c.status in (C.NO_RECEIPT, C.STALE) or c.subset]
        for i, cell in enumerate(todo, 1):
            argv = [sys.executable, "-m", "engine.cli", "check", cell.spec, "--impl", cell.target,
                    "--specs", str(specs_dir), "--receipts", str(receipts_dir)] + (["--seeds", seeds] if seeds else [])
            _err(f"[{i}/{len(todo)}] contracts check {cell.spec} --impl {cell.target}")
            done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if done.returncode not in (E.EXIT_OK, E.EXIT_FAILED):
                last = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
                _err(f"  not checked (exit {done.returncode}): {last[0]}")
                if done.returncode == E.EXIT_ENVIRONMENT and "not writable" in last[0]:
                    raise typer.Exit(E.EXIT_ENVIRONMENT)
        matrix = C.build(zoo_path, specs_dir, receipts_dir, root)
    if write is not None:
        from engine.cli.conformance_doc import render

        command = "contracts conformance" + (" --run" if run else "") + f" --write {write.as_posix()}"
        write.parent.mkdir(parents=True, exist_ok=True)
        write.write_text(render(matrix, command), encoding="utf-8")
        _err(f"wrote {write.as_posix()}: {len(matrix.cells)} cells, {len(matrix.defects)} defect(s)")
    if json_out:
        _print_json(matrix.as_dict())
        return
    if write is None:
        for c in matrix.cells:
            n = c.counts
            first = f"  first failing: {c.failing[0].id}" if c.failing else ""
            where = f"  {c.why}" if not c.contracts and c.why else ""
            _out(f"{c.framework} {c.version} {c.variant:<12} {str(c.spec or '-'):<8} {c.status:<14} "
                 f"held {n[C.HELD]} failed {n[C.FAILED]} partial {n[C.PARTIAL]} n/a {n[C.NOT_APPLICABLE]}"
                 f"{first}{where}")
