"""Reviews bound to the spec: a review approves the digest of the spec's reviewed fields, and only then counts.

The attack of the trust issue: a spec loosened after review (a tolerance widened, a mutant removed) kept
`review: DONE`, and a genuine signed run opened `gate --trust` and passed `promote --trust`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.cli as cli
from engine.gate import review as RV
from engine.paths import default_specs_dir, project_root
from engine.spec import registry
from engine.spec.loader import load_spec
from engine.store import ledger
from tests import gate_support as G


def _invoke(*args: str):
    return CliRunner().invoke(cli.app, list(args))


def _keys(base: Path, name: str) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    res = _invoke("keys", "generate", str(base / name))
    assert res.exit_code == 0, res.output
    return base / name


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The toy spec, a runner key and a reviewer key, a policy trusting each for its role, one signed run."""
    monkeypatch.setattr(registry, "_STATIC", G.TOY_NAMES)
    monkeypatch.delenv("CONTRACTS_TRUST", raising=False)
    root, specs, receipts = G.make_layout(tmp_path)
    monkeypatch.setattr("engine.paths.project_root", lambda: root)
    pipeline = tmp_path / "pipeline"
    runner, reviewer = _keys(pipeline, "runner"), _keys(pipeline, "reviewer")
    policy = pipeline / "trust.yaml"
    policy.write_text("keys:\n  - public_key: runner.pub\n    devices: [cpu]\n"
                      "reviewers:\n  - public_key: reviewer.pub\n")
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead(), sign_key=runner)
    return {"root": root, "specs": specs, "receipts": receipts, "runner": runner, "reviewer": reviewer,
            "policy": policy, "spec": specs / "toy.yaml"}


def _args(s: dict, trust: bool = True) -> list[str]:
    return ["--specs", str(s["specs"]), "--receipts", str(s["receipts"])] + (["--trust", str(s["policy"])]
                                                                             if trust else [])


def _gate(s: dict, trust: bool = True) -> tuple[int, dict]:
    res = _invoke("gate", "toy", "--json", *_args(s, trust))
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def _review_req(doc: dict) -> dict:
    return next(r for r in doc["requirements"] if r["id"] == "review")


def _approve(s: dict, *extra: str):
    res = _invoke("review", "toy", "--approve", "--reviewer", "A. Reviewer", "--note", "read every contract",
                  *_args(s, trust=False), *extra)
    assert res.exit_code == 0, res.output
    return res


def _edit(s: dict, old: str, new: str) -> None:
    text = s["spec"].read_text()
    assert old in text
    s["spec"].write_text(text.replace(old, new, 1))


# --- the attack: a spec loosened after review ---------------------------------------------------------


_TWIN = ("  - id: twin\n    description: the same planted bug, listed twice\n    mutant: toy.off_by_a_bit\n"
         "    killed_by: [double-value]\nbudget:\n")


@pytest.mark.parametrize("old,new,field", [
    ("      - {metric: max_abs_err, le: 1.0e-6}\n", "      - {metric: max_abs_err, le: 1.0e-2}\n",
     "contracts[double-value].expect[0].le"),
    (_TWIN, "budget:\n", "mutants[twin] (removed)"),
    ("    formal_comparison: true\n", "    formal_comparison: false\n", "promotion.requires.formal_comparison"),
])
def test_a_spec_loosened_after_review_makes_the_review_stale_and_the_gate_names_the_field(store, old, new, field):
    s = store
    _edit(s, "budget:\n", _TWIN)  # a second mutant entry, so that removing one leaves a valid spec
    twin = {"off-by-a-bit": True, "twin": True}
    G.write(s["root"], s["receipts"], s["spec"], comparisons=G.ahead(), sign_key=s["runner"], mutants=twin)
    _approve(s, "--sign-key", str(s["reviewer"]))
    code, doc = _gate(s)
    assert code == 0 and doc["promotable"] and _review_req(doc)["review"]["signature"] == "trusted"
    _edit(s, old, new)
    # a genuine run of the loosened spec, signed by the trusted runner: everything but the review is sound
    G.write(s["root"], s["receipts"], s["spec"], comparisons=G.ahead(), sign_key=s["runner"],
            mutants={"off-by-a-bit": True} if "twin" in field else twin)
    code, doc = _gate(s)
    req = _review_req(doc)
    assert code == 1 and not doc["promotable"] and not req["met"] and req["review"] is None
    assert [r["id"] for r in doc["requirements"] if not r["met"]] == ["review"]
    assert "is stale: the spec changed since in " + field in req["detail"], req["detail"]
    assert req["fix"] is None and "contracts review toy --approve" in req["note"]  # a person, not a pipeline
    text = _invoke("gate", "toy", *_args(s))
    assert text.exit_code == 1 and "UNMET review: " in text.stdout and field in text.stdout
    before = s["spec"].read_bytes()
    res = _invoke("promote", "toy", "--reason", "loosened", *_args(s))
    assert res.exit_code == 1 and field in res.output and s["spec"].read_bytes() == before
    assert [e["action"] for e in ledger.read(s["receipts"]).entries] == ["review"]
    # a new review of the loosened spec is what opens it again
    _approve(s, "--sign-key", str(s["reviewer"]))
    assert _gate(s)[0] == 0


