"""One receipt in full: header, per-contract results, mutants, mechanism steps, raw JSON."""

from __future__ import annotations

import json

from rich.console import Group
from rich.pretty import Pretty
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Header, Log, Static, TabbedContent, TabPane

from engine.text import term_safe
from tui import fmt, plots
from tui.data import Detail, ReceiptRow, load_detail
from tui.screens.base import BACK, COPY, DIFF, FAILURES, FILTER, MARK, FilteredScreen, tab_bindings
from tui.widgets import DataStatic, FilterBar, KeyBar, VimTable, scroll_tab, table_tab

MAX_STEP_COLUMNS = 8


class ReceiptScreen(FilteredScreen):
    """One receipt. The app keeps a single instance and refills it for every receipt opened
    (composing a fresh screen each time was most of the cost of opening one); the file is
    read in a worker, so opening never blocks the UI."""

    BINDINGS = [
        BACK, FILTER, FAILURES, DIFF, MARK, COPY,
        *tab_bindings(("results", "Results"), ("mutants", "Mutants"), ("mechanism", "Mechanism"), ("plots", "Plots"),
                      ("raw", "Raw JSON")),
    ]

    AUTO_FOCUS = "#results-table"  # focused at mount, so the key bar is built once, not again on load

    def __init__(self, row: ReceiptRow, contract: str | None = None) -> None:
        super().__init__(id="receipt")
        self.row = row
        self.contract = contract  # opened from this contract: the cursor starts on its worst row, nothing hidden
        self.detail: Detail | None = None
        self._results: list[dict] = []
        self._result_rows: list[dict] = []  # results-table row index -> result
        self._raw_shown = False
        self._plots_shown = False
        self._opened = 0  # counts show() calls: a worker that reports for an older receipt is ignored

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield DataStatic(self._header_text(), id="receipt-header")
        with TabbedContent(id="receipt-tabs", initial="results"):
            yield table_tab("1 Results", "results", "results-note", "results-table", "cell")
            yield table_tab("2 Mutants", "mutants", "mutants-note", "mutants-table")
            yield table_tab("3 Mechanism", "mechanism", "steps-note", "steps-table", "cell",
                            DataStatic("", id="comparisons"))
            yield scroll_tab("4 Plots", "plots", "plots-view", "plots-scroll")
            with TabPane("5 Raw JSON", id="raw"):
                # Log draws only the visible lines; a TextArea spent 0.5 s on a 300 KB receipt.
                yield Log(id="raw-text", highlight=False, auto_scroll=False)
        yield FilterBar(placeholder="filter results (enter: keep, escape: clear)", id="filter")
        yield KeyBar()

    def on_mount(self) -> None:
        self.show(self.row, self.contract)

    def show(self, row: ReceiptRow, contract: str | None = None) -> None:
        """Show `row`: clear what the previous receipt left, then read the file in a worker."""
        self.row, self.contract, self.filter_text, self.failures_only = row, contract, "", False
        self.detail, self._results, self._result_rows, self._raw_shown = None, [], [], False
        self._plots_shown = False
        self._opened += 1
        self.sub_title = fmt.plain(row.file).plain  # a file name is data: control characters escaped
        bar = self.query_one("#filter", FilterBar)
        bar.value = ""
        bar.display = False
        self.query_one("#receipt-header", Static).update(self._header_text())
        self.query_one("#results-note", Static).update(Text("reading the receipt ...", style="dim"))
        for table in ("#results-table", "#mutants-table", "#steps-table"):
            self.query_one(table, VimTable).fill([], [])
        for note in ("#mutants-note", "#steps-note", "#comparisons", "#plots-view"):
            self.query_one(note, Static).update("")
        self.query_one("#raw-text", Log).clear()
        self.query_one(TabbedContent).active = "results"
        self.query_one("#results-table").focus()
        self.load(row.file, self._opened)

    # -- loading -------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="detail", description="read a receipt")
    def load(self, file: str, opened: int) -> None:
        detail = load_detail(self.app.receipts_dir, file)
        self.app.ui(self.show_detail, detail, opened)

    def show_detail(self, detail: Detail, opened: int | None = None) -> None:
        if not self.is_mounted or (opened is not None and opened != self._opened):
            return  # another receipt was opened since this one was asked for
        self.detail = detail
        pred = detail.predicate
        self._results = [r for r in pred.get("results") or [] if isinstance(r, dict)]
        self._raw_shown = False
        try:
            self.query_one("#receipt-header", Static).update(self._header_text(pred, detail.error))
            self._fill_results()
            self._goto_contract()
            self._fill_mutants(pred)
            self._fill_mechanism(pred)
            self._plots_shown = False
            if self.query_one(TabbedContent).active == "plots":
                self._show_plots()
        except Exception as err:  # a tampered file can hold any JSON at all: show it raw, never crash
            self.detail = Detail(detail.file, None, detail.text,
                                 f"cannot be shown as a receipt ({type(err).__name__}: {err})")
            self.query_one("#results-note", Static).update(Text(f"{self.detail.error}; see Raw JSON",
                                                                style="bold red"))
            detail = self.detail
        if detail.data is None:
            self.query_one(TabbedContent).active = "raw"
            self._show_raw()
            self.query_one("#raw-text").focus()
        elif self.focused is None:
            self.query_one("#results-table").focus()

    def _goto_contract(self) -> None:
        """The cursor on the opened contract's worst row (its first failed or errored one, else its first)."""
        if not self.contract:
            return
        rows = [i for i, r in enumerate(self._result_rows) if r.get("contract") == self.contract]
        if not rows:
            return
        bad = [i for i in rows if self._result_rows[i].get("status") != "passed"]
        self.query_one("#results-table", VimTable).move_cursor(row=(bad or rows)[0], column=0, animate=False)

    def _show_raw(self) -> None:
        """The file's text, written into the Raw JSON tab the first time it is shown."""
        if self.detail is None or self._raw_shown:
            return
        self._raw_shown = True
        log = self.query_one("#raw-text", Log)
        log.clear()
        log.write_lines([term_safe(line) for line in self.detail.text.splitlines()])  # raw bytes: never raw
        log.scroll_home(animate=False)

    def _show_plots(self) -> None:
        """The step records as sparklines, drawn the first time the Plots tab is shown."""
        if self.detail is None or self._plots_shown:
            return
        self._plots_shown = True
        pred = self.detail.predicate if self.detail else {}
        self.query_one("#plots-view", Static).update(plots.render(pred, self.size.width - 4))

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane is not None and event.pane.id == "raw":
            self._show_raw()
        elif event.pane is not None and event.pane.id == "plots":
            self._show_plots()
        self.refresh_bindings()

    # -- drawing -----------------------------------------------------------------------

    def _header_text(self, pred: dict | None = None, error: str = "") -> Text:
        r, e = self.row, self.row.entry
        pred = pred or {}
        env = pred.get("environment") or {}
        dev = env.get("device") or {}
        t = Text()
        t.append(f"{r.method}  ", style="bold")
        t.append_text(fmt.status(r.status))
        t.append("  ")
        t.append_text(fmt.state(r.freshness))
        cov = r.coverage
        if cov is not None:
            t.append("  coverage ")
            t.append(cov.text(), style="" if cov.full else "bold yellow")
        narrow = self.app.size.width < 110
        t.append(f"  id {(r.short_id if narrow else r.receipt_id) or '?'}\n")
        t.append(f"{fmt.when(r.created_at)} UTC"
                 + (f" -> {fmt.when(pred.get('finished_at'))[11:]}" if pred.get("finished_at") else "")
                 + f"  {e.get('device') or '?'} ({e.get('device_name') or '?'})"
                 + (f" cuda {dev.get('cuda')}" if dev.get("cuda") else "")
                 + f"  commit {fmt.commit(e.get('commit'), e.get('dirty'))}\n")
        if env:
            req, act = pred.get("request") or {}, pred.get("actual") or {}
            cost = pred.get("cost") or {}
            t.append(f"seeds requested {_seeds(req.get('seeds'))} run {_seeds(act.get('seeds'))}  "
                     f"wall {cost.get('wall_s')} s, {cost.get('optimizer_updates')} updates  "
                     f"python {env.get('python')} torch {env.get('torch')} {env.get('platform')} "
                     f"threads {env.get('torch_threads')}\n", style="dim")
        problem = error or r.problem
        if problem:
            label = {"stale": "stale", "tampered": "TAMPERED", "invalid": "CORRUPT"}.get(r.freshness, "problem")
            t.append(f"{label}: {problem}\n", style=fmt.STATE_STYLE.get(r.freshness, "bold red"))
        for msg in (pred.get("errors") or [])[:3]:
            t.append(f"run error: {msg}\n", style="bold magenta")
        t.rstrip()
        return t

    def _fill_results(self) -> None:
        t = self.query_one("#results-table", VimTable)
        needle = self.filter_text.lower()
        rows = []
        self._result_rows = []
        for r in self._results:
            if self.failures_only and r.get("status") == "passed":
                continue
            text = f"{r.get('contract')} {r.get('kind')} {r.get('seed')} {r.get('dtype')} {r.get('status')} " \
                   f"{r.get('message') or ''}".lower()
            if needle and needle not in text:
                continue
            worst = _worst(r.get("expectations") if isinstance(r.get("expectations"), list) else [])
            cells = [str(r.get("contract")), str(r.get("kind")), fmt.num(r.get("seed")), str(r.get("dtype")),
                     fmt.status(r.get("status") if isinstance(r.get("status"), str) else None),
                     _describe(worst), _headroom(worst), str(r.get("message") or "")[:120]]
            raw = [r.get("contract"), r.get("kind"), r.get("seed"), r.get("dtype"), r.get("status"),
                   worst.get("value"), worst.get("headroom"), r.get("message") or ""]
            rows.append((cells, raw, None))
            self._result_rows.append(r)
        t.fill(["contract", "kind", "seed", "dtype", "status", "worst expectation", "headroom", "message"], rows)
        total, shown = len(self._results), len(rows)
        parts = [f"{shown} of {total} result(s)"]
        if self.failures_only:
            parts.append("failures only")
        if self.filter_text:
            parts.append(f"matching '{self.filter_text}' (escape clears)")
        if self.contract and not self.filter_text:
            parts.append(f"opened at {self.contract}")
        style = "dim"
        if self.detail is not None and self.detail.data is None:
            parts = [f"unreadable receipt: {self.detail.error}; see Raw JSON"]
        elif not total:
            parts, style = ["no results in this receipt" + (" (it was interrupted before the first one)"
                                                             if self.row.status == "interrupted" else "")], "italic"
        elif not shown and self.failures_only and not self.filter_text:
            parts, style = [f"no failures: all {total} result(s) passed; f shows them all"], "italic"
        elif not shown:
            parts.append("nothing matches; escape clears the filter")
        self.query_one("#results-note", Static).update(Text(", ".join(parts), style=style))

    def _fill_mutants(self, pred: dict) -> None:
        rows = []
        for m in pred.get("mutants") or []:
            if not isinstance(m, dict):
                continue
            if self.failures_only and m.get("killed"):
                continue
            killed = Text("✓ killed", style="green") if m.get("killed") else Text("✗ SURVIVED", style="bold red")
            desc = str(m.get("description") or "")
            if m.get("error"):
                desc = f"{desc} [{m['error']}]"
            killers, expected = _names(m.get("killed_by")), _names(m.get("expected_killers"))
            rows.append(([str(m.get("id")), killed, killers or "–", expected, desc],
                         [m.get("id"), m.get("killed"), killers, expected, desc], None))
        self.query_one("#mutants-table", VimTable).fill(["mutant", "killed", "killed by", "expected killers",
                                                         "breaks"], rows)
        ran = [m for m in pred.get("mutants") or [] if isinstance(m, dict)]
        if not ran:
            cov = self.row.coverage
            note = "no mutants ran" + (" (--no-mutants)" if cov is not None and "--no-mutants" in cov.why else "")
        elif not rows:
            note = f"no survivors: all {len(ran)} mutant(s) were killed; f shows them all"
        else:
            note = ""
        widget = self.query_one("#mutants-note", Static)
        widget.update(Text(note, style="italic"))
        widget.display = bool(note)

    def _fill_mechanism(self, pred: dict) -> None:
        mech = [m for m in pred.get("mechanism") or [] if isinstance(m, dict)]
        fields: list[str] = []
        for m in mech:
            for st in m.get("steps") if isinstance(m.get("steps"), list) else []:
                for k in st if isinstance(st, dict) else []:
                    if k not in fields:
                        fields.append(k)
        fields = fields[:MAX_STEP_COLUMNS]
        rows = []
        for m in mech:
            for i, st in enumerate(m.get("steps") if isinstance(m.get("steps"), list) else []):
                if not isinstance(st, dict):
                    continue
                vals = [st.get(k) for k in fields]
                rows.append(([str(m.get("contract")), fmt.num(m.get("seed")), str(m.get("dtype")), str(i),
                              *[f"[{len(v)} values]" if isinstance(v, list) else fmt.num(v) for v in vals]],
                             [m.get("contract"), m.get("seed"), m.get("dtype"), i, *vals], None))
        self.query_one("#steps-table", VimTable).fill(["contract", "seed", "dtype", "#", *fields], rows)
        note = self.query_one("#steps-note", Static)
        note.update(Text("no mechanism run in this receipt (its step records and comparisons would be here)"
                         if not mech else "step records (4 plots them per seed)", style="italic" if not mech else "dim"))
        out = Text()
        comps = [(m, c) for m in mech for c in m.get("comparisons") or [] if isinstance(c, dict)]
        for m, c in comps:
            label = "FORMAL" if c.get("formal") else "diagnostic only (the gate never counts it)"
            out.append(f"{c.get('name')} [{label}]: {c.get('method')} vs {c.get('control')} on {c.get('metric')} "
                       f"(contract {m.get('contract')}, seed {m.get('seed')})\n", style="bold")
            out.append(f"  method  {c.get('method_values')}\n  control {c.get('control_values')}\n")
            mv, cv = _numbers(c.get("method_values")), _numbers(c.get("control_values"))
            if mv and cv:
                out.append(f"  mean(method) - mean(control) = {sum(mv) / len(mv) - sum(cv) / len(cv):+.4g} "
                           "(the gate's interval is over seeds: Gate tab)\n")
            if c.get("note"):
                out.append(f"  {c['note']}\n", style="italic")
        self.query_one("#comparisons", Static).update(out)

    # -- actions ---------------------------------------------------------------------------

    def action_back(self) -> None:
        bar = self.query_one("#filter", FilterBar)
        if bar.has_focus:
            bar.action_clear()
            return
        self.app.pop_screen()

    def refill(self) -> None:
        self._fill_results()

    def refill_failures(self) -> None:
        self._fill_results()
        self._fill_mutants(self.detail.predicate if self.detail else {})

    def focus_filtered(self) -> None:
        self.query_one("#results-table").focus()

    def action_diff(self) -> None:
        self.app.open_diff(self.row.file)

    def action_mark(self) -> None:
        self.app.toggle_mark(self.row.file)
        self.refresh_bindings()
        from tui.screens.main import MainScreen

        for screen in self.app.screen_stack:
            if isinstance(screen, MainScreen):
                screen.marks_changed()

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        target = {"results": "#results-table", "mutants": "#mutants-table", "mechanism": "#steps-table",
                  "plots": "#plots-scroll", "raw": "#raw-text"}[tab]
        self.query_one(target).focus()

    def action_copy(self) -> None:
        focused = self.focused
        if isinstance(focused, VimTable) and focused.row_count:
            value = focused.cursor_value()
            if value is not None:
                self.app.copy_text(value if isinstance(value, str) else json.dumps(value))
                return
        self.app.copy_text(self.app.receipt_display_path(self.row.file))

    def on_vim_table_opened(self, event: VimTable.Opened) -> None:
        if event.table.id == "results-table":
            rows = self._result_rows
            if event.row < len(rows):
                self.app.push_screen(ResultScreen(rows[event.row]))


