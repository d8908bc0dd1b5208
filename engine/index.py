"""A cache of receipt summaries, so browsing never re-reads every receipt.

`receipts/.index.jsonl` holds one small summary per receipt file, keyed by the
file's path inside the store plus its size and mtime. `refresh()` lists the
store and parses only files that are new or changed since they were indexed;
everything else comes from the cache. The index is a cache, never evidence:
deleting it costs one full re-read and changes nothing else.

What is cached is what a file's bytes alone decide (its integrity: ok,
tampered or invalid; its results condensed per contract). Freshness depends on
the working tree, not the file, so it is computed when asked (`Freshness`),
once per distinct subject list, with file digests cached by size and mtime.

This module never imports torch.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from engine.receipts import RECEIPT_SUFFIX, TMP_PREFIX, canonical, load_receipt, receipt_id, serialize

INDEX_NAME = ".index.jsonl"
INDEX_VERSION = 1
OK, TAMPERED, INVALID = "ok", "tampered", "invalid"
FRESH, STALE = "fresh", "stale"
_STAMP_RE = re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})(\d{6})Z_")


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def integrity(data: dict, raw: bytes) -> tuple[str, str]:
    """(state, message) from the file's bytes alone: the same tests as `check_receipt`, minus freshness."""
    pred = data["predicate"]
    try:
        expected = receipt_id(pred)
    except (TypeError, ValueError) as err:
        return INVALID, f"predicate cannot be canonicalised: {err}"
    if expected != pred.get("receipt_id"):
        return TAMPERED, "receipt id does not match its predicate (edited after it was written)"
    subject = data.get("subject")
    if not isinstance(subject, list) or hashlib.sha256(canonical(subject)).hexdigest() != pred.get("subject_sha256"):
        return TAMPERED, "subject list does not match the digest in the predicate"
    if serialize(data) != raw:
        return TAMPERED, "file bytes differ from the form it was written in"
    return OK, ""


def _contract_digest(results: list[dict]) -> dict[str, list]:
    """Per contract: [status, seeds passed, n passed, n results, worst expectation, kind].

    status is the worst over seeds and dtypes (error > failed > passed); a seed
    counts as passed only when every dtype passed for it; the worst expectation
    is [metric, value, op, threshold, margin] with the smallest margin.
    """
    out: dict[str, dict] = {}
    for r in results:
        if not isinstance(r, dict) or not isinstance(r.get("contract"), str):
            continue
        c = out.setdefault(r["contract"], {"statuses": set(), "seeds": {}, "n": 0, "passed": 0, "worst": None,
                                           "kind": r.get("kind")})
        status = r.get("status")
        c["statuses"].add(status)
        c["n"] += 1
        c["passed"] += status == "passed"
        seed = r.get("seed")
        c["seeds"][seed] = c["seeds"].get(seed, True) and status == "passed"
        for e in r.get("expectations") or []:
            if not isinstance(e, dict):
                continue
            m = e.get("margin")
            key = m if _finite(m) else -math.inf  # a missing or NaN margin is the worst there is
            if c["worst"] is None or key < c["worst"][0]:
                c["worst"] = (key, [e.get("metric"), e.get("value"), e.get("op"), e.get("threshold"),
                                    m if _finite(m) else None])
        if not r.get("expectations") and c["worst"] is None:
            c["worst"] = (-math.inf, [None, None, None, None, None])
    digest = {}
    for cid, c in out.items():
        s = c["statuses"]
        status = "error" if "error" in s else "failed" if "failed" in s else "passed" if s == {"passed"} else "error"
        seeds = sorted((k for k, ok in c["seeds"].items() if ok and isinstance(k, int)))
        worst = c["worst"][1] if c["worst"] else [None] * 5
        digest[cid] = [status, seeds, c["passed"], c["n"], worst, c["kind"]]
    return digest


def summarize(data: dict) -> dict:
    """The part of a parsed receipt the browser needs on its first screen (small, JSON-safe)."""
    pred = data["predicate"]
    env = pred.get("environment") or {}
    dev = env.get("device") or {}
    git = pred.get("git") or {}
    req = pred.get("request") or {}
    formal = []
    for m in pred.get("mechanism") or []:
        for c in (m or {}).get("comparisons") or []:
            if isinstance(c, dict) and c.get("formal") is True:
                formal.append({k: c.get(k) for k in ("name", "metric", "method", "control", "method_values",
                                                     "control_values")} | {"contract": m.get("contract"),
                                                                           "seed": m.get("seed")})
    mutants = {}
    for m in pred.get("mutants") or []:
        if isinstance(m, dict) and isinstance(m.get("id"), str):
            mutants[m["id"]] = bool(m.get("killed"))
    subject = data.get("subject") if isinstance(data.get("subject"), list) else []
    return {
        "method": pred.get("method") if isinstance(pred.get("method"), str) else None,
        "receipt_id": pred.get("receipt_id") if isinstance(pred.get("receipt_id"), str) else None,
        "created_at": pred.get("created_at") if isinstance(pred.get("created_at"), str) else None,
        "status": pred.get("status") if isinstance(pred.get("status"), str) else None,
        "device": dev.get("kind"),
        "device_name": dev.get("name"),
        "seeds": list(req.get("seeds") or []),
        "only": req.get("only"),
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
        "spec_sha256": (pred.get("spec") or {}).get("sha256"),
        "review": (pred.get("spec") or {}).get("review"),
        "contracts": _contract_digest(pred.get("results") or []),
        "mutants": mutants,
        "formal": formal,
        "counts": dict((pred.get("summary") or {}).get("results") or {}),
        "subjects": hashlib.sha256(canonical(subject)).hexdigest() if subject else None,
    }


