"""The main screen: methods on the left, the selected method's tabs on the right."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Header, Static, TabbedContent, Tree

from tui import fmt
from tui.data import MethodModel, Model
from tui.screens.base import BACK, COPY, DIFF, FAILURES, FILTER, MARK, FilteredScreen, tab_bindings
from tui.widgets import DataStatic, FilterBar, KeyBar, MethodTree, VimTable, scroll_tab, table_tab

MAX_RECEIPT_ROWS = 300  # a DataTable measures every cell; the store can hold 10,000+ receipts
TABS = ("contracts", "receipts", "spec", "paper", "gate")
NARROW = 110  # columns: below this the tree drops review/promotion from its labels (the status line has them)
TREE_MIN, TREE_SHARE_WIDE, TREE_SHARE_NARROW = 20, 0.45, 0.34  # the tree's width: least, most (share of screen)
STATUS_MIN = 8  # "✓ passed": a device status column is never narrower


class MainScreen(FilteredScreen):
    """Tree of methods (review, promotion, gate) and tabs: Contracts, Receipts, Spec, Paper, Gate."""

    BINDINGS = [
        FILTER, FAILURES, COPY, DIFF, MARK,
        Binding("c", "check", "Check", id="check"),
        Binding("p", "promote", "Promote", id="promote"),
        Binding("p", "demote", "Demote", id="demote"),
        Binding("t", "toggle_tree", "Tree", id="tree"),
        BACK,
        *tab_bindings(("contracts", "Contracts"), ("receipts", "Receipts"), ("spec", "Spec"), ("paper", "Paper"),
                      ("gate", "Gate")),
    ]

    def __init__(self) -> None:
        super().__init__(id="main")
        self.method: str | None = None
        self.contract: str | None = None  # a contract picked in the tree narrows the receipt list
        self._receipt_files: list[str] = []  # receipts-table row index -> file in the store
        self._ready = False  # a model can arrive from the worker before this screen is mounted
        self._stale_tabs: set[str] = set()  # tabs whose content predates the current model or filter
        self._width = 0  # the screen's width in cells, set on mount and on every resize
        self._tree_width = TREE_MIN

    # -- layout ------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal(id="body"):
            with Vertical(id="left"):
                yield MethodTree("methods", id="methods")
                yield Static(Text("gate ✓ open ✗ closed … pending\ncontract ✓ pass ✗ fail ! error · none",
                                  style="dim"), id="legend")
            with Vertical(id="right"):
                yield DataStatic("loading specs and the receipt index ...", id="status")
                with TabbedContent(id="tabs", initial="contracts"):
                    yield table_tab("1 Contracts", "contracts", "contracts-note", "contracts-table", "cell")
                    yield table_tab("2 Receipts", "receipts", "receipts-note", "receipts-table")
                    yield scroll_tab("3 Spec", "spec", "spec-view")
                    yield scroll_tab("4 Paper", "paper", "paper-view")
                    yield scroll_tab("5 Gate", "gate", "gate-view")
        yield FilterBar(placeholder="filter (enter: keep, escape: clear)", id="filter")
        yield DataStatic("", id="run-panel")
        yield KeyBar()

    def on_mount(self) -> None:
        self._ready = True
        tree = self.query_one(MethodTree)
        tree.show_root = False
        tree.guide_depth = 2
        self.query_one("#left").border_title = "methods"
        self.query_one("#filter").display = False
        self.query_one("#contracts-note").display = False
        self.query_one("#run-panel").display = False
        self._apply_width(self.app.size.width)
        if self.app.check_run is not None:
            self.show_run(self.app.check_run)
        if self.app.model is not None:
            self.show_model(self.app.model)
        self.refresh_bindings()

    # -- layout: the tree takes what its labels need, the tables the rest ------------

    @property
    def narrow(self) -> bool:
        return self._width < NARROW

    def _apply_width(self, width: int) -> None:
        self._width = width
        self.set_class(self.narrow, "-narrow")

    def on_resize(self, event) -> None:
        if event.size.width == self._width:
            return
        was = self.narrow
        self._apply_width(event.size.width)
        if self.app.model is None:
            return
        if was != self.narrow:
            self.show_model(self.app.model)  # the labels change form
        else:
            self._size_tree()
            self._stale_tabs |= {"contracts", "receipts"}  # both tables fit their columns to the width
            self._fill_tab(self.query_one(TabbedContent).active)

    def _size_tree(self) -> None:
        """The tree as wide as its widest label (plus border and scroll bar), within a share of the screen."""
        tree = self.query_one(MethodTree)
        need = 0  # a line is its toggle or guide (2 cells) and its label; problem lines may scroll
        for node in tree.root.children:
            for n in (node, *node.children):
                if n.data and n.data[0] in ("method", "contract"):
                    need = max(need, 2 + tree.process_label(n.label).cell_len)
        share = TREE_SHARE_NARROW if self.narrow else TREE_SHARE_WIDE
        self._tree_width = max(TREE_MIN, min(need + 3, int(self._width * share)))
        self.query_one("#left").styles.width = self._tree_width

    def _table_width(self) -> int:
        """Cells across the right panel's tables (borders and the scroll bar taken off)."""
        left = self._tree_width if self.query_one("#left").display else 0
        return max(20, self._width - left - 3)

    # -- model -> widgets ----------------------------------------------------------

    @property
    def current(self) -> MethodModel | None:
        model: Model | None = self.app.model
        return model.method(self.method) if (model and self.method) else None

    def show_model(self, model: Model) -> None:
        """Redraw everything from a new model, keeping the selection where it still exists."""
        if not self._ready:
            return  # on_mount draws it
        self.sub_title = f"{len(model.methods)} method(s), {model.receipts_total} receipt(s)"
        tree = self.query_one(MethodTree)
        expanded = {n.data[1] for n in tree.root.children if n.data and n.is_expanded}
        tree.clear()
        if self.method is None or model.method(self.method) is None:
            self.method = model.methods[0].key if model.methods else None
        for m in model.methods:
            node = tree.root.add(self._method_label(m), data=("method", m.key),
                                 expand=m.key in expanded or m.key == self.method)
            shown = [c for c in m.contracts if not (self.failures_only and not c.failing)]
            for c in shown:
                node.add_leaf(self._contract_label(c), data=("contract", m.key, c.id))
            if self.failures_only and m.contracts and not shown:
                node.add_leaf(Text("no failing contracts (f shows all)", style="dim italic"), data=("note", m.key))
            for p in m.problems[:5]:
                node.add_leaf(Text(f"⚠ {p}", style="bold red"), data=("problem", m.key))
        for p in model.problems:
            tree.root.add_leaf(Text(f"⚠ {p}", style="yellow"), data=("problem", None))
        if not model.methods:
            self.query_one("#status", Static).update(Text("\n".join(model.problems) or "nothing to show",
                                                          style="yellow"))
        self._size_tree()
        self._select_tree_line()
        self.refresh_method()

    def update_gate(self, key: str) -> None:
        """A verdict arrived: relabel that method and, if it is shown, its title and Gate tab."""
        if not self._ready or self.app.model is None:
            return
        m = self.app.model.method(key)
        for node in self.query_one(MethodTree).root.children:
            if node.data and node.data[0] == "method" and node.data[1] == key:
                node.set_label(self._method_label(m))
        if key == self.method:
            self.query_one("#right").border_title = m.summary()
            self._fill_status(m)
            self._stale_tabs.add("gate")
            self._fill_tab(self.query_one(TabbedContent).active)

    def _select_tree_line(self) -> None:
        tree = self.query_one(MethodTree)
        for line in range(tree.last_line + 1):
            node = tree.get_node_at_line(line)
            if node is None or not node.data:
                continue
            if node.data[0] == "method" and node.data[1] == self.method and not self.contract:
                tree.move_cursor_to_line(line)
                return
            if node.data[0] == "contract" and node.data[1] == self.method and node.data[2] == self.contract:
                tree.move_cursor_to_line(line)
                return

    def _method_label(self, m: MethodModel) -> Text:
        """'✗ mrtpo DONE not-promoted'; on a narrow screen only the mark and the key (the status line says the
        rest)."""
        t = Text()
        t.append(f"{fmt.GATE_MARK.get(m.gate.verdict, '?')} ", style=fmt.GATE_STYLE.get(m.gate.verdict, ""))
        t.append(m.key, style="bold")
        if m.spec is None:
            t.append(" BROKEN SPEC", style="bold red")
        elif not self.narrow:
            t.append(f" {m.review}", style="green" if m.review == "DONE" else "yellow")
            t.append(f" {m.promotion}", style="green" if m.promotion == "promoted" else "dim")
        return t

    @staticmethod
    def _contract_label(c) -> Text:
        return Text(f"{fmt.STATUS_MARK.get(c.overall, '?')} {c.id}", style=fmt.STATUS_STYLE.get(c.overall, ""))

    def refresh_method(self) -> None:
        m = self.current
        right = self.query_one("#right")
        if m is None:
            right.border_title = "no method"
            for sel in ("#contracts-table", "#receipts-table"):
                self.query_one(sel, VimTable).clear()
            return
        right.border_title = m.summary()
        shown = (["failures only"] if self.failures_only else []) + (
            [f"filter '{self.filter_text}'"] if self.filter_text else [])
        right.border_subtitle = ", ".join(shown)
        self._fill_status(m)
        # Only the visible tab is drawn now; the others when first shown (a 500-row
        # receipt table or a long spec is work the first screen need not wait for).
        self._stale_tabs = set(TABS)
        self._fill_tab(self.query_one(TabbedContent).active or "contracts")
        self.refresh_bindings()

    def _fill_tab(self, tab: str) -> None:
        m = self.current
        if m is None or tab not in self._stale_tabs:
            return
        self._stale_tabs.discard(tab)
        getattr(self, f"_fill_{tab}")(m)

    def _fill_status(self, m: MethodModel) -> None:
        status = Text()
        status.append(m.key, style="bold")
        status.append(f"  review {m.review}  promotion {m.promotion}  ")
        status.append_text(fmt.gate(m.gate.verdict))
        if m.problems:
            status.append("\n" + "\n".join(m.problems[:3]), style="bold red")
        self.query_one("#status", Static).update(status)

    def _match(self, text: str) -> bool:
        return not self.filter_text or self.filter_text.lower() in text

    def _fill_contracts(self, m: MethodModel) -> None:
        """Contract, a status per device (never squeezed out: the contract column gives way first), headroom,
        seeds, the newest error against its limit, kind. The tier (math, budget or scale) stays in view beside the
        statuses: it says whether a failure is the maths, a budget or the maths at training sizes."""
        t = self.query_one("#contracts-table", VimTable)
        cursor_key = self._cursor_key(t)
        rows = []
        for c in m.contracts:
            if (self.failures_only and not c.failing) or not self._match(c.search_text()):
                continue
            cells = []
            for dev in m.devices:
                st, fr = c.cells.get(dev, (None, None))
                cells.append(fmt.status(st, " (stale)" if fr == "stale" else ""))
            rows.append(([c.id, *cells, c.tier, c.worst_headroom, c.seeds_passed, c.latest, c.kind],
                         [c.id, *[fmt_plain(x) for x in cells], c.tier, c.worst_headroom, c.seeds_passed, c.latest,
                          c.kind],
                         c.id))
        shrink = {0: 12, **{1 + i: STATUS_MIN for i in range(len(m.devices))}}
        t.fill(["contract", *m.devices, "tier", "headroom", "seeds", "newest error vs limit", "kind"], rows,
               fit=self._table_width(), shrink=shrink, keep=len(m.devices) + 2)
        note = self.query_one("#contracts-note", Static)
        note.display = not rows
        if not rows:
            note.update(Text(self._empty_contracts(m), style="italic"))
        self._restore_cursor(t, self.contract or cursor_key)

    def _empty_contracts(self, m: MethodModel) -> str:
        """Why the contracts table is empty, and the key that brings rows back."""
        if not m.contracts:
            return f"{m.key} has no contracts" + ("" if m.spec else " (its spec could not be read: 3 for why)")
        if self.failures_only and not any(c.failing for c in m.contracts):
            never = sum(c.overall is None for c in m.contracts)
            return (f"no failures: none of the {len(m.contracts)} contracts failed in its newest receipt"
                    + (f" ({never} never run)" if never else "") + "; f shows them all")
        return f"no contract matches '{self.filter_text}'; escape clears the filter"

    def _visible_receipts(self, m: MethodModel) -> list:
        rows = m.receipts
        if self.contract:
            rows = [r for r in rows if self.contract in r.contracts or r.freshness == "invalid"]
        if self.failures_only:
            rows = [r for r in rows if r.status != "passed" or r.freshness in ("tampered", "invalid")]
        if self.filter_text:
            needle = self.filter_text.lower()
            rows = [r for r in rows if needle in r.search_text()]
        return rows

    def _fill_receipts(self, m: MethodModel) -> None:
        t = self.query_one("#receipts-table", VimTable)
        cursor_key = self.selected_receipt()
        rows = self._visible_receipts(m)
        shown = rows[:MAX_RECEIPT_ROWS]
        marked = self.app.marked
        t.fill(["", "time (UTC)", "device", "status", "coverage", "evidence", "seeds", "commit", "id"], [
            ([_mark(r.file, marked), fmt.when(r.created_at, short=self.narrow), r.device,
              fmt.status(r.status) if r.status else Text("? unknown", style="bold red"), fmt.coverage(r.coverage),
              fmt.state(r.freshness), ",".join(map(str, r.entry.get("seeds") or [])) or "–",
              fmt.commit(r.entry.get("commit"), r.entry.get("dirty")), r.short_id], None, None)
            for r in shown], fit=self._table_width(), shrink={2: 4}, keep=4)
        self._receipt_files = [r.file for r in shown]  # row index -> file (rows are not keyed)
        parts = [f"{len(m.receipts)} receipt(s)"]
        if self.contract:
            parts.append(f"holding contract {self.contract}")
        if self.failures_only:
            parts.append("failures only")
        if self.filter_text:
            parts.append(f"matching '{self.filter_text}'")
        note = ", ".join(parts)
        if len(rows) > len(shown):
            note += f"; newest {len(shown)} of {len(rows)} shown (/ to filter for older ones)"
        elif rows is not m.receipts:
            note += f"; {len(rows)} shown"
        if not m.receipts:
            note = f"no receipts for {m.key} yet: press c to run a check (or contracts check {m.key} --device cpu)"
        elif not rows and self.failures_only:
            note = (f"no failures: every one of the {len(m.receipts)} receipt(s)"
                    + (f" holding {self.contract}" if self.contract else "") + " passed and reads as written; "
                    "f shows them all")
        elif not rows:
            note += "; nothing matches (escape clears)"
        if marked:
            note += f"; marked {len(marked)} of 2" + (" (d compares them)" if len(marked) == 2 else "")
        self.query_one("#receipts-note", Static).update(Text(note, style="dim"))
        if cursor_key in self._receipt_files:
            t.move_cursor(row=self._receipt_files.index(cursor_key), animate=False)

    def _fill_spec(self, m: MethodModel) -> None:
        view = self.query_one("#spec-view", Static)
        if m.spec is None:
            view.update(Text("\n".join(m.problems) + f"\n\nfix it, then press r (contracts validate {m.spec_file})",
                             style="bold red"))
            return
        d = m.spec
        parts = [Text(f"{d['title']}  ({m.spec_file}, level {d['level']}, implementation {d['implementation']})",
                      style="bold")]
        for dep in d.get("depends_on") or []:  # its gate needs each one's fresh passing receipts (the Gate tab)
            name, why = (dep, "") if isinstance(dep, str) else (dep["method"], dep.get("why", ""))
            parts.append(fmt.clean(f"depends on {name}" + (f": {why}" if why else "")))
        t = Table(title="formulas (LaTeX source)", title_justify="left", expand=True, show_lines=True)
        t.add_column("id", no_wrap=True), t.add_column("LaTeX"), t.add_column("implements", no_wrap=True)
        for f in d["formulas"]:
            t.add_row(fmt.plain(f["id"]), fmt.clean(f["latex"]), fmt.plain(f["implements"]))
        parts.append(t)
        t = Table(title="assumptions", title_justify="left", expand=True, show_header=False)
        t.add_column("id", no_wrap=True), t.add_column("text")
        for a in d["assumptions"]:
            t.add_row(fmt.plain(a["id"]), fmt.clean(a["text"]))
        parts.append(t)
        b = d["budget"]
        parts.append(Text(f"budget: seeds {b['seeds']} (max {b['max_seeds']}), <= {b['max_updates_per_seed']} updates "
                          f"and {b['max_tokens_per_seed']} sampled tokens per seed, <= {b['max_wall_seconds']} s, "
                          f"downloads: {b['downloads']}"))
        t = Table(title="mutants (killed in the newest receipt that ran them)", title_justify="left", expand=True)
        t.add_column("mutant", no_wrap=True), t.add_column("killed"), t.add_column("breaks"), t.add_column("killed by")
        for mu in m.mutants:
            killed = {True: Text("✓ killed", style="green"), False: Text("✗ SURVIVED", style="bold red"),
                      None: Text("· not run", style="dim")}[mu.killed]
            t.add_row(fmt.plain(mu.id), killed, fmt.clean(mu.description), fmt.plain(", ".join(mu.killed_by)))
        parts.append(t)
        view.update(Group(*parts))

    def _fill_paper(self, m: MethodModel) -> None:
        view = self.query_one("#paper-view", Static)
        if m.spec is None:
            view.update("")
            return
        p, pr = m.spec["paper"], m.spec["paper_results"]
        head = Text()
        head.append("PAPER-REPORTED: not measured here\n", style="bold reverse yellow")
        head.append(f"{p['title']} (arXiv {p['arxiv']}{p['version']}, {p['institution']}, first public "
                    f"{p['first_public']}; code released: {'yes' if p['code_released'] else 'no'})\n")
        if pr.get("note"):
            head.append(pr["note"] + "\n", style="italic")
        t = Table(title="results the paper (or its page) reports", title_justify="left", expand=True)
        for col in ("id", "source", "model", "benchmark", "metric", "baseline", "method"):
            t.add_column(col)
        for r in pr["results"]:
            t.add_row(*map(fmt.plain, (
                r["id"], r["source"], r["model"], r["benchmark"], r["metric"],
                f"{r.get('baseline', '')} {fmt.num(r.get('baseline_value', '')) if 'baseline_value' in r else ''}"
                .strip(), fmt.num(r["value"]) if not isinstance(r["value"], list) else str(r["value"]))))
        view.update(Group(head, t))

    def _fill_gate(self, m: MethodModel) -> None:
        g = m.gate
        out = Text()
        out.append_text(fmt.gate(g.verdict))
        word = {"open": "promotable", "closed": "not promotable"}.get(g.verdict, "not decided yet")
        out.append(f"  ({word}; verdict from {g.source})\n\n")
        if g.unmet:
            out.append("unmet requirements, each with what would meet it:\n", style="bold")
            fmt.gate_unmet(out, g.unmet)
        for what in g.met:
            out.append("✓ ", style="green")
            out.append(what + "\n")
        fmt.gate_warnings(out, g.warnings)
        self.query_one("#gate-view", Static).update(out)

    # -- cursor helpers -------------------------------------------------------------

    @staticmethod
    def _cursor_key(t: VimTable) -> str | None:
        if not t.row_count:
            return None
        try:
            return t.coordinate_to_cell_key(t.cursor_coordinate).row_key.value
        except Exception:
            return None

    @staticmethod
    def _restore_cursor(t: VimTable, key: str | None) -> None:
        if key is None:
            return
        try:
            t.move_cursor(row=t.get_row_index(key), animate=False)
        except Exception:
            pass

    def selected_receipt(self) -> str | None:
        t = self.query_one("#receipts-table", VimTable)
        files = self._receipt_files
        return files[t.cursor_row] if t.row_count and t.cursor_row < len(files) else None

    # -- events -----------------------------------------------------------------

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted) -> None:
        data = event.node.data
        if not data or data[1] is None:
            return
        changed = data[1] != self.method or (data[2] if data[0] == "contract" else None) != self.contract
        self.method = data[1]
        self.contract = data[2] if data[0] == "contract" else None
        if changed:
            self.refresh_method()

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        data = event.node.data
        if data and data[0] == "contract":
            self.open_contract(data[1], data[2])
        elif data and data[0] == "problem":
            self.action_tab("spec")

    def open_contract(self, key: str, cid: str) -> None:
        """The receipt behind a contract's worst cell (else its newest), at that contract's rows."""
        m = self.app.model.method(key) if self.app.model else None
        row = next((c for c in m.contracts if c.id == cid), None) if m else None
        if row is None:
            return
        if row.open_file is None:
            self.notify(f"{row.id} has no receipt yet: press c to run contracts check {m.key}, or run contracts "
                        f"check {m.key} --only {row.id} --device cpu", severity="warning")
            return
        self.app.open_receipt(row.open_file, contract=row.id)

    def on_vim_table_opened(self, event: VimTable.Opened) -> None:
        m = self.current
        if m is None:
            return
        if event.table.id == "receipts-table":
            file = self.selected_receipt()
            if file:
                self.app.open_receipt(file, contract=self.contract)
        elif event.table.id == "contracts-table" and event.key:
            self.open_contract(m.key, event.key)

    def refill(self) -> None:
        self.refresh_tables()
        self.query_one("#right").border_subtitle = ", ".join(
            (["failures only"] if self.failures_only else []) + ([f"filter '{self.filter_text}'"]
                                                                 if self.filter_text else []))

    def refill_failures(self) -> None:
        if self.app.model is not None:
            self.show_model(self.app.model)

    def focus_filtered(self) -> None:
        self._focus_table()

    def refresh_tables(self) -> None:
        self._stale_tabs |= {"contracts", "receipts"}
        self._fill_tab(self.query_one(TabbedContent).active)

    def _focus_table(self) -> None:
        tab = self.query_one(TabbedContent).active
        if tab == "receipts":
            self.query_one("#receipts-table").focus()
        else:
            self.query_one("#contracts-table").focus()

    # -- actions -----------------------------------------------------------------

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        if tab in ("contracts", "receipts"):
            self.query_one(f"#{tab}-table").focus()

    def action_back(self) -> None:
        if self.filter_text or self.query_one("#filter").display:
            self.query_one("#filter", FilterBar).action_clear()
        elif self.contract:
            self.contract = None
            self._select_tree_line()
            self.refresh_method()

    def action_diff(self) -> None:
        if len(self.app.marked) == 2:
            self.app.compare_marked()
            return
        file = self.selected_receipt()
        if file is None:
            self.notify("select a receipt on the Receipts tab first", severity="warning")
            return
        self.app.open_diff(file)

    def action_mark(self) -> None:
        file = self.selected_receipt()
        if file is None:
            return
        self.app.toggle_mark(file)
        self.marks_changed()

    def marks_changed(self) -> None:
        """Redraw the receipt list's mark column (and note) after `m` here or on the receipt screen."""
        self._stale_tabs.add("receipts")
        self._fill_tab(self.query_one(TabbedContent).active)
        self.refresh_bindings()

    def action_check(self) -> None:
        if self.method:
            self.app.start_check(self.method)

    def action_promote(self) -> None:
        if self.method:
            self.app.change_promotion(self.method, "promote")

    def action_demote(self) -> None:
        if self.method:
            self.app.change_promotion(self.method, "demote")

    def show_run(self, cr) -> None:
        """The check panel: what runs, how far it got, how it ended."""
        if not self._ready:
            return
        panel = self.query_one("#run-panel", Static)
        panel.display = True
        t = Text()
        args = f"contracts check {cr.method} --device {cr.device}" + (f" --seeds {cr.seeds}" if cr.seeds else "")
        if cr.running:
            t.append("stopping " if cr.stopping else "running ", style="bold yellow")
        else:
            ok = cr.returncode == 0
            t.append("finished " if ok else "ended ", style="bold green" if ok else "bold red")
        t.append(args)
        p = cr.progress
        if p is not None:
            width = max(10, min(40, self._width - 40))
            filled = int(width * p.done / p.total) if p.total else 0
            t.append("\n")
            t.append("━" * filled, style="green")
            t.append("─" * (width - filled), style="dim")
            t.append(f" {p.done}/{p.total} {p.elapsed}  ")
            t.append(p.label, style="dim")
        elif cr.running:
            t.append("\nstarting (importing torch and the methods) ...", style="dim")
        if not cr.running:
            t.append("\n" + cr.summary(), style="" if cr.returncode == 0 else "bold")
            if cr.returncode not in (0, 1, 130) and cr.stderr_tail:
                t.append("\n" + cr.stderr_tail[-1], style="red")
        else:
            t.append("\nx stops it (what finished is kept)", style="dim")
        panel.update(t)
        self.refresh_bindings()

    def show_receipt_row(self, row) -> None:
        """Put the cursor on `row` on its method's Receipts tab (a check from `c` just wrote it)."""
        self.method, self.contract = row.folder, None
        self._select_tree_line()
        self.refresh_method()
        self._fill_tab("receipts")
        self.action_tab("receipts")
        if row.file in self._receipt_files:
            self.query_one("#receipts-table", VimTable).move_cursor(row=self._receipt_files.index(row.file),
                                                                    animate=False)

    def action_toggle_tree(self) -> None:
        left = self.query_one("#left")
        left.display = not left.display
        if not left.display and self.query_one(MethodTree).has_focus:
            self._focus_table()
        self._stale_tabs |= {"contracts", "receipts"}
        self._fill_tab(self.query_one(TabbedContent).active)

    def action_copy(self) -> None:
        focused = self.focused
        if isinstance(focused, VimTable) and focused.id == "receipts-table":
            file = self.selected_receipt()
            if file:
                self.app.copy_text(self.app.receipt_display_path(file))
            return
        if isinstance(focused, VimTable):
            value = focused.cursor_value()
            if value is not None:
                self.app.copy_text(fmt_plain(value))
            return
        if isinstance(focused, MethodTree) and self.method:
            self.app.copy_text(self.contract or self.method)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        # The footer shows only what applies here; asked before on_mount too, when nothing can be queried.
        if not self._ready:
            return True
        tab = self.query_one(TabbedContent).active
        if action == "diff":
            return (tab == "receipts" and bool(self._receipt_files)) or len(self.app.marked) == 2
        if action == "mark":
            return tab == "receipts" and bool(self._receipt_files)
        if action == "back":
            return bool(self.filter_text or self.contract)
        if action in ("promote", "demote"):
            m = self.current
            if tab != "gate" or m is None or m.spec is None:
                return False
            return (m.promotion == "promoted") == (action == "demote")
        if action == "check":
            return self.current is not None and self.current.spec is not None
        return True

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane is not None and event.pane.id:
            self._fill_tab(event.pane.id)
        self.refresh_bindings()


def _mark(file: str, marked: list[str]) -> Text:
    """'●1' / '●2' for a receipt marked with `m`."""
    return Text(f"●{marked.index(file) + 1}", style="bold cyan") if file in marked else Text("")


def fmt_plain(value) -> str:
    return value.plain if isinstance(value, Text) else str(value)
