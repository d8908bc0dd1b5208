"""No leaks: receipts hold no absolute path, host name, user name or environment variable value.

A canary environment variable is set for the whole session before any test
runs (in tests/conftest.py, so that pytest-xdist workers share one value; here
too, for a run without that conftest), so every receipt the suite writes was
written with a secret in the environment. One test runs checks built to leak
(exceptions quoting absolute paths, the home folder, `user@host` and the
canary; notes and step records with paths) and finds each scrubbed. The last
test of the session scans every receipt the suite wrote (the session's temp
folders, every worker's, and the repository's receipts/) and finds none of
those things.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import secrets
import socket
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app
from engine.paths import project_root
from engine.store.receipts import PREDICATE_TYPE, STATEMENT_TYPE
from tests.toy_spec import registered_package, toy_spec

ROOT = project_root()
CANARY_NAME = "CONTRACTS_LEAK_CANARY"
os.environ.setdefault(CANARY_NAME, "leak-canary-" + secrets.token_hex(12))  # for the whole session
CANARY = os.environ[CANARY_NAME]
USER = getpass.getuser()
HOST = socket.gethostname()

LEAKY_PACKAGE = '''\
"""Test-only checks that try to leak where and by whom they ran into the receipt."""

import getpass
import os
import socket
from pathlib import Path

from engine.spec import registry

IMPL = registry.implementation("reliab_leaky", identity=lambda x: x)
WHO = f"{getpass.getuser()}@{socket.gethostname()}"


@registry.check("reliab_leaky.raises_with_paths")
def raises_with_paths(impl, ctx):
    raise FileNotFoundError(2, f"no model for {WHO} in {Path.home()}, cwd {os.getcwd()}, secret "
                               f"{os.environ['CONTRACTS_LEAK_CANARY']}", str(Path(__file__).resolve()))


@registry.check("reliab_leaky.records_paths")
def records_paths(impl, ctx):
    ctx.record_step(step=1, where=str(Path(__file__).resolve()), home=str(Path.home()), value=1.0)
    ctx.record_comparison("acc", "leaky", "control", [0.5], [0.4], "accuracy",
                          note=f"run by {WHO} at {os.getcwd()} with {os.environ['CONTRACTS_LEAK_CANARY']}")
    return {"err": 0.0}


@registry.mutant("reliab_leaky.none", base="reliab_leaky")
def none():
    return IMPL.replace("reliab_leaky.none", identity=lambda x: x + 1)
'''

LEAKY_SPEC = toy_spec(
    "reliab-leaky", "reliab_leaky", title="Test-only: checks that try to leak paths, names and secrets",
    arxiv="2601.00004", level="L1",
    formulas='  - {id: f1, latex: "y = x", implements: identity}',
    contracts="""\
  - {id: raises, description: raises quoting paths, formulas: [f1], kind: value, tier: math,
     check: reliab_leaky.raises_with_paths, dtypes: [float64], cases: 1, expect: [{metric: err, le: 1.0}]}
  - {id: records, description: records paths, formulas: [f1], kind: mechanism, tier: math,
     check: reliab_leaky.records_paths, dtypes: [float32], cases: 1, expect: [{metric: err, le: 1.0}]}""",
    mutants="  - {id: none, description: off by one, mutant: reliab_leaky.none, killed_by: [raises, records]}")


# --- the scan ---------------------------------------------------------------------------------

# Written independently of engine/store/redact.py: an absolute path is a "/" at the start of a token followed
# by a folder name and another "/".
ABS_PATH = re.compile(r"(?:^|[\s'\"(=:,\[])(/[A-Za-z0-9._@+-]+/)")
STRUCTURED = ("environment", "git")  # filled from torch/platform/git by code, never from the environment
FREE_TEXT = ("message", "error", "errors", "note")  # where a user name can only have come from the machine


def _word(text: str) -> re.Pattern:
    return re.compile(r"(?<![A-Za-z0-9_.-])" + re.escape(text) + r"(?![A-Za-z0-9_-])")


def env_values() -> dict[str, str]:
    """Environment values long enough to identify something (short ones like '1' or 'cpu' are everywhere)."""
    return {v: k for k, v in os.environ.items() if len(v) >= 8 and not re.fullmatch(r"[0-9.]+", v)}


class Scan:
    """Finds every absolute path, host name, user name and environment value in receipts.

    What a string holds is decided by the string and two facts about where it sits (free text; the
    structured environment/git sections), so each distinct (string, facts) is examined once per scan:
    the suite's receipts repeat the same keys and values (step records) hundreds of thousands of times.
    """

    def __init__(self):
        self.sensitive = sorted({str(ROOT), str(Path.home()), str(Path.cwd()), tempfile.gettempdir(), sys.prefix,
                                 str(Path(sys.executable).parent)}, key=len, reverse=True)
        self.host_re, self.user_re = _word(HOST), _word(USER)
        self.envs = env_values()
        # one search for "any environment value", the per-value loop only where it hits
        self.any_env = re.compile("|".join(map(re.escape, self.envs))) if self.envs else None
        self.seen: dict[tuple[str, bool, bool], list[str]] = {}

    def leaks(self, stmt: dict) -> list[str]:
        """Every leak in one receipt, one line each, naming where it is."""
        found: list[str] = []
        self._walk(stmt, (), False, False, found)
        return found

    def _walk(self, value, path: tuple, free_text: bool, structured: bool, found: list[str]) -> None:
        """Every string (dict keys too) with its path, and whether that path so far is free text (FREE_TEXT) or
        in a structured section (STRUCTURED)."""
        if isinstance(value, str):
            self._string(value, path, free_text, structured, found)
        elif isinstance(value, dict):
            for k, v in value.items():
                here = path + (str(k),)
                free = free_text or str(k) in FREE_TEXT
                struct = structured or (path == ("predicate",) and str(k) in STRUCTURED)
                self._string(k, here, free, struct, found)
                self._walk(v, here, free, struct, found)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self._walk(v, path + (i,), free_text, structured, found)

    def _string(self, text, path: tuple, free_text: bool, structured: bool, found: list[str]) -> None:
        if not isinstance(text, str):
            return
        key = (text, free_text, structured)
        what = self.seen.get(key)
        if what is None:
            what = self.seen[key] = self._text(text, free_text, structured)
        if what:
            where = "/".join(map(str, path))
            found += [f"{where}: {w}" for w in what]

    def _text(self, text: str, free_text: bool, structured: bool) -> list[str]:
        found = []
        m = ABS_PATH.search(text)
        if m:
            found.append(f"absolute path {m.group(1)!r} in {text[:120]!r}")
        for s in self.sensitive:
            if s in text and (text == s or f"{s}/" in text or text.endswith(s)):
                found.append(f"{s!r} in {text[:120]!r}")
        if self.host_re.search(text):
            found.append(f"host name {HOST!r} in {text[:120]!r}")
        if f"/{USER}" in text or f"{USER}@" in text or f"~{USER}" in text or text == USER or (
                free_text and self.user_re.search(text)):
            found.append(f"user name {USER!r} in {text[:120]!r}")
        if not structured and self.any_env is not None and self.any_env.search(text):
            for value, name in self.envs.items():
                if value in text:
                    found.append(f"value of ${name} in {text[:120]!r}")
        return found


def leaks(stmt: dict) -> list[str]:
    """Every absolute path, host name, user name and environment value found in one receipt."""
    return Scan().leaks(stmt)


def receipts_written(base: Path) -> list[Path]:
    out = []
    for folder in (base, ROOT / "receipts"):
        if folder.is_dir():
            for p in folder.rglob("*.json"):
                try:
                    data = _statement(json.loads(p.read_bytes()))
                except (OSError, ValueError, RecursionError):  # files other tests planted to be refused
                    continue
                if isinstance(data, dict) and data.get("_type") == STATEMENT_TYPE and \
                        data.get("predicateType") == PREDICATE_TYPE:
                    out.append(p)
    return sorted(out)


# --- tests ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def leaky(tmp_path_factory):
    base = tmp_path_factory.mktemp("leaky")
    specs = base / "specs"
    specs.mkdir()
    (specs / "reliab-leaky.yaml").write_text(LEAKY_SPEC)
    with registered_package(base / "pkg", "reliab_leaky_pkg", LEAKY_PACKAGE):
        yield specs


def test_checks_built_to_leak_leave_nothing_in_the_receipt(leaky, tmp_path):
    res = CliRunner().invoke(app, ["check", "reliab-leaky", "--specs", str(leaky), "--receipts", str(tmp_path)])
    assert res.exit_code == 3, res.output  # the raising check is an error; the run still writes its receipt
    (path,) = (tmp_path / "reliab-leaky").glob("*.json")
    text = path.read_text()
    stmt = json.loads(text)
    assert leaks(stmt) == []
    for secret in (CANARY, str(Path.home()) + "/", str(ROOT), str(tmp_path), f"{USER}@{HOST}"):
        assert secret not in text, secret
    # what was there was scrubbed, not dropped: the message still says what happened
    pred = stmt["predicate"]
    raised = next(r for r in pred["results"] if r["contract"] == "raises")
    assert raised["status"] == "error" and raised["message"].startswith("FileNotFoundError: [Errno 2] no model for")
    assert f"<env:{CANARY_NAME}>" in raised["message"] and "<user>@<host>" in raised["message"]
    assert "<abs>/reliab_leaky_pkg.py" in raised["message"]
    step = pred["mechanism"][0]["steps"][0]
    assert step["where"] == "<abs>/reliab_leaky_pkg.py" and step["value"] == 1.0
    note = pred["mechanism"][0]["comparisons"][0]["note"]
    assert f"<env:{CANARY_NAME}>" in note and "<user>@<host>" in note


def test_the_scan_finds_what_it_looks_for():
    """The scanner itself must not be blind: a receipt with each kind of leak is flagged for each."""
    stmt = {"_type": STATEMENT_TYPE, "predicate": {
        "results": [{"message": f"at {ROOT}/engine/x.py"}, {"message": f"by {USER}@{HOST}"},
                    {"message": f"key {CANARY}"}], "mechanism": [{"steps": [{"p": "/opt/data/x.bin"}]}]}}
    found = "\n".join(leaks(stmt))
    assert "absolute path" in found and "host name" in found and "user name" in found
    assert f"${CANARY_NAME}" in found


def _statement(data):
    """A receipt's Statement: the file itself, or a signed receipt's DSSE payload (scanned the same way)."""
    if isinstance(data, dict) and isinstance(data.get("payload"), str) and "payloadType" in data:
        import base64

        return json.loads(base64.b64decode(data["payload"]))
    return data


def _parsed(p):
    """A written receipt; a file other tests planted to be refused (100k-deep, not JSON) holds nothing to leak."""
    try:
        return _statement(json.loads(p.read_bytes()))
    except (RecursionError, ValueError):
        return {}


@pytest.mark.last
def test_no_receipt_the_suite_wrote_leaks_anything(tmp_path_factory, leaky, tmp_path):
    """Runs after every other test: every receipt written this session, and the shipped ones."""
    CliRunner().invoke(app, ["check", "reliab-leaky", "--specs", str(leaky), "--receipts", str(tmp_path)])
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each xdist worker writes under its own folder beside this one
        base = base.parent
    files = receipts_written(base)
    assert files, "no receipt found to scan"
    scan = Scan()
    problems = {str(p): found for p in files if (found := scan.leaks(_parsed(p)))}
    assert problems == {}, json.dumps(problems, indent=1)[:5000]
    print(f"scanned {len(files)} receipts")


# --- keys and step records ------------------------------------------------------------------------------

KEY_LEAK_PACKAGE = '''\
"""Test-only: a check that leaks through dict keys and the free text of its step records."""

import getpass
import os
import socket
from pathlib import Path

from engine.spec import registry

IMPL = registry.implementation("reliab_keyleak", identity=lambda x: x)
USER, HOST = getpass.getuser(), socket.gethostname()
TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"


@registry.check("reliab_keyleak.keys_and_steps")
def keys_and_steps(impl, ctx):
    ctx.record_step(**{f"loss@{HOST}": 1.0, str(Path.home() / "run" / "x.pt"): 2.0,
                       os.environ["CONTRACTS_LEAK_CANARY"]: 3.0},
                    text=f"ran as {USER} on {HOST} with token {TOKEN} and secret "
                         f"{os.environ['CONTRACTS_LEAK_CANARY']}", host=HOST,
                    nested={f"{USER}@{HOST}": {"note": f"api_key={TOKEN[4:]}"}})
    return {"err": 0.0, f"{USER}@{HOST}": 1.0, os.environ["CONTRACTS_LEAK_CANARY"]: 2.0}


@registry.mutant("reliab_keyleak.none", base="reliab_keyleak")
def none():
    return IMPL.replace("reliab_keyleak.none", identity=lambda x: x + 1)
'''

KEY_LEAK_SPEC = LEAKY_SPEC.replace("reliab-leaky", "reliab-keyleak").replace("reliab_leaky", "reliab_keyleak") \
    .replace('"2601.00004"', '"2601.00005"')


@pytest.fixture()
def key_leaky(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    text = KEY_LEAK_SPEC
    for cid in ("raises", "records"):  # both contracts run the one leaky check
        text = text.replace(f"check: reliab_keyleak.{'raises_with_paths' if cid == 'raises' else 'records_paths'}",
                            "check: reliab_keyleak.keys_and_steps")
    (specs / "reliab-keyleak.yaml").write_text(text)
    with registered_package(tmp_path / "pkg", "reliab_keyleak_pkg", KEY_LEAK_PACKAGE):
        yield specs


def test_a_check_leaking_through_keys_and_step_text_leaves_nothing(key_leaky, tmp_path):
    receipts = tmp_path / "receipts"
    res = CliRunner().invoke(app, ["check", "reliab-keyleak", "--specs", str(key_leaky), "--receipts", str(receipts)])
    assert res.exit_code in (0, 1), res.output
    (path,) = (receipts / "reliab-keyleak").glob("*.json")
    text = path.read_text()
    stmt = json.loads(text)
    assert leaks(stmt) == []
    for secret in (CANARY, str(Path.home()) + "/", f"{USER}@{HOST}", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"):
        assert secret not in text, secret
    step = next(m for m in stmt["predicate"]["mechanism"] if m["steps"])["steps"][0]
    assert step["text"] == "ran as <user> on <host> with token <secret> and secret " + f"<env:{CANARY_NAME}>"
    assert step["host"] == "<host>" and f"loss@<host>" in step and "<abs>/x.pt" in step
    assert f"<env:{CANARY_NAME}>" in step and step["nested"] == {"<user>@<host>": {"note": "api_key=<secret>"}}
    measured = stmt["predicate"]["results"][0]["measurements"]
    assert "<user>@<host>" in measured and f"<env:{CANARY_NAME}>" in measured and measured["err"] == 0.0
