"""Timing and memory helpers shared by the benchmark rows: paired medians, spreads, peak memory in a subprocess."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Row:
    """One line of the table: a measured ratio (or absolute figure) against its target."""

    name: str
    shape: str
    against: str
    value: float | None  # the figure the target judges (a ratio, seconds, ...)
    unit: str  # "x" for ratios, "s" for seconds
    target: str  # e.g. "<= 1.15x"
    ok: bool | None  # None: not measured (see note)
    spread: str = ""
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


class Candidates:
    """A new candidate file per call in `folder`: `source` plus a numbered comment (a new sha256, the same code), so
    that no cache keyed on the file's content can serve it."""

    def __init__(self, folder: Path, source: Path = ROOT / "tests" / "fixtures" / "my_tapo.py"):
        self.folder, self.n, self.text = folder, 0, source.read_text()

    def __call__(self) -> Path:
        self.n += 1
        p = self.folder / f"cand_{self.n}.py"
        p.write_text(self.text + f"\n# candidate {self.n}\n")
        return p


def without_keys(x: Any, keys: set[str] | frozenset[str]) -> Any:
    """A copy of JSON-like `x` with every dict entry named in `keys` left out, at any depth (to compare two
    receipts' predicates without the times and ids that legitimately differ)."""
    if isinstance(x, dict):
        return {k: without_keys(v, keys) for k, v in x.items() if k not in keys}
    if isinstance(x, list):
        return [without_keys(v, keys) for v in x]
    return x


def sync_for(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        return lambda: torch.cuda.synchronize()
    return lambda: None


def paired(fn_a: Callable[[], Any], fn_b: Callable[[], Any], repeats: int, device: str = "cpu",
           warmup: int = 1) -> dict:
    """Time a and b alternately (a, b, b, a, ...) so drift and neighbours' load hit both alike.

    Returns each one's median seconds and the per-pair ratios a/b with their median and spread.
    """
    sync = sync_for(device)

    cpu = {"a": [], "b": []}
    peak = {"a": 0, "b": 0}
    cuda = device.startswith("cuda")

    def once(fn, key) -> float:
        sync()
        if cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        sync()
        t = time.perf_counter() - t0
        cpu[key].append(time.process_time() - c0)
        if cuda:
            peak[key] = max(peak[key], torch.cuda.max_memory_allocated() - base)
        return t

    for _ in range(warmup):
        once(fn_a, "a"), once(fn_b, "b")
    cpu = {"a": [], "b": []}
    ta, tb = [], []
    for i in range(repeats):
        if i % 2:
            tb.append(once(fn_b, "b")), ta.append(once(fn_a, "a"))
        else:
            ta.append(once(fn_a, "a")), tb.append(once(fn_b, "b"))
    ratios = [a / b for a, b in zip(ta, tb)]
    # CPU time (this process, all its threads): what the work costs, whatever the neighbours do.
    cpu_ratio = statistics.median(cpu["a"]) / statistics.median(cpu["b"]) if statistics.median(cpu["b"]) else None
    return {"a_s": ta, "b_s": tb, "a_median_s": statistics.median(ta), "b_median_s": statistics.median(tb),
            "ratios": ratios, "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "cpu_a_s": cpu["a"], "cpu_b_s": cpu["b"], "cpu_ratio": cpu_ratio,
            # on a GPU: peak memory each allocated above what was there before the call
            "peak_a_bytes": peak["a"] if cuda else None, "peak_b_bytes": peak["b"] if cuda else None}


def gpu_note(t: dict) -> str:
    """Peak device memory of a paired run, for the row's note (empty on the CPU)."""
    if t.get("peak_a_bytes") is None:
        return ""
    return f"; peak GPU memory {t['peak_a_bytes'] / 2**20:.1f} MiB vs {t['peak_b_bytes'] / 2**20:.1f} MiB"


def spread(lo: float, hi: float, n: int, unit: str = "x") -> str:
    return f"{lo:.3g}-{hi:.3g}{unit} over {n}"


def run_json_subprocess(args: list[str], timeout: float = 600, env: dict | None = None) -> dict:
    """Run `python args...` from the repository root; its last stdout line is a JSON object."""
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def proc_status_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise KeyError(field_name)


def reset_peak_rss() -> bool:
    """Reset this process's peak resident size (VmHWM) to its current size (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
