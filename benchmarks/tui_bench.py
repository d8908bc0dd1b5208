"""How fast is `contracts tui` on a big store? Generates N genuine receipts, then measures.

    python benchmarks/tui_bench.py                 # 10,000 receipts in a temporary folder
    python benchmarks/tui_bench.py --receipts 2000 --runs 5 --keep
    python benchmarks/tui_bench.py --dir /tmp/bench10k   # build once there, reuse on later runs

Measured, each in a fresh Python process (imports included, as a user pays them):
  time-to-interactive  process start -> first screen drawn with the method tree and
                       contract table filled from the index, and a key press handled;
  receipt open         `enter` on a receipt row -> receipt screen drawn with its results
                       read from disk (a worker) and its tables filled.
The first start on a store without an index builds it (every receipt parsed, verified
and schema-checked once, in worker processes); that one-time cost is reported apart,
since every later start reads the index and parses only new receipts.

Uses the repository's own specs when they validate (receipts shaped by their
contracts, bound to the real source files), otherwise three demo specs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

TTI_LIMIT_S = 2.0
OPEN_LIMIT_S = 0.5


# --- the child: one app start, timed -------------------------------------------------------


def child(args) -> None:
    t0 = float(args.t0)
    if args.demo:
        import engine.spec.registry as registry
        from benchmarks.synthetic_store import demo_static_names

        registry._STATIC = demo_static_names()
    import engine.cli  # noqa: F401  (what `contracts tui` imports before the app: counted too)
    from tui.app import create_app
    from tui.screens.receipt import ReceiptScreen

    out: dict = {}

    async def go():
        app = create_app(Path(args.specs), Path(args.receipts_dir), Path(args.root), poll_seconds=None)
        async with app.run_test(size=(140, 40)) as pilot:
            # a cold start indexes every receipt first (minutes at 10,000); warm ones take about a second
            await app.wait_loaded(timeout=3600.0 if args.opens == 0 else 60.0)
            await pilot.pause()
            await pilot.press("j")  # a key press is handled: the screen is interactive
            await pilot.pause()
            out["tti_s"] = time.time() - t0
            out["receipts"] = app.model.receipts_total
            out["parsed"] = app.model.parsed
            await pilot.press("2")  # Receipts tab, newest first (drawn when first shown)
            await pilot.pause()
            out["rows_shown"] = app.screen.query_one("#receipts-table").row_count
            if args.opens:
                opens = []
                for i in range(args.opens):
                    t = time.perf_counter()
                    await pilot.press("enter")
                    while not (isinstance(app.screen, ReceiptScreen) and app.screen.detail is not None):
                        await asyncio.sleep(0.002)
                    await pilot.pause()  # its tables drawn
                    opens.append(time.perf_counter() - t)
                    n = app.screen.query_one("#results-table").row_count
                    assert n > 0, "receipt opened without results"
                    await pilot.press("escape")
                    await pilot.pause()
                    await pilot.press(*(["j"] * 37))  # another receipt, further down the list
                    await pilot.pause()
                out["open_s"] = opens
        return out

    asyncio.run(go())
    print(json.dumps(out))


def run_child(store: dict, opens: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--specs", str(store["specs"]),
           "--receipts-dir", str(store["receipts"]), "--root", str(store["root"]), "--opens", str(opens)]
    if store["demo"]:
        cmd.append("--demo")
    t0 = time.time()
    proc = subprocess.run(cmd + ["--t0", repr(t0)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        # RuntimeError, not SystemExit: `python -m benchmarks` reports a row that fails and keeps the others.
        raise RuntimeError(f"child failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the parent: build the store, time the starts -------------------------------------------


def real_specs() -> list[dict]:
    """The repository's specs that validate (empty if none yet)."""
    from engine.paths import default_specs_dir, project_root
    from engine.spec.loader import spec_files, validate_file

    out = []
    for f in spec_files(default_specs_dir()) if default_specs_dir().is_dir() else []:
        spec, errs = validate_file(f, project_root())
        if spec is not None:
            out.append(spec.data)
    return out


