"""Signed receipts (DSSE, ed25519), the trust policy, and verdicts that come from files only.

Each attack of the trust issue is re-run here against the code: a receipt written
without the key, one signed by another key or for another device, an altered
signature, an edited payload, a poisoned validation cache and a poisoned index.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from typer.testing import CliRunner

import engine.cli as cli
from engine.store import cache as C
from engine.store import receipts as R
from engine.store import signing as S
from tests import gate_support as G


_REVIEWER: dict[str, Path] = {}  # the reviewer key of the running test: every policy here lists it


@pytest.fixture
def layout(tmp_path, monkeypatch):
    """A checkout in tmp with the toy spec, approved in the ledger by a review signed with a reviewer key that
    every policy of these tests lists; keys and policies live beside it, outside the store."""
    monkeypatch.delenv("CONTRACTS_TRUST", raising=False)
    monkeypatch.delenv("CONTRACTS_SIGNING_KEY", raising=False)
    root, specs, receipts = G.toy_project(tmp_path, monkeypatch)
    reviewer, _ = _keys(tmp_path / "reviewer", "alice")
    monkeypatch.setitem(_REVIEWER, "key", reviewer)
    G.approve(root, specs, receipts, sign_key=reviewer)
    return root, specs, receipts


def _reapprove(root: Path, specs: Path, receipts: Path) -> None:
    """A test that edits the spec has the edit reviewed, signed like the first review."""
    G.approve(root, specs, receipts, sign_key=_REVIEWER["key"])


def _invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli.app, list(args), env=env)


def _keys(base: Path, name: str = "runner") -> tuple[Path, str]:
    """A key pair made by `contracts keys generate`; (private key path, key id it printed)."""
    base.mkdir(parents=True, exist_ok=True)
    res = _invoke("keys", "generate", str(base / name))
    assert res.exit_code == 0, res.output
    return base / name, res.stdout.strip()


def _policy(path: Path, entries: list[tuple[str, list[str]]], reviewers: list[str] | None = None) -> Path:
    """A policy trusting `entries` (public key, devices) and, by default, the running test's reviewer key."""
    lines = ["keys:"]
    for pub, devices in entries:
        lines += [f"  - public_key: {pub}", f"    devices: [{', '.join(devices)}]"]
    if reviewers is None:
        reviewers = [f"{_REVIEWER['key']}.pub"] if "key" in _REVIEWER else []
    if reviewers:
        lines += ["reviewers:"] + [f"  - public_key: {pub}" for pub in reviewers]
    path.write_text("\n".join(lines) + "\n")
    return path


def _gate_json(specs: Path, receipts: Path, *extra: str) -> tuple[int, dict]:
    res = _invoke("gate", "toy", "--json", "--specs", str(specs), "--receipts", str(receipts), *extra)
    assert res.exit_code in (0, 1), res.output
    doc = json.loads(res.stdout)
    doc.pop("evaluated_at")
    return res.exit_code, doc


def _req(doc: dict, rid: str) -> dict:
    return next(r for r in doc["requirements"] if r["id"] == rid)


# --- keys and envelopes ---------------------------------------------------------------


def test_keys_generate_writes_a_private_key_only_its_owner_reads_and_names_it(tmp_path):
    key, kid = _keys(tmp_path / "k")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    pub = serialization.load_pem_public_key((tmp_path / "k" / "runner.pub").read_bytes())
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert kid == hashlib.sha256(raw).hexdigest()  # the key id is the sha256 of the raw public key
    again = _invoke("keys", "generate", str(key))
    assert again.exit_code == 2 and "never overwritten" in again.output
    assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_an_envelope_verifies_independently_with_pae_computed_here(layout, tmp_path):
    root, specs, receipts = layout
    key, kid = _keys(tmp_path / "k")
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=key)
    env = json.loads(path.read_bytes())
    assert set(env) == {"payloadType", "payload", "signatures"}
    assert env["payloadType"] == "application/vnd.in-toto+json"
    payload = base64.b64decode(env["payload"])
    (sig,) = env["signatures"]
    assert sig["keyid"] == kid
    # DSSE v1 PAE, written out from the spec rather than taken from engine.store.signing
    ptype = env["payloadType"].encode()
    pae = b"DSSEv1 " + str(len(ptype)).encode() + b" " + ptype + b" " + str(len(payload)).encode() + b" " + payload
    pub = serialization.load_pem_public_key((tmp_path / "k" / "runner.pub").read_bytes())
    assert isinstance(pub, Ed25519PublicKey)
    pub.verify(base64.b64decode(sig["sig"]), pae)  # raises InvalidSignature if it does not verify
    # the payload is exactly the Statement an unsigned receipt of the same run holds
    stmt = json.loads(payload)
    assert payload == R.serialize(stmt) and stmt["_type"] == R.STATEMENT_TYPE
    assert R.integrity_problem(stmt, payload) is None