class ResultScreen(ModalScreen):
    """Every measurement and expectation of one contract result."""

    BINDINGS = [Binding("escape", "dismiss", "Close", id="back")]

    def __init__(self, result: dict) -> None:
        super().__init__()
        self.result = result

    def compose(self) -> ComposeResult:
        r = self.result
        head = Text()
        head.append(f"{r.get('contract')}  seed {r.get('seed')}  {r.get('dtype')}  ", style="bold")
        head.append_text(fmt.status(r.get("status")))
        lines = [head]
        for e in r.get("expectations") or []:
            ok = e.get("passed")
            line = Text(("✓ " if ok else "✗ "), style="green" if ok else "bold red")
            line.append(f"{_describe(e) if isinstance(e, dict) else e}  (limit from "
                        f"{e.get('tolerance_source') if isinstance(e, dict) else '?'})")
            lines.append(line)
        if r.get("message"):
            lines.append(Text(f"message: {r['message']}", style="magenta"))
        lines.append(Text("measurements (full precision):", style="bold"))
        lines.append(Pretty(r.get("measurements") or {}))
        with Vertical(id="result-box"):
            with VerticalScroll(id="result-scroll"):
                yield DataStatic(Group(*lines))
            yield KeyBar(classes="in-box")

    def action_dismiss(self) -> None:
        self.app.pop_screen()


