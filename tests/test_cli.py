"""The CLI end to end: exit codes, receipts, JSON output, and torch-free reads."""

from __future__ import annotations

import getpass
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from engine.cli import app
from tests.store_sample import copy_sample

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One full CPU check of TAPO with the budget's three seeds, shared by the tests below."""
    store = tmp_path_factory.mktemp("receipts")
    r = invoke("check", "tapo-trajectory", "--device", "cpu", "--seeds", "42,43,44", "--receipts", str(store),
               "--json")
    return r, store


def test_full_check_passes_and_writes_one_complete_receipt(full_run):
    r, store = full_run
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    (run,) = out["runs"]
    assert run["status"] == "passed"
    files = list((store / "tapo-trajectory").glob("*.json"))
    assert len(files) == 1
    stmt = json.loads(files[0].read_text())
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    names = {s["name"] for s in stmt["subject"]}
    assert "specs/tapo-trajectory.yaml" in names and "methods/tapo/objective.py" in names
    assert "engine/run/runner.py" in names and "methods/common/rollout.py" in names
    p = stmt["predicate"]
    for key in ("receipt_id", "method", "git", "environment", "request", "actual", "results", "mutants",
                "mechanism", "budget", "cost", "status", "created_at"):
        assert key in p, key
    assert p["request"]["seeds"] == [42, 43, 44] and p["actual"]["seeds"] == [42, 43, 44]
    assert p["environment"]["device"]["kind"] == "cpu" and p["environment"]["device"]["cuda"] is None
    contracts = {c["id"] for c in json.loads(invoke("show", "tapo-trajectory", "--json").stdout)["spec"]["contracts"]}
    seen = {(x["contract"], x["seed"]) for x in p["results"] if x["status"] == "passed"}
    assert seen == {(c, s) for c in contracts for s in (42, 43, 44)}
    assert all(m["killed"] for m in p["mutants"]) and len(p["mutants"]) >= 4
    assert p["unproven_contracts"] == []
    # each result records its contract's tier; the summary counts the tiers apart (TAPO has no budget contract)
    tiers = {c["id"]: c["tier"] for c in json.loads(invoke("show", "tapo-trajectory", "--json").stdout)["spec"]["contracts"]}
    assert all(x["tier"] == tiers[x["contract"]] for x in p["results"])
    n = {t: sum(1 for x in tiers.values() if x == t) for t in ("math", "budget", "scale")}
    assert n["scale"] >= 2 and n["budget"] == 0
    assert p["summary"]["tiers"] == {t: {"contracts": n[t], "held": n[t], "failed": 0, "other": 0}
                                     for t in ("math", "budget", "scale")}
    one = p["results"][0]
    for key in ("measurements", "expectations", "status", "dtype", "seed", "cases_requested"):
        assert key in one
    e = one["expectations"][0]
    assert {"threshold", "tolerance_source", "margin", "value", "passed"} <= set(e)
    mech = [m for m in p["mechanism"] if m["contract"] == "mechanism"]
    assert len(mech) == 3 and all(m["steps"] for m in mech)
    assert p["cost"]["optimizer_updates"] > 0


def test_receipt_holds_no_paths_hosts_or_users(full_run):
    _, store = full_run
    text = next((store / "tapo-trajectory").glob("*.json")).read_text()
    assert str(ROOT) not in text and str(Path.home()) not in text and str(store) not in text
    assert f'"{socket.gethostname()}"' not in text
    user = getpass.getuser()
    assert f'"{user}"' not in text and f"/{user}/" not in text


def test_second_run_adds_a_receipt_and_leaves_the_first_byte_identical(tmp_path):
    args = ("check", "tapo-trajectory", "--only", "clip_schedule", "--receipts", str(tmp_path))
    assert invoke(*args).exit_code == 0
    (first,) = list((tmp_path / "tapo-trajectory").glob("*.json"))
    before = first.read_bytes()
    assert invoke(*args).exit_code == 0
    assert len(list((tmp_path / "tapo-trajectory").glob("*.json"))) == 2
    assert first.read_bytes() == before


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_exits_4_with_one_line_and_writes_nothing(tmp_path):
    store = tmp_path / "store"
    r = invoke("check", "tapo-trajectory", "--device", "cuda", "--receipts", str(store))
    assert r.exit_code == 4
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "CUDA" in lines[0] and "no silent fallback" in lines[0]
    assert not store.exists()