def test_reviewed_fields_exclude_only_state_review_status_and_notes():
    """On the shipped TAPO spec: a clip tolerance widened, a mutant removed, and the other reviewed fields."""
    path = default_specs_dir() / "tapo-trajectory.yaml"
    data = load_spec(path, project_root()).data
    fields = RV.reviewed_fields(data)
    assert set(data) == set(fields)  # every top-level field is reviewed
    assert set(data["promotion"]) - set(fields["promotion"]) == {"state", "review", "reasons"}
    digest = RV.reviewed_digest(data)
    # what a review does not cover leaves the digest alone
    moved = json.loads(json.dumps(data))
    moved["promotion"].update(state="promoted", review="TODO", reasons=["another note"])
    assert RV.reviewed_digest(moved) == digest
    # the fields the issue names each move it, and the change is named by its path
    clip = next(i for i, c in enumerate(data["contracts"]) if c["id"] == "clip_schedule")
    for edit, named in (
            (lambda d: d["contracts"][clip]["expect"][1].update(le=1.0e-2), "contracts[clip_schedule].expect[1].le"),
            (lambda d: d["mutants"].pop(0), f"mutants[{data['mutants'][0]['id']}]"),
            (lambda d: d["budget"]["seeds"].pop(), "budget.seeds"),
            (lambda d: d["promotion"]["requires"].update(mutation_score=0.5), "promotion.requires.mutation_score"),
            (lambda d: d["assumptions"][0].update(text="x"), f"assumptions[{data['assumptions'][0]['id']}].text"),
            (lambda d: d["interface"]["functions"][0]["args"][0].update(meaning="x"),
             "interface.functions[trajectory_ratio].args[logp].meaning"),
            (lambda d: d.setdefault("equivalent_mutants", []).append({"id": "a:1:b:0123456789", "reason": "r"}),
             "equivalent_mutants"),
            (lambda d: d["formulas"][0].update(latex="x"), "formulas[prefix_ratio].latex")):
        changed = json.loads(json.dumps(data))
        edit(changed)
        assert RV.reviewed_digest(changed) != digest, named
        assert any(c["field"].startswith(named) for c in RV.changed_fields(fields, RV.reviewed_fields(changed))), (
            named, RV.changed_fields(fields, RV.reviewed_fields(changed)))


def test_comments_and_layout_do_not_stale_a_review_but_state_changes_by_promote_neither(store):
    s = store
    _approve(s, "--sign-key", str(s["reviewer"]))
    _edit(s, "# Toy spec for the gate tests", "# A reworded comment for the gate tests")
    _edit(s, "  review: DONE   # reviewed by hand", "  review: DONE")
    G.write(s["root"], s["receipts"], s["spec"], comparisons=G.ahead(), sign_key=s["runner"])
    assert _gate(s)[0] == 0
    res = _invoke("promote", "toy", "--reason", "reviewed and signed", *_args(s))
    assert res.exit_code == 0, res.output
    code, doc = _gate(s)
    assert code == 0 and doc["state"] == "promoted" and _review_req(doc)["met"]
    entry = ledger.read(s["receipts"]).entries[-1]
    assert entry["action"] == "promote" and entry["review"] == 1 and entry["unsigned"] is False
    assert entry["trust"]["sha256"] == doc["trust"]["sha256"]


