"""Receipts: canonical ids, exclusive atomic writes, tamper and staleness detection."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.store import receipts as R


def _stmt(method: str = "demo", created: str | None = None, value: float = 1.5) -> dict:
    pred = {"schema": "paper-contracts/receipt/v1", "method": method, "created_at": created or R.utc_now(),
            "results": [{"contract": "c", "measurements": {"err": value, "nan": float("nan")}}], "status": "passed"}
    return R.statement([{"name": "engine/store/receipts.py", "digest": {"sha256": R.sha256_file(
        Path(R.__file__))}}], pred)


def test_receipt_id_is_canonical_and_covers_every_field():
    a = _stmt(created="2026-01-01T00:00:00.000000Z")
    b = _stmt(created="2026-01-01T00:00:00.000000Z")
    assert a["predicate"]["receipt_id"] == b["predicate"]["receipt_id"]
    c = _stmt(created="2026-01-01T00:00:00.000000Z", value=1.5000000000000002)
    assert c["predicate"]["receipt_id"] != a["predicate"]["receipt_id"]


def test_nan_is_kept_visible_not_dropped():
    data = json.loads(R.serialize(_stmt()))
    assert data["predicate"]["results"][0]["measurements"]["nan"] == "NaN"


def test_second_write_adds_a_file_and_leaves_the_first_byte_identical(tmp_path):
    first = R.write_receipt(tmp_path, _stmt())
    before = first.read_bytes()
    second = R.write_receipt(tmp_path, _stmt())
    assert first != second and second.exists()
    assert first.read_bytes() == before
    assert [p.name for p in R.receipt_files(tmp_path, "demo")] == sorted([first.name, second.name])


def test_same_name_never_overwrites(tmp_path):
    stmt = _stmt(created="2026-01-01T00:00:00.000000Z")
    one = R.write_receipt(tmp_path, stmt)
    two = R.write_receipt(tmp_path, stmt)
    assert one != two and one.read_bytes() == two.read_bytes()


def test_crash_before_link_leaves_no_receipt(tmp_path, monkeypatch):
    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "link", boom)
    with pytest.raises(R.EnvironmentProblem):
        R.write_receipt(tmp_path, _stmt())
    left = [p for p in (tmp_path / "demo").iterdir()]
    assert left == [], "a failed write must leave neither a receipt nor a temporary file"


def test_verify_fresh_then_tampered_then_stale(tmp_path):
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    src = root / "pkg" / "a.py"
    src.write_text("x = 1\n")
    stmt = R.statement([{"name": "pkg/a.py", "digest": {"sha256": R.sha256_file(src)}}],
                       {"method": "demo", "created_at": R.utc_now(), "status": "passed"})
    path = R.write_receipt(tmp_path / "store", stmt)
    assert R.check_receipt(path, root).state == "fresh"

    src.write_text("x = 2\n")
    rc = R.check_receipt(path, root)
    assert rc.state == "stale" and rc.changed == ("pkg/a.py",)
    src.write_text("x = 1\n")

    raw = path.read_bytes()
    tampered = tmp_path / "t.json"
    tampered.write_bytes(raw.replace(b'"passed"', b'"failed"'))
    assert R.check_receipt(tampered, root).state == "tampered"
    spaced = tmp_path / "s.json"
    spaced.write_bytes(raw.replace(b'\n "subject"', b'\n  "subject"'))
    assert R.check_receipt(spaced, root).state == "tampered"
    truncated = tmp_path / "u.json"
    truncated.write_bytes(raw[: len(raw) // 2])
    assert R.check_receipt(truncated, root).state == "invalid"
