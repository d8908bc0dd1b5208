"""Snapshot tests (pytest-textual-snapshot) of `contracts tui` on a small fixed store, at 80x24 and 160x48.

Update after an intended change, only for the tests you changed, and look at the pictures:
python -m pytest tests/test_tui_snapshots.py -k NAME --snapshot-update
"""

from __future__ import annotations

import pytest

from tui_support import demo_names, make_app, settle, store  # noqa: F401 - fixtures shared with the other TUI tests

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 48), id="160x48")]


@pytest.fixture()
def app(store, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    return make_app(store)


async def loaded(pilot):
    await pilot.app.wait_loaded()
    await settle(pilot.app, pilot)


async def no_blink(pilot):
    from textual.widgets import Input

    for field in pilot.app.screen.query(Input):
        field.cursor_blink = False  # a blinking cursor would make the picture depend on the clock
    await pilot.pause()


async def settled(pilot):
    await settle(pilot.app, pilot)


async def still(pilot, wait: float | None = None):
    """After a pause (of `wait` seconds, or one refresh), with no blinking cursor."""
    await pilot.pause(wait)
    await no_blink(pilot)


def keys_after(start, keys: tuple[str, ...], then=settled):
    """run_before: `start`, then `keys` pressed, then `then` (the app settled by default)."""
    async def go(pilot):
        await start(pilot)
        await pilot.press(*keys)
        await then(pilot)

    return go


def open_failed_receipt(pilot, tab: str | None = None):
    async def go():
        await loaded(pilot)
        failed = next(r for r in pilot.app.model.method("demo-method").receipts if r.status == "failed")
        pilot.app.open_receipt(failed.file, contract="loss-gradient")
        await settle(pilot.app, pilot)
        if tab:
            await pilot.press(tab)
            await pilot.pause()

    return go()


@pytest.mark.parametrize("size", SIZES)
def test_main_screen(app, snap_compare, size):
    assert snap_compare(app, terminal_size=size, run_before=loaded)


@pytest.mark.parametrize("size", SIZES)
def test_failures_only(app, snap_compare, size):
    assert snap_compare(app, press=["f", "2"], terminal_size=size, run_before=loaded)


@pytest.mark.parametrize("size", SIZES)
def test_failures_only_with_none_says_so(app, snap_compare, size):
    async def go(pilot):
        await loaded(pilot)
        pilot.app.select_method("other-method")
        await pilot.press("f")
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=go)


@pytest.mark.parametrize("size", SIZES)
def test_tree_folded_away(app, snap_compare, size):
    assert snap_compare(app, press=["t"], terminal_size=size, run_before=loaded)


@pytest.mark.parametrize("size", SIZES)
def test_receipt_screen(app, snap_compare, size):
    assert snap_compare(app, terminal_size=size, run_before=open_failed_receipt)


@pytest.mark.parametrize("size", SIZES)
def test_plots_tab(app, snap_compare, size):
    assert snap_compare(app, terminal_size=size, run_before=lambda pilot: open_failed_receipt(pilot, "4"))


@pytest.mark.parametrize("size", SIZES)
def test_gate_tab(app, snap_compare, size):
    assert snap_compare(app, press=["5"], terminal_size=size, run_before=loaded)


@pytest.mark.parametrize("size", SIZES)
def test_promote_refused_while_the_gate_is_closed(app, snap_compare, size):
    assert snap_compare(app, terminal_size=size, run_before=keys_after(loaded, ("5", "p")))


@pytest.mark.parametrize("size", SIZES)
def test_command_palette(app, snap_compare, size):
    # the palette searches its providers asynchronously: half a second for them
    go = keys_after(loaded, ("ctrl+p",), then=lambda pilot: still(pilot, 0.5))
    assert snap_compare(app, terminal_size=size, run_before=go)


@pytest.mark.parametrize("size", SIZES)
def test_diff_screen(app, snap_compare, size):
    assert snap_compare(app, terminal_size=size, run_before=keys_after(open_failed_receipt, ("d",)))


@pytest.mark.parametrize("size", SIZES)
def test_check_form(app, snap_compare, size):
    assert snap_compare(app, terminal_size=size, run_before=keys_after(loaded, ("c",), then=still))


@pytest.mark.parametrize("size", SIZES)
def test_check_panel_while_running(app, snap_compare, size):
    """The panel as a running check draws it (its state set here: no child process in a picture)."""
    from tui.checkrun import CheckRun, Progress

    async def go(pilot):
        await loaded(pilot)
        cr = CheckRun("demo-method", "cpu", "42", ["contracts", "check"], proc=object(),
                      progress=Progress(7, 20, "0:00:03", "demo-method: loss-gradient seed 42 float64 passed"))
        pilot.app.check_run = cr
        pilot.app.screen.show_run(cr)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=go)
