"""Rewrite a spec's `promotion.state` and nothing else.

ruamel.yaml's round-trip dump keeps comments and key order but may still
re-indent sequences or re-wrap long strings, so a dump is not "only the
changed line". Instead the round-trip parser finds where the state scalar
sits, and exactly that token is replaced in the original text (its quoting
kept). The result is parsed again and must equal the old document with only
the state changed, or nothing is written.

The same splice lets freshness ignore a promote/demote: a receipt written
before the state changed still matches the spec once the state is set back
(`digest_with_state`), so promoting does not make its own evidence stale.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import secrets
from pathlib import Path

from engine.errors import UsageError

STATES = ("not-promoted", "promoted")
_BREAK = re.compile(r"\r\n|\r|\n")


class StateNotFound(UsageError):
    """The spec's promotion.state could not be located as a plain scalar."""


def _line_starts(text: str) -> list[int]:
    starts = [0]
    starts += [m.end() for m in _BREAK.finditer(text)]
    return starts


def _fast_state_span(text: str) -> tuple[int, int, str] | None:
    """state_span from libyaml's events (engine/spec/fastyaml.py, whose marks equal ruamel's), or None: then
    ruamel's round-trip parse decides. The token found is checked against the text either way."""
    from engine.spec import fastyaml
    from engine.spec.loader import MAX_DEPTH, locate

    got = fastyaml.located(text, MAX_DEPTH) if fastyaml.available() else None
    promo = got[0].get("promotion") if got is not None else None
    if not isinstance(promo, dict) or not isinstance(promo.get("state"), str):
        return None
    line, col = locate(got[1], ["promotion", "state"])
    starts = _line_starts(text)
    if line is None or line > len(starts):
        return None
    start = starts[line - 1] + col - 1
    quote = text[start] if text[start:start + 1] in ("'", '"') else ""
    token = f"{quote}{promo['state']}{quote}"
    return (start, start + len(token), quote) if text[start:start + len(token)] == token else None


def state_span(text: str) -> tuple[int, int, str]:
    """(start, end, quote) of the promotion.state token in `text`; quote is '', "'" or '"'."""
    fast = _fast_state_span(text)  # a third of a millisecond, where the round-trip parse takes 0.1-0.3 s
    if fast is not None:
        return fast
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        doc = YAML(typ="rt").load(text)
    except (YAMLError, ValueError) as err:
        raise StateNotFound(f"spec is not valid YAML: {str(err).splitlines()[0]}") from None
    promo = doc.get("promotion") if isinstance(doc, dict) else None
    if not isinstance(promo, dict) or "state" not in promo or not hasattr(promo, "lc"):
        raise StateNotFound("spec has no promotion.state mapping entry")
    line, col = promo.lc.value("state")
    starts = _line_starts(text)
    if line >= len(starts):
        raise StateNotFound("promotion.state position is outside the file")
    start = starts[line] + col
    value = str(promo["state"])
    quote = text[start] if text[start:start + 1] in ("'", '"') else ""
    token = f"{quote}{value}{quote}"
    if text[start:start + len(token)] != token:
        raise StateNotFound(f"promotion.state is not written as a simple scalar at line {line + 1}")
    return start, start + len(token), quote


def with_state(text: str, new_state: str) -> str:
    """`text` with promotion.state set to `new_state`, every other byte unchanged."""
    if new_state not in STATES:
        raise UsageError(f"promotion state {new_state!r} is not one of: {', '.join(STATES)}")
    start, end, quote = state_span(text)
    return text[:start] + f"{quote}{new_state}{quote}" + text[end:]


# (sha256 of the spec bytes, state) -> digest_with_state: a pure function of its arguments, remembered for this
# process only. `verify` and `gate` ask it once per receipt bound to an older spec state, and each answer is a
# full round-trip YAML parse (about 0.3 s for a shipped spec): a store of 20 receipts re-parsed one spec 20 times.
_RESTATED: dict[tuple[str, str], str | None] = {}


def digest_with_state(raw: bytes, state: str) -> str | None:
    """sha256 of the spec bytes as they would be with promotion.state = `state`; None if it cannot be placed."""
    key = (hashlib.sha256(raw).hexdigest(), state)
    if key not in _RESTATED:
        if len(_RESTATED) >= 256:
            _RESTATED.clear()
        _RESTATED[key] = _digest_with_state(raw, state)
    return _RESTATED[key]


def _digest_with_state(raw: bytes, state: str) -> str | None:
    try:
        text = raw.decode("utf-8")
        return hashlib.sha256(with_state(text, state).encode("utf-8")).hexdigest()
    except (UnicodeDecodeError, UsageError):
        return None


def _checked(old_text: str, new_text: str, new_state: str) -> None:
    """Refuse unless the new document equals the old one with only the state changed."""
    from ruamel.yaml import YAML

    def plain(t: str):
        return _to_plain(YAML(typ="safe", pure=True).load(t))

    before, after = plain(old_text), plain(new_text)
    expected = copy.deepcopy(before)
    expected["promotion"]["state"] = new_state
    if after != expected:
        raise StateNotFound("rewriting promotion.state would change more than the state; edit the spec by hand")


def _to_plain(v):
    if isinstance(v, dict):
        return {k: _to_plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_to_plain(x) for x in v]
    return v


def rewrite_state(path: Path, new_state: str, expect_sha256: str | None = None) -> tuple[bytes, bytes]:
    """Set promotion.state in the spec file atomically; returns (old bytes, new bytes).

    With `expect_sha256`, refuse if the file is no longer the one the gate evaluated.
    """
    path = Path(path)
    old = path.read_bytes()
    if expect_sha256 is not None and hashlib.sha256(old).hexdigest() != expect_sha256:
        raise UsageError(f"{path.name} changed since it was read; run the command again")
    old_text = old.decode("utf-8")
    new_text = with_state(old_text, new_state)
    _checked(old_text, new_text, new_state)
    new = new_text.encode("utf-8")
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")
    try:
        with open(tmp, "xb") as f:
            f.write(new)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return old, new
