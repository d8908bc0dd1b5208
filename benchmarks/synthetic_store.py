"""Genuine, verifiable receipts without running torch: for the TUI tests and its benchmark.

Every receipt is built with engine.store.receipts.statement(), so its id, subject
digest and bytes verify exactly like a real one; only the measurements are
made up. The shape of the predicate follows engine/run/runner.py.
"""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import MappingProxyType

from engine.run.expect import applies, evaluate
from engine.store.receipts import receipt_filename, serialize, sha256_file, statement, write_receipt

DEMO_SOURCES = {
    "engine/demo_engine.py": "# stands in for the engine sources a receipt binds\n",
    "methods/demo/core.py": "def loss():\n    return 0.0\n",
}

DEMO_SPEC = """\
spec_version: 1
method: {key}
title: Demo method for the browser tests
paper:
  arxiv: "2501.00001"
  version: v1
  title: A demo paper
  institution: Nowhere
  first_public: "2025-01-01"
  code_released: false
  license: null
level: L1
implementation: demo
formulas:
  - id: ratio
    latex: 'R_t = \\exp\\left(\\frac{{1}}{{t}} \\sum_{{i \\le t}} (\\ell_{{\\theta,i}} - \\ell_{{old,i}})\\right)'
    implements: ratio
  - id: loss
    latex: 'L = -\\frac{{1}}{{T}} \\sum_t \\min(R_t A, \\mathrm{{clip}}(R_t) A)'
    implements: loss
assumptions:
  - id: mean-over-tokens
    text: The loss is a mean over valid response tokens.
contracts:
  - id: ratio-forward
    description: Prefix ratio equals the float64 reference.
    formulas: [ratio]
    kind: value
    tier: math
    check: demo.ratio_forward
    dtypes: [float32, float64]
    cases: 8
    expect:
      - {{metric: max_abs_err, le: 1.0e-6}}
  - id: loss-gradient
    description: Gradient equals the analytic one.
    formulas: [loss]
    kind: gradient
    tier: math
    check: demo.loss_gradient
    dtypes: [float64]
    cases: 8
    expect:
      - {{metric: max_abs_err, le: 1.0e-10}}
  - id: padding-invariance
    description: Padding changes nothing.
    formulas: [loss]
    kind: property
    tier: math
    check: demo.padding
    dtypes: [float32]
    cases: 4
    expect:
      - {{metric: max_change, le: 0.0}}
  - id: mechanism-run
    description: Real updates move the parameters.
    formulas: [loss]
    kind: mechanism
    tier: math
    check: demo.mechanism
    dtypes: [float32]
    cases: 1
    expect:
      - {{metric: param_change, gt: 0.0}}
mutants:
  - id: no-prefix-mean
    description: Drops the 1/t of the prefix mean.
    mutant: demo.no_prefix_mean
    killed_by: [ratio-forward]
  - id: grad-leak
    description: Lets the gradient reach earlier positions.
    mutant: demo.grad_leak
    killed_by: [loss-gradient]
  - id: pad-in-loss
    description: Counts padding in the loss.
    mutant: demo.pad_in_loss
    killed_by: [padding-invariance, mechanism-run]
budget:
  seeds: [42, 43, 44]
  max_seeds: 5
  max_updates_per_seed: 10
  max_tokens_per_seed: 100000
  max_wall_seconds: 600
  downloads: false
paper_results:
  label: paper-reported
  note: Numbers as printed in the paper; nothing here was measured by this project.
  results:
    - id: math-avg
      source: paper
      model: Demo-8B
      benchmark: math average
      metric: Avg@8
      baseline: GRPO
      baseline_value: 27.7
      value: 41.0
promotion:
  review: {review}
  state: not-promoted
  reasons: [waiting for a CUDA receipt]
  requires:
    review: DONE
    devices: [cpu, cuda]
    all_budget_seeds: true
    mutants_killed: true
    formal_comparison: {formal}
"""


