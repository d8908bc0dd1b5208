"""Reading JSON that anyone could have written: bounded in size and in nesting.

Receipts, the ledger, the validation cache and the receipt index all live in a
store that whoever writes candidate code can write too. A file nested 100,000
levels deep makes `json.loads` raise RecursionError, and one nested a few
hundred levels deep loads but breaks whatever recursive code reads it next
(canonical JSON, the schema check); a file of many gigabytes is a MemoryError.
So nesting is measured before parsing, without recursion, and files are read
only up to a cap. Every refusal is a `ValueError` with a one-line reason, which
the readers already turn into "invalid" (a receipt, a ledger line) or "ignore
and rebuild" (a cache).

Nothing here follows a symbolic link: the store's files are regular files.
"""

from __future__ import annotations

import json
import os
import stat
from itertools import accumulate
from pathlib import Path
from typing import Any

MAX_DEPTH = 64  # receipts nest 7 levels, cached specs about 10: far below, and far from Python's recursion limit
MAX_RECEIPT_BYTES = 32 << 20  # receipts are about 0.3 MB
MAX_LEDGER_BYTES = 64 << 20  # a few hundred bytes per promote or demote
MAX_CACHE_BYTES = 256 << 20  # the validation cache; over it, the cache is ignored and rebuilt
MAX_INDEX_BYTES = 2 << 30  # each receipt index file; over it, the index is ignored and rebuilt

# Structure is what stands outside JSON strings. With escaped backslashes and escaped quotes removed, every
# quote left opens or closes a string; keeping only quotes and brackets leaves a short text to measure.
_KEEP = b'[]{}"'
_DROP = bytes(b for b in range(256) if b not in _KEEP)
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class TooLarge(ValueError):
    """A file over its size cap."""


class TooDeep(ValueError):
    """JSON nested deeper than MAX_DEPTH."""


def nesting_depth(raw: bytes | str) -> int:
    """The deepest nesting of [ and { outside JSON strings, without recursion or a Python-level loop.

    An unclosed string counts as structure: that can only overstate the depth
    of a document that is not JSON anyway.
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(data.translate(None, _DROP).split(b'"')[::2])  # the parts between strings
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def check_depth(raw: bytes | str, max_depth: int = MAX_DEPTH) -> None:
    """Raise TooDeep (a ValueError) when the JSON text is nested deeper than max_depth."""
    if raw.count("[" if isinstance(raw, str) else b"[") + raw.count("{" if isinstance(raw, str) else b"{") \
            > max_depth:  # else it cannot be that deep: the usual case, decided by two C-level counts
        depth = nesting_depth(raw)
        if depth > max_depth:
            raise TooDeep(f"JSON nested {depth} levels deep (more than {max_depth}); "
                          "paper-contracts never writes that")


def loads(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """json.loads, refusing (TooDeep, a ValueError) a document nested deeper than max_depth."""
    check_depth(raw, max_depth)
    return json.loads(raw)


def read_regular(path: Path | str, max_bytes: int) -> bytes:
    """The bytes of a regular file, not through a symbolic link, at most max_bytes.

    Raises TooLarge (over the cap), ValueError (a symbolic link, not a regular file) or OSError.
    """
    return read_regular_with_stat(path, max_bytes)[0]


def read_regular_with_stat(path: Path | str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """`read_regular`, with the file's status as it was just before its bytes were read (fstat of the same open
    file): what an identity recorded beside the bytes' verdict must be (engine/store/sealed_index.py)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        if Path(path).is_symlink():
            raise ValueError("is a symbolic link; files in the store must be regular files") from None
        raise err
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("is not a regular file")
        if st.st_size > max_bytes:
            raise TooLarge(f"is {st.st_size} bytes, over the {max_bytes}-byte limit")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:  # grew while being read
            raise TooLarge(f"is over the {max_bytes}-byte limit")
        return data, st
    finally:
        os.close(fd)
