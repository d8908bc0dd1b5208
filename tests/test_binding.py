"""A receipt binds exactly what measured (engine/run/binding.py, engine/run/sourceonly.py, the gate's refusals).

End to end in a committed copy of the project: front-door edits (CLI, TUI, cache, index, gate, README) leave a
receipt fresh, spec and method edits make it stale; an untracked method package the registry imports makes
the run dirty and the gate refuse it; a planted .pyc stamped with the real file's mtime and size never runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import gate_support as G
from engine.gate.verdict import evaluate
from engine.spec.loader import load_spec
from engine.store import receipts as R

REPO = Path(__file__).resolve().parent.parent
METHOD, CONTRACT = "tapo-trajectory", "prefix_ratio_forward"


def _copy_project(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("engine", "methods", "specs", "tui"):
        shutil.copytree(REPO / folder, dest / folder, ignore=ignore)
    for name in ("README.md", "pyproject.toml", ".gitignore"):
        shutil.copy(REPO / name, dest / name)
    return G.commit_all(dest)


def _check(proj: Path) -> tuple[dict, Path]:
    run = G.contracts(proj, "check", METHOD, "--only", CONTRACT, "--seeds", "42", "--no-mutants", "--device", "cpu",
                     "--json")
    assert run.returncode in (0, 1), run.stderr[-2000:]
    out = json.loads(run.stdout)["runs"][0]
    path = proj / out["receipt"]
    return json.loads(path.read_bytes()), path


def _state(proj: Path, path: Path) -> R.ReceiptCheck:
    return R.check_receipt(path, proj, proj / "specs")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    proj = _copy_project(tmp_path_factory.mktemp("binding") / "proj")
    stmt, path = _check(proj)
    return proj, stmt, path


# --- what is bound ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_clean_run_binds_its_modules_and_environment_but_no_front_door(project):
    proj, stmt, path = project
    names = {s["name"] for s in stmt["subject"]}
    pred = stmt["predicate"]
    assert pred["git"]["dirty"] is False and pred["git"]["untracked"] == [] and pred["git"]["modified"] == []
    assert f"specs/{METHOD}.yaml" in names
    assert {"engine/run/runner.py", "engine/run/session.py", "engine/spec/loader.py", "engine/store/receipts.py",
            "methods/tapo/objective.py", "methods/tapo/impl.py", "methods/common/rollout.py"} <= names
    # all of an imported method package, its modules' files and not only theirs
    assert {p.relative_to(proj).as_posix() for p in (proj / "methods" / "tapo").glob("*.py")} <= names
    assert not [n for n in names if n.startswith(("engine/cli/", "engine/gate/", "tui/"))
                or n in ("engine/store/cache.py", "engine/store/index.py", "engine/store/verify.py", "README.md")]
    assert pred["implementation"] == {"name": "tapo", "files": ["methods/tapo/objective.py", "methods/tapo/proximal.py"]}
    env = pred["environment"]
    assert {"cuda_build", "cudnn", "determinism", "env"} <= set(env)
    assert env["determinism"]["deterministic_algorithms"] in (True, False) and env["torch_threads"] >= 1


FRONT_DOORS = ["engine/cli/check.py", "engine/cli/common.py", "engine/store/cache.py", "engine/store/index.py",
               "engine/store/verify.py", "engine/gate/verdict.py", "tui/app.py", "tui/app.tcss", "README.md"]
MEASURING = [f"specs/{METHOD}.yaml", "methods/tapo/objective.py", "methods/tapo/checks.py", "methods/tapo/reference.py",
             "methods/common/rollout.py", "engine/run/runner.py", "engine/run/session.py"]


@pytest.mark.slow
@pytest.mark.parametrize("edited, stale", [(f, False) for f in FRONT_DOORS] + [(f, True) for f in MEASURING])
def test_front_door_edits_leave_the_receipt_fresh_and_spec_or_measuring_edits_make_it_stale(project, edited, stale):
    proj, _stmt, path = project
    f = proj / edited
    original = f.read_bytes()
    try:
        f.write_bytes(original + b"\n# an edit\n")
        rc = _state(proj, path)
        if stale:
            assert rc.state == "stale" and edited in rc.changed
        else:
            assert rc.state == "fresh", rc.changed
    finally:
        f.write_bytes(original)
    assert _state(proj, path).state == "fresh"


def test_the_measuring_modules_never_import_a_front_door(tmp_path):
    """Plan, run and write a receipt the way `contracts check` does, minus the CLI: no front door gets imported."""
    script = f"""
import sys
from pathlib import Path
from types import SimpleNamespace
import engine.run.worker_server  # what a local worker preloads
from engine.paths import project_root
from engine.run import session
from engine.run.binding import is_front_door
plans = session.load_plans([project_root() / "specs" / "{METHOD}.yaml"], project_root(), [42], ["{CONTRACT}"], False)
session.run_serial(plans, "cpu", Path({str(tmp_path)!r}), SimpleNamespace(stopped=False, hold=False))
print(sorted(m for m in sys.modules if is_front_door(m)))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    assert list(tmp_path.glob(f"{METHOD}/*.json"))


