"""Sealed summaries: what the reading verbs learned from a file's bytes, kept so the next call need not learn it
again, and kept so that no one but the user who computed it can make it say anything else.

A reading verb (`list`, `show`, `gate`, `verify`) spends nearly all of its time on work whose answer is a pure
function of bytes: that a receipt is intact (its id against its canonical predicate, its subject digest, its exact
bytes) and matches the receipt schema, what its typed record holds (engine/store/records.py), and that a spec is
valid and what it says. Each answer is kept here under

  * what names the bytes it summarises: a spec's sha256 with its file name (which the method key must match); for
    receipts, one index per method folder (engine/store/sealed_index.py) keyed by the folder's real path, whose
    entries map each file's identity to the sha256 its bytes had and the receipt's summary (engine/store/summary.py);
  * a fingerprint of everything else that decides it: for a receipt, the code that decides its verdict and what its
    summary holds (`receipt_fingerprint`: receipts.py, the receipt schema, the envelope, the bounds, the summary and
    the records it builds; not the CLI, the gate or the kinds), for a spec every file of the engine
    (`engine_fingerprint`) and the names its methods register (a digest of every methods/ source); and the
    validating libraries' installs and the Python version;

and sealed with an HMAC-SHA256 over all of it (kind, key, fingerprint, value) under a 256-bit key that
lives in the user's cache folder (mode 0600), never in a receipt store or the repository. An entry is used only
when its seal verifies; anything else (no entry, another key's seal, an edited value, an entry copied under the
key of other bytes, a corrupt or unreadable file) is a miss, and the answer is derived from the file afresh, as
without a cache. Only good answers are kept (an intact, schema-valid receipt; a valid spec): a file that fails
is judged from its bytes every time, so its message is always the fresh one.

What is never kept, and decided on every call: that a file is the one its entry describes (a spec is read and
hashed; a receipt's identity is taken and, signed, its signatures block read again, and `verify` reads and hashes
every receipt), freshness (the bound files against the working tree) and, under a trust policy, the signature check
of every signed receipt (engine/store/trust.py, on the envelope's bytes).

So whoever can write a store, or this folder, but cannot read the user's key, cannot change a verdict through it.
Under a trust policy the verbs read and write nothing here: there the runner's signing key is the root of trust,
and a key in the user's cache folder must not stand in for it. `--no-cache` (and CONTRACTS_NO_CACHE=1) reads and
writes nothing here either. docs/performance.md has the argument.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
import stat
import sys
from pathlib import Path
from typing import Any

VERSION = 1
ENV_DIR = "CONTRACTS_CACHE_DIR"  # where entries and the key live (default: the user cache folder)
ENV_OFF = "CONTRACTS_NO_CACHE"  # 1: read and write nothing here
KEY_NAME = "seal.key"
MAX_ENTRY_BYTES = 8 << 20
_ENGINE = Path(__file__).resolve().parent.parent
_LIBRARIES = ("jsonschema", "fastjsonschema", "ruamel.yaml", "yaml")


def default_dir() -> Path | None:
    """$CONTRACTS_CACHE_DIR, else $XDG_CACHE_HOME/paper-contracts, else ~/.cache/paper-contracts."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "paper-contracts" if os.path.isabs(base) else None


def _hash_files(h, files: list[Path], base: Path) -> None:
    for f in files:
        h.update(f.relative_to(base).as_posix().encode("utf-8", "surrogatepass") + b"\0")
        try:
            h.update(hashlib.sha256(f.read_bytes()).digest())
        except OSError:
            h.update(b"-")


@functools.lru_cache(maxsize=None)
def engine_fingerprint() -> str:
    """sha256 over every file of the engine (code and schemas), the validating libraries and Python.

    Taken once per process: a process judges with the code it loaded, so it files its answers under that code's
    fingerprint even if the sources change while it runs.
    """
    from engine.store.cache import _library

    h = hashlib.sha256(f"sealed v{VERSION}\0{sys.version}\0{':'.join(map(_library, _LIBRARIES))}".encode())
    _hash_files(h, sorted(p for p in _ENGINE.rglob("*") if p.suffix in (".py", ".json") and p.is_file()
                          and "__pycache__" not in p.parts), _ENGINE)
    return h.hexdigest()


