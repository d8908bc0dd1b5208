"""`contracts keys generate PATH`: an ed25519 key pair for signing receipts (engine.store.signing)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from engine import errors as E
from engine.cli.common import JsonOpt, _App, _err, _print_json, app, handles_errors

keys_app = _App(name="keys", help="Signing keys for receipts (ed25519, DSSE).", no_args_is_help=True,
               add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
app.add_typer(keys_app, name="keys")


@keys_app.command("generate")
@handles_errors
def generate(
    path: Annotated[Path, typer.Argument(help="Where to write the private key (PATH.pub gets the public key). "
                                              "Keep it with the runner, outside the checkout and the store.")],
    json_out: JsonOpt = False,
) -> None:
    """Write a new ed25519 private key (mode 0600) and PATH.pub; print the key id (sha256 of the raw public key)."""
    from engine.store.signing import KeyProblem, generate as make

    if not path.parent.is_dir():
        raise E.UsageError(f"{path.parent}/ is not a folder; create it first")
    try:
        kid = make(path)
    except KeyProblem as err:
        raise E.UsageError(str(err)) from None
    except OSError as err:
        raise E.EnvironmentProblem(f"could not write {path.name}: {err.strerror or err}") from None
    pub = path.with_name(path.name + ".pub")
    if json_out:
        _print_json({"keyid": kid, "private_key": str(path), "public_key": str(pub)})
        return
    typer.echo(kid)
    _err(f"private key {path} (mode 0600: only the runner's signing step should read it); public key {pub} "
         "(name it in the pipeline's trust policy)")