# --- dirty: untracked and modified code -------------------------------------------------------------


@contextlib.contextmanager
def _dirty_run(proj: Path, name: str, source: str):
    """A check run with methods/NAME/__init__.py planted in the project copy, untracked (gone after the block):
    its receipt must say the run was dirty and name the package untracked. Yields (statement, receipt path)."""
    pkg = proj / "methods" / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(source)
    try:
        stmt, path = _check(proj)
        git = stmt["predicate"]["git"]
        assert git["dirty"] is True and f"methods/{name}/__init__.py" in git["untracked"]
        yield stmt, path
    finally:
        shutil.rmtree(pkg)


@pytest.mark.slow
def test_an_untracked_method_package_makes_the_run_dirty_and_the_gate_refuse_it(project):
    proj, _stmt, _path = project
    package = "# imported by the registry with every other method package\nSWAPPED = True\n"
    with _dirty_run(proj, "zz_swap", package) as (stmt, path):
        assert "methods/zz_swap/__init__.py" in {s["name"] for s in stmt["subject"]}
        gate = G.contracts(proj, "gate", METHOD, "--json", "--no-cache")
        verdict = json.loads(gate.stdout)
        refused = {r["receipt_id"]: r for r in verdict["receipts"]["refused"]}
        rid = stmt["predicate"]["receipt_id"]
        assert rid in refused and "untracked methods/zz_swap/__init__.py" in refused[rid]["reasons"][0]
        # rerunning as it is would write one more receipt of the same uncommitted code: no command, a note
        assert refused[rid]["fix"] is None and refused[rid]["note"].startswith("commit (or remove) the files named")
        assert rid not in verdict["receipts"]["fresh"]
        assert any(w.startswith(f"refused receipt receipts/{METHOD}/{path.name}") for w in verdict["warnings"])
    assert _state(proj, path).state == "stale"  # the package it ran with is gone: the receipt says so


@pytest.mark.slow
def test_a_module_that_deletes_itself_after_its_import_still_makes_the_run_dirty(project):
    proj, _stmt, _path = project
    with _dirty_run(proj, "zz_gone", "import os\nos.remove(__file__)  # ran, then left no trace on disk\n"):
        pass  # _dirty_run asserts that the receipt calls the run dirty and names the package


# --- planted bytecode -------------------------------------------------------------------------------

PLANT = b"""
_real_trajectory_ratio = trajectory_ratio


def trajectory_ratio(*args, **kwargs):  # planted: 1.5 times the right answer
    return _real_trajectory_ratio(*args, **kwargs) * 1.5


# the loss builder's default parts follow, so the package's own explicitly fused build still imports
build_tapo_loss.__defaults__ = (trajectory_ratio, *build_tapo_loss.__defaults__[1:])
"""


