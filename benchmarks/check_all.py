"""`contracts check --all --device cpu` serially and with --jobs 2, and whether their receipts measure the same.

Each run is a fresh `python -m engine.cli check --all` process writing to its
own temporary receipt store, as a user would run it; the two receipts of each
method are then compared value by value, leaving out what is a time or says
how the run was executed.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, Row, without_keys

SERIAL_TARGET_S, SPEEDUP_TARGET = 60.0, 1.6
# Keys that are times, ids derived from them, or the record of how a run was executed.
NOT_MEASUREMENTS = {"created_at", "finished_at", "receipt_id", "subject_sha256", "wall_s", "execution", "seconds",
                    "torch_threads", "git"}


def _check(store: Path, jobs: int, device: str) -> tuple[float, int, str, float]:
    """Wall time, exit code, stderr tail and CPU seconds of the process (its forked workers not included)."""
    argv = [sys.executable, "-m", "engine.cli", "check", "--all", "--device", device, "--receipts", str(store), "--json"]
    if jobs > 1:
        argv += ["--jobs", str(jobs)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, proc.returncode, proc.stderr[-2000:], cpu


def worker_cpu(store: Path) -> dict[str, float]:
    """CPU seconds of the cells each worker ran, from the receipts' execution records."""
    per: dict[str, float] = {}
    for f in store.glob("*/*.json"):
        for c in json.loads(f.read_text())["predicate"].get("execution", {}).get("cells", []):
            per[c["worker"]] = per.get(c["worker"], 0.0) + (c.get("cpu_s") or 0.0)
    return per


def comparable(predicate: dict) -> dict:
    """A predicate without what legitimately differs between two runs of the same code (NOT_MEASUREMENTS)."""
    return without_keys(predicate, NOT_MEASUREMENTS)


def differences(a: dict, b: dict, path: str = "$") -> list[str]:
    """JSON paths where two stripped predicates differ (at most a few)."""
    if type(a) is not type(b):
        return [path]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += differences(a.get(k), b.get(k), f"{path}.{k}") if k in a and k in b else [f"{path}.{k}"]
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path} (length {len(a)} vs {len(b)})"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def compare_stores(serial: Path, parallel: Path) -> dict:
    """Per method: how many values differ between the two receipts (times and execution left out)."""
    out = {}
    for folder in sorted(p for p in serial.iterdir() if p.is_dir()):
        a = json.loads(next(folder.glob("*.json")).read_text())
        theirs = list((parallel / folder.name).glob("*.json"))
        if not theirs:
            out[folder.name] = ["no receipt from the --jobs run"]
            continue
        b = json.loads(theirs[0].read_text())
        diff = differences(comparable(a["predicate"]), comparable(b["predicate"]))
        if a["subject"] != b["subject"]:
            diff.append("$.subject")
        out[folder.name] = diff
    return out


def run(device: str = "cpu", jobs: int = 2) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:
        s_store, p_store = Path(tmp, "serial"), Path(tmp, "jobs")
        t_serial, rc_serial, err_s, cpu_serial = _check(s_store, 1, device)
        t_jobs, rc_jobs, err_j, cpu_driver = _check(p_store, jobs, device)
        diffs = compare_stores(s_store, p_store) if s_store.is_dir() and p_store.is_dir() else {"?": ["no receipts"]}
        workers = worker_cpu(p_store) if p_store.is_dir() else {}
        methods = sorted(diffs)
        seeds = 0
        for f in s_store.glob("*/*.json"):
            seeds = max(seeds, len(json.loads(f.read_text())["predicate"]["request"]["seeds"]))
    n_diff = sum(len(d) for d in diffs.values())
    # Wall time on a shared machine says as much about the neighbours as about us. CPU time does not:
    # on an idle machine the serial run takes its CPU time, the parallel one its driver's CPU time
    # (start-up, planning, merging; the forkserver's one import is in there) plus its busiest worker's.
    critical = cpu_driver + max(workers.values(), default=0.0)
    projected = cpu_serial / critical if critical else None
    shape = f"{len(methods)} methods x {seeds} seeds"
    speedup = t_serial / t_jobs
    rows = [
        Row(name="contracts check --all", shape=shape, against="(absolute)", value=t_serial, unit="s",
            target=f"<= {SERIAL_TARGET_S:g} s", ok=t_serial <= SERIAL_TARGET_S and rc_serial == 0, spread="1 run",
            note=f"exit {rc_serial}; {cpu_serial:.1f} CPU-s" + (f": {err_s.strip().splitlines()[-1]}" if rc_serial else ""),
            details={"wall_s": t_serial, "exit": rc_serial, "methods": methods, "cpu_s": cpu_serial}),
        Row(name=f"contracts check --all --jobs {jobs}", shape=shape, against="the same run serially",
            value=speedup, unit="x faster", target=f">= {SPEEDUP_TARGET}x, same measurements",
            ok=speedup >= SPEEDUP_TARGET and n_diff == 0 and rc_jobs == rc_serial, spread="1 run each",
            note=f"{t_jobs:.1f} s vs {t_serial:.1f} s; exit {rc_jobs}; "
                 + ("receipts equal but for times" if n_diff == 0 else f"{n_diff} values differ")
                 + (f"; from CPU times, an idle machine would give {projected:.2f}x (serial {cpu_serial:.1f} CPU-s; "
                    f"driver {cpu_driver:.1f} + busiest worker {max(workers.values()):.1f} CPU-s)" if projected else ""),
            details={"wall_s": t_jobs, "exit": rc_jobs, "differences": diffs, "cpu_serial_s": cpu_serial,
                     "cpu_driver_s": cpu_driver, "cpu_workers_s": workers, "projected_idle_speedup": projected}),
    ]
    return rows
