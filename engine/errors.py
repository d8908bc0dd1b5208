"""Errors a user can cause, each one line, each with its documented exit code."""

from __future__ import annotations

# Exit codes (README "Exit codes"; consistent with Click, which exits 2 on a bad argument).
EXIT_OK = 0
EXIT_FAILED = 1  # a contract failed, a mutant survived, the gate is closed, verify found a problem
EXIT_USAGE = 2  # bad argument, bad spec, bad receipt, request over budget
EXIT_INTERNAL = 3  # a check raised: recorded in the receipt as `error`
EXIT_ENVIRONMENT = 4  # the machine cannot do what was asked (no CUDA, receipts not writable)
EXIT_NOTHING = 5  # nothing selected
EXIT_NOT_IMPLEMENTED = 6  # check --impl: a candidate function raised NotImplementedError (a stub not filled in yet)
EXIT_INTERRUPTED = 130


def one_line(text: str) -> str:
    """`text` with line breaks and other control characters escaped: an error message stays one line
    whatever a spec or an argument put into it."""
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in str(text))


class ContractsError(Exception):
    """Base for errors shown to the user as one line, never as a traceback."""

    exit_code = EXIT_USAGE

    def line(self) -> str:
        return one_line(str(self))


class UsageError(ContractsError):
    exit_code = EXIT_USAGE


class LookupFailure(UsageError):
    """A name that is not registered; the message lists the valid names."""


class SpecError(UsageError):
    """A spec problem at file:line:col, with the JSON path and how to fix it."""

    def __init__(self, file: str, line: int | None, col: int | None, path: str, message: str, fix: str = ""):
        self.file, self.lineno, self.col, self.path, self.message, self.fix = file, line, col, path, message, fix
        super().__init__(self.line())

    def line(self) -> str:
        where = self.file
        if self.lineno is not None:
            where += f":{self.lineno}:{self.col or 1}"
        text = f"{where} {self.path} {self.message}"
        if self.fix:
            text += f" (fix: {self.fix})"
        return one_line(text)

    def as_dict(self) -> dict:
        return {
            "file": self.file,
            "line": self.lineno,
            "col": self.col,
            "path": self.path,
            "message": self.message,
            "fix": self.fix,
        }


class BudgetError(UsageError):
    """A request over the spec's budget, refused before anything runs."""


class EnvironmentProblem(ContractsError):
    exit_code = EXIT_ENVIRONMENT


class NothingSelected(ContractsError):
    exit_code = EXIT_NOTHING