def demo_static_names():
    """The registry names the demo spec uses (tests put this in engine.spec.registry._STATIC)."""
    from engine.spec.registry import StaticNames

    return StaticNames(
        implementations=MappingProxyType({"demo": ("loss", "ratio")}),
        checks=frozenset({"demo.ratio_forward", "demo.loss_gradient", "demo.padding", "demo.mechanism"}),
        mutants=MappingProxyType({"demo.no_prefix_mean": "demo", "demo.grad_leak": "demo", "demo.pad_in_loss": "demo"}),
        files=(),
    )


def write_demo_project(root: Path, keys=("demo-method",), review: str = "IN-REVIEW", formal: bool = False) -> Path:
    """A project folder with demo sources and one spec per key; returns the specs folder."""
    root = Path(root)
    for rel, text in DEMO_SOURCES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    specs = root / "specs"
    specs.mkdir(parents=True, exist_ok=True)
    for key in keys:
        (specs / f"{key}.yaml").write_text(DEMO_SPEC.format(key=key, review=review, formal=str(formal).lower()))
    return specs


def subject_for(root: Path, key: str, files=None) -> list[dict]:
    """in-toto subjects for the given repository files plus the method's spec, as the runner binds them."""
    root = Path(root)
    files = list(files if files is not None else DEMO_SOURCES)
    subj = [{"name": rel, "digest": {"sha256": sha256_file(root / rel)}} for rel in files]
    subj.append({"name": f"specs/{key}.yaml", "digest": {"sha256": sha256_file(root / "specs" / f"{key}.yaml")}})
    return sorted(subj, key=lambda s: s["name"])


def _measure(exps: list[dict], dtype: str, passing: bool, rng: random.Random) -> dict:
    """Measurements that meet every applicable expectation (or, failing, break the first one)."""
    from engine.run.expect import DTYPE_DEFAULTS

    bounds: dict[str, dict] = {}
    for e in exps:
        b = bounds.setdefault(e["metric"], {})
        if "default" in e:
            rtol, atol = DTYPE_DEFAULTS[dtype]
            b["hi"] = min(b.get("hi", math.inf), rtol if e["default"] == "rtol" else atol)
        elif "eq" in e:
            b["eq"] = e["eq"]
        for op in ("le", "lt"):
            if op in e:
                b["hi"] = min(b.get("hi", math.inf), float(e[op]))
                b["strict_hi"] = b.get("strict_hi", False) or op == "lt"
        for op in ("ge", "gt"):
            if op in e:
                b["lo"] = max(b.get("lo", -math.inf), float(e[op]))
    out = {}
    for k, (metric, b) in enumerate(bounds.items()):
        broken = not passing and k == 0
        if "eq" in b:
            v = b["eq"]
            out[metric] = (not v if isinstance(v, bool) else v + 1.0) if broken else v
            continue
        lo, hi = b.get("lo", -math.inf), b.get("hi", math.inf)
        if broken:
            out[metric] = hi + (abs(hi) or 1e-3) * rng.uniform(0.5, 5) if hi < math.inf else lo - (abs(lo) or 1e-3)
        elif lo > -math.inf and hi < math.inf:
            out[metric] = lo + (hi - lo) * rng.uniform(0.05, 0.95)
        elif hi < math.inf:
            if hi > 0:
                out[metric] = hi * rng.uniform(0.05, 0.95)
            else:  # le 0: exactly zero, as invariance checks measure; lt 0: just below
                out[metric] = hi - 1e-9 if b.get("strict_hi") else hi
        elif lo > -math.inf:
            out[metric] = lo + max(abs(lo), 1e-3) * rng.uniform(0.05, 5)
        else:
            out[metric] = rng.uniform(0, 1)
    return out


