"""Validated specs for the browser, cached so a start does not re-parse unchanged YAML.

Validating the three shipped specs costs about 0.6 s (ruamel round-trip
parse, JSON Schema, the static registry scan): a third of the start-up budget.
The result depends only on the spec's bytes and on the code and schema that
validate it, so it is cached under exactly those: a spec's sha256, plus one
fingerprint over engine/spec.py, engine/registry.py, engine/errors.py, the
spec schema and every methods/**/*.py file (by content). Any change to one of
them re-validates. The cache is `<receipts>/.tui-specs.json`; deleting it is
always safe.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

from engine.spec import Spec, display_path, spec_files, validate_file

CACHE_NAME = ".tui-specs.json"
CACHE_VERSION = 1


def _validation_fingerprint() -> str:
    """sha256 over everything a spec's validation result depends on besides the spec itself."""
    import engine

    h = hashlib.sha256(f"v{CACHE_VERSION}".encode())
    engine_dir = Path(engine.__file__).resolve().parent
    files = [engine_dir / n for n in ("spec.py", "registry.py", "errors.py", "schemas/spec.schema.json")]
    try:
        from engine.registry import methods_root

        files += sorted(methods_root().rglob("*.py"))
    except Exception:  # no methods package: validation will say so; nothing to fingerprint
        pass
    for f in files:
        h.update(str(f.name).encode())
        try:
            h.update(hashlib.sha256(f.read_bytes()).digest())
        except OSError:
            h.update(b"-")
    return h.hexdigest()


def load_specs(specs_dir: Path, root: Path, cache_dir: Path | None) -> dict[str, tuple[Spec | None, str, list[str]]]:
    """key -> (Spec or None, display path, error lines) for every spec file, from the cache where it holds."""
    cache_path = Path(cache_dir) / CACHE_NAME if cache_dir is not None else None
    fingerprint = _validation_fingerprint()
    cached: dict = {}
    if cache_path is not None:
        try:
            doc = json.loads(cache_path.read_text(encoding="utf-8"))
            if doc.get("fingerprint") == fingerprint:
                cached = doc.get("specs") or {}
        except (OSError, ValueError, AttributeError):
            cached = {}
    out: dict[str, tuple[Spec | None, str, list[str]]] = {}
    fresh_cache: dict = {}
    for f in spec_files(specs_dir):
        shown = display_path(f, root)
        try:
            raw = f.read_bytes()
        except OSError as err:
            out[f.stem] = (None, shown, [f"{shown} $ cannot read: {err.strerror}"])
            continue
        sha = hashlib.sha256(raw).hexdigest()
        hit = cached.get(f.name)
        if hit and hit.get("sha256") == sha:
            data, errors = hit.get("data"), list(hit.get("errors") or [])
        else:
            try:
                spec, errs = validate_file(f, root)
            except Exception as err:  # a bug of ours must not take the browser down
                spec, errs = None, [err]
            data = spec.data if spec is not None else None
            errors = [e.line() if hasattr(e, "line") else f"{shown}: {type(e).__name__}: {e}" for e in errs]
        fresh_cache[f.name] = {"sha256": sha, "data": data, "errors": errors}
        spec = Spec(path=f, display=shown, data=data, doc=None, sha256=sha) if data is not None else None
        out[spec.key if spec is not None else f.stem] = (spec, shown, errors)
    if cache_path is not None and fresh_cache != cached:
        _write(cache_path, {"fingerprint": fingerprint, "specs": fresh_cache})
    return out


def _write(path: Path, doc: dict) -> None:
    try:
        tmp = path.parent / f".tmp-tui-specs-{secrets.token_hex(6)}"
        tmp.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, path)
    except (OSError, ValueError):
        pass  # a read-only store: validated again next start
