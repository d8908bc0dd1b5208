"""Suite-wide test order, parallel workers, and the fuzz profiles.

Tests marked `last` run after all others: the receipt leak scan
(tests/test_reliability_leaks.py) reads every receipt the suite wrote, so it
has to come after the tests that write them.

The suite runs in pytest-xdist workers (`-n auto --dist load --maxschedchunk 4` in
pyproject.toml; docs/testing.md). What that needs, all here:

* `last` still means last: the items are sorted to the end of the collection,
  which `--dist load` hands out in order, so no other test is given out after
  one; the worker that reaches it waits until every other worker has finished
  its own tests (or reached a `last` test too) before running it;
* `-n auto` means one worker per core plus one (the waits inside heavy tests
  leave a core idle otherwise), and each worker gets its share of the cores as
  torch threads, at least one (two workers with two threads each on two cores
  would only wait for each other);
* values every worker must share (the leak canary) are set here, in the
  process that starts the workers, before they start.

The hypothesis profiles of tests/test_fuzz_specs.py are registered here, before
the hypothesis plugin reads `--hypothesis-profile`, so that
`pytest tests/test_fuzz_specs.py --hypothesis-profile=long` works.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from pathlib import Path

import pytest

# tests/ is a regular package (tests/__init__.py) so that `tests.x` is this folder even where verl (the [verl]
# extra) has installed a top-level `tests` package of its own: a regular package found first on sys.path wins,
# and the repository root is first, in pytest and in the `python -c` children the tests start from it. The
# folder itself stays importable too, for the helpers and toy methods some tests import by bare name.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(1, _HERE)

try:
    from hypothesis import HealthCheck, Phase, settings
except ImportError:  # hypothesis is a dev extra; without it the fuzz tests are not collected either
    pass
else:
    # fuzz-ci: the CI default, derandomized (the same examples on every run), no example database.
    settings.register_profile("fuzz-ci", max_examples=1, derandomize=True, database=None, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    # long: by hand, randomized, FUZZ_SCALE (default 20) times the CI examples; test_fuzz_specs.py scales them.
    # No explain phase: it traces every line run, which slows validate past the fuzz's per-spec time bound.
    settings.register_profile("long", max_examples=1, deadline=None, suppress_health_check=list(HealthCheck),
                              phases=[p for p in Phase if p is not Phase.explain])

# Every receipt the suite writes is written with this secret in the environment (tests/test_reliability_leaks.py
# then looks for it). Set in the first process, so xdist workers inherit one value and the scan knows it.
os.environ.setdefault("CONTRACTS_LEAK_CANARY", "leak-canary-" + secrets.token_hex(12))



TEST_RACY_NS = 50_000_000


@pytest.fixture(autouse=True)
def _own_sealed_cache(tmp_path_factory, monkeypatch):
    """Each test starts with an empty sealed cache of its own (engine/store/sealed.py), never the user's.

    A receipt changed within RACY_NS of being indexed is not recorded by its file's identity (its ctime might not
    change again within the clock's tick: engine/store/sealed_index.py). The production window, 3 s, also covers
    filesystems that keep whole seconds; the files tests write live on one that keeps nanoseconds with a tick of a
    few milliseconds, so here a file is "old" after 50 ms (tests that write a store and then expect it indexed by
    identity wait that long: tests/tui_support.py). tests/test_store_index.py tests the window itself."""
    from engine.store import sealed_index

    monkeypatch.setenv("CONTRACTS_CACHE_DIR", str(tmp_path_factory.mktemp("sealed-cache")))
    monkeypatch.delenv("CONTRACTS_NO_CACHE", raising=False)
    monkeypatch.setattr(sealed_index, "RACY_NS", TEST_RACY_NS)


WORKER = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... in an xdist worker; None otherwise
LAST_WAIT_S = 1800.0  # a worker may still be in a long test; a dead one is noticed sooner (its pid is gone)


def _workers() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)


def _board(config) -> Path:
    """A folder all workers of this session share: beside their own temp folders (xdist makes one per worker)."""
    board = Path(config.option.basetemp).parent / "workers"
    board.mkdir(exist_ok=True)
    return board


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core, plus one. Part of nearly every heavy test is spent waiting (for a
    candidate worker or a CLI subprocess to import torch, for a deadline to pass, for Ray to start, for the
    `last` leak scan's turn); a third worker on two cores runs tests in those waits. One suite run each on a
    2-core machine: 381 s with two workers, 348 s with three. PYTEST_XDIST_AUTO_NUM_WORKERS still decides
    when it is set (pytest-xdist's own hook reads it)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return _cores() + 1


def pytest_configure(config):
    config.addinivalue_line("markers", "last: runs after every other test (it reads what the suite wrote)")
    if WORKER and _workers() > 1:
        (_board(config) / f"{WORKER}.pid").write_text(str(os.getpid()))
        import torch

        # the workers share the cores' threads; with more workers than cores, one each
        torch.set_num_threads(max(1, _cores() // _workers()))


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module of tiny tensors on a shared machine: OpenMP barriers cost more than the work.
    Use as `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The modules that take the most time, heaviest first (test seconds summed over each module's tests, from a
# `--junitxml` run on a 2-core machine; docs/testing.md says how to re-measure), and the ones whose tests are
# quickest, to go last. `--dist load` hands the collection out in order and `--maxschedchunk 4`
# (pyproject.toml) tops a worker up a few tests at a time; when the queue runs dry each worker still has its
# own backlog, and the one that drew the `last` leak scan waits for the other's. Ending the queue in
# hundredth-of-a-second tests keeps that wait short. A module in neither list runs in between, in its own
# order; tests/test_suite_order.py checks that every listed name exists.
HEAVY_FIRST = (
    "test_impl.py", "test_verl.py", "test_evolve_openevolve.py", "test_mrtpo.py", "test_cache.py",
    "test_executors.py", "test_fuzz_specs.py", "test_cli.py", "test_tui.py", "test_evolve.py", "test_mutate.py",
    "test_reliability_signals.py", "test_tui_actions.py", "test_tui_snapshots.py", "test_receipt_schema.py",
    "test_binding.py", "test_hf.py", "test_pytest_plugin.py", "test_reliability_concurrency.py",
    "test_reliability_determinism.py", "test_gate.py", "test_trust.py", "test_benchmarks.py",
)
LIGHT_LAST = (
    "test_tapo.py", "test_perf_paths.py", "test_readme.py", "test_receipts.py", "test_docs_links.py",
    "test_coverage.py",
)
_RANK = {name: (0, i) for i, name in enumerate(HEAVY_FIRST)}
_RANK.update({name: (2, i) for i, name in enumerate(LIGHT_LAST)})


def _order(item) -> tuple[bool, tuple[int, int]]:
    return item.get_closest_marker("last") is not None, _RANK.get(item.path.name, (1, 0))


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=_order)  # stable: within a module, and among the modules not listed, the order is kept


# Modules whose tests share a costly per-process setup, handed to one worker whole instead of four tests at a time
# (`--dist load --maxschedchunk 4` splits a module across every worker, and each builds that setup again): verl,
# imported by the tests' own skip check and by the warm server its workers fork from (7-9 CPU-s each); the plain
# warm server the `--impl` checks fork from (torch, torch._dynamo and the methods, 3-4 CPU-s); a Ray
# cluster; the tiny Hugging Face checkpoint; the module fixtures that run full checks; `contracts mutate`'s
# forkserver, which imports torch and torch._dynamo before it forks a worker. Each is listed in
# HEAVY_FIRST, so it goes out early, while the other workers have plenty to do beside it.
TOGETHER = ("test_impl.py", "test_verl.py", "test_executors.py", "test_hf.py", "test_cli.py", "test_binding.py",
            "test_evolve.py", "test_mutate.py")


def pytest_xdist_make_scheduler(config, log):
    """`--dist load`, except that a module in TOGETHER is never split between workers. The collection is sorted by
    module, so a module's tests are consecutive: a batch that reaches into one is extended to its last test. The
    queue stays in collection order, so a `last` test is still handed out after every other."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScheduling

    class ModulesTogether(LoadScheduling):
        def _send_tests(self, node, num: int) -> None:
            pending = self.pending
            if pending and self.collection is not None:
                module = lambda i: self.collection[pending[i]].split("::", 1)[0].rsplit("/", 1)[-1]  # noqa: E731
                end = min(num, len(pending))
                while end < len(pending) and module(end - 1) in TOGETHER and module(end) == module(end - 1):
                    end += 1
                num = end
            super()._send_tests(node, num)

    return ModulesTogether(config, log)