def bound_files(root: Path) -> list[str]:
    """Source files a receipt binds: the engine and the method packages (as the runner does, without torch)."""
    files = []
    for top in ("engine", "methods"):
        files += [p.relative_to(root).as_posix() for p in (root / top).rglob("*.py")]
    return sorted(files)


def build_store(base: Path, n: int) -> dict:
    from benchmarks.synthetic_store import subject_for, write_demo_project, write_many
    from engine.spec.loader import load_spec

    specs = real_specs()
    if specs:
        from engine.paths import default_specs_dir, project_root

        root, specs_dir, demo = project_root(), default_specs_dir(), False
    else:
        import engine.spec.registry as registry
        from benchmarks.synthetic_store import demo_static_names

        registry._STATIC = demo_static_names()
        root = base / "project"
        keys = ("demo-alpha", "demo-beta", "demo-gamma")
        specs_dir = write_demo_project(root, keys=keys)
        specs = [load_spec(specs_dir / f"{k}.yaml", root).data for k in keys]
        demo = True
    receipts = base / "receipts"
    subjects = {}
    for s in specs:
        current = subject_for(root, s["method"], bound_files(root) if not demo else None)
        older = [dict(x, digest={"sha256": f"{i:064x}"}) if x["name"].startswith("engine/") else x
                 for i, x in enumerate(current)]
        subjects[s["method"]] = [older, current]  # 30% of receipts predate an engine edit: stale
    t = time.perf_counter()
    size = write_many(receipts, specs, n, subjects)
    return {"root": root, "specs": specs_dir, "receipts": receipts, "demo": demo,
            "methods": [s["method"] for s in specs],
            "write_s": time.perf_counter() - t, "bytes_per_receipt": size}


def in_process(store: dict) -> dict:
    """Index refresh and model build without the UI (what the load worker does), warm."""
    from engine.store.index import Freshness, ReceiptIndex
    from tui.data import build_model

    if store["demo"]:
        import engine.spec.registry as registry
        from benchmarks.synthetic_store import demo_static_names

        registry._STATIC = demo_static_names()
    t = time.perf_counter()
    idx = ReceiptIndex(store["receipts"])
    r = idx.refresh()
    refresh_s = time.perf_counter() - t
    t = time.perf_counter()
    model = build_model(store["specs"], store["receipts"], store["root"], ReceiptIndex(store["receipts"]),
                        Freshness(store["root"], store["specs"]))
    model_s = time.perf_counter() - t
    idx = ReceiptIndex(store["receipts"])
    model = build_model(store["specs"], store["receipts"], store["root"], idx, Freshness(store["root"], store["specs"]))
    from tui.data import gate_for

    t = time.perf_counter()
    verdicts = {m.key: gate_for(m.key, store["receipts"], store["root"], store["specs"]).verdict
                for m in model.methods if m.spec_obj is not None}
    gate_s = time.perf_counter() - t
    return {"warm_refresh_s": refresh_s, "warm_parsed": r.parsed, "build_model_s": model_s, "gates_s": gate_s,
            "verdicts": verdicts, "index_bytes": (store["receipts"] / ".index.jsonl").stat().st_size}


