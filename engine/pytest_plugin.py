"""pytest plugin: `pytest --contracts specs/` runs a spec's contracts and mutants as test items.

Registered through the `pytest11` entry point (pyproject.toml), so it loads in
every pytest run where paper-contracts is installed; without `--contracts` it
collects nothing and imports neither torch nor the runner.

It is thin: each item calls the engine's own `Runner.call` / `Runner.run_mutants`
and, when a spec's last item is done, writes the very receipt `contracts check`
writes (`engine.run.session.write`). Items:

    specs/tapo-trajectory.yaml::eq15_local_gradient        every seed and dtype of one contract
    specs/tapo-trajectory.yaml::mutant[prefix_grad_leak]   the mutant is killed by a contract that names it

Each item's location is the spec line of its contract or mutant; a failure
shows, per seed and dtype, the measured value against the limit and the headroom;
measurements are recorded as `user_properties`, which `--junitxml` writes as
JUnit properties. `-k`/deselection selects contracts like `contracts check --only`.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any, Iterable

import pytest

from engine.errors import ContractsError
from engine.text import term_safe

_SPEC_SUFFIXES = (".yaml", ".yml")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("contracts", "paper-contracts: paper method contracts as tests")
    group.addoption("--contracts", action="store_true", default=False,
                    help="collect method specs (*.yaml in a specs/ folder, or spec files named on the command "
                         "line) as contract tests; with no path, every spec in specs/")
    group.addoption("--contracts-device", default="cpu", metavar="DEVICE",
                    help="cpu, cuda or cuda:N (never falls back); default cpu")
    group.addoption("--contracts-seeds", default=None, metavar="SEEDS",
                    help="comma-separated seeds (default: each spec budget's)")
    group.addoption("--contracts-receipts", default=None, metavar="DIR",
                    help="receipt store (default: receipts/, as contracts check)")
    group.addoption("--contracts-policy", default=None, metavar="hf:PATH",
                    help="train mechanism runs on a local Hugging Face checkpoint (as contracts check --policy)")
    group.addoption("--contracts-lora-rank", default=None, type=int, metavar="RANK",
                    help="LoRA rank for --contracts-policy (default 8; 0 trains every weight)")
    group.addoption("--contracts-sign-key", default=None, metavar="KEY",
                    help="sign each receipt with this ed25519 key (default: $CONTRACTS_SIGNING_KEY; as contracts "
                         "check --sign-key: only a separate signing process reads it)")


class _Options:
    """What --contracts-* asked for, checked once at configure time."""

    def __init__(self, config: pytest.Config):
        from engine.run.devices import parse_device
        from engine.paths import default_receipts_dir

        opt = config.option
        self.device_text = opt.contracts_device
        parse_device(self.device_text)
        self.seeds = _parse_seeds(opt.contracts_seeds)
        self.receipts = Path(opt.contracts_receipts) if opt.contracts_receipts else default_receipts_dir()
        self.policy_text = opt.contracts_policy
        self.lora_rank = opt.contracts_lora_rank
        if self.policy_text is None and self.lora_rank is not None:
            raise ContractsError("--contracts-lora-rank applies to --contracts-policy hf:PATH")
        if self.policy_text is not None:
            from engine.run.policy import check_policy

            check_policy(self.policy_text)
        from engine.store.signing import KeyProblem, usable_signer

        try:  # before any check runs, in a process of its own (this one will run method code)
            key = opt.contracts_sign_key
            self.sign_key = usable_signer(Path(key) if key else None)
        except KeyProblem as err:
            raise ContractsError(f"--contracts-sign-key: {err}") from None
        self._device = None
        self._policy = None
        self.written: list[tuple[str, str, str]] = []  # (method, status, receipt path)

    def device(self):
        if self._device is None:
            from engine.run.devices import resolve_device

            self._device = resolve_device(self.device_text)
        return self._device

    def policy(self):
        if self.policy_text is not None and self._policy is None:
            from engine.run.policy import load_policy

            self._policy = load_policy(self.policy_text, self.lora_rank)
        return self._policy


_OPTIONS = pytest.StashKey[_Options]()
_OLD_SIGTERM = pytest.StashKey[Any]()
_OLD_THREADS = pytest.StashKey[int]()


def _parse_seeds(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or any(s < 0 for s in seeds):
        raise ContractsError(f"--contracts-seeds {text!r}: give comma-separated non-negative integers, e.g. 42,43,44")
    return seeds


def pytest_configure(config: pytest.Config) -> None:
    if not config.option.contracts:
        return
    # A spec's receipt is written by the process that ran all its items; pytest-xdist workers would each write a
    # partial one. So --contracts runs here even where addopts asks for workers (this project's own does): xdist
    # decides in its own pytest_configure, which runs after this one (trylast).
    if getattr(config.option, "dist", "no") != "no":
        config.option.dist, config.option.tx, config.option.numprocesses = "no", [], 0
    try:
        opts = _Options(config)
        opts.device()  # --contracts-device cuda on a machine without CUDA stops here, not mid-run
        import torch

        from engine.run.devices import default_threads

        threads = default_threads(opts.device_text)  # the receipt `contracts check` writes records the same
        if threads is not None:
            config.stash[_OLD_THREADS] = torch.get_num_threads()
            torch.set_num_threads(threads)
        from engine.store.receipts import ensure_writable

        ensure_writable(opts.receipts)
    except ContractsError as exc:
        raise pytest.UsageError(exc.line()) from None
    config.stash[_OPTIONS] = opts
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        from engine.paths import default_specs_dir

        config.args = [str(default_specs_dir())]  # `pytest --contracts` alone: every spec
    # SIGTERM (a CI timeout) becomes an interrupt, so the receipt is still written, marked interrupted.
    try:
        config.stash[_OLD_SIGTERM] = signal.signal(signal.SIGTERM, _sigterm)
    except ValueError:  # not the main thread: signals cannot be handled here
        pass


def _sigterm(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OLD_SIGTERM in config.stash:
        signal.signal(signal.SIGTERM, config.stash[_OLD_SIGTERM])
    if _OLD_THREADS in config.stash:
        import torch

        torch.set_num_threads(config.stash[_OLD_THREADS])


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    config = parent.config
    if _OPTIONS not in config.stash or file_path.suffix not in _SPEC_SUFFIXES:
        return None
    if file_path.parent.name == "specs" or file_path.resolve() in _named_files(config):
        return SpecFile.from_parent(parent, path=file_path)
    return None


def _named_files(config: pytest.Config) -> set[Path]:
    base = Path(config.invocation_params.dir)
    return {(base / a.split("::")[0]).resolve() for a in config.args}


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:  # noqa: ARG001
    opts = config.stash.get(_OPTIONS, None)
    if opts is None or not opts.written:
        return
    terminalreporter.section("contracts receipts")
    for method, status, path in opts.written:
        terminalreporter.write_line(term_safe(f"{method}: {status}  {path}"))


# --- collection -------------------------------------------------------------------


class SpecFile(pytest.File):
    """One spec: an item per contract, then an item per mutant; the receipt is written at teardown."""

    def collect(self) -> Iterable[pytest.Item]:
        from engine.spec.loader import validate_file

        spec, errors = validate_file(self.path, self.config.rootpath)
        if errors:  # a broken spec is an error, never skipped
            raise self.CollectError("\n".join(term_safe(e.line()) for e in errors))
        self.spec = spec
        self.run: _SpecRun | None = None
        for i, c in enumerate(spec.data["contracts"]):
            yield ContractItem.from_parent(self, name=c["id"], contract=c, line=spec.locate(["contracts", i])[0])
        for i, m in enumerate(spec.data["mutants"]):
            yield MutantItem.from_parent(self, name=f"mutant[{m['id']}]", mutant=m,
                                         line=spec.locate(["mutants", i])[0])

    def spec_run(self) -> "_SpecRun":
        if self.run is None:
            mine = [it for it in self.session.items if it.parent is self]
            self.run = _SpecRun(self, self.config.stash[_OPTIONS], mine)
        return self.run

    def teardown(self) -> None:
        run, self.run = getattr(self, "run", None), None
        if run is not None:
            run.finish()


class _SpecItem(pytest.Item):
    def __init__(self, *, line: int | None, **kwargs: Any):
        super().__init__(**kwargs)
        self.line = line

    def reportinfo(self):
        return self.path, (self.line - 1 if self.line else None), self.name

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, (ContractFailed, ContractsError)):
            text = excinfo.value.args[0] if isinstance(excinfo.value, ContractFailed) else excinfo.value.line()
            shown = self.parent.spec.display
            where = f"{shown}:{self.line}" if self.line else shown
            return term_safe(f"{where}: {text}", keep_newlines=True)  # receipt/spec text: data, never escapes
        return super().repr_failure(excinfo, style=style)


class ContractFailed(Exception):
    """A contract did not hold (or its check raised): the message is the whole report."""


class ContractItem(_SpecItem):
    def __init__(self, *, contract: dict, **kwargs: Any):
        super().__init__(**kwargs)
        self.contract = contract

    def runtest(self) -> None:
        run = self.parent.spec_run()
        results = run.baseline(self.contract["id"])
        run.done(self)
        for r in results:
            self.user_properties.extend(_properties(r))
        bad = [r for r in results if r["status"] != "passed"]
        if bad or run.stopped:
            # Worded as `contracts check` words its grouped report (engine/cli/failure_report.py).
            lines = [f"contract {self.contract['id']} ({self.contract['kind']}) did not hold: "
                     f"{len(bad)} of {len(results)} seed x dtype cells failed"]
            lines += [_result_line(r) for r in bad]
            if run.stopped:
                lines.append(f"run stopped: {run.stopped}")
            raise ContractFailed("\n".join(lines))


class MutantItem(_SpecItem):
    def __init__(self, *, mutant: dict, **kwargs: Any):
        super().__init__(**kwargs)
        self.mutant = mutant

    def runtest(self) -> None:
        run = self.parent.spec_run()
        record = run.mutant(self.mutant["id"])
        run.done(self)
        self.user_properties += [("killed", record["killed"]), ("killed_by", ",".join(record["killed_by"])),
                                 ("expected_killers", ",".join(record["expected_killers"]))]
        if not record["killed"]:
            lines = [f"mutant {record['id']} survived ({record['description']}); expected killers: "
                     f"{', '.join(record['expected_killers'])}"]
            if record.get("error"):
                lines.append(term_safe(record["error"]))
            for r in record["results"]:
                why = "baseline did not pass, so it cannot count" if not r["baseline_passed"] else r["status"]
                lines.append(f"  {r['contract']} {r['dtype']}: {why}"
                             + (f": {term_safe(r['message'])}" if r["message"] else ""))
            if run.stopped:
                lines.append(f"run stopped: {term_safe(run.stopped)}")
            raise ContractFailed("\n".join(lines))


# --- running: the engine's Runner, one item at a time ---------------------------------


class _SpecRun:
    """The Runner for one spec, fed item by item; `finish` writes the receipt."""

    def __init__(self, spec_file: SpecFile, opts: _Options, items: list):
        from engine.store.receipts import utc_now
        from engine.run.runner import Runner, plan_run

        spec = spec_file.spec
        self.opts = opts
        self.item_list = items
        self.items = {it.nodeid for it in items}
        self.finished: set[str] = set()
        mutant_ids = {it.mutant["id"] for it in items if isinstance(it, MutantItem)}
        needed = {it.contract["id"] for it in items if isinstance(it, ContractItem)}
        for m in spec.data["mutants"]:
            if m["id"] in mutant_ids:
                needed.update(m["killed_by"])  # a kill counts only where the baseline passed
        every = [c["id"] for c in spec.data["contracts"]]
        only = None if needed == set(every) else [cid for cid in every if cid in needed]
        plan = plan_run(spec, opts.seeds, only, mutants=bool(mutant_ids))
        plan.mutants = [m for m in plan.mutants if m["id"] in mutant_ids]
        self.created = utc_now()
        self.runner = Runner(plan, opts.device(), policy=opts.policy())
        self.impl = self.runner.registry.get_implementation(spec.data["implementation"])
        self.by_id = {c["id"]: c for c in plan.contracts}
        self.ran: dict[str, list[dict]] = {}
        self.stopped: str | None = None

    def _guard(self, fn):
        """Budget and interrupts end the run as `Runner.run` ends it."""
        from engine.run.context import BudgetExceeded
        from engine.run.runner import FAILED, INTERRUPTED

        if self.stopped:
            return None
        try:
            return fn()
        except BudgetExceeded as exc:
            self.runner.errors.append(f"budget: {exc}")
            self.runner.status = FAILED
            self.stopped = f"budget: {exc}"
        except KeyboardInterrupt:
            self.runner.status = INTERRUPTED
            self.stopped = "interrupted"
            raise
        return None

    def baseline(self, cid: str) -> list[dict]:
        """Every seed and dtype of one contract, run once, recorded as run_baseline records them."""
        if cid not in self.ran:
            contract, out = self.by_id[cid], []
            self.ran[cid] = out

            def go():
                for seed in self.runner.plan.seeds:
                    for dtype in contract["dtypes"]:
                        r = self.runner.call(self.impl, contract, seed, dtype, record_mechanism=True)
                        self.runner.results.append(r)
                        out.append(r)

            self._guard(go)
        return self.ran[cid]

    def mutant(self, mid: str) -> dict:
        """One mutant through the engine's run_mutants, after the baselines its kills depend on."""
        plan = self.runner.plan
        (m,) = [x for x in plan.mutants if x["id"] == mid]
        for cid in m["killed_by"]:
            self.baseline(cid)
        before = len(self.runner.mutant_results)
        saved = plan.mutants
        plan.mutants = [m]
        try:
            self._guard(self.runner.run_mutants)
        finally:
            plan.mutants = saved
        if len(self.runner.mutant_results) > before:
            return self.runner.mutant_results[-1]
        return {"id": m["id"], "description": m["description"], "killed": False, "killed_by": [],
                "expected_killers": list(m["killed_by"]), "results": [], "error": "not run: " + (self.stopped or "")}

    def done(self, item) -> None:
        self.finished.add(item.nodeid)

    def finish(self) -> None:
        """Write the receipt `contracts check` would write; an unfinished run is recorded as interrupted."""
        from engine.run import session
        from engine.run.runner import INTERRUPTED
        from engine.spec.loader import display_path
        from engine.paths import project_root

        missing = self.items - self.finished
        if missing and self.runner.status is None:
            self.runner.status = INTERRUPTED
        if missing:
            self.runner.errors.append(f"interrupted: pytest ended before {len(missing)} selected item(s) ran; "
                                      "results finished so far are kept")
        stmt, path = session.write(self.runner, self.created, self.opts.receipts, self.opts.sign_key)
        pred = stmt["predicate"]
        shown = display_path(path, project_root())
        # worded as list, show and the TUI word it (engine.store.records): a -k selection reads as partial
        from engine.store.records import Receipt

        try:
            outcome = Receipt.from_statement(stmt).describe(self.runner.plan.spec).text()
        except (KeyError, TypeError, ValueError):  # the receipt is written either way; only its wording is lost
            outcome = str(pred.get("status"))
        self.opts.written.append((pred["method"], outcome, shown))
        last = next((it for it in reversed(self.item_list) if it.nodeid in self.finished), None)
        if last is not None:
            last.user_properties += [("receipt", shown), ("receipt_id", pred["receipt_id"]),
                                     ("receipt_status", pred["status"])]
        if pred["status"] not in ("passed", INTERRUPTED) and not self._any_item_failed():
            # Every item held, yet the receipt did not pass (a contract no selected mutant proved, a budget):
            # pytest must not say green where the receipt says failed.
            reasons = [f"contract {c} was not shown to fail by any selected mutant" for c in pred["unproven_contracts"]]
            reasons += pred["errors"]
            pytest.fail(term_safe(f"receipt {shown} status {pred['status']}: "
                                  + "; ".join(reasons or ["see the receipt"])),
                        pytrace=False)

    def _any_item_failed(self) -> bool:
        if any(r["status"] != "passed" for r in self.runner.results):
            return True
        return any(not m["killed"] for m in self.runner.mutant_results)


