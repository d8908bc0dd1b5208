"""`contracts mutate`: operators, executed lines only, verdicts in workers, equivalents, the receipt and the gate.

Most tests run the toy method in tests/mutate_toy/ (one function, one contract, a handful of mutants whose fate
is known by reading them); one runs the real CLI on two TAPO mutants for the --json shape.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app
from engine.run.mutate import execute, operators
from engine.run.mutate.generate import Mutant, Target, mutants_of, target_modules
from engine.run.mutate.operators import apply, collect
from tests.toy_spec import toy_spec

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
TOY = TESTS / "mutate_toy"

TOY_SPEC = toy_spec(
    "toy-mutate", "mutate_toy", title="Toy weighted mean", arxiv="2601.00002", paper_title="Toy",
    institution="Nowhere", budget={"seeds": [7], "max_seeds": 2, "max_wall_seconds": 120},
    formulas="  - {id: wmean, latex: 'y = \\sum_i w_i x_i / \\sum_i w_i', implements: weighted_mean}",
    contracts="""\
  - id: value_and_grad
    description: value and gradient equal the float64 closed form
    formulas: [wmean]
    kind: gradient
    tier: math
    check: mutate_toy.value_and_grad
    dtypes: [float64]
    cases: 1
    expect:
      - {metric: max_abs_err, le: 1.0e-12}
      - {metric: grad_max_abs_err, le: 1.0e-12}""",
    mutants="  - {id: plain-mean, description: ignores the weights, mutant: mutate_toy.plain_mean, "
            "killed_by: [value_and_grad]}",
    promotion="""\
promotion:
  review: DONE
  state: not-promoted
  reasons: [toy]
  requires: {review: DONE, devices: [cpu], all_budget_seeds: true, mutants_killed: false, formal_comparison: false,
             mutation_score: 0.9}
