"""A small copy of the committed receipt store, for tests of the read-only commands.

receipts/ keeps every receipt written on main (over thirty, about 10 MB, and growing), and list, show, gate and
verify read and check each one. A test that needs the store's states (fresh, stale, full, partial, a mutation
receipt, an old layout) but not every file copies this sample: per method, its newest receipts and its oldest.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NEWEST = 3  # a method's check and mutation receipts of the last run on main, and the one before


def copy_sample(dest: Path, newest: int = NEWEST) -> Path:
    """Copy each method's `newest` receipts and its oldest one from receipts/ into `dest`; returns `dest`."""
    for folder in sorted(p for p in (ROOT / "receipts").iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = sorted(folder.glob("*.json"))  # a receipt's name starts with its UTC time: oldest first
        (dest / folder.name).mkdir(parents=True)
        for p in sorted(set(files[:1] + files[-newest:])):
            shutil.copy2(p, dest / folder.name / p.name)
    return dest
