"""Validated specs for the browser, from the engine's validation cache so a start does not re-parse
unchanged YAML.

Validating the three shipped specs costs about 0.6 s (ruamel round-trip
parse, JSON Schema, the static registry scan): a third of the start-up budget.
The cache (engine/store/cache.py, `<receipts>/.validation-cache.json`, shared with
the read-only commands) keeps each result under the spec's sha256 and a
fingerprint of everything validation depends on; any change re-validates.
"""

from __future__ import annotations

from pathlib import Path

from engine.store.cache import ValidationCache
from engine.spec.loader import Spec, display_path, spec_files


def load_specs(specs_dir: Path, root: Path, cache_dir: Path | None) -> dict[str, tuple[Spec | None, str, list[str]]]:
    """key -> (Spec or None, display path, error lines) for every spec file, from the cache where it holds."""
    # A new cache object per load: the app runs for hours, and the sources it fingerprints may change meanwhile.
    cache = ValidationCache(cache_dir)
    out: dict[str, tuple[Spec | None, str, list[str]]] = {}
    for f in spec_files(specs_dir):
        shown = display_path(f, root)
        try:
            spec, errs = cache.validate_file(f, root)
        except Exception as err:  # a bug of ours must not take the browser down
            spec, errs = None, [err]
        errors = [e.line() if hasattr(e, "line") else f"{shown}: {type(e).__name__}: {e}" for e in errs]
        out[spec.key if spec is not None else f.stem] = (spec, shown, errors)
    cache.flush()
    return out
