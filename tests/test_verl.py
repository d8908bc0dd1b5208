"""`--impl verl:NAME`: a policy loss registered with verl's @register_policy_loss under TAPO's contracts.

verl's own losses are other methods and must fail TAPO's contracts, the receipt saying which; a TAPO loss written
in verl's style (tests/fixtures/verl_tapo.py, registered with verl's real decorator) must hold every contract a
loss can be held to, and the ones it cannot be held to (no separate ratio or clip schedule) must be recorded as
not applicable or partial, never as passed.

Needs the [verl] extra (the README's test command installs it). Without verl these tests skip, except in CI
(CI=true), where a missing verl is a failure: CI is where they must run.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "verl_tapo.py"
METHOD = "tapo-trajectory"
TAPO_LOSS = f"verl:{FIXTURE.relative_to(ROOT).as_posix()}:tapo"
RATIO_ONLY = {"prefix_ratio_forward", "eq15_local_gradient", "clip_schedule", "clip_closed_form",  # a loss has none
              "scale_prefix_ratio"}
LOSS_ONLY = {"loss_forward", "loss_edges", "zero_advantage_rejection", "split_invariance", "overflow_gradient",
             "scale_loss"}
IN_PART = {"masked_junk_invariance", "on_policy_identity", "precision_agreement", "input_validation", "mechanism"}


def _verl_or_skip():
    try:
        import verl.trainer.ppo.core_algos  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure to import is "no usable verl here"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the verl tests: verl does not import ({type(exc).__name__}: {exc}); "
                        "the README's test command installs it with the [verl] extra")
        pytest.skip(f"verl is not importable ({type(exc).__name__}); install it with pip install -e '.[verl]'")


WITHOUT_VERL = {"test_without_verl_a_verl_target_is_exit_4"}  # these need no verl installed


@pytest.fixture(autouse=True)
def _needs_verl(request):
    if request.function.__name__ not in WITHOUT_VERL:
        _verl_or_skip()


runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def check(target: str, store: Path, *extra: str):
    return invoke("check", METHOD, "--impl", target, "--seeds", "42", "--receipts", str(store), "--json", *extra)


def receipt(store: Path) -> dict:
    (path,) = sorted((store / METHOD).glob("*.json"))
    return json.loads(path.read_text())


def statuses(pred: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in pred["results"]:
        out.setdefault(r["contract"], set()).add(r["status"])
    return out


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --- verl's own losses are other methods ---------------------------------------------------------


def test_geo_mean_fails_and_the_receipt_says_which_contracts(tmp_path):
    import verl
    from verl.trainer.ppo import core_algos

    store = tmp_path / "r"
    r = check("verl:geo_mean", store)
    assert r.exit_code == 1, r.output
    stmt = receipt(store)
    pred = stmt["predicate"]
    assert pred["status"] == "failed"
    st = statuses(pred)
    failed = {c for c, s in st.items() if "failed" in s}
    # a sequence-level geometric mean with a constant clip: not TAPO's token-mean prefix-ratio loss, no
    # zero-advantage guard, a per-sequence mean that a token-weighted split cannot recombine, NaN * 0 from junk
    assert {"loss_forward", "zero_advantage_rejection", "split_invariance", "masked_junk_invariance",
            "mechanism"} <= failed, st
    assert all(st[c] == {"not_applicable"} for c in RATIO_ONLY), st
    assert set(pred["applicability"]["not_applicable"]) == RATIO_ONLY
    assert "trajectory_ratio" in pred["applicability"]["partial"]["on_policy_identity"]["reasons"][0]
    # which implementation: verl's version, the function, and the file defining it bound by its sha256
    impl = pred["implementation"]
    assert pred["isolation"]["sandbox"] == "bubblewrap"  # verl imported inside the candidate's own sandbox
    assert impl["framework"] == {"name": "verl", "version": verl.__version__, "object": "geo_mean"}
    assert impl["function"]["qualname"] == "compute_policy_loss_geo_mean"
    core = {"name": "impl:verl/trainer/ppo/core_algos.py", "digest": {"sha256": _sha256(core_algos.__file__)}}
    assert core in stmt["subject"] and impl["function"]["file"] == core["name"]
    assert impl["packages"]["verl"] == verl.__version__
    assert str(Path(core_algos.__file__).parent) not in json.dumps(stmt)  # no absolute path
    # the run's JSON says the same, contract by contract
    run = json.loads(r.stdout)["runs"][0]
    assert {x["contract"] for x in run["results"] if x["status"] == "failed"} == failed
    assert run["applicability"] == pred["applicability"]


@pytest.mark.parametrize("name, also_failed", [
    # both compute in the input dtype: half-precision losses drift past TAPO's float32-or-wider tolerances
    ("vanilla", {"on_policy_identity", "precision_agreement"}),
    # GSPO's sequence ratio sums log_prob * response_mask: NaN * 0 from a masked slot (ANCHORS: OpenRLHF #1240)
    ("gspo", {"masked_junk_invariance", "on_policy_identity", "precision_agreement"}),
])
def test_vanilla_and_gspo_fail(tmp_path, name, also_failed):
    store = tmp_path / "r"
    r = check(f"verl:{name}", store, "--no-mutants")
    assert r.exit_code == 1, r.output
    pred = receipt(store)["predicate"]
    st = statuses(pred)
    failed = {c for c, s in st.items() if "failed" in s}
    assert {"loss_forward", "zero_advantage_rejection", "loss_edges", "mechanism"} | also_failed <= failed
    assert all(st[c] == {"not_applicable"} for c in RATIO_ONLY), st
    assert pred["implementation"]["function"]["qualname"] == f"compute_policy_loss_{name}"
    if name == "vanilla":  # verl's masked_sum uses torch.where: the junk in masked slots stays out
        assert st["masked_junk_invariance"] == {"partial"}


# --- TAPO written as a verl loss -------------------------------------------------------------------


def test_a_verl_style_tapo_holds_every_contract_a_loss_can_be_held_to(tmp_path):
    store = tmp_path / "r"
    r = check(TAPO_LOSS, store)
    assert r.exit_code == 0, r.output
    stmt = receipt(store)
    pred = stmt["predicate"]
    assert pred["status"] == "partial"  # never "passed": three contracts and some measurements are not its to answer
    st = statuses(pred)
    assert all(st[c] == {"passed"} for c in LOSS_ONLY), st
    assert all(st[c] == {"partial"} for c in IN_PART), st
    assert all(st[c] == {"not_applicable"} for c in RATIO_ONLY), st
    for res in pred["results"]:  # a partial result: everything measured held, the rest says why it was not
        for e in res["expectations"]:
            if "not_applicable" in e:
                assert e["passed"] is False and e["value"] is None, (res["contract"], e)
            else:
                assert e["passed"] is True, (res["contract"], e)
    cov = pred["applicability"]
    assert cov["complete"] is False and set(cov["not_applicable"]) == RATIO_ONLY and set(cov["partial"]) == IN_PART
    assert cov["partial"]["mechanism"]["not_measured"] == ["run_ratio_max_rel_err", "run_eps_max_abs_err"]
    # the mechanism run trained through the verl loss, and re-scoring the old log-probs is still caught there
    assert any(m["contract"] == "mechanism" and m["steps"] for m in pred["mechanism"])
    # the adapter's proximal_logprobs swapped for its mutants, with the verl loss in the loop: still caught
    assert {m["id"]: m["killed_by"] for m in pred["candidate_mutants"]} == {
        "old_logp_recomputed": ["mechanism"], "inner_updates_unchecked": ["input_validation"],
        "proximal_negated_later": ["gradient_audit", "mechanism"]}
    # the verl loss trains the policy through the gradient audit, and what it reports agrees with the run's figures
    assert st["gradient_audit"] == {"passed"} and st["reported_metrics_agree"] == {"passed"}, st
    # every registered mutant is killed, but one whose every killer is a contract a loss cannot answer: it is not
    # run, said so, and never counted as killed (clip_default_float32: only clip_closed_form, a schedule contract)
    skipped = {m["id"]: m["expected_killers"] for m in pred["mutants"] if "not_applicable" in m}
    assert skipped == {"clip_default_float32": ["clip_closed_form"]} and set().union(*skipped.values()) <= RATIO_ONLY
    assert all(not m["killed"] and m["results"] == [] for m in pred["mutants"] if m["id"] in skipped)
    assert all(m["killed"] for m in pred["mutants"] if m["id"] not in skipped) and pred["unproven_contracts"] == []
    assert {"name": "impl:verl_tapo.py", "digest": {"sha256": _sha256(FIXTURE)}} in stmt["subject"]
    assert pred["implementation"]["function"] == {
        "name": "tapo", "qualname": "compute_policy_loss_tapo", "file": "impl:verl_tapo.py",
        "sha256": _sha256(FIXTURE)}
    # the gate never counts a partial or not-applicable result as passed
    g = invoke("gate", METHOD, "--impl", TAPO_LOSS, "--receipts", str(store), "--json")
    assert g.exit_code == 1, g.output
    gate = json.loads(g.stdout)
    assert gate["implementation"].startswith("impl:") and gate["receipts"]["fresh"] == [pred["receipt_id"]]
    cpu = next(x for x in gate["requirements"] if x["id"] == "device:cpu")
    assert not cpu["met"] and "prefix_ratio_forward" in cpu["detail"] and "masked_junk_invariance" in cpu["detail"]


def test_a_broken_verl_style_tapo_fails_loss_forward(tmp_path):
    # the clip schedule reversed (eps_min at t = 1): only the loss can show it, and it does
    text = FIXTURE.read_text()
    old = "eps = _schedule(t, lengths.clamp(min=1), eps_min, eps_max)"
    assert text.count(old) == 1
    broken = tmp_path / "verl_tapo_reversed.py"
    broken.write_text(text.replace(old, "eps = _schedule(t, lengths.clamp(min=1), eps_max, eps_min)")
                      .replace('register_policy_loss("tapo")', 'register_policy_loss("tapo_reversed")'))
    store = tmp_path / "r"
    # unsandboxed, to see which warm server its workers forked from (sandboxed, each candidate has a template of its
    # own that imports verl: test_a_verl_style_tapo_holds_every_contract_a_loss_can_be_held_to runs that way)
    r = check(f"verl:{broken}:tapo_reversed", store, "--only", "loss_forward", "--only", "split_invariance",
              "--no-mutants", "--no-sandbox")
    assert r.exit_code == 1, r.output
    st = statuses(receipt(store)["predicate"])
    assert st == {"loss_forward": {"failed"}, "split_invariance": {"passed"}}, st
    # its workers forked from a server of their own that imported verl once, not from the plain server, which
    # other candidates' workers fork from and which is never started with a framework to preload
    from engine.run import warm

    verl_server = warm._FRAMEWORK_SERVERS.get("verl")
    assert verl_server is not None and verl_server.alive() and verl_server.proc.args[-1] == "verl"
    plain = warm.server()
    assert plain is not verl_server and plain.proc.pid != verl_server.proc.pid and "verl" not in plain.proc.args


def test_the_adapter_maps_tapos_inputs_onto_verls_config():
    import torch
    from verl.workers.config import ActorConfig

    from engine.spec import registry

    seen = {}

    def loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
             rollout_is_weights=None):
        seen.update(old=old_log_prob, new=log_prob, adv=advantages, mask=response_mask, mode=loss_agg_mode,
                    config=config, weights=rollout_is_weights)
        return (log_prob * 0).sum(), {"actor/ratio_min": torch.tensor(0.5), "actor/pg_clipfrac": 0.25, "x": 1}

    adapted = registry.load().get_adapter("verl", "tapo")(loss)
    impl = adapted.implementation("impl:test")
    lp, old = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.int64)
    mask[:, :2] = 0
    adv = torch.tensor([1.0, -1.0, 0.5, 0.0], dtype=torch.float64)
    _, metrics = impl.tapo_loss(lp, old, adv, mask, 0.1, 0.2, 7, group_size=2)
    cfg = seen["config"]
    assert isinstance(cfg, ActorConfig)  # verl's own losses assert it
    assert (cfg.clip_ratio, cfg.clip_ratio_high, cfg.clip_ratio_low) == (0.2, 0.2, 0.1)
    assert (cfg.loss_scale_factor, cfg.rollout_n, seen["mode"]) == (7, 2, "token-mean")
    assert cfg.global_batch_info == {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None,
                                     "loss_scale_factor": 7}
    assert seen["mask"].dtype == torch.bool and torch.equal(seen["mask"], mask != 0)
    assert torch.equal(seen["adv"], adv[:, None].expand(4, 6)) and seen["weights"] is None
    assert seen["new"] is lp and seen["old"] is old
    assert metrics == {"ratio_min": 0.5, "tokens": 16}  # TAPO's names only; tokens from the mask
    impl.tapo_loss(lp, old, adv, mask, 0.1, 0.2)
    assert seen["config"].rollout_n == 4 and seen["config"].loss_scale_factor is None  # one group, own lengths
    assert not registry.provides(impl, "trajectory_ratio") and registry.provides(impl, "tapo_loss")
    with pytest.raises(registry.NotProvided, match="trajectory_ratio"):
        impl.trajectory_ratio(lp, old, mask)


# --- usage -----------------------------------------------------------------------------------------


def test_bad_verl_targets_are_one_usage_line(tmp_path):
    store = tmp_path / "r"
    helper = tmp_path / "helper.py"
    helper.write_text("def my_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,"
                      " rollout_is_weights=None):\n    return log_prob.sum(), {}\n")
    (tmp_path / "registers.py").write_text("from helper import my_loss\nfrom verl.trainer.ppo.core_algos import "
                                           "register_policy_loss\nregister_policy_loss('elsewhere')(my_loss)\n")
    for target, says in (("verl:no_such_loss", "registered: "), (f"verl:{FIXTURE}:nope", "no policy loss"),
                         ("verl:", "verl:NAME"), ("verl:a:b:c", "neither a .py file"),
                         # the sandbox stages only the bound file: its unbound sibling is not there to import
                         (f"verl:{tmp_path / 'registers.py'}:elsewhere", "No module named 'helper' (registers.py:1)")):
        r = check(target, store, "--only", "loss_forward", "--no-mutants")
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and says in lines[0], (target, r.output)
        assert "Traceback" not in r.output and str(tmp_path) not in r.stderr
    assert not (store / METHOD).exists() or not list((store / METHOD).glob("*.json"))


def test_gate_on_a_verl_target_imports_neither_torch_nor_verl(tmp_path):
    import subprocess
    import sys

    code = ("import sys; from typer.testing import CliRunner; from engine.cli import app; "
            f"r = CliRunner().invoke(app, ['gate', '{METHOD}', '--impl', 'verl:geo_mean', '--receipts', sys.argv[1]]); "
            "print(r.exit_code, 'torch' in sys.modules, 'verl' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert out.stdout.split() == ["1", "False", "False"], out.stdout + out.stderr


def test_without_verl_a_verl_target_is_exit_4(tmp_path, monkeypatch):
    import importlib.machinery

    real = importlib.machinery.PathFinder.find_spec

    def no_verl(name, path=None, target=None):
        return None if name == "verl" else real(name, path, target)

    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", no_verl)
    r = check("verl:geo_mean", tmp_path / "r", "--only", "loss_forward")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 4 and len(lines) == 1 and "pip install -e '.[verl]'" in lines[0], r.output


def test_case_n_reruns_that_case_alone_beside_a_framework_target(tmp_path):
    """A framework target's checks run beside it, in the candidate's worker: --case N must reach that worker, or
    the printed repro reruns every case and names another one first."""
    store = tmp_path / "r"
    r = invoke("check", "grpo", "--impl", "verl:vanilla", "--only", "input_refusal", "--seeds", "42", "--case", "2",
               "--no-mutants", "--receipts", str(store), "--json")
    assert r.exit_code == 1, r.output  # verl accepts a negative clip_high, the table's row 2
    (path,) = sorted((store / "grpo").glob("*.json"))
    (res,) = json.loads(path.read_text())["predicate"]["results"]
    assert [c["case"] for c in res["failing_cases"]] == [2], res["failing_cases"]
    assert "clip_high" in res["failing_cases"][0]["argument"]
    m = res["measurements"]
    assert m.get("refused", 0) + m["not_refused"] + m["accepted"] + m["wrongly_refused"] == 1, m