# What decides a receipt's verdict from its bytes (integrity, envelope, bounds, schema) and what its summary holds
# (engine/store/summary.py and the records and coverage facts it builds): nothing else of the engine. Editing the
# CLI, the TUI, the gate or a kind leaves every sealed receipt verdict valid; editing one of these (or the receipt
# schema, the validating libraries, Python) makes every one of them a miss, judged from the bytes again.
RECEIPT_CODE = ("store/receipts.py", "store/signing.py", "store/bounded.py", "store/sealed.py",
                "store/sealed_index.py", "store/summary.py", "store/records.py", "store/coverage.py",
                "schemas/receipt.schema.json")
_RECEIPT_LIBRARIES = ("jsonschema", "fastjsonschema")


@functools.lru_cache(maxsize=None)
def receipt_fingerprint() -> str:
    """sha256 over the engine files that decide a receipt's verdict and summary (RECEIPT_CODE), the receipt
    validating libraries and Python. Taken once per process, like `engine_fingerprint`."""
    from engine.store.cache import _library

    h = hashlib.sha256(f"sealed receipts v{VERSION}\0{sys.version}\0"
                       f"{':'.join(map(_library, _RECEIPT_LIBRARIES))}".encode())
    _hash_files(h, [_ENGINE / n for n in RECEIPT_CODE], _ENGINE)
    return h.hexdigest()


def names_fingerprint(sealed: "Sealed") -> str | None:
    """A digest of the names specs may use (engine.spec.registry.known_names). The static scan of methods/ is
    itself kept sealed under a digest of every methods/ source; a process that set or registered names of its own
    uses those. None when there is no methods package."""
    from engine.spec import registry
    from engine.store.cache import names_doc, names_from

    memo_key = (id(registry._STATIC), len(registry._REGISTRY.implementations), len(registry._REGISTRY.checks),
                len(registry._REGISTRY.mutants))
    if sealed._names is not None and sealed._names[0] == memo_key:
        return sealed._names[1]
    try:
        if registry._STATIC is not None:
            names = registry.known_names()
        else:
            root = registry.methods_root()
            h = hashlib.sha256(b"sources\0")
            _hash_files(h, sorted(root.rglob("*.py")), root.parent)
            src = h.hexdigest()
            hit = sealed.get("names", src, engine_fingerprint())
            names = None
            if isinstance(hit, dict):
                try:
                    names = registry.with_runtime(names_from(hit))
                except (KeyError, TypeError, AttributeError):
                    names = None
            if names is None:
                static = registry.static_names()
                sealed.put("names", src, engine_fingerprint(), names_doc(static))
                names = registry.with_runtime(static)
    except Exception:  # noqa: BLE001 - no methods package: nothing to key on, so nothing is kept
        return None
    out = hashlib.sha256(b"names\0" + json.dumps(names_doc(names), sort_keys=True).encode()).hexdigest()
    sealed._names = (memo_key, out)
    return out


class Sealed:
    """The sealed entries of one user (a folder holding the key and the entries); `None` directory: disabled."""

    def __init__(self, directory: Path | None):
        self.dir = Path(directory) if directory is not None else None
        self._key: bytes | None = None
        self._names: tuple | None = None  # (registry state, names digest), this process only

    @classmethod
    def for_user(cls, use: bool = True) -> "Sealed":
        """The user's sealed cache, or a disabled one (use=False, or CONTRACTS_NO_CACHE=1)."""
        off = not use or os.environ.get(ENV_OFF, "") not in ("", "0")
        return cls(None if off else default_dir())

    @property
    def enabled(self) -> bool:
        return self.dir is not None and self._mac_key() is not None

    def _mac_key(self) -> bytes | None:
        """The user's key: read, or made once (0600, never replaced); None (no cache) when neither works."""
        if self._key is not None or self.dir is None:
            return self._key
        path = self.dir / KEY_NAME
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            try:
                self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
                try:
                    os.write(fd, secrets.token_bytes(32))
                finally:
                    os.close(fd)
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError:
                self.dir = None
                return None
        except OSError:
            self.dir = None
            return None
        try:
            st = os.fstat(fd)
            key = os.read(fd, 64)
        finally:
            os.close(fd)
        # a key others can read or write seals nothing: no cache at all (st_uid: a key someone else made)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077 or len(key) != 32 or \
                (hasattr(os, "getuid") and st.st_uid != os.getuid()):
            self.dir = None
            return None
        self._key = key
        return key

    def _seal(self, kind: str, key: str, fp: str, body: bytes) -> str:
        msg = f"v{VERSION}\0{kind}\0{key}\0{fp}\0".encode() + body
        return hmac.new(self._mac_key() or b"", msg, hashlib.sha256).hexdigest()

    def _path(self, kind: str, key: str, fp: str) -> Path:
        return self.dir / f"{kind}-v{VERSION}" / key[:2] / f"{key}-{fp[:24]}.json"

    def get(self, kind: str, key: str, fp: str, max_bytes: int = MAX_ENTRY_BYTES) -> Any:
        """The value sealed under (kind, key, fp), or None: a missing, unsealed or foreign entry is a miss."""
        if not self.enabled:
            return None
        from engine.store import bounded

        try:
            raw = bounded.read_regular(self._path(kind, key, fp), max_bytes)
        except (OSError, ValueError):
            return None
        mac, _, body = raw.partition(b"\n")
        try:
            if not hmac.compare_digest(mac.decode("ascii"), self._seal(kind, key, fp, body)):
                return None
            return bounded.loads(body)
        except ValueError:  # not ASCII, not JSON, too deep
            return None

    def put(self, kind: str, key: str, fp: str, value: Any, allow_nan: bool = False) -> None:
        """Seal and keep `value` (plain JSON data); silently nothing when it cannot be written."""
        if not self.enabled:
            return
        try:
            body = json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=allow_nan).encode("ascii")
        except (TypeError, ValueError):
            return
        path = self._path(kind, key, fp)
        tmp = path.parent / f".tmp-{secrets.token_hex(6)}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(tmp, "xb") as f:
                f.write(self._seal(kind, key, fp, body).encode("ascii") + b"\n" + body)
            os.replace(tmp, path)
        except OSError:
            try:
                tmp.unlink()
            except OSError:
                pass


