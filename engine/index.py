"""A cache of receipt summaries, so browsing never re-reads every receipt.

`receipts/.index.jsonl` holds one line per receipt file, keyed by the file's
path inside the store plus its size and mtime. `refresh()` lists the store and
parses only files that are new or changed since they were indexed (in worker
processes when there are many); everything else comes from the cache. The
index is a cache, never evidence: deleting it costs one full re-read and
changes nothing else.

A line is `{light summary}` TAB `{heavy part}`. The light summary (state,
time, device, status, ...) is decoded on start; the heavy part (per-contract
digest, mutant verdicts, and the slice of the predicate engine.gate reads) is
kept as bytes and decoded only for the receipts a view actually needs.

What is cached is what a file's bytes decide, with the same rules and order as
`contracts verify` (engine/verify.py): unreadable or not a receipt -> invalid;
id, subject digest or bytes do not match -> tampered; receipt schema broken or
filed under another method -> invalid. Freshness depends on the working tree,
so `Freshness` computes it when asked, once per distinct subject list, with
file digests cached by size and mtime.

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
from engine.spec import KEY_RE

INDEX_NAME = ".index.jsonl"
INDEX_VERSION = 2
OK, TAMPERED, INVALID = "ok", "tampered", "invalid"
FRESH, STALE = "fresh", "stale"
POOL_THRESHOLD = 200  # more new files than this: parse them in worker processes
_STAMP_RE = re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})(\d{6})Z_")
_SEP = b"\t"  # json.dumps never writes a raw tab, so it cannot occur inside either part


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()


def integrity(data: dict, raw: bytes) -> tuple[str, str]:
    """(state, message) from the file's bytes alone: the tests of `check_receipt`, minus freshness."""
    pred = data["predicate"]
    try:
        expected = receipt_id(pred)
    except (TypeError, ValueError) as err:
        return INVALID, f"predicate cannot be canonicalised: {err}"
    if expected != pred.get("receipt_id"):
        return TAMPERED, "receipt id does not match its predicate (edited after it was written)"
    subject = data.get("subject")
    if not isinstance(subject, list) or _digest(subject) != pred.get("subject_sha256"):
        return TAMPERED, "subject list does not match the digest in the predicate"
    if serialize(data) != raw:
        return TAMPERED, "file bytes differ from the form it was written in"
    return OK, ""


def contract_digest(results: list) -> dict[str, list]:
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
    digest = {}
    for cid, c in out.items():
        s = c["statuses"]
        status = "error" if "error" in s else "failed" if "failed" in s else "passed" if s == {"passed"} else "error"
        seeds = sorted(k for k, ok in c["seeds"].items() if ok and isinstance(k, int))
        worst = c["worst"][1] if c["worst"] else [None] * 5
        digest[cid] = [status, seeds, c["passed"], c["n"], worst, c["kind"]]
    return digest


def gate_slice(pred: dict) -> dict:
    """The part of a predicate engine.gate reads (results without measurements, no step records)."""
    return {
        "method": pred.get("method"),
        "status": pred.get("status"),
        "errors": pred.get("errors"),
        "spec": {"name": (pred.get("spec") or {}).get("name")},
        "environment": {"device": {"kind": ((pred.get("environment") or {}).get("device") or {}).get("kind")}},
        "results": [[r.get("contract"), r.get("seed"), r.get("dtype"), r.get("status"),
                     None if r.get("status") == "passed" else r.get("message")]
                    for r in pred.get("results") or []],
        "mutants": [[m.get("id"), m.get("killed")] for m in pred.get("mutants") or []],
        "contracts_proven": pred.get("contracts_proven"),
        "mechanism": [{"contract": m.get("contract"), "seed": m.get("seed"), "dtype": m.get("dtype"),
                       "comparisons": m.get("comparisons") or []} for m in pred.get("mechanism") or []],
    }


