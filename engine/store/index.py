"""A cache of receipt summaries, so browsing never re-reads every receipt.

`receipts/.index.jsonl` holds one line per receipt file, keyed by the file's
path inside the store plus its identity (device, inode, size, mtime, ctime: what
the reading verbs' sealed index keys on too, engine/store/sealed_index.py, for
the same reasons; a file changed within RACY_NS of being read is recorded
without one and read again next time). `refresh()` lists the store and
parses only files that are new or changed since they were indexed (in worker
processes when there are many); everything else comes from the cache. The
index is a cache, never evidence: deleting it costs one full re-read and
changes nothing else.

Every line is sealed: an HMAC-SHA256 under the user's key (engine/store/sealed.py, never in the store) over the
line, the store's real path and a fingerprint of the code that decided it. Whoever can write the store, and so
these files, but cannot read that key cannot make a line say anything: a line whose seal does not verify is not
read, and its receipt is parsed again. Without the user's key (CONTRACTS_NO_CACHE=1, a key others can read)
nothing is read or written here; the browser then indexes in memory.

Each receipt has a light summary in `.index.jsonl` (state, time, device,
status, ...), read on start, and a heavy part in `.index-detail.jsonl`
(per-contract digest, mutant verdicts), read when a view first needs one and
decoded per receipt. Whoever writes the store can write the index too, so it
serves display only: no verdict (the gate, the TUI's Gate tab) reads it.

What is cached is what a file's bytes decide, with the same rules and order as
`contracts verify` (engine/store/verify.py): unreadable or not a receipt -> invalid;
id, subject digest or bytes do not match -> tampered; receipt schema broken or
filed under another method -> invalid. Freshness depends on the working tree,
so `Freshness` computes it when asked, once per distinct subject list, with
file digests cached by size and mtime.

This module never imports torch.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from engine.store import bounded
from engine.store.receipts import RECEIPT_SUFFIX, TMP_PREFIX, canonical, load_receipt, receipt_id, serialize_parsed
from engine.spec.loader import KEY_RE
from engine.run.expect import headroom, worst_expectation
from engine.store.coverage import facts as coverage_facts
from engine.store.records import unit_of

INDEX_NAME = ".index.jsonl"
DETAIL_NAME = ".index-detail.jsonl"
INDEX_VERSION = 10  # 5: worst expectation by headroom; 6: gate slice with git; 7: no gate slice (verdicts read
# files); 8: coverage facts (engine/store/coverage.py); 9: implementation unit and label, mutation score; 10: sealed
# lines, file identity
OK, TAMPERED, INVALID = "ok", "tampered", "invalid"
FRESH, STALE = "fresh", "stale"
POOL_THRESHOLD = 200  # more new files than this: parse them in worker processes
_STAMP_RE = re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})(\d{6})Z_")
_SEP = b"\t"  # json.dumps never writes a raw tab, so it cannot occur inside either part


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _digest(value: Any) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()


def integrity(data: dict, raw: bytes) -> tuple[str, str]:
    """(state, message) from the file's bytes alone: the tests of `check_receipt`, minus freshness."""
    pred = data["predicate"]
    try:
        expected = receipt_id(pred, parsed=True)
    except (TypeError, ValueError) as err:
        return INVALID, f"predicate cannot be canonicalised: {err}"
    if expected != pred.get("receipt_id"):
        return TAMPERED, "receipt id does not match its predicate (edited after it was written)"
    subject = data.get("subject")
    if not isinstance(subject, list) or _digest(subject) != pred.get("subject_sha256"):
        return TAMPERED, "subject list does not match the digest in the predicate"
    if serialize_parsed(data) != raw:
        return TAMPERED, "file bytes differ from the form it was written in"
    return OK, ""


