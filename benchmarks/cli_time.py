"""Wall time of the read-only commands against `python -c "import torch"`, each a fresh process.

The read-only verbs promise not to import torch; this row measures what that
buys a user at the prompt: a whole command, interpreter start included, as a
fraction of what importing torch alone costs. Commands are run alternately
with the torch import, so a neighbour's load hits both alike.

Each command runs once untimed first, so the timed runs find the user's sealed
cache (engine/store/sealed.py: what was judged from these exact receipt and spec
bytes before, under an HMAC key only the user can read) warm: that is what a user
sees from the second command on. A cold run (`--no-cache`, or the first after a
receipt or the engine changed) re-checks every receipt's integrity and schema and
re-validates the specs, and costs several times more.

The checkout's modules are compiled to bytecode first, as Python does on any
import unless PYTHONDONTWRITEBYTECODE is set: torch's bytecode was compiled when
pip installed it, so without this step the baseline would skip a compile the
commands pay for on every run.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from benchmarks.harness import ROOT, Row

TARGET = 0.25


def commands(method: str) -> dict[str, list[str]]:
    return {"list": ["list"], "show": ["show", method], "gate": ["gate", method], "verify": ["verify"]}


def compile_checkout() -> None:
    """Bytecode for the checkout's packages (what an import writes unless PYTHONDONTWRITEBYTECODE is set)."""
    import compileall

    for pkg in ("engine", "methods", "tui"):
        if (ROOT / pkg).is_dir():
            compileall.compile_dir(str(ROOT / pkg), quiet=1)


def _wall(argv: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0, proc.returncode


def run(device: str = "cpu", repeats: int = 7, method: str = "tapo-trajectory") -> list[Row]:  # noqa: ARG001
    torch_cmd = [sys.executable, "-c", "import torch"]
    cmds = commands(method)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    codes: dict[str, set[int]] = {name: set() for name in cmds}
    base: list[float] = []
    _wall(torch_cmd)  # page the torch libraries in once, so the baseline is a warm import, not a cold disk read
    compile_checkout()
    for args in cmds.values():  # and fill the validation cache: the timed runs are warm-cache runs
        _wall([sys.executable, "-m", "engine.cli", *args])
    for _ in range(repeats):
        base.append(_wall(torch_cmd)[0])
        for name, args in cmds.items():
            t, code = _wall([sys.executable, "-m", "engine.cli", *args])
            times[name].append(t)
            codes[name].add(code)
    b = statistics.median(base)
    rows = []
    for name, ts in times.items():
        ratios = [t / x for t, x in zip(ts, base)]
        r = statistics.median(ts) / b
        rows.append(Row(
            name=f"contracts {' '.join(cmds[name])}", shape="this checkout's specs and receipts",
            against='python -c "import torch"', value=r, unit="x", target=f"<= {TARGET}x", ok=r <= TARGET,
            spread=f"{min(ratios):.3g}-{max(ratios):.3g}x over {repeats}",
            note=f"{statistics.median(ts) * 1e3:.0f} ms vs {b * 1e3:.0f} ms; exit {sorted(codes[name])}; "
                 "warm sealed cache (each command ran once untimed first)",
            details={"command_s": ts, "import_torch_s": base, "exit_codes": sorted(codes[name])},
        ))
    return rows
