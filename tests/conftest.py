"""Suite-wide test order: tests marked `last` run after all others.

The receipt leak scan (tests/test_reliability_leaks.py) reads every receipt
the suite wrote, so it has to come after the tests that write them.
"""


def pytest_configure(config):
    config.addinivalue_line("markers", "last: runs after every other test (it reads what the suite wrote)")


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)  # stable: the rest keep their order
