"""`contracts verify`: every receipt reported as fresh, stale, tampered or invalid; the ledger checked."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from engine.spec.loader import display_path
from typer.testing import CliRunner

import engine.cli as cli
from engine.store import ledger
from engine.store import receipts as R
from engine.store.verify import assess, assess_store
from tests import gate_support as G


@pytest.fixture
def layout(tmp_path, monkeypatch):
    root, specs, receipts = G.make_layout(tmp_path)
    monkeypatch.setattr("engine.paths.project_root", lambda: root)
    return root, specs, receipts


def _invoke(*args: str):
    return CliRunner().invoke(cli.app, list(args))


def _one_byte_edit(raw: bytes, marker: bytes) -> bytes:
    """Change one digit right after `marker`, keeping the file valid JSON."""
    i = raw.index(marker) + len(marker)
    while not raw[i:i + 1].isdigit():
        i += 1
    new = b"7" if raw[i:i + 1] != b"7" else b"3"
    return raw[:i] + new + raw[i + 1:]


def test_verify_reports_valid_stale_tampered_truncated_and_non_json(layout):
    root, specs, receipts = layout
    spec = specs / "toy.yaml"
    valid = G.write(root, receipts, spec)
    (root / "src" / "old.py").write_text("A = 1\n")
    stale = G.write(root, receipts, spec, extra=("src/old.py",))
    (root / "src" / "old.py").write_text("A = 2\n")  # one byte changed since that run
    raw = valid.read_bytes()
    folder = valid.parent
    (folder / "20990101T000000000000Z_toy_tampered.json").write_bytes(_one_byte_edit(raw, b'"max_abs_err": '))
    (folder / "20990101T000000000001Z_toy_truncated.json").write_bytes(raw[: len(raw) // 2])
    (folder / "20990101T000000000002Z_toy_garbage.json").write_bytes(b"this is not json\n")

    res = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs), "--json")
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    by_file = {r["file"].split("/")[-1]: r for r in json.loads(res.stdout)["receipts"]}
    assert by_file[valid.name]["state"] == "fresh"
    assert by_file[stale.name]["state"] == "stale" and by_file[stale.name]["changed"] == ["src/old.py"]
    assert by_file["20990101T000000000000Z_toy_tampered.json"]["state"] == "tampered"
    assert by_file["20990101T000000000001Z_toy_truncated.json"]["state"] == "invalid"
    assert "not JSON" in by_file["20990101T000000000001Z_toy_truncated.json"]["message"]
    assert by_file["20990101T000000000002Z_toy_garbage.json"]["state"] == "invalid"
    assert json.loads(res.stdout)["counts"] == {"fresh": 1, "stale": 1, "tampered": 1, "invalid": 2}

    text = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs))
    assert text.exit_code == 1 and "Traceback" not in text.output
    lines = text.stdout.splitlines()
    for state, name in [("fresh", valid.name), ("stale", stale.name), ("tampered", "toy_tampered"),
                        ("invalid", "toy_truncated"), ("invalid", "toy_garbage")]:
        assert any(ln.startswith(state) and name in ln for ln in lines), (state, name, text.stdout)
    assert any("src/old.py" in ln for ln in lines if ln.startswith("stale"))


def test_stale_alone_is_not_a_failure_unless_strict(layout):
    root, specs, receipts = layout
    G.write(root, receipts, specs / "toy.yaml")
    (root / "src" / "toy.py").write_text("def double(x):\n    return x + x\n")
    assert _invoke("verify", "--receipts", str(receipts), "--specs", str(specs)).exit_code == 0
    assert _invoke("verify", "--receipts", str(receipts), "--specs", str(specs), "--strict").exit_code == 1


def test_any_single_byte_edit_is_caught(layout):
    root, specs, receipts = layout
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    raw = path.read_bytes()
    target = path.parent / "edited.json"
    rng = random.Random(0)
    positions = sorted(rng.sample(range(len(raw)), 300)) + [0, len(raw) - 1]
    for i in positions:
        new = bytes([raw[i] ^ (1 << rng.randrange(7))])
        target.write_bytes(raw[:i] + new + raw[i + 1:])
        state = assess(target, root, specs, folder_method="toy").state
        assert state in ("tampered", "invalid"), (i, raw[max(0, i - 20):i + 20], state)


def test_an_intact_receipt_that_breaks_the_schema_is_invalid(layout):
    root, specs, receipts = layout
    pred = G.predicate(specs / "toy.yaml")
    del pred["results"]
    pred["environment"]["device"]["kind"] = "tpu"
    subject = [{"name": "src/toy.py", "digest": {"sha256": R.sha256_file(root / "src" / "toy.py")}}]
    path = R.write_receipt(receipts, R.statement(subject, pred))
    a = assess(path, root, specs, folder_method="toy")
    assert a.state == "invalid"
    assert "'results' is a required property" in a.message and "$.predicate.environment.device.kind" in a.message


def test_misfiled_stray_and_leftover_files(layout):
    root, specs, receipts = layout
    path = G.write(root, receipts, specs / "toy.yaml")
    other = receipts / "other-method"
    other.mkdir()
    (other / path.name).write_bytes(path.read_bytes())
    (receipts / "toy" / "notes.txt").write_text("hello\n")
    (receipts / "toy" / ".tmp-deadbeef").write_bytes(b"half")
    report = assess_store(receipts, root, specs)
    states = {r.file: (r.state, r.message) for r in report.receipts}
    assert states[f"other-method/{path.name}"][0] == "invalid"
    assert "filed under other-method/" in states[f"other-method/{path.name}"][1]
    assert states["toy/notes.txt"][0] == "invalid"
    assert states[f"toy/{path.name}"][0] == "fresh"
    assert report.leftovers == ["toy/.tmp-deadbeef"]


def test_verify_unknown_method_is_one_line_usage_error(layout):
    root, specs, receipts = layout
    res = _invoke("verify", "nosuch", "--receipts", str(receipts), "--specs", str(specs))
    assert res.exit_code == 2 and "known: toy" in res.stderr and "Traceback" not in res.output
    assert _invoke("verify", "Bad/Key", "--receipts", str(receipts), "--specs", str(specs)).exit_code == 2


# --- the ledger -----------------------------------------------------------------


def _ledger_with_one_entry(root, specs, receipts) -> tuple[Path, str]:
    path = G.write(root, receipts, specs / "toy.yaml")
    rid = json.loads(path.read_bytes())["predicate"]["receipt_id"]
    ledger.append(receipts, method="toy", action="promote", old_state="not-promoted", new_state="promoted",
                  reason="test", receipts=[rid])
    ledger.append(receipts, method="toy", action="demote", old_state="promoted", new_state="not-promoted",
                  reason="test 2", receipts=[])
    return ledger.ledger_path(receipts), rid


def test_ledger_entries_chain_and_validate_against_the_published_schema(layout):
    from jsonschema import Draft202012Validator

    root, specs, receipts = layout
    lpath, _ = _ledger_with_one_entry(root, specs, receipts)
    report = assess_store(receipts, root, specs, spec_states={"toy": "not-promoted"})
    assert report.ledger.problems == [] and len(report.ledger.entries) == 2
    schema = json.loads((Path(cli.__file__).parents[1] / "schemas" / "ledger.schema.json").read_text())
    for line in lpath.read_text().splitlines():
        Draft202012Validator(schema).validate(json.loads(line))
    res = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs), "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["ledger"] == {  # named by its path, like every file
        "file": display_path(receipts / "ledger.jsonl", root), "entries": 2, "ok": True, "problems": []}


@pytest.mark.parametrize("damage, expected", [
    (lambda lines: [lines[0].replace(b'"reason":"test"', b'"reason":"tesT"'), lines[1]], "tampered"),
    (lambda lines: [lines[1]], "chain broken"),
    (lambda lines: [lines[1], lines[0]], "chain broken"),
    (lambda lines: [lines[0], lines[1], b'{"oops": 1}'], "missing 'schema'"),
    (lambda lines: [lines[0], lines[1], b"not json"], "not a JSON line"),
])
def test_ledger_damage_is_reported(layout, damage, expected):
    root, specs, receipts = layout
    lpath, _ = _ledger_with_one_entry(root, specs, receipts)
    lpath.write_bytes(b"\n".join(damage(lpath.read_bytes().splitlines())) + b"\n")
    res = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs))
    assert res.exit_code == 1 and expected in res.stdout, res.stdout


def test_ledger_entry_naming_a_missing_receipt_is_reported(layout):
    root, specs, receipts = layout
    lpath, rid = _ledger_with_one_entry(root, specs, receipts)
    for p in (receipts / "toy").iterdir():
        p.unlink()
    report = assess_store(receipts, root, specs, spec_states={"toy": "not-promoted"})
    assert any("not in the store" in p and rid[:12] in p for p in report.ledger.problems)


def test_spec_state_the_ledger_does_not_explain_is_reported(layout):
    root, specs, receipts = layout
    spec = specs / "toy.yaml"
    spec.write_text(spec.read_text().replace('state: "not-promoted"', 'state: "promoted"'))
    receipts.mkdir(exist_ok=True)  # an empty store: no ledger (a store that is not there at all is exit 2)
    res = _invoke("verify", "--receipts", str(receipts), "--specs", str(specs))
    assert res.exit_code == 1 and "no ledger entry promoted it" in res.stdout


# --- schema --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["receipt", "spec", "gate", "ledger"])
def test_schema_command_prints_the_published_schema(name):
    res = _invoke("schema", name)
    assert res.exit_code == 0
    published = json.loads((Path(cli.__file__).parents[1] / "schemas" / f"{name}.schema.json").read_text())
    assert json.loads(res.stdout) == published


def test_schema_unknown_name_is_a_usage_error():
    res = _invoke("schema", "nope")
    assert res.exit_code == 2 and "valid: receipt, spec, gate, ledger" in res.stderr


def test_a_promote_does_not_stale_the_receipt_but_any_other_spec_edit_does(layout):
    from engine.gate.promote import rewrite_state

    root, specs, receipts = layout
    spec = specs / "toy.yaml"
    path = G.write(root, receipts, spec)
    rewrite_state(spec, "promoted")
    assert R.check_receipt(path, root, specs).state == "fresh"  # what show, the TUI and verify all call
    spec.write_text(spec.read_text().replace("cases: 8", "cases: 9"))
    rc = R.check_receipt(path, root, specs)
    assert rc.state == "stale" and rc.changed == ("specs/toy.yaml",)


@pytest.mark.parametrize("entry, says", [
    ({"name": 5, "digest": {"sha256": "0" * 64}}, "subject is not a list of {name: string"),
    ({"name": "src/x.py", "digest": "0" * 64}, "subject is not a list of {name: string"),
    ({"name": "src/x.py", "digest": {"sha256": None}}, "subject is not a list of {name: string"),
    ({"name": "\ud800", "digest": {"sha256": "0" * 64}}, "subject list cannot be canonicalised"),
])
def test_a_self_consistent_receipt_with_a_malformed_subject_is_invalid_not_a_crash(layout, entry, says):
    """Ids and digests recomputed after the edit, so only the entry's shape is wrong."""
    root, specs, receipts = layout
    path = G.write(root, receipts, specs / "toy.yaml")
    data = json.loads(path.read_bytes())
    data["subject"].append(entry)
    pred = data["predicate"]
    try:
        pred["subject_sha256"] = R.hashlib.sha256(R.canonical(data["subject"])).hexdigest()
    except ValueError:
        pass  # no UTF-8 form: the digest stays the old one
    pred["receipt_id"] = R.receipt_id(pred)
    path.chmod(0o644)
    try:
        raw = R.serialize(data)  # the writer's own form, so only the subject entry is wrong
    except ValueError:
        raw = json.dumps(data, indent=2).encode()  # a lone surrogate has no UTF-8 form: escaped
    path.write_bytes(raw)
    a = assess(path, root, specs, display=path.name, folder_method="toy")
    assert a.state in ("invalid", "tampered") and says in a.message, a.message
    res = _invoke("verify", "--specs", str(specs), "--receipts", str(receipts), "--no-cache")
    assert res.exit_code == 1 and says in res.stdout and "Traceback" not in res.output
