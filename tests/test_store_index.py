"""The sealed index (engine/store/sealed_index.py): each receipt verified once and again only when its file's
identity changes; a summary (engine/store/summary.py) that reads as the whole receipt does; and an index that never
makes a receipt look fresher or more trusted than judging every file from its bytes does."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.cli as cli
import engine.store.bounded
import engine.store.receipts
import engine.store.verify
from engine.store import sealed as S
from engine.store import sealed_index as SI
from engine.store import summary
from engine.store.coverage import facts
from engine.store.receipts import parse_receipt
from engine.store.records import Receipt
from engine.store.verify import assess
from tests import gate_support as G

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = sorted((ROOT / "receipts").glob("*/*.json"))


@pytest.fixture
def toy(tmp_path, monkeypatch):
    # a receipt changed within RACY_NS of being read is not recorded by its identity; the tests wait this long
    monkeypatch.setattr(SI, "RACY_NS", 50_000_000)
    return G.toy_project(tmp_path, monkeypatch)


def _settle() -> None:
    """Let the files written so far become older than RACY_NS (the test's 50 ms), as any file a minute old is."""
    time.sleep(0.12)


def _run(*argv: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli.app, list(argv))
    out = res.stdout
    if argv[0] == "gate" and "--json" in argv:
        doc = json.loads(out)
        doc.pop("evaluated_at")  # the one field that is the time of the call
        out = json.dumps(doc)
    return res.exit_code, out


def _outputs(specs: Path, receipts: Path) -> dict:
    args = ["--specs", str(specs), "--receipts", str(receipts)]
    argvs = [("list", "--json"), ("list",), ("gate", "toy", "--json"), ("gate", "toy"), ("show", "toy", "--json"),
             ("verify", "--json"), ("verify", "toy")]
    return {" ".join(a): _run(*a, *args) for a in argvs}


def _without_cache(specs: Path, receipts: Path, monkeypatch) -> dict:
    monkeypatch.setenv(S.ENV_OFF, "1")
    try:
        return _outputs(specs, receipts)
    finally:
        monkeypatch.delenv(S.ENV_OFF)


class _Reads:
    """Counts the receipt files read while it is open (every reader goes through one of these two)."""

    def __enter__(self):
        self.files: list[str] = []
        self._patch = pytest.MonkeyPatch()
        real_read, real_load = engine.store.bounded.read_regular_with_stat, engine.store.verify.load_receipt

        def read(path, *a, **k):
            self.files.append(Path(path).name)
            return real_read(path, *a, **k)

        def load(path, *a, **k):
            self.files.append(Path(path).name)
            return real_load(path, *a, **k)

        self._patch.setattr(engine.store.bounded, "read_regular_with_stat", read)
        self._patch.setattr(engine.store.verify, "load_receipt", load)
        return self

    def __exit__(self, *exc) -> None:
        self._patch.undo()

    def receipts(self) -> list[str]:
        return [f for f in self.files if f.startswith("20") and f.endswith(".json")]


def _index_files() -> list[Path]:
    return sorted(Path(os.environ[S.ENV_DIR]).glob(f"{SI.KIND}-v{S.VERSION}/*/*.json"))


# --- the summary reads as the receipt -------------------------------------------------------------------------------


def test_a_summary_gives_the_same_record_and_coverage_for_every_committed_receipt():
    assert COMMITTED
    for path in COMMITTED:
        raw = path.read_bytes()
        data, _, signatures = parse_receipt(raw)
        fields, parts = summary.of(data)
        # through JSON, as the index keeps it
        fields = json.loads(json.dumps(fields))
        decoded = {n: summary.decode_part(n, json.loads(json.dumps(parts[n]))) for n in summary.PARTS}
        keyids = tuple(s["keyid"] for s in signatures or [])
        rec = summary.receipt(fields, decoded, keyids)
        whole = Receipt.from_statement(data, keyids)
        assert rec == whole, path.name
        assert facts(rec.predicate) == facts(data["predicate"]), path.name
        assert rec.bound == whole.bound and rec.coverage() == whole.coverage(), path.name
        # what makes the index small: a few kilobytes of its own (its subject list is shared by the receipts of
        # the same code, and kept once)
        own = {k: v for k, v in parts.items() if k != "subject"}
        assert len(json.dumps([fields, own])) < len(raw) / 10, path.name


def test_receipts_with_the_same_results_share_one_table(toy):
    root, specs, receipts = toy
    for _ in range(3):
        G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    _settle()
    out = engine.store.verify.assess_receipts(receipts, root, specs, "toy", sealed=S.Sealed.for_user())[0]
    again = engine.store.verify.assess_receipts(receipts, root, specs, "toy", sealed=S.Sealed.for_user())[0]
    assert [a.as_dict() for a in out] == [a.as_dict() for a in again]
    shared = {id(a.receipt.results) for a in again}
    assert len(shared) == 1 and len({id(a.receipt.subject) for a in again}) == 1


# --- verified once: a warm command reads no receipt ------------------------------------------------------------------


def test_a_warm_list_gate_and_show_read_no_receipt_and_verify_reads_every_one(toy, monkeypatch):
    root, specs, receipts = toy
    for seed in (1, 2):
        G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), fail=(("double-value", seed, "float32"),))
    _settle()
    cold = _outputs(specs, receipts)
    reads = _Reads().__enter__()
    for name in ("integrity_problem", "schema_problems"):
        monkeypatch.setattr(engine.store.receipts, name, lambda *a, **k: pytest.fail("judged again on a warm index"))
    monkeypatch.setattr(engine.store.verify, "schema_problems", lambda *a, **k: pytest.fail("judged again"))
    args = ["--specs", str(specs), "--receipts", str(receipts)]
    for argv in (("list", "--json"), ("gate", "toy", "--json"), ("show", "toy", "--json"), ("list",)):
        assert _run(*argv, *args) == cold[" ".join(argv)]
    assert reads.receipts() == []
    assert _run("verify", "--json", *args) == cold["verify --json"]  # verify reads and hashes every file
    assert sorted(reads.receipts()) == sorted(p.name for p in receipts.glob("toy/*.json"))
    reads.__exit__()
    assert not [p for p in receipts.rglob("*") if p.name.startswith(".")]  # nothing kept in the store


