"""The promotion ledger: an append-only history of promote/demote decisions and reviews.

The spec's `promotion.state` is the pointer; the ledger is the history (MLflow
aliases move without one). One JSON object per line in
`<receipts>/ledger.jsonl`. Each entry carries its own sha256 (`entry_sha256`,
over its canonical form without that field) and the sha256 of the previous
line (`prev`), so an edited, removed or reordered line shows in `verify`.
Lines are appended under an exclusive lock with O_APPEND and fsynced; the file
is never rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import EnvironmentProblem
from engine.store import bounded
from engine.store.receipts import canonical, utc_now

LEDGER_NAME = "ledger.jsonl"
ENTRY_SCHEMA = "paper-contracts/ledger/v1"
GENESIS = "0" * 64
ACTIONS = ("promote", "demote", "review")  # review: engine.gate.review (the state is unchanged by it)
_REQUIRED = {"schema": str, "seq": int, "prev": str, "entry_sha256": str, "method": str, "action": str,
             "old_state": str, "new_state": str, "at": str, "reason": str, "receipts": list}


def ledger_path(receipts_dir: Path) -> Path:
    return Path(receipts_dir) / LEDGER_NAME


def entry_digest(entry: dict) -> str:
    return hashlib.sha256(canonical({k: v for k, v in entry.items() if k != "entry_sha256"})).hexdigest()


def _line_digest(line: bytes) -> str:
    return hashlib.sha256(line.rstrip(b"\n")).hexdigest()


def append(receipts_dir: Path, **fields: Any) -> dict:
    """Append one entry (method, action, old_state, new_state, reason, receipts, ...); returns it as written."""
    import fcntl

    path = ledger_path(receipts_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: a ledger that is a symbolic link would have us append outside the store
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as err:
        raise EnvironmentProblem(f"cannot open the ledger {path.name} for appending: {err.strerror or err}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # seq and prev must see every earlier line
        lines = [ln for ln in path.read_bytes().split(b"\n") if ln.strip()]
        entry = {"schema": ENTRY_SCHEMA, "seq": len(lines) + 1,
                 "prev": _line_digest(lines[-1]) if lines else GENESIS, "at": utc_now(), **fields}
        entry["entry_sha256"] = entry_digest(entry)
        os.write(fd, canonical(entry) + b"\n")
        os.fsync(fd)
        return entry
    except OSError as err:
        raise EnvironmentProblem(f"cannot append to the ledger {path.name}: {err.strerror or err}") from None
    finally:
        os.close(fd)  # also releases the lock


@dataclass
class LedgerReport:
    """What `verify` says of the ledger: its entries and every problem found, one line each."""

    file: str
    entries: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"file": self.file, "entries": len(self.entries), "ok": not self.problems, "problems": self.problems}


def read(receipts_dir: Path) -> LedgerReport:
    """Parse the ledger and check each line's digest and the chain; missing file = empty ledger."""
    path = ledger_path(receipts_dir)
    report = LedgerReport(file=LEDGER_NAME)
    if not path.exists() and not path.is_symlink():  # a dangling link is reported below, not taken as empty
        return report
    try:
        raw = bounded.read_regular(path, bounded.MAX_LEDGER_BYTES)
    except OSError as err:
        report.problems.append(f"{LEDGER_NAME}: cannot read: {err.strerror}")
        return report
    except ValueError as err:  # a symbolic link, not a regular file, over the size limit
        report.problems.append(f"{LEDGER_NAME}: {err}")
        return report
    if raw and not raw.endswith(b"\n"):
        report.problems.append(f"{LEDGER_NAME}: last line is incomplete (an interrupted append?)")
    prev = GENESIS
    for n, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        where = f"{LEDGER_NAME}:{n}"
        try:
            entry = bounded.loads(line.decode("utf-8"))
        except bounded.TooDeep as err:
            report.problems.append(f"{where}: {err}")
            prev = _line_digest(line)
            continue
        except (UnicodeDecodeError, json.JSONDecodeError):
            report.problems.append(f"{where}: not a JSON line")
            prev = _line_digest(line)
            continue
        bad = _shape_problem(entry)
        if bad:
            report.problems.append(f"{where}: {bad}")
        else:
            if entry["entry_sha256"] != entry_digest(entry):
                report.problems.append(f"{where}: tampered (entry_sha256 does not match the entry)")
            elif canonical(entry) != line:
                report.problems.append(f"{where}: tampered (bytes differ from the form it was written in)")
            if entry["prev"] != prev:
                report.problems.append(f"{where}: chain broken (prev does not match line before: "
                                       "a line was removed, reordered or edited)")
            if entry["seq"] != len(report.entries) + 1:
                report.problems.append(f"{where}: seq {entry['seq']}, expected {len(report.entries) + 1}")
            report.entries.append(entry)
        prev = _line_digest(line)
    return report


def _shape_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return "not a JSON object"
    for key, typ in _REQUIRED.items():
        if key not in entry:
            return f"missing {key!r}"
        if not isinstance(entry[key], typ) or (typ is int and isinstance(entry[key], bool)):
            return f"{key!r} is not a {typ.__name__}"
    if entry["schema"] != ENTRY_SCHEMA:
        return f"schema {entry['schema']!r}, expected {ENTRY_SCHEMA!r}"
    if entry["action"] not in ACTIONS:
        return f"action {entry['action']!r} is not one of {', '.join(ACTIONS)}"
    if not all(isinstance(r, str) for r in entry["receipts"]):
        return "'receipts' must list receipt ids"
    if entry["action"] == "review" and (not isinstance(entry.get("review"), dict)
                                        or not isinstance(entry.get("signature"), (dict, type(None)))):
        return "a review entry needs a 'review' object and a 'signature' (an object or null)"
    return None


def check_against(report: LedgerReport, known_receipts: set[str], spec_states: dict[str, str]) -> None:
    """Add problems: entries naming receipts the store does not hold; spec states the ledger does not explain.

    `known_receipts` are the ids of receipts whose integrity holds (fresh or
    stale); `spec_states` maps method -> current promotion.state.
    """
    last: dict[str, str] = {}
    for entry in report.entries:
        missing = [r for r in entry["receipts"] if r not in known_receipts]
        if missing:
            report.problems.append(
                f"{LEDGER_NAME}: entry {entry['seq']} ({entry['action']} {entry['method']}) names receipt(s) "
                f"not in the store: {', '.join(m[:12] for m in missing)}")
        if entry["action"] == "review":  # approves a spec; moves no state
            continue
        before = last.get(entry["method"], "not-promoted")
        if entry["old_state"] != before:  # two changes raced, or a line was forged: the history does not add up
            report.problems.append(
                f"{LEDGER_NAME}: entry {entry['seq']} ({entry['action']} {entry['method']}) starts from "
                f"{entry['old_state']}, but the history before it left {before}")
        last[entry["method"]] = entry["new_state"]
    for method, state in sorted(spec_states.items()):
        expected = last.get(method, "not-promoted")
        if state != expected:
            origin = f"the last ledger entry says {expected}" if method in last else "no ledger entry promoted it"
            report.problems.append(
                f"{LEDGER_NAME}: specs/{method}.yaml says promotion.state {state}, but {origin} "
                f"(change state only with contracts promote/demote)")
