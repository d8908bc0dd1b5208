"""`contracts tui` on 10,000 generated receipts: time-to-interactive and receipt open (absolute).

The TUI helper's benchmark (benchmarks/tui_bench.py, from the tui branch)
builds the store and times fresh app starts; this module only runs it and
turns its figures into rows. Without it (the tui branch not merged yet) the
rows say so instead of guessing.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

from benchmarks.harness import Row

TTI_TARGET_S, OPEN_TARGET_S = 2.0, 0.5


def run(device: str = "cpu", receipts: int = 10_000, starts: int = 3, opens: int = 5) -> list[Row]:  # noqa: ARG001
    try:
        from benchmarks import tui_bench
    except ImportError:
        note = "not measured: benchmarks/tui_bench.py (the TUI helper's benchmark) is not in this checkout"
        return [Row(name="contracts tui: time-to-interactive", shape=f"{receipts:,} receipts", against="(absolute)",
                    value=None, unit="s", target=f"<= {TTI_TARGET_S:g} s", ok=None, note=note),
                Row(name="contracts tui: receipt open", shape=f"{receipts:,} receipts", against="(absolute)",
                    value=None, unit="s", target=f"<= {OPEN_TARGET_S:g} s", ok=None, note=note)]
    base = Path(tempfile.mkdtemp(prefix="bench-tui-"))
    try:
        store = tui_bench.build_store(base, receipts)
        cold = tui_bench.run_child(store, opens=0)
        warm = [tui_bench.run_child(store, opens=opens) for _ in range(starts)]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    tti = [w["tti_s"] for w in warm]
    op = [o for w in warm for o in w["open_s"]]
    shape = f"{warm[0]['receipts']:,} receipts" + (" (demo specs)" if store["demo"] else "")
    return [
        Row(name="contracts tui: time-to-interactive", shape=shape, against="(absolute)", value=statistics.median(tti),
            unit="s", target=f"<= {TTI_TARGET_S:g} s", ok=max(tti) <= TTI_TARGET_S,
            spread=f"{min(tti):.2f}-{max(tti):.2f} s over {len(tti)} warm starts",
            note=f"cold start (builds the index once) {cold['tti_s']:.2f} s",
            details={"warm_s": tti, "cold_s": cold["tti_s"]}),
        Row(name="contracts tui: receipt open", shape=shape, against="(absolute)", value=statistics.median(op), unit="s",
            target=f"<= {OPEN_TARGET_S:g} s", ok=max(op) <= OPEN_TARGET_S,
            spread=f"{min(op) * 1e3:.0f}-{max(op) * 1e3:.0f} ms over {len(op)} opens", details={"open_s": op}),
    ]
