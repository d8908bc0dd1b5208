"""Concurrency: processes sharing one receipts folder lose nothing and overwrite nothing.

Two processes each run 20 `contracts check` calls (a short spec over TAPO's
clip-schedule check, well under a second each) into the same folder at once:
there must be exactly 40 receipts afterwards, each one the receipt its run
reported, all verifying. Writers racing for the very same file name still
each get their own file. Two processes promoting and demoting the same method
at once leave a spec and a ledger that `contracts verify` accepts, with no
lost update in the ledger's history; three processes appending to the ledger
directly (no promotion lock around them) still leave one unbroken chain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

import engine.cli as cli
from engine.store import ledger
from engine.store import receipts as R
from engine.paths import project_root
from tests.toy_spec import toy_spec

ROOT = project_root()
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's engine in every subprocess
RUNS_PER_PROCESS = 20


def _start_together(scripts: list[list[str]], go: Path) -> list[subprocess.Popen]:
    """Start every process, let each finish importing, then release them at once through the `go` file."""
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd in scripts]
    time.sleep(0.5)
    go.write_text("go")
    return procs


def _finish(procs: list[subprocess.Popen], timeout: float = 300) -> list[str]:
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-3000:]
        outs.append(out)
    return outs


# A short spec over TAPO's clip-schedule check (the shipped spec takes longer to parse than the check runs).
SHORT_SPEC = toy_spec(
    "clip-only", "tapo", title="TAPO's length-aware clip schedule alone, for the concurrency test",
    arxiv="2610.13020", first_public="2026-10-09", budget={"seeds": [42]},
    formulas='  - {id: length_clip, latex: "eps_t", implements: length_aware_clip}',
    contracts="""\
  - id: clip_schedule
    description: "eps_t matches the float64 formula"
    formulas: [length_clip]
    kind: value
    tier: math
    check: tapo.clip_schedule
    dtypes: [float64]
    cases: 1
    params: {eps_min: 0.1, eps_max: 0.2}
    expect:
      - {metric: max_abs_err, le: 1.0e-12}""",
    mutants="  - {id: clip_reversed, description: reversed, mutant: tapo.clip_reversed, killed_by: [clip_schedule]}")

CHECKER = """\
import json, sys, time
from pathlib import Path
from typer.testing import CliRunner
from engine.cli import app
import engine.run.runner  # noqa: F401  (torch imported before the start line)

specs, store, go, n = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
while not go.exists():
    time.sleep(0.01)
out = []
for _ in range(n):
    r = CliRunner().invoke(app, ["check", "clip-only", "--specs", specs, "--receipts", store, "--json"])
    run = json.loads(r.stdout)["runs"][0]
    out.append({"exit": r.exit_code, "receipt": run["receipt"], "id": run["receipt_id"]})
print(json.dumps(out))
"""


def test_two_processes_twenty_checks_each_into_one_folder(tmp_path):
    store, specs = tmp_path / "receipts", tmp_path / "specs"
    specs.mkdir()
    (specs / "clip-only.yaml").write_text(SHORT_SPEC)
    (tmp_path / "checker.py").write_text(CHECKER)
    go = tmp_path / "go"
    cmd = [sys.executable, str(tmp_path / "checker.py"), str(specs), str(store), str(go), str(RUNS_PER_PROCESS)]
    outs = _finish(_start_together([cmd, cmd], go))
    runs = [r for out in outs for r in json.loads(out)]
    assert len(runs) == 2 * RUNS_PER_PROCESS and all(r["exit"] == 0 for r in runs)
    files = R.receipt_files(store, "clip-only")
    assert len(files) == 2 * RUNS_PER_PROCESS, "exactly one receipt per run: none lost, none overwritten"
    by_id = {json.loads(f.read_bytes())["predicate"]["receipt_id"]: f for f in files}
    assert set(by_id) == {r["id"] for r in runs}, "each file is the receipt its own run reported"
    res = CliRunner().invoke(cli.app, ["verify", "--strict", "--specs", str(specs), "--receipts", str(store), "--json"])
    report = json.loads(res.stdout)
    assert res.exit_code == 0 and report["counts"]["fresh"] == 2 * RUNS_PER_PROCESS, res.output
    assert report["leftovers"] == []


SAME_NAME_WRITER = """\
import sys, time
from pathlib import Path
from engine.store import receipts as R

store, go, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
stmt = R.statement([], {"method": "race", "created_at": "2026-01-01T00:00:00.000000Z", "status": "passed"})
while not go.exists():
    pass
for _ in range(n):
    R.write_receipt(store, stmt)  # every process, every time: the same file name
