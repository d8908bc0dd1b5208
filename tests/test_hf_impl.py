"""A researcher's own implementation trained on a real checkpoint: `check --impl ... --policy hf:DIR`.

The supervisor holds the Hugging Face model; the candidate meets it only as a policy handle whose answers are
tensors (its KV cache stays with the supervisor, the candidate holding an opaque token for it). The
independent-implementation fixtures of TAPO, MRTPO and TAR pass their mechanism runs on the tiny Qwen2 built by
tests/hf_support.py, with LoRA; a bug planted in each fails, and a candidate that scores the policy the wrong
way (temperature 2, the logits one position off) fails with the update and seed named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
MECHANISM = {"tapo-trajectory": ("my_tapo.py", "mechanism"), "mrtpo": ("my_mrtpo.py", "mechanism"),
             "tar-adaptive-replay": ("my_tar.py", "mechanism_run")}
SCORE = '''    logits, _, _ = policy(torch.cat([prompts, responses[:, :-1]], 1))
    logdist = torch.log_softmax(logits[:, prompts.shape[1] - 1:].float(), -1)'''
# one slip a competent engineer could make in each fixture, each in the code the mechanism run calls
PLANTED = {
    # the old log-probs re-scored by the live policy before each update: every update on-policy, the clip idle
    "tapo-trajectory": ("        yield k, logp, rollout.old_logp", "        yield k, logp, logp.detach()"),
    # the replay "snapshot" is the live student, which every update moves
    "mrtpo": ("    return copy.deepcopy(policy).requires_grad_(False).eval()", "    return policy"),
    # the bank's reference log-probs scored by the trained policy instead of the frozen base
    "tar-adaptive-replay": ("        lb = _score(base, prompts, responses)", "        lb = _score(policy, prompts, responses)"),
}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    from tests.hf_support import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory)


def check(method: str, impl: Path, ckpt: Path, store: Path, *extra: str):
    contract = MECHANISM[method][1]
    r = CliRunner().invoke(app, ["check", method, "--impl", str(impl), "--only", contract, "--policy", f"hf:{ckpt}",
                                 "--lora-rank", "4", "--receipts", str(store), "--json", *extra])
    return r, (json.loads(r.stdout)["runs"][0] if r.stdout.strip().startswith("{") else None)


def planted(tmp_path: Path, method: str, old: str, new: str) -> Path:
    name = MECHANISM[method][0]
    text = (FIXTURES / name).read_text()
    assert text.count(old) == 1, (method, old)  # the fixture changed: plant the bug where it now lives
    assert new != old
    out = tmp_path / name
    out.write_text(text.replace(old, new))
    return out


@pytest.mark.parametrize("method", list(MECHANISM))
def test_the_fixture_passes_its_mechanism_on_the_checkpoint_and_its_candidate_mutants_die(method, ckpt, tmp_path):
    r, run = check(method, FIXTURES / MECHANISM[method][0], ckpt, tmp_path / "r")
    assert r.exit_code == 0, r.output
    assert run["status"] == "passed" and [x["status"] for x in run["results"]] == ["passed"] * 3
    # the spec's mutants of the mechanism, and the candidate's own functions swapped for them, all killed here
    assert run["mutants"] and all(m["killed"] for m in run["mutants"]), run["mutants"]
    assert run["candidate_mutants"] and all(m["killed"] for m in run["candidate_mutants"]), run["candidate_mutants"]
    (path,) = (tmp_path / "r" / method).glob("*.json")
    stmt = json.loads(path.read_text())
    pred = stmt["predicate"]
    assert pred["policy"]["kind"] == "hf" and pred["policy"]["used_by"] == [MECHANISM[method][1]]
    assert pred["policy"]["lora"]["rank"] == 4 and pred["isolation"]["checks_in"] == "supervisor"
    names = {s["name"] for s in stmt["subject"]}
    assert {"checkpoint:model.safetensors", "checkpoint:config.json"} <= names
    assert any(n.startswith("impl:") for n in names)  # the candidate's files and the checkpoint, both bound
    assert str(ckpt) not in path.read_text()


@pytest.mark.parametrize("method", list(MECHANISM))
def test_a_bug_planted_in_the_fixture_fails_on_the_checkpoint(method, ckpt, tmp_path):
    bad = planted(tmp_path, method, *PLANTED[method])
    r, run = check(method, bad, ckpt, tmp_path / "r", "--no-mutants", "--seeds", "42")
    assert r.exit_code == 1, r.output
    assert run["results"][0]["status"] == "failed", run["results"]


@pytest.mark.parametrize("wrong", [
    # the policy scored at temperature 2: its log-probs are not the sampler's
    SCORE.replace(".float(), -1)", ".float() / 2.0, -1)"),
    # the logits one position off: logits[:, i] taken as the distribution of token i, not i + 1
    SCORE.replace("responses[:, :-1]]", "responses]").replace("prompts.shape[1] - 1:]", "prompts.shape[1]:]"),
], ids=["temperature_2", "logits_off_by_one"])
def test_wrong_scoring_of_the_checkpoint_fails_naming_update_and_seed(wrong, ckpt, tmp_path):
    bad = planted(tmp_path, "tapo-trajectory", SCORE, wrong)
    r, run = check("tapo-trajectory", bad, ckpt, tmp_path / "r", "--no-mutants", "--seeds", "42")
    assert r.exit_code == 1, r.output
    (res,) = run["results"]
    assert res["status"] == "failed"
    text = CliRunner().invoke(app, ["check", "tapo-trajectory", "--impl", str(bad), "--only", "mechanism",
                                    "--policy", f"hf:{ckpt}", "--lora-rank", "4", "--receipts",
                                    str(tmp_path / "r2"), "--no-mutants", "--seeds", "42"])
    assert text.exit_code == 1
    # the gradient audit names where the candidate's scoring parted from the supervisor's
    assert "failing case: seed 42" in text.output and "gradient_audit" in text.output
    assert "update 1" in text.output and "arm tapo" in text.output


def test_a_policy_state_crosses_as_an_opaque_token_the_candidate_passes_back(ckpt, tmp_path):
    """A candidate that decodes incrementally (the KV cache as `state`) gets the same log-probs as a full forward:
    the cache stays with the supervisor, the candidate holding a handle it can only pass back."""
    inc = '''    P = prompts.shape[1]
    logits, _, state = policy(prompts)
    steps = [logits[:, -1:]]
    for t in range(responses.shape[1] - 1):
        out, _, state = policy(responses[:, t:t + 1], state)
        steps.append(out)
    logdist = torch.log_softmax(torch.cat(steps, 1).float(), -1)'''
    bad = planted(tmp_path, "tapo-trajectory", SCORE, inc)
    r, run = check("tapo-trajectory", bad, ckpt, tmp_path / "r", "--no-mutants", "--seeds", "42")
    assert r.exit_code == 0, r.output
    assert run["results"][0]["status"] == "passed"


def test_a_policy_state_is_only_a_token_it_neither_runs_copies_nor_stands_for_the_policy(ckpt, tmp_path):
    """What a candidate might try with the state handle, each refused with why (the run then passes: the refusals
    are what this candidate asserts)."""
    probe = SCORE + '''
    import copy as _copy
    _, _, state = policy(prompts)
    for attempt, why in ((lambda: state(prompts), "is not callable"),
                         (lambda: _copy.deepcopy(state), "opaque token"),
                         (lambda: policy(prompts, policy), "only a policy's own state crosses back")):
        try:
            attempt()
        except (TypeError, RuntimeError) as exc:
            if why not in str(exc):
                raise AssertionError(f"refused for another reason: {exc}") from None
        else:
            raise AssertionError(f"accepted: {why}")'''
    bad = planted(tmp_path, "tapo-trajectory", SCORE, probe)
    r, run = check("tapo-trajectory", bad, ckpt, tmp_path / "r", "--no-mutants", "--seeds", "42")
    assert r.exit_code == 0, r.output
