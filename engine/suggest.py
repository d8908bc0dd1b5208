""""Did you mean": the nearest valid name for a mistyped method key or contract id."""

from __future__ import annotations

import difflib
from typing import Iterable


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The valid name the user most likely meant, or None.

    Hyphen and underscore are one mistake, not two (method keys use `-`, contract ids `_`), and so is case;
    otherwise the nearest by difflib's ratio, when it is close enough to be a typo.
    """
    choices = [c for c in choices if isinstance(c, str)]
    if not isinstance(name, str) or not choices:
        return None

    def norm(s: str) -> str:
        return s.lower().replace("_", "-").strip()

    same = [c for c in choices if norm(c) == norm(name)]
    if same:
        return same[0]
    near = difflib.get_close_matches(norm(name), [norm(c) for c in choices], n=1, cutoff=0.75)
    return next(c for c in choices if norm(c) == near[0]) if near else None


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`"did you mean 'x'? "` (with a trailing space, to go before the list of valid names), or ""."""
    near = closest(name, choices)
    return f"did you mean {near!r}? " if near is not None and near != name else ""