# --- who may review, under a trust policy ---------------------------------------------------------------


def test_an_unsigned_review_under_a_trust_policy_is_refused(store):
    s = store
    _approve(s)  # no --sign-key
    code, doc = _gate(s)
    req = _review_req(doc)
    assert code == 1 and not req["met"] and req["not_counted"][0]["why"].startswith("unsigned")
    assert "--sign-key KEY" in req["note"] and "lists under reviewers:" in req["note"]
    res = _invoke("promote", "toy", "--reason", "x", *_args(s))
    assert res.exit_code == 1 and not ledger.read(s["receipts"]).entries[-1]["action"] == "promote"
    # without a policy the same review counts, and the gate says the evidence is not verified
    code, doc = _gate(s, trust=False)
    assert code == 0 and doc["evidence"]["unsigned"] and doc["evidence"]["review"]["signature"] == "unsigned"
    text = _invoke("gate", "toy", *_args(s, trust=False))
    assert text.exit_code == 0 and "  unsigned: 1 receipt(s) and the review counted without a trust policy" in text.stdout
    code, doc = _gate(s)
    assert not doc["evidence"]["unsigned"]


def test_a_review_signed_by_a_runner_key_or_an_unknown_key_or_altered_is_refused(store, tmp_path):
    s = store
    _approve(s, "--sign-key", str(s["runner"]))  # the key that signs candidate runs: not a reviewer
    req = _review_req(_gate(s)[1])
    assert not req["met"] and "not a reviewer key" in req["not_counted"][0]["why"]
    _approve(s, "--sign-key", str(_keys(tmp_path / "elsewhere", "stranger")))
    assert not _review_req(_gate(s)[1])["met"]
    _approve(s, "--sign-key", str(s["reviewer"]))
    assert _gate(s)[0] == 0
    # alter the signed review's note and re-seal the entry's own digest: the signature no longer verifies
    path = ledger.ledger_path(s["receipts"])
    lines = path.read_bytes().splitlines()
    entry = json.loads(lines[-1])
    entry["review"]["note"] = "rubber-stamped"
    entry["entry_sha256"] = ledger.entry_digest(entry)
    from engine.store.receipts import canonical

    path.write_bytes(b"\n".join(lines[:-1] + [canonical(entry)]) + b"\n")
    req = _review_req(_gate(s)[1])
    assert not req["met"] and req["not_counted"][0]["why"].startswith("bad signature")
    # and a forged review body (another spec's fields under this digest) is refused whatever it is signed with
    entry["review"]["reviewed"]["budget"]["seeds"] = [9]
    entry["entry_sha256"] = ledger.entry_digest(entry)
    path.write_bytes(b"\n".join(lines[:-1] + [canonical(entry)]) + b"\n")
    assert "do not match its digest" in _review_req(_gate(s, trust=False)[1])["not_counted"][0]["why"]


def test_a_policy_may_not_list_one_key_as_runner_and_reviewer(store):
    s = store
    s["policy"].write_text("keys:\n  - public_key: runner.pub\n    devices: [cpu]\n"
                           "reviewers:\n  - public_key: runner.pub\n")
    res = _invoke("gate", "toy", *_args(s))
    assert res.exit_code == 2 and "also a runner key" in res.stderr and res.stderr.count("\n") == 1


def test_a_policy_without_reviewers_lets_no_review_count(store):
    s = store
    _approve(s, "--sign-key", str(s["reviewer"]))
    s["policy"].write_text("keys:\n  - public_key: runner.pub\n    devices: [cpu]\n")
    req = _review_req(_gate(s)[1])
    assert not req["met"] and "not a reviewer key" in req["not_counted"][0]["why"]


# --- migration and promote ------------------------------------------------------------------------------


def test_review_done_in_the_yaml_alone_no_longer_opens_the_gate_and_the_fix_says_how(store):
    s = store
    code, doc = _gate(s, trust=False)
    req = _review_req(doc)
    assert code == 1 and [r["id"] for r in doc["requirements"] if not r["met"]] == ["review"]
    assert "promotion.review: DONE alone does not count" in req["detail"]
    assert req["fix"] is None and req["note"].endswith(
        f"contracts review toy --approve --reviewer NAME --note TEXT --specs {s['specs']} --receipts {s['receipts']}")
    status = _invoke("review", "toy", *_args(s, trust=False))
    assert status.exit_code == 1 and "no review in the ledger approves this spec" in status.stdout
    _approve(s)
    status = _invoke("review", "toy", *_args(s, trust=False))
    assert status.exit_code == 0 and "approved by ledger entry 1" in status.stdout


