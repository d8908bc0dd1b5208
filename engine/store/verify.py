"""`contracts verify`: integrity, schema and freshness of every receipt in a store, and the ledger.

States, in the order they are decided:
  invalid   the file cannot be read, is not JSON, is not a receipt, is filed under
            the wrong method, or does not match the receipt JSON Schema;
  tampered  the receipt id, the subject digest or the exact bytes do not match;
  stale     intact, but a bound file changed since the run (named);
  fresh     intact and every bound file matches the working tree.
A receipt file is a Statement, or a DSSE envelope of one (signed); integrity,
the id and the schema are judged on the Statement either way. Under a trust
policy (engine.store.trust) each receipt also gets `trust`: trusted, unsigned,
untrusted key or bad signature, decided after integrity and before the schema,
from the file's bytes (never from a cache). Without one, `signed_by` only names
the key ids an envelope claims.
Integrity comes before the schema, so an edited byte reads as tampered even when
the edit also breaks the schema. A spec that differs from the run's only in
`promotion.state` (a promote or demote since) still counts as the same spec
(engine.store.receipts.check_receipt).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.store import ledger as ledger_mod
from engine.store.receipts import (RECEIPT_SUFFIX, TMP_PREFIX, check_receipt, load_receipt, parse_receipt,
                                   schema_problems)
from engine.store.records import Receipt
from engine.spec.loader import KEY_RE

STATES = ("fresh", "stale", "tampered", "invalid")


@dataclass
class Assessed:
    """One receipt file as verify, gate and list see it."""

    file: str  # <method>/<name>, relative to the receipts folder
    state: str
    message: str = ""
    method: str | None = None
    receipt_id: str | None = None
    status: str | None = None
    created_at: str | None = None
    device: str | None = None
    changed: list[str] = field(default_factory=list)
    # only for fresh and stale receipts: the predicate, or its coverage facts (engine.store.coverage.facts) when
    # it was read from a summary (engine/store/summary.py: `assess_receipts`, the sealed index)
    predicate: dict | None = field(default=None, repr=False)
    subject: list | None = field(default=None, repr=False)  # what the receipt binds; None when read from a summary
    receipt: Receipt | None = field(default=None, repr=False)  # the typed record (engine/store/records.py), likewise
    signed_by: list[str] = field(default_factory=list)  # key ids the envelope claims (not checked without a policy)
    trust: str | None = None  # under a policy: trusted | unsigned | untrusted key | bad signature
    trust_message: str = ""

    def as_dict(self) -> dict:
        return {"file": self.file, "state": self.state, "method": self.method, "receipt_id": self.receipt_id,
                "status": self.status, "created_at": self.created_at, "device": self.device,
                "changed": list(self.changed), "message": self.message, "signed_by": list(self.signed_by),
                "trust": self.trust, "trust_message": self.trust_message}


def assess(path: Path, root: Path, specs_dir: Path, display: str | None = None,
           folder_method: str | None = None, cache=None, policy=None, sealed=None, index=None,
           rehash: bool = False) -> Assessed:
    """Everything verify knows about one receipt file.

    With an `engine.store.cache.ValidationCache`, the integrity and schema verdicts of these exact bytes may come
    from it (display only: gate, promote and verify pass none); freshness is decided afresh either way. With the
    user's sealed cache (`sealed`, engine.store.sealed.Sealed; or `index`, the folder's
    engine.store.sealed_index.FolderIndex), a receipt judged intact and schema-valid before is read from its
    summary: without reading the file while its identity is the one recorded, or after reading and hashing it
    (`rehash`, what `contracts verify` does) when its bytes are the ones recorded; its freshness, folder and key
    ids are decided afresh. Under a trust policy (engine.store.trust.TrustPolicy) nothing sealed is used and
    `trust` says whether the receipt may count.
    """
    display = display or Path(path).name
    own = None
    if index is None and policy is None and sealed is not None and sealed.enabled:
        from engine.store.sealed_index import FolderIndex

        index = own = FolderIndex(sealed, Path(path).parent)
    try:
        return _assess(Path(path), root, specs_dir, display, folder_method, cache, policy, index, rehash, False)
    finally:
        if own is not None:
            own.save()


def _assess(path: Path, root: Path, specs_dir: Path, display: str, folder_method: str | None, cache, policy,
            index, rehash: bool, light: bool) -> Assessed:
    """`assess`. `index` (a FolderIndex) is read when it is the user's sealed one (never under a policy) and is
    given what was judged; with `light` a receipt judged from its bytes comes back as read from its summary too,
    so that a store of thousands keeps a few kilobytes per receipt in memory, not its parsed predicate."""
    name = path.name
    sealed_index = index is not None and index.persistent and policy is None
    if sealed_index and not rehash:
        hit = index.by_identity(name)
        if hit is not None:
            out = _summarised(display, folder_method, *hit, root, specs_dir, cache)
            if out is not None:
                return out
    file_bytes, st, sha, t0 = None, None, None, 0
    if index is not None:
        from engine.store import bounded
        from engine.store.sealed_index import now_ns

        t0 = now_ns()  # before the status is taken: a ctime after it is racy (engine/store/sealed_index.py)
        try:
            if not path.parent.is_symlink():
                file_bytes, st = bounded.read_regular_with_stat(path, bounded.MAX_RECEIPT_BYTES)
        except (OSError, ValueError):
            file_bytes = None  # load_receipt below says why
        if file_bytes is not None:
            sha = hashlib.sha256(file_bytes).hexdigest()
            hit = index.by_content(name, sha, st, t0) if sealed_index else None
            if hit is not None:
                out = _summarised(display, folder_method, *hit, root, specs_dir, cache)
                if out is not None:
                    return out
    try:
        data, raw, signatures = parse_receipt(file_bytes) if file_bytes is not None else \
            load_receipt(path, with_signatures=True)
        loaded = (data, raw)
    except ValueError:
        loaded, signatures = None, None  # check_receipt reads it again and says why it cannot
    rc = check_receipt(path, root, specs_dir, display=display, cache=cache, loaded=loaded)
    out = Assessed(file=display, state=rc.state, message=rc.message, method=rc.method, receipt_id=rc.receipt_id,
                   status=rc.status if isinstance(rc.status, str) else None, created_at=rc.created_at,
                   changed=list(rc.changed), signed_by=[s["keyid"] for s in signatures or []])
    if rc.state in ("invalid", "tampered"):
        return out
    if loaded is None:  # unreadable at our read, readable at check_receipt's: replaced in between
        out.state, out.changed = "invalid", []
        out.message = "the file changed while it was being read; run verify again"
        return out
    if policy is not None:  # before the schema check (integrity -> signature -> schema), so read defensively
        env = data["predicate"].get("environment")
        kind = ((env or {}).get("device") or {}).get("kind") if isinstance(env, dict) and isinstance(
            env.get("device"), dict) else None
        out.trust, out.trust_message = policy.judge(signatures, raw, kind if isinstance(kind, str) else None)
    problems = cache.schema_problems(data, raw) if cache is not None else schema_problems(data)
    if problems:
        out.state, out.changed = "invalid", []
        out.message = "does not match the receipt schema: " + "; ".join(problems)
        return out
    pred = data["predicate"]
    if folder_method is not None and pred["method"] != folder_method:
        out.state, out.changed = "invalid", []
        out.message = f"filed under {folder_method}/ but is a receipt of {pred['method']}"
        return out
    try:
        out.receipt = Receipt.from_statement(data, tuple(out.signed_by))
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # the schema allows what the record cannot read
        out.state, out.changed = "invalid", []
        out.message = f"unexpected receipt shape: {type(err).__name__}: {err}"
        return out
    out.device = out.receipt.device
    out.predicate = pred
    out.subject = data.get("subject")
    # judged intact and valid from these bytes just now (never from a store's cache file, which anyone who writes
    # the store can edit): keep its summary
    if index is not None and file_bytes is not None and getattr(cache, "path", None) is None:
        from engine.store import summary

        try:
            fields, parts = summary.of(data)
            entry = index.record(name, st, t0, file_bytes, signatures, fields, parts, sha)
        except (KeyError, TypeError, ValueError, AttributeError):  # a shape the summary cannot hold: as it is
            return out
        if light:
            again = _summarised(display, folder_method, *entry, root, specs_dir, cache, changed=out.changed)
            if again is not None:
                again.trust, again.trust_message = out.trust, out.trust_message
                return again
    return out


def _summarised(display: str, folder_method: str | None, fields: list, parts: dict, keyids: list[str], root: Path,
                specs_dir: Path, cache, changed=None) -> Assessed | None:
    """The Assessed of a receipt from its summary, as `_assess` makes it from the bytes (freshness decided now,
    unless `changed` says what it was just found to be); None when the summary cannot be read back (the file is
    then judged from its bytes). A store has thousands: made without dataclass __init__ (Assessed has no
    __post_init__), from one dict."""
    from engine.store import summary
    from engine.store.receipts import changed_subjects

    try:
        rec = summary.receipt(fields, parts, tuple(keyids))
    except ValueError:
        return None
    pairs, state = rec.subject, rec.spec_state
    if changed is None:
        changed = cache.changed_subjects(pairs, state, root, specs_dir) if cache is not None else \
            changed_subjects(pairs, state, root, specs_dir)
    out = _NEW(Assessed)
    if folder_method is not None and rec.method != folder_method:
        out.__dict__.update(file=display, state="invalid", method=rec.method, receipt_id=rec.receipt_id,
                            status=rec.status, created_at=rec.created_at, device=None, changed=[],
                            message=f"filed under {folder_method}/ but is a receipt of {rec.method}",
                            predicate=None, subject=None, receipt=None, signed_by=list(keyids), trust=None,
                            trust_message="")
        return out
    out.__dict__.update(file=display, state="stale" if changed else "fresh", message=_changed_message(changed),
                        method=rec.method, receipt_id=rec.receipt_id, status=rec.status, created_at=rec.created_at,
                        device=rec.device, changed=list(changed), predicate=rec.predicate, subject=None, receipt=rec,
                        signed_by=list(keyids), trust=None, trust_message="")
    return out


_NEW = object.__new__
_MESSAGES: dict[tuple, str] = {}


def _changed_message(changed) -> str:
    """check_receipt's message for a stale receipt (the same few lists recur across a store: built once each)."""
    if not changed:
        return ""
    key = tuple(changed)
    if key not in _MESSAGES:
        if len(_MESSAGES) > 4096:
            _MESSAGES.clear()
        _MESSAGES[key] = "changed since the run: " + ", ".join(changed)
    return _MESSAGES[key]


