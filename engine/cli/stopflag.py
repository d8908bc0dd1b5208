"""The stop flag `check` and its cell runs share: its own module, so the report helpers need not import `check`."""

from __future__ import annotations

import signal
from typing import Any


class _StopFlag:
    """SIGTERM (and SIGINT) set a flag the runner checks between check calls, and interrupt the check running.

    While `hold` is set (the receipt is being built and written) a signal only
    sets the flag: the receipt is written whole, then the command exits 130.
    """

    def __init__(self) -> None:
        self.stopped = False
        self.hold = False
        self._old: dict = {}

    def __enter__(self) -> "_StopFlag":
        def handler(signum, frame):  # noqa: ARG001
            self.stopped = True
            if not self.hold:
                raise KeyboardInterrupt

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
