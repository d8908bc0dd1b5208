"""Fixtures and helpers the TUI tests share: the demo project's store, an app on it (no polling, so tests drive
time), the app started and loaded, and readers for what a table or a Static shows."""

from __future__ import annotations

import contextlib
import io
import time

import pytest

import engine.spec.registry as registry
from benchmarks.synthetic_store import build_fixture_store, demo_static_names
from tui.app import create_app
from tui.widgets import VimTable

SIZE = (130, 36)


@pytest.fixture()
def demo_names(monkeypatch):
    """The demo spec names registered things the real methods/ does not have."""
    monkeypatch.setattr(registry, "_STATIC", demo_static_names())


@pytest.fixture()
def store(tmp_path, demo_names):
    out = build_fixture_store(tmp_path / "proj")
    out["root"] = tmp_path / "proj"
    time.sleep(0.06)  # older than the tests' racy window (tests/conftest.py): indexed by identity from now on
    return out


def make_app(store, **kw):
    kw.setdefault("poll_seconds", None)
    return create_app(store["specs"], store["receipts"], store["root"], **kw)


async def settle(app, pilot):
    """Let the app's workers finish and the screen catch up with what they posted."""
    await app.workers.wait_for_complete()
    await pilot.pause()


@contextlib.asynccontextmanager
async def running(app, *, size=SIZE, settled: bool = True):
    """The pilot of `app` once its first load is done; with `settled`, its workers are idle too."""
    async with app.run_test(size=size) as pilot:
        await app.wait_loaded()
        if settled:
            await settle(app, pilot)
        yield pilot


@contextlib.asynccontextmanager
async def started(store, *, size=SIZE, settled: bool = True, receipt: str | None = None, **kw):
    """`(app, pilot)`: `running` for a new app on `store` (`kw` go to make_app); with `receipt` (METHOD/FILE), that
    receipt opened as soon as the first load is done, and the app settled on it."""
    app = make_app(store, **kw)
    async with running(app, size=size, settled=settled and receipt is None) as pilot:
        if receipt is not None:
            app.open_receipt(receipt)
            await settle(app, pilot)
        yield app, pilot


def rows(t: VimTable) -> list[list[str]]:
    """A table's cells as plain text, row by row."""
    return [[c.plain if hasattr(c, "plain") else str(c) for c in t.get_row_at(r)] for r in range(t.row_count)]


def text_of(widget) -> str:
    """What a Static shows, as plain text (a Group or Table rendered the way a terminal would get it)."""
    from rich.console import Console

    content = widget.content if hasattr(widget, "content") else widget.render()
    if isinstance(content, str):
        return content
    console = Console(width=200, record=True, color_system=None, file=io.StringIO())
    console.print(content)
    return console.export_text()
