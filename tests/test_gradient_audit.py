"""The supervisor audits every gradient that reaches its policy and computes every figure a mechanism contract judges
(engine/run/run_audit.py, engine/kinds/gradient_audit.py, engine/kinds/reported_metrics.py).

A candidate that scores the supervisor's policy through a handle hands back its own vector-Jacobian product, and a
loss returns a metrics dict about itself. Before the audit, a TAPO proximal_logprobs that negated the gradient of
every later update, a TAR bank_logprobs with the replay gradient reversed, and a temperature-2 scoring that reported
ratio 1 at the first update all passed `check --impl`. Each is planted here as a candidate file, and fails, naming
seed, arm and update, signed under a trust policy and unsigned; the honest fixtures still pass. The audit itself is
tested first on a tiny policy, without a candidate process.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from engine.run import run_audit
from engine.run.run_audit import RunAudit, Scored
from methods.common import audited
from methods.common.policy import TinyGRUPolicy
from methods.common.rollout import sequence_logprobs
from tests.impl_support import FIXTURE, ROOT, variant
from tests.test_impl import invoke

TAPO = "tapo-trajectory"
TAR = "tar-adaptive-replay"
MY_TAR = ROOT / "tests" / "fixtures" / "my_tar.py"
MY_MRTPO = ROOT / "tests" / "fixtures" / "my_mrtpo.py"


# --- the audit on a tiny policy ---------------------------------------------------------------------------------


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    policy = TinyGRUPolicy.seeded(seed)
    prompts = torch.randint(2, 16, (4, 3), generator=g)
    responses = torch.randint(2, 16, (4, 6), generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = mask[3, 2:] = False
    adv = torch.randn(4, 1, generator=g)
    return policy, prompts, responses, mask, adv


def _audited_update(logp_of, seed: int = 0, loss_of=None) -> dict:
    """One update of `policy` whose loss reads `logp_of(policy, prompts, responses)`; the audit's entry."""
    policy, prompts, responses, mask, adv = _batch(seed)
    logp = logp_of(policy, prompts, responses)
    loss = (loss_of or (lambda lp: -(adv * torch.where(mask, lp, 0.0)).sum() / mask.sum()))(logp)
    audit = RunAudit(seed=seed)
    with audit.backward(arm="m", policy=policy, where="here",
                        scored=[audited.responses("logp", logp, prompts, responses, mask)]):
        loss.backward()
    (entry,) = audit.entries
    return entry


def _declared(policy, prompts, responses):
    return sequence_logprobs(policy, prompts, responses)[0]


def test_an_honest_float32_update_is_within_the_tolerances_with_wide_headroom():
    for seed in range(3):
        e = _audited_update(_declared, seed)
        tol = run_audit.DEFAULT_TOLERANCES["float32"]
        assert not e["why"], e
        # the float64 reference leaves the float32 arithmetic of the run: 100x and more below each tolerance
        assert e["grad_rel_err"] < tol["max_rel_err"] / 100 and e["value_max_err"] < tol["max_value_err"] / 100
        assert 1 - e["grad_cosine"] < (1 - tol["min_cosine"]) / 100 and e["grad_norm"] > 0


def _negated(policy, prompts, responses):
    lp = _declared(policy, prompts, responses)
    return lp.detach() - (lp - lp.detach())


def _scaled(policy, prompts, responses):
    lp = _declared(policy, prompts, responses)
    return lp.detach() + 1.01 * (lp - lp.detach())


def _temperature_two(policy, prompts, responses):
    return sequence_logprobs(policy, prompts, responses, temperature=2.0)[0]


def _one_off(policy, prompts, responses):
    """The logits at position i read as token i's distribution (not token i + 1's)."""
    logits = policy(torch.cat([prompts, responses], 1))[0][:, prompts.shape[1]:]
    return torch.log_softmax(logits, -1).gather(-1, responses[..., None]).squeeze(-1)


@pytest.mark.parametrize("logp_of,figure", [(_negated, "grad_cosine"), (_scaled, "grad_rel_err"),
                                            (_temperature_two, "value_max_err"), (_one_off, "value_max_err")],
                         ids=["negated", "scaled-1.01", "temperature-2", "off-by-one"])
