"""Imported once, for its side effect, by the local workers' server (engine/run/executors.py) before it forks them.

It imports what every cell needs, so that no worker imports it again: torch; torch._dynamo, which
building a torch.optim optimizer imports on first use (about 1 CPU-s a worker would otherwise pay in its
first mechanism check); the runner; each method package, from source (engine/run/sourceonly.py). The GC is paused meanwhile (engine/run/imports.py),
and what was imported is then frozen: the workers' collections skip it and so do not copy its pages.
"""

from __future__ import annotations

import gc
import importlib

from engine.run import sourceonly
from engine.run.imports import gc_paused

# First: the methods this server imports (and its forked workers inherit) run from source, never a planted .pyc.
sourceonly.install()


def modules() -> list[str]:
    """torch, torch._dynamo, the runner and each method package (named by the registry, found without importing it)."""
    from engine.spec.registry import method_packages

    return ["torch", "torch._dynamo", "engine.run.runner", "engine.run.executors"] + sorted(method_packages())


def preload() -> None:
    with gc_paused():
        for name in modules():
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # as multiprocessing's own preload: the cell that needs it reports the error
        # Check what was imported now (torch's modules among them) once, here: the forked workers inherit the
        # record, and each worker's runner then checks only what it imports itself.
        sourceonly.install()
        gc.freeze()


preload()
