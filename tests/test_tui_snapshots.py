"""Snapshot tests (pytest-textual-snapshot) of `contracts tui` on a small fixed store at a fixed size.

Update after an intended change: python -m pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

import pytest

import engine.spec.registry as registry
from benchmarks.synthetic_store import build_fixture_store, demo_static_names
from tui.app import create_app

SIZE = (130, 36)


@pytest.fixture()
def app(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_STATIC", demo_static_names())
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = build_fixture_store(tmp_path / "proj")
    return create_app(out["specs"], out["receipts"], tmp_path / "proj", poll_seconds=None)


async def loaded(pilot):
    await pilot.app.wait_loaded()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def open_failed_receipt(pilot):
    async def go():
        await loaded(pilot)
        failed = next(r for r in pilot.app.model.method("demo-method").receipts if r.status == "failed")
        pilot.app.open_receipt(failed.file)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    return go()


def test_main_screen(app, snap_compare):
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded)


def test_failures_only(app, snap_compare):
    assert snap_compare(app, press=["f", "2"], terminal_size=SIZE, run_before=loaded)


def test_receipt_screen(app, snap_compare):
    assert snap_compare(app, terminal_size=SIZE, run_before=open_failed_receipt)


def test_gate_tab(app, snap_compare):
    assert snap_compare(app, press=["5"], terminal_size=SIZE, run_before=loaded)


def test_command_palette(app, snap_compare):
    async def go(pilot):
        await loaded(pilot)
        await pilot.press("ctrl+p", *"method")
        await pilot.pause(0.5)  # the palette searches its providers asynchronously
        from textual.widgets import Input

        for field in pilot.app.screen.query(Input):
            field.cursor_blink = False  # a blinking cursor would make the picture depend on the clock
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=go)


def test_diff_screen(app, snap_compare):
    async def go(pilot):
        await open_failed_receipt(pilot)
        await pilot.press("d")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=go)
