"""The pytest plugin: contracts as test items, JUnit properties, and the receipt `contracts check` writes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.harness import without_keys
from engine.cli import app
from engine.store.receipts import check_receipt, receipt_files
from engine.spec.loader import load_spec

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "tapo-trajectory.yaml"
ISOLATE = ("-p", "no:textual-snapshot", "-p", "no:cacheprovider")
# input_validation and the two mutants only it kills: what `check --only input_validation` runs (a selected mutant
# brings in every contract that kills it, so the contract's mutants must be its alone), about a second
FAST = "input_validation or inner_updates_unchecked or ratio_mask_bool_only"


def plugin_args() -> list[str]:
    """`-p engine.pytest_plugin` unless the pytest11 entry point already loads it (loading it twice is an error)."""
    for ep in metadata.entry_points(group="pytest11"):
        if ep.value == "engine.pytest_plugin":
            return []
    return ["-p", "engine.pytest_plugin"]


@pytest.fixture
def project(pytester):
    """A folder with specs/tapo-trajectory.yaml (a copy), where pytest runs."""
    (pytester.path / "specs").mkdir()
    shutil.copy(SPEC, pytester.path / "specs" / SPEC.name)
    return pytester


def run(pytester, *args: str):
    receipts = pytester.path / "receipts"
    # In process (torch is already imported: fast); the snapshot plugin's session hooks share global state.
    return pytester.runpytest_inprocess(*plugin_args(), *ISOLATE, "--contracts-receipts", str(receipts),
                                        *args), receipts


def only_receipt(receipts: Path) -> dict:
    (path,) = receipt_files(receipts, "tapo-trajectory")
    return json.loads(path.read_text())


def test_importing_the_plugin_imports_no_torch():
    code = "import sys, engine.pytest_plugin; assert 'torch' not in sys.modules, 'torch imported'"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_without_contracts_the_plugin_collects_nothing_and_imports_no_torch(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "broken.yaml").write_text("spec_version: [\n")  # would be a collection error
    (tmp_path / "test_plain.py").write_text("import sys\n\ndef test_plain():\n    assert 'torch' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-m", "pytest", *plugin_args(), "-q", "-p", "no:cacheprovider", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed" in r.stdout


def test_contracts_run_in_this_process_even_when_workers_are_asked_for(project):
    """xdist workers would each write a partial receipt: with --contracts, `-n 2` starts none."""
    pytest.importorskip("xdist")
    # what `-n 2` becomes before configure (xdist's pytest_cmdline_main, which parseconfigure does not call)
    args = (*plugin_args(), *ISOLATE, "--dist", "load", "--tx", "2*popen", "--contracts-receipts",
            str(project.path / "receipts"))
    plain = project.parseconfigure(*args)
    assert plain.pluginmanager.getplugin("dsession") is not None  # without --contracts, xdist distributes
    config = project.parseconfigure(*args, "--contracts", "specs/")
    assert config.pluginmanager.getplugin("dsession") is None and config.option.dist == "no"


def test_one_item_per_contract_and_per_mutant_at_the_spec_line(project):
    r, _ = run(project, "--contracts", "--collect-only", "-q", "specs/")
    spec = load_spec(SPEC)
    want = [f"specs/{SPEC.name}::{c['id']}" for c in spec.data["contracts"]]
    want += [f"specs/{SPEC.name}::mutant[{m['id']}]" for m in spec.data["mutants"]]
    got = [line for line in r.outlines if "::" in line]
    assert got == want
    items, _ = project.inline_genitems(*plugin_args(), *ISOLATE, "--contracts", "specs/")
    i = [c["id"] for c in spec.data["contracts"]].index("eq15_local_gradient")
    line = spec.locate(["contracts", i])[0]
    (item,) = [it for it in items if it.name == "eq15_local_gradient"]
    assert item.location == (f"specs/{SPEC.name}", line - 1, "eq15_local_gradient")
    assert project.path.joinpath("specs", SPEC.name).read_text().splitlines()[line - 1].lstrip().startswith(
        "- id: eq15_local_gradient")


def test_junit_has_a_case_per_item_with_measurements_as_properties_and_the_receipt_matches(project):
    junit = project.path / "report.xml"
    r, receipts = run(project, "--contracts", "specs/", "-k", FAST, "--contracts-seeds", "42,43",
                      f"--junitxml={junit}")
    r.assert_outcomes(passed=3)
    cases = {c.get("name"): c for c in ET.parse(junit).getroot().iter("testcase")}
    assert set(cases) == {"input_validation", "mutant[inner_updates_unchecked]", "mutant[ratio_mask_bool_only]"}
    props = {p.get("name"): p.get("value") for p in cases["input_validation"].iter("property")}
    stmt = only_receipt(receipts)
    pred = stmt["predicate"]
    assert pred["status"] == "passed" and pred["request"]["seeds"] == [42, 43]
    assert len(pred["results"]) == 4  # 2 seeds x 2 dtypes
    for res in pred["results"]:
        key = f"{res['seed']}/{res['dtype']}"
        assert props[f"{key}/status"] == "passed"
        for metric, value in res["measurements"].items():
            assert props[f"{key}/{metric}"] == str(value)
    killed = {c: {p.get("name"): p.get("value") for p in cases[c].iter("property")}["killed"]
              for c in cases if c.startswith("mutant[")}
    assert killed == {"mutant[inner_updates_unchecked]": "True", "mutant[ratio_mask_bool_only]": "True"}
    assert [m["id"] for m in pred["mutants"]] == ["inner_updates_unchecked", "ratio_mask_bool_only"]
    (path,) = receipt_files(receipts, "tapo-trajectory")
    assert check_receipt(path, ROOT, project.path / "specs").state == "fresh"
    assert "contracts receipts" in r.stdout.str() and path.name in r.stdout.str()


def test_the_plugin_writes_the_receipt_contracts_check_writes(project, tmp_path):
    def check(store: Path):
        c = CliRunner().invoke(app, ["check", "tapo-trajectory", "--only", "input_validation", "--seeds",
                                     "42", "--specs", str(project.path / "specs"), "--receipts", str(store)])
        assert c.exit_code == 0, c.output

    # A receipt binds the checkout modules its process has imported (engine/run/binding.py), and `check` imports
    # some the plugin does not: one `check` first puts this process where both runs below find it, whatever ran
    # in it before (this test alone, or early in an xdist worker, would otherwise compare different states).
    check(tmp_path / "warm")
    r, receipts = run(project, "--contracts", "specs/", "-k", FAST, "--contracts-seeds", "42")
    r.assert_outcomes(passed=3)
    plugin = only_receipt(receipts)
    cli_store = tmp_path / "cli"
    check(cli_store)
    cli = only_receipt(cli_store)
    assert plugin["subject"] == cli["subject"]

    def comparable(pred: dict) -> dict:
        return without_keys(pred, {"receipt_id", "created_at", "finished_at", "cost", "wall_s"})

    assert comparable(plugin["predicate"]) == comparable(cli["predicate"])


def _failing_spec(project) -> int:
    """Make clip_schedule's float64 max_abs_err bound impossible; return that contract's spec line."""
    path = project.path / "specs" / SPEC.name
    text = path.read_text()
    old = "      - {metric: max_abs_err, dtype: float64, le: 1.0e-12}\n"
    assert text.count(old) == 1
    path.write_text(text.replace(old, "      - {metric: max_abs_err, dtype: float64, le: 1.0e-30}\n"))
    spec = load_spec(path)
    return spec.locate(["contracts", [c["id"] for c in spec.data["contracts"]].index("clip_schedule")])[0]


def test_a_failing_contract_shows_measured_against_the_limit_and_headroom(project):
    line = _failing_spec(project)
    junit = project.path / "report.xml"
    r, receipts = run(project, "--contracts", "specs/", "-k", "clip_schedule", "--contracts-seeds", "42",
                      f"--junitxml={junit}")
    r.assert_outcomes(failed=1)
    out = r.stdout.str()
    assert f"specs/{SPEC.name}:{line}: contract clip_schedule (value) did not hold" in out
    assert "seed x dtype cells failed" in out
    assert "seed 42 float64: failed: max_abs_err " in out
    assert "> limit 1e-30 (tolerance from spec, headroom 10^-" in out
    assert "<= 1e-30" not in out  # a failure never reads like a true statement
    (case,) = ET.parse(junit).getroot().iter("testcase")
    assert "> limit 1e-30" in case.find("failure").get("message")
    pred = only_receipt(receipts)["predicate"]
    assert pred["status"] == "failed"
    bad = [x for x in pred["results"] if x["status"] != "passed"]
    assert [(x["seed"], x["dtype"]) for x in bad] == [(42, "float64")]


def test_stopping_early_writes_an_interrupted_receipt(project):
    _failing_spec(project)
    r, receipts = run(project, "--contracts", "specs/", "-x", "-k", "clip_schedule or zero_adv",
                      "--contracts-seeds", "42")
    r.assert_outcomes(failed=1)
    pred = only_receipt(receipts)["predicate"]
    assert pred["status"] == "interrupted"
    assert any("pytest ended before" in e for e in pred["errors"])


def test_green_items_cannot_hide_a_failed_receipt(project):
    # clip_reversed brings in its killers; no selected mutant kills zero_advantage_rejection, so it is unproven.
    r, receipts = run(project, "--contracts", "specs/", "-k", "zero_advantage_rejection or clip_reversed",
                      "--contracts-seeds", "42")
    r.assert_outcomes(passed=2, errors=1)
    assert "contract zero_advantage_rejection was not shown to fail by any selected mutant" in r.stdout.str()
    assert only_receipt(receipts)["predicate"]["status"] == "failed"


def test_a_broken_spec_is_a_collection_error_with_its_line(project):
    (project.path / "specs" / "broken.yaml").write_text("spec_version: 1\nmethod: broken\ntitle: [\n")
    r, _ = run(project, "--contracts", "--collect-only", "specs/")
    assert r.ret != 0
    assert "specs/broken.yaml:" in r.stdout.str() and "YAML" in r.stdout.str()


def test_bad_options_are_usage_errors(project):
    r, _ = run(project, "--contracts", "--contracts-seeds", "x", "specs/")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    assert "--contracts-seeds 'x'" in r.stderr.str()
    r, _ = run(project, "--contracts", "--contracts-policy", "hf:Qwen/Qwen2.5-0.5B", "specs/")
    assert r.ret == pytest.ExitCode.USAGE_ERROR and "huggingface-cli download Qwen/Qwen2.5-0.5B" in r.stderr.str()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_stops_before_collection(project):
    r, _ = run(project, "--contracts", "--contracts-device", "cuda", "specs/")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    assert "no silent fallback" in r.stderr.str()


def test_contracts_alone_collects_the_specs_folder(project, monkeypatch):
    monkeypatch.setenv("CONTRACTS_SPECS", str(project.path / "specs"))  # what default_specs_dir() reads first
    (project.path / "test_other.py").write_text("def test_other():\n    pass\n")
    r, _ = run(project, "--contracts", "--collect-only", "-q")
    ids = [line for line in r.outlines if "::" in line]
    assert ids and all(i.startswith(f"specs/{SPEC.name}::") for i in ids)


def test_contracts_sign_key_writes_a_signed_receipt_and_a_bad_key_stops_before_any_check(project, tmp_path):
    from engine.store import signing
    from engine.store.receipts import load_receipt

    key = tmp_path / "keys" / "runner"
    key.parent.mkdir()
    kid = signing.generate(key)
    r, receipts = run(project, "--contracts", "specs/", "-k", FAST, "--contracts-seeds", "42",
                      "--contracts-sign-key", str(key))
    r.assert_outcomes(passed=3)
    (path,) = receipt_files(receipts, "tapo-trajectory")
    env = json.loads(path.read_text())
    assert signing.is_envelope(env) and [s["keyid"] for s in env["signatures"]] == [kid]
    stmt, raw, sigs = load_receipt(path, with_signatures=True)
    pub = signing.load_public_pem(key.with_name("runner.pub").read_bytes(), "runner.pub")
    assert signing.verify_signatures(raw, sigs, {kid: pub}) == (kid, "")
    bad = tmp_path / "keys" / "bad"
    bad.write_text("not a key\n")
    r, receipts = run(project, "--contracts", "specs/", "-k", FAST, "--contracts-sign-key", str(bad))
    assert r.ret != 0 and "--contracts-sign-key" in "\n".join(r.errlines + r.outlines)
    assert len(receipt_files(receipts, "tapo-trajectory")) == 1  # nothing new written