@pytest.mark.parametrize("args, code, words", [
    (("check", "tapo-trajectory", "--device", "tpu"), 2, "not a device"),
    (("check", "tapo-trajectory", "--seeds", "1,2,3,4,5,6"), 2, "max_seeds"),
    (("check", "tapo-trajectory", "--seeds", "4x"), 2, "comma-separated"),
    (("check", "no-such-method"), 2, "valid methods: cispo, dapo, dr-grpo, gmpo, gpg, grpo, gspo, mrtpo, tapo-trajectory"),
    (("check", "../etc/passwd"), 2, "not a method key"),
    (("check", "tapo-trajectory", "--only", "nope"), 2, "valid contracts"),
    (("check",), 2, "name a method"),
    (("check", "tapo-trajectory", "--threads", "0"), 2, "--threads 0"),
    (("show", "no-such-method"), 2, "valid methods"),
])
def test_usage_errors_are_one_line_with_exit_2(args, code, words, tmp_path):
    r = invoke(*args, "--receipts", str(tmp_path)) if args[0] == "check" else invoke(*args)
    assert r.exit_code == code, r.output
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, code", [
    (("--seeds", "42", "--only", "clip_schedule", "--json"), 0),
    (("--seeds", "4x", "--json"), 2),
])
def test_a_check_process_leaves_with_its_exit_code_and_all_its_output(args, code, tmp_path):
    """`python -m engine.cli check` skips interpreter teardown at exit: nothing it printed may be lost."""
    p = subprocess.run([sys.executable, "-m", "engine.cli", "check", "tapo-trajectory", "--receipts", str(tmp_path),
                        *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == code, p.stderr[-2000:]
    if code == 0:
        (run,) = json.loads(p.stdout)["runs"]
        assert run["status"] == "passed" and (tmp_path / "tapo-trajectory" / run["receipt"]).is_file()
    else:
        assert "comma-separated" in p.stderr and p.stdout == ""


@pytest.mark.parametrize("extra, threads", [((), 1), (("--threads", "2"), 2)])
def test_checks_on_the_cpu_use_one_torch_thread_unless_told(extra, threads, tmp_path):
    import torch

    before = torch.get_num_threads()
    r = invoke("check", "tapo-trajectory", "--seeds", "42", "--only", "clip_schedule", "--receipts", str(tmp_path),
               "--json", *extra)
    assert r.exit_code == 0, r.output
    (path,) = (tmp_path / "tapo-trajectory").glob("*.json")
    assert json.loads(path.read_text())["predicate"]["environment"]["torch_threads"] == threads
    assert torch.get_num_threads() == before  # an in-process check leaves torch as it found it


def test_validate_reports_a_broken_spec_with_exit_2(tmp_path):
    text = (ROOT / "specs" / "tapo-trajectory.yaml").read_text().replace("check: tapo.mechanism", "check: nope")
    (tmp_path / "tapo-trajectory.yaml").write_text(text)
    r = invoke("validate", "--specs", str(tmp_path))
    assert r.exit_code == 2
    at = [c.get("check") for c in YAML(typ="safe").load((ROOT / "specs" / "tapo-trajectory.yaml").read_text())["contracts"]].index(
        "tapo.mechanism")
    assert "tapo-trajectory.yaml:" in r.stderr and f"$.contracts[{at}].check" in r.stderr


def test_check_refuses_a_broken_spec_before_running(tmp_path):
    text = (ROOT / "specs" / "tapo-trajectory.yaml").read_text().replace("level: L1", "level: L7")
    (tmp_path / "tapo-trajectory.yaml").write_text(text)
    r = invoke("check", "tapo-trajectory", "--specs", str(tmp_path), "--receipts", str(tmp_path / "r"))
    assert r.exit_code == 2 and "$.level" in r.stderr and not (tmp_path / "r").exists()


def test_show_json_has_contract_ids():
    r = invoke("show", "tapo-trajectory", "--json")
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert "eq15_local_gradient" in {c["id"] for c in data["spec"]["contracts"]}


@pytest.mark.parametrize("method", ["grpo", "gspo", "mrtpo", "tapo-trajectory", "tar-adaptive-replay"])
def test_show_names_every_contracts_tier(method, monkeypatch):
    """math, budget or scale on every contract, in show --json (per contract and grouped) and in the text table;
    every spec has a scale tier (training sizes)."""
    data = json.loads(invoke("show", method, "--json").stdout)
    tiers = {c["id"]: c["tier"] for c in data["spec"]["contracts"]}
    assert set(tiers.values()) <= {"math", "budget", "scale"} and "scale" in tiers.values()
    assert data["tiers"] == {t: [c for c, x in tiers.items() if x == t] for t in ("math", "budget", "scale")}
    monkeypatch.setenv("COLUMNS", "200")
    text = invoke("show", method).stdout
    assert f"tiers: math {len(data['tiers']['math'])}; budget {len(data['tiers']['budget'])}" in text
    assert f"; scale {len(data['tiers']['scale'])} ({', '.join(data['tiers']['scale'])})" in text
    assert "tier" in next(line for line in text.splitlines() if "kind" in line and "check" in line)


@pytest.mark.parametrize("verb", [["list"], ["list", "--json"], ["show", "tapo-trajectory"], ["validate"]])
def test_read_only_commands_do_not_import_torch(verb):
    code = (f"import sys; from engine.cli import app; from typer.testing import CliRunner; "
            f"r = CliRunner().invoke(app, {verb!r}); "
            f"assert r.exit_code == 0, r.output; assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "NO_COLOR": "1"})


# --- main()'s direct way into list/show/gate/verify (no typer parsing) ---------------------------------


def test_the_direct_table_matches_the_commands_signatures():
    """Every parameter of a direct verb is a path option, a flag or METHOD, exactly as the table says, and
    none has an envvar or callback the direct parse would skip."""
    import inspect
    import typing

    import typer.models

    import engine.cli as cli

    for verb, (fn, fewest, most, flags, options) in cli._DIRECT.items():
        seen_flags, seen_opts, method = set(), set(), None
        for name, p in inspect.signature(fn).parameters.items():
            annotation = typing.get_type_hints(fn, include_extras=True)[name]
            base, info = typing.get_args(annotation)[0], typing.get_args(annotation)[1]
            assert info.envvar is None and info.callback is None and not getattr(info, "is_eager", False), (verb, name)
            if isinstance(info, typer.models.ArgumentInfo):
                assert name == "method" and base in (str, typing.Optional[str]), (verb, name)
                method = p
                continue
            (decl,) = info.param_decls or (info.default,)  # Annotated: typer reads a str default as the name
            if decl in cli._TYPER_ONLY_OPTIONS:  # argv holding it goes to typer (test_typer_only_options_...)
                assert cli._direct_call([verb, "m", decl, "x"]) is None, (verb, decl)
                continue
            if base is bool:
                assert cli._DIRECT_FLAGS[decl] == name and decl in flags and p.default is False, (verb, decl)
                seen_flags.add(decl)
            else:
                assert base == typing.Optional[Path] and cli._DIRECT_OPTIONS[decl] == name and p.default is None
                seen_opts.add(decl)
        assert seen_flags == set(flags) and seen_opts == set(options), verb
        required = method is not None and method.default is inspect.Parameter.empty
        assert (fewest, most) == ((1, 1) if required else (0, 1) if method is not None else (0, 0)), verb


@pytest.mark.parametrize("argv", [
    ["show"], ["show", "a", "b"], ["list", "x"], ["list", "--json", "--json"], ["verify", "--help"],
    ["list", "--receipts"], ["list", "--receipts", "--json"], ["list", "--receipts="], ["gate", "-h"],
    ["gate", "m", "--strict"], ["check", "tapo-trajectory"], ["show", ""], ["list", "--"], ["list", "--jso"],
    ["verify", "--specs", "a", "--specs", "b"], [], ["--json", "list"],
])
def test_anything_but_the_plain_forms_is_left_to_typer(argv):
    import engine.cli as cli

    assert cli._direct_call(argv) is None


def test_the_direct_way_prints_what_typer_prints(tmp_path):
    import engine.cli as cli

    store = tmp_path / "store"
    copy_sample(store)
    cases = [["list"], ["list", "--json", "--receipts", str(store)], ["show", "mrtpo", f"--receipts={store}"],
             ["--", "gate", "tapo-trajectory", "--json"], ["gate", "--specs", str(ROOT / "specs"), "mrtpo"],
             ["verify", "--strict"], ["verify", "tar-adaptive-replay", "--json"], ["show", "no-such-method"],
             ["gate", "../x"]]
    for argv in cases:
        argv = [a for a in argv if a != "--"]
        if "--receipts" not in " ".join(argv):
            argv += ["--receipts", str(store)]
        assert cli._direct_call(argv) is not None, argv
        typer_run = invoke(*argv)
        direct = subprocess.run([sys.executable, "-m", "engine.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                                timeout=120, env={**os.environ, "NO_COLOR": "1"})
        outs = [typer_run.stdout, direct.stdout]
        if "gate" in argv and "--json" in argv:
            outs = [json.dumps({**json.loads(o), "evaluated_at": None}) for o in outs]
        # verify's stderr says how long it took, which differs between any two runs
        errs = [re.sub(r"judged in [0-9.]+ s \([0-9.]+ ms per receipt\)", "judged in T", e)
                for e in (typer_run.stderr, direct.stderr)]
        assert (direct.returncode, outs[1], errs[1]) == (typer_run.exit_code, outs[0], errs[0]), argv