def test_signed_and_unsigned_receipts_read_alike_and_integrity_applies_inside(layout, tmp_path):
    root, specs, receipts = layout
    key, _ = _keys(tmp_path / "k")
    signed = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=key)
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    res = _invoke("verify", "--json", "--specs", str(specs), "--receipts", str(receipts))
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and [r["state"] for r in doc["receipts"]] == ["fresh", "fresh"]
    assert sorted(bool(r["signed_by"]) for r in doc["receipts"]) == [False, True]
    shown = json.loads(_invoke("show", "toy", "--json", "--specs", str(specs), "--receipts", str(receipts)).stdout)
    assert [r["state"] for r in shown["receipts"]] == ["fresh", "fresh"]
    listed = json.loads(_invoke("list", "--json", "--specs", str(specs), "--receipts", str(receipts)).stdout)
    assert listed["methods"][0]["latest_receipt"]["state"] == "fresh" and listed["methods"][0]["gate"]["promotable"]
    code, gated = _gate_json(specs, receipts)
    assert code == 0 and len(gated["receipts"]["fresh"]) == 2
    # an edited Statement inside the envelope is tampered, signed or not
    env = json.loads(signed.read_bytes())
    payload = base64.b64decode(env["payload"]).replace(b'"wall_s": ', b'"wall_s":  ', 1)
    env["payload"] = base64.b64encode(payload).decode()
    signed.chmod(0o644)
    signed.write_bytes(S.envelope_bytes(env))
    res = _invoke("verify", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 1 and "tampered" in res.stdout and "file bytes differ" in res.stdout


def test_a_malformed_envelope_is_invalid_not_a_crash(layout, tmp_path):
    root, specs, receipts = layout
    key, _ = _keys(tmp_path / "k")
    path = G.write(root, receipts, specs / "toy.yaml", sign_key=key)
    env = json.loads(path.read_bytes())
    path.chmod(0o644)
    for broken, why in (({**env, "payloadType": "text/plain"}, "payloadType"),
                        ({**env, "payload": "%%%"}, "base64"),
                        ({**env, "signatures": []}, "signatures"),
                        ({**env, "signatures": [{"keyid": "\x1b]52;c;aGk=\x07", "sig": "AA=="}]}, "printable"),
                        ({**env, "extra": 1}, "unexpected field")):
        path.write_bytes(json.dumps(broken).encode())
        res = _invoke("verify", "--specs", str(specs), "--receipts", str(receipts))
        assert res.exit_code == 1 and res.stdout.startswith("invalid") and why in res.stdout, res.output


# --- the trust policy -------------------------------------------------------------------


def test_under_a_policy_only_receipts_signed_by_a_key_trusted_for_their_device_count(layout, tmp_path):
    root, specs, receipts = layout
    key, kid = _keys(tmp_path / "pipeline")
    other, _ = _keys(tmp_path / "pipeline", "other")
    policy = _policy(tmp_path / "pipeline" / "trust.yaml", [("runner.pub", ["cpu"])])
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())  # unsigned
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=other)  # someone else's key
    code, doc = _gate_json(specs, receipts, "--trust", str(policy))
    assert code == 1 and not doc["promotable"]
    assert sorted(u["why"] for u in doc["receipts"]["untrusted"]) == ["unsigned", "untrusted key"]
    assert doc["receipts"]["fresh"] == []
    assert "no fresh trusted cpu receipt" in _req(doc, "device:cpu")["detail"]
    assert any("is not counted: unsigned" in w for w in doc["warnings"])
    # without a policy the same receipts count (unsigned receipts stay valid for local use)
    assert _gate_json(specs, receipts)[1]["promotable"]
    # a receipt signed by the trusted key counts for device:cpu
    good = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=key)
    code, doc = _gate_json(specs, receipts, "--trust", str(policy))
    rid = json.loads(base64.b64decode(json.loads(good.read_bytes())["payload"]))["predicate"]["receipt_id"]
    assert code == 0 and doc["promotable"] and _req(doc, "device:cpu")["receipts"] == [rid]
    assert doc["receipts"]["fresh"] == [rid] and doc["justified_by"] == [rid]
    assert len(doc["trust"].pop("reviewers")) == 1
    assert doc["trust"] == {"file": str(policy), "sha256": hashlib.sha256(policy.read_bytes()).hexdigest(),
                            "keys": [{"keyid": kid, "devices": ["cpu"]}]}
    assert doc["store"] == "receipts"
    # the same key trusted only for cuda does not attest a cpu receipt
    _policy(policy, [("runner.pub", ["cuda"])])
    code, doc = _gate_json(specs, receipts, "--trust", str(policy))
    assert code == 1 and "untrusted key" in {u["why"] for u in doc["receipts"]["untrusted"]}
    assert any("not cpu" in u["message"] for u in doc["receipts"]["untrusted"])