""")

# The two survivors of the toy: clamp_min(1e-30) -> clamp_min(1.0) and -> clamp_min(-1.0) change nothing while
# every row's weights sum to more than 1, as the toy's contract draws them.
SURVIVOR_DESCRIPTIONS = {"1e-30 -> 1.0", "1e-30 -> -1.0"}


def _list_equivalent(toy: Path, ids: list[str], edit: str = "") -> None:
    """Rewrite the toy's spec with mutants `ids` judged equivalent (the two survivors are, on the contract's inputs),
    and `edit` (a line) before its promotion block."""
    listed = "equivalent_mutants:\n" + "".join(
        f"  - id: {i}\n    reason: every row's weights sum to more than 1, so the clamp never binds\n" for i in ids)
    (toy / "toy-mutate.yaml").write_text(TOY_SPEC.replace("promotion:\n", listed + edit + "promotion:\n"),
                                         encoding="utf-8")


def _sha_tree(*folders: Path) -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in folders for p in sorted(folder.rglob("*.py"))}


@pytest.fixture()
def toy(tmp_path, monkeypatch):
    """The toy registered in this process (spec validation needs its names) and its spec in a temp folder."""
    monkeypatch.syspath_prepend(str(TESTS))
    import mutate_toy.checks  # noqa: F401  (registers mutate_toy)

    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "toy-mutate.yaml").write_text(TOY_SPEC, encoding="utf-8")
    return specs


def _opts(**kw):
    from engine.run.mutate.session import Options

    return Options(seeds=[7], jobs=2, sys_path=[str(TESTS)], imports=["mutate_toy.checks"], **kw)


def _spec(specs: Path):
    from engine.spec.loader import load_spec

    return load_spec(specs / "toy-mutate.yaml", ROOT)


# --- operators ---------------------------------------------------------------------------------------------------


def _edits(src: str, op: str) -> list[str]:
    return [apply(src, e) for e in collect(src, frozenset({op}))]


def test_operators_make_the_intended_edits():
    assert _edits("y = a + b * c\n", "arith") == ["y = a - b * c\n", "y = a + b / c\n"]
    assert _edits("y = a < b\n", "compare") == ["y = a <= b\n"]
    assert _edits("y = x is None\n", "compare") == ["y = x is not None\n"]
    assert _edits("y = a and not b\n", "logic") == ["y = a or not b\n", "y = a and b\n"]
    assert _edits("y = torch.minimum(a, b).clamp(min=0)\n", "minmax") == [
        "y = torch.maximum(a, b).clamp(min=0)\n", "y = torch.minimum(a, b).clamp(max=0)\n"]
    assert _edits("y = -x\n", "sign") == ["y = x\n"]
    assert _edits("y = x * 2 + 0.5\n", "constant") == ["y = x * 1 + 0.5\n", "y = x * 3 + 0.5\n",
                                                         "y = x * 2 + (-0.5)\n", "y = x * 2 + 1.5\n"]
    assert _edits("y = x == True\n", "constant") == ["y = x == False\n"]
    assert _edits("y = x.sum(dim=-1)\n", "dim") == ["y = x.sum(dim=0)\n"]
    assert _edits("y = torch.cumsum(x, 0)\n", "dim") == ["y = torch.cumsum(x, -1)\n"]
    assert _edits("y = x.detach()\n", "detach") == ["y = x\n"]
    assert _edits("y = torch.exp(x)\n", "detach") == ["y = (torch.exp(x)).detach()\n"]
    assert _edits("y = x.mean(-1)\n", "reduce") == ["y = x.sum(-1)\n"]
    # A dim literal belongs to the dim operator, not to constant +-1.
    assert _edits("y = x.sum(-1)\n", "constant") == []
    # Not mutated: the text of a raise, f-strings, string concatenation, annotations, decorators.
    assert collect('raise ValueError(f"{n + 1} rows")\n') == []
    assert collect('s = "a" + "b"\n', frozenset({"arith"})) == []
    assert [e.text for e in collect("def f(x: int = 1) -> None:\n    pass\n", frozenset({"constant"}))] == ["0", "2"]
    assert collect("@registry.check(1 + 1)\ndef f():\n    pass\n") == []


def test_an_edit_changes_only_its_token_and_keeps_the_layout():
    src = "def f(a, b):\n    # why\n    return (a +\n            b)  # tail\n"
    (edit,) = collect(src, frozenset({"arith"}))
    assert apply(src, edit) == src.replace("(a +", "(a -")


def test_only_executed_lines_are_mutated():
    src = (TOY / "method.py").read_text()
    lines = src.splitlines()
    body = {i + 1 for i, line in enumerate(lines) if "total" in line}  # the two lines of weighted_mean's body
    target = Target(module="mutate_toy.method", path=str(TOY / "method.py"), display="tests/mutate_toy/method.py",
                    executed=frozenset(body))
    mutants = mutants_of(target, src)
    assert mutants and {m.line for m in mutants} <= body
    unused = next(i + 1 for i, line in enumerate(lines) if "x * 3 + 1" in line)
    everywhere = mutants_of(Target(target.module, target.path, target.display, frozenset(range(1, len(lines) + 1))),
                            src)
    assert unused in {m.line for m in everywhere}  # the filter, not the operators, kept them out


def test_a_module_that_declares_itself_check_code_is_not_a_target(tmp_path):
    pkg = tmp_path / "meth"
    pkg.mkdir()
    (pkg / "objective.py").write_text("def f(x):\n    return x + 1\n")
    (pkg / "audit.py").write_text('"""Checks f."""\n\n__mutate__ = False  # check code\n\ndef g(x):\n    return x\n')
    (pkg / "helper.py").write_text("__mutate__ = True\n\ndef h(x):\n    return x * 2\n")
    (pkg / "checks.py").write_text("def c():\n    pass\n")
    got = target_modules(["meth.objective"], {"meth.objective": str(pkg / "objective.py")})
    assert [m for m, _ in got] == ["meth.helper", "meth.objective"]  # audit.py declared, checks.py by name
    # The real packages: TAPO's run audit and fast-path comparison are declared check code.
    tapo = ROOT / "methods" / "tapo"
    names = [m for m, _ in target_modules(["methods.tapo.objective"], {"methods.tapo.objective": str(tapo / "objective.py")})]
    assert "methods.tapo.audit" not in names and "methods.tapo.fastpath" not in names
    assert {"methods.tapo.objective", "methods.tapo.proximal", "methods.tapo.mechanism"} <= set(names)
    # MRTPO's check code declares itself; what the default run executes does not
    from engine.run.mutate.generate import declares_check_code

    assert not declares_check_code(pkg / "helper.py")  # only `False` opts out
    mrtpo = ROOT / "methods" / "mrtpo"
    declared = sorted(f.stem for f in mrtpo.glob("*.py") if declares_check_code(f))
    assert declared == ["fastpath_checks", "measure", "mechanism_checks"]
    tar = ROOT / "methods" / "tar"
    assert sorted(f.stem for f in tar.glob("*.py") if declares_check_code(f)) == ['audit', 'bench', 'harness_check', 'inputs']


def test_a_package_declares_the_shared_modules_its_implementation_runs(tmp_path, monkeypatch):
    """`__mutate_also__` in the package's __init__ adds a module of a sibling package; a module elsewhere or a
    shared module of check code is refused with a message naming it."""
    root = tmp_path / "meths"
    (root / "meth").mkdir(parents=True)
    (root / "shared").mkdir()
    for d in (root, root / "shared"):
        (d / "__init__.py").write_text("")
    (root / "shared" / "masks.py").write_text("def m(x):\n    return x != 0\n")
    (root / "shared" / "audit.py").write_text("__mutate__ = False\n")
    (root / "meth" / "objective.py").write_text("def f(x):\n    return x + 1\n")
    init = root / "meth" / "__init__.py"
    init.write_text('__mutate_also__ = ("meths.shared.masks",)\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    files = {"meths.meth.objective": str(root / "meth" / "objective.py")}
    got = dict(target_modules(["meths.meth.objective"], files))
    assert sorted(got) == ["meths.meth.objective", "meths.shared.masks"]
    assert Path(got["meths.shared.masks"]).resolve() == (root / "shared" / "masks.py").resolve()
    for bad in ('("meths.shared.audit",)', '("json",)', '"meths.shared.masks"'):
        init.write_text(f"__mutate_also__ = {bad}\n")
        with pytest.raises(ValueError, match="__mutate_also__"):
            target_modules(["meths.meth.objective"], files)


# --- runs --------------------------------------------------------------------------------------------------------


def test_toy_run_kills_formula_breaks_names_the_contract_and_keeps_the_checkout(toy):
    from engine.run.mutate.session import run

    before = _sha_tree(ROOT / "methods", TOY)
    out = run(_spec(toy), ROOT, _opts())
    assert _sha_tree(ROOT / "methods", TOY) == before, "a mutate run wrote to the checkout"
    m = out["mutation"]
    # The baseline's coverage: weighted_mean's lines ran, unused_scale's did not.
    unused = next(i + 1 for i, line in enumerate((TOY / "method.py").read_text().splitlines()) if "x * 3" in line)
    assert all(r["line"] != unused for r in m["results"])
    assert m["mutants"] >= 8 and m["timeout"] == 0
    by_desc = {r["description"]: r for r in m["results"]}
    broken = by_desc["* -> /"]  # (x * w) -> (x / w): the formula is wrong
    assert broken["status"] == "killed" and broken["killed_by"] == "value_and_grad"
    assert "max_abs_err" in broken["message"]
    detached = by_desc["expr -> (expr).detach()"]  # the value is right, the gradient is gone
    assert detached["status"] == "killed" and detached["killed_by"] == "value_and_grad"
    assert {s["description"] for s in m["survivors"]} == SURVIVOR_DESCRIPTIONS
    assert m["survived"] == 2 and m["killed"] == m["mutants"] - 2
    assert m["score"] == pytest.approx(m["killed"] / m["mutants"])
    assert all(s["diff"].startswith("--- a/tests/mutate_toy/method.py") for s in m["survivors"])
    assert m["complete"] is True and m["passed"] is False


def test_an_equivalent_listed_in_the_spec_leaves_the_denominator(toy):
    from engine.run.mutate.session import score

    records = [{"id": f"m{i}", "file": "f.py", "line": 1, "operator": "arith", "description": "d", "diff": "",
                "status": s} for i, s in enumerate(["killed", "killed", "killed", "survived", "survived", "timeout"])]
    plain = score([dict(r) for r in records], [])
    assert (plain["killed"], plain["survived"], plain["timeout"], plain["score"]) == (3, 2, 1, 0.6)
    listed = score([dict(r) for r in records], [{"id": "m4", "reason": "r"}, {"id": "gone", "reason": "r"}])
    assert (listed["survived"], listed["equivalent"], listed["score"]) == (1, 1, 0.75)
    assert [e["id"] for e in listed["equivalents"]] == ["m4"] and listed["equivalents"][0]["reason"] == "r"
    assert listed["listed_not_run"] == ["gone"]
    killed_listed = score([dict(r) for r in records], [{"id": "m0", "reason": "wrong"}])
    assert killed_listed["listed_but_killed"] == ["m0"] and killed_listed["score"] == 0.6


def test_a_hanging_mutant_is_a_timeout(toy):
    from engine.run.mutate.session import judge

    path = TOY / "method.py"
    src = path.read_text()
    hang = src.replace("    total = (x * w).sum(dim=-1)\n", "    while True:\n        pass\n")
    assert hang != src
    mutant = Mutant(id="tests/mutate_toy/method.py:7:logic:0000000000", module="mutate_toy.method", path=str(path),
                    display="tests/mutate_toy/method.py", line=7, operator="logic", description="hang", source=hang,
                    diff="")
    (record,) = judge(_spec(toy), ROOT, [mutant], ["value_and_grad"], _opts(), timeout_s=4.0)
    assert record["status"] == "timeout" and record["killed_by"] is None
    assert 4.0 <= record["wall_s"] < 30


def test_import_hook_serves_only_its_module():
    hook = execute.MutantSource("no_such_mutant_mod", "/nowhere/mod.py", "VALUE = 41 + 1\n")
    assert hook.find_spec("no_such_other") is None
    sys.meta_path.insert(0, hook)
    try:
        import importlib

        mod = importlib.import_module("no_such_mutant_mod")
        assert mod.VALUE == 42 and mod.__file__ == "/nowhere/mod.py"
    finally:
        sys.meta_path.remove(hook)
        sys.modules.pop("no_such_mutant_mod", None)


def test_a_failing_baseline_refuses_to_judge(toy, tmp_path):
    from engine.run.mutate.session import BaselineFailed, run

    text = TOY_SPEC.replace("{metric: max_abs_err, le: 1.0e-12}", "{metric: max_abs_err, lt: 0.0}")
    (toy / "toy-mutate.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(BaselineFailed, match="fails 1 contract result"):
        run(_spec(toy), ROOT, _opts())


# --- receipt and gate ------------------------------------------------------------------------------------------


def _gate(specs: Path, receipts: Path) -> dict:
    receipts.mkdir(exist_ok=True)  # an empty store: one that is not there is exit 2
    res = CliRunner().invoke(app, ["gate", "toy-mutate", "--specs", str(specs), "--receipts", str(receipts), "--json",
                                   "--no-cache"])
    return json.loads(res.stdout)


def test_gate_demands_the_mutation_score(toy, tmp_path, monkeypatch):
    from jsonschema import Draft202012Validator

    # The toy method lives under tests/, which receipts never bind (engine.run.binding), and the suite may run
    # in a working tree with edits: what makes a receipt count at all is tests/test_binding.py's; here, the score.
    monkeypatch.setattr("engine.gate.verdict.refusal", lambda a, impl_file: [])

    from engine.gate.verdict import GATE_SCHEMA  # noqa: F401
    from engine.run.mutate.session import run, statement
    from engine.store.receipts import schema_problems, utc_now, write_receipt

    receipts = tmp_path / "receipts"
    gate_schema = json.loads((ROOT / "engine/schemas/gate.schema.json").read_text())

    def requirement(out):
        assert not list(Draft202012Validator(gate_schema).iter_errors(out))
        return next(r for r in out["requirements"] if r["id"] == "mutation_score")

    req = requirement(_gate(toy, receipts))
    assert req["met"] is False and "no fresh, complete mutation receipt" in req["detail"]

    spec = _spec(toy)
    opts = _opts()
    out = run(spec, ROOT, opts)
    stmt = statement(spec, ROOT, out, opts, utc_now())
    assert schema_problems(json.loads(json.dumps(stmt))) == []
    write_receipt(receipts, stmt)
    req = requirement(_gate(toy, receipts))
    assert req["met"] is False and "is below 0.9" in req["detail"] and req["score"] < 0.9

    # Judge the two survivors equivalent (they are, on the contract's inputs) and list them: the score is 1.
    ids = [s["id"] for s in out["mutation"]["survivors"]]
    _list_equivalent(toy, ids)
    spec = _spec(toy)
    out = run(spec, ROOT, opts)
    assert out["mutation"]["equivalent"] == 2 and out["mutation"]["survived"] == 0
    assert out["mutation"]["score"] == 1.0
    write_receipt(receipts, statement(spec, ROOT, out, opts, utc_now()))
    from engine.gate import review

    review.record(spec, receipts, "R. Viewer", "read it")  # the gate's review requirement: this spec, approved
    res = _gate(toy, receipts)
    req = requirement(res)
    assert req["met"] is True and req["score"] == 1.0, req
    assert res["promotable"] is True
    # list names the newest receipt for what it is: a mutation run and its score, not its one-seed baseline
    as_json = CliRunner().invoke(app, ["list", "--specs", str(toy), "--receipts", str(receipts), "--json"])
    (row,) = json.loads(as_json.stdout)["methods"]
    assert row["latest_receipt"]["mutation"] == {"score": 1.0, "complete": True}, as_json.stdout
    shown = CliRunner().invoke(app, ["list", "--specs", str(toy), "--receipts", str(receipts)]).stdout
    assert "mutate 1.000 (full" in shown, shown
    # a candidate implementation is held to the contracts' score: `contracts mutate` takes no --impl, so a
    # requirement only the candidate's own receipts could meet would have no command to meet it
    cand = tmp_path / "cand.py"
    cand.write_text("def double(x):\n    return 2 * x\n")
    res = CliRunner().invoke(app, ["gate", "toy-mutate", "--impl", str(cand), "--specs", str(toy), "--receipts",
                                   str(receipts), "--json", "--no-cache"])
    req = requirement(json.loads(res.stdout))
    assert req["met"] is True and req["detail"].startswith("the contracts' score, measured on the registered"), req

    # A partial run (a selection of the mutants) never counts, even with a perfect score.
    _list_equivalent(toy, ids, "# edited\n")
    spec = _spec(toy)
    partial = _opts(max_mutants=1)
    out = run(spec, ROOT, partial)
    assert out["mutation"]["complete"] is False
    write_receipt(receipts, statement(spec, ROOT, out, partial, utc_now()))
    req = requirement(_gate(toy, receipts))
    assert req["met"] is False and "partial run" in req["detail"]


def test_gate_without_the_requirement_keeps_its_shape(toy, tmp_path):
    (toy / "toy-mutate.yaml").write_text(TOY_SPEC.replace(",\n             mutation_score: 0.9}", "}"),
                                         encoding="utf-8")
    out = _gate(toy, tmp_path / "receipts")
    assert [r["id"] for r in out["requirements"]] == ["review", "device:cpu", "fresh_seeds", "mutants_killed",
                                                      "formal_comparison", "signed"]
    # the registered implementation is not held to fresh seeds unless the spec asks
    (fresh,) = [r for r in out["requirements"] if r["id"] == "fresh_seeds"]
    assert fresh["met"] is True and fresh["detail"].startswith("not required for the registered"), fresh


# --- the CLI ---------------------------------------------------------------------------------------------------


def test_cli_json_shape_on_two_tapo_mutants(tmp_path):
    before = _sha_tree(ROOT / "methods")
    res = CliRunner().invoke(app, ["mutate", "tapo-trajectory", "--only-file", "objective.py", "--max-mutants", "2",
                                   "--jobs", "2", "--receipts", str(tmp_path), "--json"])
    assert _sha_tree(ROOT / "methods") == before
    assert res.exit_code in (0, 1), res.output
    data = json.loads(res.stdout)
    for key in ("mutants", "killed", "survived", "timeout", "score", "survivors", "receipt"):
        assert key in data
    assert data["mutants"] == 2 == data["killed"] + data["survived"] + data["timeout"] + data["equivalent"]
    if data["mutants"] - data["timeout"] - data["equivalent"]:
        assert data["score"] == data["killed"] / (data["mutants"] - data["timeout"] - data["equivalent"])
    assert data["complete"] is False
    assert res.exit_code == (0 if data["score"] is not None and data["score"] >= data["threshold"] else 1)
    for s in data["survivors"]:
        assert s["diff"].startswith("--- a/methods/tapo/objective.py") and s["id"].startswith(
            "methods/tapo/objective.py:")
    (receipt,) = list(tmp_path.rglob("*.json"))
    pred = json.loads(receipt.read_text())["predicate"]
    assert pred["mutation"]["mutants"] == 2 and pred["mutants"] == [] and pred["mechanism"] == []


def test_cli_refuses_bad_options(tmp_path):
    runner = CliRunner()
    for args, text in ((["--jobs", "0"], "--jobs 0"), (["--operators", "arith,nope"], "unknown nope"),
                       (["--max-mutants", "0"], "--max-mutants 0"), (["--timeout", "-1"], "--timeout -1")):
        res = runner.invoke(app, ["mutate", "tapo-trajectory", "--receipts", str(tmp_path), *args])
        assert res.exit_code == 2 and text in res.stderr, res.output
    import torch

    if not torch.cuda.is_available():
        res = runner.invoke(app, ["mutate", "tapo-trajectory", "--receipts", str(tmp_path), "--device", "cuda"])
        assert res.exit_code == 4 and "no CUDA" in res.stderr, res.output
    # --only-file is checked against the files the baseline found; the check itself, without a baseline:
    from engine.run.mutate.session import select_targets
    from engine.errors import UsageError

    t = Target("m.a", "/x/a.py", "methods/m/a.py")
    assert select_targets([t], ["a.py"]) == [t] and select_targets([t], ["methods/m/a.py"]) == [t]
    with pytest.raises(UsageError, match="not a mutated file"):
        select_targets([t], ["b.py"])


def test_operator_names_are_documented():
    doc = (ROOT / "docs" / "mutation.md").read_text()
    for op in operators.OPERATORS:
        assert f"`{op}`" in doc


def test_configuration_literals_and_gradless_factories_are_left_alone():
    assert collect('lr = float(p.get("lr", 0.02))\ng = ctx.generator(101)\n', frozenset({"constant"})) == []
    assert collect("t = torch.zeros((), dtype=torch.float64)\n", frozenset({"detach"})) == []
    assert collect("LN2 = math.log(2.0)\n", frozenset({"detach"})) == []  # a float: .detach() would only crash
    assert len(collect("y = x.log()\n", frozenset({"detach"}))) == 1
    assert [e.text for e in collect("n = p.get('n', 3) + 1\n", frozenset({"constant"}))] == ["0", "2"]


def test_a_mutant_is_asked_only_of_the_contracts_that_ran_its_statement():
    t = Target("m.a", "/x/a.py", "methods/m/a.py", frozenset({3, 4, 9}),
               contexts={3: ["cheap"], 4: ["cheap", "mechanism"], 9: [""]})
    assert t.contracts_for(3, 3) == {"cheap"}
    assert t.contracts_for(3, 4) == {"cheap", "mechanism"}
    assert t.contracts_for(9, 9) is None  # import-time code: every contract may see it
    assert t.contracts_for(5, 6) is None  # not measured: every contract


def test_a_hung_worker_ends_itself_past_its_limit(toy):
    """Even if the parent never stops it (killed -9, say), a hanging mutant's worker does not outlive its limit."""
    import time

    src = (TOY / "method.py").read_text().replace("    total = (x * w).sum(dim=-1)\n", "    while True:\n        pass\n")
    job = execute.Job(spec_path=str(toy / "toy-mutate.yaml"), root=str(ROOT), seeds=[7], sys_path=[str(TESTS)],
                      imports=["mutate_toy.checks"], module="mutate_toy.method", path=str(TOY / "method.py"),
                      source=src, limit_s=3.0)
    ctx = execute._context()
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=execute._worker, args=(send, job), daemon=True)
    t0 = time.monotonic()
    proc.start()
    send.close()
    proc.join(timeout=30)
    alive = proc.is_alive()
    if alive:
        proc.kill()
    assert not alive and proc.exitcode == 3 and time.monotonic() - t0 < 30


