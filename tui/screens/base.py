"""What the main, receipt and diff screens share: their common key bindings, numbered tab keys, and the filter bar
(`/`) with the failures-only toggle (`f`) over their tables."""

from __future__ import annotations

from textual.binding import Binding
from textual.screen import Screen

from tui.widgets import FilterBar

# One Binding per action and id, so that a remapped id (the keymap) means the same key on every screen.
BACK = Binding("escape", "back", "Back", id="back")
FILTER = Binding("slash", "filter", "Filter", id="filter")
FAILURES = Binding("f", "failures", "Failures", id="failures")
COPY = Binding("y", "copy", "Copy", id="copy")
DIFF = Binding("d", "diff", "Diff", id="diff")
MARK = Binding("m", "mark", "Mark", id="mark")
TAB_KEYS = Binding.Group("Tabs")


def tab_bindings(*tabs: tuple[str, str]) -> list[Binding]:
    """`1`, `2`, ... for the (tab id, label) pairs in order, one footer group."""
    return [Binding(str(i), f"tab('{tab}')", label, id=f"tab.{tab}", group=TAB_KEYS)
            for i, (tab, label) in enumerate(tabs, 1)]


class FilteredScreen(Screen):
    """A screen whose tables a filter bar (`#filter`) narrows by text and `f` narrows to failures.

    Subclasses say what to refill (`refill`, `refill_failures`) and what to focus when the bar is done; they must
    not define the FilterBar handlers themselves (Textual would call both)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.filter_text = ""
        self.failures_only = False

    def refill(self) -> None:
        """Show the rows the filter text lets through."""
        raise NotImplementedError

    def refill_failures(self) -> None:
        """Show the rows after `f` toggled failures-only (by default, as for a new filter text)."""
        self.refill()

    def focus_filtered(self) -> None:
        """Focus the table the filter narrows, once the bar is done."""
        raise NotImplementedError

    def action_filter(self) -> None:
        bar = self.query_one("#filter", FilterBar)
        bar.display = True
        bar.focus()

    def action_failures(self) -> None:
        self.failures_only = not self.failures_only
        self.refill_failures()

    def on_input_changed(self, event: FilterBar.Changed) -> None:
        if event.input.id == "filter":
            self.filter_text = event.value.strip()
            self.refill()

    def on_filter_bar_done(self, event: FilterBar.Done) -> None:
        if event.cleared:
            self.query_one("#filter").display = False
            self.filter_text = ""
            self.refill()
        self.focus_filtered()