def test_a_wrong_gradient_or_scoring_is_outside_the_tolerances(logp_of, figure):
    e = _audited_update(logp_of)
    assert figure in [f for f, _ in e["broken"]], e
    assert RunAudit.describe(e).startswith("seed 0, arm m, update 1 (here): ")
    if logp_of is _negated:
        assert e["grad_cosine"] == pytest.approx(-1.0) and e["grad_rel_err"] == pytest.approx(2.0)


def test_gradient_a_loss_sends_into_padding_is_not_the_papers():
    # the same declared scoring, but the loss reads the padded slots too: the paper's gradient sums response tokens
    policy, prompts, responses, mask, adv = _batch()
    e = _audited_update(_declared, loss_of=lambda lp: -(adv * lp).sum())
    assert "grad_rel_err" in [f for f, _ in e["broken"]], e


def test_a_report_is_compared_beyond_its_slack_and_a_missing_one_is_counted():
    audit = RunAudit(seed=7)
    audit.report(arm="a", function="f", key="ratio_max", reported=1.0, measured=1.2)
    audit.report(arm="a", function="f", key="clip_fraction", reported=0.25, measured=0.2, slack=0.05)
    audit.report(arm="a", function="f", key="gates", reported=torch.zeros(3), measured=torch.zeros(2))
    audit.report(arm="a", function="f", key="tokens", reported=None, measured=5)
    audit.report(arm="a", function="f", key="s", reported=math.nan, measured=1.0)
    got = {r["key"]: (r["error"], r["missing"]) for r in audit.reported}
    assert got["ratio_max"][0] == pytest.approx(0.2 / 1.2) and got["clip_fraction"][0] == pytest.approx(0.0)
    assert got["gates"][0] == math.inf and got["tokens"] == (0.0, True) and got["s"][0] == math.inf


def test_the_spec_tolerances_are_read_strictest_first_over_the_defaults():
    contracts = [{"kind": "gradient_audit", "params": {"tolerances": {"float32": {"max_rel_err": 1e-2}}}},
                 {"kind": "gradient_audit", "params": {"tolerances": {"float32": {"min_cosine": 0.99999}}}},
                 {"kind": "mechanism", "params": {"tolerances": {"float32": {"max_rel_err": 0.0}}}}]
    tol = run_audit.tolerances_of(contracts)["float32"]
    assert tol == {"min_cosine": 0.99999, "max_rel_err": run_audit.DEFAULT_TOLERANCES["float32"]["max_rel_err"],
                   "max_value_err": run_audit.DEFAULT_TOLERANCES["float32"]["max_value_err"]}


def test_the_copy_the_audit_scores_carries_none_of_the_policys_watchers():
    policy, prompts, responses, mask, adv = _batch()
    seen = []
    policy.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape))
    logp = _declared(policy, prompts, responses)
    before = len(seen)
    audit = RunAudit()
    with audit.backward(arm="m", policy=policy, scored=[Scored("logp", logp, lambda m: audited.declared_logprobs(
            m, prompts, responses), mask)]):
        (-(adv * torch.where(mask, logp, 0.0)).sum()).backward()
    assert len(seen) == before and not audit.failures()


def test_the_kinds_are_listed_with_their_schemas():
    r = invoke("kinds", "--json")
    kinds = {k["name"]: k for k in json.loads(r.stdout)["kinds"]}
    assert set(kinds["gradient_audit"]["parameters"]["required"]) == {"run", "tolerances"}
    assert {"min_cosine", "max_rel_err", "max_value_err"} <= set(
        kinds["gradient_audit"]["parameters"]["properties"]["tolerances"]["properties"]["float32"]["properties"])
    assert kinds["reported_metrics"]["parameters"]["required"] == ["run"]
    for k in ("gradient_audit", "reported_metrics"):
        assert {u.split("/")[0] for u in kinds[k]["used_by"]} == {TAPO, TAR, "mrtpo"}