def test_an_altered_signature_is_never_counted_and_verify_reports_it(layout, tmp_path):
    root, specs, receipts = layout
    key, _ = _keys(tmp_path / "pipeline")
    policy = _policy(tmp_path / "pipeline" / "trust.yaml", [("runner.pub", ["cpu", "cuda"])])
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=key)
    assert _gate_json(specs, receipts, "--trust", str(policy))[0] == 0
    env = json.loads(path.read_bytes())
    sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
    sig[0] ^= 1
    env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    path.chmod(0o644)
    path.write_bytes(S.envelope_bytes(env))
    code, doc = _gate_json(specs, receipts, "--trust", str(policy))
    assert code == 1 and [u["why"] for u in doc["receipts"]["untrusted"]] == ["bad signature"]
    res = _invoke("verify", "--specs", str(specs), "--receipts", str(receipts), "--trust", str(policy))
    assert res.exit_code == 1 and "bad signature" in res.stdout


def test_a_forged_payload_under_a_genuine_signature_is_not_counted(layout, tmp_path):
    """The forged-receipt attack: a receipt built with the project's own functions (fresh ids, cuda device) put
    into a genuine envelope, or signed with the attacker's own key."""
    root, specs, receipts = layout
    key, _ = _keys(tmp_path / "pipeline")
    attacker, _ = _keys(tmp_path / "attacker")
    policy = _policy(tmp_path / "pipeline" / "trust.yaml", [("runner.pub", ["cpu"])])
    _set = (specs / "toy.yaml").read_text().replace("devices: [cpu]", "devices: [cuda]")
    (specs / "toy.yaml").write_text(_set)
    _reapprove(root, specs, receipts)  # the edit is reviewed: only the receipts are forged here
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=key, device="cpu")
    env = json.loads(path.read_bytes())
    forged = json.loads(base64.b64decode(env["payload"]))
    pred = forged["predicate"]
    pred["environment"]["device"] = {"kind": "cuda", "index": 0, "name": "Fake GPU", "cuda": None, "capability": None}
    pred["request"]["device"] = "cuda"
    body = {k: v for k, v in pred.items() if k not in ("receipt_id", "subject_sha256")}

    def forge() -> dict:  # fresh ids: each forgery is a receipt of its own
        return R.statement(forged["subject"], {**body, "created_at": R.utc_now()})

    env["payload"] = base64.b64encode(R.serialize(forge())).decode()
    path.chmod(0o644)
    path.write_bytes(S.envelope_bytes(env))
    R.write_receipt(receipts, forge(), sign_key=attacker)
    unsigned = R.write_receipt(receipts, forge())
    code, doc = _gate_json(specs, receipts, "--trust", str(policy))
    assert code == 1 and not doc["promotable"]
    assert sorted(u["why"] for u in doc["receipts"]["untrusted"]) == ["bad signature", "unsigned", "untrusted key"]
    assert doc["receipts"]["fresh"] == []
    promote = _invoke("promote", "toy", "--reason", "forged", "--specs", str(specs), "--receipts", str(receipts),
                      "--trust", str(policy))
    assert promote.exit_code == 1 and "state: \"not-promoted\"" in (specs / "toy.yaml").read_text()
    # without the policy a forgery passes: this is what the signature defends
    for p in receipts.glob("toy/*.json"):
        if p != unsigned:
            p.unlink()
    assert _gate_json(specs, receipts)[1]["promotable"]