def predicate(spec: dict, created_at: str, device: str = "cpu", seeds=None, failing=(), survivors=(),
              rng: random.Random | None = None, steps: int = 4, formal: float | None = None,
              commit: str = "0123456789abcdef0123456789abcdef01234567") -> dict:
    """A runner-shaped predicate for `spec`: results per contract/seed/dtype, mutants, mechanism steps."""
    rng = rng or random.Random(0)
    seeds = list(seeds or spec["budget"]["seeds"])
    results, mechanism = [], []
    for c in spec["contracts"]:
        for seed in seeds:
            for dtype in c["dtypes"]:
                passing = c["id"] not in failing
                applicable = [e for e in c["expect"] if applies(e, dtype)]
                ms = _measure(applicable, dtype, passing, rng)
                ms["cases"] = c["cases"]
                exps = [evaluate(e, ms, dtype) for e in applicable]  # the engine's own comparison
                status = "passed" if exps and all(x["passed"] for x in exps) else "failed"
                results.append({
                    "contract": c["id"], "kind": c["kind"], "check": c["check"], "seed": seed, "dtype": dtype,
                    "status": status, "measurements": ms, "expectations": exps,
                    "message": None if status == "passed" else f"{exps[0]['metric']} = {exps[0]['value']} not "
                                                                f"{exps[0]['op']} {exps[0]['threshold']}",
                    "cases_requested": c["cases"], "wall_s": round(rng.uniform(0.001, 0.2), 6),
                    "cost": {"optimizer_updates": steps if c["kind"] == "mechanism" else 0, "sampled_tokens": 0}})
                if c["kind"] == "mechanism":
                    rec = {"contract": c["id"], "seed": seed, "dtype": dtype,
                           "steps": [{"step": i, "loss": rng.uniform(-1, 1), "grad_norm": rng.uniform(0.01, 2),
                                      "param_change": rng.uniform(1e-4, 1e-2), "reward_mean": rng.uniform(0, 1),
                                      "clip_fraction": rng.uniform(0, 0.3)} for i in range(steps)],
                           "comparisons": [{"name": "vs-grpo", "metric": "reward_mean", "method": spec["method"],
                                            "control": "grpo", "method_values": [rng.uniform(0, 1) for _ in range(3)],
                                            "control_values": [rng.uniform(0, 1) for _ in range(3)],
                                            "formal": False, "note": "diagnostic: too few seeds to decide"}]}
                    mechanism.append(rec)
    if formal is not None:
        # A formal comparison per seed: the method `formal` ahead of its control on average.
        for rec in mechanism:
            control = [rng.uniform(0.3, 0.5) for _ in range(4)]
            rec["comparisons"].append({"name": "vs-grpo-formal", "metric": "reward_mean", "method": spec["method"],
                                       "control": "grpo", "method_values": [c + formal + rng.uniform(-0.01, 0.01)
                                                                            for c in control],
                                       "control_values": control, "formal": True, "note": ""})
    mutants = []
    for m in spec["mutants"]:
        killed = m["id"] not in survivors
        mutants.append({"id": m["id"], "mutant": m["mutant"], "description": m["description"],
                        "expected_killers": list(m["killed_by"]),
                        "killed_by": list(m["killed_by"][:1]) if killed else [],
                        "killed": killed, "seed": seeds[0], "results": []})
    contracts = {c["id"]: {"passed": sum(r["status"] == "passed" for r in results if r["contract"] == c["id"]),
                           "failed": sum(r["status"] == "failed" for r in results if r["contract"] == c["id"]),
                           "error": 0, "requested": len(seeds) * len(c["dtypes"])} for c in spec["contracts"]}
    status = "failed" if failing or survivors else "passed"
    dev = ({"kind": "cuda", "index": 0, "name": "NVIDIA H100 80GB HBM3", "cuda": "12.8", "capability": "9.0"}
           if device == "cuda" else {"kind": "cpu", "index": None, "name": "cpu", "cuda": None, "capability": None})
    return {
        "schema": "paper-contracts/receipt/v1", "created_at": created_at, "finished_at": created_at,
        "git": {"commit": commit, "dirty": False},
        "implementation": {"name": spec["implementation"], "files": ["methods/demo/core.py"]},
        "method": spec["method"],
        "spec": {"name": f"specs/{spec['method']}.yaml", "sha256": "0" * 64, "spec_version": 1,
                 "level": spec["level"], "implementation": spec["implementation"],
                 "review": spec["promotion"]["review"], "promotion_state": spec["promotion"]["state"]},
        "environment": {"python": "3.11.7", "torch": "2.13.0", "platform": "Linux-x86_64", "device": dev,
                        "torch_threads": 2},
        "request": {"device": device, "seeds": seeds, "only": None, "contracts": [c["id"] for c in spec["contracts"]],
                    "mutants": [m["id"] for m in spec["mutants"]]},
        "actual": {"seeds": seeds, "results": len(results), "cases": sum(r["cases_requested"] for r in results),
                   "mutants_run": len(mutants)},
        "results": results, "mutants": mutants,
        "contracts_proven": {c["id"]: [m["id"] for m in spec["mutants"] if c["id"] in m["killed_by"]]
                             for c in spec["contracts"]},
        "unproven_contracts": [], "mechanism": mechanism, "budget": dict(spec["budget"]),
        "cost": {"wall_s": round(rng.uniform(1, 30), 3), "optimizer_updates": 0, "sampled_tokens": 0,
                 "max_optimizer_updates_per_seed": steps},
        "summary": {"contracts": contracts,
                    "results": {s: sum(r["status"] == s for r in results) for s in ("passed", "failed", "error")},
                    "mutants": {"killed": sum(m["killed"] for m in mutants),
                                "survived": sum(not m["killed"] for m in mutants)}},
        "errors": [], "status": status,
    }


