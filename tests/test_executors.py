"""Cells (method x seed) in local processes and on Ray give the serial run's receipt; lost cells are recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.harness import without_keys
from engine.cli import app
from engine.store.receipts import check_receipt, receipt_files, schema_problems
from tests import executor_faults as faults

ROOT = Path(__file__).resolve().parent.parent
METHOD = "tapo-trajectory"
# The mechanism run (steps, comparisons, optimizer updates) plus two quick contracts; their mutants run too.
ONLY = ["mechanism", "clip_schedule", "loss_forward"]
SEEDS = [42, 43, 44]
cli = CliRunner()


def check(store: Path, *extra: str):
    args = ["check", METHOD, "--seeds", ",".join(map(str, SEEDS)), "--receipts", str(store)]
    for cid in ONLY:
        args += ["--only", cid]
    return cli.invoke(app, args + list(extra))


def receipt(store: Path) -> dict:
    (path,) = receipt_files(store, METHOD)
    assert check_receipt(path, ROOT).state == "fresh"
    data = json.loads(path.read_text())
    assert schema_problems(data) == []
    return data


TIMES = {"created_at", "finished_at", "receipt_id", "subject_sha256", "wall_s", "execution"}


def measured(pred: dict) -> dict:
    """The predicate without what legitimately differs between two runs: times, ids, thread count, how it ran."""
    out = without_keys(pred, TIMES)
    out["environment"].pop("torch_threads")
    return out


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    # A receipt binds the engine files its process had imported when it was built. Writing the serial check's
    # receipt imports engine.store.bounded (lazily, to read the store back); any later check in this process has
    # it already. Import it first, so that the serial run is compared on the same footing whatever ran before
    # (alone, this module's comparisons failed on engine/store/bounded.py; in the suite, earlier tests hid it).
    import engine.store.bounded  # noqa: F401

    store = tmp_path_factory.mktemp("serial")
    r = check(store)
    assert r.exit_code == 0, r.output
    return receipt(store)


def plans(seeds=SEEDS, only=("clip_schedule",)):
    from engine.run.runner import plan_run
    from engine.spec.loader import load_spec

    spec = load_spec(ROOT / "specs" / f"{METHOD}.yaml", ROOT)
    return [plan_run(spec, list(seeds), list(only))]


def test_jobs_2_receipt_measures_what_the_serial_run_measures(serial, tmp_path):
    r = check(tmp_path, "--jobs", "2")
    assert r.exit_code == 0, r.output
    par = receipt(tmp_path)["predicate"]
    assert par["execution"]["executor"] == "local" and par["execution"]["jobs"] == 2
    assert par["execution"]["threads"] == 1 and par["environment"]["torch_threads"] == 1  # the CPU default
    assert [c["seed"] for c in par["execution"]["cells"]] == SEEDS
    assert par["results"] and par["mechanism"] and par["mutants"]
    assert measured(par) == measured(serial["predicate"])
    # and the same files are bound, plus the executor's own modules, which the workers ran
    par_subj = {s["name"]: s["digest"] for s in receipt(tmp_path)["subject"]}
    ser_subj = {s["name"]: s["digest"] for s in serial["subject"]}
    assert {k: v for k, v in par_subj.items() if k in ser_subj} == ser_subj
    assert set(par_subj) - set(ser_subj) <= {"engine/run/executors.py", "engine/run/worker_server.py"}


def test_jobs_1_is_the_plain_serial_path(tmp_path):
    r = cli.invoke(app, ["check", METHOD, "--seeds", "42", "--only", "clip_schedule", "--receipts", str(tmp_path),
                         "--jobs", "1"])
    assert r.exit_code == 0, r.output
    assert "execution" not in receipt(tmp_path)["predicate"]


def lost_cells(stmt: dict, seed: int) -> list[dict]:
    assert schema_problems(json.loads(json.dumps(stmt))) == []  # a receipt with holes is still a valid receipt
    return [r for r in stmt["predicate"]["results"] if r["seed"] == seed]


def test_a_raising_cell_is_an_error_for_that_cell_only():
    from engine.run.executors import execute

    (stmt,) = execute(plans(), "cpu", jobs=2, cell_fn=faults.raise_on_bad_seed)
    pred = stmt["predicate"]
    bad = lost_cells(stmt, 43)
    assert bad and all(r["status"] == "error" and "RuntimeError: injected failure" in r["message"] for r in bad)
    assert all(r["status"] == "passed" for r in pred["results"] if r["seed"] != 43)
    assert pred["status"] == "error" and any("seed 43" in e for e in pred["errors"])
    assert pred["mutants"] and all(m["killed"] for m in pred["mutants"])  # seed 42 carried them
    cell = next(c for c in pred["execution"]["cells"] if c["seed"] == 43)
    assert cell["status"] == "lost" and "injected failure" in cell["error"]


def test_a_dead_worker_is_recorded_and_replaced():
    from engine.run.executors import execute

    # One worker: seed 44 can only run if the pool replaced the worker that died on seed 43.
    (stmt,) = execute(plans(), "cpu", jobs=1, cell_fn=faults.die_on_bad_seed)
    bad = lost_cells(stmt, 43)
    assert bad and all(r["status"] == "error" and "killed by SIGKILL" in r["message"] for r in bad)
    assert {r["status"] for r in lost_cells(stmt, 44)} == {"passed"}
    assert stmt["predicate"]["status"] == "error"


def test_a_dead_first_seed_cell_marks_its_mutants_not_run():
    from engine.run.executors import execute

    (stmt,) = execute(plans(seeds=[43, 44]), "cpu", jobs=2, cell_fn=faults.exit_on_bad_seed)
    pred = stmt["predicate"]
    assert pred["mutants"] and all(not m["killed"] and m["error"].startswith("not run:") for m in pred["mutants"])
    assert all("exited with code 0" in r["message"] for r in lost_cells(stmt, 43))
    assert pred["status"] == "error"


def test_a_hanging_cell_is_stopped_at_its_deadline():
    from engine.run.executors import execute

    t0 = time.perf_counter()
    # 8 s: far beyond what a healthy cell here needs (well under a second), even on a loaded machine.
    (stmt,) = execute(plans(), "cpu", jobs=2, cell_fn=faults.hang_on_bad_seed, deadline_s=8)
    assert time.perf_counter() - t0 < 60  # worker start-up (torch import) is outside the cell's deadline
    assert all("deadline of 8 s" in r["message"] for r in lost_cells(stmt, 43))
    assert {r["status"] for r in lost_cells(stmt, 42)} == {"passed"}


@pytest.mark.parametrize("args, text", [
    (["--jobs", "0"], "--jobs 0"),
    (["--executor", "dask"], "not an executor"),
    (["--address", "ray://x:10001"], "add --executor ray"),
    (["--executor", "ray", "--jobs", "2"], "--jobs is for the local executor"),
    (["--jobs", "2", "--policy", "hf:{ckpt}"], "--policy runs in one process"),
])
def test_bad_executor_options_are_usage_errors(tmp_path, args, text):
    ckpt = tmp_path / "ckpt"  # passes --policy's own checks without loading anything
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"")
    args = [a.format(ckpt=ckpt) for a in args]
    r = cli.invoke(app, ["check", METHOD, "--receipts", str(tmp_path / "r")] + args)
    assert r.exit_code == 2 and text in r.output, r.output
    assert not receipt_files(tmp_path / "r", METHOD)


def test_workers_never_get_more_threads_than_their_share_of_the_cores(monkeypatch):
    from engine.run.executors import worker_threads

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert worker_threads(2) == 4 and worker_threads(2, 1) == 1 and worker_threads(2, 16) == 4
    assert worker_threads(16) == 1 and worker_threads(3, 2) == 2


def test_threads_reach_the_workers_and_the_receipt(tmp_path):
    r = cli.invoke(app, ["check", METHOD, "--seeds", "42,43", "--only", "clip_schedule", "--receipts", str(tmp_path),
                         "--jobs", "2", "--threads", "8"])
    assert r.exit_code == 0, r.output
    pred = receipt(tmp_path)["predicate"]
    share = max(1, (os.cpu_count() or 1) // 2)
    assert pred["execution"]["threads"] == share and pred["environment"]["torch_threads"] == share


def test_workers_start_with_what_a_cell_imports_already_imported():
    """Every worker would pay a cell's first-use imports again (torch._dynamo, which an optimizer imports:
    about 1 CPU-s): the worker server imports them once, before it forks."""
    from engine.run.executors import run_local, split

    _, cells = split(plans(only=("mechanism",)), "cpu")
    outcomes = run_local(cells, {}, 2, cell_fn=faults.report_imports)
    for o in outcomes.values():
        assert o.failure is None, o.failure
        assert "torch._dynamo" in o.data["before"]
        # Before: 818 modules, torch._dynamo, torch.fx and sympy among them; now a few tiny ones at most.
        assert not [m for m in o.data["imported"] if m.startswith(("torch._dynamo", "torch.fx", "sympy"))]
        assert len(o.data["imported"]) < 20, o.data["imported"]


def test_importing_the_executors_does_not_import_torch():
    code = "import sys, engine.cli, engine.run.executors; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# --- Ray --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_receipt_equals_the_local_executors(ray_local, serial, tmp_path):
    from engine.store.receipts import serialize
    from engine.run.executors import execute
    from engine.run.runner import plan_run
    from engine.spec.loader import load_spec

    spec = load_spec(ROOT / "specs" / f"{METHOD}.yaml", ROOT)
    (stmt,) = execute([plan_run(spec, SEEDS, ONLY)], "cpu", executor="ray")
    stmt = json.loads(serialize(stmt))  # as a receipt file holds it (inf as "Infinity"), like `serial`
    pred = stmt["predicate"]
    assert pred["execution"]["executor"] == "ray" and {c["worker"] for c in pred["execution"]["cells"]} == {"ray"}
    # Ray sets OMP_NUM_THREADS for its workers; the receipt records what the worker ran with, and nothing else differs
    ours, theirs = pred["environment"], serial["predicate"]["environment"]
    assert {k: v for k, v in ours["env"].items() if k != "OMP_NUM_THREADS"} == theirs["env"], ours["env"]
    ours["env"] = theirs["env"]
    assert measured(pred) == measured(serial["predicate"])
    # the same files are bound, plus the executor's module the Ray workers ran
    par_subj = {s["name"]: s["digest"] for s in stmt["subject"]}
    ser_subj = {s["name"]: s["digest"] for s in serial["subject"]}
    assert {k: v for k, v in par_subj.items() if k in ser_subj} == ser_subj
    # the executor's module, and the --policy loader its task function imports (it stays None on this run)
    assert set(par_subj) - set(ser_subj) <= {"engine/run/executors.py", "engine/run/policy.py"}


def test_ray_lost_cells_are_errors_never_hangs(ray_local):
    from engine.run.executors import execute

    (stmt,) = execute(plans(), "cpu", executor="ray", cell_fn=faults.raise_on_bad_seed)
    assert all("RuntimeError: injected failure" in r["message"] for r in lost_cells(stmt, 43))
    (stmt,) = execute(plans(), "cpu", executor="ray", cell_fn=faults.exit_on_bad_seed)
    bad = lost_cells(stmt, 43)
    assert bad and all(r["status"] == "error" and "Ray worker" in r["message"] for r in bad)
    assert {r["status"] for r in lost_cells(stmt, 42)} == {"passed"}
    assert stmt["predicate"]["status"] == "error"


def test_check_cli_on_ray(ray_local, tmp_path):
    r = cli.invoke(app, ["check", METHOD, "--seeds", "42,43", "--only", "clip_schedule", "--receipts", str(tmp_path),
                         "--executor", "ray", "--json"])
    assert r.exit_code == 0, r.output
    run = json.loads(r.stdout)["runs"][0]
    assert run["status"] == "passed" and run["execution"]["executor"] == "ray"


def test_a_worker_running_other_code_is_refused():
    """The receipt binds the driver's files; a cell computed from different files becomes an error, not a result."""
    import dataclasses

    from engine.run.executors import CellOutcome, merge, run_cell, split

    runs, cells = split(plans(seeds=[42]), "cpu")
    (mr,) = runs
    data = run_cell(cells[0])
    assert merge(dataclasses.replace(mr, outcomes={0: CellOutcome(cell=cells[0], data=data)}), "local", 1)[
        "predicate"]["status"] == "passed"
    data["sources"] = dict(data["sources"], **{"methods/tapo/objective.py": "0" * 64})
    stmt = merge(dataclasses.replace(mr, outcomes={0: CellOutcome(cell=cells[0], data=data)}), "local", 1)
    bad = lost_cells(stmt, 42)
    assert bad and all("differ from this checkout's: methods/tapo/objective.py" in r["message"] for r in bad)
    assert stmt["predicate"]["status"] == "error"


