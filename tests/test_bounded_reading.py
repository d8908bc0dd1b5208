"""Bounded reading: files in the store are read within a size cap and a nesting limit, never through a link.

A 100,000-deep JSON array as a receipt used to end `verify` with RecursionError
(exit 3); now it is an invalid receipt (exit 1). The same holds for the ledger,
the validation cache and the receipt index, which are ignored and rebuilt when
they cannot be read within bounds. Symbolic links inside the store are refused,
and a subject that resolves outside the checkout is never read.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.cli as cli
from engine.store import bounded
from engine.store.index import INDEX_NAME, ReceiptIndex
from engine.store.ledger import LEDGER_NAME
from tests import gate_support as G

DEEP = "[" * 100_000 + "]" * 100_000


def _invoke(*args: str):
    return CliRunner().invoke(cli.app, list(args))


@pytest.fixture
def layout(tmp_path, monkeypatch):
    root, specs, receipts = G.toy_project(tmp_path, monkeypatch)
    return root, specs, receipts


def _by_file(res) -> dict:
    return {r["file"].split("/")[-1]: r for r in json.loads(res.stdout)["receipts"]}


# --- the reader itself ------------------------------------------------------------------------------------


def test_nesting_is_measured_outside_strings_without_recursion():
    assert bounded.nesting_depth(DEEP) == 100_000
    assert bounded.nesting_depth('{"a": "[[[[\\"[[[", "b": [[1]]}') == 3
    assert bounded.nesting_depth('["\\\\", [[]]]') == 3
    assert bounded.nesting_depth('{"k": "\\u005b"}') == 1
    with pytest.raises(bounded.TooDeep, match="100000 levels deep"):
        bounded.loads(DEEP)
    with pytest.raises(ValueError):
        bounded.loads('{"a":' * 65 + "1" + "}" * 65)
    assert bounded.loads("[" * 64 + "]" * 64) is not None
    assert bounded.loads('{"s": "' + "[" * 1000 + '"}') == {"s": "[" * 1000}  # brackets in a string are text


def test_read_regular_refuses_links_and_files_over_the_cap(tmp_path):
    f = tmp_path / "f.json"
    f.write_text("[1, 2]")
    assert bounded.read_regular(f, 100) == b"[1, 2]"
    with pytest.raises(bounded.TooLarge):
        bounded.read_regular(f, 3)
    link = tmp_path / "link.json"
    link.symlink_to(f)
    with pytest.raises(ValueError, match="symbolic link"):
        bounded.read_regular(link, 100)


# --- receipts --------------------------------------------------------------------------------------------


def test_a_100k_deep_receipt_makes_verify_exit_1_not_3(layout):
    root, specs, receipts = layout
    good = G.write(root, receipts, specs / "toy.yaml")
    (good.parent / "20990101T000000000000Z_toy_deep.json").write_text(DEEP)
    (good.parent / "20990101T000000000001Z_toy_deepobj.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    res = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs), "--json")
    assert res.exit_code == 1, res.output
    by = _by_file(res)
    for name in ("20990101T000000000000Z_toy_deep.json", "20990101T000000000001Z_toy_deepobj.json"):
        assert by[name]["state"] == "invalid" and "nested 100000 levels deep" in by[name]["message"]
    assert by[good.name]["state"] == "fresh"
    for args in (("verify",), ("gate", "toy"), ("list",), ("show", "toy")):
        res = _invoke(*args, "--receipts", str(receipts), "--specs", str(specs))
        assert res.exit_code in (0, 1), (args, res.output)
        assert "internal error" not in res.output and "Traceback" not in res.output


def test_a_receipt_over_the_size_cap_is_invalid(layout, monkeypatch):
    root, specs, receipts = layout
    good = G.write(root, receipts, specs / "toy.yaml")
    monkeypatch.setattr(bounded, "MAX_RECEIPT_BYTES", good.stat().st_size - 1)
    res = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs), "--json")
    assert res.exit_code == 1
    assert "over the" in _by_file(res)[good.name]["message"] and _by_file(res)[good.name]["state"] == "invalid"


def test_symlinked_receipts_and_method_folders_are_invalid(layout, tmp_path):
    root, specs, receipts = layout
    good = G.write(root, receipts, specs / "toy.yaml")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    real = outside / good.name.replace(".json", "-copy.json")
    real.write_bytes(good.read_bytes())
    (good.parent / "20990101T000000000000Z_toy_link.json").symlink_to(real)  # a file that is a link
    (good.parent / "20990101T000000000001Z_toy_dangling.json").symlink_to(outside / "gone.json")
    res = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs), "--json")
    by = _by_file(res)
    assert res.exit_code == 1
    assert by["20990101T000000000000Z_toy_link.json"]["state"] == "invalid"
    assert "symbolic link" in by["20990101T000000000000Z_toy_link.json"]["message"]
    assert by["20990101T000000000001Z_toy_dangling.json"]["state"] == "invalid"

    # a method folder that is a link: every receipt in it is refused
    (good.parent / "20990101T000000000000Z_toy_link.json").unlink()
    (good.parent / "20990101T000000000001Z_toy_dangling.json").unlink()
    moved = outside / "toy"
    good.parent.rename(moved)
    (receipts / "toy").symlink_to(moved, target_is_directory=True)
    res = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs), "--json")
    (only,) = json.loads(res.stdout)["receipts"]
    assert res.exit_code == 1 and only["state"] == "invalid" and "folder is a symbolic link" in only["message"]
    gate = _invoke("gate", "toy", "--receipts", str(receipts), "--specs", str(specs), "--json")
    assert json.loads(gate.stdout)["receipts"]["fresh"] == []


def test_a_subject_that_resolves_outside_the_checkout_is_never_read(layout, tmp_path, monkeypatch):
    root, specs, receipts = layout
    secret = tmp_path / "outside.py"
    secret.write_text("def double(x):\n    return 2 * x\n")
    (root / "src" / "link.py").symlink_to(secret)  # inside by name, outside by where it leads
    rec = G.write(root, receipts, specs / "toy.yaml", extra=("src/link.py",))
    from engine.store import receipts as R

    opened = []
    real_sha = R.sha256_file
    monkeypatch.setattr(R, "sha256_file", lambda p: opened.append(os.path.realpath(p)) or real_sha(p))
    res = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs), "--json", "--no-cache")
    r = _by_file(res)[rec.name]
    assert r["state"] == "stale" and r["changed"] == ["src/link.py (resolves outside the checkout)"]
    assert str(secret.resolve()) not in opened
    gate = json.loads(_invoke("gate", "toy", "--receipts", str(receipts), "--specs", str(specs), "--json").stdout)
    assert gate["receipts"]["fresh"] == []


# --- ledger, cache, index ------------------------------------------------------------------------------


def test_a_deep_ledger_line_is_a_problem_not_a_crash(layout):
    root, specs, receipts = layout
    G.write(root, receipts, specs / "toy.yaml")
    (receipts / LEDGER_NAME).write_text(DEEP + "\n")
    res = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs), "--json")
    assert res.exit_code == 1, res.output
    problems = json.loads(res.stdout)["ledger"]["problems"]
    assert any("ledger.jsonl:1: JSON nested 100000 levels deep" in p for p in problems), problems
    for args in (("gate", "toy"), ("list",), ("show", "toy")):
        res = _invoke(*args, "--receipts", str(receipts), "--specs", str(specs))
        assert "internal error" not in res.output, (args, res.output)


def test_a_symlinked_ledger_is_refused(layout, tmp_path):
    _, specs, receipts = layout
    receipts.mkdir(parents=True, exist_ok=True)
    target = tmp_path / "ledger-elsewhere.jsonl"
    target.write_text("")
    (receipts / LEDGER_NAME).symlink_to(target)
    res = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs), "--json")
    assert res.exit_code == 1 and any("symbolic link" in p for p in json.loads(res.stdout)["ledger"]["problems"])


def test_a_deep_or_oversized_cache_is_ignored_and_rebuilt(layout, monkeypatch):
    root, specs, receipts = layout
    G.write(root, receipts, specs / "toy.yaml")
    from engine.store.cache import CACHE_NAME

    cache = receipts / CACHE_NAME
    cache.write_text('{"v": ' + DEEP + "}")
    for args in (("gate", "toy"), ("list",), ("show", "toy"), ("verify",)):
        res = _invoke(*args, "--receipts", str(receipts), "--specs", str(specs))
        assert res.exit_code in (0, 1) and "internal error" not in res.output, (args, res.output)
    from engine.store.cache import ValidationCache

    browser = ValidationCache(receipts)  # the TUI's browser, the one reader of the store's cache, rebuilds it
    browser.validate_file(specs / "toy.yaml", root)
    browser.flush()
    assert json.loads(cache.read_bytes())["sections"]  # rewritten: a working cache again
    monkeypatch.setattr(bounded, "MAX_CACHE_BYTES", 10)
    res = _invoke("gate", "toy", "--receipts", str(receipts), "--specs", str(specs))
    assert res.exit_code == 1 and "internal error" not in res.output


def test_a_deep_index_is_ignored_and_rebuilt(layout):
    root, specs, receipts = layout
    G.write(root, receipts, specs / "toy.yaml")
    time.sleep(0.06)  # older than the tests' racy window (tests/conftest.py): indexed by its identity
    ReceiptIndex(receipts).refresh()
    lines = (receipts / INDEX_NAME).read_text().splitlines()
    (receipts / INDEX_NAME).write_text("\n".join([lines[0], DEEP, *lines[1:]]) + "\n")  # a deep line among good ones
    idx = ReceiptIndex(receipts)
    idx.refresh()
    assert len(idx) == 1
    (receipts / INDEX_NAME).write_text(DEEP + "\n")  # a deep header: the whole file is not this cache
    idx = ReceiptIndex(receipts)
    result = idx.refresh()
    assert len(idx) == 1 and result.parsed == 1
    detail = receipts / ".index-detail.jsonl"
    head, line = detail.read_text().splitlines()[:2]
    seal, key = line.split("\t")[:2]  # this receipt's key, so its heavy parts would be decoded: deep ones
    detail.write_text(f"{head}\n{seal}\t{key}\t{DEEP}\t{DEEP}\n")  # as whoever writes the store could
    idx = ReceiptIndex(receipts)
    idx.refresh()
    (entry,) = idx.entries()
    assert idx.heavy(entry["file"])["c"]  # that line's seal does not verify: the receipt was read again
    idx = ReceiptIndex(receipts)  # a deep line sealed by the user's key (a bug of ours): unreadable, not a crash
    detail.write_bytes(head.encode() + b"\n" + idx._sealed_line(f"{key}\t{DEEP}\t{DEEP}".encode()))
    idx.refresh()
    (entry,) = idx.entries()
    assert idx.heavy(entry["file"]) is None
    res = _invoke("tui", "--json", "--receipts", str(receipts), "--specs", str(specs))
    assert res.exit_code == 0 and "internal error" not in res.output, res.output


# --- gate --json caps its warnings ------------------------------------------------------------------------


def test_gate_json_caps_its_warnings_and_counts_them_all(layout):
    root, specs, receipts = layout
    good = G.write(root, receipts, specs / "toy.yaml")
    for i in range(45):
        (good.parent / f"20990101T0000000000{i:02d}Z_toy_junk.json").write_text("junk")
    res = _invoke("gate", "toy", "--receipts", str(receipts), "--specs", str(specs), "--json")
    out = json.loads(res.stdout)
    from engine.gate.verdict import MAX_WARNINGS

    assert len(out["warnings"]) == MAX_WARNINGS == 20 and out["warnings_total"] == 45
    from jsonschema import Draft202012Validator

    schema = json.loads((Path(cli.__file__).resolve().parent.parent / "schemas" / "gate.schema.json").read_text())
    assert list(Draft202012Validator(schema).iter_errors(out)) == []
    text = _invoke("gate", "toy", "--receipts", str(receipts), "--specs", str(specs))
    assert "warning: +25 more" in text.stdout and text.stdout.count("warning: invalid receipt") == 20