def _worst(expectations: list) -> dict:
    """The expectation nearest to failing by headroom (engine.run.expect.worst_expectation: an equality sanity
    check only when nothing scaled is there); {} when there is none."""
    from engine.run.expect import worst_expectation

    try:
        return worst_expectation([e for e in expectations if isinstance(e, dict)]) or {}
    except Exception:  # a tampered receipt can hold any values at all
        return next((e for e in expectations if isinstance(e, dict)), {})


def _describe(e: dict) -> str:
    """`max_abs_err 3e-16 <= 1e-12 (10^3.5x headroom)`, `max_rel_err 0.356 > limit 1e-12`: true as printed."""
    from engine.run.expect import describe

    if not e or e.get("metric") is None:
        return "–"
    try:
        return describe(e)
    except Exception:
        return fmt.expectation(e.get("metric"), e.get("value"), e.get("op"), e.get("threshold"))


def _headroom(e: dict) -> str:
    """The worst expectation's headroom as the main screen shows it: a ratio, or held / not held."""
    from engine.run.expect import format_headroom, headroom, is_sanity

    if not e:
        return "–"
    try:
        if is_sanity(e):
            return "held" if e.get("passed") else "not held"
        h = e.get("headroom") if "headroom" in e else headroom(e.get("op"), e.get("value"), e.get("threshold"))
        return format_headroom(h) if h is not None else ("held" if e.get("passed") else "not held")
    except Exception:
        return "?"


def _seeds(value) -> str:
    """'42,43,44' for a list of seeds; anything else as its text (a tampered receipt may hold anything)."""
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _numbers(values) -> list[float]:
    """Finite numbers only; an empty list when any value is not one."""
    import math

    if not isinstance(values, list):
        return []
    ok = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return ok if len(ok) == len(values) else []


def _names(value) -> str:
    """A list of ids as 'a, b'; anything else as its text (a tampered receipt may hold anything)."""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return "" if value is None else str(value)
