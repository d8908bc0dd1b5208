"""`d`: a receipt against the previous full receipt of its method on the same device, or two marked receipts."""

from __future__ import annotations

import json

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Header, Static

from tui import fmt
from tui.data import ReceiptRow, load_detail
from tui.diff import DiffRow, diff_predicates
from tui.screens.base import BACK, COPY, FILTER, FilteredScreen
from tui.widgets import DataStatic, FilterBar, KeyBar, VimTable

KIND_STYLE = {"status": "bold red", "mutant": "bold magenta", "run": "cyan", "added": "green", "removed": "yellow",
              "measurement": ""}


class DiffScreen(FilteredScreen):
    """Which measurements moved and which statuses changed, old -> new."""

    BINDINGS = [
        BACK, FILTER,
        Binding("f", "failures", "Status changes only", id="failures"),
        COPY,
    ]

    def __init__(self, old: ReceiptRow, new: ReceiptRow, why: str = "") -> None:
        super().__init__(id="diff")
        self.old, self.new, self.why = old, new, why
        self.rows: list[DiffRow] = []
        self.same = 0
        self.error = ""

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield DataStatic(Text(f"old {self.old.file}  ({fmt.when(self.old.created_at)})\n"
                              f"new {self.new.file}  ({fmt.when(self.new.created_at)})\ncomparing ...", style="bold"),
                         id="diff-header")
        yield VimTable(id="diff-table", cursor_type="cell")
        yield FilterBar(placeholder="filter changes (enter: keep, escape: clear)", id="filter")
        yield KeyBar()

    def on_mount(self) -> None:
        self.sub_title = "diff"
        self.query_one("#filter").display = False
        self.compare()

    @work(thread=True, exclusive=True, group="diff")
    def compare(self) -> None:
        a = load_detail(self.app.receipts_dir, self.old.file)
        b = load_detail(self.app.receipts_dir, self.new.file)
        if a.data is None or b.data is None:
            bad = a if a.data is None else b
            self.app.ui(self.show, [], 0, f"cannot compare: {bad.file}: {bad.error}")
            return
        try:
            rows, same = diff_predicates(a.data["predicate"], b.data["predicate"])
        except Exception as err:  # a tampered file can hold any JSON at all
            self.app.ui(self.show, [], 0, f"cannot compare: {type(err).__name__}: {err}")
            return
        self.app.ui(self.show, rows, same, "")

    def show(self, rows: list[DiffRow], same: int, error: str) -> None:
        if not self.is_mounted:
            return  # closed before the comparison finished
        self.rows, self.same, self.error = rows, same, error
        self._fill()
        self.query_one("#diff-table").focus()

    def _fill(self) -> None:
        moved = sum(r.kind == "measurement" for r in self.rows)
        statuses = sum(r.kind == "status" for r in self.rows)
        head = Text(style="bold")
        for word, r in (("old", self.old), ("new", self.new)):
            head.append(f"{word} {r.file}  ({fmt.when(r.created_at)}, {r.device}, {r.status}, {r.coverage_label})\n")
        if self.why:
            head.append(f"comparing {self.why}\n", style="dim")
        if self.error:
            head.append(self.error, style="bold red")
        elif not self.rows:
            head.append(f"no differences: every one of the {self.same} measurement(s), every status and every mutant "
                        "verdict is the same", style="green")
        else:
            head.append(f"{moved} measurement(s) moved, {statuses} status(es) changed, "
                        f"{sum(r.kind == 'mutant' for r in self.rows)} mutant verdict(s) changed, "
                        f"{self.same} measurement(s) unchanged")
            if self.failures_only and not any(r.kind in ("status", "mutant", "run") for r in self.rows):
                head.append("\nno status, mutant or run changes (f shows the moved measurements)", style="italic")
        self.query_one("#diff-header", Static).update(head)
        rows = []
        needle = self.filter_text.lower()
        for r in self.rows:
            if self.failures_only and r.kind not in ("status", "mutant", "run"):
                continue
            if needle and needle not in f"{r.kind} {r.where} {r.name} {r.change}".lower():
                continue
            rows.append(([Text(r.kind, style=KIND_STYLE.get(r.kind, "")), r.where, str(r.name), fmt.num(r.old),
                          fmt.num(r.new), r.change], [r.kind, r.where, r.name, r.old, r.new, r.change], None))
        self.query_one("#diff-table", VimTable).fill(["change", "contract seed dtype", "what", "old", "new", "delta"],
                                                     rows)

    def action_back(self) -> None:
        self.app.pop_screen()

    def refill(self) -> None:
        self._fill()

    def focus_filtered(self) -> None:
        self.query_one("#diff-table").focus()

    def action_copy(self) -> None:
        value = self.query_one("#diff-table", VimTable).cursor_value()
        if value is not None:
            self.app.copy_text(value if isinstance(value, str) else json.dumps(value))