@dataclass
class StoreReport:
    receipts: list[Assessed] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)  # .tmp- files a crashed write left behind
    ledger: ledger_mod.LedgerReport | None = None

    def counts(self) -> dict[str, int]:
        return {s: sum(r.state == s for r in self.receipts) for s in STATES}


def _listing(receipts_dir: Path, method: str | None = None) -> tuple[list[tuple], list[str]]:
    """(folder, name, display, folder method, directory entry) for every candidate receipt, plus leftover
    temporary files: `store_files`, by os.scandir (its file types come with the listing, and a reading verb on
    10,000 receipts must not stat each twice)."""
    base = os.fspath(receipts_dir)
    files: list[tuple] = []
    leftovers: list[str] = []
    if not os.path.isdir(base):
        return files, leftovers
    if method:
        folders = [(method, os.path.join(base, method))]
    else:
        with os.scandir(base) as it:
            folders = sorted((e.name, e.path) for e in it if e.is_dir())
    for name, folder in folders:
        if name.startswith((".", "__")) or not os.path.isdir(folder):
            continue
        folder_method = name if KEY_RE.match(name) else None
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if not (e.is_file() or e.is_symlink()):  # a link is assessed (and refused as invalid), never skipped
                continue
            if e.name.startswith(TMP_PREFIX):
                leftovers.append(f"{name}/{e.name}")
            elif not e.name.startswith("."):
                files.append((folder, e.name, f"{name}/{e.name}", folder_method, e))
    if method is None:
        with os.scandir(base) as it:
            top = sorted(it, key=lambda e: e.name)
        for e in top:
            if e.is_file() and e.name.endswith(RECEIPT_SUFFIX) and not e.name.startswith("."):
                files.append((base, e.name, e.name, None, e))
    return files, leftovers


