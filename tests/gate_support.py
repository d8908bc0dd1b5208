"""Shared by test_gate.py and test_verify.py: a toy method, its spec, and genuine receipts for it.

Receipts here are built with engine.store.receipts.statement()/write_receipt(), so
they carry real ids and real subject digests and verify exactly like a run's.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType

from engine.store import receipts as R
from engine.spec import registry

SPEC_TEXT = """\
# Toy spec for the gate tests: comments, key order and quoting must survive promote.
spec_version: 1
method: toy
title: "Toy doubling method"   # quoted on purpose
paper:
  arxiv: "2601.00001"
  version: v1
  title: Toy paper
  institution: Nowhere
  first_public: "2026-01-01"
  code_released: false
  license: null
level: L1
implementation: toy
formulas:
  - id: double
    latex: 'y = 2x'
    implements: double
assumptions:
  - id: a1
    text: doubling is exact in float64
contracts:
  - id: double-value
    description: the value equals 2x
    formulas: [double]
    kind: value
    tier: math
    check: toy.double_value
    dtypes: [float64, float32]
    cases: 8
    expect:
      - {metric: max_abs_err, le: 1.0e-6}
  - id: mechanism
    description: a doubling run beside a control
    formulas: [double]
    kind: mechanism
    tier: math
    check: toy.mechanism
    dtypes: [float32]
    cases: 1
    expect:
      - metric: max_abs_err
        le: 1.0e-6
mutants:
  - id: off-by-a-bit
    description: adds 1e-3 to every output
    mutant: toy.off_by_a_bit
    killed_by: [double-value, mechanism]
budget:
  seeds: [1, 2, 3]
  max_seeds: 3
  max_updates_per_seed: 0
  max_tokens_per_seed: 0
  max_wall_seconds: 120
  downloads: false
paper_results:
  label: paper-reported
  results: []
promotion:
  review: DONE   # reviewed by hand
  state: "not-promoted"    # the gate decides; promote rewrites only this value
  reasons:
    - 'toy: nothing to promote yet'
  requires:
    review: DONE
    devices: [cpu]
    all_budget_seeds: true
    mutants_killed: true
    formal_comparison: true
"""

# methods/toy/__init__.py for a copied project: a real registered method the real runner can check.
TOY_PACKAGE = '''\
"""A toy method for the gate tests: doubling, a check, a mechanism check with comparisons, one mutant."""

from engine.spec import registry


def double(x):
    return 2 * x


IMPL = registry.implementation("toy", double=double)


@registry.check("toy.double_value")
def double_value(impl, ctx):
    x = ctx.randn(ctx.cases, g=ctx.generator())
    return {"max_abs_err": (impl.double(x).double() - 2 * x.double()).abs().max().item()}


@registry.check("toy.mechanism")
def mechanism(impl, ctx):
    x = ctx.randn(4, g=ctx.generator(1))
    err = (impl.double(x).double() - 2 * x.double()).abs().max().item()
    ctx.record_step(step=1, err=err)
    # formal: the method ahead on every seed, by a seed-dependent margin (a real spread, so a real CI)
    ctx.record_comparison("val-acc", "toy", "control", [0.8 + 0.01 * (ctx.seed % 5)], [0.5], "accuracy",
                          formal=True)
    # diagnostic: the method behind; the gate must never count it
    ctx.record_comparison("diag", "toy", "control", [0.1], [0.9], "accuracy", formal=False)
    return {"max_abs_err": err}


@registry.mutant("toy.off_by_a_bit", base="toy")
def off_by_a_bit():
    return IMPL.replace("toy.off_by_a_bit", double=lambda x: 2 * x + 1e-3)
'''

TOY_NAMES = registry.StaticNames(
    implementations=MappingProxyType({"toy": ("double",)}),
    checks=frozenset({"toy.double_value", "toy.mechanism"}),
    mutants=MappingProxyType({"toy.off_by_a_bit": "toy"}),
    files=(),
)

CONTRACTS = {"double-value": ("double-value", ["float64", "float32"]), "mechanism": ("mechanism", ["float32"])}


def make_layout(tmp: Path, spec_text: str = SPEC_TEXT) -> tuple[Path, Path, Path]:
    """(root, specs_dir, receipts_dir): a checkout with one bound source file, the toy spec and an empty store
    (a store that is not there is a usage error for every reading verb)."""
    root = tmp / "repo"
    (root / "src").mkdir(parents=True)
    (root / "src" / "toy.py").write_text("def double(x):\n    return 2 * x\n")
    specs = root / "specs"
    specs.mkdir()
    (specs / "toy.yaml").write_text(spec_text)
    (root / "receipts").mkdir()
    return root, specs, root / "receipts"


def toy_project(tmp: Path, monkeypatch) -> tuple[Path, Path, Path]:
    """make_layout in `tmp`, as the commands will see it: the static registry knows the toy names and the project
    root is `tmp`'s checkout. Returns (root, specs, receipts)."""
    monkeypatch.setattr(registry, "_STATIC", TOY_NAMES)
    root, specs, receipts = make_layout(tmp)
    monkeypatch.setattr("engine.paths.project_root", lambda: root)
    return root, specs, receipts