def test_promote_refuses_an_unsigned_receipt_under_a_policy(layout, tmp_path, monkeypatch):
    root, specs, receipts = layout
    _keys(tmp_path / "pipeline")
    policy = _policy(tmp_path / "pipeline" / "trust.yaml", [("runner.pub", ["cpu"])])
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    before = (specs / "toy.yaml").read_bytes()
    lines = (receipts / "ledger.jsonl").read_text()  # the review
    monkeypatch.setenv("CONTRACTS_TRUST", str(policy))  # the environment variable names it too
    res = _invoke("promote", "toy", "--reason", "x", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 1 and "unsigned" in res.output and (specs / "toy.yaml").read_bytes() == before
    assert (receipts / "ledger.jsonl").read_text() == lines
    lst = json.loads(_invoke("list", "--json", "--specs", str(specs), "--receipts", str(receipts)).stdout)
    assert lst["methods"][0]["gate"]["promotable"] is False
    monkeypatch.delenv("CONTRACTS_TRUST")
    res = _invoke("promote", "toy", "--reason", "x", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 2 and "--allow-unsigned" in res.stderr  # unverified evidence: only when asked
    res = _invoke("promote", "toy", "--reason", "x", "--specs", str(specs), "--receipts", str(receipts),
                  "--allow-unsigned")
    assert res.exit_code == 0  # without a policy (and no requires.signed) a local store still promotes, if asked


def test_requires_signed_closes_the_gate_without_a_policy(layout, tmp_path):
    root, specs, receipts = layout
    text = (specs / "toy.yaml").read_text()
    (specs / "toy.yaml").write_text(text.replace("    formal_comparison: true\n",
                                                 "    formal_comparison: true\n    signed: true\n"))
    _reapprove(root, specs, receipts)
    assert _invoke("validate", str(specs / "toy.yaml")).exit_code == 0
    key, _ = _keys(tmp_path / "pipeline")
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=key)
    code, doc = _gate_json(specs, receipts)
    signed = _req(doc, "signed")
    assert code == 1 and signed["required"] and not signed["met"] and signed["fix"] is None  # needs a file of theirs
    assert "--trust POLICY.yaml" in signed["note"]
    assert any(r.startswith("signed: ") and "--trust" in r for r in doc["reasons"])
    policy = _policy(tmp_path / "pipeline" / "trust.yaml", [("runner.pub", ["cpu"])])
    code, doc = _gate_json(specs, receipts, "--trust", str(policy))
    assert code == 0 and _req(doc, "signed")["met"]


@pytest.mark.parametrize("text,expect", [
    ("keys: [\n", "not valid YAML"),
    ("{}\n", "$:"),
    ("keys: []\n", "$.keys"),
    ("keys:\n  - public_key: runner.pub\n    devices: [tpu]\n", "$.keys[0].devices"),
    ("keys:\n  - public_key: missing.pub\n    devices: [cpu]\n", "cannot read missing.pub"),
    ("keys:\n  - public_key: runner\n    devices: [cpu]\n", "not a PEM public key"),
    ("keys:\n  - public_key: runner.pub\n    devices: [cpu]\n    admin: true\n", "exactly public_key and devices"),
    ("!!python/object:os.system {}\n", "not valid YAML"),
])
def test_a_bad_policy_is_one_line_and_exit_2(layout, tmp_path, text, expect):
    root, specs, receipts = layout
    _keys(tmp_path / "pipeline")
    policy = tmp_path / "pipeline" / "trust.yaml"
    policy.write_text(text)
    for verb in (["gate", "toy"], ["verify"], ["list"], ["promote", "toy", "--reason", "x"], ["tui", "--json"]):
        res = _invoke(*verb, "--specs", str(specs), "--receipts", str(receipts), "--trust", str(policy))
        assert res.exit_code == 2, (verb, res.output)
        (line,) = res.stderr.strip().splitlines()
        assert line.startswith("error: trust policy") and expect in line, line


def test_a_policy_or_key_inside_the_store_is_refused(layout, tmp_path):
    root, specs, receipts = layout
    _keys(tmp_path / "pipeline")
    receipts.mkdir(parents=True, exist_ok=True)
    inside = _policy(receipts / "trust.yaml", [(str(tmp_path / "pipeline" / "runner.pub"), ["cpu"])])
    res = _invoke("gate", "toy", "--specs", str(specs), "--receipts", str(receipts), "--trust", str(inside))
    assert res.exit_code == 2 and "inside the receipt store" in res.output
    (receipts / "runner.pub").write_bytes((tmp_path / "pipeline" / "runner.pub").read_bytes())
    outside = _policy(tmp_path / "trust.yaml", [(str(receipts / "runner.pub"), ["cpu"])])
    res = _invoke("gate", "toy", "--specs", str(specs), "--receipts", str(receipts), "--trust", str(outside))
    assert res.exit_code == 2 and "inside the receipt store" in res.output


def test_an_inline_pem_key_is_accepted(layout, tmp_path):
    root, specs, receipts = layout
    key, kid = _keys(tmp_path / "pipeline")
    pem = (tmp_path / "pipeline" / "runner.pub").read_text()
    policy = tmp_path / "trust.yaml"
    policy.write_text("keys:\n  - public_key: |\n" + "".join(f"      {ln}\n" for ln in pem.splitlines())
                      + f"    devices: [cpu]\nreviewers:\n  - public_key: {_REVIEWER['key']}.pub\n")
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=key)
    code, doc = _gate_json(specs, receipts, "--trust", str(policy))
    assert code == 0 and doc["trust"]["keys"] == [{"keyid": kid, "devices": ["cpu"]}]


