"""The TUI shows text from specs and receipts as text: never Textual markup, never raw control codes.

A receipt is written by whoever runs a check, and a self-consistent one needs no key:
its strings (contract names, metric names, messages, step record keys) reach tables,
labels and notifications. Markup in them would be live (`[@click=app.screenshot(...)]`
runs an action when clicked; `[/]` is an error that stops the app at start-up).
"""

from __future__ import annotations

import asyncio

import pytest

import engine.spec.registry as registry
from benchmarks.synthetic_store import build_fixture_store, demo_static_names, predicate, stamp, subject_for
from engine.spec.loader import load_spec
from engine.store.receipts import statement, write_receipt
from tui.screens.main import MainScreen
from tui.screens.receipt import ReceiptScreen
from tui.widgets import VimTable
from tui_support import rows, settle, started

OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"


def _store(tmp_path, monkeypatch, closing_tags: bool) -> dict:
    """The fixture store plus one newest, intact, schema-valid receipt whose strings are markup and controls."""
    monkeypatch.setattr(registry, "_STATIC", demo_static_names())
    root = tmp_path / "proj"
    store = build_fixture_store(root)
    shots = tmp_path / "shots"
    shots.mkdir()
    monkeypatch.chdir(tmp_path)  # the action's folder is relative: receipts hold no absolute path
    spec = load_spec(store["specs"] / "demo-method.yaml", root).data
    pred = predicate(spec, stamp(30))
    click = "[@click=app.screenshot('x.svg','shots')]CLICK-ME-CLICK-ME[/]"
    pred["results"][0]["contract"] = click
    pred["results"][0]["message"] = f"bare [@click=app.screenshot('x.svg','shots')] and {OSC52}"
    if closing_tags:
        for r in pred["results"]:
            for e in r["expectations"]:
                e["metric"] = "[/]"  # a closing tag with nothing to close: a MarkupError if parsed
        for m in pred["mechanism"]:
            for st in m["steps"]:
                st["[/]"] = 1.0  # a step record key becomes a column label
    path = write_receipt(store["receipts"], statement(subject_for(root, "demo-method"), pred))
    return {**store, "root": root, "hostile": path, "receipt": f"demo-method/{path.name}", "shots": shots,
            "click": click}


@pytest.fixture()
def hostile_store(tmp_path, monkeypatch):
    return _store(tmp_path, monkeypatch, closing_tags=True)


@pytest.fixture()
def click_store(tmp_path, monkeypatch):
    return _store(tmp_path, monkeypatch, closing_tags=False)


def test_a_metric_named_closing_tag_starts_the_app_and_shows_literally(hostile_store):
    async def go():
        async with started(hostile_store) as (app, pilot):
            assert app.is_running and isinstance(app.screen, MainScreen)
            latest = [row[-2] for row in rows(app.screen.query_one("#contracts-table", VimTable))]
            assert any("[/]" in cell for cell in latest), latest  # shown as written
            app.open_receipt(f"demo-method/{hostile_store['hostile'].name}")
            await settle(app, pilot)
            assert isinstance(app.screen, ReceiptScreen)
            steps = app.screen.query_one("#steps-table", VimTable)
            assert "[/]" in [c.label.plain for c in steps.columns.values()]
            message = next(r[-1] for r in rows(app.screen.query_one("#results-table", VimTable)) if "bare" in r[-1])
            assert "\x1b" not in message and "\\x1b]52;c;" in message  # the control sequence is shown escaped
        assert app.return_code in (0, None)

    asyncio.run(go())


def test_a_click_action_in_a_receipt_cell_does_nothing(click_store):
    hostile_store = click_store

    async def go():
        async with started(hostile_store, receipt=hostile_store["receipt"]) as (app, pilot):
            t = app.screen.query_one("#results-table", VimTable)
            assert rows(t)[0][0] == hostile_store["click"]  # the literal characters, markup and all
            for x in range(2, 20):  # anywhere over the cell's text
                await pilot.click("#results-table", offset=(x, 1))
                await settle(app, pilot)
            assert app.is_running
        assert list(hostile_store["shots"].iterdir()) == []  # no screenshot was written

    asyncio.run(go())


def test_notifications_are_literal_text(click_store):
    async def go():
        # not in the index: a warning naming it
        async with started(click_store, receipt=f"demo-method/[/]{OSC52}.json") as (app, pilot):
            assert app.is_running
            (note,) = list(app._notifications)
            assert "[/]" in note.message and "\x1b" not in note.message and "\\x1b" in note.message
            assert note.markup is False

    asyncio.run(go())


def test_contracts_tui_exits_3_when_the_app_stopped_on_an_error(monkeypatch):
    """Textual prints the error and returns; the command must not then report success (exit 0)."""
    import types

    from typer.testing import CliRunner

    import engine.cli as cli
    import engine.cli.tui as tui_verb
    import tui.app

    class Crashed:
        return_code = 1

        def run(self):
            return None

    tty = types.SimpleNamespace(isatty=lambda: True)
    monkeypatch.setattr(tui_verb, "sys", types.SimpleNamespace(stdin=tty, stdout=tty))
    monkeypatch.setattr(tui.app, "create_app", lambda *a, **k: Crashed())
    assert CliRunner().invoke(cli.app, ["tui"]).exit_code == 3
    Crashed.return_code = 0
    assert CliRunner().invoke(cli.app, ["tui"]).exit_code == 0


def test_step_record_keys_plot_literally_and_a_childs_output_stays_text(hostile_store):
    """A step record key becomes a Plots row label; a check child's progress line (contract ids, messages)
    reaches the run panel: both literal, control characters escaped."""
    from tui.checkrun import CheckRun, Progress, parse_progress

    async def go():
        async with started(hostile_store, receipt=hostile_store["receipt"]) as (app, pilot):
            await pilot.press("4")
            await settle(app, pilot)
            view = app.screen.query_one("#plots-view")
            from rich.console import Console

            console = Console(width=200, record=True, color_system=None)
            console.print(view.content)  # a str here would be parsed as markup: the label must come out literal
            assert "[/]" in console.export_text()
            await pilot.press("escape")
            await settle(app, pilot)
            frame = parse_progress(f"\r\x1b[2Kdemo-method: [@click=app.quit]x[/] {OSC52} failed ━━ 3/9 0:00:01")
            assert frame is not None and "[@click=app.quit]x[/]" in frame.label
            cr = CheckRun("demo-method", "cpu", "42", ["x"], proc=object(), progress=Progress(3, 9, "0:00:01",
                                                                                       frame.label))
            app.check_run = cr
            app.screen.show_run(cr)
            await settle(app, pilot)
            panel = str(app.screen.query_one("#run-panel").render())
            assert "[@click=app.quit]x[/]" in panel and "\x1b" not in panel and app.is_running

    asyncio.run(go())


def test_palette_text_is_never_markup():
    from textual.fuzzy import Matcher

    from tui.commands import highlight

    shown = highlight(Matcher("click"), "receipt: [@click=app.quit]x[/]")
    assert shown.plain == "receipt: [@click=app.quit]x[/]"