@pytest.mark.parametrize("complete", [True, False])
def test_listed_equivalents_not_run_are_one_warning_each_only_in_a_complete_run(capsys, complete):
    from engine.cli.mutate import _print_report

    section = {"score": 1.0, "threshold": 0.9, "threshold_source": "spec", "passed": True, "complete": complete,
               "mutants": 1, "killed": 1, "survived": 0, "timeout": 0, "equivalent": 0, "files": [],
               "survivors": [], "timeouts": [], "equivalents": [], "listed_but_killed": [],
               "listed_not_run": ["a.py:1:arith:0", "a.py:2:arith:1", "a.py:3:arith:2"], "results": [],
               "wall_s": 1.0, "baseline_wall_s": 1.0, "jobs": 1, "selection": {"run": 1, "candidates": 9}}
    _print_report(section, "toy", "receipts/toy/x.json")
    err = capsys.readouterr().err
    if complete:  # the code changed under a listed id: each one is named, to be re-judged
        assert err.count("no such mutant was run (the code changed: re-judge it)") == 3, err
    else:  # a selection leaves listed ids out by design: one line says so
        assert "no such mutant" not in err and "3 mutants listed in equivalent_mutants were not in this selection" in err


def test_a_worker_takes_the_parents_validated_spec_only_for_the_same_bytes(tmp_path, monkeypatch):
    """Each mutant's worker used to validate the spec again (a tenth of a mutation run's CPU, the registry's
    source scan included): it now takes the parent's data when the file still has the bytes the parent read, and
    validates whatever the file holds otherwise."""
    from engine.spec import loader

    spec = loader.load_spec(ROOT / "specs" / "tapo-trajectory.yaml", ROOT)
    copy = tmp_path / "tapo-trajectory.yaml"
    copy.write_bytes(spec.raw)
    job = execute.Job(spec_path=str(copy), root=str(ROOT), seeds=[42], spec_data=spec.data,
                      spec_sha256=spec.sha256)

    def refuse(*a, **k):
        raise AssertionError("validated the same bytes again")

    monkeypatch.setattr(loader, "load_spec", refuse)
    _, _, order, got = execute._load(job)
    assert got.data == spec.data and got.sha256 == spec.sha256 and [c["id"] for c in order] == \
        [c["id"] for c in spec.data["contracts"]]
    monkeypatch.undo()
    copy.write_bytes(spec.raw.replace(b"per_contract_timeout_seconds: ", b"per_contract_timeout_seconds:  ", 1))
    assert execute._validated(job) is None  # other bytes: the worker validates the file itself
    _, _, _, again = execute._load(job)
    assert again.sha256 != spec.sha256 and again.data == spec.data