def _stamp_time(name: str) -> str | None:
    m = _STAMP_RE.match(name)
    if not m:
        return None
    y, mo, d, h, mi, s, us = m.groups()
    return f"{y}-{mo}-{d}T{h}:{mi}:{s}.{us}Z"


def _empty(rel: str, state: str, message: str) -> dict:
    """What an unreadable file gets: enough to list it as broken, never a crash."""
    folder, _, name = rel.partition("/")
    return {"method": folder or None, "receipt_id": None, "created_at": _stamp_time(name), "status": None,
            "device": None, "device_name": None, "seeds": [], "only": None, "commit": None, "dirty": None,
            "spec_sha256": None, "review": None, "contracts": {}, "mutants": {}, "formal": [], "counts": {},
            "subjects": None, "state": state, "message": message}


def index_file(path: Path, rel: str) -> tuple[dict, list | None]:
    """(summary, subject list) for one receipt file; broken files give a summary that says so."""
    try:
        data, raw = load_receipt(path, with_bytes=True)
    except ValueError as err:
        return _empty(rel, INVALID, str(err)), None
    try:
        state, message = integrity(data, raw)
        summary = summarize(data)
    except Exception as err:  # an odd shape from another version or an edit: listed, never fatal
        return _empty(rel, INVALID, f"unexpected receipt shape: {type(err).__name__}: {err}"), None
    summary["state"], summary["message"] = state, message
    subject = data.get("subject") if isinstance(data.get("subject"), list) else None
    return summary, subject


@dataclass
class RefreshResult:
    """What one `refresh` did: how many files it parsed, and what changed."""

    parsed: int = 0
    cached: int = 0
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    persisted: bool = True


class ReceiptIndex:
    """Receipt summaries for one store, refreshed incrementally from `.index.jsonl`."""

    def __init__(self, receipts_dir: Path, persist: bool = True):
        self.receipts_dir = Path(receipts_dir)
        self.path = self.receipts_dir / INDEX_NAME
        self.persist = persist
        self._entries: dict[str, dict] = {}  # rel path -> summary (with size, mtime_ns, file)
        self._subjects: dict[str, list] = {}  # subject-list digest -> [[name, sha256], ...]
        self._loaded = False
        self._lines = 0

    # -- the cache file ------------------------------------------------------

    def _read_cache(self) -> None:
        self._loaded = True
        try:
            with open(self.path, "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        if not lines:
            return
        try:
            head = json.loads(lines[0])
        except ValueError:
            return
        if head.get("k") != "h" or head.get("v") != INDEX_VERSION:
            return  # another format: rebuilt from the receipts on this refresh
        for line in lines[1:]:
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash: that file is simply parsed again
            kind = rec.get("k")
            if kind == "r" and isinstance(rec.get("file"), str):
                self._entries[rec["file"]] = rec
            elif kind == "s" and isinstance(rec.get("d"), str):
                self._subjects[rec["d"]] = rec.get("s") or []
        self._lines = len(lines)

    def _write(self, records: list[dict], rewrite: bool) -> bool:
        if not self.persist:
            return False
        text = "".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"
                       for r in records)
        try:
            if rewrite:
                head = json.dumps({"k": "h", "v": INDEX_VERSION, "about": "cache of receipt summaries; safe to "
                                   "delete"}) + "\n"
                tmp = self.receipts_dir / f"{TMP_PREFIX}index-{secrets.token_hex(6)}"
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(head + text)
                os.replace(tmp, self.path)
                self._lines = 1 + len(records)
            elif records:
                # One write of whole lines in append mode: a concurrent reader sees whole lines or
                # a cut last line, which it skips.
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(text)
                self._lines += len(records)
            return True
        except (OSError, ValueError):
            return False  # a read-only store still browses; it just re-parses next time

    # -- refresh ---------------------------------------------------------------

    def _listing(self) -> dict[str, tuple[Path, int, int]]:
        found: dict[str, tuple[Path, int, int]] = {}
        try:
            folders = [e for e in os.scandir(self.receipts_dir) if e.is_dir() and not e.name.startswith(".")]
        except OSError:
            return found
        for folder in folders:
            try:
                entries = list(os.scandir(folder.path))
            except OSError:
                continue
            for e in entries:
                if e.name.startswith(".") or not e.name.endswith(RECEIPT_SUFFIX):
                    continue
                try:
                    if not e.is_file():
                        continue
                    st = e.stat()
                except OSError:
                    continue
                found[f"{folder.name}/{e.name}"] = (Path(e.path), st.st_size, st.st_mtime_ns)
        return found

    def refresh(self, progress: Callable[[int, int], None] | None = None) -> RefreshResult:
        """List the store; parse only files not indexed yet (or changed); persist the new summaries."""
        if not self._loaded:
            self._read_cache()
        had_cache_file = self._lines > 0
        listing = self._listing()
        result = RefreshResult()
        todo = [rel for rel, (_, size, mtime) in listing.items()
                if (e := self._entries.get(rel)) is None or e.get("size") != size or e.get("mtime_ns") != mtime]
        result.removed = sorted(set(self._entries) - set(listing))
        for rel in result.removed:
            del self._entries[rel]
        new_records: list[dict] = []
        for i, rel in enumerate(sorted(todo)):
            path, size, mtime = listing[rel]
            summary, subject = index_file(path, rel)
            rec = {"k": "r", "file": rel, "size": size, "mtime_ns": mtime, **summary}
            digest = summary.get("subjects")
            if digest and subject is not None and digest not in self._subjects:
                pairs = [[s.get("name"), (s.get("digest") or {}).get("sha256")] for s in subject if isinstance(s, dict)]
                self._subjects[digest] = pairs
                new_records.append({"k": "s", "d": digest, "s": pairs})
            if rel not in self._entries:
                result.added.append(rel)
            self._entries[rel] = rec
            new_records.append(rec)
            if progress is not None and (i % 200 == 0 or i == len(todo) - 1):
                progress(i + 1, len(todo))
        result.parsed = len(todo)
        result.cached = len(listing) - len(todo)
        # Rewrite when the cache is missing or mostly dead lines; otherwise append.
        live = len(self._entries) + len(self._subjects) + 1
        rewrite = not had_cache_file or bool(result.removed) or self._lines + len(new_records) > 2 * live + 100
        if rewrite and (listing or had_cache_file):
            records = [{"k": "s", "d": d, "s": s} for d, s in self._subjects.items()]
            records += [self._entries[k] for k in sorted(self._entries)]
            result.persisted = self._write(records, rewrite=True)
        elif new_records:
            result.persisted = self._write(new_records, rewrite=False)
        return result

    # -- queries ----------------------------------------------------------------

    def entries(self, method: str | None = None) -> list[dict]:
        """Summaries, oldest first (file names start with the UTC time)."""
        items = self._entries.values() if method is None else (e for e in self._entries.values()
                                                                if e["file"].split("/", 1)[0] == method)
        return sorted(items, key=lambda e: e["file"].rsplit("/", 1)[-1])

    def subjects(self, digest: str | None) -> list | None:
        return self._subjects.get(digest) if digest else None

    def __len__(self) -> int:
        return len(self._entries)

    def full_path(self, rel: str) -> Path:
        return self.receipts_dir / rel


