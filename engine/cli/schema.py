"""`contracts schema`: print a published JSON Schema."""

from __future__ import annotations

from typing import Annotated

import typer

from engine import errors as E
from engine.cli.common import (
    JsonOpt,
    app,
    handles_errors,
)

SCHEMAS = ("receipt", "spec", "gate", "ledger", "check", "list")


@app.command()
@handles_errors
def schema(
    name: Annotated[str, typer.Argument(help="receipt, spec, gate, check or list (the --json output of those verbs), or "
                                              "ledger (one line).")],
    json_out: JsonOpt = False,  # noqa: ARG001 - the output is JSON either way
) -> None:
    """Print a published JSON Schema."""
    from importlib import resources

    if name not in SCHEMAS:
        raise E.UsageError(f"no schema {name!r}; valid: {', '.join(SCHEMAS)}")
    typer.echo(resources.files("engine").joinpath(f"schemas/{name}.schema.json").read_text(encoding="utf-8").rstrip())