def gate_predicate(g: dict) -> dict:
    """A `gate_slice` back in the predicate's own shape, for engine.gate.evaluate."""
    out = dict(g)
    out["results"] = [{"contract": c, "seed": s, "dtype": d, "status": st, "message": msg}
                      for c, s, d, st, msg in g["results"]]
    out["mutants"] = [{"id": i, "killed": k} for i, k in g["mutants"]]
    return out


def _stamp_time(name: str) -> str | None:
    m = _STAMP_RE.match(name)
    if not m:
        return None
    y, mo, d, h, mi, s, us = m.groups()
    return f"{y}-{mo}-{d}T{h}:{mi}:{s}.{us}Z"


def _light(rel: str, state: str, message: str) -> dict:
    folder, _, name = rel.rpartition("/")
    return {"state": state, "message": message, "method": folder or None, "receipt_id": None,
            "created_at": _stamp_time(name), "status": None, "device": None, "device_name": None, "seeds": [],
            "commit": None, "dirty": None, "subjects": None, "cset": None, "spec_name": None, "spec_state": None}


def index_file(path: str, rel: str, folder_method: str | None) -> tuple[dict, dict | None, list | None, list | None]:
    """(light summary, heavy part, subject pairs, contract ids) for one file; broken files say why, never raise."""
    if folder_method is None:
        where = "not inside a method folder" if "/" not in rel else f"in {rel.split('/')[0]}/, which is not a method key"
        return _light(rel, INVALID, f"{where} (receipts live in <receipts>/<method>/)"), None, None, None
    if not rel.endswith(RECEIPT_SUFFIX):
        return _light(rel, INVALID, f"not a receipt file name (expected *{RECEIPT_SUFFIX})"), None, None, None
    try:
        data, raw = load_receipt(Path(path), with_bytes=True)
    except ValueError as err:
        return _light(rel, INVALID, str(err)), None, None, None
    try:
        state, message = integrity(data, raw)
        if state == OK:
            from engine.receipts import schema_problems

            problems = schema_problems(data)
            if problems:
                state, message = INVALID, "does not match the receipt schema: " + "; ".join(problems)
        pred = data["predicate"]
        if state == OK and pred.get("method") != folder_method:
            state, message = INVALID, f"filed under {folder_method}/ but is a receipt of {pred.get('method')}"
        light = _light(rel, state, message)
        env = pred.get("environment") if isinstance(pred.get("environment"), dict) else {}
        dev = env.get("device") if isinstance(env.get("device"), dict) else {}
        git = pred.get("git") if isinstance(pred.get("git"), dict) else {}
        req = pred.get("request") if isinstance(pred.get("request"), dict) else {}
        spec = pred.get("spec") if isinstance(pred.get("spec"), dict) else {}
        results = [r for r in pred.get("results") or [] if isinstance(r, dict)]
        cids = sorted({r.get("contract") for r in results if isinstance(r.get("contract"), str)})
        subject = data.get("subject") if isinstance(data.get("subject"), list) else []
        pairs = [[s.get("name"), (s.get("digest") or {}).get("sha256")] for s in subject if isinstance(s, dict)]
        light.update({
            "receipt_id": pred.get("receipt_id") if isinstance(pred.get("receipt_id"), str) else None,
            "created_at": pred.get("created_at") if isinstance(pred.get("created_at"), str) else light["created_at"],
            "status": pred.get("status") if isinstance(pred.get("status"), str) else None,
            "device": dev.get("kind"), "device_name": dev.get("name"),
            "seeds": [s for s in req.get("seeds") or [] if isinstance(s, int)],
            "commit": git.get("commit"), "dirty": git.get("dirty"),
            "subjects": _digest(pairs) if pairs else None, "cset": _digest(cids),
            "spec_name": spec.get("name"), "spec_state": spec.get("promotion_state"),
        })
        heavy = {"c": contract_digest(results),
                 "m": {m["id"]: bool(m.get("killed")) for m in pred.get("mutants") or []
                       if isinstance(m, dict) and isinstance(m.get("id"), str)},
                 "g": gate_slice(pred) if state == OK else None}
        return light, heavy, pairs, cids
    except Exception as err:  # an odd shape that still passed the checks above: listed as broken, never fatal
        return _light(rel, INVALID, f"unexpected receipt shape: {type(err).__name__}: {err}"), None, None, None


