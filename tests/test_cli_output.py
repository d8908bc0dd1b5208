"""What the CLI prints for people and pipelines: coverage beside every verdict, tables that fit 80 columns without
cutting a method key or contract id, one path convention, published check/list schemas, invalid specs that stay
visible, every spec error, a missing store, clean help and capped stale warnings."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from engine.cli import app
from engine.spec.loader import spec_files
from tests import gate_support as G

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "tapo-trajectory.yaml"
KEYS = [p.stem for p in spec_files(ROOT / "specs")]


def invoke(*args: str, columns: int | None = None):
    env = {"COLUMNS": str(columns)} if columns else {}
    return CliRunner().invoke(app, list(args), env=env)


def _schema(name: str) -> dict:
    r = invoke("schema", name)
    assert r.exit_code == 0, r.output
    schema = json.loads(r.stdout)
    Draft202012Validator.check_schema(schema)
    return schema


@pytest.fixture(scope="module")
def partial_store(tmp_path_factory):
    """Two real partial runs of TAPO on one seed: --only one contract, and every contract with --no-mutants."""
    store = tmp_path_factory.mktemp("partial") / "receipts"
    only = invoke("check", "tapo-trajectory", "--only", "clip_schedule", "--seeds", "42", "--receipts", str(store),
                  "--json")
    assert only.exit_code == 0, only.output
    text = invoke("check", "tapo-trajectory", "--only", "clip_schedule", "--seeds", "42", "--receipts", str(store),
                  columns=80)
    assert text.exit_code == 0, text.output
    return store, json.loads(only.stdout), text


# --- coverage ---------------------------------------------------------------------------------------------------


def test_a_partial_run_never_reads_like_a_full_pass(partial_store):
    store, doc, text = partial_store
    total = len(json.loads(invoke("show", "tapo-trajectory", "--json").stdout)["spec"]["contracts"])
    (run,) = doc["runs"]
    assert run["status"] == "passed" and run["coverage"] == {
        "full": False, "label": f"partial 1/{total}", "ran": 1, "total": total,
        "why": ["--only clip_schedule", "seeds 42 of the budget's 42,43,44"]}
    assert text.stdout.splitlines()[0].startswith(f"tapo-trajectory on cpu: PASSED (partial 1/{total}: --only")
    listed = invoke("list", "--receipts", str(store))
    lines = listed.stdout.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("tapo-trajectory"))
    # wide: "passed (partial 1/N, fresh) ..."; below 110 columns the cell takes two lines: "passed (partial 1/N)"
    # over "fresh, DATE"
    assert f"passed (partial 1/{total}, fresh)" in lines[i] or (
        f"passed (partial 1/{total})" in lines[i] and "fresh, " in lines[i + 1]), listed.stdout
    verified = invoke("verify", "tapo-trajectory", "--receipts", str(store))
    lines = [ln for ln in verified.stdout.splitlines() if ln.startswith("fresh")]
    assert len(lines) == 2 and all(f"passed, partial 1/{total}: --only clip_schedule; seeds 42" in ln for ln in lines)
    as_json = json.loads(invoke("verify", "tapo-trajectory", "--receipts", str(store), "--json").stdout)
    assert {r["coverage"]["label"] for r in as_json["receipts"]} == {f"partial 1/{total}"}


def test_check_all_counts_the_partial_receipts(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / SPEC.name).write_text(SPEC.read_text())
    r = invoke("check", "--all", "--seeds", "42", "--no-mutants", "--specs", str(specs), "--receipts",
               str(tmp_path / "r"))
    assert r.exit_code == 0, r.output  # it passed what it ran, and says it is partial
    assert r.stdout.rstrip().splitlines()[-1] == "checked 1 method: 1 passed, 0 failed; 1 receipt written (1 partial)"
    total = len(json.loads(invoke("show", "tapo-trajectory", "--json").stdout)["spec"]["contracts"])
    flat = " ".join(r.stdout.split())  # the table title, however the width wrapped it
    assert f"PASSED (partial {total}/{total}: --no-mutants; seeds 42 of the budget's 42,43,44)" in flat, r.stdout


@pytest.mark.parametrize("columns", ["80", "200"])
def test_an_interrupted_run_names_no_contract_that_never_ran(capsys, monkeypatch, columns):
    from engine.cli.check_report import _print_summary

    monkeypatch.setenv("COLUMNS", columns)  # both layouts: narrow (no error column) and wide

    pred = G.predicate(ROOT / "specs" / "tapo-trajectory.yaml", status="interrupted")
    pred["summary"] = {"contracts": {"double-value": {"passed": 6, "failed": 0, "error": 0, "requested": 6},
                                     "mechanism": {"passed": 0, "failed": 0, "error": 0, "requested": 3}},
                       "results": {}, "mutants": {"killed": 0, "survived": 0}}
    pred["results"] = [r for r in pred["results"] if r["contract"] == "double-value"]
    pred["mutants"], pred["unproven_contracts"], pred["contracts_proven"] = [], ["double-value", "mechanism"], {}
    pred["request"]["mutants"], pred["actual"]["mutants_run"] = ["off-by-a-bit"], 0
    pred["cost"] = {"wall_s": 1.0, "optimizer_updates": 0, "sampled_tokens": 0}
    _print_summary(pred, "receipts/x.json")
    out, err = capsys.readouterr()
    assert "INTERRUPTED (partial 1/2: interrupted after 1 of 2 contracts)" in " ".join(out.split())
    # a summary written before tiers (no tier) reads as maths
    row = r"^mechanism\s+math\s+0/3\s+0\s+not run\s+0$" if columns == "80" else \
        r"^mechanism\s+math\s+0/3\s+0\s+0\s+not run\s+-"
    assert re.search(row, out, re.M), out
    assert "UNPROVEN" not in err and "never ran, so nothing is said about them" in " ".join(err.split())  # wrapped at 80


# --- 80 columns -------------------------------------------------------------------------------------------------


def _widths(text: str) -> int:
    return max((len(ln.rstrip()) for ln in text.splitlines()), default=0)


def test_list_fits_80_columns_and_never_cuts_a_method_key(partial_store):
    store, _, _ = partial_store
    r = invoke("list", "--receipts", str(store), columns=80)
    assert r.exit_code == 0, r.output
    assert _widths(r.stdout) <= 80, r.stdout
    starts = [ln.split()[0] for ln in r.stdout.splitlines()[3:] if ln and not ln.startswith(" ")]
    assert starts == KEYS, r.stdout  # whole, at the start of their row: what you type next
    wide = invoke("list", "--receipts", str(store), columns=160)
    assert "contracts" in wide.stdout.splitlines()[1] and _widths(wide.stdout) <= 160


def test_the_check_table_fits_80_columns_with_every_contract_id_whole(capsys, monkeypatch):
    from engine.cli.check_report import _print_summary

    ids = ["fps_rejects_invalid_vectors", "student_sees_verifier_block", "zero_advantage_rejection"]
    killers = ["weights_not_divided_by_qbar", "prefix_ratio_cumsum_unmasked", "clip_schedule_reversed_ends"]
    pred = G.predicate(ROOT / "specs" / "tapo-trajectory.yaml")
    pred["results"] = [dict(pred["results"][0], contract=c, kind="negative-control") for c in ids]
    pred["summary"] = {"contracts": {c: {"passed": 1, "failed": 0, "error": 0, "requested": 1} for c in ids},
                       "results": {}, "mutants": {"killed": 3, "survived": 0}}
    pred["contracts_proven"] = {c: killers for c in ids}
    pred["cost"] = {"wall_s": 1.0, "optimizer_updates": 0, "sampled_tokens": 0}
    for columns, named in ((80, False), (200, True)):
        monkeypatch.setenv("COLUMNS", str(columns))
        _print_summary(pred, "receipts/x.json")
        table = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("wall ")]
        assert max(len(ln.rstrip()) for ln in table) <= columns, table
        assert [ln.split()[0] for ln in table if ln.split() and ln.split()[0] in ids] == ids, table
        # at 80 columns the killers are counted (their ids would not fit), at 200 named in full; nothing is
        # cropped away at the right edge either way
        rows = [ln.rstrip() for ln in table if ln.split() and ln.split()[0] in ids]
        assert all(ln.endswith(", ".join(killers) if named else " 3") for ln in rows), table
        assert "mutants" in "\n".join(table[1:3])


# --- paths ------------------------------------------------------------------------------------------------------


def test_paths_outside_the_working_directory_are_printed_whole(tmp_path, partial_store):
    store, doc, text = partial_store
    receipt = Path(doc["runs"][0]["receipt"])
    assert receipt.is_absolute() and receipt.is_file() and receipt.parent.parent == store  # not a base name
    assert text.stdout.rstrip().endswith(f"receipt {text.stdout.rstrip().rsplit('receipt ', 1)[1]}")
    listed = json.loads(invoke("list", "--receipts", str(store), "--json").stdout)
    files = {m["method"]: m["latest_receipt"] and m["latest_receipt"]["file"] for m in listed["methods"]}
    assert Path(files["tapo-trajectory"]).parent == store / "tapo-trajectory"
    verified = json.loads(invoke("verify", "--receipts", str(store), "--json").stdout)
    assert {str(Path(r["file"]).parent) for r in verified["receipts"]} == {str(store / "tapo-trajectory")}
    assert verified["ledger"]["file"] == str(store / "ledger.jsonl")
    gate = json.loads(invoke("gate", "tapo-trajectory", "--receipts", str(store), "--json").stdout)
    assert gate["store"] == str(store)
    bad = tmp_path / "specs"
    bad.mkdir()
    (bad / SPEC.name).write_text(SPEC.read_text().replace("level: L1", "level: L9"))
    r = invoke("validate", str(bad / SPEC.name))
    assert r.stderr.startswith(f"{bad / SPEC.name}:"), r.stderr  # was cut to "tapo-trajectory.yaml:"


def test_inside_the_working_directory_paths_are_relative(partial_store, monkeypatch):
    store, _, _ = partial_store
    monkeypatch.chdir(store.parent)
    listed = json.loads(invoke("list", "--receipts", "receipts", "--json").stdout)
    tapo = next(m for m in listed["methods"] if m["method"] == "tapo-trajectory")
    assert tapo["latest_receipt"]["file"].startswith("receipts/tapo-trajectory/")


# --- schemas ----------------------------------------------------------------------------------------------------


def test_check_and_list_json_match_their_published_schemas(partial_store):
    store, doc, _ = partial_store
    check_schema, list_schema = _schema("check"), _schema("list")
    assert doc["schema"] == "paper-contracts/check/v1" and doc["schema_version"] == 1
    Draft202012Validator(check_schema).validate(doc)
    listed = json.loads(invoke("list", "--receipts", str(store), "--json").stdout)
    assert listed["schema"] == "paper-contracts/list/v1" and listed["schema_version"] == 1
    Draft202012Validator(list_schema).validate(listed)
    broken = dict(listed, schema_version=2)
    assert list(Draft202012Validator(list_schema).iter_errors(broken))  # the schema can fail
    no_cov = json.loads(json.dumps(doc))
    del no_cov["runs"][0]["coverage"]
    assert list(Draft202012Validator(check_schema).iter_errors(no_cov))


# --- specs ------------------------------------------------------------------------------------------------------


def _two_errors(specs: Path) -> Path:
    text = SPEC.read_text().replace("level: L1", "level: L9")
    old = "{metric: max_rel_err, dtype: float32, le: 1.0e-5}"
    assert old in text
    (specs / SPEC.name).write_text(text.replace(old, '{metric: max_rel_err, dtype: float32, le: "tiny"}', 1))
    return specs / SPEC.name


def test_a_broken_spec_stays_in_list_as_invalid_with_its_first_error(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    for key in KEYS:
        (specs / f"{key}.yaml").write_text((ROOT / "specs" / f"{key}.yaml").read_text())
    path = _two_errors(specs)
    (tmp_path / "r").mkdir()  # an empty store (a missing one is exit 2 before any spec is read)
    r = invoke("list", "--specs", str(specs), "--receipts", str(tmp_path / "r"), columns=80)
    assert r.exit_code == 2
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("tapo-trajectory"))
    assert "invalid spec" in row and "invalid spec(s)" in r.stdout.splitlines()[0]
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"invalid spec tapo-trajectory: {path}:") and "$.level" in line
    assert line.endswith(f"(+1 more: contracts validate {path})")
    doc = json.loads(invoke("list", "--specs", str(specs), "--receipts", str(tmp_path / "r"), "--json").stdout)
    Draft202012Validator(_schema("list")).validate(doc)
    assert doc["invalid"] == [{"method": "tapo-trajectory", "file": str(path), "first_error": line.split(": ", 1)[1]
                               .rsplit(" (+1 more", 1)[0], "errors": 2}]


def test_check_reports_every_spec_error(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    _two_errors(specs)
    r = invoke("check", "tapo-trajectory", "--specs", str(specs), "--receipts", str(tmp_path / "r"))
    assert r.exit_code == 2 and not (tmp_path / "r").exists()
    lines = r.stderr.splitlines()
    assert [ln.split(" ", 2)[2].split(" ", 1)[0] for ln in lines[:2]] == ["$.level",
                                                                          "$.contracts[0].expect[1].le"], lines
    assert lines[2] == "2 spec errors; nothing was run"


# --- verify, help, warnings -------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", [["verify"], ["list"], ["list", "--json"], ["show", "mrtpo"], ["gate", "mrtpo"],
                                  ["gate", "mrtpo", "--json"], ["tui", "--json"]])
def test_every_reading_verb_on_a_store_that_does_not_exist_exits_2_with_one_line(tmp_path, verb):
    r = invoke(*verb, "--receipts", str(tmp_path / "nonexistent"))
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [f"error: no receipt store at {tmp_path / 'nonexistent'}: not a folder (give "
                                     "--receipts DIR of an existing store; contracts check creates one)"]


def _verbs(group, path=()):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _verbs(cmd, (*path, name))
        else:
            yield (*path, name)


def test_help_names_values_not_python_types_and_fits_80_columns():
    import typer.main

    verbs = list(_verbs(typer.main.get_command(app)))
    assert len(verbs) >= 14
    for verb in [(), *verbs]:
        r = invoke(*verb, "--help", columns=80)
        assert r.exit_code == 0, (verb, r.output)
        for bad in ("<bool>", "<str>", "<int>", "<path>", "<list", "{method}", "list[", "[method]"):
            assert bad not in r.stdout, (verb, bad, r.stdout)
        assert _widths(r.stdout) <= 80, (verb, r.stdout)
    check = invoke("check", "--help").stdout
    assert "Usage: contracts check [OPTIONS] [METHOD]" in check and "--only CONTRACT" in check
    assert re.search(r"^  --all\s+Check every spec\.", check, re.M)  # a flag takes no value
    assert "the [ray] extra" in check  # help text is shown as written, brackets and all
    assert "Usage: contracts show [OPTIONS] METHOD\n" in invoke("show", "--help").stdout


def test_many_stale_receipts_are_one_warning_with_a_count(tmp_path, monkeypatch):
    from engine.spec import registry

    monkeypatch.setattr(registry, "_STATIC", G.TOY_NAMES)
    root, specs, receipts = G.make_layout(tmp_path)
    monkeypatch.setattr("engine.paths.project_root", lambda: root)
    for _ in range(9):
        G.write(root, receipts, specs / "toy.yaml")
    (root / "src" / "toy.py").write_text("# edited: every receipt binding it is stale now\n")
    doc = json.loads(invoke("gate", "toy", "--specs", str(specs), "--receipts", str(receipts), "--json").stdout)
    stale = [w for w in doc["warnings"] if "stale receipt" in w]
    assert len(doc["receipts"]["stale"]) == 9 and len(stale) == 1
    assert stale[0].startswith("9 stale receipts do not count (the newest, receipts/toy/")
    assert "changed: src/toy.py" in stale[0] and stale[0].endswith("names each")