def contract_digest(results: list) -> dict[str, list]:
    """Per contract: [status, seeds passed, n passed, n results, worst expectation, kind].

    status is the worst over seeds and dtypes (error > failed > partial > passed; not_applicable when nothing
    could be measured on the implementation); a seed
    counts as passed only when every dtype passed for it; the worst expectation
    is [metric, value, op, threshold, headroom, passed, margin], the one nearest to
    failing by headroom (engine.run.expect.worst_expectation: equality sanity
    checks such as `updates 3 = 3` only when nothing scaled is there).
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
        records = [e for e in r.get("expectations") or [] if isinstance(e, dict) and "not_applicable" not in e]
        c["worst"] = worst_expectation(records + ([c["worst"]] if c["worst"] else []))
    digest = {}
    for cid, c in out.items():
        s = c["statuses"]
        status = ("error" if "error" in s else "failed" if "failed" in s else "passed" if s == {"passed"}
                  else "not_applicable" if s == {"not_applicable"}
                  else "partial" if s <= {"passed", "partial", "not_applicable"} else "error")
        seeds = sorted(k for k, ok in c["seeds"].items() if ok and isinstance(k, int))
        e = c["worst"]
        if e:
            h = e["headroom"] if "headroom" in e else headroom(e.get("op"), e.get("value"), e.get("threshold"))
            worst = [e.get("metric"), e.get("value"), e.get("op"), e.get("threshold"),
                     h if _finite(h) else "Infinity" if h in ("Infinity", math.inf) else None,
                     e.get("passed") is True, e.get("margin") if _finite(e.get("margin")) else None]
        else:
            worst = [None] * 7
        digest[cid] = [status, seeds, c["passed"], c["n"], worst, c["kind"]]
    return digest


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
            "commit": None, "dirty": None, "subjects": None, "cset": None, "spec_name": None, "spec_state": None,
            "coverage": None, "unit": "default", "impl_label": "default", "mutation": None}


def index_file(path: str, rel: str, folder_method: str | None) -> tuple[dict, list | None, list | None, list | None]:
    """(light summary, heavy part, subject pairs, contract ids) for one file; broken files say why, never raise.

    The heavy part is [{"c": contract digest, "m": mutant verdicts}, None] (the second slot held the gate's
    slice of the predicate before index v5; kept so a detail line keeps its shape).
    """
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
            from engine.store.receipts import schema_problems

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
            "coverage": coverage_facts(pred),  # full or partial: coverage.coverage(entry["coverage"], spec)
            # [impl] which implementation it measured: a candidate's receipts are a row of their own
            "unit": unit_of(pred), "impl_label": _impl_label(pred),
            "mutation": _mutation(pred),
        })
        heavy = [{"c": contract_digest(results),
                  "m": {m["id"]: bool(m.get("killed")) for m in pred.get("mutants") or []
                        if isinstance(m, dict) and isinstance(m.get("id"), str)}},
                 None]
        return light, heavy, pairs, cids
    except Exception as err:  # an odd shape that still passed the checks above: listed as broken, never fatal
        return _light(rel, INVALID, f"unexpected receipt shape: {type(err).__name__}: {err}"), None, None, None


def _impl_label(pred: dict) -> str:
    impl = pred.get("implementation") if isinstance(pred.get("implementation"), dict) else {}
    unit = unit_of(pred)
    if unit == "default":
        return unit
    target = impl.get("target")
    return f"--impl {target if isinstance(target, str) else '?'} ({unit[5:17]})"


def _mutation(pred: dict) -> dict | None:
    m = pred.get("mutation")
    if not isinstance(m, dict):
        return None
    score = m.get("score")
    return {"score": float(score) if _finite(score) else None, "complete": m.get("complete") is True}


def spawn_pool(workers: int):
    """A spawn-context process pool that also starts from inside a Textual app.

    multiprocessing's resource tracker is started with sys.stderr's file
    descriptor; Textual replaces sys.stderr with a capture object that has
    none, so the tracker is started against the real stderr first.
    """
    import multiprocessing
    import sys
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import resource_tracker

    saved = sys.stderr
    try:
        if sys.__stderr__ is not None:
            sys.stderr = sys.__stderr__
        resource_tracker.ensure_running()
    finally:
        sys.stderr = saved
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


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


_INDEX_CODE = ("store/index.py", "run/expect.py")


@functools.lru_cache(maxsize=None)
def _fingerprint() -> str:
    """What decides a line: the receipt verdict's code (engine.store.sealed.receipt_fingerprint) and this module's
    summaries (the contract digest's worst expectation comes from engine/run/expect.py). Once per process."""
    from engine.store.sealed import _ENGINE, receipt_fingerprint

    h = hashlib.sha256(f"browse v{INDEX_VERSION}\0{receipt_fingerprint()}".encode())
    for rel in _INDEX_CODE:
        try:
            h.update(rel.encode() + b"\0" + hashlib.sha256((_ENGINE / rel).read_bytes()).digest())
        except OSError:
            h.update(rel.encode() + b"\0-")
    return h.hexdigest()


class ReceiptIndex:
    """Receipt summaries for one store, refreshed incrementally from `.index.jsonl`.

    Light summaries live in `.index.jsonl` (read on every start); heavy parts in
    `.index-detail.jsonl`, read the first time a view asks for one (the
    Contracts tab's newest receipts), so a start reads only the light lines.
    Display only: no verdict reads the index (engine.store.browse.gate_for reads the files).
    """

    def __init__(self, receipts_dir: Path, persist: bool = True, sealed=None):
        from engine.store.sealed import Sealed

        self.receipts_dir = Path(receipts_dir)
        self.path = self.receipts_dir / INDEX_NAME
        self.detail_path = self.receipts_dir / DETAIL_NAME
        sealed = sealed if sealed is not None else Sealed.for_user()
        self._key = sealed._mac_key() if sealed.enabled else None
        self.persist = persist and self._key is not None  # nothing to seal with: this process's index only
        self._seal_prefix = b"browse\0" + hashlib.sha256(os.fsencode(os.path.realpath(self.receipts_dir))).digest() \
            + b"\0" + (_fingerprint().encode() if self._key is not None else b"") + b"\0"
        self._entries: dict[str, dict] = {}  # rel path -> light summary (+ file, size, mtime_ns)
        self._heavy: dict[str, bytes | dict | None] = {}  # rel path -> heavy part, bytes until first asked
        self._subjects: dict[str, list] = {}  # digest -> [[name, sha256], ...]
        self._csets: dict[str, list] = {}  # digest -> contract ids present in the receipt
        self._loaded = False
        self._detail_loaded = False
        self._lines = 0
        self._dead = 0

    # -- the cache files ---------------------------------------------------------

    def _seal(self, payload: bytes) -> bytes:
        return hmac.digest(self._key, self._seal_prefix + payload, "sha256").hex().encode("ascii")

    def _sealed_line(self, payload: bytes) -> bytes:
        """A line as written: its seal, a tab, the payload (which holds no raw newline)."""
        return self._seal(payload) + _SEP + payload + b"\n"

    def _opened(self, line: bytes) -> bytes | None:
        """The payload of a line whose seal verifies; None for any other (cut, edited, foreign, unsealed)."""
        mac, _, payload = line.partition(_SEP)
        if self._key is None or len(mac) != 64 or not hmac.compare_digest(mac, self._seal(payload)):
            return None
        return payload

    def _read_lines(self, path: Path) -> list[bytes] | None:
        """The payloads of the sealed lines after a header of this version, or None (missing, foreign or
        unreadable); a line whose seal does not verify is left out."""
        if self._key is None:
            return None
        try:  # a symbolic link, or a file over the cap, is not this cache: rebuilt from the receipts
            lines = bounded.read_regular(path, bounded.MAX_INDEX_BYTES).split(b"\n")
        except (OSError, ValueError):
            return None
        try:
            head = bounded.loads(lines[0])
        except ValueError:
            return None
        if not isinstance(head, dict) or head.get("k") != "h" or head.get("v") != INDEX_VERSION:
            return None  # another format: rebuilt from the receipts on this refresh
        opened = [self._opened(line) for line in lines[1:] if line]
        self._dead = sum(p is None for p in opened)
        return [p for p in opened if p is not None]

    def _read_cache(self) -> None:
        self._loaded = True
        lines = self._read_lines(self.path)
        if not lines:
            return
        loads = bounded.loads  # a line nested too deep is a ValueError like a cut one: that file is parsed again
        for line in lines:
            try:
                rec = loads(line)
            except ValueError:
                continue  # a line cut short by a crash: that file is simply parsed again
            kind = rec.get("k") if isinstance(rec, dict) else None
            if kind == "r" and isinstance(rec.get("file"), str):
                self._entries[rec["file"]] = rec
            elif kind == "s" and isinstance(rec.get("d"), str):
                self._subjects[rec["d"]] = rec.get("s") or []
            elif kind == "c" and isinstance(rec.get("d"), str):
                self._csets[rec["d"]] = rec.get("c") or []
        self._lines = len(lines) + self._dead

    def _load_detail(self) -> None:
        """Heavy parts from `.index-detail.jsonl`, kept as bytes; only those matching a current entry."""
        self._detail_loaded = True
        for line in self._read_lines(self.detail_path) or []:
            key, _, heavy = line.partition(_SEP)
            try:
                rel, ident = bounded.loads(key)
            except (ValueError, TypeError):
                continue
            e = self._entries.get(rel)
            if e is not None and ident is not None and e.get("ident") == ident and heavy and rel not in self._heavy:
                self._heavy[rel] = heavy

    def _header(self) -> str:
        return _dumps({"k": "h", "v": INDEX_VERSION, "about": "cache of receipt summaries; safe to delete"}) + "\n"

    def _write(self, path: Path, lines: list[bytes], rewrite: bool) -> bool:
        if not self.persist:
            return False
        data = b"".join(lines)
        header = self._header().encode("utf-8")
        try:
            if rewrite:
                tmp = self.receipts_dir / f"{TMP_PREFIX}index-{secrets.token_hex(6)}"
                with open(tmp, "wb") as f:
                    f.write(header + data)
                os.replace(tmp, path)
            elif data:
                # One write of whole lines in append mode: a concurrent reader sees whole lines or
                # a cut last line, which it skips.
                new = not path.exists()
                with open(path, "ab") as f:
                    f.write((header if new else b"") + data)
            return True
        except (OSError, ValueError):
            return False  # a read-only store still browses; it just re-parses next time

    def _line(self, record: dict) -> bytes:
        return self._sealed_line(_dumps(record).encode("utf-8")) if self._key is not None else b""

    def _light_line(self, rel: str) -> bytes:
        return self._line({"k": "r", **self._entries[rel]})

    def _detail_line(self, rel: str) -> bytes:
        e = self._entries[rel]
        heavy = self._heavy.get(rel)
        if isinstance(heavy, bytes):
            payload = heavy
        else:
            cm, g = heavy if isinstance(heavy, list) else (None, None)
            payload = _SEP.join(p if isinstance(p, bytes) else _dumps(p).encode("utf-8") for p in (cm, g))
        if self._key is None:
            return b""
        return self._sealed_line(_dumps([rel, e.get("ident")]).encode("utf-8") + _SEP + payload)

    def _write_details(self, rels: list[str], rewrite: bool) -> bool:
        """Write detail lines, recording each line's byte offset in its light entry (`dofs`)."""
        if not self.persist:
            return False
        chunks = []
        try:
            if rewrite:
                pos = len(self._header().encode("utf-8"))
            else:
                try:
                    pos = os.path.getsize(self.detail_path)
                except OSError:
                    pos = 0
                if pos == 0:
                    chunks.append(self._header().encode("utf-8"))
                    pos = len(chunks[0])
            for rel in rels:
                line = self._detail_line(rel)
                self._entries[rel]["dofs"] = pos
                chunks.append(line)
                pos += len(line)
            data = b"".join(chunks)
            if rewrite:
                tmp = self.receipts_dir / f"{TMP_PREFIX}index-{secrets.token_hex(6)}"
                with open(tmp, "wb") as f:
                    f.write(self._header().encode("utf-8") + data)
                os.replace(tmp, self.detail_path)
            elif data:
                with open(self.detail_path, "ab") as f:
                    f.write(data)
            return True
        except OSError:
            for rel in rels:
                self._entries[rel].pop("dofs", None)
            return False

    def _read_detail_at(self, rel: str) -> bytes | None:
        """One heavy part by its recorded offset; None when the line there is not this entry's."""
        e = self._entries.get(rel)
        pos = e.get("dofs") if e else None
        if not isinstance(pos, int):
            return None
        try:
            with open(self.detail_path, "rb", opener=_no_follow) as f:  # never through a link
                f.seek(pos)
                line = f.readline(bounded.MAX_RECEIPT_BYTES).rstrip(b"\n")
        except OSError:
            return None
        line = self._opened(line)
        if line is None or e.get("ident") is None:
            return None
        key, _, heavy = line.partition(_SEP)
        try:
            if bounded.loads(key) != [rel, e["ident"]]:
                return None
        except (ValueError, TypeError):
            return None
        return heavy or None

    # -- refresh ------------------------------------------------------------------------

    def _listing(self) -> dict[str, tuple[str, list, str | None]]:
        """rel -> (path, identity, folder method): every candidate `contracts verify` would assess."""
        from engine.store.sealed_index import identity

        found: dict[str, tuple[str, list, str | None]] = {}
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
                        # a symbolic link is listed (and refused as invalid when read), never skipped unseen
                        if f.name.startswith(".") or not (f.is_file() or f.is_symlink()):
                            continue
                        st = f.stat(follow_symlinks=False)
                        found[f"{name}/{f.name}"] = (f.path, identity(st), folder_method)
                elif name.endswith(RECEIPT_SUFFIX) and e.is_file():
                    st = e.stat()
                    found[name] = (e.path, identity(st), None)
            except OSError:
                continue
        return found

    def _parse(self, todo: list, listing: dict, progress) -> list:
        jobs = [(listing[rel][0], rel, listing[rel][2]) for rel in todo]
        if len(jobs) <= POOL_THRESHOLD:
            out = []
            for i, job in enumerate(jobs):
                out.append(index_file(*job))
                if progress is not None and (i % 100 == 0 or i == len(jobs) - 1):
                    progress(i + 1, len(jobs))
            return out
        # Many new files (a first start on a big store): parse in other processes so the UI
        # thread keeps the GIL to itself. spawn, not fork: the caller may be running threads.
        workers = max(1, min(8, os.cpu_count() or 1))
        size = 50
        batches = [jobs[i:i + size] for i in range(0, len(jobs), size)]
        out: list = []
        try:
            with spawn_pool(workers) as pool:
                for res in pool.map(_index_batch, batches):
                    out.extend(res)
                    if progress is not None:
                        progress(len(out), len(jobs))
        except Exception:  # no worker processes here (no /dev/shm, a sandbox): do the rest in this one
            for job in jobs[len(out):]:
                out.append(index_file(*job))
        return out

    def refresh(self, progress: Callable[[int, int], None] | None = None) -> RefreshResult:
        """List the store; parse only files not indexed yet (or changed); persist the new summaries."""
        if not self._loaded:
            self._read_cache()
        had_cache_file = self._lines > 0
        from engine.store.sealed_index import RACY_NS

        t0 = time.time_ns()  # before the listing's identities: a file changed after it is racy
        listing = self._listing()
        result = RefreshResult()
        entries = self._entries
        todo = sorted(rel for rel, (_, ident, _fm) in listing.items()
                      if (e := entries.get(rel)) is None or e.get("ident") is None or e["ident"] != ident)
        result.removed = sorted(set(entries) - set(listing))
        for rel in result.removed:
            del entries[rel]
            self._heavy.pop(rel, None)
        light_lines: list[bytes] = []
        new_rels: list[str] = []
        for rel, (light, heavy, pairs, cids) in zip(todo, self._parse(todo, listing, progress)):
            _, ident, _fm = listing[rel]
            if light["subjects"] and light["subjects"] not in self._subjects:
                self._subjects[light["subjects"]] = pairs
                light_lines.append(self._line({"k": "s", "d": light["subjects"], "s": pairs}))
            if light["cset"] and light["cset"] not in self._csets:
                self._csets[light["cset"]] = cids
                light_lines.append(self._line({"k": "c", "d": light["cset"], "c": cids}))
            if rel not in entries:
                result.added.append(rel)
            # racy (changed within RACY_NS of the listing): no identity, so it is parsed again next time
            entries[rel] = {"file": rel, "ident": ident if ident[4] <= t0 - RACY_NS else None, **light}
            self._heavy[rel] = heavy
            new_rels.append(rel)
        result.parsed = len(todo)
        result.cached = len(listing) - len(todo)
        # Rewrite when the cache is missing, has entries of deleted files, or is mostly dead lines.
        live = len(entries) + len(self._subjects) + len(self._csets)
        rewrite = not had_cache_file or bool(result.removed) or \
            self._lines + len(light_lines) + len(new_rels) > 2 * live + 100
        if rewrite and (listing or had_cache_file):
            if not self._detail_loaded:
                self._load_detail()
            # Details first, so the light lines carry their offsets; a light line whose detail is
            # missing or moved is re-read from the receipt on demand, never wrong.
            result.persisted = self._write_details([rel for rel in sorted(entries) if rel in self._heavy], True)
            light = [self._line({"k": "s", "d": d, "s": s}) for d, s in self._subjects.items()]
            light += [self._line({"k": "c", "d": d, "c": c}) for d, c in self._csets.items()]
            light += [self._light_line(rel) for rel in sorted(entries)]
            result.persisted = self._write(self.path, light, rewrite=True) and result.persisted
            self._lines = len(light)
        elif new_rels:
            result.persisted = self._write_details(new_rels, rewrite=False)
            light_lines += [self._light_line(rel) for rel in new_rels]
            result.persisted = self._write(self.path, light_lines, rewrite=False) and result.persisted
            self._lines += len(light_lines)
        return result

    # -- queries ------------------------------------------------------------------------------

    def entries(self, method: str | None = None) -> list[dict]:
        """Light summaries, oldest first (file names start with the UTC time)."""
        items = self._entries.values() if method is None else (e for e in self._entries.values()
                                                                if e["file"].split("/", 1)[0] == method)
        return sorted(items, key=lambda e: e["file"].rsplit("/", 1)[-1])

    def _parts(self, rel: str) -> list | None:
        """[contracts+mutants, None] of one entry, each still bytes until decoded."""
        if rel not in self._heavy and rel in self._entries:
            found = self._read_detail_at(rel)  # one seek, for the few a first screen needs
            if found is None and not self._detail_loaded:
                self._load_detail()
                found = self._heavy.get(rel)
            if found is not None:
                self._heavy[rel] = found
            else:
                # Not in the detail file (cut short, or deleted): read the receipt itself once more.
                folder = rel.rsplit("/", 1)[0] if "/" in rel else None
                _, heavy, _, _ = index_file(str(self.receipts_dir / rel), rel,
                                            folder if folder and KEY_RE.match(folder) else None)
                self._heavy[rel] = heavy if heavy is not None else [None, None]
                if self._write_details([rel], rewrite=False):
                    self._write(self.path, [self._light_line(rel)], rewrite=False)
                    self._lines += 1
        h = self._heavy.get(rel)
        if isinstance(h, bytes):
            cm, _, g = h.partition(_SEP)
            h = self._heavy[rel] = [cm, g or b"null"]
        return h

    def _decoded(self, rel: str, i: int):
        parts = self._parts(rel)
        if parts is None:
            return None
        if isinstance(parts[i], bytes):
            try:
                parts[i] = bounded.loads(parts[i])
            except ValueError:
                parts[i] = None
        return parts[i]

    def heavy(self, rel: str) -> dict | None:
        """Contract digest and mutant verdicts of one entry: {"c": ..., "m": ...}, decoded on first use."""
        return self._decoded(rel, 0)

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

    def _target(self, name: str) -> Path | None:
        """The file, or None when it resolves outside the checkout (never read; see subject_target)."""
        from engine.store.receipts import subject_target

        return subject_target(name, self.root, self.specs_dir)

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

    def _same_but_state(self, name: str, sha: str, state: str | None) -> bool:
        if not name.startswith("specs/") or not isinstance(state, str):
            return False
        from engine.gate.promote import digest_with_state

        target = self._target(name)
        if target is None:
            return False
        try:
            return digest_with_state(target.read_bytes(), state) == sha
        except OSError:
            return False

    def changed(self, digest: str, pairs: Iterable, spec_state: str | None = None) -> tuple[str, ...]:
        """Subject names whose file differs from (or is missing in) the tree."""
        key = (digest, spec_state)
        if key in self._verdicts:
            return self._verdicts[key]
        from engine.store.receipts import is_external_subject

        out = []
        for name, sha in pairs:
            if is_external_subject(name):
                continue  # a checkpoint's or an --impl target's file: not in the tree (as check_receipt rules)
            p = Path(name) if isinstance(name, str) else None
            if not name or p is None or p.is_absolute() or ".." in p.parts:
                out.append(f"{name} (not a repository path)")
                continue
            now = self.file_sha(name)
            if now is None:
                out.append(f"{name} (resolves outside the checkout)" if self._target(name) is None
                           else f"{name} (missing)")
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
