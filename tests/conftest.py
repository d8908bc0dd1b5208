"""Suite-wide test order, and the fuzz profiles.

Tests marked `last` run after all others: the receipt leak scan
(tests/test_reliability_leaks.py) reads every receipt the suite wrote, so it
has to come after the tests that write them.

The hypothesis profiles of tests/test_fuzz_specs.py are registered here, before
the hypothesis plugin reads `--hypothesis-profile`, so that
`pytest tests/test_fuzz_specs.py --hypothesis-profile=long` works.
"""

import sys
import types
from pathlib import Path

# `tests.x` is this folder, whatever is installed: verl (the [verl] extra) ships a top-level `tests` package of its
# own, and a regular package anywhere on sys.path wins over this folder, a namespace package. Bound here, before
# any test module imports `tests.fuzz_support` and the like.
_HERE = str(Path(__file__).resolve().parent)
if list(getattr(sys.modules.get("tests"), "__path__", None) or []) != [_HERE]:
    _pkg = types.ModuleType("tests", "The project's tests (bound to this folder by tests/conftest.py).")
    _pkg.__path__ = [_HERE]
    sys.modules["tests"] = _pkg

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


def pytest_configure(config):
    config.addinivalue_line("markers", "last: runs after every other test (it reads what the suite wrote)")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)  # stable: the rest keep their order