# --- the key is read only by the signing process -------------------------------------------


def test_the_check_process_never_opens_the_key(layout, tmp_path, monkeypatch):
    """write_receipt hands the key's path to a process of its own; opening it here would be a leak to
    whatever method code ran in this process."""
    import builtins

    root, specs, receipts = layout
    key, _ = _keys(tmp_path / "k")
    opened = []
    real_open, real_os_open = builtins.open, os.open

    def watch_open(file, *a, **k):
        if Path(str(file)).resolve() == key.resolve() if isinstance(file, (str, os.PathLike)) else False:
            opened.append(file)
        return real_open(file, *a, **k)

    def watch_os_open(file, *a, **k):
        if Path(str(file)).resolve() == key.resolve():
            opened.append(file)
        return real_os_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", watch_open)
    monkeypatch.setattr(os, "open", watch_os_open)
    monkeypatch.setattr(Path, "read_bytes", lambda self: (opened.append(self) if self.resolve() == key.resolve()
                                                          else None) or real_open(self, "rb").read())
    path = G.write(root, receipts, specs / "toy.yaml", sign_key=key)
    assert opened == [] and S.is_envelope(json.loads(path.read_bytes()))
    monkeypatch.undo()


def test_the_signer_imports_nothing_of_the_project_but_itself(tmp_path):
    import subprocess

    key, _ = _keys(tmp_path / "k")
    cmd = S._signer_command(key)
    cmd[3] = cmd[3].replace("sys.exit(main(sys.argv[1:]))",
                            "rc = main(sys.argv[1:]); sys.stderr.write(','.join(sorted(m for m in sys.modules "
                            "if m.split('.')[0] in ('engine', 'methods', 'tui', 'torch')))); sys.exit(rc)")
    done = subprocess.run(cmd, input=b"{}", capture_output=True, timeout=60)
    assert done.returncode == 0
    assert done.stderr.decode().split(",") == ["engine", "engine.store", "engine.store.signing"]


def test_check_refuses_a_bad_key_before_running_anything(layout, tmp_path):
    root, specs, receipts = layout
    shutil.rmtree(receipts)  # check must refuse before it creates a store (the layout's ledger holds a review)
    bad = tmp_path / "not-a-key"
    bad.write_text("hello\n")
    for env in ({}, {"CONTRACTS_SIGNING_KEY": str(bad)}):
        args = ["check", "toy", "--specs", str(specs), "--receipts", str(receipts)]
        res = _invoke(*args, *([] if env else ["--sign-key", str(bad)]), env=env)
        assert res.exit_code == 2 and "not an unencrypted PEM private key" in res.output, res.output
    res = _invoke("check", "toy", "--specs", str(specs), "--sign-key", str(tmp_path / "nope"))
    assert res.exit_code == 2 and "no such file" in res.output
    assert not list(receipts.glob("toy/*"))


# --- decisions come from files ----------------------------------------------------------------


