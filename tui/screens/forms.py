"""Small dialogs: the check form (`c`), confirmations, the promotion reason prompt, the gate's refusal."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from tui.checkrun import check_form_problems
from tui.widgets import DataStatic, KeyBar


class CheckForm(ModalScreen):
    """Device and seeds for `contracts check METHOD`; dismisses with (device, seeds) or None."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="form.cancel"),
        Binding("ctrl+r", "submit", "Run", id="form.submit"),
    ]

    def __init__(self, method: str, seeds: list[int], devices: list[str]) -> None:
        super().__init__(id="check-form")
        self.method, self.seeds, self.devices = method, seeds, devices

    def compose(self) -> ComposeResult:
        with Vertical(id="form-box"):
            yield DataStatic(Text(f"run contracts check {self.method}", style="bold"), id="form-title")
            yield Label("device (cpu, cuda or cuda:N" + (f"; the gate needs {', '.join(self.devices)})"
                                                         if self.devices else ")"))
            yield Input(value="cpu", id="form-device")
            yield Label("seeds (comma-separated, or fresh: drawn at run time; the spec's budget by default)")
            yield Input(value=",".join(map(str, self.seeds)), id="form-seeds")
            yield DataStatic(Text("enter: next field, then run; escape cancels. The receipt appears when it finishes.",
                                  style="dim"), id="form-errors")
            yield KeyBar(classes="in-box")

    def on_mount(self) -> None:
        self.query_one("#form-box").border_title = "check"
        self.query_one("#form-device", Input).focus()

    def values(self) -> tuple[str, str]:
        return self.query_one("#form-device", Input).value.strip(), self.query_one("#form-seeds", Input).value.strip()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "form-device":
            self.query_one("#form-seeds", Input).focus()
        else:
            self.action_submit()

    def action_submit(self) -> None:
        device, seeds = self.values()
        problems = check_form_problems(device, seeds)
        if problems:
            self.query_one("#form-errors", DataStatic).update(Text("\n".join(problems), style="bold red"))
            return
        self.dismiss((device, seeds))

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen):
    """A yes/no question; dismisses with True or False."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]

    def __init__(self, question: Text | str, title: str = "confirm") -> None:
        super().__init__(id="confirm")
        self.question, self.title_text = question, title

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield DataStatic(self.question, id="confirm-question")
            yield KeyBar(classes="in-box")

    def on_mount(self) -> None:
        self.query_one("#confirm-box").border_title = self.title_text

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ReasonForm(ModalScreen):
    """`p` on the Gate tab: the change, the gate's verdict just read from the files, and why (required);
    dismisses with the reason or None."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="form.cancel"),
                Binding("enter", "submit", "Confirm", id="form.confirm")]

    def __init__(self, action: str, method: str, old: str, new: str, verdict: Text) -> None:
        super().__init__(id="reason-form")
        self.action, self.method, self.old, self.new, self.verdict = action, method, old, new, verdict

    def compose(self) -> ComposeResult:
        with Vertical(id="form-box"):
            head = Text(f"{self.action} {self.method}: promotion.state {self.old} -> {self.new}\n", style="bold")
            head.append_text(self.verdict)
            yield DataStatic(head, id="form-title")
            yield Label("reason (recorded in the ledger; required)")
            yield Input(placeholder="e.g. fresh CUDA receipts and a formal comparison", id="form-reason")
            yield DataStatic(Text(f"enter {self.action}s it (contracts {self.action} runs and checks the gate "
                                  "again); escape cancels", style="dim"), id="form-errors")
            yield KeyBar(classes="in-box")

    def on_mount(self) -> None:
        self.query_one("#form-box").border_title = self.action
        self.query_one("#form-reason", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_submit()

    def action_submit(self) -> None:
        reason = self.query_one("#form-reason", Input).value.strip()
        if not reason:
            self.query_one("#form-errors", DataStatic).update(Text("say why: the ledger records a reason for "
                                                                   "every change", style="bold red"))
            return
        self.dismiss(reason)

    def action_cancel(self) -> None:
        self.dismiss(None)


class MessageScreen(ModalScreen):
    """Text to read (the gate's refusal, a command's outcome); any of escape, enter or q closes it."""

    BINDINGS = [Binding("escape,enter,q", "close", "Close", id="message.close")]

    def __init__(self, text: Text, title: str) -> None:
        super().__init__(id="message")
        self.text, self.title_text = text, title

    def compose(self) -> ComposeResult:
        with Vertical(id="message-box"):
            with VerticalScroll(id="message-scroll"):
                yield DataStatic(self.text, id="message-text")
            yield KeyBar(classes="in-box")

    def on_mount(self) -> None:
        self.query_one("#message-box").border_title = self.title_text

    def action_close(self) -> None:
        self.dismiss(None)