def _plant(source: Path) -> Path:
    """Bytecode compiled from other source, stamped with the real file's mtime and size, where Python looks."""
    from importlib._bootstrap_external import _code_to_timestamp_pyc

    st = source.stat()
    code = compile(source.read_bytes() + PLANT, str(source), "exec", dont_inherit=True)
    pyc = Path(importlib.util.cache_from_source(str(source)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(bytes(_code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size)))
    return pyc


@pytest.mark.slow
def test_a_planted_pyc_is_never_executed(project):
    proj, _stmt, _path = project
    pyc = _plant(proj / "methods" / "tapo" / "objective.py")
    try:
        # the plant is live: Python's own loader runs it
        probe = subprocess.run([sys.executable, "-c", "import methods.tapo.objective as m; "
                                "print(hasattr(m, '_real_trajectory_ratio'))"],
                               cwd=proj, capture_output=True, text=True, timeout=120)
        assert probe.stdout.strip() == "True", probe.stderr
        # a check runs the source: the contract passes, as it does without the plant
        stmt, _ = _check(proj)
        results = stmt["predicate"]["results"]
        assert results and all(r["status"] == "passed" for r in results), [r["message"] for r in results]
    finally:
        pyc.unlink()


# --- the gate refuses receipts that do not bind what they claim ---------------------------------------


@pytest.fixture
def layout(tmp_path, monkeypatch):
    """A checkout in tmp with the toy spec; the static registry knows the toy names (as in test_gate.py)."""
    root, specs, receipts = G.toy_project(tmp_path, monkeypatch)
    G.approve(root, specs, receipts)
    return root, specs, receipts


def test_a_receipt_that_binds_only_a_checkpoint_is_refused(layout):
    root, specs, receipts = layout
    spec_path = specs / "toy.yaml"
    pred = G.predicate(spec_path, comparisons=G.ahead())
    subject = [{"name": "checkpoint:model.safetensors", "digest": {"sha256": "0" * 64}}]
    R.write_receipt(receipts, R.statement(subject, pred))
    out = evaluate(load_spec(spec_path, root), receipts, root, specs)
    assert not out["promotable"] and out["receipts"]["fresh"] == []
    (refused,) = out["receipts"]["refused"]
    assert refused["reasons"] == ["does not bind its spec specs/toy.yaml",
                                  "does not bind its implementation's src/toy.py"]
    assert any("no fresh cpu receipt (1 fresh cpu receipt(s) refused" in r for r in out["reasons"])
    # the same evidence, binding the spec and the implementation, opens the gate
    G.write(root, receipts, spec_path, comparisons=G.ahead())
    assert evaluate(load_spec(spec_path, root), receipts, root, specs)["promotable"]


@pytest.mark.parametrize("git, reason", [
    ({"commit": "0" * 40, "dirty": True, "untracked": ["methods/x/__init__.py"], "modified": []},
     "ran with uncommitted code (untracked methods/x/__init__.py)"),
    (None, "not run in a git checkout: whether its code was committed is unknown"),
])
def test_a_dirty_receipt_is_never_counted(layout, git, reason):
    root, specs, receipts = layout
    spec_path = specs / "toy.yaml"
    subject = [{"name": "src/toy.py", "digest": {"sha256": R.sha256_file(root / "src" / "toy.py")}},
               {"name": "specs/toy.yaml", "digest": {"sha256": R.sha256_file(spec_path)}}]
    pred = G.predicate(spec_path, comparisons=G.ahead())
    pred["git"] = git
    R.write_receipt(receipts, R.statement(subject, pred))
    out = evaluate(load_spec(spec_path, root), receipts, root, specs)
    assert not out["promotable"] and out["receipts"]["fresh"] == []
    assert out["receipts"]["refused"][0]["reasons"] == [reason]


@pytest.mark.slow
def test_planted_bytecode_of_a_module_imported_before_the_guard_stops_the_run(project):
    """The CLI imports engine.spec.loader before a check installs the source-only finder: a planted .pyc for it
    is found by comparing its code with the source's, and the run stops (exit 4) naming the file to delete."""
    proj, _stmt, _path = project
    source = proj / "engine" / "spec" / "loader.py"
    from importlib._bootstrap_external import _code_to_timestamp_pyc

    st = source.stat()
    code = compile(source.read_bytes() + b"\nPLANTED = True\n", str(source), "exec", dont_inherit=True)
    pyc = Path(importlib.util.cache_from_source(str(source)))
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(bytes(_code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size)))
    try:
        run = G.contracts(proj, "check", METHOD, "--only", CONTRACT, "--seeds", "42", "--no-mutants", "--device", "cpu")
        assert run.returncode == 4, run.stderr[-2000:]
        assert "engine/spec/__pycache__/" in run.stderr and "does not match engine/spec/loader.py" in run.stderr
        assert "Traceback" not in run.stderr
    finally:
        pyc.unlink()


# --- the numeric environment and the git record, without a run -------------------------------------


def test_only_determinism_variables_are_recorded_and_only_plain_short_values():
    from engine.run.binding import WITHHELD, determinism_env

    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OMP_NUM_THREADS": "4", "PYTHONHASHSEED": "0",
           "TORCH_USE_DETERMINISTIC_ALGORITHMS": "1", "MKL_NUM_THREADS": "token=hunter2/secret",
           "AWS_SECRET_ACCESS_KEY": "abc", "HOME": "/home/alice", "TORCH_HOME": "/home/alice/.torch"}
    assert determinism_env(env) == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "MKL_NUM_THREADS": WITHHELD,
                                    "OMP_NUM_THREADS": "4", "PYTHONHASHSEED": "0",
                                    "TORCH_USE_DETERMINISTIC_ALGORITHMS": "1"}


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "engine").mkdir(parents=True)
    (root / "methods" / "m").mkdir(parents=True)
    (root / "engine" / "x.py").write_text("X = 1\n")
    (root / "methods" / "m" / "__init__.py").write_text("M = 1\n")
    (root / ".gitignore").write_text("__pycache__/\nmethods/hidden/\n")
    return G.commit_all(root, "c")


def test_git_state_sees_untracked_ignored_and_flag_hidden_code_but_not_bytecode(tmp_path):
    from engine.run.binding import git_state

    root = _repo(tmp_path)
    bound = ["engine/x.py", "methods/m/__init__.py"]
    clean = git_state(root, bound)
    assert clean["dirty"] is False and clean["untracked"] == [] and clean["modified"] == []
    (root / "methods" / "m" / "__pycache__").mkdir()
    (root / "methods" / "m" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\0" * 16)
    assert git_state(root, bound)["dirty"] is False  # bytecode is not code a receipt binds (sourceonly.py)
    (root / "methods" / "hidden").mkdir()
    (root / "methods" / "hidden" / "__init__.py").write_text("# ignored by .gitignore, imported all the same\n")
    (root / "methods" / "new.py").write_text("N = 1\n")
    state = git_state(root, bound)
    assert state["dirty"] and state["untracked"] == ["methods/hidden/__init__.py", "methods/new.py"]
    # an edit git status is told not to see (skip-worktree) is still an edit of a bound file
    subprocess.run(["git", "update-index", "--skip-worktree", "engine/x.py"], cwd=root, check=True)
    (root / "engine" / "x.py").write_text("X = 2\n")
    assert "engine/x.py" in git_state(root, bound)["modified"]
    assert git_state(tmp_path / "not-a-repo") is None