def test_verify_says_how_long_per_receipt(toy):
    root, specs, receipts = toy
    G.write(root, receipts, specs / "toy.yaml")
    res = CliRunner().invoke(cli.app, ["verify", "--specs", str(specs), "--receipts", str(receipts)])
    assert res.exit_code == 0
    assert "verify: 1 receipt file(s) read and judged in" in res.stderr and "ms per receipt" in res.stderr


# --- never fresher or more trusted than the bytes -----------------------------------------------------------------


def _same_size_edit(path: Path) -> None:
    """Change one byte of the run (a tampered receipt), keep the size and put the mtime back."""
    st = path.stat()
    raw = path.read_bytes()
    edited = raw.replace(b'"wall_s": 0.001', b'"wall_s": 0.002', 1)
    assert edited != raw and len(edited) == len(raw)
    path.chmod(0o644)
    path.write_bytes(edited)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


def _agree(specs: Path, receipts: Path, monkeypatch) -> dict[str, str]:
    """Every reading verb prints exactly what it prints with no cache, and the gate counts each receipt as verify
    judges it; returns verify's state of each file."""
    warm = _outputs(specs, receipts)
    assert warm == _without_cache(specs, receipts, monkeypatch)
    verified = {Path(r["file"]).name: r for r in json.loads(warm["verify --json"][1])["receipts"]}
    gated = json.loads(warm["gate toy --json"][1])["receipts"]
    by_file = {Path(r["file"]).name: k for k in ("stale", "tampered", "invalid", "refused") for r in gated[k]}
    for name, r in verified.items():
        if r["state"] == "fresh":
            assert r["receipt_id"] in gated["fresh"] or by_file.get(name) == "refused", name
        else:
            assert by_file.get(name) == r["state"], (name, r["state"], by_file.get(name))
            assert r["receipt_id"] not in gated["fresh"]
    return {name: r["state"] for name, r in verified.items()}


