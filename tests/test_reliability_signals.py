"""Faults during a run: Ctrl-C, SIGTERM, SIGKILL, a full disk or a read-only receipts folder lose no evidence.

Signals go to real `contracts check` processes. A driver script registers a
test-only method whose checks drop a marker file when they start, so the
signal lands at a known point: after three results, inside the fourth check.
The receipt must then say `interrupted` and hold exactly the three finished
results (or there is no receipt at all), verify as intact, and the process
exits 130. The same is checked on the shipped TAPO mechanism contract with
`python -m engine.cli`. SIGKILL during receipt writes leaves only complete
receipts (temporary files are hidden and never read as receipts). A receipts
folder that cannot be written stops the command with one line and exit 4
before any check runs.
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.cli as cli
from engine.store import receipts as R
from engine.paths import project_root
from engine.store.verify import store_files
from tests.toy_spec import toy_spec

ROOT = project_root()
# Subprocesses import this checkout's engine, whatever `pip install -e` points at.
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

SIGNAL_PACKAGE = '''\
"""Test-only checks for the signal tests: each drops a marker file when it starts."""

import ctypes
import os
import time
from pathlib import Path

from engine.spec import registry

MARKS = Path(os.environ["RELIAB_MARKS"])


def double(x):
    return 2 * x


IMPL = registry.implementation("reliab_signal", double=double)


def _mark(name, ctx):
    (MARKS / f"{name}-{ctx.seed}").write_text("started")


@registry.check("reliab_signal.quick")
def quick(impl, ctx):
    _mark("quick", ctx)
    return {"err": 0.0}


@registry.check("reliab_signal.block")
def block(impl, ctx):
    _mark("block", ctx)
    # The signal arrives while this sleeps inside a C-level PyRun_String call, as it can inside torch's
    # pybind11 code: CPython then remembers the KeyboardInterrupt even though the runner catches it.
    run = ctypes.pythonapi.PyRun_String
    run.restype = ctypes.py_object
    run.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
    scope = {"__builtins__": __builtins__}
    run(b"import time\\ntime.sleep(60)\\n", 257, scope, scope)  # 257: Py_file_input
    return {"err": 0.0}


@registry.mutant("reliab_signal.broken", base="reliab_signal")
def broken():
    return IMPL.replace("reliab_signal.broken", double=lambda x: 3 * x)
'''

SIGNAL_SPEC = toy_spec(
    "reliab-signal", "reliab_signal", title="Test-only: a run that is interrupted", arxiv="2601.00003",
    budget={"seeds": [1, 2, 3], "max_seeds": 3, "max_wall_seconds": 600},
    formulas='  - {id: f1, latex: "y = 2x", implements: double}',
    contracts="""\
  - {id: quick, description: finishes at once, formulas: [f1], kind: value, tier: math, check: reliab_signal.quick,
     dtypes: [float64], cases: 1, expect: [{metric: err, le: 1.0e-12}]}
  - {id: block, description: blocks until interrupted, formulas: [f1], kind: value, tier: math, check: reliab_signal.block,
     dtypes: [float64], cases: 1, expect: [{metric: err, le: 1.0e-12}]}""",
    mutants="  - {id: broken, description: 3x, mutant: reliab_signal.broken, killed_by: [quick, block]}")

# The real CLI entry point, after the test-only method has registered itself in this process. Run with
# `python -m`, as `python -m engine.cli` is (a module run exits differently from a script on CPython).
DRIVER = """\
import sys
import reliab_signal_pkg  # noqa: F401  (registers the test-only method)
from engine.cli import main
sys.argv = ["contracts", *sys.argv[1:]]
main()
"""


def _wait_for(predicate, timeout: float, proc: subprocess.Popen, poll: float = 0.02) -> None:
    t0 = time.monotonic()
    while not predicate():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the process ended (exit {proc.returncode}) before the signal: {err[-2000:]}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            pytest.fail("timed out waiting for the run to reach the signal point")
        time.sleep(poll)


def _receipts(store: Path, method: str) -> list[Path]:
    return sorted((store / method).glob("*.json")) if (store / method).is_dir() else []


@pytest.fixture
def signal_layout(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "reliab_signal_pkg.py").write_text(SIGNAL_PACKAGE)
    (pkg / "reliab_signal_driver.py").write_text(DRIVER)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "reliab-signal.yaml").write_text(SIGNAL_SPEC)
    marks = tmp_path / "marks"
    marks.mkdir()
    return pkg, specs, marks, tmp_path / "receipts"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_check_leaves_an_interrupted_receipt_with_every_finished_result(signal_layout, signum):
    pkg, specs, marks, store = signal_layout
    env = {**ENV, "RELIAB_MARKS": str(marks), "PYTHONPATH": f"{ROOT}{os.pathsep}{pkg}"}
    proc = subprocess.Popen([sys.executable, "-m", "reliab_signal_driver", "check", "reliab-signal",
                             "--specs", str(specs), "--receipts", str(store)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: (marks / "block-1").exists(), 120, proc)
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the process did not stop after the signal")
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    (path,) = _receipts(store, "reliab-signal")
    pred = json.loads(path.read_text())["predicate"]
    assert pred["status"] == "interrupted"
    assert [(r["contract"], r["seed"], r["status"]) for r in pred["results"]] == [
        ("quick", 1, "passed"), ("quick", 2, "passed"), ("quick", 3, "passed")]
    assert any("interrupted" in e for e in pred["errors"])
    assert R.check_receipt(path, ROOT, specs).state in ("fresh", "stale"), "a complete, intact receipt"
    assert not (marks / "block-2").exists(), "nothing ran after the signal"
    files, leftovers = store_files(store)
    assert [p for p, _, _ in files] == [path] and leftovers == []


def test_sigterm_during_the_shipped_mechanism_check(tmp_path):
    """`python -m engine.cli check` on TAPO's mechanism contract, stopped inside its second seed.

    A wrapper drops a marker as the runner starts its second check call, and the signal is sent when the
    marker appears: the shipped check is then inside real torch code, with one seed and the mutant still to
    run. (A fixed sleep raced: on a fast machine the whole run ends in about a second.)
    """
    store, marker = tmp_path / "receipts", tmp_path / "second-call"
    driver = (
        "import sys, pathlib; import engine.run.runner as r; orig = r.Runner.call; calls = []; marker = sys.argv.pop(1)\n"
        "def call(self, *a, **k):\n"
        "    calls.append(1)\n"
        "    if len(calls) == 2: pathlib.Path(marker).write_text('started')\n"
        "    return orig(self, *a, **k)\n"
        "r.Runner.call = call\nsys.argv = ['contracts', *sys.argv[1:]]\n"
        "from engine.cli import main; main()"
    )
    proc = subprocess.Popen([sys.executable, "-c", driver, str(marker), "check", "tapo-trajectory",
                             "--only", "mechanism", "--seeds", "42,43,44", "--receipts", str(store)],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(marker.exists, 120, proc, poll=0.002)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    (path,) = _receipts(store, "tapo-trajectory")
    pred = json.loads(path.read_text())["predicate"]
    assert pred["status"] == "interrupted"
    assert [(r["contract"], r["seed"], r["status"]) for r in pred["results"]] == [("mechanism", 42, "passed")]
    assert pred["mutants"] == [], "the run did not get to the mutants"
    assert R.check_receipt(path, ROOT).state in ("fresh", "stale")


def test_a_signal_before_the_runner_starts_exits_130_and_writes_nothing(tmp_path):
    """Interrupted before the runner starts (while planning, torch just imported): no receipt, exit 130."""
    store = tmp_path / "receipts"
    proc = subprocess.Popen([sys.executable, "-c",
                             "import os, signal, sys; import engine.run.runner as r; orig = r.plan_run\n"
                             "def plan(*a, **k):\n    os.kill(os.getpid(), signal.SIGTERM)\n    return orig(*a, **k)\n"
                             "r.plan_run = plan\nsys.argv = ['contracts', *sys.argv[1:]]\n"
                             "from engine.cli import main; main()",
                             "check", "tapo-trajectory", "--only", "clip_schedule", "--receipts", str(store)],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted"
    assert _receipts(store, "tapo-trajectory") == []


def test_a_signal_while_the_receipt_is_written_still_leaves_it_whole(tmp_path, monkeypatch):
    """A signal that arrives as the receipt is being written is noted, not obeyed mid-write: exit 130 after."""
    calls = []
    real_write = R.write_receipt

    def write_with_a_signal(receipts_dir, stmt, **kw):
        os.kill(os.getpid(), signal.SIGINT)  # delivered right now, inside the write
        calls.append(1)
        return real_write(receipts_dir, stmt, **kw)

    monkeypatch.setattr(R, "write_receipt", write_with_a_signal)
    res = CliRunner().invoke(cli.app, ["check", "tapo-trajectory", "--only", "clip_schedule",
                                       "--receipts", str(tmp_path)])
    assert calls == [1] and res.exit_code == 130, res.output
    (path,) = _receipts(tmp_path, "tapo-trajectory")
    assert R.check_receipt(path, ROOT).state in ("fresh", "stale")
    assert json.loads(path.read_text())["predicate"]["status"] == "passed", "the run itself had finished"


# --- SIGKILL ----------------------------------------------------------------------------------------

WRITER = """\
import builtins, os, signal, sys, time
from pathlib import Path
from engine.store import receipts as R

