"""`contracts interface` and `contracts scaffold`: what an implementation of a method must expose, and a stub of it.

Both read the spec only (static registry names, no torch): they are instant.
"""

from __future__ import annotations

from typing import Annotated

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.common import JsonOpt, ReceiptsOpt, SpecsOpt, _dirs, _out, _print_json, _spec_cache, app, handles_errors
from engine.paths import spec_path


def _interface(method: str, specs, receipts):
    from engine.spec import interface as iface_mod
    from engine.spec.registry import known_names

    specs_dir, receipts_dir = _dirs(specs, receipts)
    spec = _spec_cache(receipts_dir).load_spec(spec_path(specs_dir, method), _paths.project_root())
    registered = known_names().implementations.get(spec.data["implementation"])
    return spec, iface_mod.from_spec(spec.data, registered)


@app.command("interface")
@handles_errors
def interface_cmd(
    method: Annotated[str, typer.Argument(help="Method key, e.g. tapo-trajectory.")],
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The functions an implementation of METHOD must expose (for --impl): arguments, shapes, dtypes, returns."""
    from engine.spec import interface as iface_mod

    _, iface = _interface(method, specs, receipts)
    if json_out:
        _print_json(iface_mod.as_json(iface))
    else:
        for line in iface_mod.text_lines(iface):
            _out(line)  # spec text is data: terminal-safe like every other verb's
    raise typer.Exit(E.EXIT_OK)


@app.command("scaffold")
@handles_errors
def scaffold_cmd(
    method: Annotated[str, typer.Argument(help="Method key, e.g. tapo-trajectory.")],
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
) -> None:
    """Print a Python stub of METHOD's interface (docstrings with shapes; bodies raise NotImplementedError):
    contracts scaffold METHOD > my_impl.py, fill it in, then contracts check METHOD --impl my_impl.py."""
    from engine.spec import interface as iface_mod

    spec, iface = _interface(method, specs, receipts)
    typer.echo(iface_mod.scaffold(iface, f"specs/{spec.path.name}"), nl=False)
    raise typer.Exit(E.EXIT_OK)