def _poisoned_store(layout):
    """Spec on disk: IN-REVIEW, requires cpu and cuda. Receipts: a passing cpu run, a cpu run with a failure,
    and an edited receipt. Then the cache is poisoned (the spec's parsed data says DONE and cpu only; the edited
    receipt's sha256 is filed as intact) and so is the index, as far as whoever writes the store can: its lines
    are sealed with the user's key now (engine/store/index.py), so the failing run's edited digest (every contract
    passed) is not read, and the edited receipt (same size and mtime, a new ctime) is parsed again."""
    root, specs, receipts = layout
    text = (specs / "toy.yaml").read_text()
    (specs / "toy.yaml").write_text(text.replace("  review: DONE   # reviewed by hand", "  review: IN-REVIEW")
                                    .replace("devices: [cpu]", "devices: [cpu, cuda]"))
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    failing = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(),
                      fail={("double-value", 2, "float32")})
    edited = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), device="cuda")
    time.sleep(0.06)  # older than the tests' racy window (tests/conftest.py): indexed by identity
    # warm the store's cache and the index as the TUI's browser does (the reading verbs seal theirs elsewhere)
    assert _invoke("list", "--specs", str(specs), "--receipts", str(receipts)).exit_code == 0
    C.code_stamp.cache_clear()
    warm = C.ValidationCache(receipts)
    warm.validate_file(specs / "toy.yaml", root)
    warm.flush()
    from engine.store.index import DETAIL_NAME, ReceiptIndex

    ReceiptIndex(receipts).refresh()
    from engine.gate.verdict import evaluate
    from engine.spec.loader import load_spec
    from tui.data import gate_flags

    raw = edited.read_bytes()
    st = edited.stat()
    edited.chmod(0o644)
    edited.write_bytes(raw.replace(b'"name": "Fake GPU"', b'"name": "Fake GPX"', 1))  # same size
    os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime: the index keeps its entry
    expected = _gate_json(specs, receipts)  # what the files say, before the cache and the index are poisoned
    with_tui_flags = evaluate(load_spec(specs / "toy.yaml", root), receipts, root, specs,
                              gate_flags(receipts, specs, root))
    cache_file = receipts / C.CACHE_NAME
    doc = json.loads(cache_file.read_bytes())
    (entry_key,) = [k for k in doc["sections"]["specs"]["entries"] if k.endswith(":toy.yaml")]
    data = doc["sections"]["specs"]["entries"][entry_key]["data"]
    data["promotion"]["review"] = "DONE"
    data["promotion"]["requires"].update(review="DONE", devices=["cpu"], formal_comparison=False)
    C.code_stamp.cache_clear()
    fp = C.ValidationCache(receipts).receipt_fingerprint()
    sha = hashlib.sha256(edited.read_bytes()).hexdigest()
    for section, value in (("integrity", None), ("receipts", [])):
        doc["sections"].setdefault(section, {"fp": fp, "entries": {}})
        doc["sections"][section]["entries"][sha] = value
    cache_file.write_bytes(json.dumps(doc).encode())
    detail = receipts / DETAIL_NAME
    lines = []
    poisoned_lines = 0
    for line in detail.read_bytes().splitlines():
        if line.count(b"\t") != 3:  # the header
            lines.append(line)
            continue
        seal, head, cm, g = line.split(b"\t")
        if failing.name.encode() in head:  # its contract digest: every contract passed (under the old seal)
            digest = json.loads(cm)
            for row in digest["c"].values():
                row[0] = "passed"
            cm = json.dumps(digest, separators=(",", ":")).encode()
            poisoned_lines += 1
        lines.append(b"\t".join((seal, head, cm, g)))
    assert poisoned_lines
    detail.write_bytes(b"\n".join(lines) + b"\n")
    # the poison is in place in the cache, which now says what the files do not; the index's is refused
    C.code_stamp.cache_clear()
    poisoned = C.ValidationCache(receipts)
    assert poisoned.load_spec(specs / "toy.yaml", root).data["promotion"]["review"] == "DONE"
    assert poisoned.integrity_problem({}, edited.read_bytes()) is None
    idx = ReceiptIndex(receipts)
    idx.refresh()
    assert "failed" in {row[0] for row in idx.heavy(f"toy/{failing.name}")["c"].values()}
    assert next(e for e in idx.entries() if e["file"] == f"toy/{edited.name}")["state"] == "tampered"
    return expected, with_tui_flags


