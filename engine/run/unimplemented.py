"""A candidate's functions that are not written yet: which raised NotImplementedError, and on which of its lines.

`contracts scaffold` writes stubs that raise NotImplementedError; a user checks as soon as one body is filled.
The worker wraps each candidate function (`watch`); the runner takes what was noted during each check call
(`take`), so a stub is reported as "not implemented" once per function, at the candidate's own line, even when
a check caught the exception (a refusal check counts any exception as a refusal) or it surfaced in a frame of
the check. A NotImplementedError raised elsewhere (torch lacking an operator on a device) is not the
candidate's stub and is not noted.
"""

from __future__ import annotations

import functools
import inspect
import traceback
from pathlib import Path
from typing import Any, Callable

_NOTED: dict[str, str] = {}  # function -> "file.py:line", in the order first seen


def _note(name: str, exc: BaseException, own_file: str | None) -> None:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return
    last = frames[-1]
    if own_file is not None and last.filename != own_file:
        return  # raised by something the candidate called, not by the candidate's own code
    _NOTED.setdefault(name, f"{Path(last.filename).name}:{last.lineno}")  # the file's name only: no paths


def watch(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with its NotImplementedError noted under `name` (and re-raised unchanged); same signature."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    own_file = code.co_filename if code is not None else None
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args: Any, **kwargs: Any) -> Any:
            try:
                return (yield from fn(*args, **kwargs))
            except NotImplementedError as exc:
                _note(name, exc, own_file)
                raise

        return gen

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except NotImplementedError as exc:
            _note(name, exc, own_file)
            raise

    return call


def noted(name: str, at: str) -> None:
    """Note a stub that raised in the candidate's own process (engine/run/boundary.py: its file:line crossed)."""
    _NOTED.setdefault(name, at)


def take() -> list[dict]:
    """What was noted since the last take, as [{function, at}], and forget it."""
    out = [{"function": k, "at": v} for k, v in _NOTED.items()]
    _NOTED.clear()
    return out


def message(noted: list[dict]) -> str:
    return "not implemented: " + ", ".join(f"{d['function']} raised NotImplementedError ({d['at']})" for d in noted)