def load_or_build(base: Path, n: int) -> dict:
    """Reuse a store this script built in `base` before (manifest.json), else build one."""
    manifest = base / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        if m.get("n") == n:
            m.update(root=Path(m["root"]), specs=Path(m["specs"]), receipts=Path(m["receipts"]), reused=True)
            return m
    if (base / "receipts").exists():
        raise SystemExit(f"{base}/receipts exists but has no matching manifest.json; use another --dir")
    store = build_store(base, n)
    manifest.write_text(json.dumps({**store, "n": n, "root": str(store["root"]), "specs": str(store["specs"]),
                                    "receipts": str(store["receipts"])}))
    return {**store, "n": n, "reused": False}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--receipts", type=int, default=10_000, help="how many receipts to generate")
    ap.add_argument("--runs", type=int, default=3, help="warm starts to time")
    ap.add_argument("--opens", type=int, default=10, help="receipts to open per warm start")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where to build the store, or reuse the one built there before (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the generated store")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--specs", help=argparse.SUPPRESS)
    ap.add_argument("--receipts-dir", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--t0", help=argparse.SUPPRESS)
    ap.add_argument("--demo", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    base = Path(args.dir or tempfile.mkdtemp(prefix="tui-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        print(f"store: {args.receipts} receipts in {base} ...", file=sys.stderr)
        store = load_or_build(base, args.receipts)
        if not store["reused"]:
            print(f"  written in {store['write_s']:.0f} s, {store['bytes_per_receipt'] / 1024:.0f} KiB per receipt",
                  file=sys.stderr)
        from engine.store.index import INDEX_NAME, ReceiptIndex

        cold = None
        if not (store["receipts"] / INDEX_NAME).is_file():
            print("  building the index (every receipt parsed and verified once) ...", file=sys.stderr)
            t = time.perf_counter()
            r = ReceiptIndex(store["receipts"]).refresh()
            cold = (time.perf_counter() - t, r.parsed)
        warm = [run_child(store, opens=args.opens) for _ in range(args.runs)]
        inproc = in_process(store)
        tti = [w["tti_s"] for w in warm]
        opens = [o for w in warm for o in w["open_s"]]
        rows = [
            ("receipts in the store", f"{warm[0]['receipts']}",
             f"methods {', '.join(store['methods'])}{' (demo specs)' if store['demo'] else ''}"),
            ("receipt size", f"{store['bytes_per_receipt'] / 1024:.0f} KiB", "shaped by the specs' contracts"),
            ("index size", f"{inproc['index_bytes'] / 1e6:.1f} MB", ".index.jsonl"),
            ("index build, first start", "already built" if cold is None else f"{cold[0]:.0f} s",
             "" if cold is None else f"{cold[1]} files parsed and verified once, {os.cpu_count()} processes"),
            ("time-to-interactive", f"median {statistics.median(tti):.2f} s, max {max(tti):.2f} s",
             f"{len(tti)} starts, index present; parsed {warm[-1]['parsed']} files; limit {TTI_LIMIT_S} s"),
            ("receipt open", f"median {statistics.median(opens) * 1000:.0f} ms, max {max(opens) * 1000:.0f} ms",
             f"{len(opens)} opens; limit {OPEN_LIMIT_S * 1000:.0f} ms"),
            ("index refresh (in-process)", f"{inproc['warm_refresh_s'] * 1000:.0f} ms",
             f"parsed {inproc['warm_parsed']} files"),
            ("build_model (in-process)", f"{inproc['build_model_s'] * 1000:.0f} ms",
             "specs + index + freshness + rows"),
            ("engine.gate.verdict, all methods", f"{inproc['gates_s'] * 1000:.0f} ms",
             "after the first paint (another process above 1,000 receipts): "
             + ", ".join(f"{k} {v}" for k, v in inproc["verdicts"].items())),
            ("receipt rows in the table", f"{warm[0]['rows_shown']}", "newest first; / filters all of them"),
        ]
        width = max(len(r[0]) for r in rows)
        vwidth = max(len(r[1]) for r in rows)
        print(f"{'measure'.ljust(width)}  {'value'.ljust(vwidth)}  note")
        for name, value, note in rows:
            print(f"{name.ljust(width)}  {value.ljust(vwidth)}  {note}")
        load = os.getloadavg()
        print(f"\nload average during the run: {load[0]:.1f} (1 min) {load[1]:.1f} (5 min) on {os.cpu_count()} cores; "
              "other work on the machine slows every figure above")
        ok = max(tti) <= TTI_LIMIT_S and max(opens) <= OPEN_LIMIT_S
        print(f"\n{'PASS' if ok else 'FAIL'}: time-to-interactive <= {TTI_LIMIT_S} s and receipt open <= "
              f"{OPEN_LIMIT_S} s on {os.cpu_count()} CPU core(s)")
        sys.exit(0 if ok else 1)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