def _index_batch(batch: list[tuple[str, str, str | None]]) -> list:
    """Worker-process entry point: index many files, return plain data."""
    return [index_file(path, rel, fm) for path, rel, fm in batch]


@dataclass
class RefreshResult:
    """What one `refresh` did: how many files it parsed, and what changed."""

    parsed: int = 0
    cached: int = 0
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    persisted: bool = True


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


class ReceiptIndex:
    """Receipt summaries for one store, refreshed incrementally from `.index.jsonl`."""

    def __init__(self, receipts_dir: Path, persist: bool = True):
        self.receipts_dir = Path(receipts_dir)
        self.path = self.receipts_dir / INDEX_NAME
        self.persist = persist
        self._entries: dict[str, dict] = {}  # rel path -> light summary (+ file, size, mtime_ns)
        self._heavy: dict[str, bytes | dict | None] = {}  # rel path -> heavy part, bytes until first asked
        self._subjects: dict[str, list] = {}  # digest -> [[name, sha256], ...]
        self._csets: dict[str, list] = {}  # digest -> contract ids present in the receipt
        self._loaded = False
        self._lines = 0

    # -- the cache file --------------------------------------------------------

    def _read_cache(self) -> None:
        self._loaded = True
        try:
            with open(self.path, "rb") as f:
                lines = f.read().split(b"\n")
        except OSError:
            return
        if not lines or not lines[0]:
            return
        try:
            head = json.loads(lines[0])
        except ValueError:
            return
        if not isinstance(head, dict) or head.get("k") != "h" or head.get("v") != INDEX_VERSION:
            return  # another format: rebuilt from the receipts on this refresh
        loads = json.loads
        for line in lines[1:]:
            light, _, heavy = line.partition(_SEP)
            try:
                rec = loads(light)
            except ValueError:
                continue  # a line cut short by a crash: that file is simply parsed again
            kind = rec.get("k") if isinstance(rec, dict) else None
            if kind == "r" and heavy and isinstance(rec.get("file"), str):
                self._entries[rec["file"]] = rec
                self._heavy[rec["file"]] = heavy if heavy != b"null" else None
            elif kind == "s" and isinstance(rec.get("d"), str):
                self._subjects[rec["d"]] = rec.get("s") or []
            elif kind == "c" and isinstance(rec.get("d"), str):
                self._csets[rec["d"]] = rec.get("c") or []
        self._lines = len(lines) - 1

    def _write(self, text: str, rewrite: bool) -> bool:
        if not self.persist:
            return False
        try:
            if rewrite:
                head = _dumps({"k": "h", "v": INDEX_VERSION, "about": "cache of receipt summaries; safe to delete"})
                tmp = self.receipts_dir / f"{TMP_PREFIX}index-{secrets.token_hex(6)}"
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(head + "\n" + text)
                os.replace(tmp, self.path)
            elif text:
                # One write of whole lines in append mode: a concurrent reader sees whole lines or
                # a cut last line, which it skips.
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(text)
            return True
        except (OSError, ValueError):
            return False  # a read-only store still browses; it just re-parses next time

    def _record(self, rel: str) -> str:
        heavy = self._heavy.get(rel)
        heavy_text = heavy.decode("utf-8") if isinstance(heavy, bytes) else _dumps(heavy)
        return _dumps({"k": "r", **self._entries[rel]}) + "\t" + heavy_text + "\n"

    # -- refresh ---------------------------------------------------------------------

    def _listing(self) -> dict[str, tuple[str, int, int, str | None]]:
        """rel -> (path, size, mtime_ns, folder method): every candidate `contracts verify` would assess."""
        found: dict[str, tuple[str, int, int, str | None]] = {}
        try:
            top = list(os.scandir(self.receipts_dir))
        except OSError:
            return found
        for e in top:
            name = e.name
            if name.startswith("."):
                continue
            try:
                if e.is_dir():
                    if name.startswith("__"):
                        continue
                    folder_method = name if KEY_RE.match(name) else None
                    for f in os.scandir(e.path):
                        if f.name.startswith(".") or not f.is_file():
                            continue
                        st = f.stat()
                        found[f"{name}/{f.name}"] = (f.path, st.st_size, st.st_mtime_ns, folder_method)
                elif name.endswith(RECEIPT_SUFFIX) and e.is_file():
                    st = e.stat()
                    found[name] = (e.path, st.st_size, st.st_mtime_ns, None)
            except OSError:
                continue
        return found

    def _parse(self, todo: list, listing: dict, progress) -> list:
        jobs = [(listing[rel][0], rel, listing[rel][3]) for rel in todo]
        if len(jobs) <= POOL_THRESHOLD:
            out = []
            for i, job in enumerate(jobs):
                out.append(index_file(*job))
                if progress is not None and (i % 100 == 0 or i == len(jobs) - 1):
                    progress(i + 1, len(jobs))
            return out
        # Many new files (a first start on a big store): parse in other processes so the UI
        # thread keeps the GIL to itself. spawn, not fork: the caller may be running threads.
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        from concurrent.futures.process import BrokenProcessPool

        workers = max(1, min(8, os.cpu_count() or 1))
        size = 50
        batches = [jobs[i:i + size] for i in range(0, len(jobs), size)]
        out: list = []
        try:
            with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                for res in pool.map(_index_batch, batches):
                    out.extend(res)
                    if progress is not None:
                        progress(len(out), len(jobs))
        except (BrokenProcessPool, OSError):  # no worker processes here: do the rest in this one
            for job in jobs[len(out):]:
                out.append(index_file(*job))
        return out

    def refresh(self, progress: Callable[[int, int], None] | None = None) -> RefreshResult:
        """List the store; parse only files not indexed yet (or changed); persist the new summaries."""
        if not self._loaded:
            self._read_cache()
        had_cache_file = self._lines > 0
        listing = self._listing()
        result = RefreshResult()
        entries = self._entries
        todo = sorted(rel for rel, (_, size, mtime, _fm) in listing.items()
                      if (e := entries.get(rel)) is None or e["size"] != size or e["mtime_ns"] != mtime)
        result.removed = sorted(set(entries) - set(listing))
        for rel in result.removed:
            del entries[rel]
            self._heavy.pop(rel, None)
        lines: list[str] = []
        for rel, (light, heavy, pairs, cids) in zip(todo, self._parse(todo, listing, progress)):
            _, size, mtime, _fm = listing[rel]
            if light["subjects"] and light["subjects"] not in self._subjects:
                self._subjects[light["subjects"]] = pairs
                lines.append(_dumps({"k": "s", "d": light["subjects"], "s": pairs}) + "\n")
            if light["cset"] and light["cset"] not in self._csets:
                self._csets[light["cset"]] = cids
                lines.append(_dumps({"k": "c", "d": light["cset"], "c": cids}) + "\n")
            if rel not in entries:
                result.added.append(rel)
            entries[rel] = {"file": rel, "size": size, "mtime_ns": mtime, **light}
            self._heavy[rel] = heavy
            lines.append(self._record(rel))
        result.parsed = len(todo)
        result.cached = len(listing) - len(todo)
        # Rewrite when the cache is missing, has entries of deleted files, or is mostly dead lines.
        live = len(entries) + len(self._subjects) + len(self._csets)
        rewrite = not had_cache_file or bool(result.removed) or self._lines + len(lines) > 2 * live + 100
        if rewrite and (listing or had_cache_file):
            text = "".join(_dumps({"k": "s", "d": d, "s": s}) + "\n" for d, s in self._subjects.items())
            text += "".join(_dumps({"k": "c", "d": d, "c": c}) + "\n" for d, c in self._csets.items())
            text += "".join(self._record(rel) for rel in sorted(entries))
            result.persisted = self._write(text, rewrite=True)
            self._lines = text.count("\n")
        elif lines:
            result.persisted = self._write("".join(lines), rewrite=False)
            self._lines += len(lines)
        return result

    # -- queries ----------------------------------------------------------------------

    def entries(self, method: str | None = None) -> list[dict]:
        """Light summaries, oldest first (file names start with the UTC time)."""
        items = self._entries.values() if method is None else (e for e in self._entries.values()
                                                                if e["file"].split("/", 1)[0] == method)
        return sorted(items, key=lambda e: e["file"].rsplit("/", 1)[-1])

    def heavy(self, rel: str) -> dict | None:
        """The heavy part of one entry, decoded on first use: {"c": contracts, "m": mutants, "g": gate slice}."""
        h = self._heavy.get(rel)
        if isinstance(h, bytes):
            try:
                h = json.loads(h)
            except ValueError:
                h = None
            self._heavy[rel] = h
        return h

    def contracts_of(self, entry: dict) -> list:
        """Contract ids the receipt holds results for (without decoding its heavy part)."""
        return self._csets.get(entry.get("cset") or "", [])

    def subjects(self, digest: str | None) -> list | None:
        return self._subjects.get(digest) if digest else None

    def __len__(self) -> int:
        return len(self._entries)