def test_promote_without_a_policy_needs_allow_unsigned(store):
    s = store
    _approve(s)
    before = s["spec"].read_bytes()
    res = _invoke("promote", "toy", "--reason", "x", *_args(s, trust=False))
    assert res.exit_code == 2 and s["spec"].read_bytes() == before
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("error: promote without a trust policy") and "--allow-unsigned" in line
    assert "--trust POLICY.yaml" in line
    res = _invoke("promote", "toy", "--reason", "x", "--allow-unsigned", *_args(s, trust=False))
    assert res.exit_code == 0, res.output
    entry = ledger.read(s["receipts"]).entries[-1]
    assert entry["action"] == "promote" and entry["unsigned"] is True and entry["trust"] is None
    assert _invoke("demote", "toy", "--reason", "y", *_args(s, trust=False)).exit_code == 0  # demote: always
    assert _invoke("verify", *_args(s, trust=False)).exit_code == 0  # the review entries keep the ledger sound


def test_review_usage_errors_are_one_line(store):
    s = store
    for extra, why in ((["--reviewer", "x"], "add --approve"), (["--approve", "--note", "n"], "--reviewer is empty"),
                       (["--approve", "--reviewer", "r", "--note", " "], "--note is empty"),
                       (["--approve", "--reviewer", "r", "--note", "n", "--sign-key", "/nonexistent/k"],
                        "no such file")):
        res = _invoke("review", "toy", *extra, *_args(s, trust=False))
        assert res.exit_code == 2 and why in res.stderr and res.stderr.count("\n") == 1, (extra, res.output)
    assert not ledger.ledger_path(s["receipts"]).exists()


def test_gate_json_and_ledger_lines_match_their_published_schemas(store):
    from jsonschema import Draft202012Validator

    s = store
    repo = Path(__file__).resolve().parent.parent / "engine" / "schemas"
    gate_schema = Draft202012Validator(json.loads((repo / "gate.schema.json").read_text()))
    ledger_schema = Draft202012Validator(json.loads((repo / "ledger.schema.json").read_text()))
    _approve(s, "--sign-key", str(s["reviewer"]))
    _edit(s, "      - {metric: max_abs_err, le: 1.0e-6}\n", "      - {metric: max_abs_err, le: 1.0e-2}\n")
    for trust in (True, False):
        gate_schema.validate(_gate(s, trust)[1])  # a stale review, with its changed fields
    _approve(s)
    gate_schema.validate(_gate(s, trust=False)[1])  # an unsigned review counted
    assert _invoke("promote", "toy", "--reason", "x", "--allow-unsigned", *_args(s, trust=False)).exit_code == 1
    G.write(s["root"], s["receipts"], s["spec"], comparisons=G.ahead(), sign_key=s["runner"])
    assert _invoke("promote", "toy", "--reason", "x", "--allow-unsigned", *_args(s, trust=False)).exit_code == 0
    entries = [json.loads(x) for x in ledger.ledger_path(s["receipts"]).read_text().splitlines()]
    assert [e["action"] for e in entries] == ["review", "review", "promote"]
    for e in entries:
        ledger_schema.validate(e)


def test_review_without_approve_reads_only_and_never_imports_torch(store):
    import subprocess
    import sys

    s = store
    _approve(s, "--sign-key", str(s["reviewer"]))
    script = f"""
import sys
from pathlib import Path
from typer.testing import CliRunner
from engine.spec import registry
from tests import gate_support as G
import engine.cli as cli
import engine.paths
registry._STATIC = G.TOY_NAMES
engine.paths.project_root = lambda: Path({str(s['root'])!r})
res = CliRunner().invoke(cli.app, ["review", "toy", "--json", *{_args(s)!r}])
assert res.exit_code == 0, res.output
assert "torch" not in sys.modules
print("ok")
"""
    before = ledger.ledger_path(s["receipts"]).read_bytes()
    repo = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    assert ledger.ledger_path(s["receipts"]).read_bytes() == before