def predicate(spec_path: Path, *, device: str = "cpu", seeds=(1, 2, 3), fail=(), mutants=None,
              comparisons=None, errors=(), status: str | None = None, created_at: str | None = None,
              spec_state: str = "not-promoted", seed_source: str | None = None) -> dict:
    """A predicate shaped like engine.run.runner's. `fail` holds (contract, seed, dtype) cells that failed;
    `comparisons` maps seed -> list of comparison dicts for the mechanism contract."""
    results = []
    for cid, (_, dtypes) in CONTRACTS.items():
        for seed in seeds:
            for dtype in dtypes:
                bad = (cid, seed, dtype) in fail
                results.append({
                    "contract": cid, "kind": "value", "check": f"toy.{cid}", "seed": seed, "dtype": dtype,
                    "status": "failed" if bad else "passed", "measurements": {"max_abs_err": 1.0 if bad else 0.0},
                    "expectations": [{"metric": "max_abs_err", "op": "le", "threshold": 1e-6, "tolerance_source": "spec",
                                      "value": 1.0 if bad else 0.0, "margin": -1.0 if bad else 1e-6,
                                      "passed": not bad}],
                    "message": "max_abs_err = 1.0 not le 1e-06" if bad else None, "cases_requested": 8,
                    "wall_s": 0.001, "cost": {"optimizer_updates": 0, "sampled_tokens": 0}})
    mutants = {"off-by-a-bit": True} if mutants is None else mutants
    mut = [{"id": mid, "mutant": "toy.off_by_a_bit", "description": "adds 1e-3", "expected_killers": list(CONTRACTS),
            "killed_by": list(CONTRACTS) if killed else [], "killed": killed, "seed": seeds[0], "results": []}
           for mid, killed in mutants.items()]
    killed_any = any(mutants.values())
    mechanism = []
    for seed, comps in (comparisons or {}).items():
        mechanism.append({"contract": "mechanism", "seed": seed, "dtype": "float32", "steps": [{"step": 1}],
                          "comparisons": comps})
    raw = R.sha256_file(spec_path)
    return {
        "schema": "paper-contracts/receipt/v1", "created_at": created_at or R.utc_now(), "finished_at": R.utc_now(),
        "git": {"commit": "0" * 40, "dirty": False}, "method": "toy",
        "implementation": {"name": "toy", "files": ["src/toy.py"]},
        "spec": {"name": f"specs/{spec_path.name}", "sha256": raw, "spec_version": 1, "level": "L1",
                 "implementation": "toy", "review": "DONE", "promotion_state": spec_state},
        "environment": {"python": "3.11", "torch": "2.x", "platform": "Linux-x86_64",
                        "device": {"kind": device, "index": 0 if device == "cuda" else None,
                                   "name": "Fake GPU" if device == "cuda" else "cpu", "cuda": None, "capability": None},
                        "torch_threads": 1},
        "request": {"device": device, "seeds": list(seeds), "only": None, "contracts": list(CONTRACTS),
                    "mutants": list(mutants), **({"seed_source": seed_source} if seed_source else {})},
        "actual": {"seeds": list(seeds), "results": len(results), "cases": 0, "mutants_run": len(mut)},
        "results": results, "mutants": mut,
        "contracts_proven": {cid: (list(mutants) if killed_any else []) for cid in CONTRACTS},
        "unproven_contracts": [] if killed_any else list(CONTRACTS),
        "mechanism": mechanism, "budget": {}, "cost": {"wall_s": 0.1},
        "summary": {"contracts": {}, "results": {}, "mutants": {}},
        "errors": list(errors),
        "status": status or ("failed" if fail or not all(mutants.values()) else "passed"),
    }


def comparison(method_value: float, control_value: float, formal: bool = True, name: str = "val-acc") -> dict:
    return {"name": name, "metric": "accuracy", "method": "toy", "control": "control",
            "method_values": [method_value], "control_values": [control_value], "formal": formal, "note": ""}


def ahead(seeds=(1, 2, 3)) -> dict:
    """Formal comparisons with the method clearly ahead on every seed."""
    return {s: [comparison(0.8 + 0.01 * s, 0.5)] for s in seeds}


def write(root: Path, receipts: Path, spec_path: Path, extra: tuple[str, ...] = (), sign_key: Path | None = None,
          **kw) -> Path:
    """Write one genuine receipt binding src/toy.py, the spec and any `extra` repository files (signed with
    `sign_key` when given)."""
    names = ["src/toy.py", *extra]
    subject = [{"name": n, "digest": {"sha256": R.sha256_file(root / n)}} for n in names]
    subject.append({"name": f"specs/{spec_path.name}", "digest": {"sha256": R.sha256_file(spec_path)}})
    return R.write_receipt(receipts, R.statement(sorted(subject, key=lambda s: s["name"]), predicate(spec_path, **kw)),
                           sign_key=sign_key)


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def approve(root: Path, specs: Path, receipts: Path, sign_key: Path | None = None, name: str = "toy.yaml",
            reviewer: str = "R. Viewer") -> dict:
    """Record a review of the spec as it is now in the store's ledger (as `contracts review --approve` does)."""
    from engine.gate import review
    from engine.spec.loader import load_spec

    return review.record(load_spec(specs / name, root), receipts, reviewer, "checked the tolerances", sign_key)


GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def commit_all(root: Path, message: str = "copy") -> Path:
    """Make `root` a git repository whose one commit holds every file in it; returns `root`."""
    env = {**os.environ, **GIT_ENV}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", message]):
        subprocess.run(cmd, cwd=root, check=True, env=env, capture_output=True)
    return root


def contracts(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`contracts ARGS` in a fresh process in `cwd`, on that project's specs and receipts (not the environment's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CONTRACTS_SPECS", "CONTRACTS_RECEIPTS")}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=timeout)
