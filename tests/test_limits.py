"""Limits that hold against a hostile candidate: each class of attack planted, and the bounded cost shown.

The candidate's process gets hard rlimits it cannot raise, a size-bounded /tmp (in the sandbox), a bounded read
of its output, answers no larger than their call justifies (judged from the header), call backs bounded in what
they pass and in what they make the checks hold, and the call deadline over its import.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from engine.cli import app

ROOT = Path(__file__).resolve().parent.parent

PROBE = '''
import os
import resource
import sys
import time

import torch


def raise_memory(x):
    """Try to lift the address-space cap and reserve past it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        lifted = True
    except (ValueError, OSError):
        lifted = False
    try:
        big = torch.empty(8 << 30, dtype=torch.uint8)  # 8 GiB past a 2 GiB cap
        reserved = big.numel()
    except (RuntimeError, MemoryError):
        reserved = 0
    return torch.tensor([soft == hard, lifted, reserved > 0])


def raise_files(x):
    out = []
    for name in ("RLIMIT_FSIZE", "RLIMIT_NOFILE"):
        which = getattr(resource, name)
        soft, hard = resource.getrlimit(which)
        try:
            resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            out.append(True)
        except (ValueError, OSError):
            out.append(False)
    return torch.tensor(out)


def flood(x):
    """Print far more than any report needs: 256 MiB."""
    line = "x" * (1 << 20)
    for _ in range(256):
        print(line, flush=True)
    return x


def huge(x):
    """An answer of 256 MiB to a call that passed 4 bytes."""
    return torch.zeros(1 << 26)


def amplify(policy, n):
    """Call the checks' policy with far more token ids than any score needs."""
    return policy(torch.zeros(int(n), dtype=torch.long))


def keep_graphs(policy, n):
    """Many call backs, each under the token bound, each output kept with grad: the checks hold every graph."""
    kept = [policy(torch.zeros(1 << 16, dtype=torch.long)) for _ in range(int(n))]
    return sum(k.sum() for k in kept)


def hidden_scratch(x, mib):
    """Scratch the allocation meter cannot see: bytes from a bytearray, written through torch.frombuffer."""
    buf = bytearray(max(1, int(mib) << 20))
    view = torch.frombuffer(buf, dtype=torch.uint8)
    view.fill_(1)
    return x.sum() + float(view[-1])
