"""Hostile text and hostile files: what a spec, a receipt or a file name holds never acts on the terminal.

Whoever writes candidate code can write specs and the receipt store. These tests put
terminal control sequences (OSC 52 writes the clipboard; a C1 CSI; bidi overrides) into
spec titles and receipt file names and check that `validate` refuses them in a spec and
that `show`, `list`, `verify` and `gate` print them escaped, never raw.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.cli as cli
from engine.spec import loader
from engine.text import json_term_safe, term_safe
from tests import gate_support as G

ROOT = Path(__file__).resolve().parent.parent
OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"  # "set the clipboard to 'echo pwned'"
FAKE_LINE = "\r\x1b[2Kfresh    toy:x.json  passed"  # paints over the line before it
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # what must never be printed


def _invoke(*args: str):
    return CliRunner().invoke(cli.app, list(args))


def _raw_controls(text: str) -> list[str]:
    return RAW.findall(text)


@pytest.fixture
def layout(tmp_path, monkeypatch):
    root, specs, receipts = G.toy_project(tmp_path, monkeypatch)
    return root, specs, receipts


@pytest.fixture
def schema_without_text_rules(monkeypatch):
    """The spec schema minus its control-character patterns, so what the printers do is tested by itself
    (a spec that got past validation some other way, e.g. an older engine's cache)."""
    from jsonschema import Draft202012Validator

    schema = copy.deepcopy(loader.spec_schema())  # the loader's own copy is cached for the process
    for name in ("text", "line"):
        schema["$defs"][name].pop("pattern", None)
    schema["properties"]["paper"]["properties"]["first_public"]["pattern"] = "^[0-9]{4}-[0-9]{2}-[0-9]{2}"
    monkeypatch.setattr(loader, "_validator", lambda: Draft202012Validator(schema))


def _hostile_title(specs: Path, title: str) -> Path:
    path = specs / "toy.yaml"
    text = path.read_text().replace('title: "Toy doubling method"', "title: " + json.dumps(title), 1)
    path.write_text(text)
    return path


# --- the helper ---------------------------------------------------------------------------------------


def test_term_safe_escapes_controls_and_bidi_and_keeps_plain_text():
    plain = "max_abs_err ≤ 1e-6 — π, 中文, émigré [bold]x[/]"
    assert term_safe(plain) is plain
    assert term_safe(OSC52) == "\\x1b]52;c;ZWNobyBwd25lZA==\\x07"
    assert term_safe("a\x9b2Jb\x7fc\u202eevil\u2066d") == "a\\x9b2Jb\\x7fc\\u202eevil\\u2066d"
    assert term_safe("one\ntwo\tthree\r") == "one\\ntwo\\tthree\\r"
    assert term_safe("one\ntwo\tthree\r", keep_newlines=True) == "one\ntwo\tthree\\r"
    assert term_safe("bad \udcff name") == "bad \\udcff name"  # a file name that is not UTF-8
    assert _raw_controls(term_safe("".join(map(chr, range(0x00, 0xa0))))) == []


def test_json_term_safe_keeps_the_same_document():
    value = {"name": f"x{OSC52}\x9b\u202e\x7fy", "n": 1}
    text = json_term_safe(json.dumps(value, ensure_ascii=False))
    assert _raw_controls(text) == [] and json.loads(text) == value


# --- validate refuses control characters in a spec -----------------------------------------------------


@pytest.mark.parametrize("title, says", [
    (f"Toy {OSC52} method", "holds the control character \\x1b at offset 4"),
    ("Toy \x9b2J method", "holds the control character \\x9b"),
    ("Toy \u202eevil", "holds the control character \\u202e"),
    ("Toy\nsecond line", "holds the control character \\n"),
])
def test_validate_rejects_control_characters_in_a_title(layout, title, says):
    _, specs, _ = layout
    path = _hostile_title(specs, title)
    res = _invoke("validate", str(path))
    assert res.exit_code == 2, res.output
    (line,) = [ln for ln in res.stderr.splitlines() if "$.title" in ln]
    assert line.startswith("specs/toy.yaml:4:8 $.title ") and says in line and "(fix: " in line
    assert _raw_controls(res.output) == []


def test_validate_allows_line_feeds_and_tabs_in_multi_line_text_only(layout):
    _, specs, _ = layout
    path = specs / "toy.yaml"
    path.write_text(path.read_text().replace("text: doubling is exact in float64",
                                             'text: "doubling is exact\\n\\tin float64"'))
    assert _invoke("validate", str(path)).exit_code == 0
    path.write_text(path.read_text().replace('"doubling is exact\\n\\tin float64"', '"exact\\e]52;c;eA==\\a"'))
    res = _invoke("validate", str(path))
    assert res.exit_code == 2 and "$.assumptions[0].text holds the control character \\x1b" in res.stderr


# --- show, list, verify, gate print hostile text escaped ------------------------------------------------


def test_show_never_prints_a_control_sequence_from_a_spec_title(layout, schema_without_text_rules):
    _, specs, receipts = layout
    _hostile_title(specs, f"Toy {OSC52}{FAKE_LINE} \u202egnp.exe")
    res = _invoke("show", "toy", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 0, res.output
    assert _raw_controls(res.output) == []
    assert "\\x1b]52;c;ZWNobyBwd25lZA==\\x07" in res.stdout and "\\u202egnp.exe" in res.stdout
    as_json = _invoke("show", "toy", "--specs", str(specs), "--receipts", str(receipts), "--json")
    assert _raw_controls(as_json.stdout) == [] and OSC52 in json.loads(as_json.stdout)["spec"]["title"]


def test_show_refuses_a_hostile_spec_in_one_escaped_line(layout):
    _, specs, receipts = layout
    _hostile_title(specs, f"Toy {OSC52}")
    res = _invoke("show", "toy", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 2 and _raw_controls(res.output) == [] and "\\x1b" in res.stderr


def test_list_never_prints_a_control_sequence(layout):
    """`list` prints a receipt's status only once the receipt is verified and schema-valid (status is then one of the
    schema's words), so hostile text in a receipt is never shown, raw or escaped: the row names what is wrong."""
    root, specs, receipts = layout
    good = G.write(root, receipts, specs / "toy.yaml")
    # signed and bound, but its status is no status the schema knows
    G.write(root, receipts, specs / "toy.yaml", status=f"passed{FAKE_LINE}")
    res = _invoke("list", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 0, res.output
    assert _raw_controls(res.output) == [] and "invalid" in res.stdout and "fresh" not in res.stdout, res.stdout
    # forged (the newest, so listed): named tampered
    forged = json.loads(good.read_text())
    forged["predicate"]["created_at"] = f"2099-01-01T00:00:00{OSC52}Z"
    forged["predicate"]["status"] = f"passed{FAKE_LINE}"
    (good.parent / "20990101T000000000000Z_toy_forged.json").write_text(json.dumps(forged))
    res = _invoke("list", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 0, res.output
    assert _raw_controls(res.output) == [] and "tampered" in res.stdout and "fresh" not in res.stdout, res.stdout
    as_json = _invoke("list", "--specs", str(specs), "--receipts", str(receipts), "--json")
    assert _raw_controls(as_json.stdout) == []


def test_the_check_summary_escapes_receipt_text(capsys):
    from engine.cli.check_report import _print_summary

    hostile = f"x{OSC52}"
    pred = {"method": "toy", "status": "failed", "environment": {"device": {"name": hostile}},
            "results": [{"contract": "c1", "kind": "value", "seed": 1, "dtype": "float32", "status": "error",
                         "expectations": [], "message": hostile}],
            "summary": {"contracts": {"c1": {"passed": 0, "requested": 1, "failed": 0, "error": 1}},
                        "mutants": {"killed": 0, "survived": 1}},
            "contracts_proven": {}, "unproven_contracts": ["c1"], "errors": [hostile],
            "mutants": [{"id": "m", "killed": False, "description": hostile, "expected_killers": ["c1"]}],
            "cost": {"wall_s": 1.0, "optimizer_updates": 0, "sampled_tokens": 0}}
    _print_summary(pred, f"receipts/toy/{hostile}.json")
    out, err = capsys.readouterr()
    assert _raw_controls(out + err) == [] and out.count("\\x1b]52") >= 2 and err.count("\\x1b]52") >= 2


def _hostile_file_names(root: Path, specs: Path, receipts: Path) -> list[str]:
    good = G.write(root, receipts, specs / "toy.yaml")
    names = [f"20990101T000000000000Z_{OSC52}.json", f"20990101T000000000001Z_{FAKE_LINE}.json",
             "20990101T000000000002Z_\x9b2J_\u202enosj.json"]
    for n in names:
        (good.parent / n).write_bytes(good.read_bytes())  # a copy: intact, fresh, but not under its own name
    (good.parent / f"{OSC52}.json").write_text("{not json")
    return names


def test_verify_never_prints_a_control_sequence_from_a_file_name(layout):
    root, specs, receipts = layout
    _hostile_file_names(root, specs, receipts)
    res = _invoke("verify", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code in (0, 1), res.output
    assert _raw_controls(res.output) == []
    assert "\\x1b]52;c;ZWNobyBwd25lZA==\\x07" in res.stdout and "\\r\\x1b[2Kfresh" in res.stdout
    as_json = _invoke("verify", "--specs", str(specs), "--receipts", str(receipts), "--json")
    assert _raw_controls(as_json.stdout) == []
    files = {r["file"] for r in json.loads(as_json.stdout)["receipts"]}
    assert f"receipts/toy/{OSC52}.json" in files  # JSON keeps the name exactly, escaped as JSON escapes it


def test_gate_never_prints_a_control_sequence_from_a_file_name(layout):
    root, specs, receipts = layout
    _hostile_file_names(root, specs, receipts)
    res = _invoke("gate", "toy", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 1, res.output
    assert _raw_controls(res.output) == [] and "warning: invalid receipt receipts/toy/\\x1b]52;c;" in res.stdout
    as_json = _invoke("gate", "toy", "--specs", str(specs), "--receipts", str(receipts), "--json")
    assert _raw_controls(as_json.stdout) == []
    assert any(OSC52 in w for w in json.loads(as_json.stdout)["warnings"])


def test_messages_and_lines_are_escaped(layout, capsys):
    _, specs, receipts = layout
    res = _invoke("demote", "toy", "--reason", "no", "--specs", str(specs), "--receipts", str(receipts))
    assert res.exit_code == 0 and "already not-promoted" in res.stderr
    from engine.cli import common

    common._err(f"x {OSC52}")
    common._out(f"y {OSC52}")
    out, err = capsys.readouterr()
    assert out == "y \\x1b]52;c;ZWNobyBwd25lZA==\\x07\n" and err == "x \\x1b]52;c;ZWNobyBwd25lZA==\\x07\n"


def test_the_pytest_plugin_escapes_receipt_text():
    from engine.pytest_plugin import _result_line

    line = _result_line({"seed": 1, "dtype": "float32", "status": "error", "expectations": [],
                         "message": f"boom {OSC52}"})
    assert _raw_controls(line) == [] and "\\x1b]52" in line


# --- a closed pipe ends quietly -------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["gate", "mrtpo"], ["list"], ["gate", "mrtpo", "--json"], ["show", "mrtpo"]])
def test_writing_into_a_closed_pipe_exits_quietly(tmp_path, args):
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", *args, "--receipts", str(tmp_path)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line (`| head -0`)
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "internal error" not in err and "Traceback" not in err and "BrokenPipe" not in err, err
    assert proc.returncode == 1, (proc.returncode, err)


# --- git ignores the promotion lock ----------------------------------------------------------------------


def test_the_promotion_lock_is_git_ignored():
    from engine.store.locking import PROMOTION_LOCK

    res = subprocess.run(["git", "check-ignore", "-q", f"receipts/{PROMOTION_LOCK}"], cwd=ROOT)
    if res.returncode == 128:
        pytest.skip("not a git checkout")
    assert res.returncode == 0, "receipts/.promotion.lock is not in .gitignore"