def test_a_poisoned_cache_and_index_change_no_cli_verdict(layout):
    root, specs, receipts = layout
    expected, _ = _poisoned_store(layout)
    code, doc = _gate_json(specs, receipts)
    assert (code, doc) == expected
    assert not doc["promotable"] and {"review", "device:cpu", "device:cuda"} <= {
        r["id"] for r in doc["requirements"] if not r["met"]}
    assert [t["file"] for t in doc["receipts"]["tampered"]] and code == 1
    assert _gate_json(specs, receipts, "--no-cache") == expected  # kept for scripts; the same verdict
    res = _invoke("verify", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 1 and "tampered" in res.stdout
    res = _invoke("promote", "toy", "--reason", "x", "--specs", str(specs), "--receipts", str(receipts),
                  "--allow-unsigned")
    assert res.exit_code == 1


def test_a_poisoned_cache_and_index_change_no_tui_gate_verdict(layout):
    from tui.app import create_app

    root, specs, receipts = layout
    _, expected = _poisoned_store(layout)  # as the TUI words its fix lines (paths relative to the checkout)
    unmet = [(f"{r['id']}: {r['detail']}", r["fix"]) for r in expected["requirements"] if r["required"] and not r["met"]]

    async def go():
        app = create_app(specs, receipts, root, poll_seconds=None)
        async with app.run_test(size=(130, 36)) as pilot:
            await app.wait_loaded()
            await app.workers.wait_for_complete()
            await pilot.pause()
            view = app.model.method("toy").gate
            assert view.source == "engine.gate" and view.verdict == "closed"
            assert view.unmet == unmet and view.warnings == expected["warnings"]

    asyncio.run(go())
    res = _invoke("tui", "--json", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 0, res.output


# --- end to end: the real runner signs; the real CLI judges ------------------------------------------


@pytest.mark.slow
def test_check_sign_key_then_gate_trust_counts_exactly_the_signed_run(tmp_path):
    from tests.test_gate import _contracts, _copy_project

    proj = _copy_project(tmp_path / "proj")
    keys = tmp_path / "runner-keys"
    keys.mkdir()
    made = _contracts(proj, "keys", "generate", str(keys / "K"))
    assert made.returncode == 0, made.stderr
    kid = made.stdout.strip()
    _contracts(proj, "keys", "generate", str(keys / "other"))
    store = tmp_path / "R"
    run = _contracts(proj, "check", "toy", "--device", "cpu", "--sign-key", str(keys / "K"), "--receipts", str(store))
    assert run.returncode == 0, run.stderr
    (signed,) = store.glob("toy/*.json")
    assert S.is_envelope(json.loads(signed.read_bytes()))
    pipeline = tmp_path / "pipeline"
    pipeline.mkdir()
    _contracts(proj, "keys", "generate", str(keys / "reviewer"))
    reviewed = _contracts(proj, "review", "toy", "--approve", "--reviewer", "R", "--note", "read it", "--sign-key",
                          str(keys / "reviewer"), "--receipts", str(store))
    assert reviewed.returncode == 0, reviewed.stderr
    rev = [str(keys / "reviewer.pub")]
    trusted = _policy(pipeline / "P.yaml", [(str(keys / "K.pub"), ["cpu"])], rev)
    other = _policy(pipeline / "other.yaml", [(str(keys / "other.pub"), ["cpu", "cuda"])], rev)
    gate = _contracts(proj, "gate", "toy", "--trust", str(trusted), "--receipts", str(store), "--json")
    doc = json.loads(gate.stdout)
    assert gate.returncode == 0 and doc["promotable"] and _req(doc, "device:cpu")["met"], gate.stdout
    assert doc["trust"]["keys"] == [{"keyid": kid, "devices": ["cpu"]}]
    gate = _contracts(proj, "gate", "toy", "--trust", str(other), "--receipts", str(store), "--json")
    doc = json.loads(gate.stdout)
    assert gate.returncode == 1 and not _req(doc, "device:cpu")["met"]
    assert [u["why"] for u in doc["receipts"]["untrusted"]] == ["untrusted key"]
    # an unsigned run of the same code is not counted under the policy
    unsigned_store = tmp_path / "U"
    assert _contracts(proj, "check", "toy", "--device", "cpu", "--receipts", str(unsigned_store)).returncode == 0
    gate = _contracts(proj, "gate", "toy", "--trust", str(trusted), "--receipts", str(unsigned_store), "--json")
    doc = json.loads(gate.stdout)
    assert gate.returncode == 1 and [u["why"] for u in doc["receipts"]["untrusted"]] == ["unsigned"]


def test_read_only_verbs_with_a_policy_never_import_torch(layout, tmp_path):
    import subprocess
    import sys

    root, specs, receipts = layout
    key, _ = _keys(tmp_path / "pipeline")
    policy = _policy(tmp_path / "pipeline" / "trust.yaml", [("runner.pub", ["cpu"])])
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=key)
    script = f"""
import sys
from pathlib import Path
from typer.testing import CliRunner
from engine.spec import registry
from tests import gate_support as G
import engine.cli as cli
import engine.paths
registry._STATIC = G.TOY_NAMES
engine.paths.project_root = lambda: Path({str(root)!r})
store = ["--specs", {str(specs)!r}, "--receipts", {str(receipts)!r}, "--trust", {str(policy)!r}]
for args in (["verify", *store], ["gate", "toy", *store, "--json"], ["list", *store], ["tui", "--json", *store]):
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 0, (args, res.output)
    assert "torch" not in sys.modules, args
print("ok")
"""
    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_signing_command_signs_and_is_held_to_the_receipt_it_was_given(layout, tmp_path, monkeypatch):
    """--sign-command (e.g. the signing module run as another OS user who alone can read the key): the receipt
    is its envelope, and only an envelope of exactly the bytes handed over is accepted."""
    import shlex
    import sys

    root, specs, receipts = layout
    key, kid = _keys(tmp_path / "k")
    top = str(Path(S.__file__).resolve().parent.parent.parent)
    command = f"{shlex.quote(sys.executable)} -m engine.store.signing sign {shlex.quote(str(key))}"
    monkeypatch.setenv("PYTHONPATH", top)
    signer = S.usable_signer(None, command)
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=signer)
    assert [s["keyid"] for s in json.loads(path.read_bytes())["signatures"]] == [kid]
    policy = _policy(tmp_path / "k" / "trust.yaml", [("runner.pub", ["cpu"])])
    assert _gate_json(specs, receipts, "--trust", str(policy))[0] == 0
    # a command that signs something else (here: always the empty document) is refused
    other = tmp_path / "other.py"
    other.write_text("import sys, json\nsys.stdin.buffer.read()\n"
                     f"sys.path.insert(0, {top!r})\nfrom engine.store import signing as S\n"
                     f"k = S._load_private(__import__('pathlib').Path({str(key)!r}))\n"
                     "sys.stdout.buffer.write(S.envelope_bytes(S.envelope(b'{}', k)))\n")
    with pytest.raises(S.KeyProblem, match="of the receipt it was given"):
        S.sign_in_subprocess(b"{\"x\": 1}", (sys.executable, str(other)))
    for args, why in ((["--sign-command", "false"], "signing"),
                      (["--sign-command", command, "--sign-key", str(key)], "not both")):
        res = _invoke("check", "toy", "--specs", str(specs), "--receipts", str(tmp_path / "none"), *args)
        assert res.exit_code == 2 and why in res.output, res.output
    assert not (tmp_path / "none").exists()