class Freshness:
    """Is a receipt's subject list still the working tree? The rules of `check_receipt`, memoised.

    File digests are cached by (size, mtime); a verdict is memoised per
    (subject list, recorded promotion state), since a spec that differs only
    in promotion.state (a promote or demote since the run) is the same spec.
    """

    def __init__(self, root: Path, specs_dir: Path | None = None):
        self.root = Path(root)
        self.specs_dir = Path(specs_dir) if specs_dir is not None else None
        self._files: dict[str, tuple[int, int, str]] = {}
        self._verdicts: dict[tuple, tuple[str, ...]] = {}

    def _target(self, name: str) -> Path:
        p = Path(name)
        if self.specs_dir is not None and p.parts[:1] == ("specs",) and len(p.parts) > 1:
            return self.specs_dir / Path(*p.parts[1:])
        return self.root / name

    def file_sha(self, name: str) -> str | None:
        target = self._target(name)
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

    def _same_but_state(self, name: str, sha: str, state: str | None) -> bool:
        if not name.startswith("specs/") or not isinstance(state, str):
            return False
        from engine.promote import digest_with_state

        try:
            return digest_with_state(self._target(name).read_bytes(), state) == sha
        except OSError:
            return False

    def changed(self, digest: str, pairs: Iterable, spec_state: str | None = None) -> tuple[str, ...]:
        """Subject names whose file differs from (or is missing in) the tree."""
        key = (digest, spec_state)
        if key in self._verdicts:
            return self._verdicts[key]
        out = []
        for name, sha in pairs:
            p = Path(name) if isinstance(name, str) else None
            if not name or p is None or p.is_absolute() or ".." in p.parts:
                out.append(f"{name} (not a repository path)")
                continue
            now = self.file_sha(name)
            if now is None:
                out.append(f"{name} (missing)")
            elif now != sha and not self._same_but_state(name, sha, spec_state):
                out.append(name)
        self._verdicts[key] = tuple(out)
        return self._verdicts[key]

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
    changed = fresh.changed(entry["subjects"], pairs, entry.get("spec_state"))
    return (STALE if changed else FRESH), changed