def _alive(pid_file: Path) -> bool:
    """The worker process is running: a dead one that xdist has not reaped yet (a zombie) is not."""
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: kill(pid, 0) is all there is
    return state not in ("Z", "X")


def pytest_runtest_setup(item):
    """Under xdist, a `last` test waits for the other workers: their tests may still be writing receipts."""
    if item.get_closest_marker("last") is None or not WORKER or _workers() < 2:
        return
    board = _board(item.config)
    (board / f"{WORKER}.last").write_text("")
    others = [f"gw{i}" for i in range(_workers()) if f"gw{i}" != WORKER]
    end = time.monotonic() + LAST_WAIT_S
    while True:
        busy = [w for w in others if not (board / f"{w}.done").exists() and not (board / f"{w}.last").exists()]
        lost = [w for w in busy if not _alive(board / f"{w}.pid")]
        if lost:
            pytest.fail(f"xdist worker(s) {', '.join(lost)} ended without finishing: cannot run a `last` test",
                        pytrace=False)
        if not busy:
            return
        if time.monotonic() > end:
            pytest.fail(f"xdist worker(s) {', '.join(busy)} still running after {LAST_WAIT_S:g} s", pytrace=False)
        time.sleep(0.2)


def pytest_sessionfinish(session):
    if WORKER and _workers() > 1:
        (_board(session.config) / f"{WORKER}.done").write_text("")
