"""The suite's own order (tests/conftest.py): the heaviest modules first, the quickest last, then `last` tests."""

from __future__ import annotations

from pathlib import Path

from tests import conftest

ROOT = Path(__file__).resolve().parent.parent


class _Item:
    """What the ordering reads of a pytest item: its file and its `last` marker."""

    def __init__(self, module: str, name: str, last: bool = False):
        self.path, self.name, self._last = ROOT / "tests" / module, name, last

    def get_closest_marker(self, name: str):
        return object() if (name == "last" and self._last) else None


def test_every_module_named_first_or_last_exists_and_is_named_once():
    here = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    listed = conftest.HEAVY_FIRST + conftest.LIGHT_LAST
    missing = [name for name in listed if name not in here]
    assert not missing, f"renamed or removed, so no longer placed: {missing}"
    assert len(set(listed)) == len(listed)


def test_heavy_modules_go_first_in_their_listed_order_and_the_rest_keep_theirs():
    items = [_Item("test_verify.py", "v1"), _Item("test_reliability_leaks.py", "scan", last=True),
             _Item("test_reliability_leaks.py", "l1"), _Item("test_gate.py", "g1"), _Item("test_verify.py", "v2"),
             _Item("test_gate.py", "g2"), _Item("test_verl.py", "x1"), _Item("test_readme.py", "r1"),
             _Item("test_verl.py", "x2"), _Item("test_tapo.py", "t1")]
    conftest.pytest_collection_modifyitems(None, None, items)
    # heavy first in their listed order; then the unlisted in theirs; then the light in their listed order
    assert [i.name for i in items] == ["x1", "x2", "g1", "g2", "v1", "l1", "v2", "t1", "r1", "scan"]
    assert conftest.HEAVY_FIRST.index("test_verl.py") < conftest.HEAVY_FIRST.index("test_gate.py")


class _Config:
    """What the scheduler reads of pytest's config under `-n 3 --dist load --maxschedchunk 4`."""

    def getoption(self, name):
        return {"dist": "load", "maxschedchunk": 4}[name]

    def getvalue(self, name):
        return {"tx": ["3*popen"]}[name]


class _Node:
    def __init__(self):
        self.sent: list[int] = []

    def send_runtest_some(self, indices):
        self.sent += indices


def test_a_module_listed_together_goes_to_one_worker_whole_and_the_queue_keeps_its_order():
    assert set(conftest.TOGETHER) <= set(conftest.HEAVY_FIRST)  # whole modules go out early, beside the rest
    sched = conftest.pytest_xdist_make_scheduler(_Config(), None)
    collection = ([f"tests/test_cache.py::t{i}" for i in range(6)] + [f"tests/test_verl.py::v{i}" for i in range(9)]
                  + [f"tests/test_tapo.py::p{i}" for i in range(6)] + ["tests/test_reliability_leaks.py::scan"])
    nodes = [_Node(), _Node(), _Node()]
    sched.collection, sched.pending = collection, list(range(len(collection)))
    sched.node2pending = {n: [] for n in nodes}
    for n in nodes * 3:
        sched._send_tests(n, 4)
    got = [[collection[i].rsplit("::", 1)[1] for i in n.sent] for n in nodes]
    # four at a time, but verl (listed) whole, with the one batch that reached into it; the rest as xdist sends it
    assert got[0] == ["t0", "t1", "t2", "t3", "p4", "p5", "scan"]
    assert got[1] == ["t4", "t5", "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8"]
    assert got[2] == ["p0", "p1", "p2", "p3"]
    assert sched.pending == []


def test_other_distribution_modes_keep_xdists_own_scheduler():
    class Worksteal(_Config):
        def getoption(self, name):
            return "worksteal" if name == "dist" else super().getoption(name)

    assert conftest.pytest_xdist_make_scheduler(Worksteal(), None) is None