def stamp(i: int, start: datetime | None = None) -> str:
    """The i-th creation time, one minute apart: names sort in creation order."""
    start = start or datetime(2026, 1, 5, 9, 0, 0, tzinfo=timezone.utc)
    return (start + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def add_receipt(receipts_dir: Path, root: Path, spec: dict, i: int, **kw) -> Path:
    """Write one genuine receipt through engine.store.receipts.write_receipt."""
    subject = kw.pop("subject", None) or subject_for(root, spec["method"])
    return write_receipt(receipts_dir, statement(subject, predicate(spec, stamp(i), **kw)))


def write_many(receipts_dir: Path, specs: list[dict], n: int, subjects: dict[str, list[list[dict]]],
               seed: int = 0) -> float:
    """n receipts spread over `specs` (bytes identical to write_receipt's, without its fsyncs); returns bytes/file.

    `subjects[method]` is a list of subject lists; most receipts bind the last
    (the current tree, so they are fresh), older ones earlier lists (stale).
    """
    rng = random.Random(seed)
    total = 0
    for i in range(n):
        spec = specs[i % len(specs)]
        key = spec["method"]
        options = subjects[key]
        subject = options[-1] if i > n * 0.3 or len(options) == 1 else options[i % (len(options) - 1)]
        failing = {spec["contracts"][rng.randrange(len(spec["contracts"]))]["id"]} if rng.random() < 0.08 else ()
        device = "cuda" if rng.random() < 0.3 else "cpu"
        stmt = statement(subject, predicate(spec, stamp(i), device=device, failing=failing, rng=rng,
                                            commit=f"{rng.getrandbits(160):040x}"))
        data = serialize(stmt)
        folder = Path(receipts_dir) / key
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / receipt_filename(key, stmt["predicate"]["created_at"], stmt["predicate"]["receipt_id"]),
                  "xb") as f:
            f.write(data)
        total += len(data)
    return total / max(n, 1)


def build_fixture_store(root: Path) -> dict[str, Path]:
    """The small store the TUI tests and snapshots browse (identical bytes on every run).

    demo-method: a passing cpu run, a failing cpu run, a cuda run of one seed,
    a stale run (bound to an older engine file), a tampered one and a truncated
    one; other-method: a spec without receipts. Returns the written paths by name.
    """
    import json

    from engine.spec.loader import load_spec

    root = Path(root)
    specs = write_demo_project(root, keys=("demo-method", "other-method"))
    spec = load_spec(specs / "demo-method.yaml", root).data
    rd = root / "receipts"
    out = {"specs": specs, "receipts": rd}
    out["passed"] = add_receipt(rd, root, spec, 0)
    out["failed"] = add_receipt(rd, root, spec, 1, failing={"loss-gradient"}, rng=random.Random(1))
    out["cuda"] = add_receipt(rd, root, spec, 2, device="cuda", seeds=[42], rng=random.Random(2))
    old = subject_for(root, "demo-method")
    for s in old:
        if s["name"] == "engine/demo_engine.py":
            s["digest"]["sha256"] = "1" * 64  # the engine file as it was before an edit
    out["stale"] = add_receipt(rd, root, spec, -1, subject=old, rng=random.Random(3))  # the oldest run
    tampered = add_receipt(rd, root, spec, 4, rng=random.Random(4))
    data = json.loads(tampered.read_text())
    data["predicate"]["results"][0]["measurements"]["max_abs_err"] = 0.0  # an edit after the run
    tampered.write_text(json.dumps(data, indent=1) + "\n")
    out["tampered"] = tampered
    truncated = add_receipt(rd, root, spec, 5, rng=random.Random(5))
    truncated.write_bytes(truncated.read_bytes()[:700])
    out["truncated"] = truncated
    return out