def test_no_tampering_makes_a_receipt_look_fresher_than_verify_says(toy, monkeypatch, tmp_path):
    from engine.store.signing import generate

    root, specs, receipts = toy
    key = tmp_path / "keys" / "runner.key"
    key.parent.mkdir()
    generate(key)
    spec = specs / "toy.yaml"
    w = {}
    w["edited"] = G.write(root, receipts, spec, comparisons=G.ahead())
    w["replaced"] = G.write(root, receipts, spec, comparisons=G.ahead())
    w["swap_a"] = G.write(root, receipts, spec, comparisons=G.ahead())
    w["swap_b"] = G.write(root, receipts, spec, fail=(("double-value", 2, "float64"),))
    w["truncated"] = G.write(root, receipts, spec)
    w["signed"] = G.write(root, receipts, spec, sign_key=key, comparisons=G.ahead())
    w["signed_edit"] = G.write(root, receipts, spec, sign_key=key)
    w["untouched"] = G.write(root, receipts, spec, comparisons=G.ahead())
    _settle()
    before = _agree(specs, receipts, monkeypatch)  # warm: every receipt recorded by its identity
    assert set(before.values()) == {"fresh"}
    with _Reads() as reads:
        _outputs(specs, receipts)
    everyone = sorted(p.name for p in receipts.glob("toy/*.json"))
    assert sorted(reads.receipts()) == sorted(everyone * 2)  # verify's two runs read them; list, gate, show none

    _same_size_edit(w["edited"])
    # replaced by rename: other bytes of the same size (one digit of the run changed) under the same name
    tmp = w["replaced"].with_name(".tmp-replace")
    raw = w["replaced"].read_bytes()
    tmp.write_bytes(raw.replace(b'"wall_s": 0.001', b'"wall_s": 0.003', 1))
    os.replace(tmp, w["replaced"])
    # the two files swapped: each name now holds the other receipt (both intact, so both fresh, but which failed
    # is the other one)
    tmp = w["swap_a"].with_name(".tmp-swap")
    os.rename(w["swap_a"], tmp)
    os.rename(w["swap_b"], w["swap_a"])
    os.rename(tmp, w["swap_b"])
    with open(w["truncated"], "r+b") as f:
        f.truncate(os.path.getsize(w["truncated"]) // 2)
    # a signed receipt whose signature is edited (same size, mtime put back): no longer its runner's signature
    st = w["signed_edit"].stat()
    raw = w["signed_edit"].read_bytes()
    at = raw.rindex(b'"sig": "') + len(b'"sig": "')
    flipped = raw[:at] + (b"B" if raw[at:at + 1] == b"A" else b"A") + raw[at + 1:]
    w["signed_edit"].chmod(0o644)
    w["signed_edit"].write_bytes(flipped)
    os.utime(w["signed_edit"], ns=(st.st_atime_ns, st.st_mtime_ns))

    after = _agree(specs, receipts, monkeypatch)
    assert after[w["edited"].name] == "tampered" and after[w["replaced"].name] == "tampered"
    assert after[w["truncated"].name] == "invalid"
    assert after[w["swap_a"].name] == after[w["swap_b"].name] == "fresh"
    assert after[w["untouched"].name] == after[w["signed"].name] == "fresh"
    # the swap shows: each name holds the other receipt
    verified = json.loads(_run("verify", "--json", "--specs", str(specs), "--receipts", str(receipts))[1])
    by_name = {Path(r["file"]).name: r for r in verified["receipts"]}
    assert by_name[w["swap_a"].name]["status"] == "failed" and by_name[w["swap_b"].name]["status"] == "passed"
    # a signature edited in place: the key ids shown come from the file, and under a trust policy it is refused
    assert by_name[w["signed_edit"].name]["signed_by"] == by_name[w["signed"].name]["signed_by"]

    # the index files themselves: edited, replaced by one sealed with another key, or by a genuine index whose
    # entry is rewritten to claim the tampered file's identity and bytes
    for index_file in _index_files():
        body = index_file.read_bytes().partition(b"\n")[2]
        doc = json.loads(body)
        name = w["edited"].name
        entry = doc["files"][name]
        entry[0] = SI.identity(os.lstat(w["edited"]))
        entry[1] = hashlib.sha256(w["edited"].read_bytes()).hexdigest()
        forged = json.dumps(doc, separators=(",", ":")).encode()
        old_mac = index_file.read_bytes().partition(b"\n")[0]
        index_file.write_bytes(old_mac + b"\n" + forged)  # the old seal over new content
        assert _agree(specs, receipts, monkeypatch)[name] == "tampered"
        key, fp = index_file.stem.split("-")
        assert fp == S.receipt_fingerprint()[:24]
        full_fp = S.receipt_fingerprint()
        other = hmac.new(os.urandom(32), f"v{S.VERSION}\0{SI.KIND}\0{key}\0{full_fp}\0".encode() + forged,
                         hashlib.sha256).hexdigest()
        index_file.write_bytes(other.encode() + b"\n" + forged)  # sealed with a key that is not the user's
        assert _agree(specs, receipts, monkeypatch)[name] == "tampered"
        index_file.write_bytes(b"\x00garbage")
        assert _agree(specs, receipts, monkeypatch)[name] == "tampered"

    # a bound source file changed: every receipt goes stale, from the index as from the files
    (root / "src" / "toy.py").write_text("def double(x):\n    return x + x\n")
    stale = _agree(specs, receipts, monkeypatch)
    assert stale[w["untouched"].name] == "stale" and stale[w["edited"].name] == "tampered"


def test_a_trust_policy_judges_the_signatures_from_the_files(toy, monkeypatch, tmp_path):
    """Warm index or not, a receipt whose signature was edited in place does not count under a policy."""
    from engine.store.signing import generate

    root, specs, receipts = toy
    key = tmp_path / "keys" / "runner.key"
    key.parent.mkdir()
    generate(key)
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"keys:\n  - public_key: {key}.pub\n    devices: [cpu]\n")
    path = G.write(root, receipts, specs / "toy.yaml", sign_key=key, comparisons=G.ahead())
    _settle()
    args = ["--specs", str(specs), "--receipts", str(receipts)]
    _run("list", *args)  # warm
    raw = path.read_bytes()
    at = raw.rindex(b'"sig": "') + len(b'"sig": "')
    st = path.stat()
    path.chmod(0o644)
    path.write_bytes(raw[:at] + (b"B" if raw[at:at + 1] == b"A" else b"A") + raw[at + 1:])
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    code, out = _run("gate", "toy", "--json", "--trust", str(policy), *args)
    doc = json.loads(out)
    assert [r["why"] for r in doc["receipts"]["untrusted"]] == ["bad signature"] and doc["receipts"]["fresh"] == []