root, store, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
subject = [{"name": "bound.txt", "digest": {"sha256": R.sha256_file(root / "bound.txt")}}]
blob = "x" * 4_000_000  # big enough that a kill may land mid-write


def stmt(n):
    return R.statement(subject, {"schema": "paper-contracts/receipt/v1", "method": "killed",
                                 "created_at": R.utc_now(), "status": "passed", "n": n, "blob": blob})


real_open = builtins.open


# mode "half": the process dies (SIGKILL) with half of the receipt's bytes on disk, as in a crash.
# mode "loop": the bytes go out in fsynced chunks, so a write lasts long enough for a kill to land in it.
class DiesHalfway:

    def __init__(self, f):
        self.f = f

    def write(self, data):
        if sys.argv[3] == "loop":
            for i in range(0, len(data), 1 << 18):
                self.f.write(data[i:i + (1 << 18)])
                self.f.flush()
                os.fsync(self.f.fileno())
                time.sleep(0.005)  # 16 chunks: a write lasts 80 ms or more
            return len(data)
        self.f.write(data[: len(data) // 2])
        self.f.flush()
        os.fsync(self.f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.f.__exit__(*exc)


def dying_open(file, mode="r", *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    if str(file).startswith(str(store)) and "b" in mode and ("w" in mode or "x" in mode):
        return DiesHalfway(f)
    return f


builtins.open = dying_open
if mode == "loop":  # write until killed
    n = 0
    while True:
        n += 1
        R.write_receipt(store, stmt(n))
R.write_receipt(store, stmt(1))
"""


def _writer(tmp_path: Path, mode: str) -> tuple[list, Path, Path]:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    (root / "bound.txt").write_text("bound\n")
    (tmp_path / "writer.py").write_text(WRITER)
    return [sys.executable, str(tmp_path / "writer.py"), str(root), str(tmp_path / "store"), mode], root, \
        tmp_path / "store"


def test_sigkill_halfway_through_a_receipt_leaves_no_receipt_and_the_others_intact(tmp_path):
    cmd, root, store = _writer(tmp_path, "half")
    earlier = R.write_receipt(store, R.statement(
        [{"name": "bound.txt", "digest": {"sha256": R.sha256_file(root / "bound.txt")}}],
        {"method": "killed", "created_at": R.utc_now(), "status": "passed"}))
    before = earlier.read_bytes()
    proc = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    files, leftovers = store_files(store)
    assert [p for p, _, _ in files] == [earlier] and earlier.read_bytes() == before
    assert len(leftovers) == 1 and leftovers[0].startswith(f"killed/{R.TMP_PREFIX}"), leftovers
    assert R.receipt_files(store) == [earlier], "the half-written bytes never carry a receipt's name"


def test_sigkill_at_random_moments_leaves_only_complete_receipts(tmp_path):
    """Each writer finishes one receipt, then is killed at a seeded moment (7-65 ms) after its next write began:
    inside that write, which lasts 80 ms or more."""
    cmd, root, store = _writer(tmp_path, "loop")
    folder, rng = store / "killed", random.Random(7)

    def names() -> set[str]:
        return {p.name for p in folder.iterdir()} if folder.is_dir() else set()

    for _ in range(6):
        start = names()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for(lambda: any(not n.startswith(".") for n in names() - start), 60, proc, poll=0.001)  # one done
        done = names()
        _wait_for(lambda: bool(names() - done), 60, proc, poll=0.001)  # the next write has begun
        time.sleep(rng.uniform(0, 0.1))
        proc.kill()
        proc.wait()
    files, leftovers = store_files(store)
    assert files, "some receipts were written between the kills"
    for path, _, _ in files:
        rc = R.check_receipt(path, root)
        assert rc.state == "fresh", (path.name, rc.state, rc.message)
    assert all(Path(f).name.startswith(R.TMP_PREFIX) for f in leftovers)
    assert leftovers, "no kill landed inside a write: the test did not test anything"


# --- receipts folder that cannot be written: exit 4, one line, before any check runs ---------------


def _unwritable(kind: str, tmp_path: Path, monkeypatch) -> Path:
    store = tmp_path / "receipts"
    if kind == "path_is_a_file":
        store.write_text("not a folder")
    elif kind == "inside_a_file":
        (tmp_path / "file").write_text("x")
        store = tmp_path / "file" / "receipts"
    else:
        store.mkdir()
        code = errno.ENOSPC if kind == "disk_full" else errno.EROFS
        real_open = open

        def failing_open(file, mode="r", *args, **kwargs):
            if str(file).startswith(str(store)) and any(c in mode for c in "wxa"):
                raise OSError(code, os.strerror(code), str(file))
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr("builtins.open", failing_open)
    return store


@pytest.mark.parametrize("kind", ["path_is_a_file", "inside_a_file", "disk_full", "read_only"])
def test_an_unwritable_receipts_folder_is_one_line_and_exit_4_before_any_check(kind, tmp_path, monkeypatch):
    import engine.run.runner as runner_mod

    store = _unwritable(kind, tmp_path, monkeypatch)
    started = []
    real_call = runner_mod.Runner.call

    def counting_call(self, *args, **kwargs):
        started.append(1)
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(runner_mod.Runner, "call", counting_call)
    res = CliRunner().invoke(cli.app, ["check", "tapo-trajectory", "--only", "clip_schedule",
                                       "--receipts", str(store)])
    assert res.exit_code == 4, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "not writable" in lines[0] and "--receipts" in lines[0], lines
    assert "Traceback" not in res.output
    assert started == [], "no check may run when its receipt cannot be written"
