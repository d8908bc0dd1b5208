"""`C`: the conformance matrix (engine/store/conformance.py, what `contracts conformance` prints and writes to
docs/conformance.md): one row per framework variant and claimed spec, and below it the selected row's contracts with
the first failing case and the command that reruns it, or why the row has no receipt."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from tui.screens.base import BACK
from tui.widgets import VimTable

CELL_COLUMNS = ("framework", "variant", "spec", "cell", "held", "failed", "partial", "n/a", "first failing")
CONTRACT_COLUMNS = ("contract", "status", "first failing case", "repro")


class ConformanceScreen(Screen):
    BINDINGS = [BACK]

    def __init__(self) -> None:
        super().__init__(id="conformance")
        self.matrix = None

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Vertical():
            yield Static("reading the receipts ...", id="conf-summary", markup=False)
            yield VimTable(id="conf-cells")
            yield VimTable(id="conf-contracts")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#conf-cells", VimTable).add_columns(*CELL_COLUMNS)
        self.query_one("#conf-contracts", VimTable).add_columns(*CONTRACT_COLUMNS)
        self.load()

    @work(thread=True, group="conformance", description="read the conformance matrix")
    def load(self) -> None:
        from engine.store import conformance as C

        app = self.app
        try:
            zoo = getattr(app, "zoo", None) or C.default_zoo()  # a test's own table, else docs/conformance.yaml
            matrix = C.build(zoo, app.specs_dir, app.receipts_dir, app.root)
        except Exception as err:  # a broken zoo table is one line, never a dead screen
            app.ui(self.query_one("#conf-summary", Static).update, f"cannot read the matrix: {type(err).__name__}: "
                                                                     f"{err}")
            return
        app.ui(self.show, matrix)

    def show(self, matrix) -> None:
        from engine.text import term_safe

        self.matrix = matrix
        cells = self.query_one("#conf-cells", VimTable)
        cells.clear()
        for c in matrix.cells:
            n = c.counts
            cells.add_row(*(term_safe(x) for x in (
                f"{c.framework} {c.version}", c.variant, c.spec or "-", c.status, n["held"], n["failed"],
                n["partial"], n["not applicable"], c.failing[0].id if c.failing else "")))
        by = {}
        for c in matrix.cells:
            by[c.status] = by.get(c.status, 0) + 1
        self.query_one("#conf-summary", Static).update(term_safe(
            f"{len(matrix.cells)} rows from {matrix.zoo} and {matrix.store}: "
            + ", ".join(f"{k} {v}" for k, v in sorted(by.items())) + f"; {len(matrix.defects)} defect(s)"))
        if matrix.cells:
            self.show_contracts(0)
        cells.focus()

    def show_contracts(self, row: int) -> None:
        from engine.text import term_safe

        table = self.query_one("#conf-contracts", VimTable)
        table.clear()
        if self.matrix is None or not 0 <= row < len(self.matrix.cells):
            return
        cell = self.matrix.cells[row]
        if not cell.contracts:
            table.add_row(term_safe(cell.status), "", term_safe(cell.why), "")
            return
        for x in cell.contracts:
            table.add_row(*(term_safe(v) for v in (x.id, x.status, x.case or x.message, x.repro)))

    def on_data_table_row_highlighted(self, event) -> None:
        if event.data_table.id == "conf-cells":
            self.show_contracts(event.cursor_row)

    def action_back(self) -> None:
        self.app.pop_screen()
