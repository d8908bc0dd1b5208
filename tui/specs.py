"""Validated specs for the browser: engine.store.browse.load_specs (from the engine's validation cache)."""

from engine.store.browse import load_specs  # noqa: F401
