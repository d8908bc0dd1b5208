"""`?`: every key, its binding id (for remapping) and what the marks mean."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = [
    ("filter", "/", "filter the table (enter keeps it, escape clears it)"),
    ("failures", "f", "failures only (failed, error, tampered, corrupt)"),
    ("open", "enter", "open: contract -> its newest receipt; receipt -> its results; result -> its measurements"),
    ("back", "escape", "back, or clear the filter"),
    ("diff", "d", "diff a receipt against the previous receipt of the same method"),
    ("copy", "y", "copy the selected value (full precision) or the receipt path"),
    ("reload", "r", "re-read specs and new receipts (also happens by itself every few seconds)"),
    ("help", "?", "this help"),
    ("quit", "q", "quit"),
    ("table.down / table.up", "j / k", "down / up in tables and the tree"),
    ("table.top / table.bottom", "g / G", "first / last row"),
    ("tab.contracts .. tab.gate", "1 .. 5", "switch tab: Contracts, Receipts, Spec, Paper, Gate"),
    ("command palette", "ctrl+p", "method: NAME, receipt: ID, copy: contracts check ..., filter: failures only"),
]


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "close", "Close", id="help.close")]

    def compose(self) -> ComposeResult:
        t = Table(title="keys (binding id -> default key)", title_justify="left", expand=True)
        t.add_column("id", no_wrap=True), t.add_column("key", no_wrap=True), t.add_column("does")
        for bid, key, what in KEYS:
            t.add_row(bid, key, what)
        notes = Text()
        notes.append("\nremap keys: contracts tui --keys 'copy=c,failures=x' (or CONTRACTS_TUI_KEYS)\n")
        notes.append("marks: ✓ passed  ✗ failed  ! error  · none/not run  |  gate ✓ open  ✗ closed\n")
        notes.append("evidence: fresh (sources unchanged) | stale (a bound file changed; does not count) | "
                     "TAMPERED (edited after writing) | CORRUPT (unreadable)\n")
        notes.append("paper-reported results are never measured here; the Paper tab keeps them apart.\n")
        with VerticalScroll(id="help-box"):
            yield Static(t)
            yield Static(notes)

    def action_close(self) -> None:
        self.app.pop_screen()
