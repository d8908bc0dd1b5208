"""Small widgets shared by the screens: a DataTable with vim keys, a filter bar, a Static for data.

Every widget here that shows text from a spec, a receipt or a file name takes
it as literal text (tui.fmt.plain / tui.fmt.clean): DataTable cells and column
labels, Tree labels and Static content given as a str would otherwise be parsed
as Textual markup, where `[@click=app.screenshot(...)]` is an action and `[/]`
an error that stops the app.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.coordinate import Coordinate
from textual.message import Message
from rich.cells import cell_len
from rich.text import Text
from textual.widget import Widget
from textual.widgets import DataTable, Input, Static, TabPane, Tree

from tui import fmt

MOVE = Binding.Group("Move")  # j/k/g/G share one footer entry


def _moves(top: str, bottom: str) -> list[Binding]:
    """enter, j, k, g, G under one set of ids for every list (one remap moves them all); `top` and `bottom` are the
    widget's own actions for g and G."""
    return [
        Binding("enter", "select_cursor", "Open", id="open"),
        Binding("j", "cursor_down", "Down", id="table.down", group=MOVE),
        Binding("k", "cursor_up", "Up", id="table.up", group=MOVE),
        Binding("g", top, "Top", id="table.top", group=MOVE),
        Binding("G", bottom, "Bottom", id="table.bottom", group=MOVE),
    ]


class VimTable(DataTable):
    """DataTable with j/k/g/G; `enter` opens the row. Every binding has an id users can remap.

    Rows may carry their raw values beside the displayed text, so `y` copies
    full precision rather than the 3 significant digits shown.
    """

    BINDINGS = _moves("scroll_top", "scroll_bottom")

    class Opened(Message):
        """Enter on a row (or cell): which row, by index and key."""

        def __init__(self, table: "VimTable", row: int, key: str | None) -> None:
            self.table, self.row, self.key = table, row, key
            super().__init__()

    MAX_WIDTH = 60  # longer cells are cut on screen; y copies them whole, enter shows them whole

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("cursor_type", "row")
        kwargs.setdefault("zebra_stripes", True)
        super().__init__(*args, **kwargs)
        self._raw: list = []
        self._pending_raw = None

    def clear(self, columns: bool = False):
        self._raw = []
        return super().clear(columns)

    def add_row(self, *cells, **kwargs):
        self._raw.append(self._pending_raw)
        self._pending_raw = None
        return super().add_row(*(fmt.cell(c) for c in cells), **kwargs)

    def add_column(self, label, *args, **kwargs):
        return super().add_column(fmt.cell(label), *args, **kwargs)

    def add_raw_row(self, cells: list, raw: list | None, key: str | None = None):
        """A row shown as `cells`, copied as `raw`."""
        self._pending_raw = raw
        return self.add_row(*cells, key=key)

    def fill(self, columns: list, rows: list, fit: int | None = None, shrink: dict[int, int] | None = None,
             keep: int | None = None) -> None:
        """Replace every column and row: `columns` are labels or (label, key); `rows` are (cells, raw, key).

        Column widths are computed here from the text (capped at MAX_WIDTH), not
        left to DataTable's measuring pass on idle: the picture is the same
        whenever it is taken, and no cell is measured twice. With `fit` (the
        cells the table has across), the columns in `shrink` (index -> the
        narrowest it may get, in the order given) give up width until the
        columns up to `keep` (default: the last shrinkable one) fit; a cut cell
        ends in `…`, and `y`/`enter` still give it whole.
        """
        cols = [(fmt.cell(label), key) for label, key in (c if isinstance(c, tuple) else (c, None) for c in columns)]
        widths = [label.cell_len for label, _ in cols]
        rows = [([fmt.cell(c) for c in cells], raw, key) for cells, raw, key in rows]
        for cells, _raw, _key in rows:
            for i, cell in enumerate(cells[:len(widths)]):
                w = cell.cell_len if isinstance(cell, Text) else cell_len(str(cell))
                if w > widths[i]:
                    widths[i] = min(w, self.MAX_WIDTH)
        if fit is not None and shrink:
            widths = fitted_widths(widths, fit, shrink, 2 * self.cell_padding, keep)
        self.clear(columns=True)
        for (label, key), width in zip(cols, widths):
            self.add_column(label, width=width, key=key)
        for cells, raw, key in rows:
            self.add_raw_row(cells, raw, key)

    def action_select_cursor(self) -> None:
        if not self.row_count:
            return
        row = self.cursor_coordinate.row
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            key = None
        self.post_message(self.Opened(self, row, key))

    def action_scroll_top(self) -> None:
        if self.row_count:
            self.move_cursor(row=0, animate=False)

    def action_scroll_bottom(self) -> None:
        if self.row_count:
            self.move_cursor(row=self.row_count - 1, animate=False)

    def cursor_value(self):
        """The value under the cursor, raw if the row has raw values (row mode: the first column)."""
        if not self.row_count:
            return None
        row, col = self.cursor_coordinate
        if self.cursor_type == "row":
            col = 0
        raw = self._raw[row] if row < len(self._raw) else None
        if raw is not None and col < len(raw):
            return raw[col]
        if not self.is_valid_coordinate(Coordinate(row, col)):
            return None
        value = self.get_cell_at(Coordinate(row, col))
        return value.plain if hasattr(value, "plain") else value


def fitted_widths(widths: list[int], fit: int, shrink: dict[int, int], padding: int,
                  keep: int | None = None) -> list[int]:
    """`widths` with the `shrink` columns narrowed (to no less than their minimum) until every column up to
    and including `keep` (default: the last shrinkable one) fits in `fit` cells; later ones may scroll off."""
    widths = list(widths)
    last = max(shrink) if keep is None else keep
    need = sum(w + padding for w in widths[:last + 1]) - fit
    for i, least in shrink.items():
        if need <= 0:
            break
        give = min(need, max(0, widths[i] - least))
        widths[i] -= give
        need -= give
    return widths


