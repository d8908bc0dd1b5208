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
