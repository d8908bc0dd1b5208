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

import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


# --- the same verbs on a store of 10,000 receipts -------------------------------------------------------------------

STORE_ENV = "BENCH_STORE_DIR"  # where the big store is built once and kept (default: a temporary folder)


def _measured(argv: list[str]) -> dict:
    """Wall time, CPU time and peak RSS of one fresh process (os.wait4: this child's own figures)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024,
            "code": proc.returncode}


def tree_digest() -> str:
    """A digest of every file a benchmark receipt binds (tui_bench.bound_files) and of the specs."""
    from benchmarks import tui_bench

    h = hashlib.sha256()
    for rel in tui_bench.bound_files(ROOT) + sorted(f"specs/{p.name}" for p in (ROOT / "specs").glob("*.yaml")):
        h.update(rel.encode() + b"\0" + hashlib.sha256((ROOT / rel).read_bytes()).digest())
    return h.hexdigest()


def bound_store(base: Path, n: int) -> tuple[Path, dict]:
    """A store of `n` receipts bound to this tree: generated once in `base` (benchmarks/tui_bench.py, most of an
    hour on a loaded 2-core machine), then rebound to the tree as it is now (synthetic_store.rebind_store, once
    per tree: `base`/bound-DIGEST, older copies removed), so that its current receipts are fresh here."""
    from benchmarks import tui_bench
    from benchmarks.synthetic_store import rebind_store

    store = tui_bench.load_or_build(base, n)
    target = base / f"bound-{tree_digest()[:12]}"
    info = {"built_s": None if store.get("reused") else store.get("write_s"), "rebind_s": None}
    if not (target / "done").is_file():
        for old in base.glob("bound-*"):
            shutil.rmtree(old, ignore_errors=True)
        t = time.perf_counter()
        # one process per method folder, two at a time: minutes, not an hour, on a busy 2-core machine
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        folders = sorted(p.name for p in Path(store["receipts"]).iterdir() if p.is_dir())
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
            list(pool.map(rebind_store, *zip(*[(store["receipts"], target / "receipts", ROOT, ROOT / "specs", [f])
                                               for f in folders])))
        info["rebind_s"] = time.perf_counter() - t
        (target / "done").write_text("")
    return target / "receipts", info


def run_store(device: str = "cpu", receipts: int = 10_000, repeats: int = 5,  # noqa: ARG001
              method: str = "tapo-trajectory", verify_repeats: int = 2) -> list[Row]:
    """`list`, `gate METHOD`, `show METHOD` on `receipts` receipts, each a fresh process alternated with
    `import torch`, warm (the user's sealed index built by an untimed first run, whose time is reported); and
    `verify`, which reads and hashes every receipt, as seconds per receipt."""
    base = Path(os.environ.get(STORE_ENV) or tempfile.mkdtemp(prefix="bench-store-"))
    base.mkdir(parents=True, exist_ok=True)
    store, info = bound_store(base, receipts)
    cli = [sys.executable, "-m", "engine.cli"]
    cmds = {"list": ["list"], "gate": ["gate", method], "show": ["show", method]}
    torch_cmd = [sys.executable, "-c", "import torch"]
    load = [os.getloadavg()[0]]
    _measured(torch_cmd)
    compile_checkout()
    first = {name: _measured([*cli, *args, "--receipts", str(store)]) for name, args in cmds.items()}
    n = sum(1 for _ in store.glob("*/*.json"))
    base_runs: list[dict] = []
    runs: dict[str, list[dict]] = {name: [] for name in cmds}
    for _ in range(repeats):
        base_runs.append(_measured(torch_cmd))
        for name, args in cmds.items():
            runs[name].append(_measured([*cli, *args, "--receipts", str(store)]))
    load.append(os.getloadavg()[0])
    verify = []
    for _ in range(verify_repeats):
        verify.append(_measured([*cli, "verify", "--receipts", str(store)]))
        base_runs.append(_measured(torch_cmd))
    load.append(os.getloadavg()[0])
    b = statistics.median(r["wall"] for r in base_runs)
    shape = f"{n:,} receipts ({sum(p.stat().st_size for p in store.glob('*/*.json')) / 1e9:.1f} GB), warm index"
    rows = []
    for name, rs in runs.items():
        ratios = [r["wall"] / x["wall"] for r, x in zip(rs, base_runs)]
        wall = statistics.median(r["wall"] for r in rs)
        r = wall / b
        rows.append(Row(
            name=f"contracts {' '.join(cmds[name])}", shape=shape, against='python -c "import torch"', value=r,
            unit="x", target=f"<= {TARGET}x", ok=r <= TARGET, spread=f"{min(ratios):.3g}-{max(ratios):.3g}x over {repeats}",
            note=(f"{wall * 1e3:.0f} ms vs {b * 1e3:.0f} ms; {statistics.median(x['cpu'] for x in rs):.2f} CPU-s, "
                  f"{max(x['rss_mb'] for x in rs):.0f} MB peak; exit {sorted({x['code'] for x in rs})}; first (cold) "
                  f"run {first[name]['wall']:.0f} s; load {load[0]:.1f}-{load[1]:.1f}"),
            details={"command_s": [x["wall"] for x in rs], "import_torch_s": [x["wall"] for x in base_runs],
                     "cpu_s": [x["cpu"] for x in rs], "rss_mb": [x["rss_mb"] for x in rs],
                     "first_run": first[name], "store": info}))
    vw = statistics.median(x["wall"] for x in verify)
    rows.append(Row(
        name="contracts verify, per receipt", shape=shape.replace("warm index", "every file read and hashed"),
        against="(absolute)", value=vw / n * 1e3, unit="ms", target="(shown: grows with the store)", ok=None,
        spread=f"{min(x['wall'] for x in verify):.1f}-{max(x['wall'] for x in verify):.1f} s over {len(verify)}",
        note=(f"{vw:.1f} s in all ({vw / b:.2f}x import torch); {statistics.median(x['cpu'] for x in verify):.1f} "
              f"CPU-s, {max(x['rss_mb'] for x in verify):.0f} MB peak; load {load[1]:.1f}-{load[2]:.1f}"),
        details={"verify_s": [x["wall"] for x in verify], "cpu_s": [x["cpu"] for x in verify]}))
    return rows