def test_the_tui_opens_a_signed_receipt_as_its_statement(layout, tmp_path):
    from tui.data import load_detail

    root, specs, receipts = layout
    key, _ = _keys(tmp_path / "k")
    path = G.write(root, receipts, specs / "toy.yaml", sign_key=key)
    detail = load_detail(receipts, f"toy/{path.name}")
    assert detail.error == "" and detail.data["_type"] == R.STATEMENT_TYPE
    assert detail.text.startswith('{\n "_type": "https://in-toto.io/Statement/v1"')


def test_braces_in_a_policy_path_stay_braces_in_the_fix_lines(layout, tmp_path):
    root, specs, receipts = layout
    folder = tmp_path / "{device}{0}"
    _keys(folder)
    policy = _policy(folder / "trust.yaml", [("runner.pub", ["cpu"])])
    code, doc = _gate_json(specs, receipts, "--trust", str(policy))
    cpu = _req(doc, "device:cpu")
    assert code == 1 and f"sign it with a key {policy} trusts for cpu" in cpu["note"]
    assert cpu["fix"]["argv"][:5] == ["contracts", "check", "toy", "--device", "cpu"]


def test_the_tui_gate_under_a_policy_is_contracts_gate_under_it(layout, tmp_path):
    from engine.store.index import Freshness, ReceiptIndex
    from tui.data import build_model

    root, specs, receipts = layout
    key, _ = _keys(tmp_path / "pipeline")
    policy = _policy(tmp_path / "pipeline" / "trust.yaml", [("runner.pub", ["cpu"])])
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())  # unsigned: opens the gate without a policy
    model = build_model(specs, receipts, root, ReceiptIndex(receipts), Freshness(root, specs), gates=True, trust=policy)
    view = model.method("toy").gate
    _, doc = _gate_json(specs, receipts, "--trust", str(policy))
    assert view.verdict == "closed" and not doc["promotable"]
    assert [u.split(": ")[0] for u, _ in view.unmet] == [r["id"] for r in doc["requirements"] if not r["met"]]
    assert any("is not counted: unsigned" in w for w in view.warnings)
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=key)
    model = build_model(specs, receipts, root, ReceiptIndex(receipts), Freshness(root, specs), gates=True, trust=policy)
    assert model.method("toy").gate.verdict == "open" and _gate_json(specs, receipts, "--trust", str(policy))[0] == 0
