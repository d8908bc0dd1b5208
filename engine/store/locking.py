"""One writer at a time: an advisory lock file for read-modify-write sequences on a store.

`promote`/`demote` read the spec, ask the gate, rewrite the spec and append to
the ledger. Two of them interleaved could each read the old state, and the
ledger would then record a change from a state the spec no longer had. Holding
an exclusive lock across the whole sequence makes them take turns. Receipts
need no lock: each is created under a name that no other write can take
(engine.store.receipts.write_receipt).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

PROMOTION_LOCK = ".promotion.lock"


@contextlib.contextmanager
def exclusive(directory: Path, name: str) -> Iterator[bool]:
    """Hold an exclusive flock on `directory/name` for the block, waiting for any other holder.

    Yields False without locking when the lock file cannot be created (a
    read-only store): whatever needs writing there fails on its own, with its
    own message, and a command that writes nothing still works.
    """
    import fcntl

    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        fd = os.open(Path(directory) / name, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield True
    finally:
        os.close(fd)  # releases the lock
