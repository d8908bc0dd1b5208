"""`contracts tui`: the Textual app and the one factory that both the CLI and the tests use."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

from textual import work
from textual.app import App
from textual.binding import Binding

from engine.store.index import Freshness, ReceiptIndex
from engine.spec.loader import display_path
from tui.commands import ContractsCommands
from tui.data import (
    GateView,
    Model,
    build_model,
    gate_flags,
    gate_for,
    gate_views_elsewhere,
    previous_full_receipt,
)

DEFAULT_POLL_SECONDS = 3.0
GATE_PROCESS_THRESHOLD = 1000  # receipts; above this the gate runs in another process


class ContractsApp(App):
    """Browse methods, contracts, receipts and gate verdicts."""

    CSS_PATH = "app.tcss"
    TITLE = "contracts"
    COMMANDS = {ContractsCommands}  # it lists Textual's own commands too, after the app's
    BINDINGS = [
        Binding("q", "quit", "Quit", id="quit"),
        Binding("question_mark", "help", "Help", id="help"),
        Binding("r", "reload", "Reload", id="reload"),
        Binding("x", "stop_check", "Stop check", id="check.stop"),
        Binding("C", "conformance", "Conformance", id="conformance"),
    ]

    def __init__(self, specs_dir: Path, receipts_dir: Path, root: Path,
                 poll_seconds: float | None = DEFAULT_POLL_SECONDS,
                 keymap: dict[str, str] | None = None, persist_index: bool = True, trust: Path | None = None) -> None:
        super().__init__()
        self.specs_dir, self.receipts_dir, self.root = Path(specs_dir), Path(receipts_dir), Path(root)
        self.trust = Path(trust) if trust is not None else None  # the trust policy file the Gate tab reads
        self.poll_seconds = poll_seconds
        self.model: Model | None = None
        self.generation = 0  # models applied so far; tests and the benchmark wait on it
        self.index = ReceiptIndex(self.receipts_dir, persist=persist_index)
        self.freshness = Freshness(self.root, self.specs_dir)
        self._build_lock = threading.Lock()  # one index refresh at a time: `r` and the poll may overlap
        self._signature: tuple | None = None
        self.flags = gate_flags(self.receipts_dir, self.specs_dir, self.root)  # for commands we suggest or copy
        self._receipt_screen = None  # the one ReceiptScreen, installed on first use
        self.marked: list[str] = []  # receipts marked with `m` (two at most), compared by `d`
        self.check_run = None  # the `contracts check` child started with `c` (tui.checkrun.CheckRun)
        self._select_receipt_id: str | None = None  # a finished check's receipt, selected once it is loaded
        self._quit_after_check = False
        if keymap:
            self.set_keymap(keymap)

    def notify(self, message, *, title: str = "", severity="information", timeout: float | None = None,
               markup: bool = True) -> None:
        """Every notification is literal text: the messages name receipts, contracts and errors, which are
        data (never Textual markup, never raw control characters), whatever a caller passes as `markup`."""
        from engine.text import term_safe

        super().notify(term_safe(message), title=term_safe(title), severity=severity, timeout=timeout, markup=False)

    def ui(self, callback, *args, **kwargs):
        """Run `callback` on the UI thread from a worker; nothing once the app is shutting down.

        call_from_thread raises when the app has stopped, and a worker finishing
        a moment after `q` must not turn a clean exit into an error.
        """
        if not self.is_running:
            return None
        try:
            return self.call_from_thread(callback, *args, **kwargs)
        except RuntimeError:
            if self.is_running:
                raise  # the callback's own error, not a shutdown
            return None

    def get_default_screen(self):
        from tui.screens.main import MainScreen

        return MainScreen()

    def on_mount(self) -> None:
        self.sub_title = display_path(self.receipts_dir, self.root)
        self.load_model()
        if self.poll_seconds:
            self.set_interval(self.poll_seconds, self.poll)

    # -- loading -----------------------------------------------------------------------

    @work(thread=True, group="load", description="load specs and receipt index")
    def load_model(self, announce: bool = False) -> None:
        """Validate specs and refresh the index off the UI thread, then redraw."""
        with self._build_lock:
            self._signature = self._store_signature()
            # The index of a big store is a million small objects; a full GC pass over them mid-build costs
            # a few hundred ms, and would repeat on every later pass unless they are frozen (apply_model).
            gc_was_on = gc.isenabled()
            gc.disable()
            try:
                model = build_model(self.specs_dir, self.receipts_dir, self.root, self.index, self.freshness,
                                    progress=self._progress)
            except Exception as err:  # a bug of ours: say so, keep the app alive
                self.ui(self.notify, f"could not load: {type(err).__name__}: {err}",
                                      severity="error", timeout=10)
                return
            finally:
                if gc_was_on:
                    gc.enable()
        self.ui(self.apply_model, model, announce)

    def _progress(self, done: int, total: int) -> None:
        if total > 200:
            self.ui(self._show_progress, done, total)

    def _show_progress(self, done: int, total: int) -> None:
        from tui.screens.main import MainScreen

        for screen in self.screen_stack:
            if isinstance(screen, MainScreen) and self.model is None:
                screen.query_one("#status").update(f"indexing receipts {done}/{total} (only new files are read; "
                                                   "the next start reads the index)")

    def apply_model(self, model: Model, announce: bool = False) -> None:
        before = self.model.receipts_total if self.model else None
        self.model = model
        self.generation += 1
        self.sub_title = display_path(self.receipts_dir, self.root)
        from tui.screens.main import MainScreen

        for screen in self.screen_stack:
            if isinstance(screen, MainScreen):
                screen.show_model(model)
        gc.freeze()  # long-lived: keep the cyclic GC from walking the index on every collection
        self.refine_gates(model)
        if self._select_receipt_id:
            self._show_new_receipt(model)
        if announce or (before is not None and before != model.receipts_total):
            added = model.receipts_total - (before or 0)
            self.notify(f"reloaded: {model.receipts_total} receipt(s)"
                        + (f", {added:+d} since last time" if before is not None and added else ""), timeout=3)

    # description: otherwise @work builds one from repr(model), 10,000 rows long (0.3 s on a big store)
    @work(thread=True, group="gate", exclusive=True, description="gate verdicts")
    def refine_gates(self, model: Model) -> None:
        """engine.gate.verdict's verdict per method, after the first paint, from the files as `contracts gate`
        derives it (tui.data.gate_for): never from the index or the validation cache.

        The gate reads every receipt file (seconds for a big store), so on a big
        store it runs in another process: this thread only waits, and the UI
        keeps the GIL. Small stores are evaluated here, which is quicker than a spawn.
        """
        units = [(m.key, m.method_key, m.unit) for m in model.methods if m.spec_obj is not None]
        keys = [u[0] for u in units]
        views: dict = {}
        if model.receipts_total > GATE_PROCESS_THRESHOLD and self.index.persist:
            try:
                views = self._gates_elsewhere(units)
            except Exception:  # no worker process here: evaluate in this thread instead
                views = {}
        for m in model.methods:
            if m.key not in keys or model is not self.model:
                continue
            view = views.get(m.key)
            if view is None:
                try:
                    view = gate_for(m.method_key, self.receipts_dir, self.root, self.specs_dir, self.trust,
                                    unit=m.unit)
                except Exception as err:  # a bug here must not take the browser down: say so on the Gate tab
                    view = GateView("unknown", [(f"engine.gate raised {type(err).__name__}: {err}",
                                                 f"contracts gate {m.key}")], "engine.gate (failed)")
            self.ui(self._apply_gate, model, m.key, view)

    def _gates_elsewhere(self, keys: list) -> dict:
        return gate_views_elsewhere(keys, self.specs_dir, self.receipts_dir, self.root, self.trust)

    def _apply_gate(self, model: Model, key: str, view) -> None:
        if model is not self.model:
            return  # a newer model has been drawn since
        model.method(key).gate = view
        from tui.screens.main import MainScreen

        for screen in self.screen_stack:
            if isinstance(screen, MainScreen):
                screen.update_gate(key)

    def _store_signature(self) -> tuple:
        """Cheap change detector: mtimes of the store, its method folders, the specs folder and files."""
        sig = []
        for base in (self.receipts_dir, self.specs_dir):
            try:
                # Not the folders' own mtimes: the index file written into the store would count as a change.
                with os.scandir(base) as it:
                    entries = [e for e in it if not e.name.startswith(".")]
                for e in entries:
                    if e.is_dir() or e.name.endswith(".yaml"):
                        st = e.stat()
                        sig.append((e.name, st.st_mtime_ns, st.st_size))
            except OSError:
                sig.append((str(base), None))
        return tuple(sorted(sig, key=str))

    @work(thread=True, group="poll", exclusive=True, description="poll the store")
    def poll(self) -> None:
        """A new receipt or an edited spec shows up by itself within `poll_seconds`."""
        if self._build_lock.locked():
            return
        if self._store_signature() != self._signature:
            self.ui(self.load_model)

    # -- navigation used by screens and the palette ------------------------------------------

    def receipt_display_path(self, file: str) -> str:
        return display_path(self.receipts_dir / file, self.root)

    def open_receipt(self, file: str, contract: str | None = None) -> None:
        """Show a receipt on the one receipt screen (installed once, refilled for each receipt)."""
        from tui.screens.receipt import ReceiptScreen

        row = self.model.receipt(file) if self.model else None
        if row is None:
            self.notify(f"no receipt {file} in the index (press r)", severity="warning")
            return
        screen = self._receipt_screen
        if screen is None:
            screen = self._receipt_screen = ReceiptScreen(row, contract)
            self.install_screen(screen, name="receipt")
            self.push_screen("receipt")  # on_mount shows the row
            return
        while screen in self.screen_stack and self.screen is not screen:
            self.pop_screen()  # e.g. a diff opened from it: go back to it
        if self.screen is not screen:
            self.push_screen("receipt")
        screen.show(row, contract)

    def open_diff(self, file: str) -> None:
        """`d`: the two marked receipts if two are marked, else `file` against the previous full receipt of its
        method on the same device (a partial run is never the default baseline)."""
        if len(self.marked) == 2:
            self.compare_marked()
            return
        row = self.model.receipt(file) if self.model else None
        prev = previous_full_receipt(self.model, file) if row else None
        if prev is None:
            self.notify(f"no earlier full receipt of {file.split('/', 1)[0]} on {row.device if row else '?'} to "
                        "compare with; mark any two receipts with m, then press d", severity="warning")
            return
        self._push_diff(prev, row, f"previous full receipt on {row.device}")

    def compare_marked(self) -> None:
        rows = [self.model.receipt(f) if self.model else None for f in self.marked]
        if len(rows) != 2 or None in rows:
            self.notify("mark two receipts with m first (a marked receipt is gone: press r)", severity="warning")
            return
        old, new = sorted(rows, key=lambda r: r.created_at or "")  # older first, whatever the marking order
        self._push_diff(old, new, "the two marked receipts")

    def _push_diff(self, old, new, why: str) -> None:
        from tui.screens.diff import DiffScreen

        self.push_screen(DiffScreen(old, new, why))

    def toggle_mark(self, file: str) -> None:
        """Mark a receipt for `d` (two at most: a third mark drops the oldest one); unmark it if marked."""
        if file in self.marked:
            self.marked.remove(file)
        else:
            self.marked = (self.marked + [file])[-2:]
        n = len(self.marked)
        self.notify(f"{n} receipt(s) marked" + ("; d compares them" if n == 2 else "; mark one more to compare"),
                    timeout=3)

    def select_method(self, key: str) -> None:
        from tui.screens.main import MainScreen

        while not isinstance(self.screen, MainScreen) and len(self.screen_stack) > 1:
            self.pop_screen()
        main = self.screen
        if isinstance(main, MainScreen):
            main.method, main.contract = key, None
            main._select_tree_line()
            main.refresh_method()

    def toggle_failures(self) -> None:
        action = getattr(self.screen, "action_failures", None)
        if action is not None:
            action()

    def toggle_tree(self) -> None:
        action = getattr(self.screen, "action_toggle_tree", None)
        if action is not None:
            action()

    def copy_text(self, text: str) -> None:
        """Copy to the terminal clipboard (OSC 52 works over SSH) and say what was copied."""
        self.copy_to_clipboard(text)
        self.notify(f"copied: {text if len(text) <= 80 else text[:77] + '...'}", timeout=3)

    # -- `c`: a check in a child process; `x` stops it ---------------------------------------

    def start_check(self, key: str) -> None:
        """Ask for device and seeds, then run `contracts check KEY` as a child (never in this process)."""
        from tui.screens.forms import CheckForm

        if self.check_run is not None and self.check_run.running:
            self.notify(f"a check of {self.check_run.method} is running (x stops it)", severity="warning")
            return
        m = self.model.method(key) if self.model else None
        if m is None or m.spec is None:
            self.notify(f"{key}: no readable spec to check", severity="warning")
            return
        if m.candidate:  # its target is a file of the user's: checked from a shell, in the sandbox, by its path
            self.notify(f"{key} is an --impl candidate: run contracts check {m.method_key} --impl TARGET from a shell",
                        severity="warning")
            return

        def chosen(values) -> None:
            if values is not None:
                self.run_check(key, *values)

        needed = list(m.spec.get("promotion", {}).get("requires", {}).get("devices") or [])
        self.push_screen(CheckForm(key, list(m.spec["budget"]["seeds"]), needed), chosen)

    def run_check(self, key: str, device: str, seeds: str, argv: list[str] | None = None) -> None:
        """Start the child now (`argv` replaces the command line, for tests)."""
        from tui.checkrun import CheckRun, check_argv

        cr = CheckRun(key, device, seeds, argv or check_argv(key, device, seeds, self.specs_dir, self.receipts_dir))
        self.check_run = cr
        self._follow_check(cr)

    @work(exclusive=True, group="check", description="contracts check (child process)")
    async def _follow_check(self, cr) -> None:
        from tui import checkrun

        self._show_run(cr)
        try:
            await checkrun.run(cr, self.root, self._show_run)
        except OSError as err:
            cr.returncode = -1
            cr.stderr_tail.append(f"could not start contracts check: {err}")
        self._check_finished(cr)

    def _show_run(self, cr) -> None:
        from tui.screens.main import MainScreen

        for screen in self.screen_stack:
            if isinstance(screen, MainScreen):
                screen.show_run(cr)
        self.screen.refresh_bindings()

    def _check_finished(self, cr) -> None:
        self._show_run(cr)
        runs = cr.receipts()
        self.notify(f"contracts check {cr.method}: {cr.summary()}",
                    severity="information" if cr.returncode == 0 else "warning", timeout=8)
        if runs and runs[-1].get("receipt_id"):
            self._select_receipt_id = runs[-1]["receipt_id"]
        self.load_model()  # the new receipt appears (the poll would find it too, a little later)
        if self._quit_after_check:
            self.exit()

    def _show_new_receipt(self, model) -> None:
        """Select the receipt a finished check wrote, on its method's Receipts tab."""
        from tui.screens.main import MainScreen

        rid, self._select_receipt_id = self._select_receipt_id, None
        row = next((r for m in model.methods for r in m.receipts if r.receipt_id == rid), None)
        if row is None:
            return
        for screen in self.screen_stack:
            if isinstance(screen, MainScreen):
                screen.show_receipt_row(row)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "stop_check":
            return self.check_run is not None and self.check_run.running
        return True

    def action_stop_check(self) -> None:
        from rich.text import Text

        from tui.screens.forms import ConfirmScreen

        cr = self.check_run
        if cr is None or not cr.running:
            return

        def answered(yes) -> None:
            if yes:
                self._stop_check(cr)

        self.push_screen(ConfirmScreen(Text(f"Stop the check of {cr.method} on {cr.device}?\nWhat finished so far "
                                            "is kept in an interrupted receipt (coverage: partial).", style="bold"),
                                       "stop check"), answered)

    def _stop_check(self, cr) -> None:
        from tui import checkrun

        checkrun.stop(cr)
        self.set_timer(checkrun.STOP_GRACE_S, lambda: checkrun.force_stop(cr))
        self._show_run(cr)

    async def action_quit(self) -> None:
        """Quit; with a check running, ask first and let it write its interrupted receipt."""
        from rich.text import Text

        from tui.screens.forms import ConfirmScreen

        cr = self.check_run
        if cr is None or not cr.running:
            self.exit()
            return

        def answered(yes) -> None:
            if yes:
                self._quit_after_check = True
                self._stop_check(cr)
                self.notify("stopping the check; quitting once its receipt is written", timeout=5)

        self.push_screen(ConfirmScreen(Text(f"A check of {cr.method} is running. Stop it and quit?\nWhat "
                                            "finished is kept in an interrupted receipt.", style="bold"), "quit"),
                         answered)

    # -- `p` on the Gate tab: promote / demote through `contracts promote|demote` ----------------

    def change_promotion(self, key: str, action: str) -> None:
        """Read the gate from the files (never the index or a cache), then refuse with its reasons or ask why."""
        m = self.model.method(key) if self.model else None
        if m is not None and m.candidate:  # promotion is the spec's, earned by its registered implementation
            self.notify(f"{key} is an --impl candidate: promotion belongs to the registered implementation",
                        severity="warning")
            return
        self._gate_then_ask(key, action)

    @work(thread=True, group="promote", exclusive=True, description="gate verdict for a promotion")
    def _gate_then_ask(self, key: str, action: str) -> None:
        try:
            view = gate_for(key, self.receipts_dir, self.root, self.specs_dir, self.trust)
        except Exception as err:  # a bug here must not take the browser down
            self.ui(self.notify, f"engine.gate raised {type(err).__name__}: {err}", severity="error")
            return
        self.ui(self._ask_promotion, key, action, view)

    def _ask_promotion(self, key: str, action: str, view) -> None:
        from tui import fmt
        from tui.screens.forms import MessageScreen, ReasonForm

        if self.model is not None and self.model.method(key) is not None:
            self._apply_gate(self.model, key, view)  # what was just read is what the tab shows
        m = self.model.method(key) if self.model else None
        if m is None:
            return
        if action == "promote" and view.verdict != "open":
            self.push_screen(MessageScreen(refusal_text(key, view), "not promoted"))
            return
        new = "promoted" if action == "promote" else "not-promoted"

        def given(reason) -> None:
            if reason:
                self._run_promotion(key, action, reason)

        self.push_screen(ReasonForm(action, key, m.promotion, new, fmt.gate(view.verdict)), given)

    def promotion_argv(self, key: str, action: str, reason: str) -> list[str]:
        import sys

        argv = [sys.executable, "-m", "engine.cli", action, key, "--reason", reason, "--json",
                "--specs", str(self.specs_dir.resolve()), "--receipts", str(self.receipts_dir.resolve())]
        if self.trust is not None:
            argv += ["--trust", str(self.trust.resolve())]
        elif action == "promote":  # a person confirmed it with a reason; the ledger records it as unsigned
            argv.append("--allow-unsigned")
        return argv

    @work(exclusive=True, group="promote", description="contracts promote/demote (child process)")
    async def _run_promotion(self, key: str, action: str, reason: str) -> None:
        """`contracts promote|demote KEY --reason R --json`: it holds the promotion lock, reads the gate from the
        files again and writes the ledger; the TUI only shows what it says."""
        import asyncio
        import json

        from tui.data import gate_view
        from tui.screens.forms import MessageScreen

        proc = await asyncio.create_subprocess_exec(*self.promotion_argv(key, action, reason), cwd=str(self.root),
                                                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        try:
            result = json.loads(out.decode("utf-8", errors="replace"))
        except ValueError:
            result = None
        last = (err.decode("utf-8", errors="replace").strip().splitlines() or ["(no message)"])[-1]
        if proc.returncode == 0 and isinstance(result, dict):
            entry = result.get("ledger_entry") or {}
            self.notify(f"{key}: promotion.state {result.get('old_state')} -> {result.get('new_state')}, ledger "
                        f"entry {entry.get('seq')}" if result.get("changed") else
                        f"{key} is already {result.get('new_state')}: nothing changed", timeout=6)
        elif proc.returncode == 1 and isinstance(result, dict) and isinstance(result.get("gate"), dict):
            self.push_screen(MessageScreen(refusal_text(key, gate_view(result["gate"], f"contracts {action}")),
                                           "not promoted"))
        else:
            self.notify(f"contracts {action} {key} exited {proc.returncode}: {last}", severity="error", timeout=10)
        self.action_reload()

    # -- actions ---------------------------------------------------------------------------

    def action_reload(self) -> None:
        self.freshness.forget()
        self.load_model(announce=True)

    def action_conformance(self) -> None:
        """The framework zoo's conformance matrix, read from this store (tui/screens/conformance.py)."""
        from tui.screens.conformance import ConformanceScreen

        if not isinstance(self.screen, ConformanceScreen):
            self.push_screen(ConformanceScreen())

    def action_help(self) -> None:
        from tui.screens.help import HelpScreen

        self.push_screen(HelpScreen(binding_classes()))

    async def wait_loaded(self, generation: int = 1, timeout: float = 60.0) -> None:
        """Until `generation` models have been applied (for tests and the benchmark); raises, never hangs."""
        import asyncio
        import time

        deadline = time.monotonic() + timeout
        while self.generation < generation:
            if self._exit_renderables or self.return_code is not None:
                raise RuntimeError("the app stopped before its model was drawn")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no model drawn within {timeout} s (did loading fail? see notifications)")
            await asyncio.sleep(0.01)


def refusal_text(key: str, view: GateView):
    """Why the gate refuses: every unmet requirement with what would meet it."""
    from rich.text import Text

    from tui import fmt

    out = Text()
    out.append(f"{key} cannot be promoted: the gate is closed (verdict from {view.source}, read from the "
               "files just now)\n\n", style="bold red")
    fmt.gate_unmet(out, view.unmet)
    fmt.gate_warnings(out, view.warnings)
    out.append("\nescape closes this", style="dim")
    return out


def binding_ids() -> set[str]:
    """Every binding id a user may remap with --keys."""
    ids = set()
    for cls in binding_classes():
        ids.update(b.id for b in cls.BINDINGS if getattr(b, "id", None))
    return ids


def binding_classes() -> list[type]:
    """Every class of ours that declares bindings (the keymap, the help screen and a test walk them)."""
    from tui.screens.conformance import ConformanceScreen
    from tui.screens.diff import DiffScreen
    from tui.screens.forms import CheckForm, ConfirmScreen, MessageScreen, ReasonForm
    from tui.screens.help import HelpScreen
    from tui.screens.main import MainScreen
    from tui.screens.receipt import ReceiptScreen, ResultScreen
    from tui.widgets import FilterBar, MethodTree, VimTable

    return [ContractsApp, MainScreen, ReceiptScreen, ResultScreen, DiffScreen, HelpScreen, CheckForm, ConfirmScreen,
            ReasonForm, MessageScreen, ConformanceScreen, VimTable, MethodTree, FilterBar]


def parse_keys(text: str | None) -> dict[str, str]:
    """'copy=c,failures=x' -> {'copy': 'c', 'failures': 'x'}; raises ValueError on a malformed pair."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        bid, sep, key = part.partition("=")
        if not sep or not bid.strip() or not key.strip():
            raise ValueError(f"{part!r} is not BINDING_ID=KEY (e.g. copy=c)")
        out[bid.strip()] = key.strip()
    return out


def create_app(specs_dir: Path | None = None, receipts_dir: Path | None = None, root: Path | None = None,
               poll_seconds: float | None = DEFAULT_POLL_SECONDS, keymap: dict[str, str] | None = None,
               persist_index: bool = True, trust: Path | None = None) -> ContractsApp:
    """The app `contracts tui` runs and the tests drive (defaults: the project's specs/ and receipts/)."""
    from engine.paths import default_receipts_dir, default_specs_dir, project_root

    return ContractsApp(specs_dir=specs_dir or default_specs_dir(), receipts_dir=receipts_dir or default_receipts_dir(),
                        root=root or project_root(), poll_seconds=poll_seconds, keymap=keymap,
                        persist_index=persist_index, trust=trust)