def store_files(receipts_dir: Path, method: str | None = None) -> tuple[list[tuple[Path, str, str | None]], list[str]]:
    """(path, display, folder method) for every candidate receipt, plus leftover temporary files.

    Every non-hidden file inside a method folder is a candidate, whatever its
    name, so a stray or renamed file is reported rather than skipped; a `.json`
    file at the top of the store (outside any method folder) is reported too.
    """
    files, leftovers = _listing(receipts_dir, method)
    return [(Path(folder, name), display, fm) for folder, name, display, fm, _ in files], leftovers


def assess_receipts(receipts_dir: Path, root: Path, specs_dir: Path, method: str | None = None, cache=None,
                    policy=None, sealed=None, rehash: bool = False) -> tuple[list[Assessed], list[str]]:
    """Every candidate receipt (of one method, or all), assessed; plus leftover temporary files. With the user's
    sealed cache (and no policy) each method folder's sealed index serves what it holds (`assess`): a receipt
    whose file still has the identity recorded with its verdict is read from its summary without opening it."""
    from engine.store.sealed_index import FolderIndex

    files, leftovers = _listing(receipts_dir, method)
    base = os.fspath(receipts_dir)
    indexes: dict[str, Any] = {}
    listed: dict[str, set] = {}
    use_index = policy is None and sealed is not None and sealed.enabled
    out = []
    for folder, name, display, folder_method, entry in files:
        if folder_method is None:
            where = f"in {os.path.basename(folder)}/, which is not a method key" if folder != base \
                else "not inside a method folder"
            a = Assessed(file=display, state="invalid", message=f"{where} (receipts live in <receipts>/<method>/)")
        elif not name.endswith(RECEIPT_SUFFIX):
            a = Assessed(file=display, state="invalid", message=f"not a receipt file name (expected *{RECEIPT_SUFFIX})")
        else:
            index = indexes.get(folder)
            if index is None:  # the user's sealed index; under a policy or without a cache, this command's only
                index = indexes[folder] = FolderIndex(sealed if use_index else None, Path(folder))
                listed[folder] = set()
            listed[folder].add(name)
            a = None
            if use_index and not rehash:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    st = None
                hit = index.by_identity(name, st) if st is not None else None
                if hit is not None:
                    a = _summarised(display, folder_method, *hit, root, specs_dir, cache)
            if a is None:  # not known by its identity: read (and hashed, and looked up by its bytes)
                a = _assess(Path(folder, name), root, specs_dir, display, folder_method, cache, policy, index, True,
                            True)
        out.append(a)
    for folder, index in indexes.items():
        index.save(listed[folder])
    return out, leftovers


def assess_store(receipts_dir: Path, root: Path, specs_dir: Path, method: str | None = None,
                 spec_states: dict[str, str] | None = None, cache=None, policy=None, sealed=None,
                 rehash: bool = True) -> StoreReport:
    """Assess every receipt (of one method, or all) and the ledger against them and the specs' states. `rehash`
    (verify's way): every file is read and hashed, whatever its identity says."""
    receipts, leftovers = assess_receipts(receipts_dir, root, specs_dir, method, cache=cache, policy=policy,
                                          sealed=sealed, rehash=rehash)
    report = StoreReport(receipts=receipts, leftovers=leftovers)
    led = ledger_mod.read(receipts_dir)
    if method is not None:
        led.entries = [e for e in led.entries if e.get("method") == method]
    # the ledger may name a receipt that has gone stale, never one that is gone or broken
    known = {r.receipt_id for r in report.receipts if r.state in ("fresh", "stale") and r.receipt_id}
    ledger_mod.check_against(led, known, spec_states or {})
    report.ledger = led
    return report
