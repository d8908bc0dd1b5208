"""Cell functions that misbehave on seed 43, for the executor tests (importable by spawned and Ray workers)."""

from __future__ import annotations

import os
import signal
import time

from engine.run.executors import run_cell

BAD_SEED = 43


def raise_on_bad_seed(cell, on_result=None):
    if cell.seed == BAD_SEED:
        raise RuntimeError("injected failure")
    return run_cell(cell, on_result)


def die_on_bad_seed(cell, on_result=None):
    if cell.seed == BAD_SEED:
        os.kill(os.getpid(), signal.SIGKILL)
    return run_cell(cell, on_result)


def hang_on_bad_seed(cell, on_result=None):
    if cell.seed == BAD_SEED:
        signal.signal(signal.SIGALRM, signal.SIG_IGN)  # beyond the runner's per-check alarm: a true hang
        while True:
            time.sleep(1)
    return run_cell(cell, on_result)


def exit_on_bad_seed(cell, on_result=None):
    """A worker that leaves cleanly (os._exit) in the middle of a cell: no exception, no reply."""
    if cell.seed == BAD_SEED:
        os._exit(0)
    return run_cell(cell, on_result)


def report_imports(cell, on_result=None):
    """No measurement: which modules a worker had imported before its cell, and which the cell imported."""
    import sys

    before = set(sys.modules)
    run_cell(cell, on_result)
    return {"before": sorted(before), "imported": sorted(set(sys.modules) - before)}
