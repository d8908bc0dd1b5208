"""Receipts: immutable, source-bound records of one `contracts check` run.

Layout is an in-toto Statement v1: `subject` lists every file that measured
(the spec, the checkout modules the measuring process imported, all of each
imported method package, checkpoint files: engine/run/binding.py) with its
sha256; `predicate` is the run. The receipt id is the sha256 of the canonical
predicate (without the id itself), so any edited byte of the predicate shows.

Files are written to a temporary name, fsynced, then hard-linked to the final
name: `link` fails if the name exists, so a receipt is never overwritten and a
crash before the link leaves no receipt at all, never half of one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import secrets
import stat
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from engine.errors import EnvironmentProblem

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://paper-contracts.dev/receipt/v1"
RECEIPT_SUFFIX = ".json"
TMP_PREFIX = ".tmp-"


def utc_now() -> str:
    """RFC 3339 UTC with microseconds: sorts as text, and two runs never share one."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _json_safe(value: Any) -> Any:
    """Non-finite floats as strings: strict JSON has no NaN, and a NaN must stay visible."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def canonical(value: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, no spaces, UTF-8)."""
    return json.dumps(_json_safe(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def canonical_parsed(value: Any) -> bytes:
    """`canonical(value)` for what json.loads returned (string keys only): the same bytes, from the C encoder
    without the Python walk of `_json_safe`, which changes nothing there unless a float is not finite (a NaN
    literal in the file), and then this falls back to `canonical`. About a third of an integrity check."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False).encode("utf-8")
    except (TypeError, ValueError):
        return canonical(value)


def receipt_id(predicate: dict, parsed: bool = False) -> str:
    """The sha256 of the canonical predicate without its id; `parsed`: it came from json.loads (canonical_parsed)."""
    body = {k: v for k, v in predicate.items() if k != "receipt_id"}
    return hashlib.sha256((canonical_parsed if parsed else canonical)(body)).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def subjects(root: Path, files: Iterable[str]) -> list[dict]:
    """in-toto subjects for repository-relative paths."""
    out = []
    for rel in sorted(set(files)):
        out.append({"name": rel, "digest": {"sha256": sha256_file(root / rel)}})
    return out


def git_revision(root: Path) -> dict | None:
    """{commit, dirty} of the checkout, or None outside git (never a host or user name)."""
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        if commit.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


def statement(subject: list[dict], predicate: dict) -> dict:
    """Bind subject and predicate: the id covers the subject list through its digest.

    Free text in the predicate is scrubbed of absolute paths, user and host names and environment
    values first (engine.store.redact), so what the id covers is what may be shared.
    """
    from engine.store.redact import scrub_predicate

    for s in subject:  # repository-relative names only: a receipt holds no absolute path, never points outside
        name = s.get("name") if isinstance(s, dict) else None
        if not isinstance(name, str) or not name or not name.isprintable() or (not is_external_subject(name) and (
                name.startswith(("/", "\\")) or ".." in Path(name).parts or ":" in name.split("/")[0])):
            raise ValueError(f"subject name {name!r} is not a repository-relative path")
    predicate = scrub_predicate(dict(predicate))
    predicate["subject_sha256"] = hashlib.sha256(canonical(subject)).hexdigest()
    predicate["receipt_id"] = receipt_id(predicate)
    return {"_type": STATEMENT_TYPE, "subject": subject, "predicateType": PREDICATE_TYPE, "predicate": predicate}


def ensure_writable(directory: Path) -> None:
    """Fail early (exit 4) when receipts cannot be written, before any expensive work."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f"{TMP_PREFIX}probe-{secrets.token_hex(6)}"
        with open(probe, "xb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as err:
        raise EnvironmentProblem(
            f"receipts folder {directory.name}/ is not writable ({err.strerror or err}); "
            "choose another with --receipts DIR or free some space"
        ) from None


def serialize(stmt: dict) -> bytes:
    """The exact bytes of a receipt file; verify re-derives them, so any edited byte shows."""
    return (json.dumps(_json_safe(stmt), indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def serialize_parsed(stmt: dict) -> bytes:
    """`serialize(stmt)` for what json.loads returned: the same bytes without the `_json_safe` walk (see
    canonical_parsed), falling back to `serialize` for a float that is not finite."""
    try:
        return (json.dumps(stmt, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    except (TypeError, ValueError):
        return serialize(stmt)


def receipt_filename(method: str, created_at: str, rid: str) -> str:
    stamp = created_at.replace("-", "").replace(":", "").replace(".", "")  # 20261130T020304123456Z
    return f"{stamp}_{method}_{rid[:12]}{RECEIPT_SUFFIX}"


def write_receipt(receipts_dir: Path, stmt: dict, sign_key=None) -> Path:
    """Write one receipt atomically under receipts_dir/<method>/; never overwrite.

    With `sign_key` (a key path, or a signing command: engine.store.signing.usable_signer), the file is a
    DSSE envelope of the Statement's bytes, signed by a process of its own that reads the key; this process
    only names the key's path.
    """
    from engine.spec.loader import check_key

    pred = stmt["predicate"]
    folder = Path(receipts_dir) / check_key(pred["method"])  # the method names a folder: no "..", no "/"
    folder.mkdir(parents=True, exist_ok=True)
    data = serialize(stmt)
    if sign_key is not None:
        from engine.errors import UsageError
        from engine.store.signing import KeyProblem, sign_in_subprocess

        try:
            data = sign_in_subprocess(data, sign_key)
        except KeyProblem as err:
            raise UsageError(f"receipt not written: {err}") from None
    tmp = folder / f"{TMP_PREFIX}{secrets.token_hex(8)}"
    name = receipt_filename(pred["method"], pred["created_at"], pred["receipt_id"])
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        final = folder / name
        n = 0
        while True:
            try:
                os.link(tmp, final)
                break
            except FileExistsError:
                n += 1
                final = folder / name.replace(RECEIPT_SUFFIX, f"-{n}{RECEIPT_SUFFIX}")
        _fsync_dir(folder)
        return final
    except OSError as err:
        raise EnvironmentProblem(f"could not write receipt in {folder.name}/: {err.strerror or err}") from None
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def receipt_files(receipts_dir: Path, method: str | None = None) -> list[Path]:
    """Receipt files, oldest first (file names start with the UTC time)."""
    from engine.spec.loader import check_key

    base = Path(receipts_dir)
    folders = [base / check_key(method)] if method else sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    files: list[Path] = []
    for folder in folders:
        if folder.is_dir():
            files.extend(p for p in folder.iterdir()
                         if p.is_file() and p.suffix == RECEIPT_SUFFIX and not p.name.startswith("."))
    return sorted(files, key=lambda p: p.name)


# --- subjects outside the working tree ----------------------------------------

# `contracts check --policy hf:PATH` binds the checkpoint's files as subjects named
# `checkpoint:<file in the checkpoint folder>`. They say exactly which weights ran;
# they are not part of the working tree, so they never make a receipt stale, and
# the folder's location is never stored (no absolute paths in receipts).
EXTERNAL_SUBJECT_PREFIX = "checkpoint:"
# [impl] `contracts check --impl TARGET` binds the candidate's files as `impl:<name>` (engine/run/impl_loader.py);
# whether they still match is the gate's question for that implementation (`gate --impl TARGET`), not freshness's.
EXTERNAL_SUBJECT_PREFIXES = (EXTERNAL_SUBJECT_PREFIX, "impl:")


def is_external_subject(name: str) -> bool:
    """True for a subject that binds a file outside the working tree (a model checkpoint's, an --impl target's)."""
    return isinstance(name, str) and name.startswith(EXTERNAL_SUBJECT_PREFIXES)


@dataclass
class ReceiptCheck:
    """What `verify` says of one receipt file."""

    file: str
    state: str  # fresh | stale | tampered | invalid
    method: str | None = None
    receipt_id: str | None = None
    status: str | None = None
    created_at: str | None = None
    changed: tuple = ()
    message: str = ""


def load_receipt(path: Path, with_bytes: bool = False, with_signatures: bool = False):
    """Parse a receipt file, unsigned (a Statement) or signed (a DSSE envelope of one); ValueError with a one-line
    reason when it is neither.

    `with_bytes` adds the Statement's bytes (the file's, or the envelope's payload): integrity and the receipt id
    are judged on those, in both forms. `with_signatures` adds the envelope's signatures (None when unsigned).
    Bounded (engine.store.bounded): a receipt is a regular file in a real method folder, at most
    MAX_RECEIPT_BYTES, nested at most MAX_DEPTH deep; anything else is refused before it is parsed.
    """
    from engine.store import bounded

    if Path(path).parent.is_symlink():
        raise ValueError("its method folder is a symbolic link; receipts live in real folders of the store")
    try:
        raw = bounded.read_regular(path, bounded.MAX_RECEIPT_BYTES)
    except OSError as err:
        raise ValueError(f"cannot read: {err.strerror}") from None
    data, raw, signatures = parse_receipt(raw)
    if with_signatures:
        return data, raw, signatures
    return (data, raw) if with_bytes else data


def parse_receipt(raw: bytes) -> tuple[dict, bytes, list | None]:
    """(Statement, its bytes, signatures or None) of a receipt file's bytes; ValueError as `load_receipt`."""
    data = _json_document(raw)
    signatures = None
    from engine.store.signing import is_envelope, open_envelope

    if is_envelope(data):
        raw, signatures = open_envelope(data)
        data = _json_document(raw, "DSSE payload ")
    if not isinstance(data, dict) or data.get("_type") != STATEMENT_TYPE or not isinstance(data.get("predicate"), dict):
        raise ValueError("not a paper-contracts receipt (no in-toto Statement with a predicate)")
    return data, raw, signatures


def _json_document(raw: bytes, what: str = ""):
    from engine.store import bounded

    try:
        text = raw.decode("utf-8")
        bounded.check_depth(raw)  # before json.loads: a 100k-deep file is refused, never a RecursionError
        return json.loads(text)
    except UnicodeDecodeError:
        raise ValueError(f"{what}not UTF-8") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{what}not JSON ({err.msg}: line {err.lineno} column {err.colno})") from None


def integrity_problem(data: dict, raw: bytes) -> tuple[str, str] | None:
    """(state, message) when a parsed receipt is not intact, None when it is.

    Intact: the id equals the sha256 of the canonical predicate, the subject list
    matches its digest, and `raw` is exactly the form `serialize` writes (so an
    edit that changes no value, e.g. whitespace, is caught too). A pure function
    of the bytes, which is what lets a ValidationCache keep it under their sha256.
    """
    pred = data["predicate"]
    try:
        expected = receipt_id(pred, parsed=True)
    except (TypeError, ValueError) as err:
        return "invalid", f"predicate cannot be canonicalised: {err}"
    if expected != pred.get("receipt_id"):
        return "tampered", "receipt id does not match its predicate (edited after it was written)"
    subject = data.get("subject")
    try:
        subject_digest = hashlib.sha256(canonical_parsed(subject)).hexdigest() if isinstance(subject, list) else None
    except (TypeError, ValueError) as err:  # e.g. a lone surrogate in a name: no UTF-8 form to hash
        return "invalid", f"subject list cannot be canonicalised: {err}"
    if subject_digest is None or subject_digest != pred.get("subject_sha256"):
        return "tampered", "subject list does not match the digest in the predicate"
    if serialize_parsed(data) != raw:
        return "tampered", "file bytes differ from the form it was written in"
    return None


def check_receipt(path: Path, root: Path, specs_dir: Path | None = None, display: str | None = None,
                  cache=None, loaded: tuple[dict, bytes] | None = None, intact: bool = False) -> ReceiptCheck:
    """Integrity (recomputed id, subject digest, exact bytes) and freshness (subject digests vs the tree).

    Subjects named `specs/...` resolve against `specs_dir` (default root/specs),
    so a receipt of a spec kept outside the checkout can still be checked.
    Freshness is decided here every time; an `engine.store.cache.ValidationCache` only
    spares re-deriving what bytes alone decide: integrity (`integrity_problem`,
    under the receipt's sha256) and `_same_but_state` (under the spec's).
    `loaded` is (data, raw) when the caller has already read the file; `intact` says its integrity is known
    (a sealed summary of these very bytes, engine/store/sealed.py), and then only freshness is decided.
    """
    display = display or Path(path).name
    try:
        data, raw = loaded if loaded is not None else load_receipt(path, with_bytes=True)
    except ValueError as err:
        return ReceiptCheck(file=display, state="invalid", message=str(err))
    pred = data["predicate"]
    rc = ReceiptCheck(file=display, state="fresh", method=pred.get("method"), receipt_id=pred.get("receipt_id"),
                      status=pred.get("status"), created_at=pred.get("created_at"))
    problem = None if intact else cache.integrity_problem(data, raw) if cache is not None else \
        integrity_problem(data, raw)
    if problem is not None:
        rc.state, rc.message = problem
        return rc
    subject = data.get("subject")
    if not isinstance(subject, list) or not all(
            isinstance(x, dict) and isinstance(x.get("name"), str) and isinstance(x.get("digest"), dict)
            and isinstance(x["digest"].get("sha256"), str) for x in subject):
        rc.state, rc.message = "invalid", "subject is not a list of {name: string, digest: {sha256: string}} entries"
        return rc
    spec = pred.get("spec")
    state = spec.get("promotion_state") if isinstance(spec, dict) else None
    pairs = tuple((s["name"], s["digest"]["sha256"]) for s in subject)
    changed = cache.changed_subjects(pairs, state, root, specs_dir) if cache is not None else \
        changed_subjects(pairs, state, root, specs_dir)
    if changed:
        rc.state, rc.changed = "stale", tuple(changed)
        rc.message = "changed since the run: " + ", ".join(changed)
    return rc


def changed_subjects(pairs, state: str | None, root: Path, specs_dir: Path | None = None, cache=None) -> tuple:
    """The bound files (`pairs`: (name, sha256) of a receipt's subject) that differ from the working tree, each
    named as `verify` says it; empty when the receipt is fresh. `state` is the promotion state the receipt recorded
    for its spec (a spec that differs only in it is the same spec). The one rule of freshness: `check_receipt` and
    the sealed index (engine/store/sealed_index.py) both decide it here, on every call."""
    changed = []
    for name, sha in pairs:
        if is_external_subject(name):
            continue  # a checkpoint file: binds what ran, is not in the tree (see is_external_subject)
        if _not_a_repository_path(name):
            changed.append(f"{name} (not a repository path)")
            continue
        target = cache.subject_target(name, root, specs_dir) if cache is not None else \
            subject_target(name, root, specs_dir)
        if target is None:
            changed.append(f"{name} (resolves outside the checkout)")
        elif not target.is_file():
            changed.append(f"{name} (missing)")
        elif (cache.tree_sha256(target) if cache is not None else sha256_file(target)) != sha \
                and not _same_but_state(target, name, sha, state, cache):
            changed.append(name)
    return tuple(changed)


@functools.lru_cache(maxsize=4096)
def _not_a_repository_path(name: str) -> bool:
    """Empty, absolute, or climbing out with `..`: a pure function of the name, which many receipts share."""
    return not name or Path(name).is_absolute() or ".." in Path(name).parts


def subject_target(name: str, root: Path, specs_dir: Path | None = None) -> Path | None:
    """The working-tree file a subject names, or None when it resolves outside its folder (`..`, or a symbolic
    link out of the checkout): such a file is never read. `specs/...` resolves against specs_dir when given.

    Each component is lstat'ed (a few microseconds); only a path through a link is resolved in full.
    """
    if name.startswith(("/", "\\")):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if specs_dir is not None and parts[:1] == ["specs"] and len(parts) > 1:
        base, rel = os.fspath(specs_dir), parts[1:]
    else:
        base, rel = os.fspath(root), parts
    if not rel or ".." in rel:
        return None
    target = Path(base, *rel)
    here = base
    try:
        for part in rel:
            here = os.path.join(here, part)
            try:
                mode = os.lstat(here).st_mode
            except FileNotFoundError:
                return target  # missing: nothing to read, and the caller says so
            if stat.S_ISLNK(mode):
                real, real_base = os.path.realpath(target), os.path.realpath(base)
                inside = real == real_base or real.startswith(real_base.rstrip(os.sep) + os.sep)
                return target if inside else None
    except (ValueError, OSError):  # a NUL byte, a name too long: no file this names can be read
        return None
    return target


# --- freshness across a promote/demote -----------------------------------------


def _same_but_state(target: Path, name: str, sha: str, state: str | None, cache=None) -> bool:
    """A spec that differs from the run's only in promotion.state (a promote or demote since) is the same spec.

    Promoting rewrites exactly the state token (engine/gate/promote.py); setting it
    back must reproduce the bound bytes, or the spec really changed.
    """
    if not name.startswith("specs/") or not isinstance(state, str):
        return False
    if cache is not None:
        return cache.digest_with_state(target.read_bytes(), state) == sha
    from engine.gate.promote import digest_with_state

    return digest_with_state(target.read_bytes(), state) == sha


# --- receipt JSON Schema (published by `contracts schema receipt`) -----------


def receipt_schema() -> dict:
    """The receipt JSON Schema (Draft 2020-12)."""
    from importlib import resources

    return json.loads(resources.files("engine").joinpath("schemas/receipt.schema.json").read_text(encoding="utf-8"))


_RECEIPT_VALIDATOR = None
_FAST_VALIDATOR: Any = None  # the compiled fast check; False once it is known to be unavailable

# The keywords the receipt schema may use. Each means the same to a draft-7 validator (fastjsonschema
# implements drafts 4/6/7) as in Draft 2020-12 (the published dialect, which jsonschema checks), under
# the rules `dialect_problems` adds. Left out on purpose: `format` (an annotation in 2020-12, asserted by
# fastjsonschema), `items` as an array, `dependentRequired`/`prefixItems`/`unevaluated*`/`$anchor`/
# `$dynamicRef` (2020-12 only: draft 7 ignores them), `definitions`/`dependencies`/`additionalItems`
# (draft 7 only), `default` (fastjsonschema would write it into the data).
DRAFT7_SAME_KEYWORDS = frozenset({
    "$schema", "$id", "$defs", "$ref", "title", "description", "type", "enum", "const", "properties",
    "required", "additionalProperties", "items", "minItems", "minLength", "pattern", "minimum", "anyOf", "oneOf",
})
_JSON_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})
_ROOT_ONLY = frozenset({"$schema", "$id", "$defs"})
_DRAFT7 = "http://json-schema.org/draft-07/schema#"
# Python's `$` (no MULTILINE): end of text, or before a newline that ends it. fastjsonschema turns every
# unescaped `$` of a pattern into `\Z` (end of text only), so it is handed this instead.
_PY_DOLLAR = r"(?=\n?\Z)"


def _pattern_dollars(pattern: str) -> list[int] | None:
    """Offsets of the `$` end anchors in a regex; None when a `$` stands inside a character class."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
            elif c == "$":
                return None
        elif c == "[":
            in_class = True
            i += 1 + (pattern[i + 1:i + 2] == "^")
            i += pattern[i:i + 1] == "]"  # a `]` first in a class is a literal
            continue
        elif c == "$":
            out.append(i)
        i += 1
    return out


def dialect_problems(schema: dict) -> list[str]:
    """Why the receipt schema could mean something else to a draft-7 validator; empty when it cannot.

    The fast path trusts fastjsonschema's "valid" only while this is empty, and
    tests/test_receipt_schema.py keeps it empty for the shipped schema.
    """
    out: list[str] = []
    defs = schema.get("$defs") if isinstance(schema, dict) else None
    defs = defs if isinstance(defs, dict) else {}

    def walk(node: Any, at: str, root: bool = False) -> None:
        if not isinstance(node, dict):
            out.append(f"{at}: a subschema that is not an object")
            return
        for key in node:
            if key not in DRAFT7_SAME_KEYWORDS:
                out.append(f"{at}: keyword {key!r} is not known to mean the same in draft 7 and 2020-12")
            elif key in _ROOT_ONLY and not root:
                out.append(f"{at}: {key!r} below the root")
        ref = node.get("$ref")
        if "$ref" in node:
            if len(node) > 1:  # 2020-12 applies a $ref's siblings, draft 7 ignores them
                out.append(f"{at}: $ref with sibling keywords {sorted(k for k in node if k != '$ref')}")
            if not (isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs):
                out.append(f"{at}: $ref {ref!r} is not '#/$defs/<name>' of this schema")
        for key in ("title", "description", "$schema", "$id"):
            if key in node and not isinstance(node[key], str):
                out.append(f"{at}.{key}: not a string")
        if "type" in node:
            types = node["type"] if isinstance(node["type"], list) else [node["type"]]
            if not types or not all(isinstance(t, str) and t in _JSON_TYPES for t in types):
                out.append(f"{at}.type: {node['type']!r}")
        # Strings only: how 1, 1.0 and true compare differs between validators (and fastjsonschema versions).
        for key in ("enum", "const"):
            if key in node:
                vals = node[key] if key == "enum" else [node[key]]
                if not isinstance(vals, list) or not vals or not all(isinstance(v, str) for v in vals):
                    out.append(f"{at}.{key}: values other than strings")
        if "required" in node and not (isinstance(node["required"], list)
                                        and all(isinstance(r, str) for r in node["required"])):
            out.append(f"{at}.required: not a list of names")
        for key in ("minItems", "minLength", "minimum"):
            if key in node and (isinstance(node[key], bool) or not isinstance(node[key], int)):
                out.append(f"{at}.{key}: not an integer")
        if "pattern" in node:
            pat = node["pattern"]
            if not isinstance(pat, str) or _pattern_dollars(pat) is None:
                out.append(f"{at}.pattern: a `$` inside a character class")
            elif re.search(r"\(\?[aiLmsux-]+[:)]", pat):  # (?m) would make `$` an end of line
                out.append(f"{at}.pattern: inline flags")
        for key in ("properties", "$defs"):
            if key in node:
                if isinstance(node[key], dict):
                    for name, sub in node[key].items():
                        walk(sub, f"{at}.{key}.{name}")
                else:
                    out.append(f"{at}.{key}: not an object")
        if "items" in node:
            walk(node["items"], f"{at}.items")  # an array of schemas is not a 2020-12 `items`
        if "additionalProperties" in node and not isinstance(node["additionalProperties"], bool):
            walk(node["additionalProperties"], f"{at}.additionalProperties")
        for key in ("anyOf", "oneOf"):
            if key in node:
                if isinstance(node[key], list) and node[key]:
                    for i, sub in enumerate(node[key]):
                        walk(sub, f"{at}.{key}[{i}]")
                else:
                    out.append(f"{at}.{key}: not a non-empty list")

    walk(schema, "$", root=True)
    return out


def draft7_copy(schema: dict) -> dict:
    """The schema as fastjsonschema must be given it to mean what it means in 2020-12 (see dialect_problems)."""

    def conv(node: Any, key: str | None = None) -> Any:
        if isinstance(node, dict):
            return {k: conv(v, k) for k, v in node.items()}
        if isinstance(node, list):
            return [conv(v) for v in node]
        if key == "pattern" and isinstance(node, str):
            for i in reversed(_pattern_dollars(node) or []):
                node = node[:i] + _PY_DOLLAR + node[i + 1:]
        return node

    out = conv(schema)
    out["$schema"] = _DRAFT7
    return out


def _refuse_remote(uri: str):
    raise ValueError(f"the receipt schema refers to {uri}; it must not need anything remote")


def compile_fast(schema: dict):
    """fastjsonschema's compiled check of `schema`, or None: fastjsonschema is not installed, or the schema
    uses something `dialect_problems` does not vouch for, or it does not compile."""
    try:
        import fastjsonschema
    except ImportError:
        return None
    if dialect_problems(schema):
        return None
    try:
        # detailed_exceptions stays on: off, fastjsonschema 2.22 fails to compile a `const`.
        return fastjsonschema.compile(draft7_copy(schema), use_default=False,
                                      handlers={s: _refuse_remote for s in ("http", "https", "file", "ftp")})
    except Exception:  # a schema it cannot compile only costs speed: jsonschema alone decides
        return None


def _fast_validator():
    """`compile_fast(receipt_schema())`, once per process and only when a receipt is first checked (about
    25 ms: five fast checks of a 300 KB receipt, a third of one jsonschema check), so commands that check
    no receipt never import fastjsonschema. Compiling is generating Python source and exec'ing it in
    memory, as compile_to_code would; nothing generated is kept on disk."""
    global _FAST_VALIDATOR
    if _FAST_VALIDATOR is None:
        _FAST_VALIDATOR = compile_fast(receipt_schema()) or False
    return _FAST_VALIDATOR or None


def schema_problems(data: Any, limit: int = 3) -> list[str]:
    """Where a parsed receipt breaks the receipt schema, as `$.json.path: message` lines (empty when valid).

    `data` is what json.loads returns (fastjsonschema takes a tuple for an array).
    A receipt the compiled fast check accepts is valid; any other goes to
    jsonschema, which decides and words the problems.
    """
    fast = _fast_validator()
    if fast is not None:
        try:
            fast(data)
        except Exception:
            pass
        else:
            return []
    global _RECEIPT_VALIDATOR
    from jsonschema import Draft202012Validator

    if _RECEIPT_VALIDATOR is None:
        _RECEIPT_VALIDATOR = Draft202012Validator(receipt_schema())
    return problem_lines(_RECEIPT_VALIDATOR, data, limit)


def problem_lines(validator, data: Any, limit: int = 3) -> list[str]:
    """A jsonschema validator's errors for `data`, sorted by path, as `$.json.path: message` lines."""
    out = []
    for err in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        msg = err.message if len(err.message) <= 160 else err.message[:157] + "..."
        out.append(f"{path}: {msg}")
        if len(out) >= limit:
            break
    return out