STALE_MARK = "0" * 48  # subject_for's stand-in digests of an older engine (f"{i:064x}") start with this


def rebind_store(src: Path, dst: Path, root: Path, specs_dir: Path | None = None, methods=None) -> dict:
    """Copy a store written by `write_many` into `dst`, each receipt bound to the working tree as it is now.

    A benchmark store binds the engine and methods files as they were when it was written, so any later edit of
    the engine makes every receipt stale and the gate has nothing fresh to count. Generating 10,000 receipts again
    takes most of an hour on a loaded 2-core machine; rebinding takes minutes: each subject digest of a real file
    becomes that file's digest now (the stand-ins of an older engine, STALE_MARK, stay: those receipts stay stale),
    the subject digest and the receipt id are computed again, and the file's bytes are the Statement serialised as
    `write_receipt` would (the subject list re-serialised, the predicate's bytes kept but for its two digests; a
    sample is checked against `serialize`). `methods`: only these method folders (several processes can share the
    work). Returns {"receipts": n, "bytes_per_receipt": ...}.
    """
    import hashlib
    import json

    from engine.store.receipts import canonical_parsed, receipt_id, serialize_parsed, subject_target

    src, dst, root = Path(src), Path(dst), Path(root)
    now: dict[str, str | None] = {}

    def digest_now(name: str) -> str | None:
        if name not in now:
            target = subject_target(name, root, specs_dir)
            now[name] = sha256_file(target) if target is not None and target.is_file() else None
        return now[name]

    n, total = 0, 0
    for folder in sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith(".")
                         and (methods is None or p.name in methods)):
        out = dst / folder.name
        out.mkdir(parents=True, exist_ok=True)
        for i, path in enumerate(sorted(folder.glob("*.json"))):
            raw = path.read_bytes()
            stmt = json.loads(raw)
            pred = stmt["predicate"]
            subject = [dict(s, digest={"sha256": s["digest"]["sha256"] if s["digest"]["sha256"].startswith(STALE_MARK)
                                       or digest_now(s["name"]) is None else digest_now(s["name"])})
                       for s in stmt["subject"]]
            old_sub, old_id = pred["subject_sha256"], pred["receipt_id"]
            pred["subject_sha256"] = hashlib.sha256(canonical_parsed(subject)).hexdigest()
            pred["receipt_id"] = receipt_id(pred, parsed=True)
            stmt["subject"] = subject
            head = json.dumps({"_type": stmt["_type"], "subject": subject}, indent=1, ensure_ascii=False)
            at = raw.index(b',\n "predicateType"')
            rest = raw[at:].replace(f'"subject_sha256": "{old_sub}"'.encode(),
                                    f'"subject_sha256": "{pred["subject_sha256"]}"'.encode(), 1)
            rest = rest.replace(f'"receipt_id": "{old_id}"'.encode(), f'"receipt_id": "{pred["receipt_id"]}"'.encode(), 1)
            data = head[:head.rindex("\n}")].encode("utf-8") + rest
            if i % 500 == 0 and data != serialize_parsed(stmt):
                raise RuntimeError(f"rebinding {path.name} did not give write_receipt's bytes")
            with open(out / receipt_filename(folder.name, pred["created_at"], pred["receipt_id"]), "xb") as f:
                f.write(data)
            n += 1
            total += len(data)
    return {"receipts": n, "bytes_per_receipt": total / max(n, 1)}