'''
NAMES = ["raise_memory", "raise_files", "flood", "huge", "amplify", "keep_graphs", "hidden_scratch"]


class Wide(torch.nn.Module):
    """A policy whose forward saves a wide activation per token (1 KiB of floats), like a real model's."""

    vocab_size = 4

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(4, 256)

    def forward(self, tokens):
        return torch.tanh(self.emb(tokens)).mean(-1)


@pytest.fixture
def probe(tmp_path):
    from engine.run import boundary

    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    conn = boundary.plain()
    msg = conn.load({"target": {"form": "file", "path": str(path)}, "names": NAMES, "device": "cpu", "threads": 1,
                     "memory_mb": 2048, "cwd": str(tmp_path)}, 180)
    assert msg["op"] == "loaded" and not msg["missing"], msg
    conn.deadline_s = 120.0
    yield boundary.implementation(conn, "probe", NAMES), conn
    conn.close(kill=True)


def test_the_address_space_cap_is_hard_the_candidate_cannot_raise_it_or_reserve_past_it(probe):
    impl, _ = probe
    hard, lifted, reserved = impl.raise_memory(torch.zeros(1)).tolist()
    assert hard and not lifted and not reserved


def test_file_size_and_open_file_limits_are_hard(probe):
    impl, _ = probe
    assert impl.raise_files(torch.zeros(1)).tolist() == [False, False]


def test_a_stdout_flood_is_cut_at_the_file_limit_and_read_only_at_its_tail(probe):
    from engine.run import call_loop
    from engine.run.isolation import LOG_TAIL, log_tail

    impl, conn = probe
    rss = _resident()
    with pytest.raises(BaseException):  # noqa: B017 - killed by SIGXFSZ, or its write refused (EFBIG): either way
        impl.flood(torch.zeros(1))
    size = os.fstat(conn.log.fileno()).st_size
    assert size <= call_loop.FILE_LIMIT  # 64 MiB of the 256 it printed reached the checks' file
    reads = []

    class Counted:  # the log file, with each read's size noted
        def seek(self, *a):
            return conn.log.seek(*a)

        def read(self, n=-1):
            reads.append(n)
            return conn.log.read(n)

    assert log_tail(Counted()) == "x" * 300  # the last line, cut to 300 printable characters
    assert reads and all(0 <= n <= LOG_TAIL for n in reads)  # never the whole file
    assert _resident() - rss < 64 << 20


def test_an_answer_larger_than_its_call_justifies_is_refused_from_its_header(probe):
    from engine.run.boundary import CandidateLost

    impl, conn = probe
    rss = _resident()
    with pytest.raises(CandidateLost, match="refused from its header"):
        impl.huge(torch.zeros(1))
    assert _resident() - rss < 128 << 20  # the 256 MiB were never read


def test_a_call_back_with_more_token_ids_than_the_bound_is_refused_before_the_forward(probe):
    from engine.run import boundary

    impl, conn = probe
    policy = Wide()
    assert impl.amplify(policy, 1000).shape == (1000,)
    with pytest.raises(ValueError, match="at most 1048576 token ids"):
        impl.amplify(policy, boundary.MAX_CALLBACK_TOKENS + 1)


def test_call_backs_that_make_the_checks_hold_too_much_lose_the_candidate(probe, monkeypatch):
    """Each call back is small, but the graphs kept for the call's gradient (saved activations) add up: past
    MAX_CALL_GROWTH (lowered here to 64 MiB) the candidate is lost, whatever its answers' sizes say."""
    from engine.run import boundary

    impl, conn = probe
    monkeypatch.setattr(boundary, "MAX_CALL_GROWTH", 64 << 20)
    policy = Wide()
    with torch.enable_grad():
        with pytest.raises(boundary.CandidateLost, match="grew the checks by"):
            impl.keep_graphs(policy, 64)  # 64 x 65536 tokens x 1 KiB saved: 4 GiB unbounded


def test_a_metered_call_is_also_measured_from_outside_by_the_kernels_high_water_mark(probe):
    """The call loop's meter counts torch storage, so scratch in a bytearray reads 0 there; the supervisor's own
    reading of the process (VmHWM, reset before the call) sees it, less the frames' transport."""
    impl, conn = probe
    x = torch.zeros(1 << 20)
    readings = {}
    for mib in (1, 512):
        with impl.hidden_scratch.metered() as meter:
            impl.hidden_scratch(x, mib)
        readings[mib] = (meter.peak_bytes, meter.outside_peak_bytes)
    assert readings[512][0] < 1 << 20  # the candidate's own meter: nothing
    assert readings[512][1] is not None and readings[512][1] >= 384 << 20  # the kernel's: most of the 512 MiB
    assert readings[1][1] is not None and readings[1][1] < 64 << 20


def test_a_child_forked_at_import_is_not_the_process_measured_from_outside(tmp_path):
    """The outside reading follows the call loop's process, fixed before the candidate loads: a candidate that forks
    an idle child at import (the deepest descendant once it runs) still has its own scratch measured."""
    from engine.run import boundary

    path = tmp_path / "forks.py"
    path.write_text("import os\nimport time\n\nif os.fork() == 0:\n    time.sleep(120)\n    os._exit(0)\n"
                    + PROBE)
    conn = boundary.plain()
    try:
        msg = conn.load({"target": {"form": "file", "path": str(path)}, "names": ["hidden_scratch"],
                         "device": "cpu", "threads": 1, "memory_mb": 2048, "cwd": str(tmp_path)}, 180)
        assert msg["op"] == "loaded" and not msg["missing"], msg
        conn.deadline_s = 120.0
        impl = boundary.implementation(conn, "forks", ["hidden_scratch"])
        assert conn.candidate_pid() == conn.proc.pid
        with impl.hidden_scratch.metered() as meter:
            impl.hidden_scratch(torch.zeros(1 << 20), 512)
        assert meter.outside_peak_bytes is not None and meter.outside_peak_bytes >= 384 << 20
    finally:
        conn.close(kill=True)


# the candidate re-points the call loop's meter (its process's __main__) so every reading is zeros
REPOINT_METER = ("import sys as _sys\n"
                 "_sys.modules['__main__']._metered = lambda meter, fn: fn()\n")


@pytest.mark.parametrize("repoint", [False, True], ids=["bytearray-scratch", "scratch-and-meter-re-pointed"])
def test_a_budget_whose_scratch_hides_from_the_in_process_meter_fails_on_the_outside_reading(tmp_path, repoint):
    """MRTPO js_distance with ten [N, V] units of scratch in a bytearray (and, second, the call loop's meter
    re-pointed to report nothing): the candidate's own reading shows almost nothing, the kernel's high-water mark
    does, and js_memory fails on it."""
    text = (ROOT / "tests" / "fixtures" / "my_mrtpo.py").read_text()
    old = "def js_distance(logp_a, logp_b, chunk_elems=1048576):\n"
    assert old in text
    cand = tmp_path / "scratchy.py"
    text = text.replace(old, old + "    _scratch = torch.frombuffer(bytearray(10 * logp_a.numel() * 4), "
                                   "dtype=torch.uint8)\n    _scratch.fill_(1)\n")
    cand.write_text(_after_future(text, REPOINT_METER) if repoint else text)
    r = CliRunner().invoke(app, ["check", "mrtpo", "--impl", str(cand), "--only", "js_memory", "--no-mutants",
                                 "--seeds", "42", "--receipts", str(tmp_path / "r")])
    assert r.exit_code == 1, r.output
    (path,) = (tmp_path / "r" / "mrtpo").glob("*.json")
    pred = json.loads(path.read_text())["predicate"]
    m = next(x for x in pred["results"] if x["status"] == "failed")["measurements"]
    assert m["outside_peak_memory_ratio"] > 1.0 and m["peak_memory_ratio"] == m["outside_peak_memory_ratio"]


def test_a_sleep_at_import_is_held_to_the_call_deadline(tmp_path):
    from engine.run import boundary
    from engine.run.isolation import WorkerLost

    path = tmp_path / "slow.py"
    path.write_text("import time\ntime.sleep(300)\n")
    conn = boundary.plain()
    try:
        assert conn.wait_ready(180)  # torch imported: what is left is the candidate's own import
        t0 = time.monotonic()
        with pytest.raises(WorkerLost, match="did not finish loading within 3 s"):
            conn.load({"target": {"form": "file", "path": str(path)}, "names": ["f"], "device": "cpu",
                       "threads": 1, "memory_mb": 0, "cwd": str(tmp_path)}, 180, load_s=3)
        assert time.monotonic() - t0 < 20
    finally:
        conn.close(kill=True)
    assert conn.proc.poll() is not None  # nothing left running


def test_impl_timeout_covers_the_candidates_import_end_to_end(tmp_path):
    """`check --impl` with --impl-timeout 5 on a file that sleeps at import: an error within seconds, not the
    180 s start-up allowance."""
    cand = tmp_path / "sleepy.py"
    cand.write_text(_after_future((ROOT / "tests" / "fixtures" / "my_tapo.py").read_text(),
                                  "import time\ntime.sleep(120)\n"))
    t0 = time.monotonic()
    r = CliRunner().invoke(app, ["check", "tapo-trajectory", "--impl", str(cand), "--only", "clip_schedule",
                                 "--no-mutants", "--impl-timeout", "5", "--receipts", str(tmp_path / "r"),
                                 "--no-sandbox"])
    assert time.monotonic() - t0 < 60, r.output
    assert r.exit_code != 0 and "within 5 s" in r.output


def test_the_sandboxs_tmp_is_bounded(tmp_path):
    """A candidate that fills /tmp at import: past the bound its writes fail (ENOSPC) and the host's memory does
    not grow with them; the candidate asserts the bound itself and would fail to load without it."""
    from engine.run import sandbox

    if sandbox.unavailable():
        pytest.skip(sandbox.unavailable())
    if not sandbox.sizes_tmpfs():
        pytest.skip("this bubblewrap cannot bound a tmpfs (--size needs 0.7)")
    fill = (
        "import errno\n"
        "_written = 0\n"
        "try:\n"
        "    with open('/tmp/fill', 'wb') as _f:\n"
        "        for _ in range(1024):\n"
        "            _f.write(b'x' * (1 << 20))\n"
        "            _written += 1 << 20\n"
        "except OSError as _e:\n"
        "    assert _e.errno in (errno.ENOSPC, errno.EFBIG), _e\n"
        f"assert _written <= {sandbox.TMP_BYTES}, _written\n"
    )
    cand = tmp_path / "filler.py"
    cand.write_text(_after_future((ROOT / "tests" / "fixtures" / "my_tapo.py").read_text(), fill))
    r = CliRunner().invoke(app, ["check", "tapo-trajectory", "--impl", str(cand), "--only", "clip_schedule",
                                 "--no-mutants", "--seeds", "42", "--receipts", str(tmp_path / "r"), "--json"])
    assert r.exit_code == 0, r.output
    (run,) = json.loads(r.stdout)["runs"]
    (path,) = (tmp_path / "r" / "tapo-trajectory").glob("*.json")
    iso = json.loads(path.read_text())["predicate"]["isolation"]
    assert iso["tmp_bytes"] == sandbox.TMP_BYTES and run["status"] in ("passed", "partial")


def _resident() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _after_future(text: str, code: str) -> str:
    """`code` run at import, placed after the module's `from __future__` line (which must come first)."""
    marker = "from __future__ import annotations\n"
    assert marker in text
    return text.replace(marker, marker + code, 1)


def test_a_policy_can_refuse_receipts_resting_on_the_candidates_own_readings(tmp_path):
    """`require: [measured_in_supervisor]`: an --impl receipt with a budget contract (its operations and time are
    the candidate process's own readings) is not counted, and the gate and verify say why; the same check without
    that contract counts. `checks_in_supervisor` holds for every --impl receipt of the five methods."""
    pipeline = tmp_path / "pipeline"
    pipeline.mkdir()
    key = pipeline / "runner"
    assert CliRunner().invoke(app, ["keys", "generate", str(key)]).exit_code == 0
    policy = pipeline / "strict.yaml"
    policy.write_text("keys:\n  - public_key: runner.pub\n    devices: [cpu]\n"
                      "require: [sandboxed, checks_in_supervisor, measured_in_supervisor]\n")
    store = tmp_path / "store"
    fixture = ROOT / "tests" / "fixtures" / "my_mrtpo.py"

    def check(only: str) -> str:
        r = CliRunner().invoke(app, ["check", "mrtpo", "--impl", str(fixture), "--only", only, "--no-mutants",
                                     "--seeds", "42", "--receipts", str(store), "--sign-key", str(key), "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["runs"][0]["receipt_id"]

    metered = check("js_vectorised")
    plain = check("beta_schedule")
    g = CliRunner().invoke(app, ["gate", "mrtpo", "--impl", str(fixture), "--receipts", str(store), "--trust",
                                 str(policy), "--json"])
    doc = json.loads(g.stdout)
    assert doc["receipts"]["fresh"] == [plain]
    (refused,) = doc["receipts"]["untrusted"]
    assert refused["receipt_id"] == metered and refused["why"] == "checked in candidate"
    assert "requires measured_in_supervisor and js_vectorised rest on readings" in refused["message"]
    v = CliRunner().invoke(app, ["verify", "mrtpo", "--receipts", str(store), "--trust", str(policy), "--strict"])
    assert v.exit_code == 1 and "1 checked in candidate" in v.output, v.output
