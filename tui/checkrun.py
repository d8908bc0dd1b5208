"""`c`: run `contracts check` in a child process and follow its progress; the TUI itself never imports torch.

The child is the real command (`python -m engine.cli check METHOD --device D
--seeds S --json`), so what it writes is exactly what the CLI would write. Its
progress bar (engine/cli/check.py, Rich on stderr) is drawn as a terminal
would get it (TTY_COMPATIBLE/TTY_INTERACTIVE: Rich draws a live bar into a
pipe); each frame is `DESCRIPTION BAR DONE/TOTAL H:MM:SS`, which `parse_progress`
reads back. Stopping sends SIGINT, which the command treats as Ctrl-C: the
cells finished so far are kept in an `interrupted` receipt and it exits 130.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import EXIT_INTERRUPTED

CSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
FRAME = re.compile(r"(?P<done>\d+)/(?P<total>\d+)\s+(?P<elapsed>\d+:\d{2}:\d{2})\s*$")
BAR_GLYPHS = "━╸╺╾╼─ "
DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")
SEEDS = re.compile(r"^\s*\d+(\s*,\s*\d+)*\s*$")
FRESH = re.compile(r"^(fresh|random)(:[1-9][0-9]{0,2})?$")  # check --seeds fresh: drawn from the OS at run time
STOP_GRACE_S = 20.0  # after SIGINT, how long the child may take to write its receipt before SIGTERM
EXIT_WORDS = {0: "every contract held", 1: "a contract failed or a mutant survived", 2: "usage error or bad spec",
              3: "internal error (recorded in the receipt)", 4: "this machine cannot do it",
              5: "nothing selected", EXIT_INTERRUPTED: "stopped; what finished is kept in the receipt"}


@dataclass
class Progress:
    """One frame of the child's progress bar."""

    done: int
    total: int
    elapsed: str
    label: str  # "tapo-trajectory: clip_schedule seed 42 float64 passed"


def parse_progress(chunk: str) -> Progress | None:
    """The newest complete frame in `chunk` (text read from the child's stderr), or None."""
    text = CSI.sub("", chunk)
    for line in reversed(re.split(r"[\r\n]", text)):
        m = FRAME.search(line)
        if m is None:
            continue
        label = line[:m.start()].rstrip(BAR_GLYPHS).strip()
        return Progress(int(m["done"]), int(m["total"]), m["elapsed"], label)
    return None


def check_form_problems(device: str, seeds: str) -> list[str]:
    """What is wrong with the form's fields, each as one line (empty: it may run)."""
    out = []
    if not DEVICE.match(device.strip()):
        out.append(f"device {device.strip()!r}: give cpu, cuda or cuda:N")
    if seeds.strip() and not SEEDS.match(seeds) and not FRESH.match(seeds.strip()):
        out.append(f"seeds {seeds.strip()!r}: give comma-separated integers, e.g. 42,43,44, or fresh (drawn at run "
                   "time, recorded in the receipt)")
    return out


@dataclass
class CheckRun:
    """One `contracts check` child: its command line, what it said, how it ended."""

    method: str
    device: str
    seeds: str
    argv: list[str]
    progress: Progress | None = None
    stderr_tail: list[str] = field(default_factory=list)  # the last lines it printed that are not progress frames
    stdout: str = ""
    returncode: int | None = None
    stopping: bool = False
    proc: object = None  # the asyncio subprocess while it runs

    @property
    def running(self) -> bool:
        return self.proc is not None and self.returncode is None

    def receipts(self) -> list[dict]:
        """The receipts the child reported (`--json` runs), [] when it wrote none."""
        try:
            return [r for r in json.loads(self.stdout).get("runs") or [] if isinstance(r, dict)]
        except (ValueError, AttributeError):
            return []

    def summary(self) -> str:
        """One line: how it ended, in the CLI's exit-code words."""
        if self.returncode is None:
            return "running"
        runs = self.receipts()
        word = EXIT_WORDS.get(self.returncode, "ended")
        got = f"; receipt {runs[-1].get('receipt_id', '?')[:12]} ({runs[-1].get('status')})" if runs else \
            "; no receipt written"
        return f"exit {self.returncode}: {word}{got}"


def check_argv(method: str, device: str, seeds: str, specs_dir: Path, receipts_dir: Path) -> list[str]:
    """`contracts check` for this method, on the app's own folders, with machine-readable output."""
    argv = [sys.executable, "-m", "engine.cli", "check", method, "--device", device.strip(), "--json",
            "--specs", str(Path(specs_dir).resolve()), "--receipts", str(Path(receipts_dir).resolve())]
    if seeds.strip():
        argv += ["--seeds", ",".join(s.strip() for s in seeds.split(","))]
    return argv


def child_env() -> dict[str, str]:
    """The environment of the child: ours, with Rich told to draw its live bar into the pipe."""
    env = dict(os.environ)
    env.update(TTY_COMPATIBLE="1", TTY_INTERACTIVE="1", COLUMNS="240", NO_COLOR="1")
    env.pop("FORCE_COLOR", None)
    return env


async def run(cr: CheckRun, cwd: Path, on_update) -> None:
    """Start the child, feed `on_update(cr)` as it progresses, return when it has exited."""
    import asyncio

    cr.proc = await asyncio.create_subprocess_exec(*cr.argv, cwd=str(cwd), env=child_env(),
                                                   stdin=asyncio.subprocess.DEVNULL,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def read_stdout() -> None:
        cr.stdout = (await cr.proc.stdout.read()).decode("utf-8", errors="replace")

    async def read_stderr() -> None:
        pending = ""
        while True:
            chunk = await cr.proc.stderr.read(8192)
            if not chunk:
                break
            pending += chunk.decode("utf-8", errors="replace")
            frame = parse_progress(pending)
            if frame is not None:
                cr.progress = frame
            # Keep the last lines that are messages (errors, warnings), not bar frames.
            *lines, pending = re.split(r"\n", pending)
            for line in lines:
                clean = CSI.sub("", line).split("\r")[-1].strip()
                if clean and FRAME.search(clean) is None:
                    cr.stderr_tail = (cr.stderr_tail + [clean])[-6:]
            pending = pending[-4096:]
            on_update(cr)
        clean = CSI.sub("", pending).split("\r")[-1].strip()
        if clean and FRAME.search(clean) is None:
            cr.stderr_tail = (cr.stderr_tail + [clean])[-6:]

    await asyncio.gather(read_stdout(), read_stderr())
    cr.returncode = await cr.proc.wait()
    on_update(cr)


def stop(cr: CheckRun) -> None:
    """Ask the child to stop as Ctrl-C would (it keeps what finished, writes the receipt, exits 130)."""
    if cr.running:
        cr.stopping = True
        try:
            cr.proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass


def force_stop(cr: CheckRun) -> None:
    """SIGTERM, if SIGINT did not end it within STOP_GRACE_S (the command handles both the same way)."""
    if cr.running:
        try:
            cr.proc.terminate()
        except ProcessLookupError:
            pass