# --- specs ---------------------------------------------------------------------------------------------------------


def validate_spec(path: Path, root: Path | None, sealed: Sealed):
    """`engine.spec.memo.validate_file`, answered from a sealed entry for these bytes, this file name, this engine
    and these registered names; a valid spec it validates is kept. Problems are always found afresh."""
    from engine.spec import loader, memo

    path = Path(path)
    if not sealed.enabled:
        return memo.validate_file(path, root)
    try:
        raw = path.read_bytes() if path.is_file() and path.stat().st_size <= loader.MAX_SPEC_BYTES else None
    except OSError:
        raw = None
    if raw is None or len(raw) > loader.MAX_SPEC_BYTES:
        return memo.validate_file(path, root)
    names = names_fingerprint(sealed)
    if names is None:
        return memo.validate_file(path, root, raw=raw)
    sha = hashlib.sha256(raw).hexdigest()
    key = hashlib.sha256(f"{sha}\0{path.name}".encode("utf-8", "surrogatepass")).hexdigest()
    fp = hashlib.sha256(f"{engine_fingerprint()}\0{names}".encode()).hexdigest()
    hit = sealed.get("spec", key, fp)
    if isinstance(hit, dict) and isinstance(hit.get("data"), dict):
        return loader.Spec(path=path, display=loader.display_path(path, root), data=hit["data"], doc=None,
                           sha256=sha, raw=raw), []
    spec, errors = memo.validate_file(path, root, raw=raw)
    if spec is not None and not errors:
        sealed.put("spec", key, fp, {"data": spec.data})
    return spec, errors


def load_spec(path: Path, root: Path | None, sealed: Sealed):
    """A valid spec, or the first SpecError (`validate_spec`)."""
    spec, errors = validate_spec(path, root, sealed)
    if errors:
        raise errors[0]
    return spec


# --- the promote/demote splice that freshness uses ---------------------------------------------------------------


def process_cache(sealed: Sealed):
    """A ValidationCache of this process only (no file: the working tree's digests and subject paths are worked
    out once per command), whose promote/demote splice (engine.gate.promote.digest_with_state, a pure function of
    the spec's bytes and a state) comes from a sealed entry when there is one."""
    from engine.store.cache import ValidationCache

    class _ProcessCache(ValidationCache):
        def digest_with_state(self, raw: bytes, state: str) -> str | None:
            key = hashlib.sha256(hashlib.sha256(raw).digest() + b"\0" + state.encode("utf-8", "surrogatepass")
                                 ).hexdigest()
            hit = sealed.get("restate", key, engine_fingerprint())
            if isinstance(hit, dict) and (hit.get("digest") is None or isinstance(hit.get("digest"), str)):
                return hit["digest"]
            out = super().digest_with_state(raw, state)
            sealed.put("restate", key, engine_fingerprint(), {"digest": out})
            return out

    return _ProcessCache(None)