# --- signed mutation receipts ------------------------------------------------------------------------------------


def test_a_signed_mutation_receipt_meets_mutation_score_under_a_trust_policy(toy, tmp_path, monkeypatch):
    """Under a trust policy only signed receipts count, so `mutation_score` needs a signed mutation receipt: the
    unsigned one of the same run is refused, the one signed by the runner's key meets it."""
    monkeypatch.setattr("engine.gate.verdict.refusal", lambda a, impl_file: [])  # as above: the toy lives in tests/
    from engine.run.mutate.session import run, statement
    from engine.store.receipts import utc_now, write_receipt
    from engine.store.signing import usable_signer

    keys = tmp_path / "keys"
    keys.mkdir()
    assert CliRunner().invoke(app, ["keys", "generate", str(keys / "runner")]).exit_code == 0
    policy = keys / "trust.yaml"
    policy.write_text("keys:\n  - public_key: runner.pub\n    devices: [cpu]\n")
    spec = _spec(toy)
    opts = _opts()
    out = run(spec, ROOT, opts)
    ids = [s["id"] for s in out["mutation"]["survivors"]]
    _list_equivalent(toy, ids)
    spec = _spec(toy)
    out = run(spec, ROOT, opts)
    assert out["mutation"]["score"] == 1.0
    receipts = tmp_path / "receipts"

    def requirement(*extra):
        res = CliRunner().invoke(app, ["gate", "toy-mutate", "--specs", str(toy), "--receipts", str(receipts),
                                       "--json", *extra])
        return next(r for r in json.loads(res.stdout)["requirements"] if r["id"] == "mutation_score")

    write_receipt(receipts, statement(spec, ROOT, out, opts, utc_now()))  # unsigned
    assert requirement()["met"] is True
    assert requirement("--trust", str(policy))["met"] is False
    write_receipt(receipts, statement(spec, ROOT, out, opts, utc_now()),
                  sign_key=usable_signer(keys / "runner"))
    req = requirement("--trust", str(policy))
    assert req["met"] is True and req["score"] == 1.0, req


