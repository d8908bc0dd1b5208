"""`contracts --version`: the installed package's version (what a bug report should name)."""

from __future__ import annotations

from typing import Annotated

import typer

from engine.cli.common import app


def package_version() -> str:
    """The installed distribution's version; the source tree's own when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("paper-contracts")
    except PackageNotFoundError:
        from engine import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"contracts (paper-contracts) {package_version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Check RL post-training implementations against their paper's math; gate their promotion."""
