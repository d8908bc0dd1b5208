"""The project's tests: a regular package, so `tests.x` names this folder whatever else is installed."""