# --- reporting ------------------------------------------------------------------


def _result_line(r: dict) -> str:
    head = f"  seed {r['seed']} {r['dtype']}: {r['status']}"
    failed = [e for e in r["expectations"] if not e["passed"]]
    if not failed:
        return head + (f": {term_safe(r['message'])}" if r["message"] else "")
    from engine.run.expect import describe, format_headroom

    parts = []
    for e in failed:
        # A true statement ("max_rel_err 0.356 > limit 1e-12"), never the rule it broke written as if it held.
        text = f"{describe(e)} (tolerance from {e['tolerance_source']}"
        text += f", headroom {format_headroom(e['headroom'])})" if e.get("headroom") is not None else ")"
        if e.get("message"):
            text += f" [{term_safe(e['message'])}]"
        parts.append(text)
    return head + ": " + "; ".join(parts)


def _properties(r: dict) -> list[tuple[str, Any]]:
    """Measurements (and each expectation's margin and headroom) as JUnit properties `seed/dtype/metric`."""
    key = f"{r['seed']}/{r['dtype']}"
    props: list[tuple[str, Any]] = [(f"{key}/status", r["status"])]
    props += [(f"{key}/{m}", v) for m, v in r["measurements"].items()]
    props += [(f"{key}/{e['metric']}/margin", e["margin"]) for e in r["expectations"]]
    props += [(f"{key}/{e['metric']}/headroom", e["headroom"]) for e in r["expectations"] if e.get("headroom") is not None]
    return props
