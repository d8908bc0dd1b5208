"""Text from specs, receipts, file names and errors is data: make it safe to put on a terminal.

A spec title, a receipt's file name or an exception's message can carry
terminal control sequences: ESC (OSC 52 writes the user's clipboard, CSI moves
the cursor and can paint over a line already printed), C1 controls (0x9b is a
one-byte CSI on some terminals), a carriage return or line feed (a fake
`fresh ... passed` line), or a bidi override that makes text read differently
from what it is. `term_safe` shows each of them escaped, the way Python writes
it in a string literal (`\\x1b`, `\\x9b`, `\\u202e`), and leaves everything
else, Unicode text included, exactly as it is.
"""

from __future__ import annotations

import re
from typing import Any

# C0 controls and DEL, C1 controls, bidi embeddings/overrides (U+202A-202E) and isolates (U+2066-2069).
# Lone surrogates too: a file name that is not UTF-8 carries them, and no terminal encoding can write them.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(m: re.Match) -> str:
    return ascii(m.group(0))[1:-1]  # as in a Python literal: \n, \x1b, \x9b, \u202e


def term_safe(value: Any, keep_newlines: bool = False) -> str:
    """`str(value)` with every control character and bidi control escaped.

    With keep_newlines, a line feed and a tab are kept (multi-line text shown
    as such); a carriage return is still escaped, so no line can be overwritten.
    """
    text = value if isinstance(value, str) else str(value)
    pattern = _UNSAFE_KEEP_LINES if keep_newlines else _UNSAFE
    return pattern.sub(_escape, text) if pattern.search(text) else text


def term_safe_deep(value: Any) -> Any:
    """Every string in a JSON-like value (dict keys included) made `term_safe`; other values as they are."""
    if isinstance(value, str):
        return term_safe(value)
    if isinstance(value, dict):
        return {term_safe_deep(k): term_safe_deep(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [term_safe_deep(v) for v in value]
    return value


# What json.dumps(ensure_ascii=False) leaves raw although a terminal may act on it (DEL, C1, bidi controls)
# or cannot be encoded (lone surrogates).
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def json_term_safe(text: str) -> str:
    """JSON text (from json.dumps) with the characters it leaves raw written as \\uXXXX escapes.

    Such characters can only stand inside JSON strings, where the escape means
    the same character: the document parses to the same value.
    """
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text) if _JSON_UNSAFE.search(text) else text
