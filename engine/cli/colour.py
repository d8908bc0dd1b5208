"""Colour for the words a reader scans for (FAILED, UNMET), and none at all under NO_COLOR.

click/typer's echo already drops escape codes when the stream is not a terminal;
NO_COLOR (https://no-color.org: set and non-empty) turns the styling off at the
source, bold included, so a terminal that asked for no colour gets plain text.
"""

from __future__ import annotations

import os

import typer


def enabled() -> bool:
    return not os.environ.get("NO_COLOR")


def bad(text: str) -> str:
    """A failure word: bold red, or the word alone under NO_COLOR."""
    return typer.style(text, fg="red", bold=True) if enabled() else text


def good(text: str) -> str:
    return typer.style(text, fg="green") if enabled() else text
