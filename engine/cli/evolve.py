"""`contracts evolve-evaluator METHOD --out FILE`: write an OpenEvolve evaluator that checks candidates of METHOD.

Reads the spec only (no torch): the file it writes does the checking when
OpenEvolve calls it (engine/evolve/evaluator.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from engine import errors as E
from engine import paths as _paths
from engine.cli.common import JsonOpt, SpecsOpt, _err, _out, _print_json, _spec_cache, app, handles_errors
from engine.paths import spec_path


def _absolute(p: Optional[Path]) -> Optional[str]:
    return None if p is None else str(Path(p).expanduser().resolve())


def _write(out: Path, text: str, force: bool) -> None:
    """Write `text` to `out` whole (a temporary file renamed into place); an existing file only with --force."""
    import secrets

    if out.exists() and not force:
        raise E.UsageError(f"{out} exists; pass --force to replace it, or choose another --out")
    if out.exists() and not out.is_file():
        raise E.UsageError(f"{out} is not a regular file")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}.tmp")
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if force:
            os.replace(tmp, out)
        else:
            try:
                os.link(tmp, out)  # never replaces what appeared meanwhile
            finally:
                tmp.unlink()
    except FileExistsError:
        raise E.UsageError(f"{out} exists; pass --force to replace it, or choose another --out") from None
    except OSError as err:
        raise E.EnvironmentProblem(f"could not write {out}: {err.strerror or err}") from None


@app.command("evolve-evaluator")
@handles_errors
def evolve_evaluator(
    method: Annotated[str, typer.Argument(help="Method key, e.g. tapo-trajectory.")],
    out: Annotated[Path, typer.Option("--out", help="Where to write the evaluator file (a .py OpenEvolve loads).")],
    receipts: Annotated[Optional[Path], typer.Option(
        "--receipts", help="Receipt store for the candidates' receipts (default: FILE's folder/evolve-receipts; "
                           "keep it apart from the project's receipts/).")] = None,
    specs: SpecsOpt = None,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N. Never falls back.")] = "cpu",
    seeds: Annotated[Optional[str], typer.Option(help="fresh (the default; alias random): seeds drawn from the operating "
                                                       "system for every candidate and stage (stage 1 one, stages 2 and "
                                                       "3 as many as the budget lists), recorded in each receipt; "
                                                       "budget: the spec budget's; or a comma-separated list (stage 1 "
                                                       "runs the first).")] = None,
    impl_timeout: Annotated[Optional[float], typer.Option(
        "--impl-timeout", help="Seconds one check call of a candidate may take before its worker is killed "
                               "(default: the spec's per_contract_timeout_seconds).")] = None,
    impl_memory_mb: Annotated[Optional[int], typer.Option(
        "--impl-memory-mb", help="Address space a worker may add after its imports, in MiB (cpu only; 0: no "
                                 "limit; default 4096).")] = None,
    jobs: Annotated[Optional[int], typer.Option(
        "--jobs", "-j", help="Workers checking one candidate side by side (default: 2, or 1 on a 1-core "
                             "machine).")] = None,
    sign_key: Annotated[Optional[Path], typer.Option(
        "--sign-key", help="Sign every receipt with this key (default at run time: $CONTRACTS_SIGNING_KEY).")] = None,
    sign_command: Annotated[Optional[str], typer.Option(
        "--sign-command", help="Sign with this command instead (default at run time: $CONTRACTS_SIGN_COMMAND).")]
    = None,
    trust: Annotated[Optional[Path], typer.Option(
        "--trust", help="Count only receipts signed by a key this trust policy trusts for the device kind "
                        "(default at run time: $CONTRACTS_TRUST).")] = None,
    no_sandbox: Annotated[bool, typer.Option(
        "--no-sandbox", help="Run candidates without the bubblewrap sandbox (where bwrap is not installed); their "
                             "receipts record sandbox: none.")] = False,
    no_strict: Annotated[bool, typer.Option(
        "--no-strict", help="Do not screen candidates' source against the import and construct allowlist "
                            "(docs/evolve.md) before they run.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace FILE if it exists.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write an OpenEvolve evaluator for METHOD: evaluate_stage1/2/3 and evaluate, scoring a candidate 0 when it
    breaks any contract and by the spec's evolve.score when it holds them all (docs/evolve.md)."""
    from engine.cli.check import _parse_seeds
    from engine.cli.version import package_version
    from engine.evolve import stages as S
    from engine.evolve.template import render
    from engine.run.devices import parse_device
    from engine.spec.loader import check_key

    check_key(method)
    parse_device(device)
    seed_list: "list[int] | str | None" = None
    if seeds is not None and seeds.strip().lower() == "budget":
        seed_list = "budget"
    elif seeds is not None and seeds.strip().lower() not in ("fresh", "random"):
        seed_list = _parse_seeds(seeds)
    if impl_timeout is not None and not impl_timeout > 0:
        raise E.UsageError(f"--impl-timeout {impl_timeout}: give a positive number of seconds")
    if impl_memory_mb is not None and impl_memory_mb < 0:
        raise E.UsageError(f"--impl-memory-mb {impl_memory_mb}: give 0 (no limit) or a positive number of MiB")
    if jobs is not None and jobs < 1:
        raise E.UsageError(f"--jobs {jobs}: give 1 or more")
    if sign_key is not None and sign_command is not None:
        raise E.UsageError("give --sign-key or --sign-command, not both")
    if sign_key is not None and not sign_key.is_file():
        raise E.UsageError(f"--sign-key {sign_key}: no such file; make one with contracts keys generate PATH")
    out = Path(out).expanduser()
    if out.suffix != ".py":
        raise E.UsageError(f"--out {out}: OpenEvolve loads a Python file; give a name ending in .py")
    specs_dir = specs or _paths.default_specs_dir()
    receipts_dir = receipts if receipts is not None else out.parent / "evolve-receipts"
    spec = _spec_cache(receipts_dir, use=False).load_spec(spec_path(specs_dir, method), _paths.project_root())
    if isinstance(seed_list, list) and len(seed_list) > spec.data["budget"]["max_seeds"]:
        raise E.BudgetError(f"--seeds lists {len(seed_list)} seeds but {spec.display} budget.max_seeds is "
                            f"{spec.data['budget']['max_seeds']}")
    if trust is not None:
        from engine.store.trust import policy_from_option

        policy_from_option(trust, receipts_dir)  # a bad policy is a usage error now, not a 0 for every candidate
        if sign_key is None and sign_command is None and not os.environ.get("CONTRACTS_SIGNING_KEY") and \
                not os.environ.get("CONTRACTS_SIGN_COMMAND"):
            raise E.UsageError("--trust counts only signed receipts, and nothing would sign them: give --sign-key "
                               "or --sign-command too")
    if seed_list is None:  # what a stage runs, with as many fresh seeds as it will draw
        n = len(spec.data["budget"]["seeds"])
        stages = {k: S.describe(spec.data, k, list(range(1 if k == 1 else n))).split(" on ")[0]
                  + f" on {1 if k == 1 else n} fresh seed{'' if k == 1 or n == 1 else 's'} per candidate"
                  for k in S.STAGES}
    else:
        stages = {k: S.describe(spec.data, k, None if seed_list == "budget" else seed_list) for k in S.STAGES}
    decl = (spec.data.get("evolve") or {}).get("score")
    score = (f"{decl['contract']}.{decl['metric']} mapped from {list(decl['range'])} onto [0, 1]"
             + ("" if decl.get("higher_is_better", True) else ", lower is better") if decl else
             "1 (the spec declares no evolve.score)")
    options = {"specs": _absolute(specs_dir), "receipts": _absolute(receipts_dir), "device": device,
               "seeds": seed_list, "timeout_s": impl_timeout, "memory_mb": impl_memory_mb, "jobs": jobs,
               "sign_key": _absolute(sign_key), "sign_command": sign_command, "trust": _absolute(trust),
               "sandbox": not no_sandbox, "strict": not no_strict}
    text = render(method=method, spec_name=f"specs/{spec.path.name}", version=package_version(), stages=stages,
                  score=score, options=options, receipts_shown=str(receipts_dir))
    compile(text, str(out), "exec")  # what we write must at least be Python
    _write(out, text, force)
    if json_out:
        _print_json({"evaluator": str(out), "method": method, "spec": f"specs/{spec.path.name}",
                     "stages": {f"evaluate_stage{k}": v for k, v in stages.items()}, "score": decl,
                     "combined_score": {"broken": 0.0, "stage1": 0.5, "stage2": 0.75, "all_contracts": "0.9 + 0.1 x score"},
                     "receipts": str(receipts_dir), "options": options})
        raise typer.Exit(E.EXIT_OK)
    _out(f"wrote {out}: an OpenEvolve evaluator for {method}")
    for k, v in stages.items():
        _out(f"  evaluate_stage{k}: {v}")
    _out(f"  combined_score: 0 when a contract breaks; 0.5 once stage 1 holds, 0.75 once stage 2 holds; "
         f"0.9 + 0.1 x {score} once every contract holds")
    _out(f"  receipts: {receipts_dir}/ (one per stage that runs)")
    _err(f"next: run OpenEvolve with {out.name} as its evaluator and evaluator.cascade_evaluation: true "
         "(docs/evolve.md has a config)")
    raise typer.Exit(E.EXIT_OK)