class MethodTree(Tree):
    """The method tree, with the same binding ids as the tables."""

    BINDINGS = _moves("scroll_home", "scroll_end")

    def process_label(self, label) -> Text:
        """A label is literal text, never markup (see the module docstring)."""
        return super().process_label(fmt.clean(label))

    def action_scroll_home(self) -> None:
        self.move_cursor_to_line(0)

    def action_scroll_end(self) -> None:
        self.move_cursor_to_line(max(0, self.last_line))


class DataStatic(Static):
    """A Static for text from specs and receipts: a str is literal text, control characters show escaped."""

    def __init__(self, content="", **kwargs) -> None:
        kwargs.setdefault("markup", False)
        super().__init__(fmt.clean(content), **kwargs)

    def update(self, content="", **kwargs) -> None:
        super().update(fmt.clean(content), **kwargs)


def table_tab(title: str, pane_id: str, note_id: str, table_id: str, cursor_type: str = "row",
              *after: Widget) -> TabPane:
    """A tab of a note line (DataStatic `note_id`) above a VimTable `table_id`, then `after`."""
    return TabPane(title, DataStatic("", id=note_id), VimTable(id=table_id, cursor_type=cursor_type), *after,
                   id=pane_id)


def scroll_tab(title: str, pane_id: str, view_id: str, scroll_id: str | None = None) -> TabPane:
    """A tab of one scrolled DataStatic `view_id`."""
    return TabPane(title, VerticalScroll(DataStatic("", id=view_id), id=scroll_id), id=pane_id)


class FilterBar(Input):
    """The `/` filter: typing filters live; enter keeps it, escape clears it."""

    class Done(Message):
        def __init__(self, cleared: bool) -> None:
            self.cleared = cleared
            super().__init__()

    BINDINGS = [Binding("escape", "clear", "Clear filter", id="filter.clear")]

    def action_clear(self) -> None:
        self.value = ""
        self.post_message(self.Done(cleared=True))

    async def action_submit(self) -> None:
        self.post_message(self.Done(cleared=False))


class KeyBar(Static):
    """The footer: the keys that apply here, from the screen's active bindings, wrapped onto a second line
    when the terminal is narrow; bindings of one group (tabs, moving) share one entry, e.g. `1-5 Tabs`.

    One widget rather than Textual's Footer, which mounts a widget per key and
    rebuilds them on every focus change (about 100 ms per screen opened here).
    """

    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        width: 100%;
        height: auto;
        max-height: 3;
        background: $footer-background;
        color: $footer-foreground;
    }
    """

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._changed)
        self._changed(self.screen)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def on_resize(self, event) -> None:
        if event.size.width != getattr(self, "_width", None):  # only a new width re-wraps the keys
            self._width = event.size.width
            self._changed(self.screen)

    def _changed(self, screen) -> None:
        if screen is self.screen:
            self.update(self.render_keys())

    def entries(self) -> list[tuple[str, str, bool]]:
        """(keys, description, enabled) per footer entry, in binding order; a group is one entry."""
        out: list[tuple[str, str, bool]] = []
        groups: dict = {}
        seen = set()
        for _node, binding, enabled, _tip in self.screen.active_bindings.values():
            if binding.action == "command_palette" or binding.system or not binding.show or binding.action in seen:
                continue
            seen.add(binding.action)
            key = self.app.get_key_display(binding)
            if binding.group is not None:
                if binding.group in groups:
                    keys, desc, on = out[groups[binding.group]]
                    out[groups[binding.group]] = (keys + [key], desc, on or enabled)
                    continue
                groups[binding.group] = len(out)
                out.append(([key], binding.group.description, enabled))
            else:
                out.append(([key], binding.description, enabled))
        return [(_keys(keys), desc, on) for keys, desc, on in out]

    def palette_hint(self) -> str:
        if not self.app.ENABLE_COMMAND_PALETTE:
            return ""
        for _node, binding, _enabled, _tip in self.screen.active_bindings.values():
            if binding.action == "command_palette":
                return f" {self.app.get_key_display(binding)} palette "
        return ""

    def render_keys(self) -> Text:
        """' ⏎ Open  / Filter  ...' packed into lines of the bar's width, the palette key at the right edge."""
        width = self.size.width or self.app.size.width or 80
        lines: list[Text] = [Text()]
        for keys, desc, enabled in self.entries():
            item = Text()
            item.append(f" {keys} ", style="bold reverse" if enabled else "dim reverse")
            item.append(f" {desc} ", style="" if enabled else "dim")
            if lines[-1].cell_len and lines[-1].cell_len + item.cell_len > width:
                lines.append(Text())
            lines[-1].append_text(item)
        hint = self.palette_hint()
        if hint:
            if lines[-1].cell_len + len(hint) + 1 > width:
                lines.append(Text())
            gap = max(1, width - lines[-1].cell_len - len(hint))
            lines[-1].append(" " * gap + hint, style="dim")
        return Text("\n").join(lines)


def _keys(keys: list[str]) -> str:
    """'1-5' for a run of digits, else the keys joined by '/'."""
    if len(keys) > 2 and all(len(k) == 1 and k.isdigit() for k in keys):
        digits = [int(k) for k in keys]
        if digits == list(range(digits[0], digits[0] + len(digits))):
            return f"{keys[0]}-{keys[-1]}"
    return "/".join(keys)


