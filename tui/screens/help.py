"""`?`: every key, its binding id (for remapping) and what the marks mean."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.widgets import KeyBar

# What each binding does, at more length than its footer word; a binding missing here shows that word.
DOES = {
    "filter": "filter the table (enter keeps it, escape clears it)",
    "failures": "failures only (failed, error, tampered, corrupt; mutants that survived)",
    "open": "open: contract -> the receipt behind its worst cell; receipt -> its results; result -> its measurements",
    "back": "back, or clear the filter",
    "diff": "diff: the two marked receipts, else this receipt against the previous FULL receipt on the same device",
    "mark": "mark a receipt (two at most) for d to compare",
    "copy": "copy the selected value (full precision) or the receipt path",
    "check": "run contracts check on the selected method (device, seeds) in a child process, progress below",
    "check.stop": "stop the running check (asks first; what finished is kept in an interrupted receipt)",
    "promote": "Gate tab: promote (the gate is read from the files; refused with its reasons when closed)",
    "demote": "Gate tab: demote (asks why; the ledger records it)",
    "tree": "hide or show the method tree",
    "reload": "re-read specs and new receipts (also happens by itself every few seconds)",
    "help": "this help",
    "conformance": "the frameworks' conformance matrix: each variant against the paper spec it claims, from fresh "
                   "receipts (contracts conformance)",
    "quit": "quit (asks first while a check runs)",
}


def key_rows(classes: list[type]) -> list[tuple[str, str, str]]:
    """(binding id, default key, what it does) for every binding of `classes` (the app's binding_classes), each id
    once. The app hands the classes in: a screen it shows does not import it back."""
    rows, seen = [], set()
    for cls in classes:
        for b in cls.BINDINGS:
            if not isinstance(b, Binding) or b.id in seen:
                continue
            seen.add(b.id)
            rows.append((b.id, b.key, DOES.get(b.id, b.description)))
    return rows


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "close", "Close", id="help.close")]

    def __init__(self, classes: list[type]) -> None:
        super().__init__()
        self.classes_with_keys = list(classes)

    def compose(self) -> ComposeResult:
        t = Table(title="keys (binding id -> default key)", title_justify="left", expand=True)
        t.add_column("id", no_wrap=True), t.add_column("key", no_wrap=True), t.add_column("does")
        for bid, key, what in key_rows(self.classes_with_keys):
            t.add_row(Text(bid), Text(key), Text(what))
        t.add_row(Text("(palette)"), Text("ctrl+p"), Text("method:, check:, receipt:, compare:, promote:, copy:, "
                                                          "filter:, then Textual's own commands"))
        notes = Text()
        notes.append("\nremap keys: contracts tui --keys 'copy=c,failures=x' (or CONTRACTS_TUI_KEYS)\n")
        notes.append("marks: ✓ passed  ✗ failed  ! error  · none/not run  |  gate ✓ open  ✗ closed\n")
        notes.append("coverage: full (every contract, mutant and budget seed ran) | partial 1/10 (--only, "
                     "--no-mutants, fewer seeds, an interrupt)\n")
        notes.append("evidence: fresh (sources unchanged) | stale (a bound file changed; does not count) | "
                     "TAMPERED (edited after writing) | CORRUPT (unreadable)\n")
        notes.append("paper-reported results are never measured here; the Paper tab keeps them apart.\n")
        with Vertical(id="help-box"):
            with VerticalScroll(id="help-scroll"):
                yield Static(t)
                yield Static(notes)
            yield KeyBar(classes="in-box")

    def action_close(self) -> None:
        self.app.pop_screen()