def test_a_cuda_run_merges_on_a_driver_without_a_gpu():
    """Ray may run CUDA cells for a driver that has no GPU: merging must not touch a device."""
    import dataclasses

    from engine.run.executors import CellOutcome, merge, run_cell, split

    (cpu_run,), cpu_cells = split(plans(seeds=[42]), "cpu")
    data = run_cell(cpu_cells[0])
    data["environment"] = dict(data["environment"], device={"kind": "cuda", "index": 0, "name": "a GPU",
                                                            "cuda": "12.8", "capability": "9.0"})
    (mr,), cells = split(plans(seeds=[42]), "cuda")
    stmt = merge(dataclasses.replace(mr, outcomes={0: CellOutcome(cell=cells[0], data=data)}), "ray")
    pred = stmt["predicate"]
    assert pred["request"]["device"] == "cuda" and pred["environment"]["device"]["name"] == "a GPU"
    assert pred["status"] == "passed"
    lost = merge(dataclasses.replace(mr, outcomes={}), "ray")["predicate"]
    assert lost["environment"]["device"]["kind"] == "cuda" and lost["status"] == "error"


def test_a_warm_server_started_long_ago_still_spawns_when_its_ready_was_never_read():
    """Its "ready" sat unread in the socket while the startup time ran out: the wait must read it, not say "no
    answer within 0 s" (seen under xdist, where one worker's server outlives the startup time between tests)."""
    import select

    from engine.run import warm

    srv = warm.WarmServer()
    try:
        ready, _, _ = select.select([srv.sock], [], [], 120)  # its "ready" arrives; nobody reads it
        assert ready
        srv.started -= 10_000  # no startup time left
        pid, _, _, log = srv.spawn()
        assert pid > 0
        log.close()
    finally:
        srv.close()