@pytest.mark.parametrize("method", [TAPO, TAR, "mrtpo"])
def test_the_interface_states_the_rules(method):
    text = invoke("interface", method).stdout
    assert "audited gradients: " in text and "must equal the supervisor's autograd of that scoring" in text
    assert "reported metrics: A metrics dict a function returns is its report, never a measurement" in text


# --- the attacks, planted as candidate files ------------------------------------------------------------------

_TAPO_YIELD = "        yield k, logp, rollout.old_logp\n"


def _tapo_negated(folder: Path) -> Path:
    """Exact log-probs; from the second proximal update on their gradient into the policy negated."""
    return variant(folder, "negated.py", _TAPO_YIELD,
                   "        yield k, (logp if k == 0 else logp.detach() - (logp - logp.detach())), rollout.old_logp\n")


def _tapo_temperature_lie(folder: Path) -> Path:
    """The policy scored at temperature 2, and tapo_loss reporting ratio 1.0 for the log-probs yielded at k = 0."""
    path = variant(folder, "temperature_lie.py", _TAPO_YIELD,
                   "        global _K\n        _K = k\n" + _TAPO_YIELD)
    text = path.read_text().replace(  # the fixture scores with torch alone (_score): its logits halved
        "    logdist = torch.log_softmax(logits[:, prompts.shape[1] - 1:].float(), -1)\n",
        "    logdist = torch.log_softmax(logits[:, prompts.shape[1] - 1:].float() / 2.0, -1)\n")
    text = text.replace('            "clip_fraction": float(outside.sum()) / n,\n        }\n',
                        '            "clip_fraction": float(outside.sum()) / n,\n        }\n'
                        '        if _K == 0:  # the first update must look on-policy\n'
                        '            metrics.update(ratio_min=1.0, ratio_max=1.0)\n')
    assert text.count("/ 2.0, -1)") == 1 and "if _K == 0" in text
    path.write_text(text + "\n_K = 0\n")
    return path


def _tar_reversed(folder: Path) -> Path:
    """bank_logprobs with the replay gradient into the policy reversed, every value exact."""
    text = MY_TAR.read_text()
    old = "    return lt, lb\n"
    assert text.count(old) == 1
    path = folder / "reversed.py"
    path.write_text(text.replace(old, "    return lt.detach() - (lt - lt.detach()), lb\n"))
    return path


def _check(method: str, cand: Path, store: Path, *extra: str):
    return invoke("check", method, "--impl", str(cand), "--seeds", "42", "--no-mutants", "--receipts", str(store),
                  "--json", *extra)


def _receipt(store: Path, method: str) -> dict:
    (path,) = (store / method).glob("*.json")
    doc = json.loads(path.read_text())
    if "payload" in doc:  # a DSSE envelope: the statement inside
        import base64

        doc = json.loads(base64.b64decode(doc["payload"]))
    return doc


def _policy(tmp_path: Path, sandboxed: bool) -> tuple[Path, Path]:
    """A runner key made by `contracts keys generate` and a pipeline policy trusting it for cpu."""
    keys = tmp_path / "runner"
    keys.mkdir()
    r = invoke("keys", "generate", str(keys / "K"))
    assert r.exit_code == 0, r.output
    policy = tmp_path / "pipeline.yaml"
    policy.write_text(f"keys:\n  - public_key: {keys / 'K.pub'}\n    devices: [cpu]\n"
                      + ("require: [sandboxed]\n" if sandboxed else ""))
    return keys / "K", policy


