"""`contracts`: one command per verb. Read-only verbs never import torch.

Exit codes: 0 ok / gate open; 1 a contract failed, a mutant survived, the gate
is closed or verify found a problem; 2 usage error (bad argument, bad spec,
request over budget); 3 internal error (a check raised); 4 the environment
cannot do what was asked; 5 nothing selected; 130 interrupted.
"""

from __future__ import annotations

import functools
import hashlib
import json
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from engine import errors as E
from engine.paths import default_receipts_dir, default_specs_dir, project_root, spec_path
from engine.spec import SpecError, display_path, spec_files, validate_file

app = typer.Typer(
    name="contracts",
    help="Check RL post-training implementations against their paper's math; gate their promotion.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

SpecsOpt = Annotated[Optional[Path], typer.Option("--specs", help="Folder of spec YAML files (default: specs/).")]
ReceiptsOpt = Annotated[Optional[Path], typer.Option("--receipts", help="Receipt store (default: receipts/).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout; messages go to stderr.")]
NoCacheOpt = Annotated[bool, typer.Option(
    "--no-cache", help="Decide everything from the files: read and write no <receipts>/.validation-cache.json.")]
PolicyOpt = Annotated[Optional[str], typer.Option(
    "--policy", help="Train the mechanism runs on this instead of the tiny policies: hf:PATH, a local Hugging Face "
                     "causal-LM checkpoint folder (needs the 'hf' extra; never downloads).")]
LoraRankOpt = Annotated[Optional[int], typer.Option(
    "--lora-rank", help="LoRA rank for --policy hf:PATH (default 8; 0 trains every weight).")]


def _err(text: str) -> None:
    typer.echo(text, err=True)


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """User errors become one line and their exit code; nothing reaches the user as a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from engine import cache

        cache.reset()  # each command reads the cache afresh: in tests, many commands share one process
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except E.ContractsError as exc:
            _err(f"error: {exc.line()}")
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            _err("interrupted")
            raise typer.Exit(E.EXIT_INTERRUPTED) from None
        except Exception as exc:  # a bug of ours: still one line, with where to look
            _err(f"internal error: {type(exc).__name__}: {exc} (please report this; rerun with "
                 "CONTRACTS_DEBUG=1 for the traceback)")
            import os

            if os.environ.get("CONTRACTS_DEBUG"):
                import traceback

                traceback.print_exc()
            raise typer.Exit(E.EXIT_INTERNAL) from None
        finally:
            cache.flush_all()  # whatever was validated afresh, for the next command; never fails

    return wrapper


def _dirs(specs: Optional[Path], receipts: Optional[Path]) -> tuple[Path, Path]:
    return (specs or default_specs_dir()), (receipts or default_receipts_dir())


def _print_json(data: Any) -> None:
    from engine.receipts import _json_safe

    typer.echo(json.dumps(_json_safe(data), indent=2, ensure_ascii=False))


def _console():
    from rich.console import Console

    # Piped output is read whole (logs, CI), so do not squeeze tables into 80 columns there.
    # markup=False: spec text such as "logp_loo[k]" must print as written, not as Rich markup.
    return Console(highlight=False, markup=False, width=None if sys.stdout.isatty() else 200)


def _spec_cache(receipts_dir: Path, use: bool = True):
    """The validation cache kept in the receipts store (engine/cache.py); with use=False one that lives in
    this process only, so every verdict is derived from the files."""
    from engine.cache import ValidationCache, for_store

    return for_store(receipts_dir) if use else ValidationCache(None)


def _load_valid_specs(specs_dir: Path, receipts_dir: Path) -> tuple[list, list[SpecError]]:
    files = spec_files(specs_dir)
    cache = _spec_cache(receipts_dir)
    good, bad = [], []
    for f in files:
        spec, errs = cache.validate_file(f, project_root())
        if spec is not None:
            good.append(spec)
        bad.extend(errs)
    return good, bad


# --- validate -------------------------------------------------------------


@app.command()
@handles_errors
def validate(
    paths: Annotated[Optional[list[Path]], typer.Argument(help="Spec files (default: every spec).")] = None,
    specs: SpecsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Validate specs: YAML safety, JSON Schema, registered names, cross-references."""
    specs_dir, _ = _dirs(specs, None)
    files = list(paths) if paths else spec_files(specs_dir)
    if not files:
        raise E.NothingSelected(f"no spec files in {display_path(specs_dir)}/")
    report, total = [], 0
    for f in files:
        _, errs = validate_file(f, project_root())
        total += len(errs)
        report.append({"file": display_path(f, project_root()), "valid": not errs,
                       "errors": [e.as_dict() | {"line_text": e.line()} for e in errs]})
        if not json_out:
            for e in errs:
                _err(e.line())
    if json_out:
        _print_json({"files": report, "errors": total})
    else:
        ok = sum(r["valid"] for r in report)
        _err(f"{ok}/{len(report)} spec(s) valid" + (f", {total} error(s)" if total else ""))
    if total:
        raise typer.Exit(E.EXIT_USAGE)


# --- list / show ------------------------------------------------------------


def _receipt_and_gate(spec, specs_dir: Path, receipts_dir: Path) -> dict:
    """`list` columns: the latest receipt with its freshness, and the gate verdict (same evaluation as `gate`)."""
    from engine.gate import evaluate
    from engine.verify import assess_receipts

    assessed, _ = assess_receipts(receipts_dir, project_root(), specs_dir, spec.key, cache=_spec_cache(receipts_dir))
    dated = [a for a in assessed if a.created_at]
    last = max(dated, key=lambda a: a.created_at) if dated else (assessed[-1] if assessed else None)
    latest = None if last is None else {
        "file": last.file.split("/")[-1], "state": last.state, "status": last.status, "created_at": last.created_at or "",
        "receipt_id": last.receipt_id, "count": len(assessed), "changed": last.changed}
    g = evaluate(spec, receipts_dir, project_root(), specs_dir, assessed=assessed)
    return {"latest_receipt": latest,
            "gate": {"promotable": g["promotable"], "unmet": [r["id"] for r in g["requirements"] if not r["met"]]}}


@app.command("list")
@handles_errors
def list_(specs: SpecsOpt = None, receipts: ReceiptsOpt = None, json_out: JsonOpt = False) -> None:
    """Every method: level, review, promotion state, contracts, latest receipt and its freshness, gate verdict."""
    specs_dir, receipts_dir = _dirs(specs, receipts)
    good, bad = _load_valid_specs(specs_dir, receipts_dir)
    rows = []
    for s in good:
        d = s.data
        rows.append({
            "method": s.key, "title": d["title"], "level": d["level"], "review": d["promotion"]["review"],
            "promotion": d["promotion"]["state"], "contracts": len(d["contracts"]), "mutants": len(d["mutants"]),
            **_receipt_and_gate(s, specs_dir, receipts_dir),
        })
    for e in bad:
        _err(e.line())
    if json_out:
        _print_json({"methods": rows, "invalid_specs": [e.as_dict() for e in bad]})
    else:
        from rich.table import Table

        t = Table(title=f"{len(rows)} method(s)", title_justify="left")
        for col in ("method", "level", "review", "promotion", "contracts", "mutants", "latest receipt", "gate"):
            t.add_column(col)
        for r in rows:
            lr = r["latest_receipt"]
            latest = "none" if lr is None else f"{lr['status']} ({lr['state']}) {lr['created_at'][:19]}Z"
            g = r["gate"]
            t.add_row(r["method"], r["level"], r["review"], r["promotion"], str(r["contracts"]), str(r["mutants"]),
                      latest, "open" if g["promotable"] else f"closed ({len(g['unmet'])} unmet)")
        _console().print(t)
    if bad:
        raise typer.Exit(E.EXIT_USAGE)


def _fmt_expect(e: dict) -> str:
    op = next((k for k in ("le", "lt", "ge", "gt", "eq") if k in e), None)
    text = f"{e['metric']} {op} {e[op]}" if op else f"{e['metric']} le dtype-default {e['default']}"
    return text + (f" [{e['dtype']}]" if "dtype" in e else "")


@app.command()
@handles_errors
def show(
    method: Annotated[str, typer.Argument(help="Method key, e.g. tapo-trajectory.")],
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """One method in full: formulas, assumptions, contracts, mutants, budget, paper results, receipts."""
    from engine.receipts import check_receipt, receipt_files

    specs_dir, receipts_dir = _dirs(specs, receipts)
    cache = _spec_cache(receipts_dir)
    spec = cache.load_spec(spec_path(specs_dir, method), project_root())
    d = spec.data
    recent = []
    for f in receipt_files(receipts_dir, spec.key)[-5:]:
        rc = check_receipt(f, project_root(), specs_dir, cache=cache)
        recent.append({"file": f.name, "state": rc.state, "status": rc.status, "created_at": rc.created_at})
    if json_out:
        _print_json({"spec": d, "file": spec.display, "sha256": spec.sha256, "receipts": recent})
        return
    from rich.table import Table

    con = _console()
    p = d["paper"]
    con.print(f"{spec.key}: {d['title']}", style="bold")
    con.print(f"arXiv {p['arxiv']} {p['version']} | {p['institution']} | first public {p['first_public']} | "
              f"code released: {'yes' if p['code_released'] else 'no'} | licence: {p['license'] or 'unknown'}")
    con.print(f"level {d['level']} | implementation {d['implementation']} | review {d['promotion']['review']} | "
              f"promotion {d['promotion']['state']}")
    t = Table(title="formulas", title_justify="left")
    t.add_column("id"), t.add_column("implements"), t.add_column("LaTeX")
    for f in d["formulas"]:
        t.add_row(f["id"], f["implements"], f["latex"])
    con.print(t)
    con.print("assumptions", style="bold")
    for a in d["assumptions"]:
        con.print(f"- {a['id']}: {a['text']}")
    t = Table(title="contracts", title_justify="left")
    for col in ("id", "kind", "check", "dtypes", "cases", "expect"):
        t.add_column(col)
    for c in d["contracts"]:
        t.add_row(c["id"], c["kind"], c["check"], ",".join(c["dtypes"]), str(c["cases"]),
                  "; ".join(_fmt_expect(e) for e in c["expect"]))
    con.print(t)
    t = Table(title="mutants (known-bad variants each contract set must kill)", title_justify="left")
    t.add_column("id"), t.add_column("breaks"), t.add_column("killed by")
    for m in d["mutants"]:
        t.add_row(m["id"], m["description"], ", ".join(m["killed_by"]))
    con.print(t)
    b = d["budget"]
    con.print(f"budget: seeds {b['seeds']} (max {b['max_seeds']}), <= {b['max_updates_per_seed']} "
              f"updates and {b['max_tokens_per_seed']} sampled tokens per seed, <= {b['max_wall_seconds']} s, "
              f"downloads: {b['downloads']}")
    t = Table(title="paper-reported results (NOT measured here)", title_justify="left")
    for col in ("id", "source", "model", "benchmark", "metric", "baseline", "method"):
        t.add_column(col)
    for r in d["paper_results"]["results"]:
        t.add_row(r["id"], r["source"], r["model"], r["benchmark"], r["metric"],
                  f"{r.get('baseline', '')} {r.get('baseline_value', '')}".strip(), str(r["value"]))
    con.print(t)
    con.print("promotion: " + d["promotion"]["state"], style="bold")
    for reason in d["promotion"]["reasons"]:
        con.print(f"- {reason}")
    con.print("latest receipts" + ("" if recent else ": none yet (run contracts check "
                                                                  f"{spec.key} --device cpu)"))
    for r in recent:
        con.print(f"- {r['file']}  {r['status']}  {r['state']}")


# --- check ------------------------------------------------------------------


def _parse_seeds(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise E.UsageError(f"--seeds {text!r} is not a comma-separated list of integers, e.g. 42,43,44") from None
    if not seeds or any(s < 0 for s in seeds):
        raise E.UsageError(f"--seeds {text!r}: give one or more non-negative integers")
    return seeds


class _StopFlag:
    """SIGTERM (and SIGINT) set a flag the runner checks between check calls, and interrupt the check running.

    While `hold` is set (the receipt is being built and written) a signal only
    sets the flag: the receipt is written whole, then the command exits 130.
    """

    def __init__(self) -> None:
        self.stopped = False
        self.hold = False
        self._old: dict = {}

    def __enter__(self) -> "_StopFlag":
        def handler(signum, frame):  # noqa: ARG001
            self.stopped = True
            if not self.hold:
                raise KeyboardInterrupt

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


_STOP: Optional[_StopFlag] = None
_CHECK_RAN = False  # main() may skip interpreter teardown after `check` (see main)


def stops_on_signals(fn: Callable[..., Any]) -> Callable[..., Any]:
    """SIGTERM/SIGINT mean "stop, keep what is done, exit 130" from the command's first line (torch import
    included), not only once the runner starts; the flag is `_STOP` while the command runs."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _STOP
        with _StopFlag() as stop:
            _STOP = stop
            try:
                return fn(*args, **kwargs)
            finally:
                _STOP = None

    return wrapper


@app.command()
@handles_errors
@stops_on_signals
def check(
    method: Annotated[Optional[str], typer.Argument(help="Method key (or use --all).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Check every spec.")] = False,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N. Never falls back.")] = "cpu",
    seeds: Annotated[Optional[str], typer.Option(help="Comma-separated seeds (default: the spec budget's).")] = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", help="Run only this contract id (repeatable).")] = None,
    no_mutants: Annotated[bool, typer.Option("--no-mutants", help="Skip the mutant phase (the run cannot pass).")] = False,
    policy: PolicyOpt = None,
    lora_rank: LoraRankOpt = None,
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Run (method, seed) cells in N local processes.")] = 1,
    executor: Annotated[str, typer.Option(help="local (processes on this machine) or ray (tasks on a Ray "
                                                "cluster; needs the [ray] extra).")] = "local",
    address: Annotated[Optional[str], typer.Option(help="Ray cluster address for --executor ray (default: "
                                                        "start a local Ray instance).")] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch threads per process (default: 1 on "
                                                                      "cpu, torch's own on cuda; with --jobs N at "
                                                                      "most cores / N).")] = None,
) -> None:
    """Run a method's contracts and mutants on a device; write one receipt per method."""
    global _CHECK_RAN
    _CHECK_RAN = True
    from engine.devices import default_threads, parse_device
    from engine.receipts import ensure_writable
    from engine.spec import load_spec

    specs_dir, receipts_dir = _dirs(specs, receipts)
    parse_device(device)
    seed_list = _parse_seeds(seeds)
    _check_policy_options(policy, lora_rank)
    if all_ and method:
        raise E.UsageError("give a method or --all, not both")
    if not all_ and not method:
        raise E.UsageError("name a method (e.g. contracts check tapo-trajectory) or pass --all")
    if only and all_:
        raise E.UsageError("--only selects contracts of one method; name the method instead of --all")
    if threads is not None and threads < 1:
        raise E.UsageError(f"--threads {threads}: give 1 or more")
    if all_:
        paths = spec_files(specs_dir)
        if not paths:
            raise E.NothingSelected(f"no specs in {display_path(specs_dir)}/")
    else:
        paths = [spec_path(specs_dir, method)]
    if jobs > 1 and executor == "local" and not address and policy is None:
        from engine.executors import prestart_local_workers

        # First: the workers' server imports torch and the methods (about 2 s) while this process reads the
        # specs and imports its own; the workers' imports are the --jobs run's serial part.
        prestart_local_workers()
    loaded = [load_spec(p, project_root()) for p in paths]
    from engine.imports import gc_paused

    with gc_paused():
        from engine.runner import plan_run  # imports torch from here on

    plans = [plan_run(s, seed_list, only, mutants=not no_mutants) for s in loaded]
    threads = default_threads(device, threads)
    if jobs != 1 or executor != "local" or address:
        _check_cells(plans, device, executor, jobs, address, receipts_dir, json_out, policy, threads)  # exits
    import torch

    from engine.devices import resolve_device

    dev = resolve_device(device)
    ensure_writable(receipts_dir)
    provider = _load_policy(policy, lora_rank)
    outcomes = []
    stop = _STOP
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        for plan in plans:
            outcomes.append(_run_one(plan, dev, receipts_dir, stop, json_out, provider))
            if outcomes[-1]["status"] == "interrupted" or stop.stopped:
                break
    finally:
        torch.set_num_threads(before)  # `check` called in-process (tests, the pytest plugin) leaves torch as it was
    if json_out:
        _print_json({"runs": outcomes})
    statuses = {o["status"] for o in outcomes}
    code = (E.EXIT_INTERRUPTED if "interrupted" in statuses or stop.stopped else E.EXIT_INTERNAL if "error" in statuses
            else E.EXIT_FAILED if "failed" in statuses else E.EXIT_OK)
    raise typer.Exit(code)


def _run_one(plan, dev, receipts_dir: Path, stop: _StopFlag, json_out: bool, provider=None) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.receipts import utc_now, write_receipt
    from engine.runner import Runner, build_statement

    total = sum(len(plan.seeds) * len(c["dtypes"]) for c in plan.contracts)
    by_id = {c["id"]: c for c in plan.contracts}
    total += sum(len(by_id[cid]["dtypes"]) for m in plan.mutants for cid in m["killed_by"])
    created = utc_now()
    from rich.console import Console

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    with progress:
        task = progress.add_task(f"{plan.spec.key}", total=total)

        def on_result(r: dict) -> None:
            label = f"mutant {r['mutant']} / {r['contract']}" if r["phase"] == "mutant" else \
                f"{r['contract']} seed {r['seed']} {r['dtype']}"
            progress.update(task, advance=1, description=f"{plan.spec.key}: {label} {r['status']}")

        runner = Runner(plan, dev, on_result=on_result, should_stop=lambda: stop.stopped, policy=provider)
        try:
            runner.run()
        finally:
            stop.hold = True  # from here a signal is only noted: the receipt is written whole, or not at all
    try:
        stmt = build_statement(runner, created)
        path = write_receipt(receipts_dir, stmt)
    finally:
        stop.hold = False
    pred = stmt["predicate"]
    shown = display_path(path, project_root())
    if not json_out:
        _print_summary(pred, shown)
    _note_policy(pred)
    return {"method": pred["method"], "status": pred["status"], "receipt": shown, "receipt_id": pred["receipt_id"],
            "policy": _policy_summary(pred),
            "summary": pred["summary"], "cost": pred["cost"], "unproven_contracts": pred["unproven_contracts"],
            "results": [{k: r[k] for k in ("contract", "seed", "dtype", "status", "measurements", "message")}
                        for r in pred["results"]],
            "mutants": [{k: m[k] for k in ("id", "killed", "killed_by")} for m in pred["mutants"]]}


def _print_summary(pred: dict, receipt: str) -> None:
    from rich.table import Table

    con = _console()
    t = Table(title=f"{pred['method']} on {pred['environment']['device']['name']}: {pred['status'].upper()}",
              title_justify="left")
    for col in ("contract", "kind", "passed", "failed", "error", "worst margin", "mutants killing it"):
        t.add_column(col)
    worst: dict[str, float] = {}
    kinds: dict[str, str] = {}
    for r in pred["results"]:
        kinds[r["contract"]] = r["kind"]
        for e in r["expectations"]:
            if isinstance(e.get("margin"), (int, float)):
                worst[r["contract"]] = min(worst.get(r["contract"], float("inf")), e["margin"])
    for cid, s in pred["summary"]["contracts"].items():
        w = worst.get(cid)
        t.add_row(cid, kinds.get(cid, ""), f"{s['passed']}/{s['requested']}", str(s["failed"]), str(s["error"]),
                  "" if w is None else f"{w:.3g}", ", ".join(pred["contracts_proven"].get(cid, [])) or "-")
    con.print(t)
    for r in pred["results"]:
        if r["status"] != "passed":
            _err(f"  {r['status']}: {r['contract']} seed {r['seed']} {r['dtype']}: {r['message']}")
    ms = pred["summary"]["mutants"]
    con.print(f"mutants: {ms['killed']} killed, {ms['survived']} survived")
    for m in pred["mutants"]:
        if not m["killed"]:
            _err(f"  survived: mutant {m['id']} ({m['description']}); expected killers: "
                 f"{', '.join(m['expected_killers'])}" + (f"; {m['error']}" if m.get("error") else ""))
    for cid in pred["unproven_contracts"]:
        _err(f"  unproven: contract {cid} was not shown to fail on any mutant")
    for e in pred["errors"]:
        _err(f"  {e}")
    c = pred["cost"]
    con.print(f"wall {c['wall_s']:.2f} s, {c['optimizer_updates']} optimizer updates, {c['sampled_tokens']} sampled "
              f"tokens; receipt {receipt}")


# --- check in cells: --jobs N and --executor ray (engine/executors.py) ---------------------------


def _check_cells(plans: list, device: str, executor: str, jobs: int, address: Optional[str], receipts_dir: Path,
                 json_out: bool, policy: Optional[str] = None, threads: Optional[int] = None) -> None:
    """Run every (method, seed) cell on the executor, write one merged receipt per method, exit like check."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.executors import EXECUTORS, execute
    from engine.receipts import ensure_writable

    if executor not in EXECUTORS:
        raise E.UsageError(f"--executor {executor!r} is not an executor; use {' or '.join(EXECUTORS)}")
    if jobs < 1:
        raise E.UsageError(f"--jobs {jobs}: give 1 or more processes")
    if address and executor != "ray":
        raise E.UsageError("--address names a Ray cluster; add --executor ray")
    if executor == "ray" and jobs != 1:
        raise E.UsageError("--jobs is for the local executor; Ray schedules by the cluster's CPUs and GPUs")
    if policy is not None:
        raise E.UsageError("--policy runs in one process for now; drop --jobs/--executor to check a checkpoint")
    if executor == "local":
        from engine.devices import resolve_device

        resolve_device(device)  # exit 4 here, before any worker starts; Ray workers resolve it on their node
    ensure_writable(receipts_dir)
    cells = sum(len(p.seeds) for p in plans)
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True)
    with progress, _StopFlag() as stop:
        task = progress.add_task(f"{cells} cells on {executor}", total=cells)

        def on_progress(cell, r: dict) -> None:
            what = f"mutant {r['mutant']} / {r['contract']}" if r.get("phase") == "mutant" else \
                f"{r['contract']} {r['dtype']}"
            progress.update(task, description=f"{cell.method} seed {cell.seed}: {what} {r['status']}")

        def on_cell(o) -> None:
            progress.update(task, advance=1, description=f"{o.cell.method} seed {o.cell.seed}: "
                                                         f"{'done' if o.data is not None else o.failure}")

        try:
            statements = execute(plans, device, executor=executor, jobs=jobs, address=address, threads=threads,
                                 on_progress=on_progress, on_cell=on_cell, should_stop=lambda: stop.stopped)
        except KeyboardInterrupt as exc:
            statements = getattr(exc, "statements", [])
    outcomes = [_write_merged(stmt, receipts_dir, json_out) for stmt in statements]
    if json_out:
        _print_json({"runs": outcomes})
    statuses = {o["status"] for o in outcomes}
    code = (E.EXIT_INTERRUPTED if "interrupted" in statuses or not outcomes else E.EXIT_INTERNAL
            if "error" in statuses else E.EXIT_FAILED if "failed" in statuses else E.EXIT_OK)
    raise typer.Exit(code)


def _write_merged(stmt: dict, receipts_dir: Path, json_out: bool) -> dict:
    from engine.receipts import write_receipt

    path = write_receipt(receipts_dir, stmt)
    pred = stmt["predicate"]
    shown = display_path(path, project_root())
    if not json_out:
        _print_summary(pred, shown)
    return {"method": pred["method"], "status": pred["status"], "receipt": shown, "receipt_id": pred["receipt_id"],
            "summary": pred["summary"], "cost": pred["cost"], "unproven_contracts": pred["unproven_contracts"],
            "execution": pred["execution"],
            "results": [{k: r[k] for k in ("contract", "seed", "dtype", "status", "measurements", "message")}
                        for r in pred["results"]],
            "mutants": [{k: m[k] for k in ("id", "killed", "killed_by")} for m in pred["mutants"]]}


# --- check --policy: mechanism runs on a Hugging Face checkpoint (issue 9) ------------


def _check_policy_options(policy: Optional[str], lora_rank: Optional[int]) -> None:
    """Refuse a bad --policy/--lora-rank before anything is imported or run."""
    from engine.policy import check_policy

    if policy is None:
        if lora_rank is not None:
            raise E.UsageError("--lora-rank applies to --policy hf:PATH; give the checkpoint too")
        return
    if lora_rank is not None and lora_rank < 0:
        raise E.UsageError(f"--lora-rank {lora_rank}: give 0 (train every weight) or a positive rank, e.g. 8")
    check_policy(policy)


def _load_policy(policy: Optional[str], lora_rank: Optional[int]):
    if policy is None:
        return None
    from engine.policy import load_policy

    _err(f"loading {policy} ...")
    return load_policy(policy, lora_rank)


def _policy_summary(pred: dict) -> Optional[dict]:
    p = pred.get("policy")
    if not p:
        return None
    ck = p.get("checkpoint") or {}
    return {"kind": p.get("kind"), "checkpoint": ck.get("name"), "config_sha256": ck.get("config_sha256"),
            "lora": p.get("lora"), "used_by": p.get("used_by", [])}


def _note_policy(pred: dict) -> None:
    """Say which contracts trained the given policy; a policy nothing used must not pass unnoticed."""
    p = _policy_summary(pred)
    if p is None:
        return
    lora = f"LoRA rank {p['lora']['rank']}" if p["lora"] else "all weights trained"
    if p["used_by"]:
        _err(f"policy: {p['kind']} checkpoint {p['checkpoint']} ({lora}), config sha256 "
             f"{(p['config_sha256'] or '')[:12]}, used by: {', '.join(p['used_by'])}")
    else:
        _err(f"warning: --policy was given but no selected contract of {pred['method']} builds a policy "
             "(only mechanism runs do); this receipt's results do not depend on it")


# --- verify / gate / promote / demote / schema ---------------------------------
# Read-only verbs here import nothing that imports torch (tests/test_gate.py checks it).


def _flags(specs: Optional[Path], receipts: Optional[Path]) -> str:
    """The folder options exactly as given, so a suggested command works on the same store."""
    import shlex

    out = ""
    if specs is not None:
        out += f" --specs {shlex.quote(str(specs))}"
    if receipts is not None:
        out += f" --receipts {shlex.quote(str(receipts))}"
    return out


def _spec_states(specs_dir: Path, method: Optional[str], cache) -> tuple[dict[str, str], list[str]]:
    """promotion.state of each spec (one, or all), read without validating the rest; and why any could not be."""
    from engine.spec import read_document

    paths = [specs_dir / f"{method}.yaml"] if method else spec_files(specs_dir)
    states, problems = {}, []
    for p in paths:
        if not p.is_file():
            continue
        try:
            spec, _ = cache.validate_file(p, project_root())
        except Exception:  # e.g. no methods package to check names against: the state alone is still readable
            spec = None
        if spec is not None:  # valid: read_document gives this same data, and the schema requires the state
            states[p.stem] = spec.data["promotion"]["state"]
            continue
        try:
            data, _, _ = read_document(p, display_path(p, project_root()))
            states[p.stem] = data["promotion"]["state"]
        except SpecError as e:
            problems.append(f"cannot read promotion.state to check the ledger: {e.line()}")
        except (KeyError, TypeError):
            problems.append(f"{display_path(p, project_root())}: no promotion.state to check the ledger against")
    return states, problems


@app.command()
@handles_errors
def verify(
    method: Annotated[Optional[str], typer.Argument(help="Only this method's receipts (default: all).")] = None,
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    strict: Annotated[bool, typer.Option("--strict", help="Count stale receipts as a problem too.")] = False,
    json_out: JsonOpt = False,
    no_cache: NoCacheOpt = False,
) -> None:
    """Integrity, schema and freshness of every receipt, and the promotion ledger. Exit 1 on any problem."""
    from engine.spec import check_key
    from engine.verify import assess_store

    specs_dir, receipts_dir = _dirs(specs, receipts)
    if method is not None:
        check_key(method)
        if not (receipts_dir / method).is_dir() and not (specs_dir / f"{method}.yaml").is_file():
            known = sorted({p.stem for p in spec_files(specs_dir)} |
                           ({p.name for p in receipts_dir.iterdir() if p.is_dir()} if receipts_dir.is_dir() else set()))
            raise E.UsageError(f"no receipts and no spec for method {method!r}; known: {', '.join(known) or '(none)'}")
    cache = _spec_cache(receipts_dir, use=not no_cache)
    states, state_problems = _spec_states(specs_dir, method, cache)
    report = assess_store(receipts_dir, project_root(), specs_dir, method, states, cache=cache)
    report.ledger.problems.extend(state_problems)
    counts = report.counts()
    bad = counts["tampered"] + counts["invalid"] + (counts["stale"] if strict else 0)
    ok = not bad and not report.ledger.problems
    if json_out:
        _print_json({"receipts": [r.as_dict() for r in report.receipts], "counts": counts,
                     "leftovers": report.leftovers, "ledger": report.ledger.as_dict(), "strict": strict, "ok": ok})
    else:
        for r in report.receipts:
            tail = f"  {r.message}" if r.message else ""
            typer.echo(f"{r.state:<8} {r.file}  {r.status or '-'}{tail}")
        for f in report.leftovers:
            typer.echo(f"leftover {f}  temporary file of an interrupted write; never a receipt, safe to delete")
        led = report.ledger
        typer.echo(f"ledger   {led.file}  {len(led.entries)} entr{'y' if len(led.entries) == 1 else 'ies'}, "
                   + ("ok" if not led.problems else f"{len(led.problems)} problem(s)"))
        for p in led.problems:
            typer.echo(f"  {p}")
        _err(f"{len(report.receipts)} receipt(s): " + ", ".join(f"{n} {s}" for s, n in counts.items())
             + ("; OK" if ok else "; PROBLEMS FOUND"))
    raise typer.Exit(E.EXIT_OK if ok else E.EXIT_FAILED)


def _print_gate(result: dict) -> None:
    """Plain lines (no wrapping, no markup): one per requirement; an unmet one ends with the command that meets it."""
    head = "PROMOTABLE" if result["promotable"] else "NOT PROMOTABLE"
    typer.echo(f"{result['method']}: {head} (state {result['state']}, review {result['review']})")
    for r in result["requirements"]:
        if r["required"]:
            typer.echo(f"  {'met  ' if r['met'] else 'UNMET'} {r['id']}: {r['detail']}"
                       + ("" if r["met"] else f" -> {r['fix']}"))
    for w in result["warnings"]:
        typer.echo(f"  warning: {w}")


@app.command()
@handles_errors
def gate(
    method: Annotated[str, typer.Argument(help="Method key, e.g. tapo-trajectory.")],
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
    no_cache: NoCacheOpt = False,
) -> None:
    """May this method be promoted? Exit 0 when every requirement is met by fresh receipts, 1 when not."""
    from engine.gate import evaluate

    specs_dir, receipts_dir = _dirs(specs, receipts)
    cache = _spec_cache(receipts_dir, use=not no_cache)
    spec = cache.load_spec(spec_path(specs_dir, method), project_root())
    result = evaluate(spec, receipts_dir, project_root(), specs_dir, _flags(specs, receipts), cache=cache)
    if json_out:
        _print_json(result)
    else:
        _print_gate(result)
    raise typer.Exit(E.EXIT_OK if result["promotable"] else E.EXIT_FAILED)


def _check_reason(reason: str) -> str:
    text = reason.strip()
    if not text:
        raise E.UsageError("--reason is empty; say why, e.g. --reason 'fresh CUDA receipts and a formal comparison'")
    if len(text) > 2000:
        raise E.UsageError(f"--reason is {len(text)} characters; keep it under 2000")
    return text


def _change_state(method: str, new_state: str, reason: str, by: Optional[str], specs: Optional[Path],
                  receipts: Optional[Path], json_out: bool) -> None:
    from engine import ledger
    from engine.gate import evaluate
    from engine.promote import rewrite_state
    from engine.receipts import ensure_writable, git_revision
    from engine.spec import load_spec

    reason = _check_reason(reason)
    action = "promote" if new_state == "promoted" else "demote"
    specs_dir, receipts_dir = _dirs(specs, receipts)
    path = spec_path(specs_dir, method)
    spec = load_spec(path, project_root())
    result = evaluate(spec, receipts_dir, project_root(), specs_dir, _flags(specs, receipts))
    old_state = spec.data["promotion"]["state"]
    out = {"method": spec.key, "action": action, "changed": False, "old_state": old_state, "new_state": new_state,
           "ledger_entry": None, "gate": result}
    if action == "promote" and not result["promotable"]:
        if json_out:
            _print_json(out)
        else:
            _print_gate(result)
            _err(f"not promoted: the gate is closed ({len(result['reasons'])} unmet requirement(s))")
        raise typer.Exit(E.EXIT_FAILED)
    if old_state == new_state:
        if json_out:
            _print_json(out)
        else:
            _err(f"{spec.key} is already {new_state}; nothing changed, nothing ledgered")
        raise typer.Exit(E.EXIT_OK)
    ensure_writable(receipts_dir)  # the ledger must be writable before the spec changes
    old, new = rewrite_state(path, new_state, expect_sha256=spec.sha256)
    try:
        entry = ledger.append(
            receipts_dir, method=spec.key, action=action, old_state=old_state, new_state=new_state, reason=reason,
            by=by, receipts=result["justified_by"] if action == "promote" else [],
            gate={"promotable": result["promotable"], "unmet": [r["id"] for r in result["requirements"] if not r["met"]]},
            spec={"file": f"specs/{path.name}", "sha256_before": spec.sha256,
                  "sha256_after": hashlib.sha256(new).hexdigest()},
            git=git_revision(project_root()))
    except BaseException:
        path.write_bytes(old)  # no ledger entry, no state change
        raise
    out.update(changed=True, ledger_entry=entry)
    if json_out:
        _print_json(out)
    else:
        typer.echo(f"{spec.key}: promotion.state {old_state} -> {new_state} in {spec.display}; ledger entry "
                   f"{entry['seq']}" + (f" (receipts {', '.join(r[:12] for r in entry['receipts'])})"
                                        if entry["receipts"] else ""))


def _locked_change(method: str, new_state: str, reason: str, by: Optional[str], specs: Optional[Path],
                   receipts: Optional[Path], json_out: bool) -> None:
    """`_change_state` with the store's promotion lock held, so concurrent promote/demote take turns."""
    from engine.locking import PROMOTION_LOCK, exclusive
    from engine.spec import check_key

    check_key(method)  # a path trick is refused before any file (the lock file included) is touched
    with exclusive(_dirs(specs, receipts)[1], PROMOTION_LOCK):
        _change_state(method, new_state, reason, by, specs, receipts, json_out)


ReasonOpt = Annotated[str, typer.Option("--reason", help="Why (recorded in the ledger).")]
ByOpt = Annotated[Optional[str], typer.Option("--by", help="Who decided (recorded in the ledger; e.g. evolve).")]


@app.command()
@handles_errors
def promote(
    method: Annotated[str, typer.Argument(help="Method key.")],
    reason: ReasonOpt,
    by: ByOpt = None,
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Set promotion.state: promoted, only when the gate is open; ledger the change."""
    _locked_change(method, "promoted", reason, by, specs, receipts, json_out)


@app.command()
@handles_errors
def demote(
    method: Annotated[str, typer.Argument(help="Method key.")],
    reason: ReasonOpt,
    by: ByOpt = None,
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Set promotion.state: not-promoted (always allowed); ledger the change."""
    _locked_change(method, "not-promoted", reason, by, specs, receipts, json_out)


SCHEMAS = ("receipt", "spec", "gate", "ledger")


@app.command()
@handles_errors
def schema(
    name: Annotated[str, typer.Argument(help="receipt, spec, gate (the gate --json output) or ledger (one line).")],
    json_out: JsonOpt = False,  # noqa: ARG001 - the output is JSON either way
) -> None:
    """Print a published JSON Schema."""
    from importlib import resources

    if name not in SCHEMAS:
        raise E.UsageError(f"no schema {name!r}; valid: {', '.join(SCHEMAS)}")
    typer.echo(resources.files("engine").joinpath(f"schemas/{name}.schema.json").read_text(encoding="utf-8").rstrip())


# --- tui (issue 6) --------------------------------------------------------------
# Kept in its own section so it merges cleanly beside other verbs. Nothing here
# imports torch: the app reads specs and the receipt index (engine/index.py).


@app.command()
@handles_errors
def tui(
    specs: SpecsOpt = None,
    receipts: ReceiptsOpt = None,
    keys: Annotated[Optional[str], typer.Option(
        "--keys", envvar="CONTRACTS_TUI_KEYS",
        help="Remap keys by binding id, e.g. 'copy=c,failures=x' (ids are listed under ? in the app).")] = None,
    poll: Annotated[float, typer.Option(
        "--poll", min=0.0, help="Seconds between checks for new receipts and edited specs (0: only on r).")] = 3.0,
    json_out: JsonOpt = False,
) -> None:
    """Browse methods, contracts, receipts and gate verdicts in the terminal.

    With --json, print what the first screen would show (per method: review,
    promotion, gate verdict, contract statuses per device) and exit.
    """
    from tui.app import binding_ids, create_app, parse_keys

    specs_dir, receipts_dir = _dirs(specs, receipts)
    try:
        keymap = parse_keys(keys)
    except ValueError as err:
        raise E.UsageError(f"--keys: {err}") from None
    unknown = sorted(set(keymap) - binding_ids())
    if unknown:
        raise E.UsageError(f"--keys: no binding with id {', '.join(unknown)}; valid ids: {', '.join(sorted(binding_ids()))}")
    if json_out:
        from engine.index import Freshness, ReceiptIndex
        from tui.data import build_model, model_as_dict

        model = build_model(specs_dir, receipts_dir, project_root(), ReceiptIndex(receipts_dir),
                            Freshness(project_root(), specs_dir), gates=True)
        _print_json(model_as_dict(model))
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise E.EnvironmentProblem("contracts tui needs an interactive terminal; for scripts use "
                                   "contracts tui --json or contracts list --json")
    create_app(specs_dir, receipts_dir, project_root(), poll_seconds=poll or None, keymap=keymap).run()


# --- a direct way into the read-only verbs ---------------------------------------------------
# Before running any command, typer builds a pydantic TypeAdapter per parameter: about 70 ms, pydantic's
# import included, of a warm `contracts gate` that otherwise takes about 130 ms. When argv uses nothing but
# the plain options of list/show/gate/verify, main() parses it here and calls the same function typer would;
# anything else (--help, an unknown, repeated or valueless option, a wrong number of arguments) goes to
# typer, which also says what is wrong. tests/test_cli.py keeps this table equal to the signatures.

_DIRECT_OPTIONS = {"--specs": "specs", "--receipts": "receipts"}  # take a path
_DIRECT_FLAGS = {"--json": "json_out", "--strict": "strict", "--no-cache": "no_cache"}
_DIRECT = {  # verb -> (function, fewest and most METHOD arguments, flags it takes)
    "list": (list_, 0, 0, ("--json",)),
    "show": (show, 1, 1, ("--json",)),
    "gate": (gate, 1, 1, ("--json", "--no-cache")),
    "verify": (verify, 0, 1, ("--json", "--strict", "--no-cache")),
}


def _direct_call(argv: list[str]) -> Optional[tuple[Callable[..., Any], dict]]:
    """(function, keyword arguments) for argv that typer would parse into exactly that; else None."""
    if not argv or argv[0] not in _DIRECT:
        return None
    fn, fewest, most, flags = _DIRECT[argv[0]]
    kwargs: dict[str, Any] = {}
    methods: list[str] = []
    rest = iter(argv[1:])
    for tok in rest:
        if not tok.startswith("-"):
            if not tok:
                return None
            methods.append(tok)
            continue
        name, eq, value = tok.partition("=")
        if tok in flags and _DIRECT_FLAGS[tok] not in kwargs:
            kwargs[_DIRECT_FLAGS[tok]] = True
        elif name in _DIRECT_OPTIONS and _DIRECT_OPTIONS[name] not in kwargs:
            value = value if eq else next(rest, "")
            if not value or value.startswith("-"):  # typer would take "--json" as the path; let it say so
                return None
            kwargs[_DIRECT_OPTIONS[name]] = Path(value)
        else:
            return None
    if not fewest <= len(methods) <= most:
        return None
    if methods:
        kwargs["method"] = methods[0]
    return fn, kwargs


def main() -> None:
    try:
        direct = _direct_call(sys.argv[1:])
        if direct is None:
            app()
        else:
            fn, kwargs = direct
            try:
                fn(**kwargs)
            except typer.Exit as exc:  # what typer's standalone mode does with it
                sys.exit(exc.exit_code)
            sys.exit(E.EXIT_OK)
    except SystemExit as exc:
        if exc.code == E.EXIT_INTERRUPTED:
            _exit_now(E.EXIT_INTERRUPTED)
        if _CHECK_RAN and "ray" not in sys.modules and isinstance(exc.code, int):
            # Tearing down torch (and torch._dynamo, which optimizers import) takes 0.3-2 s of interpreter
            # finalisation that writes nothing: check's receipts are fsynced and closed by now and its local
            # workers stopped. Ray's atexit shutdown must run, so not with Ray loaded.
            _exit_now(exc.code)
        raise


def _exit_now(code: int) -> None:
    """Leave with `code` now: flush, skip interpreter finalisation, whatever CPython remembers.

    A KeyboardInterrupt that crossed a C extension's PyRun_* call (torch's
    pybind11 code can be on the stack when the signal lands) sets CPython's
    `_Py_UnhandledKeyboardInterrupt` even though the runner caught it; at
    exit `python -m engine.cli` then kills itself with SIGINT (status -2, not
    130). The receipt is written and fsynced by now; flush and go.
    """
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
