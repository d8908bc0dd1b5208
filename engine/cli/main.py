"""The `contracts` entry point, and a direct way into the read-only verbs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from engine import errors as E
from engine.cli import check as check_mod
from engine.cli.common import (
    app,
    quiet_broken_pipe,
)
from engine.cli.gate import gate
from engine.cli.list import list_
from engine.cli.show import show
from engine.cli.verify import verify

# --- a direct way into the read-only verbs ---------------------------------------------------
# Before running any command, typer builds a pydantic TypeAdapter per parameter: about 70 ms, pydantic's
# import included, of a warm `contracts gate` that otherwise takes about 130 ms. When argv uses nothing but
# the plain options of list/show/gate/verify, main() parses it here and calls the same function typer would;
# anything else (--help, an unknown, repeated or valueless option, a wrong number of arguments) goes to
# typer, which also says what is wrong. tests/test_cli.py keeps this table equal to the signatures.

_DIRECT_OPTIONS = {"--specs": "specs", "--receipts": "receipts", "--trust": "trust"}  # take a path
_DIRECT_FLAGS = {"--json": "json_out", "--strict": "strict", "--no-cache": "no_cache"}
# [impl] options the direct parse does not take: argv with one goes to typer (e.g. gate --impl TARGET).
_TYPER_ONLY_OPTIONS = {"--impl"}
_FOLDERS = ("--specs", "--receipts")
_DIRECT = {  # verb -> (function, fewest and most METHOD arguments, flags it takes, path options it takes)
    "list": (list_, 0, 0, ("--json",), _FOLDERS + ("--trust",)),
    "show": (show, 1, 1, ("--json",), _FOLDERS),
    "gate": (gate, 1, 1, ("--json", "--no-cache"), _FOLDERS + ("--trust",)),
    "verify": (verify, 0, 1, ("--json", "--strict", "--no-cache"), _FOLDERS + ("--trust",)),
}


def _direct_call(argv: list[str]) -> Optional[tuple[Callable[..., Any], dict]]:
    """(function, keyword arguments) for argv that typer would parse into exactly that; else None."""
    if not argv or argv[0] not in _DIRECT:
        return None
    fn, fewest, most, flags, options = _DIRECT[argv[0]]
    kwargs: dict[str, Any] = {}
    methods: list[str] = []
    rest = iter(argv[1:])
    for tok in rest:
        if not tok.startswith("-"):
            if not tok:
                return None
            methods.append(tok)
            continue
        name, eq, value = tok.partition("=")
        if tok in flags and _DIRECT_FLAGS[tok] not in kwargs:
            kwargs[_DIRECT_FLAGS[tok]] = True
        elif name in options and _DIRECT_OPTIONS[name] not in kwargs:
            value = value if eq else next(rest, "")
            if not value or value.startswith("-"):  # typer would take "--json" as the path; let it say so
                return None
            kwargs[_DIRECT_OPTIONS[name]] = Path(value)
        else:
            return None
    if not fewest <= len(methods) <= most:
        return None
    if methods:
        kwargs["method"] = methods[0]
    return fn, kwargs


def main() -> None:
    try:
        direct = _direct_call(sys.argv[1:])
        if direct is None:
            app()
        else:
            fn, kwargs = direct
            try:
                fn(**kwargs)
            except typer.Exit as exc:  # what typer's standalone mode does with it
                _flush_stdout()
                sys.exit(exc.exit_code)
            _flush_stdout()
            sys.exit(E.EXIT_OK)
    except BrokenPipeError:  # the reader of stdout went away (`contracts list | head -1`): no traceback
        quiet_broken_pipe()
        sys.exit(E.EXIT_FAILED)
    except SystemExit as exc:
        if exc.code == E.EXIT_INTERRUPTED:
            _exit_now(E.EXIT_INTERRUPTED)
        if check_mod._CHECK_RAN and "ray" not in sys.modules and isinstance(exc.code, int):
            # Tearing down torch (and torch._dynamo, which optimizers import) takes 0.3-2 s of interpreter
            # finalisation that writes nothing: check's receipts are fsynced and closed by now and its local
            # workers stopped. Ray's atexit shutdown must run, so not with Ray loaded.
            _exit_now(exc.code)
        raise


def _flush_stdout() -> None:
    """Flush now, inside main's handlers, so a closed pipe is met here and not in interpreter finalisation."""
    sys.stdout.flush()


def _exit_now(code: int) -> None:
    """Leave with `code` now: flush, skip interpreter finalisation, whatever CPython remembers.

    A KeyboardInterrupt that crossed a C extension's PyRun_* call (torch's
    pybind11 code can be on the stack when the signal lands) sets CPython's
    `_Py_UnhandledKeyboardInterrupt` even though the runner caught it; at
    exit `python -m engine.cli` then kills itself with SIGINT (status -2, not
    130). The receipt is written and fsynced by now; flush and go.
    """
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