class Freshness:
    """Is a receipt's subject list still the working tree? Digests cached by (size, mtime)."""

    def __init__(self, root: Path, specs_dir: Path | None = None):
        self.root = Path(root)
        self.specs_dir = Path(specs_dir) if specs_dir is not None else None
        self._files: dict[str, tuple[int, int, str | None]] = {}
        self._verdicts: dict[str, tuple[str, ...]] = {}

    def _target(self, name: str) -> Path | None:
        p = Path(name)
        if not name or p.is_absolute() or ".." in p.parts:
            return None
        if self.specs_dir is not None and p.parts[:1] == ("specs",) and len(p.parts) > 1:
            return self.specs_dir / Path(*p.parts[1:])
        return self.root / name

    def file_sha(self, name: str) -> str | None:
        target = self._target(name)
        if target is None:
            return None
        try:
            st = target.stat()
        except OSError:
            return None
        cached = self._files.get(name)
        if cached and cached[0] == st.st_size and cached[1] == st.st_mtime_ns:
            return cached[2]
        h = hashlib.sha256()
        try:
            with open(target, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError:
            return None
        self._files[name] = (st.st_size, st.st_mtime_ns, h.hexdigest())
        return h.hexdigest()

    def changed(self, digest: str, pairs: Iterable) -> tuple[str, ...]:
        """Subject names whose file differs from (or is missing in) the tree; memoised per subject list."""
        if digest in self._verdicts:
            return self._verdicts[digest]
        out = []
        for name, sha in pairs:
            now = self.file_sha(name) if isinstance(name, str) else None
            if now is None:
                out.append(f"{name} (missing)")
            elif now != sha:
                out.append(name)
        self._verdicts[digest] = tuple(out)
        return self._verdicts[digest]

    def forget(self) -> None:
        """Drop memoised verdicts (after `r`): files may have changed since."""
        self._verdicts.clear()


def freshness_of(entry: dict, index: ReceiptIndex, fresh: Freshness) -> tuple[str, tuple[str, ...]]:
    """(fresh | stale | tampered | invalid, changed files) for one indexed receipt."""
    if entry.get("state") != OK:
        return entry.get("state") or INVALID, ()
    pairs = index.subjects(entry.get("subjects"))
    if pairs is None:
        return INVALID, ()
    changed = fresh.changed(entry["subjects"], pairs)
    return (STALE if changed else FRESH), changed