"""


def test_writers_racing_for_one_file_name_each_get_their_own_file(tmp_path):
    store = tmp_path / "receipts"
    (tmp_path / "writer.py").write_text(SAME_NAME_WRITER)
    go = tmp_path / "go"
    cmd = [sys.executable, str(tmp_path / "writer.py"), str(store), str(go), "25"]
    _finish(_start_together([cmd, cmd, cmd], go))
    files = R.receipt_files(store, "race")
    assert len(files) == 75
    first = files[0].read_bytes()
    assert all(f.read_bytes() == first for f in files), "every file is a whole copy of the one receipt"


# --- promote / demote from two processes -----------------------------------------------------

FLIPPER = """\
import json, sys, time
from pathlib import Path
from typer.testing import CliRunner
import engine.cli as cli
from engine.spec import registry
from tests import gate_support as G

root, go, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
registry._STATIC = G.TOY_NAMES  # the toy method's names, as tests/test_gate.py does
import engine.paths; engine.paths.project_root = lambda: root
args = ["--specs", str(root / "specs"), "--receipts", str(root / "receipts")]
while not go.exists():
    time.sleep(0.001)
codes = []
for i in range(n):
    for verb in ("promote", "demote"):
        extra = ["--allow-unsigned"] if verb == "promote" else []  # no trust policy here: a local store
        r = CliRunner().invoke(cli.app, [verb, "toy", "--reason", f"{verb} {i}", "--by", sys.argv[4], *args, *extra])
        codes.append((verb, r.exit_code, r.output.strip()[-300:]))
print(json.dumps(codes))
"""


def test_promote_and_demote_from_two_processes_leave_a_ledger_verify_accepts(tmp_path, monkeypatch):
    from engine.spec import registry
    from tests import gate_support as G

    monkeypatch.setattr(registry, "_STATIC", G.TOY_NAMES)  # the toy's names, for the review recorded here

    root, specs, receipts = G.make_layout(tmp_path)
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())  # fresh evidence: the gate is open
    G.approve(root, specs, receipts)  # and a review of this spec
    (tmp_path / "flipper.py").write_text(FLIPPER)
    go = tmp_path / "go"
    cmds = [[sys.executable, str(tmp_path / "flipper.py"), str(root), str(go), "12", who] for who in ("a", "b")]
    outs = _finish(_start_together(cmds, go))
    for out in outs:
        for verb, code, text in json.loads(out):
            assert code == 0, (verb, code, text)  # changed it, or found it already so
    report = ledger.read(receipts)
    assert report.problems == [] and report.entries, "an intact hash chain"
    state = "not-promoted"
    for e in report.entries[1:]:  # after the review, every entry starts from the state the one before it left
        assert e["old_state"] == state, (e["seq"], e["old_state"], state)
        state = e["new_state"]
    spec_state = "promoted" if 'state: "promoted"' in (specs / "toy.yaml").read_text() else "not-promoted"
    assert spec_state == state
    verify = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; import engine.cli as cli; "
         "from engine.spec import registry; from tests import gate_support as G; registry._STATIC = G.TOY_NAMES; "
         "root = Path(sys.argv[1]); import engine.paths; engine.paths.project_root = lambda: root; sys.argv = ['contracts', 'verify', "
         "'--strict', '--specs', sys.argv[2], '--receipts', sys.argv[3]]; cli.main()",
         str(root), str(specs), str(receipts)],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr


APPENDER = """\
import sys, time
from pathlib import Path
from engine.store import ledger

store, go, n, who = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
while not go.exists():
    pass
for i in range(n):
    old, new = ("not-promoted", "promoted") if i % 2 == 0 else ("promoted", "not-promoted")
    ledger.append(store, method=f"m-{who}", action="promote" if i % 2 == 0 else "demote", old_state=old,
                  new_state=new, reason=f"{who} {i}", receipts=[])
"""


def test_ledger_appends_from_three_processes_keep_one_unbroken_chain(tmp_path):
    """The ledger's own lock, without the promotion lock around it: seq and prev still see every earlier line."""
    store = tmp_path / "receipts"
    (tmp_path / "appender.py").write_text(APPENDER)
    go = tmp_path / "go"
    cmds = [[sys.executable, str(tmp_path / "appender.py"), str(store), str(go), "40", who] for who in "abc"]
    _finish(_start_together(cmds, go))
    report = ledger.read(store)
    assert report.problems == [] and [e["seq"] for e in report.entries] == list(range(1, 121))
    for who in "abc":  # each writer's own entries, in its order
        assert [e["reason"] for e in report.entries if e["method"] == f"m-{who}"] == [f"{who} {i}" for i in range(40)]
