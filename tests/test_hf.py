"""Mechanism runs on a Hugging Face checkpoint: a tiny random Qwen2-style model built in a temporary folder.

Nothing is downloaded. Tests that need transformers and peft (the [hf] extra) skip when they are missing;
the error paths that need neither always run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from engine.cli import app
from engine.errors import UsageError
from engine.store.receipts import check_receipt, receipt_files
from engine.spec.loader import load_spec
from methods.common.rollout import sample, sequence_logprobs
from methods.common.tasks import EOS, PAD
from methods.hfpolicy.checkpoint import find_checkpoint

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
MECHANISMS = {"tapo-trajectory": "mechanism", "mrtpo": "mechanism", "tar-adaptive-replay": "mechanism_run"}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    from tests.hf_support import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def provider(ckpt):
    from engine.run.policy import load_policy

    return load_policy(f"hf:{ckpt}", lora_rank=4)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- never a download; one-line errors --------------------------------------------------


def test_a_hub_id_is_refused_with_what_to_download_and_where():
    r = invoke("check", "tapo-trajectory", "--only", "mechanism", "--policy", "hf:Qwen/Qwen2.5-0.5B")
    assert r.exit_code == 2
    (line,) = r.stderr.strip().splitlines()
    assert "never downloads" in line
    assert "huggingface-cli download Qwen/Qwen2.5-0.5B --local-dir checkpoints/Qwen2.5-0.5B" in line
    assert "--policy hf:checkpoints/Qwen2.5-0.5B" in line


def test_a_bad_policy_is_refused_before_torch_or_transformers_is_imported():
    import subprocess

    code = ("import sys; from typer.testing import CliRunner; from engine.cli import app; "
            "r = CliRunner().invoke(app, ['check', 'tapo-trajectory', '--policy', 'hf:Qwen/Qwen2.5-0.5B']); "
            "assert r.exit_code == 2, r.output; "
            "loaded = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]; assert not loaded, loaded")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_folders_that_are_not_checkpoints_are_refused(tmp_path):
    with pytest.raises(UsageError, match="no such folder"):
        find_checkpoint(str(tmp_path / "missing"))
    with pytest.raises(UsageError, match="no config.json"):
        find_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UsageError, match="no weight files"):
        find_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match="not readable JSON"):
        find_checkpoint(str(tmp_path))


def test_bad_policy_options_are_usage_errors():
    assert invoke("check", "tapo-trajectory", "--policy", "s3:bucket").exit_code == 2
    r = invoke("check", "tapo-trajectory", "--lora-rank", "8")
    assert r.exit_code == 2 and "--policy hf:PATH" in r.stderr


def test_without_the_hf_extra_the_error_says_what_to_install(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    (tmp_path / "model.safetensors").write_bytes(b"\0")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    r = invoke("check", "tapo-trajectory", "--only", "mechanism", "--policy", f"hf:{tmp_path}",
               "--receipts", str(tmp_path / "r"))
    assert r.exit_code == 4, r.output
    assert "pip install -e '.[hf]'" in r.stderr


def test_the_checkpoint_subjects_are_its_files_digests(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "README.md").write_text("not read by a load")
    subjects = {s["name"]: s["digest"]["sha256"] for s in find_checkpoint(str(tmp_path)).subjects()}
    assert subjects == {f"checkpoint:{n}": sha256(tmp_path / n) for n in ("config.json", "model.safetensors",
                                                                          "tokenizer.json")}
    (tmp_path / "model.safetensors").write_bytes(b"other weights")
    again = {s["name"]: s["digest"]["sha256"] for s in find_checkpoint(str(tmp_path)).subjects()}
    assert again["checkpoint:model.safetensors"] != subjects["checkpoint:model.safetensors"]


# --- the policy: the checkpoint behind the tiny policies' interface --------------------------


def test_task_tokens_are_single_tokenizer_tokens(provider):
    ids = provider.token_ids(16)
    tok = provider.tokenizer
    assert ids[PAD] == tok.pad_token_id and ids[EOS] == tok.eos_token_id
    words = [tok.decode([i]) for i in ids[2:]]
    assert all(w.startswith(" ") and w.strip().isalpha() for w in words)
    assert len(set(ids[2:])) == 14
    assert tok.decode(provider.prefix) == "Answer with words from the list:"
    assert provider.token_ids(32)[:16] == ids  # one map serves every task vocabulary size
    assert provider.describe()["task"]["token_ids"] == provider.token_ids(32)


def test_sampled_log_probs_match_a_full_forward_and_lora_starts_at_the_checkpoint(provider):
    from methods.hfpolicy.policy import HFPolicy

    policy = provider.build(seed=42, device=torch.device("cpu"), vocab_size=16)
    plain = HFPolicy(provider.model, provider.token_ids(16), provider.prefix, provider.cache_arg)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, 16, (3, 4), generator=g)
    ro = sample(policy, prompts, 6, g)
    logp, hidden = sequence_logprobs(policy, ro.prompts, ro.responses)
    assert logp.shape == ro.responses.shape and hidden.shape[:2] == ro.responses.shape
    assert float((logp.detach() - ro.old_logp)[ro.mask].abs().max()) < 1e-5  # KV-cache sampling == full forward
    with torch.no_grad():
        a, _, _ = policy(prompts)
        b, _, _ = plain(prompts)
    assert a.shape == (3, 4, 16)  # the instruction prefix is cut from the outputs
    assert torch.equal(a, b)  # LoRA B = 0: the first policy is exactly the checkpoint


def test_lora_trains_only_adapters_seeded_from_the_run_seed(provider):
    a = provider.build(seed=42, device=torch.device("cpu"), vocab_size=16)
    b = provider.build(seed=42, device=torch.device("cpu"), vocab_size=16)
    c = provider.build(seed=43, device=torch.device("cpu"), vocab_size=16)
    trainable = [n for n, p in a.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if "lora_A" in k)


def test_lora_rank_zero_trains_every_weight(ckpt):
    from engine.run.policy import load_policy

    full = load_policy(f"hf:{ckpt}", lora_rank=0).build(seed=1, device=torch.device("cpu"), vocab_size=16)
    assert all(p.requires_grad for p in full.parameters())
    assert not any("lora_" in n for n, _ in full.named_parameters())


# --- the three mechanism runs, receipts bound to the checkpoint -------------------------------


@pytest.mark.slow
def test_the_three_mechanism_runs_hold_on_the_checkpoint_and_bind_its_digests(ckpt, tmp_path):
    store = tmp_path / "receipts"
    for method, contract in MECHANISMS.items():
        r = invoke("check", method, "--only", contract, "--seeds", "42", "--no-mutants", "--policy", f"hf:{ckpt}",
                   "--lora-rank", "4", "--receipts", str(store), "--json")
        assert r.exit_code == 0, (method, r.output)
        (path,) = receipt_files(store, method)
        text = path.read_text()
        stmt = json.loads(text)
        pred = stmt["predicate"]
        (res,) = pred["results"]
        assert res["status"] == "passed", (method, res["message"])
        m = res["measurements"]
        if method == "tapo-trajectory":  # real updates against the same behaviour log-probs
            assert m["updates_made"] > 0 and m["min_grad_norm"] > 0 and m["min_param_l2_change"] > 0
        elif method == "mrtpo":  # the frozen replay snapshot never moves, the student does
            assert m["snapshot_max_change"] == 0 and m["student_l2_change"] > 0 and m["student_verifier_tokens"] == 0
        else:  # the frozen base gets no gradient and does not move, the actor does
            assert m["base_param_l2_change"] == 0 and m["base_params_with_grad"] == 0
            assert m["actor_param_l2_change"] > 0 and m["bank_size"] >= 1

        subjects = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
        for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
            assert subjects[f"checkpoint:{name}"] == sha256(ckpt / name), name
        assert "methods/hfpolicy/policy.py" in subjects and f"specs/{method}.yaml" in subjects
        pol = pred["policy"]
        assert pol["kind"] == "hf" and pol["used_by"] == [contract]
        assert pol["checkpoint"]["config_sha256"] == sha256(ckpt / "config.json")
        assert pol["checkpoint"]["weight_files"] == {"model.safetensors": sha256(ckpt / "model.safetensors")}
        assert pol["lora"]["rank"] == 4 and pol["checkpoint"]["model_type"] == "qwen2"

        budget = load_spec(ROOT / "specs" / f"{method}.yaml").data["budget"]
        assert 0 < pred["cost"]["max_optimizer_updates_per_seed"] <= budget["max_updates_per_seed"]
        assert 0 < res["cost"]["sampled_tokens"] <= budget["max_tokens_per_seed"]

        assert check_receipt(path, ROOT).state == "fresh"  # checkpoint files bind identity, not freshness
        assert str(ckpt) not in text and str(tmp_path) not in text


def test_a_mutant_is_killed_on_the_checkpoint_too(ckpt, tmp_path):
    r = invoke("check", "tapo-trajectory", "--only", "mechanism", "--seeds", "42", "--policy", f"hf:{ckpt}",
               "--lora-rank", "4", "--receipts", str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    (run,) = json.loads(r.stdout)["runs"]
    # every mutant the spec says the mechanism kills (no gradient, re-scored old log-probs, a fused-backward
    # defect, a negated proximal gradient, a policy scored at temperature 2), read from the spec so that a mutant
    # added there is held on the checkpoint too
    from ruamel.yaml import YAML

    spec = YAML(typ="safe").load((ROOT / "specs" / "tapo-trajectory.yaml").read_text())
    expected = [m["id"] for m in spec["mutants"] if "mechanism" in m["killed_by"]]
    assert {"ratio_detached", "old_logp_recomputed", "fused_grad_no_ratio"} <= set(expected)
    assert run["mutants"] == [{"id": m, "killed": True, "killed_by": ["mechanism"]} for m in expected]


def test_the_spec_budget_binds_the_checkpoint_run(ckpt, tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    text = (ROOT / "specs" / "tapo-trajectory.yaml").read_text()
    assert text.count("max_updates_per_seed: 220\n") == 1
    (specs / "tapo-trajectory.yaml").write_text(text.replace("max_updates_per_seed: 220\n", "max_updates_per_seed: 5\n"))
    r = invoke("check", "tapo-trajectory", "--only", "mechanism", "--seeds", "42", "--no-mutants", "--policy",
               f"hf:{ckpt}", "--specs", str(specs), "--receipts", str(tmp_path / "r"), "--json")
    assert r.exit_code == 1, r.output
    (res,) = json.loads(r.stdout)["runs"][0]["results"]
    assert res["status"] == "failed" and "over the budget of 5" in res["message"]


def test_a_policy_no_selected_contract_uses_is_said_so(ckpt, tmp_path):
    r = invoke("check", "tapo-trajectory", "--only", "clip_schedule", "--seeds", "42", "--no-mutants", "--policy",
               f"hf:{ckpt}", "--receipts", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert "warning: --policy was given but no selected contract" in r.stderr
    pred = json.loads(receipt_files(tmp_path, "tapo-trajectory")[0].read_text())["predicate"]
    assert pred["policy"]["used_by"] == []


def test_the_pytest_plugin_takes_the_policy_too(ckpt, pytester):
    from tests.test_pytest_plugin import ISOLATE, plugin_args

    (pytester.path / "specs").mkdir()
    shutil.copy(ROOT / "specs" / "tapo-trajectory.yaml", pytester.path / "specs")
    store = pytester.path / "receipts"
    r = pytester.runpytest_inprocess(*plugin_args(), *ISOLATE, "--contracts", "specs/", "-k", "mechanism and not mutant",
                                     "--contracts-seeds", "42", "--contracts-policy", f"hf:{ckpt}",
                                     "--contracts-lora-rank", "4", "--contracts-receipts", str(store))
    r.assert_outcomes(passed=1)
    pred = json.loads(receipt_files(store, "tapo-trajectory")[0].read_text())["predicate"]
    assert pred["policy"]["used_by"] == ["mechanism"] and pred["results"][0]["status"] == "passed"
