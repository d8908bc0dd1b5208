"""Suite-wide test order, and the fuzz profiles.

Tests marked `last` run after all others: the receipt leak scan
(tests/test_reliability_leaks.py) reads every receipt the suite wrote, so it
has to come after the tests that write them.

The hypothesis profiles of tests/test_fuzz_specs.py are registered here, before
the hypothesis plugin reads `--hypothesis-profile`, so that
`pytest tests/test_fuzz_specs.py --hypothesis-profile=long` works.
"""

import sys
from pathlib import Path

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


def pytest_configure(config):
    config.addinivalue_line("markers", "last: runs after every other test (it reads what the suite wrote)")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)  # stable: the rest keep their order
