"""The evaluator an OpenEvolve evaluator file (`contracts evolve-evaluator`) calls: one candidate, one stage.

`Evaluator.stage(k, program_path)`:

1. identifies the candidate as `contracts check --impl` does (its file's sha256; nothing of it is run here);
2. draws the stage's seeds: by default fresh from the operating system for every candidate and stage (a
   candidate cannot know them, so it cannot recognise its check by them; each receipt records them), or the
   seeds it was given (`seeds=[...]`, or `seeds="budget"` for the spec budget's);
3. reads back, from the receipt files themselves, the receipts this process wrote for exactly these bytes
   (engine.store.verify.assess: integrity, freshness, and the signature under a trust policy; no cache):
   the cells they hold need not run again (a later stage still needs the cells of the stages before it, on
   their seeds, and reuses their receipts);
4. runs the cells the stage still needs in isolated workers forked from a warm server
   (engine/run/warm.py), and writes one receipt (signed, with a key) for them, as `check --impl` would,
   with no mutant phase: the spec's mutants prove the contracts, `contracts check --impl` proves them
   on a candidate, and neither depends on which candidate evolve proposes;
5. judges the stage from the usable receipts only (engine/evolve/score.py) and returns OpenEvolve's
   EvaluationResult: metrics with combined_score, artifacts naming each broken contract with its
   measured value against its tolerance and the receipt ids.

A stage never raises for anything the candidate does: a missing function, a syntax error, a crash, a hang or
sys.exit becomes combined_score 0 with the reason in the artifacts.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import OrderedDict
from pathlib import Path
from typing import Any

from engine import paths as _paths
from engine.errors import EnvironmentProblem, UsageError
from engine.evolve import score as SC
from engine.evolve import stages as S

MAX_CANDIDATES = 512  # receipts remembered per process, by candidate digest (only to find them again)

_WRITTEN: "OrderedDict[tuple, list[Path]]" = OrderedDict()  # (store, candidate digest) -> receipt files
_DRAWN: "OrderedDict[tuple, dict[int, list[int]]]" = OrderedDict()  # (store, digest) -> {stage: fresh seeds}
_SIGNERS: dict[tuple, Any] = {}
_LOCK = threading.Lock()


class _Plain:
    """Stand-in for openevolve.evaluation_result.EvaluationResult where OpenEvolve is not installed."""

    def __init__(self, metrics: dict, artifacts: dict):
        self.metrics, self.artifacts = metrics, artifacts

    def __repr__(self) -> str:
        return f"EvaluationResult(metrics={self.metrics!r}, artifacts={sorted(self.artifacts)})"


def _result(metrics: dict, artifacts: dict):
    try:
        from openevolve.evaluation_result import EvaluationResult
    except ImportError:
        return _Plain(metrics, artifacts)
    return EvaluationResult(metrics=metrics, artifacts=artifacts)


def _remember(key: tuple, path: Path) -> None:
    with _LOCK:
        _WRITTEN.setdefault(key, []).append(path)
        _WRITTEN.move_to_end(key)
        while len(_WRITTEN) > MAX_CANDIDATES:
            _WRITTEN.popitem(last=False)


def _written(key: tuple) -> list[Path]:
    with _LOCK:
        return list(_WRITTEN.get(key, []))


def _drawn(key: tuple, stage: int, n: int) -> dict[int, list[int]]:
    """The fresh seeds of each stage drawn so far for this candidate, drawing `n` for `stage` if it has none."""
    from engine.run import seeds as seeds_mod

    with _LOCK:
        stages = _DRAWN.setdefault(key, {})
        if stage not in stages:
            stages[stage] = seeds_mod.draw(n)
        _DRAWN.move_to_end(key)
        while len(_DRAWN) > MAX_CANDIDATES:
            _DRAWN.popitem(last=False)
        return {k: list(v) for k, v in stages.items()}


class Evaluator:
    """Checks OpenEvolve candidates of one method against its spec; see the module docstring."""

    def __init__(self, method: str, *, specs: str | os.PathLike | None = None,
                 receipts: str | os.PathLike | None = None, device: str = "cpu", seeds: list[int] | None = None,
                 timeout_s: float | None = None,
                 memory_mb: int | None = None, jobs: int | None = None, threads: int | None = None,
                 sign_key: str | os.PathLike | None = None, sign_command: str | None = None,
                 trust: str | os.PathLike | None = None, sandbox: bool = True, strict: bool = True):
        from engine.run.devices import parse_device
        from engine.spec.loader import check_key

        self.method = check_key(method)
        self.specs_dir = Path(specs) if specs else _paths.default_specs_dir()
        self.receipts_dir = Path(receipts) if receipts else _paths.default_receipts_dir()
        parse_device(device)
        self.device = device
        # None or "fresh": drawn from the OS for every candidate and stage; "budget": the spec budget's; or a list
        if seeds is None or seeds in ("fresh", "random"):
            self.seeds: "list[int] | str" = "fresh"
        elif seeds == "budget":
            self.seeds = "budget"
        else:
            self.seeds = [int(x) for x in seeds]
            if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
                raise UsageError(f"seeds {seeds!r}: give distinct non-negative integers, 'fresh' or 'budget'")
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.jobs = jobs if jobs else max(1, min(2, os.cpu_count() or 1))
        self.threads = threads
        self.sign_key = Path(sign_key) if sign_key else None
        self.sign_command = sign_command
        self.trust = Path(trust) if trust else None
        self.sandbox = bool(sandbox)  # each candidate in a bubblewrap sandbox of its own (engine/run/sandbox.py)
        self.strict = bool(strict)  # screen the source first (engine/evolve/screen.py)
        self._pool = None
        self._bare_pool = None

    # -- OpenEvolve's entry points --------------------------------------------------------

    def evaluate(self, program_path: str):
        """Every contract (OpenEvolve without a cascade): what stage 3 needs."""
        return self.stage(S.FULL, program_path)

    def stage(self, k: int, program_path: str):
        """OpenEvolve's evaluate_stage{k}(program_path): metrics and artifacts; never raises for the candidate."""
        t0 = time.perf_counter()
        try:
            metrics, artifacts = self.check(k, program_path, t0)
        except (UsageError, EnvironmentProblem) as exc:  # the candidate (or this set-up) cannot be checked
            metrics, artifacts = self._unchecked(k, str(exc), t0)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - a bug here must not pass a candidate: it scores 0, loudly
            print(f"paper-contracts evaluator: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
            traceback.print_exc()
            metrics, artifacts = self._unchecked(k, f"internal error in the evaluator: {type(exc).__name__}: {exc}", t0)
        return _result(metrics, artifacts)

    # -- the work -------------------------------------------------------------------------

    def check(self, k: int, program_path: str, t0: float | None = None) -> tuple[dict, dict]:
        """(metrics, artifacts) for stage k of the candidate at program_path."""
        from engine.run.impl_loader import identity, parse_target

        t0 = time.perf_counter() if t0 is None else t0
        if k not in S.STAGES:
            raise UsageError(f"stage {k!r}: OpenEvolve's cascade here has stages {', '.join(map(str, S.STAGES))}")
        if self.sandbox:
            # its imports (torch) overlap with ours on the first call
            self._sandboxes().prestart(loop=True)
        else:
            self._bare().prestart(loop=True)
        spec = self._spec()
        target = parse_target(str(program_path))
        ident = identity(target)
        if self.strict:
            from engine.evolve.screen import screen

            refusal = screen(target.path) if target.form == "file" else \
                f"{target.shown}: strict screens a candidate's source file; give the program's .py path"
            if refusal:
                return self._unchecked(k, f"refused by the strict screen: {refusal}", t0)
        policy = self._policy()
        kind = self.device.split(":")[0]
        seeds, needed = self._needed(spec.data, ident, k)
        evidence, refused = self._evidence(ident, kind, policy)
        verdict = SC.judge(spec.data, k, evidence, seeds, needed=needed)
        written: list[str] = []
        if verdict.missing and not verdict.broken:
            for path, rid in self._run(spec, target, ident, verdict.missing):
                written.append(rid)
                _remember(self._key(ident), path)
                # The receipts read above were read for this verdict a moment ago; the new one is read back now.
                more, why = self._evidence(ident, kind, policy, [path])
                evidence, refused = evidence + more, refused + why
            verdict = SC.judge(spec.data, k, evidence, seeds, needed=needed)
        return SC.report(spec, k, verdict, evidence, refused, time.perf_counter() - t0, written, seeds,
                         fresh=self.seeds == "fresh")

    def _needed(self, spec_data: dict, ident: dict, k: int) -> tuple[list[int], list]:
        """(stage k's seeds, the cells stage k needs). Fresh seeds: stage k's own draw, and the cells of every
        earlier stage already drawn for this candidate on that stage's seeds (a later stage never forgets an
        earlier one's cells)."""
        if self.seeds != "fresh":
            seeds = list(spec_data["budget"]["seeds"]) if self.seeds == "budget" else list(self.seeds)
            return S.seeds_for(spec_data, k, seeds), S.cells(spec_data, k, seeds)
        n = len(spec_data["budget"]["seeds"])
        drawn = _drawn(self._key(ident), k, 1 if k == 1 else n)
        needed: list = []
        for j in sorted(st for st in drawn if st <= k):
            needed += [c for c in S.cells(spec_data, j, drawn[j]) if c not in needed]
        return drawn[k], needed

    def _sandboxes(self):
        """Fresh sandboxes for this evaluator's candidates, a spare kept started (no candidate ever shares one)."""
        from engine.run import sandbox

        sandbox.require(False)  # without bwrap: EnvironmentProblem, and the stage scores 0 saying so
        with _LOCK:
            if self._pool is None:
                self._pool = sandbox.Pool(sandbox.hidden_paths(self.receipts_dir, self.sign_key, self.sign_command,
                                                               self.trust), self.device, spare=True)
            return self._pool

    def _bare(self):
        """Without the sandbox: fresh call-loop processes, a spare kept started (the same boundary, no bwrap)."""
        from engine.run import sandbox

        with _LOCK:
            if self._bare_pool is None:
                self._bare_pool = sandbox.Pool(None, self.device, spare=True)
            return self._bare_pool

    def _unchecked(self, k: int, why: str, t0: float) -> tuple[dict, dict]:
        metrics = {"combined_score": 0.0, f"stage{k}_passed": 0.0, "cells_passed": 0.0, "contracts_broken": 0.0,
                   "eval_seconds": round(time.perf_counter() - t0, 3)}
        head = f"{self.method} stage {k}: NOT CHECKED; combined_score 0: {why}"
        return metrics, {"verdict": head, f"stage{k}_verdict": head, "not_checked": why}

    def _key(self, ident: dict) -> tuple:
        """Receipts count only in the store this evaluator writes to, and only for these exact bytes."""
        return str(self.receipts_dir.resolve()), ident["digest"]

    def _spec(self):
        """The spec, validated; parsed again only when its bytes change (engine/spec/memo.py)."""
        from engine.paths import spec_path
        from engine.spec.memo import validate_file

        path = spec_path(self.specs_dir, self.method)
        try:
            raw = path.read_bytes()
        except OSError as err:
            raise UsageError(f"{path}: cannot read the spec: {err.strerror}") from None
        spec, errors = validate_file(path, _paths.project_root(), raw=raw)
        if errors:
            raise errors[0]
        return spec

    def _policy(self):
        from engine.store.trust import policy_from_option

        return policy_from_option(self.trust, self.receipts_dir)

    def _signer(self):
        from engine.store.signing import KeyProblem, usable_signer

        key = (self.sign_key, self.sign_command, os.environ.get("CONTRACTS_SIGNING_KEY"),
               os.environ.get("CONTRACTS_SIGN_COMMAND"))
        with _LOCK:
            if key in _SIGNERS:
                return _SIGNERS[key]
        try:
            signer = usable_signer(self.sign_key, self.sign_command)  # proven once per process, never read here
        except KeyProblem as err:
            raise UsageError(f"signing: {err}") from None
        with _LOCK:
            _SIGNERS[key] = signer
        return signer

    def _evidence(self, ident: dict, kind: str, policy, paths: list[Path] | None = None
                  ) -> tuple[list[SC.Evidence], list[str]]:
        """The receipts written here for this candidate's exact bytes (or `paths`) that may count, each read and
        judged from its file: integrity, freshness, and its signature under a trust policy."""
        from engine.store.verify import assess

        root = _paths.project_root()
        out, refused = [], []
        for path in _written(self._key(ident)) if paths is None else paths:
            a = assess(path, root, self.specs_dir, display=f"{path.parent.name}/{path.name}",
                       folder_method=self.method, policy=policy)
            why = SC.usable(a, ident, kind, policy)
            if why is None:
                out.append(SC.Evidence(file=a.file, receipt_id=a.receipt_id, predicate=a.predicate))
            else:
                refused.append(f"receipt {a.file} does not count: {why}")
        return out, refused

    def _run(self, spec, target, ident: dict, missing: list) -> list[tuple[Path, str]]:
        """Run the contracts with missing cells (whole contracts x seeds), at most the budget's max_seeds seeds
        per receipt, and write their receipts."""
        wanted = list(dict.fromkeys(s for _c, s, _d in missing))
        step = int(spec.data["budget"]["max_seeds"])
        out = []
        for i in range(0, len(wanted), step):
            chunk = set(wanted[i:i + step])
            out.append(self._run_one(spec, target, ident, [c for c in missing if c[1] in chunk]))
        return out

    def _run_one(self, spec, target, ident: dict, missing: list) -> tuple[Path, str]:
        """Run the contracts with missing cells (whole contracts x seeds) and write their receipt."""
        from engine.run.devices import default_threads, resolve_device
        from engine.run.isolation import DEFAULT_MEMORY_MB, CandidateSession, Unit, _lost, make_runner
        from engine.run.runner import build_statement, plan_run
        from engine.spec.interface import from_spec
        from engine.spec.registry import known_names
        from engine.store.receipts import ensure_writable, utc_now, write_receipt

        contracts = list(dict.fromkeys(cid for cid, _s, _d in missing))
        seeds = list(dict.fromkeys(s for _c, s, _d in missing))
        plan = plan_run(spec, seeds, contracts, mutants=False)
        if self.seeds == "fresh":
            plan.seed_source = "fresh"  # drawn by this evaluator from the OS (engine/run/seeds.py), not given
        dev = resolve_device(self.device)
        ensure_writable(self.receipts_dir)
        signer = self._signer()
        budget = spec.data["budget"]
        deadline = self.timeout_s or float(budget.get("per_contract_timeout_seconds") or 60)
        names = list(from_spec(spec.data, known_names().implementations.get(spec.data["implementation"])).names)
        # the init `check --impl` sends its worker (engine.run.isolation.run_candidate), field for field
        init = {"type": "init", "method": spec.key, "shown": ident["target"], "name": f"impl:{ident['target']}",
                "implementation": spec.data["implementation"],
                "names": names, "device": str(dev), "threads": default_threads(self.device, self.threads),
                "memory_mb": DEFAULT_MEMORY_MB if self.memory_mb is None else self.memory_mb,
                "budget": dict(budget),
                "target": {"form": target.form, "path": str(target.path) if target.path else None,
                           "module": target.module, "attribute": target.attribute,
                           "framework": getattr(target, "framework", None), "name": getattr(target, "name", None)}}
        created = utc_now()
        runner = make_runner(plan, dev, ident)
        runner.candidate_mutants = []
        from engine.run import sandbox

        # The candidate's functions in a process of their own (a fresh sandbox from the pool, its spare started),
        # the checks here; contracts whose arguments cannot cross run beside it (the receipt lists them).
        hidden = self._sandboxes().hidden if self.sandbox else None
        conf = sandbox.confine(ident, target, hidden, str(dev), pool=self._pool if self.sandbox else self._bare())
        session = CandidateSession(runner, init, conf, deadline, framework=target.form == "framework")
        lost: list[str] = []
        ran: list[dict] = []
        stopped: str | None = None
        try:
            session.probe()
            # Cheap contracts first, and none after the first that breaks: the score is 0 whatever else holds, and
            # a broken candidate (half of what an LLM writes) then costs the price of its cheapest failure.
            for c in sorted(plan.contracts, key=S.cost_rank):
                if stopped is not None:
                    break
                ran.append(c)
                calls = [{"contract": c, "seed": s, "dtype": d, "record_mechanism": True}
                         for s in plan.seeds for d in c["dtypes"]]
                if lost:  # a hanging candidate costs one deadline, not one per contract
                    runner.results += [_lost(call, f"not run: an earlier call of this candidate lost its worker "
                                                   f"({lost[0]})") for call in calls]
                    continue
                unit = Unit(label=c["id"], calls=calls)
                session.run(unit, c, lambda r: None, record_mechanism=True)
                runner.results += unit.results
                lost += [r["message"][len("no measurement: "):] for r in unit.results
                         if r["status"] == "error" and str(r.get("message")).startswith("no measurement: ")][:1]
                if any(r["status"] != "passed" for r in unit.results):  # it breaks a cell: the score is 0
                    stopped = c["id"]
        finally:
            session.close()  # the candidate and all it started are gone before its receipt is built and signed
        skipped = [c["id"] for c in plan.contracts if c not in ran]
        if skipped:  # the receipt requests what ran, and says why the rest did not
            kept = runner.plan  # the candidate's plan (engine.run.runner.for_candidate), which the receipt reads
            kept.contracts = [c for c in kept.contracts if c["id"] in {r["id"] for r in ran}]  # the spec's order
            kept.only = [c["id"] for c in kept.contracts]
        runner.isolation = session.record()
        if skipped:
            runner.isolation["stopped_early"] = {"broken": stopped, "not_run": skipped}
        if session.load_failure:
            runner.errors.append(f"the candidate could not be run: {session.load_failure}")
        runner.errors += [f"isolation: {n}" for n in session.notes]
        stmt = build_statement(runner, created)
        path = write_receipt(self.receipts_dir, stmt, sign_key=signer)  # the workers have finished
        return path, stmt["predicate"]["receipt_id"]


__all__ = ["Evaluator"]
