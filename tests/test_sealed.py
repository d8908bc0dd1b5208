"""The sealed cache (engine/store/sealed.py): a hit reads exactly as a fresh assessment, and no forged, copied,
foreign or edited entry changes a verdict of `verify`, `gate` or `list`."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.cli as cli
import engine.store.receipts
import engine.store.verify
from engine.store import sealed as S
from engine.store import sealed_index as SI
from engine.store.verify import assess
from tests import gate_support as G

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = sorted((ROOT / "receipts").glob("*/*.json"))


@pytest.fixture
def toy(tmp_path, monkeypatch):
    return G.toy_project(tmp_path, monkeypatch)


def _sealed() -> S.Sealed:
    return S.Sealed.for_user()


def _run(*argv: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli.app, list(argv))
    return res.exit_code, res.stdout


def _entry(sealed: S.Sealed, kind: str, key: str, fp: str) -> Path:
    return sealed._path(kind, key, fp)


# --- a hit is a fresh assessment ------------------------------------------------------------------------------------


# (that a receipt's summary reads as the whole receipt, for every committed receipt: tests/test_store_index.py)


def test_a_hit_reads_as_a_fresh_assessment_and_checks_nothing_again(toy, monkeypatch):
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    fresh = assess(path, root, specs, display=path.name, folder_method="toy")
    first = assess(path, root, specs, display=path.name, folder_method="toy", sealed=_sealed())  # seals it
    assert any(_sealed().dir.rglob("*.json"))
    for name in ("integrity_problem", "schema_problems"):
        monkeypatch.setattr(engine.store.receipts, name, lambda *a, **k: pytest.fail("checked again on a hit"))
    monkeypatch.setattr(engine.store.verify, "schema_problems", lambda *a, **k: pytest.fail("checked again"))
    hit = assess(path, root, specs, display=path.name, folder_method="toy", sealed=_sealed())
    assert fresh.as_dict() == first.as_dict() == hit.as_dict() and hit.state == "fresh"
    assert hit.receipt == fresh.receipt


def test_freshness_is_decided_on_every_call(toy):
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml")
    assert assess(path, root, specs, display=path.name, folder_method="toy", sealed=_sealed()).state == "fresh"
    (root / "src" / "toy.py").write_text("def double(x):\n    return x + x\n")
    a = assess(path, root, specs, display=path.name, folder_method="toy", sealed=_sealed())
    assert a.state == "stale" and a.changed == ["src/toy.py"]


# --- forgeries decide nothing --------------------------------------------------------------------------------------


def _tamper(path: Path) -> bytes:
    raw = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(raw.replace(b'"wall_s": ', b'"wall_s":  ', 1))  # one more space: tampered
    return path.read_bytes()


def _verdicts(specs: Path, receipts: Path) -> list:
    args = ["--specs", str(specs), "--receipts", str(receipts)]
    return [_run("verify", *args), _run("verify", "--json", *args), _run("gate", "toy", *args),
            _run("list", "--json", *args)]


def _forge(sealed: S.Sealed, kind: str, key: str, fp: str, value, mac: bytes) -> None:
    """Write an entry as anyone who can write the folder could: any value, sealed with `mac`."""
    body = json.dumps(value, separators=(",", ":")).encode()
    seal = hmac.new(mac, f"v{S.VERSION}\0{kind}\0{key}\0{fp}\0".encode() + body, hashlib.sha256).hexdigest()
    p = _entry(sealed, kind, key, fp)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(seal.encode() + b"\n" + body)


@pytest.mark.parametrize("forgery", ["right key, unsealed value", "right key, another user's seal",
                                     "a genuine index of another folder, renamed", "a genuine index, value edited"])
def test_a_forged_receipt_entry_changes_no_verdict(forgery, toy, tmp_path):
    """The sealed index (engine/store/sealed_index.py) claims the tampered file is the intact receipt it was: by
    its identity and its bytes' sha256, with the intact receipt's summary. No such claim is taken."""
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    sealed = _sealed()
    good = path.read_bytes()
    assert assess(path, root, specs, display=path.name, folder_method="toy", sealed=sealed).state == "fresh"
    index = SI.FolderIndex(sealed, path.parent)
    genuine = _entry(sealed, SI.KIND, index.key, index.fp)
    assert genuine.is_file() and path.name in index.files
    bad = _tamper(path)
    os.environ[S.ENV_OFF] = "1"
    try:
        expected = _verdicts(specs, receipts)  # from the files alone
    finally:
        del os.environ[S.ENV_OFF]
    assert expected[0][0] == 1 and "file bytes differ" in expected[0][1]
    assert expected[2][0] == 1 and "tampered receipt" in expected[2][1]
    doc = json.loads(genuine.read_bytes().partition(b"\n")[2])
    doc["files"][path.name][0] = SI.identity(os.lstat(path))  # "this file, as it is now, is the intact receipt"
    doc["files"][path.name][1] = hashlib.sha256(bad).hexdigest()
    claim = json.dumps(doc, separators=(",", ":")).encode()
    if forgery == "right key, unsealed value":
        genuine.write_bytes(b"0" * 64 + b"\n" + claim)
    elif forgery == "right key, another user's seal":
        _forge(sealed, SI.KIND, index.key, index.fp, doc, os.urandom(32))
    elif forgery == "a genuine index of another folder, renamed":
        other = tmp_path / "other-store" / "toy"
        other.mkdir(parents=True)
        copy = other / path.name
        copy.write_bytes(bad)  # the tampered bytes, indexed nowhere (never judged intact), and the intact ones:
        copy.with_name("intact.json").write_bytes(genuine.read_bytes())  # (any file name will do)
        theirs = SI.FolderIndex(sealed, other)
        theirs.files[path.name] = doc["files"][path.name]  # as if the user had once indexed it there, intact
        theirs.parts = doc["parts"]
        theirs._dirty = True
        theirs.save()
        genuine.write_bytes(_entry(sealed, SI.KIND, theirs.key, theirs.fp).read_bytes())
    else:
        path.write_bytes(good)  # the intact receipt again: its own entry, edited, now lies about it
        text = genuine.read_bytes()
        genuine.write_bytes(text.replace(b'"passed"', b'"failed"'))
        assert genuine.read_bytes() != text
        os.environ[S.ENV_OFF] = "1"
        try:
            expected = _verdicts(specs, receipts)
        finally:
            del os.environ[S.ENV_OFF]
        assert expected[2][0] == 1 and "tampered" not in expected[2][1]
    assert _verdicts(specs, receipts) == expected


def test_a_forged_spec_entry_changes_no_verdict(toy):
    """A spec entry that claims the spec requires less (no contracts to pass) is not taken."""
    root, specs, receipts = toy
    G.write(root, receipts, specs / "toy.yaml", fail=(("double-value", 1, "float64"),))
    args = ["--specs", str(specs), "--receipts", str(receipts)]
    before = _run("gate", "toy", *args)
    assert before[0] == 1
    sealed = _sealed()
    spec_file = specs / "toy.yaml"
    assert S.validate_spec(spec_file, root, sealed)[0] is not None  # sealed now
    raw = spec_file.read_bytes()
    key = hashlib.sha256(f"{hashlib.sha256(raw).hexdigest()}\0{spec_file.name}".encode()).hexdigest()
    fp = hashlib.sha256(f"{S.engine_fingerprint()}\0{S.names_fingerprint(sealed)}".encode()).hexdigest()
    entry = _entry(sealed, "spec", key, fp)
    assert entry.is_file()
    data = json.loads(entry.read_bytes().partition(b"\n")[2])["data"]
    data["contracts"] = data["contracts"][1:]  # drop the failing contract
    _forge(sealed, "spec", key, fp, {"data": data}, os.urandom(32))
    assert _run("gate", "toy", *args) == before


def test_a_key_others_can_read_seals_nothing(toy):
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml")
    sealed = _sealed()
    assert sealed.enabled
    key_file = sealed.dir / S.KEY_NAME
    key_file.chmod(0o644)
    loose = _sealed()
    assert not loose.enabled
    assess(path, root, specs, display=path.name, folder_method="toy", sealed=loose)
    assert not list(sealed.dir.glob(f"receipt-v{S.VERSION}/*/*.json"))


def test_no_cache_reads_and_writes_nothing(toy):
    root, specs, receipts = toy
    G.write(root, receipts, specs / "toy.yaml")
    args = ["--specs", str(specs), "--receipts", str(receipts)]
    without = [_run("gate", "toy", "--no-cache", *args), _run("verify", "--no-cache", *args)]
    assert not (_sealed().dir / S.KEY_NAME).exists()
    assert [_run("gate", "toy", *args), _run("verify", *args)] == without
    assert (_sealed().dir / S.KEY_NAME).exists()
    assert [_run("gate", "toy", *args), _run("verify", *args)] == without  # warm


def test_signed_receipts_hit_and_a_trust_policy_reads_nothing_sealed(toy, tmp_path, monkeypatch):
    """A signed receipt's summary is sealed like any other (its key ids still come from the envelope on every
    call); under a trust policy nothing sealed is read or written: the runner's signing key is the root of trust
    there, and a key in the user's cache folder must not stand in for it."""
    root, specs, receipts = toy
    monkeypatch.delenv("CONTRACTS_TRUST", raising=False)
    base = tmp_path / "pipeline"
    base.mkdir()
    assert _run("keys", "generate", str(base / "runner"))[0] == 0
    signed = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=base / "runner")
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())  # unsigned
    policy = base / "trust.yaml"
    policy.write_text("keys:\n  - public_key: runner.pub\n    devices: [cpu]\n")
    fresh = assess(signed, root, specs, display=signed.name, folder_method="toy")
    assert fresh.signed_by and fresh.state == "fresh"
    assess(signed, root, specs, display=signed.name, folder_method="toy", sealed=_sealed())
    hit = assess(signed, root, specs, display=signed.name, folder_method="toy", sealed=_sealed())
    assert hit.as_dict() == fresh.as_dict() and hit.receipt == fresh.receipt
    args = ["--specs", str(specs), "--receipts", str(receipts), "--trust", str(policy)]
    expected = [_run("verify", "--no-cache", *args), _run("gate", "toy", "--no-cache", *args)]
    monkeypatch.setattr(S.Sealed, "get", lambda *a, **k: pytest.fail("read a sealed entry under a trust policy"))
    monkeypatch.setattr(S.Sealed, "put", lambda *a, **k: pytest.fail("sealed an entry under a trust policy"))
    assert [_run("verify", *args), _run("gate", "toy", *args)] == expected
    assert "unsigned" in expected[0][1] and "trusted key" in expected[0][1]


def test_an_answer_from_the_stores_cache_file_is_never_sealed(toy):
    """The store's display cache (which anyone who writes the store can edit) may call a tampered receipt intact;
    that answer must not be laundered into the sealed cache."""
    from engine.store import cache as C

    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml")
    bad = _tamper(path)
    poisoned = C.ValidationCache(receipts)
    poisoned.put("integrity", poisoned.receipt_fingerprint(), C._sha(bad), None)
    poisoned.flush()
    shown = assess(path, root, specs, display=path.name, folder_method="toy", cache=C.ValidationCache(receipts),
                   sealed=_sealed())
    assert shown.state == "fresh"  # a display fooled by the store's file
    assert not list(_sealed().dir.glob(f"{SI.KIND}-v{S.VERSION}/*/*.json"))
    a = assess(path, root, specs, display=path.name, folder_method="toy", sealed=_sealed())
    assert a.state == "tampered" and "file bytes differ" in a.message
