"""Heavy imports (torch, torch._dynamo, the method packages) without the cyclic GC running during them.

Importing torch and torch._dynamo allocates a few hundred thousand objects that all live on; the
collections those allocations trigger walk the ever larger heap and find next to nothing: 0.5 of the
2 CPU-s it takes to import what a check needs (684 collections).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection inside the block (the previous state comes back after it)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
