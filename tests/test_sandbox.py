"""Candidates cannot reach their judge: each way a candidate has tried, planted here, and what stops it.

The candidates are tests/fixtures/my_tapo.py (a correct plain-torch TAPO) with one attack added each:

* it looks at `sys.modules` for the engine, or re-points engine functions: the strict screen refuses it before
  it runs (engine/evolve/screen.py), naming the line and the construct;
* it plants a `sitecustomize.py` on PYTHONPATH or edits files the workers load, then a wrong candidate follows:
  the sandbox shows it every such place read-only or not at all, and the wrong one still fails;
* it double-forks a daemon that rewrites the receipt: the daemon sees no store and dies with the sandbox;
* it looks for the signer in /proc and reads the key file: neither is there (and without the sandbox it finds
  the key, which shows the probe works);
* without bubblewrap a candidate check refuses unless --no-sandbox; receipts record their isolation; a trust
  policy requiring `sandboxed` refuses an unsandboxed receipt.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app
from engine.run import sandbox

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "my_tapo.py"
METHOD = "tapo-trajectory"
RATIO_RETURN = "    return prefix * torch.exp(here - here.detach())"
WRONG_RETURN = "    return (1.01 if WRONG else 1.0) * prefix * torch.exp(here - here.detach())"

needs_bwrap = pytest.mark.skipif(sandbox.unavailable() is not None,
                                 reason=f"no sandbox on this machine: {sandbox.unavailable()}")
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def attack(folder: Path, name: str, prelude: str) -> Path:
    """The fixture with `prelude` (module code that sets WRONG) run at import, and a ratio that is 1% off when
    WRONG is true: a candidate whose attack worked is wrong and passes only if the attack fooled the judge."""
    text = FIXTURE.read_text()
    assert text.count("import torch\n") == 1 and text.count(RATIO_RETURN) == 1
    text = text.replace("import torch\n", "import torch\n\n" + prelude + "\n", 1).replace(RATIO_RETURN, WRONG_RETURN)
    path = folder / name
    path.write_text(text)
    return path


def scaled(folder: Path, name: str = "scaled.py") -> Path:
    return attack(folder, name, "WRONG = True\n")


def check(target: Path, store: Path, *extra: str):
    return invoke("check", METHOD, "--impl", str(target), "--seeds", "42", "--receipts", str(store), "--json",
                  "--no-mutants", *extra)


def receipts(store: Path) -> list[dict]:
    out = []
    for p in sorted((store / METHOD).glob("*.json")):
        doc = json.loads(p.read_text())
        if "payload" in doc:
            import base64

            doc = json.loads(base64.b64decode(doc["payload"]))
        out.append(doc)
    return out


def keys_and_policy(folder: Path, require: bool) -> tuple[Path, Path]:
    folder.mkdir(exist_ok=True)
    key = folder / "runner"
    if not key.exists():
        assert invoke("keys", "generate", str(key)).exit_code == 0
    policy = folder / ("strict.yaml" if require else "plain.yaml")
    policy.write_text("keys:\n  - public_key: runner.pub\n    devices: [cpu]\n"
                      + ("require: [sandboxed]\n" if require else ""))
    return key, policy


# --- no sandbox tool: refuse, unless asked -------------------------------------------------------------------------


def test_without_bubblewrap_a_candidate_check_refuses_unless_no_sandbox(tmp_path, monkeypatch):
    from engine.evolve.evaluator import Evaluator

    monkeypatch.setattr(sandbox, "bwrap", lambda: None)
    monkeypatch.setattr(sandbox, "_PROBE", {})
    good = attack(tmp_path, "good.py", "WRONG = False\n")
    r = check(good, tmp_path / "r", "--only", "clip_schedule")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 4 and len(lines) == 1, r.output
    assert "apt-get install bubblewrap" in lines[0] and "--no-sandbox" in lines[0]
    assert not (tmp_path / "r" / METHOD).exists()  # nothing ran, no receipt
    r = check(good, tmp_path / "r", "--only", "clip_schedule", "--no-sandbox")
    assert r.exit_code == 0, r.output
    (stmt,) = receipts(tmp_path / "r")
    assert stmt["predicate"]["isolation"] == {"sandbox": "none", "candidate": True, "checks_in": "supervisor"}
    res = Evaluator(METHOD, receipts=tmp_path / "e").stage(1, str(good))
    assert res.metrics["combined_score"] == 0.0 and "bubblewrap" in res.artifacts["not_checked"]
    assert invoke("check", METHOD, "--no-sandbox", "--only", "clip_schedule").exit_code == 2  # only with --impl


@needs_bwrap
def test_receipts_record_their_isolation(tmp_path):
    good = attack(tmp_path, "good.py", "WRONG = False\n")
    r = check(good, tmp_path / "r", "--only", "clip_schedule")
    assert r.exit_code == 0, r.output
    r = invoke("check", METHOD, "--only", "clip_schedule", "--no-mutants", "--seeds", "42", "--receipts",
               str(tmp_path / "r"))
    assert r.exit_code == 0, r.output
    by_kind = {s["predicate"]["implementation"].get("kind", "default"): s["predicate"]["isolation"]
               for s in receipts(tmp_path / "r")}
    assert by_kind["default"] == {"sandbox": "none", "candidate": False}
    iso = by_kind["external"]
    assert iso["sandbox"] == "bubblewrap" and iso["version"] == sandbox.version() and iso["network"] is False
    assert iso["pid_namespace"] is True and iso["python"] == "isolated"
    assert iso["checks_in"] == "supervisor"  # the checks ran here; the candidate's functions in the sandbox


# --- the trust policy can require it -------------------------------------------------------------------------------


@needs_bwrap
def test_gate_trust_requiring_sandboxed_refuses_an_unsandboxed_receipt(tmp_path):
    key, strict = keys_and_policy(tmp_path / "pipeline", require=True)
    _, plain = keys_and_policy(tmp_path / "pipeline", require=False)
    good = attack(tmp_path, "good.py", "WRONG = False\n")
    store = tmp_path / "store"
    r = check(good, store, "--only", "clip_schedule", "--no-sandbox", "--sign-key", str(key))
    assert r.exit_code == 0, r.output
    unsandboxed = json.loads(r.stdout)["runs"][0]["receipt_id"]

    def gate(policy):
        g = invoke("gate", METHOD, "--impl", str(good), "--receipts", str(store), "--trust", str(policy), "--json")
        return json.loads(g.stdout)

    doc = gate(strict)
    assert doc["receipts"]["fresh"] == []
    (refused,) = doc["receipts"]["untrusted"]
    assert refused["receipt_id"] == unsandboxed and refused["why"] == "unsandboxed", refused
    assert "requires sandboxed" in refused["message"]
    assert doc["trust"]["require"] == ["sandboxed"]
    assert gate(plain)["receipts"]["fresh"] == [unsandboxed]  # the same receipt, a policy that does not require it
    v = invoke("verify", METHOD, "--receipts", str(store), "--trust", str(strict), "--strict")
    assert v.exit_code == 1 and "1 unsandboxed" in v.stderr, v.output
    r = check(good, store, "--only", "clip_schedule", "--sign-key", str(key))
    assert r.exit_code == 0, r.output
    sandboxed_id = json.loads(r.stdout)["runs"][0]["receipt_id"]
    assert gate(strict)["receipts"]["fresh"] == [sandboxed_id]


# --- the strict screen: a candidate that looks at, or re-points, its judge -----------------------------------------

SYS_MODULES = ("import sys\n"
               "WRONG = not any(m.startswith('engine.run') for m in sys.modules)  # right only under the harness\n")
REPOINT = ("from engine.run import runner as _r\n"
           "_r.Runner.call = lambda self, impl, contract, seed, dtype, **k: {'status': 'passed'}\n"
           "WRONG = True\n")
DUNDER = ("WRONG = not any('engine' in k for k in torch.__class__.__dict__.get('__globals__', {}) or [])\n")
# the routes through torch's own module attributes that the first screen let through (issue 36)
TORCH_SYS = "WRONG = not any(m.startswith('engine.run') for m in torch.sys.modules)\n"
HEX_EXEC = f"torch.builtins.exec(bytes.fromhex('{b'WRONG = True'.hex()}').decode())  # sets WRONG\n"


@pytest.mark.parametrize("name,prelude,construct", [
    ("sys_modules", SYS_MODULES, ":1: import sys: not in the allowlist"),
    ("repoint", REPOINT, ":1: from engine.run import ...: not in the allowlist"),
    ("dunder", DUNDER, ": attribute __class__: underscore and dunder attributes"),
    ("torch_sys", TORCH_SYS, ": torch.sys: is the module sys, outside the allowlist"),
    ("hex_exec", HEX_EXEC, ": torch.builtins: is the module builtins, outside the allowlist"),
])
def test_the_strict_screen_refuses_a_candidate_that_reaches_for_its_judge(tmp_path, name, prelude, construct):
    """Under strict (the evaluator's default) these never run: score 0, the refusal names the line and the
    construct; under a trust policy too (the screen comes before any receipt)."""
    from engine.evolve.evaluator import Evaluator

    cand = attack(tmp_path, f"{name}.py", prelude)
    key, policy = keys_and_policy(tmp_path / "pipeline", require=True)
    for ev in (Evaluator(METHOD, receipts=tmp_path / "store"),
               Evaluator(METHOD, receipts=tmp_path / "signed", sign_key=key, trust=policy)):
        res = ev.stage(1, str(cand))
        assert res.metrics["combined_score"] == 0.0
        why = res.artifacts["not_checked"]
        line = cand.read_text().splitlines().index(prelude.splitlines()[0]) + 1
        assert why.startswith(f"refused by the strict screen: {name}.py:{line}:") and construct in why, why
    assert not (tmp_path / "store").exists() and not (tmp_path / "signed").exists()  # nothing of it ran


# --- persistence: what one candidate plants never reaches the next -------------------------------------------------


@needs_bwrap
def test_a_planted_sitecustomize_or_edited_worker_file_never_reaches_the_next_candidate(tmp_path, monkeypatch):
    """A candidate writes sitecustomize.py into a folder on PYTHONPATH, a module into the checkout's methods, a
    file into the interpreter's site-packages, and a marker into /tmp, then kills its warm template; a wrong
    candidate after it still scores 0, a correct one still scores 0.5. Not strict: the sandbox is the defence."""
    from engine.evolve.evaluator import Evaluator

    on_path = tmp_path / "on-path"
    on_path.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(on_path))
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    mark = uuid.uuid4().hex
    targets = [on_path / "sitecustomize.py", ROOT / "methods" / "tapo" / f"planted_{mark}.py",
               site / f"planted_{mark}.txt"]
    plant = ("import os, signal\n"
             f"WRONG = False\n"
             f"for _p in {[str(t) for t in targets]!r}:\n"
             "    try:\n"
             "        with open(_p, 'w') as _f:\n"
             "            _f.write('import builtins\\n')\n"
             "        WRONG = True\n"
             "    except OSError:\n"
             "        pass\n"
             f"open('/tmp/planted-{mark}', 'w').write('x')\n"
             "os.kill(os.getppid(), signal.SIGKILL)  # the warm template it was forked from\n")
    follower = attack(tmp_path, "follower.py", f"import os\nWRONG = os.path.exists('/tmp/planted-{mark}')\n")
    try:
        ev = Evaluator(METHOD, receipts=tmp_path / "store", strict=False)
        ev.stage(1, str(attack(tmp_path, "planter.py", plant)))  # its score depends on when it killed the template
        assert ev.stage(1, str(scaled(tmp_path))).metrics["combined_score"] == 0.0
        assert ev.stage(1, str(follower)).metrics["combined_score"] == 0.5  # /tmp was its own
        assert not Path(f"/tmp/planted-{mark}").exists()
        r = check(scaled(tmp_path, "scaled2.py"), tmp_path / "r", "--only", "prefix_ratio_forward")
        assert r.exit_code == 1, r.output  # a signed-path check of a wrong file after it still fails
    finally:
        existed = [t for t in targets if t.exists()]
        for t in existed:
            t.unlink()
    assert existed == []


# --- a daemon that outlives its worker -------------------------------------------------------------------------------


@needs_bwrap
def test_a_double_forked_daemon_dies_with_the_sandbox_and_never_sees_the_receipt(tmp_path):
    store = tmp_path / "store"
    mark = f"{time.time_ns() % 10**9}.{os.getpid()}"
    daemon = ("import os, glob, time\n"
              "WRONG = True\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    if os.fork() == 0:\n"
              "        if os.fork() == 0:\n"
              f"            os.execv('/bin/sleep', ['sleep', '{mark}'])\n"
              "        end = time.time() + 30\n"
              "        while time.time() < end:\n"
              f"            for p in glob.glob({str(store)!r} + '/*/*.json'):\n"
              "                try:\n"
              "                    t = open(p).read()\n"
              "                    open(p, 'w').write(t.replace('\"failed\"', '\"passed\"'))\n"
              "                except OSError:\n"
              "                    pass\n"
              "            time.sleep(0.1)\n"
              "    os._exit(0)\n")
    cand = attack(tmp_path, "daemon.py", daemon)
    r = check(cand, store, "--only", "prefix_ratio_forward")
    assert r.exit_code == 1, r.output
    (path,) = list((store / METHOD).glob("*.json"))
    before = path.read_bytes()
    time.sleep(1.5)

    def alive() -> list[int]:
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if mark.encode() in (d / "cmdline").read_bytes():
                        out.append(int(d.name))
                except OSError:
                    pass
        return out

    left = alive()
    for pid in left:  # only if the sandbox failed: leave nothing behind
        os.kill(pid, 9)
    assert left == []
    assert path.read_bytes() == before
    v = invoke("verify", METHOD, "--receipts", str(store))
    assert v.exit_code == 0 and "failed" in v.stdout, v.output


# --- the signer is out of reach --------------------------------------------------------------------------------------


@needs_bwrap
def test_a_candidate_that_looks_for_the_signer_finds_nothing(tmp_path):
    key, policy = keys_and_policy(tmp_path / "pipeline", require=True)
    store = tmp_path / "store"
    probe = ("import os\n"
             "FOUND = []\n"
             "for _d in os.listdir('/proc'):\n"
             "    if _d.isdigit():\n"
             "        try:\n"
             "            _c = open('/proc/' + _d + '/cmdline', 'rb').read()\n"
             "        except OSError:\n"
             "            continue\n"
             "        if b'--sign-key' in _c or b'signing' in _c or b'pytest' in _c:\n"
             "            FOUND.append(_d)\n"
             f"for _p in ({str(key)!r}, {str(store)!r}, {str(policy)!r}):\n"
             "    try:\n"
             "        if os.listdir(_p) if os.path.isdir(_p) else open(_p, 'rb').read(1):\n"
             "            FOUND.append(_p)\n"
             "    except OSError:\n"
             "        pass\n"
             "WRONG = bool(FOUND)\n")
    cand = attack(tmp_path, "seeker.py", probe)
    r = check(cand, store, "--only", "prefix_ratio_forward", "--sign-key", str(key))
    assert r.exit_code == 0, r.output  # it found nothing, so it stayed right
    g = invoke("gate", METHOD, "--impl", str(cand), "--receipts", str(store), "--trust", str(policy), "--json")
    assert len(json.loads(g.stdout)["receipts"]["fresh"]) == 1, g.output  # signed, sandboxed: it counts
    # the same probe without the sandbox sees the test process, the key and the store: it turns itself wrong
    r = check(cand, tmp_path / "open", "--only", "prefix_ratio_forward", "--no-sandbox")
    assert r.exit_code == 1, r.output


def test_the_store_key_and_policy_are_masked_wherever_they_fall_inside_what_a_sandbox_shows(tmp_path):
    """Inside the checkout (bound read-only), the store becomes an empty folder and the key and the policy
    /dev/null; .git too, and the files a signing command names (not the programs it runs)."""
    store, key, policy = ROOT / "some-store", ROOT / "engine" / "__init__.py", ROOT / "pyproject.toml"
    hidden = sandbox.hidden_paths(receipts=ROOT / "receipts", sign_key=key, trust=policy,
                                  sign_command=f"{sys.executable} -m engine.store.signing sign {ROOT / 'README.md'}")
    args = sandbox.command(str(tmp_path), hidden + [str(store)])
    pairs = list(zip(args, args[1:], args[2:]))
    assert ("--ro-bind", "/dev/null", str(key)) in pairs and ("--ro-bind", "/dev/null", str(policy)) in pairs
    assert ("--ro-bind", "/dev/null", str(ROOT / "README.md")) in pairs
    assert ("--tmpfs", str(ROOT / "receipts")) in list(zip(args, args[1:]))
    assert str(ROOT / ".git") in args
    assert os.path.realpath(sys.executable) not in hidden
    assert str(store) not in args  # not there: nothing to mask
    assert ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"] == args[1:7]
    assert args[args.index("--") + 2] == "-I"  # isolated Python


# --- the call loop's sandbox names no checker --------------------------------------------------------------------


PROBE = r'''
import importlib.util, json, os, sys
site = [p for p in sys.path if p.endswith("site-packages")]
print(json.dumps({"cwd": os.getcwd(), "home": os.environ.get("HOME"), "env": dict(os.environ),
                  "host": os.uname().nodename, "prefix": sys.prefix, "executable": sys.executable, "path": sys.path,
                  "engine": importlib.util.find_spec("engine") is not None,
                  "site": sorted(e for p in site for e in os.listdir(p)),
                  "cache": sorted(e for p in site if os.path.isdir(p + "/__pycache__")
                                  for e in os.listdir(p + "/__pycache__")),
                  "torch": importlib.util.find_spec("torch") is not None}))
'''


@needs_bwrap
def test_the_call_loops_sandbox_names_no_checker(tmp_path):
    """What the candidate's own process sees: an ordinary user's folder, home and host name, no variable, module,
    package, path or argv naming the checker (its checkout is not there at all), torch importable; and the loop
    itself is `python -I -c` with its code from the pipe, no call_loop.py in argv."""
    import subprocess

    (tmp_path / "mine.py").write_text("x = 1\n")
    args = sandbox.command(str(tmp_path), sandbox.hidden_paths(), loop=(0, 1))
    assert args[args.index("--") + 1:][1:3] == ["-I", "-c"] and not any("call_loop.py" in a for a in args)
    assert "--as-pid-1" in args  # the loop is PID 1: no bubblewrap inside whose argv lists the binds
    probe = args[:args.index("--") + 2] + ["-I", "-c", PROBE]
    seen = json.loads(subprocess.run(probe, capture_output=True, text=True, timeout=120, check=True).stdout)
    assert (seen["cwd"], seen["home"], seen["host"]) == (sandbox.INSIDE, sandbox.HOME, "localhost")
    assert seen["prefix"] == sandbox.VENV and seen["torch"] and not seen["engine"]
    words = ("contract", "check", "candidate", "call_loop", str(ROOT).lower())
    text = json.dumps([seen["env"], seen["path"], seen["site"], seen["cache"], seen["cwd"], seen["executable"]])
    assert not [w for w in words if w in text.lower()], text
    assert seen["env"].get("PWD", sandbox.INSIDE) == sandbox.INSIDE  # bubblewrap's --chdir sets it, as a shell does
    assert set(seen["env"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "LANGUAGE", "TZ", "PYTHONHASHSEED", "NO_COLOR",
                                "TERM", "PWD"} | {k for k in seen["env"] if k.startswith(("LC_", "OMP_", "MKL_", "OPENBLAS_",
                                                                                    "KMP_", "CUDA_VISIBLE", "CUBLAS_"))}
    # the loop as it really starts: BOOT then the loop's code over the pipe; it says ready, and its argv is -c
    box = sandbox.LoopBox(sandbox.hidden_paths())
    try:
        assert box.wait_ready(120), box.conn.tail()
        kids = subprocess.run(["ps", "-o", "args=", "--ppid", str(box.conn.proc.pid)], capture_output=True,
                              text=True).stdout
        inner = subprocess.run(["ps", "-o", "args=", "-e"], capture_output=True, text=True).stdout
        mine = [line for line in inner.splitlines() if sandbox.VENV in line and "-I -c" in line]
        assert mine and not any("call_loop.py" in line for line in mine + kids.splitlines()), (kids, mine)
    finally:
        box.close()
