"""The sealed index of a receipt store: each receipt verified once, and again only when its file changes.

A reading verb must not read 2.5 GB to list 10,000 receipts. Per method folder of a store, the user's sealed cache
(engine/store/sealed.py: the user's folder, an HMAC under the user's key, never the store) keeps one index:

    file name -> (identity, sha256 of its bytes, for a signed receipt where its signatures block starts and that
                  block's sha256, and the receipt's summary: engine/store/summary.py)

made only from bytes judged intact and schema-valid just then (engine/store/verify.py), filed under the
fingerprint of the code that decides that (sealed.receipt_fingerprint: receipts.py, the receipt schema, the
envelope, the summary; not the CLI or the gate), and keyed by the folder's real path.

The identity is (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns). Any write to a file, a rename over it, a
truncation, a hard link, a chmod or an `os.utime` that puts its mtime back sets its ctime to the current time, and
nobody but the clock's owner can set a ctime back; a replaced or swapped file is another inode. So a file whose
identity is the recorded one holds the recorded bytes, with two provisos, both handled as git handles its "racily
clean" index entries: the kernel stamps times from a clock that ticks every few milliseconds (and some filesystems
keep whole seconds), so a file whose ctime is within RACY_NS of the moment its bytes were read is recorded without
an identity (it is hashed again next time, and recorded then); and the identity is taken from the open file just
before its bytes are read, never after. A signed receipt's signatures block (the end of its file) is read again on
every call, its digest compared and its key ids taken from it, so the key ids a verb shows always come from the file.

On a miss (no entry, another identity, a racy one) the file is read and hashed: bytes with the recorded sha256 reuse
the summary (and record the new identity); any other bytes are judged from scratch, exactly as without an index.
Freshness (every bound file against the working tree), the folder a receipt is filed in and its file name are
decided on every call; under a trust policy, with --no-cache or CONTRACTS_NO_CACHE=1 nothing here is read or
written. `contracts verify` reads and hashes every file whatever its identity says.

This module never imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from engine.store.summary import PARTS, decode_part

KIND = "index"
VERSION = 2  # 2: the receipt's policy (kind, used_by) in its static part
MAX_INDEX_BYTES = 512 << 20  # an index of 10,000 receipts with nothing shared is about 100 MB
MAX_TAIL_BYTES = 64 << 10  # a signatures block: at most 16 key ids and signatures of printable ASCII
RACY_NS = 3_000_000_000  # a file changed this recently may change again within the same clock tick
_SIGNATURES = b'"signatures":'
_O_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


def identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def signatures_block(raw: bytes, signatures: list[dict]) -> tuple[int, str] | None:
    """(offset, sha256) of the signatures block that ends a signed receipt file, when the file ends with exactly
    the block holding `signatures` (as `engine.store.signing.envelope_bytes` writes it); else None."""
    at = raw.rfind(_SIGNATURES)
    if at < 0 or len(raw) - at > MAX_TAIL_BYTES:
        return None
    tail = raw[at:]
    if _key_ids(tail) != [s["keyid"] for s in signatures] or _parsed_signatures(tail) != signatures:
        return None
    return at, hashlib.sha256(tail).hexdigest()


def _parsed_signatures(tail: bytes) -> Any:
    try:
        doc = json.loads(b"{" + tail)
    except (ValueError, RecursionError):
        return None
    return doc.get("signatures") if isinstance(doc, dict) and set(doc) == {"signatures"} else None


def _key_ids(tail: bytes) -> list[str] | None:
    sigs = _parsed_signatures(tail)
    if not isinstance(sigs, list) or not all(isinstance(s, dict) and isinstance(s.get("keyid"), str) for s in sigs):
        return None
    return [s["keyid"] for s in sigs]


class FolderIndex:
    """The sealed index of one method folder (a receipts folder's subfolder), loaded once per command."""

    def __init__(self, sealed, folder: Path):
        """`sealed` None (or disabled): an index of this process only, nothing read or written, whose records
        share their parts all the same."""
        from engine.store.sealed import receipt_fingerprint

        self.sealed, self.folder = sealed, Path(folder)
        self.persistent = sealed is not None and sealed.enabled
        self.key = hashlib.sha256(b"receipt index\0" + os.fsencode(os.path.realpath(self.folder))).hexdigest()
        self.fp = receipt_fingerprint()
        # name -> [identity | None, sha256, signatures block | None, key ids | None, own fields, refs to parts]
        self.files: dict[str, list] = {}
        self.parts: list[list] = []  # [name, value], as stored
        self._decoded: dict[int, Any] = {}
        self._canonical: dict[str, int] | None = None
        self._dirty = False
        # load_receipt refuses every file of a folder that is a symbolic link: so does the index, by holding nothing
        self.usable = not os.path.islink(self.folder)
        if self.usable and self.persistent:
            self._load()

    # -- the sealed file ---------------------------------------------------------------------------------------

    def _load(self) -> None:
        doc = self.sealed.get(KIND, self.key, self.fp, max_bytes=MAX_INDEX_BYTES)
        if not isinstance(doc, dict) or doc.get("v") != VERSION or not isinstance(doc.get("parts"), list) \
                or not isinstance(doc.get("files"), dict):
            return
        self.parts = doc["parts"]
        self.files = {k: v for k, v in doc["files"].items() if isinstance(v, list) and len(v) == 6}

    def save(self, listed: set[str] | None = None) -> None:
        """Keep what was learnt (`listed`: every file name the folder holds now; the others' entries go)."""
        if not (self.usable and self.persistent):
            return
        if listed is not None and set(self.files) - listed:
            self.files = {k: v for k, v in self.files.items() if k in listed}
            self._dirty = True
        if not self._dirty:
            return
        used: dict[int, int] = {}
        parts: list[list] = []
        files = {}
        for name, (ident, sha, block, keyids, fields, refs) in self.files.items():
            new = []
            for i in refs:
                if i not in used:
                    used[i] = len(parts)
                    parts.append(self.parts[i])
                new.append(used[i])
            files[name] = [ident, sha, block, keyids, fields, new]
        self.sealed.put(KIND, self.key, self.fp, {"v": VERSION, "folder": self.folder.name, "parts": parts,
                                                  "files": files}, allow_nan=True)
        self._dirty = False

    # -- reading ------------------------------------------------------------------------------------------------

    def _summary(self, entry: list) -> tuple[list, dict[str, Any]] | None:
        refs = entry[5]
        if not isinstance(refs, list) or len(refs) != len(PARTS) or not isinstance(entry[4], list):
            return None
        try:
            parts = {name: self._decoded_part(i, name) for name, i in zip(PARTS, refs)}
        except (ValueError, IndexError, TypeError, KeyError):
            return None
        return entry[4], parts

    def _decoded_part(self, i: int, name: str) -> Any:
        got = self._decoded.get(i)
        if got is None:
            stored = self.parts[i]
            if stored[0] != name:
                raise ValueError(f"part {i} is not a {name} part")
            got = self._decoded[i] = decode_part(name, stored[1])
        return got

    def by_identity(self, name: str, st: os.stat_result | None = None) -> tuple[list, dict, list[str]] | None:
        """(fields, parts, key ids) of the file `name` when its identity (and, signed, its signatures block) is the
        one recorded with its verdict; None otherwise (read and hash it). `st`: its lstat, when the caller has it."""
        entry = self.files.get(name) if self.usable and self.persistent else None
        if entry is None or not isinstance(entry[0], list):
            return None
        path = os.path.join(self.folder, name)
        block = entry[2]
        try:
            if entry[3] is None:  # unsigned: the identity alone
                st = st if st is not None else os.lstat(path)
                if not stat.S_ISREG(st.st_mode) or identity(st) != entry[0]:
                    return None
                keyids: list[str] = []
            else:
                if not (isinstance(block, list) and len(block) == 2 and isinstance(block[0], int)):
                    return None
                fd = os.open(path, _O_READ)
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode) or identity(st) != entry[0]:
                        return None
                    tail = os.pread(fd, st.st_size - block[0], block[0])
                finally:
                    os.close(fd)
                if hashlib.sha256(tail).hexdigest() != block[1]:
                    return None
                keyids = _key_ids(tail)
                if keyids is None:
                    return None
        except (OSError, ValueError, TypeError):
            return None
        summary = self._summary(entry)
        return None if summary is None else (*summary, keyids)

    def by_content(self, name: str, sha: str, st: os.stat_result, t0: int) -> tuple[list, dict, list[str]] | None:
        """(fields, parts, key ids) when the bytes of `name` just read (sha256 `sha`, status `st` taken before
        reading, at time `t0`) are the ones recorded; their identity is recorded anew."""
        entry = self.files.get(name) if self.usable and self.persistent else None
        if entry is None or entry[1] != sha:
            return None
        summary = self._summary(entry)
        if summary is None:
            return None
        ident = self._identity(st, t0)
        if ident != entry[0]:
            entry[0] = ident
            self._dirty = True
        return (*summary, list(entry[3] or []))

    # -- recording ------------------------------------------------------------------------------------------------

    @staticmethod
    def _identity(st: os.stat_result, t0: int) -> list[int] | None:
        """The identity to record, or None while the file is racy (changed within RACY_NS of reading it)."""
        return identity(st) if st.st_ctime_ns <= t0 - RACY_NS else None

    def _part(self, name: str, value: Any) -> int:
        if self._canonical is None:
            self._canonical = {}
            for i, (n, v) in enumerate(self.parts):
                self._canonical.setdefault(_canonical(n, v), i)
        key = _canonical(name, value)
        i = self._canonical.get(key)
        if i is None:
            i = self._canonical[key] = len(self.parts)
            self.parts.append([name, value])
        return i

    def record(self, name: str, st: os.stat_result, t0: int, raw: bytes, signatures: list[dict] | None,
               fields: list, parts: dict[str, Any], sha: str | None = None) -> tuple[list, dict, list[str]]:
        """Keep the summary of the file `name`, whose bytes `raw` (status `st` taken before reading them, at time
        `t0`) were judged intact and schema-valid just now; returns it as `by_identity` would, its parts decoded
        and shared with the records that have the same ones."""
        block = None
        ident = self._identity(st, t0)
        if signatures is not None:
            block = signatures_block(raw, signatures)
            if block is None:
                ident = None  # no block to read again on every call: found by its bytes only
        refs = [self._part(p, parts[p]) for p in PARTS]
        keyids = [s["keyid"] for s in signatures or []]
        entry = [ident, sha or hashlib.sha256(raw).hexdigest(), None if block is None else list(block),
                 None if signatures is None else keyids, fields, refs]
        if self.usable:
            self.files[name] = entry
            self._dirty = True
        decoded = {p: self._decoded_part(i, p) for p, i in zip(PARTS, refs)}
        return fields, decoded, keyids


def _canonical(name: str, value: Any) -> str:
    return name + "\0" + json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)


def now_ns() -> int:
    """The time a read starts, against which a file's ctime is judged racy."""
    return time.time_ns()
