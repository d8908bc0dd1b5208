"""python -m benchmarks [--device cpu|cuda] [--only ROW ...] [--out FILE] [--quick]

Prints one table (each row: what, shape, against what, the median, its
spread, the target, whether it is met) and writes the same as JSON, with the
machine it ran on. Exit 0 when every measured row meets its target, 1 if not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import ROOT, Row

ROWS = ("tapo", "family", "mrtpo", "tar", "cli", "check", "evolve", "sandbox", "boundary", "stage1", "audit", "hf",
        "tui", "store")
# The TUI rows generate 10,000 receipts and let the first start index them (about 130 ms of CPU per
# receipt, mostly the receipt schema check): far longer than every other row together, so they run only
# when named, `--only tui`, and the default run stays under five minutes on a 2-core machine.
# The store rows read a store of 10,000 receipts (2.5 GB, generated once in $BENCH_STORE_DIR: most of an hour), so
# they run only when named too, `--only store`.
# The hf rows need the [hf] extra (transformers, peft): they run only when named, `--only hf`.
DEFAULT_ROWS = tuple(r for r in ROWS if r not in ("tui", "store", "hf"))


def machine(device: str) -> dict:
    import torch

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            mem_gib = int(f.readline().split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        mem_gib = None
    out = {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_gib, 1) if mem_gib else None,
           "python": platform.python_version(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
           "platform": f"{platform.system()}-{platform.machine()}", "device": device}
    if device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name(0)
    try:
        out["commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        out["commit"] = None
    return out


def measure(name: str, device: str, quick: bool) -> list[Row]:
    if name == "tapo":
        from benchmarks import tapo_loss

        return [tapo_loss.run(device, **({"repeats": 5, "length": 2048} if quick else {}))]
    if name == "family":
        from benchmarks import family_loss

        return family_loss.run(device, **({"repeats": 3, "length": 2048} if quick else {}))
    if name == "mrtpo":
        from benchmarks import mrtpo_credit

        return [mrtpo_credit.run(device, **({"repeats": 1, "rows": 8} if quick else {}))]
    if name == "tar":
        from benchmarks import tar_fps

        return [tar_fps.run(device, **({"repeats": 3, "prompts": 64} if quick else {}))]
    if name == "cli":
        from benchmarks import cli_time

        return cli_time.run(device, **({"repeats": 1} if quick else {}))
    if name == "check":
        from benchmarks import check_all

        return check_all.run(device)
    if name == "evolve":
        from benchmarks import evolve_bench

        return evolve_bench.run(device, **({"repeats": 1, "cold_repeats": 1} if quick else {}))
    if name == "sandbox":
        from benchmarks import sandbox_bench

        return sandbox_bench.run(device, **({"repeats": 1, "check_repeats": 1} if quick else {}))
    if name == "boundary":
        from benchmarks import sandbox_bench

        return sandbox_bench.boundary(device, **({"repeats": 1, "check_repeats": 1} if quick else {}))
    if name == "audit":
        from benchmarks import audit_bench

        return audit_bench.run(device, **({"repeats": 1} if quick else {}))
    if name == "stage1":
        from benchmarks import stage1_profile

        return stage1_profile.run(device, **({"repeats": 1} if quick else {}))
    if name == "hf":
        from benchmarks import hf_impl_bench

        return hf_impl_bench.run(device, **({"repeats": 1} if quick else {}))
    if name == "store":
        from benchmarks import cli_time

        return cli_time.run_store(device, **({"receipts": 200, "repeats": 1, "verify_repeats": 1} if quick else {}))
    if name == "tui":
        from benchmarks import tui_rows

        return tui_rows.run(device, **({"receipts": 200, "starts": 1, "opens": 1} if quick else {}))
    raise ValueError(name)


def table(rows: list[Row], info: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(highlight=False, width=None if sys.stdout.isatty() else 220)
    title = (f"{info['cpu']}, {info['cores']} cores, {info['memory_gib']} GiB; torch {info['torch']} "
             f"({info['torch_threads']} threads); device {info['device']}" + (f" ({info['gpu']})" if "gpu" in info else "")
             + f"; load {info['load_before'][0]:.2f} -> {info['load_after'][0]:.2f}")
    t = Table(title=title, title_justify="left")
    for col in ("#", "row", "shape", "against", "median", "spread", "target", "met"):
        t.add_column(col)
    for i, r in enumerate(rows, 1):
        val = "n/a" if r.value is None else f"{r.value:.3g} {r.unit}"
        met = "n/a" if r.ok is None else ("yes" if r.ok else "NO")
        t.add_row(str(i), r.name, r.shape, r.against, val, r.spread, r.target, met)
    con.print(t)
    for i, r in enumerate(rows, 1):
        if r.note:
            con.print(f"{i}. {r.note}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (cuda also reports absolute times and GPU memory)")
    ap.add_argument("--only", action="append", choices=ROWS, help="run only these rows (repeatable; default: all but tui, which takes far longer)")
    ap.add_argument("--out", type=Path, default=Path("benchmark-results.json"), help="where to write the JSON")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, one repeat: checks the harness, not the targets")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads here and in the subprocesses (default: torch's, one per core)")
    a = ap.parse_args(argv)
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
        # the subprocesses (memory probes, check --all) start torch with the same thread count
        os.environ["OMP_NUM_THREADS"] = str(a.threads)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {a.device}: torch {torch.__version__} sees no CUDA device here", file=sys.stderr)
        return 4
    info = machine(a.device)
    info["load_before"] = list(os.getloadavg())
    t0 = time.perf_counter()
    rows: list[Row] = []
    for name in a.only or DEFAULT_ROWS:
        print(f"measuring {name} ...", file=sys.stderr, flush=True)
        try:
            rows += measure(name, a.device, a.quick)
        except Exception as exc:  # a row that cannot run is reported, the others still run
            rows.append(Row(name=name, shape="", against="", value=None, unit="", target="", ok=False,
                            note=f"could not run: {type(exc).__name__}: {exc}"))
    info["load_after"] = list(os.getloadavg())
    info["wall_s"] = round(time.perf_counter() - t0, 1)
    info["quick"] = a.quick
    table(rows, info)
    a.out.write_text(json.dumps({"machine": info, "rows": [r.as_dict() for r in rows]}, indent=1) + "\n")
    print(f"{len(rows)} rows in {info['wall_s']} s; JSON: {a.out}", file=sys.stderr)
    return 0 if all(r.ok is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