def test_cli_mutate_signs_its_receipt_with_sign_key(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    assert CliRunner().invoke(app, ["keys", "generate", str(keys / "runner")]).exit_code == 0
    store = tmp_path / "store"
    res = CliRunner().invoke(app, ["mutate", "tapo-trajectory", "--only-file", "objective.py", "--max-mutants", "1",
                                   "--receipts", str(store), "--json", "--sign-key", str(keys / "runner")])
    assert res.exit_code in (0, 1), res.output
    (receipt,) = list(store.rglob("*.json"))
    env = json.loads(receipt.read_text())
    assert set(env) == {"payloadType", "payload", "signatures"}  # a DSSE envelope, not a bare Statement
    policy = keys / "trust.yaml"
    policy.write_text("keys:\n  - public_key: runner.pub\n    devices: [cpu]\n")
    v = CliRunner().invoke(app, ["verify", "tapo-trajectory", "--receipts", str(store), "--trust", str(policy)])
    assert "signed by trusted key" in v.stdout, v.output
    bad = CliRunner().invoke(app, ["mutate", "tapo-trajectory", "--max-mutants", "1", "--receipts", str(store),
                                   "--sign-key", str(keys / "missing")])
    assert bad.exit_code == 2 and "signing" in bad.output and len(list(store.rglob("*.json"))) == 1