def test_a_file_changed_right_after_it_was_read_is_judged_again(toy, monkeypatch):
    """The racy case: within one clock tick a rewrite may keep size, mtime and ctime. A receipt read within RACY_NS
    of its last change is recorded by its bytes only, so a same-size rewrite right after is still read."""
    monkeypatch.setattr(SI, "RACY_NS", 10 ** 12)  # everything is racy
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml")
    args = ["--specs", str(specs), "--receipts", str(receipts)]
    assert _run("verify", *args)[0] == 0
    (index_file,) = _index_files()
    doc = json.loads(index_file.read_bytes().partition(b"\n")[2])
    assert [e[0] for e in doc["files"].values()] == [None]  # no identity recorded
    _same_size_edit(path)
    assert _run("gate", "toy", *args)[1] == _without_cache(specs, receipts, monkeypatch)["gate toy"][1]
    assert "tampered receipt" in _run("gate", "toy", *args)[1]


def test_a_file_touched_but_unchanged_is_hashed_once_and_recorded_again(toy, monkeypatch):
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml")
    _settle()
    args = ["--specs", str(specs), "--receipts", str(receipts)]
    _run("list", *args)
    os.utime(path)  # new mtime and ctime, same bytes
    _settle()
    monkeypatch.setattr(engine.store.receipts, "integrity_problem", lambda *a, **k: pytest.fail("judged again"))
    with _Reads() as reads:
        _run("list", *args)
        assert reads.receipts() == [path.name]  # read and hashed: the bytes are the recorded ones
        _run("list", *args)
        assert reads.receipts() == [path.name]  # and recorded by its new identity


# --- what the verdicts are filed under ------------------------------------------------------------------------------