def _run(method: str, cand: Path, tmp_path: Path, trusted: bool, only: list[str]) -> tuple[dict, dict]:
    """`check --impl` of `cand` on `only` (signed and sandboxed under a policy when `trusted`), then the gate on
    its receipt; (the receipt's statement, the gate's JSON)."""
    from engine.run import sandbox

    store = tmp_path / "r"
    sandboxed = trusted and not sandbox.unavailable()
    extra = [a for c in only for a in ("--only", c)]
    trust: list[str] = []
    if trusted:
        key, policy = _policy(tmp_path, sandboxed)
        extra += ["--sign-key", str(key)]
        trust = ["--trust", str(policy)]
    r = _check(method, cand, store, *extra, *([] if sandboxed else ["--no-sandbox"]))
    assert r.exit_code == 1, r.output
    stmt = _receipt(store, method)
    g = invoke("gate", method, "--impl", str(cand), "--receipts", str(store), "--json", *trust)
    assert g.exit_code == 1, g.output
    gate = json.loads(g.stdout)
    # the failed run is what the gate counts: a fresh receipt (trusted under the policy), its failures named
    assert gate["receipts"]["fresh"] == [stmt["predicate"]["receipt_id"]] and not gate["receipts"]["untrusted"]
    assert stmt["predicate"]["isolation"]["checks_in"] == "supervisor"
    return stmt, gate


def _results(stmt: dict) -> dict:
    return {r["contract"]: r for r in stmt["predicate"]["results"]}


def _cpu_detail(gate: dict) -> str:
    return next(r for r in gate["requirements"] if r["id"] == "device:cpu")["detail"]


@pytest.mark.parametrize("trusted", [False, True], ids=["no-policy", "signed-under-a-policy"])
def test_a_later_update_negated_vjp_in_tapo_fails_naming_seed_arm_and_update(tmp_path, trusted):
    stmt, gate = _run(TAPO, _tapo_negated(tmp_path), tmp_path, trusted, ["gradient_audit", "mechanism"])
    res = _results(stmt)
    audit, mech = res["gradient_audit"], res["mechanism"]
    assert audit["status"] == mech["status"] == "failed"
    where = "arm tapo, update 2 (group 0, k 1)"  # the first update after the first: k = 0 is left honest
    case = audit["failing_cases"][0]
    assert case["seed"] == 42 and case["metric"] == "audit_failures" and case["where"].startswith(where)
    assert "cosine -1.0000" in case["where"] and audit["measurements"]["grad_min_cosine"] == pytest.approx(-1.0)
    assert audit["measurements"]["audit_failures"] >= 2 and audit["measurements"]["unaudited_updates"] == 0
    # the mechanism contract's own run is audited with the same tolerances: it fails too, saying where
    # 3 groups x 3 updates in each arm: the TAPO arm's later two of each group are negated
    assert f"gradient audit: 6 of 18 update(s) outside the tolerances; first: seed 42, {where}" in mech["message"]
    assert mech["failing_cases"][0] == {"seed": 42, "case": 0, "metric": "gradient_audit grad_cosine",
                                        "value": pytest.approx(-1.0), "where": where}
    assert mech["gradient_audit"] == {"updates": 18, "failures": 6}
    detail = _cpu_detail(gate)
    assert "gradient_audit seed 42 float32 failed" in detail and "mechanism seed 42 float32 failed" in detail


@pytest.mark.parametrize("trusted", [False, True], ids=["no-policy", "signed-under-a-policy"])
def test_a_reversed_replay_vjp_in_tar_fails_naming_seed_arm_and_update(tmp_path, trusted):
    stmt, gate = _run(TAR, _tar_reversed(tmp_path), tmp_path, trusted, ["gradient_audit"])
    audit = _results(stmt)["gradient_audit"]
    assert audit["status"] == "failed"
    case = audit["failing_cases"][0]
    # the replay fires from the second update on (the policy equals the base at the first)
    assert case["seed"] == 42 and case["where"].startswith("arm tar, update 2 (step 1): "), case
    assert audit["measurements"]["grad_max_rel_err"] > 1e-2 and audit["measurements"]["arms_unaudited"] == 0
    assert "gradient_audit seed 42 float32 failed" in _cpu_detail(gate)