def test_an_unrelated_engine_edit_keeps_the_verdicts_and_a_schema_edit_drops_them(toy, monkeypatch, tmp_path):
    root, specs, receipts = toy
    engine_copy = tmp_path / "engine-copy"
    shutil.copytree(S._ENGINE, engine_copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(S, "_ENGINE", engine_copy)

    def refingerprint():
        S.receipt_fingerprint.cache_clear()
        S.engine_fingerprint.cache_clear()

    monkeypatch.setattr(S.receipt_fingerprint, "cache_clear", S.receipt_fingerprint.cache_clear)
    refingerprint()
    path = G.write(root, receipts, specs / "toy.yaml")
    _settle()
    calls = []
    real = engine.store.verify.schema_problems
    monkeypatch.setattr(engine.store.verify, "schema_problems", lambda d: calls.append(1) or real(d))

    def judged() -> int:
        before = len(calls)
        assess(path, root, specs, display=path.name, folder_method="toy", sealed=S.Sealed.for_user())
        return len(calls) - before

    assert judged() == 1  # cold
    assert judged() == 0  # warm
    for unrelated in ("cli/list.py", "gate/verdict.py", "store/overview.py", "kinds/__init__.py"):
        with open(engine_copy / unrelated, "a") as f:
            f.write("\n# an edit\n")
    refingerprint()
    assert judged() == 0  # the verdict still holds: none of those decides it
    with open(engine_copy / "schemas" / "receipt.schema.json", "a") as f:
        f.write("\n")
    refingerprint()
    assert judged() == 1  # the schema decides it: judged from the bytes again
    assert judged() == 0
    with open(engine_copy / "store" / "receipts.py", "a") as f:
        f.write("\n# an edit\n")
    refingerprint()
    assert judged() == 1
    refingerprint()
    monkeypatch.undo()
    refingerprint()


def test_a_signed_receipts_signatures_are_read_from_its_file_on_every_call(toy, monkeypatch, tmp_path):
    """Even where a file's times never change (here: an identity of device, inode and size only), a signed
    receipt's signatures block is read again on every call: key ids edited in place show, as from the bytes."""
    from engine.store.signing import generate

    monkeypatch.setattr(SI, "identity", lambda st: [st.st_dev, st.st_ino, st.st_size])
    root, specs, receipts = toy
    key = tmp_path / "keys" / "runner.key"
    key.parent.mkdir()
    generate(key)
    path = G.write(root, receipts, specs / "toy.yaml", sign_key=key, comparisons=G.ahead())
    _settle()
    args = ["--specs", str(specs), "--receipts", str(receipts)]
    assert _run("list", "--json", *args)[0] == 0
    with _Reads() as reads:
        _run("list", "--json", *args)
        assert reads.receipts() == []  # served by its identity and its signatures block
    raw = path.read_bytes()
    at = raw.rindex(b'"keyid": "') + len(b'"keyid": "')
    edited = raw[:at] + (b"0" if raw[at:at + 1] != b"0" else b"1") + raw[at + 1:]
    path.chmod(0o644)
    path.write_bytes(edited)
    # what list, gate and show read (verify reads every file anyway): the key ids now in the file
    (a,), _ = engine.store.verify.assess_receipts(receipts, root, specs, "toy", sealed=S.Sealed.for_user())
    assert a.signed_by == [json.loads(edited)["signatures"][0]["keyid"]] != json.loads(raw)["signatures"][0]["keyid"]
    assert _outputs(specs, receipts) == _without_cache(specs, receipts, monkeypatch)


def test_under_a_trust_policy_gate_reads_only_its_methods_folder(toy, monkeypatch, tmp_path):
    """Under a policy nothing sealed is used and every receipt is judged from its bytes: of the gated method only."""
    from engine.store.signing import generate

    root, specs, receipts = toy
    key = tmp_path / "keys" / "runner.key"
    key.parent.mkdir()
    generate(key)
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"keys:\n  - public_key: {key}.pub\n    devices: [cpu]\n")
    mine = G.write(root, receipts, specs / "toy.yaml", sign_key=key, comparisons=G.ahead())
    other = receipts / "other-method"
    other.mkdir()
    for i in range(3):
        (other / f"2026010{i}T000000000000Z_other-method_{i:012x}.json").write_bytes(mine.read_bytes())
    with _Reads() as reads:
        code, out = _run("gate", "toy", "--json", "--trust", str(policy), "--specs", str(specs), "--receipts",
                         str(receipts))
    assert json.loads(out)["receipts"]["fresh"] and reads.files == [mine.name]