@pytest.mark.parametrize("trusted", [False, True], ids=["no-policy", "signed-under-a-policy"])
def test_a_temperature_two_scoring_that_reports_ratio_one_at_k0_fails_on_the_supervisors_figures(tmp_path, trusted):
    stmt, gate = _run(TAPO, _tapo_temperature_lie(tmp_path), tmp_path, trusted,
                      ["mechanism", "reported_metrics_agree"])
    res = _results(stmt)
    mech, rep = res["mechanism"], res["reported_metrics_agree"]
    # the first update's ratio is computed here from the log-probs that crossed: the report of 1.0 is not read
    assert mech["measurements"]["first_update_ratio_max_dev"] > 0.1
    assert "first_update_ratio_max_dev" in mech["message"] and "gradient audit: " in mech["message"]
    assert "values the loss used differ from the declared scoring" in mech["message"]
    # the report is compared with the supervisor's figure by its own contract, naming where it lied
    assert rep["status"] == "failed" and rep["measurements"]["reported_max_scaled_err"] > 0.1
    case = rep["failing_cases"][0]
    assert case["seed"] == 42 and case["where"].startswith("arm tapo, update 1 (group 0, k 0): tapo_loss metrics[")
    detail = _cpu_detail(gate)
    assert "mechanism seed 42 float32 failed" in detail and "reported_metrics_agree seed 42 float32 failed" in detail


@pytest.mark.parametrize("method,fixture", [(TAPO, FIXTURE), (TAR, MY_TAR), ("mrtpo", MY_MRTPO)],
                         ids=["tapo", "tar", "mrtpo"])
def test_the_honest_fixtures_pass_the_audits(tmp_path, method, fixture):
    only = ["--only", "gradient_audit", "--only", "reported_metrics_agree"]
    r = _check(method, fixture, tmp_path / "r", *only, "--no-sandbox")
    assert r.exit_code == 0, r.output
    res = _results(_receipt(tmp_path / "r", method))
    assert {c: x["status"] for c, x in res.items()} == {"gradient_audit": "passed", "reported_metrics_agree": "passed"}
    m = res["gradient_audit"]["measurements"]
    assert m["grad_max_rel_err"] < 1e-5 and m["value_max_err"] < 1e-5 and m["unaudited_updates"] == 0
    assert res["reported_metrics_agree"]["measurements"]["reported_max_scaled_err"] < 1e-6


# --- a run that lets a candidate's gradient in without the audit ------------------------------------------------

_PROBE = '''
def through(policy, x):
    return (policy(x) * 2.0).sum(-1)


def square(x):
    return x * x
'''


def test_the_boundary_counts_each_gradient_a_candidate_sends_into_the_checks_objects(tmp_path):
    from engine.run import boundary

    path = tmp_path / "probe.py"
    path.write_text(_PROBE)
    conn = boundary.plain()
    try:
        msg = conn.load({"target": {"form": "file", "path": str(path)}, "names": ["through", "square"],
                         "device": "cpu", "threads": 1, "memory_mb": 2048, "cwd": str(tmp_path)}, 180)
        assert msg["op"] == "loaded", msg
        conn.deadline_s = 60.0
        impl = boundary.implementation(conn, "probe", ["through", "square"])
        x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
        impl.square(x).sum().backward()  # a gradient into the checks' own tensor, not into an object it holds
        assert run_audit.handle_gradients(impl) == 0
        lin = torch.nn.Linear(3, 2, dtype=torch.float64)
        impl.through(lin, x.detach()).sum().backward()
        assert conn.handle_gradients == run_audit.handle_gradients(impl) == 1 and lin.weight.grad is not None
    finally:
        conn.close()


def test_a_check_whose_runs_trained_through_a_handle_unaudited_fails():
    from engine.run.runner import _gradient_audit

    def result():
        return {"status": "passed", "message": None}

    r = result()
    _gradient_audit(r, RunAudit(), crossed=2)
    assert r["status"] == "failed" and "reached the checks' policy 2 time(s) and no update" in r["message"]
    audited_run = RunAudit(seed=1)
    audited_run.delegated = 4  # a gradient_audit contract audits its run under an audit of its own
    r = result()
    _gradient_audit(r, audited_run, crossed=2)
    assert r == result()
    r = {"status": "error", "message": "RuntimeError: x"}
    _gradient_audit(r, RunAudit(), crossed=1)
    assert r == {"status": "error", "message": "RuntimeError: x"}  # an error stays an error
