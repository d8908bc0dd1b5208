"""TAR mechanism run: a real verifier-filtered FPS bank and real gated-replay updates.

Per seed: a randomly initialised GRU policy (vocabulary 16, hidden 8); the base
is a frozen copy of it. For every training prompt the base samples 8
responses, the task's programmatic verifier marks them, and the
implementation's FPS keeps at most 3 correct ones, chosen on the base's own
hidden states (the bank holds only the base's samples: no gold or written
answers). Each update the policy samples 2 groups of 6 responses and trains on
GRPO + full-vocabulary KL(pi_theta || pi_base) + lambda_rep * TAR replay over
the bank entries of the step's prompts, through the implementation under test.

The encoder, the bank's reference scoring and the KL term are the implementation's
(`impl.trajectory_embeddings`, `impl.bank_logprobs`, `impl.kl_to_base`: they carry the
method's decisions) and each is audited on the run's own tensors (methods/tar/audit.py).

The hidden state is a declared encoder, not a semantic one: it exercises the
FPS definition and says nothing about the coverage of reasoning modes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from methods.common import (
    TargetTokenTask,
    group_advantages,
    grpo_token_loss,
    make_policy,
    sample,
    sequence_logprobs,
    snapshot,
)
from methods.common.policy import param_l2_change, state_copy
from methods.tar.audit import HarnessAudit

DEFAULTS = {
    "updates": 3,
    "prompts_per_step": 2,
    "group_size": 6,
    "base_samples": 8,
    "bank_k": 3,
    "max_new_tokens": 6,
    "vocab_size": 16,
    "hidden_size": 8,
    "lr": 0.05,
    "beta_kl": 0.05,
    "lambda_rep": 1.0,
}


@dataclass
class Bank:
    prompt_index: torch.Tensor  # [R] which training prompt each entry belongs to
    prompts: torch.Tensor  # [R, P]
    responses: torch.Tensor  # [R, T]
    mask: torch.Tensor  # [R, T]
    candidates: int  # base samples drawn
    correct_candidates: int  # of which the verifier marked correct


def build_bank(impl, base, task, prompts, ctx, cfg) -> Bank:
    n = cfg["base_samples"]
    rep = prompts.repeat_interleave(n, dim=0)
    roll = sample(base, rep, cfg["max_new_tokens"], ctx.generator(2))
    ctx.meter.add_tokens(roll.n_tokens)
    correct = task.verify(rep, roll.responses, roll.mask).bool()
    emb = impl.trajectory_embeddings(base, rep, roll.responses, roll.mask)
    ids = torch.arange(prompts.shape[0], device=prompts.device).repeat_interleave(n)
    keep = impl.farthest_point_prototypes(emb, correct, k=cfg["bank_k"], prompt_ids=ids)
    keep = torch.as_tensor(keep, dtype=torch.long, device=prompts.device)
    ctx.record_step(
        step=0,
        phase="bank",
        candidates=int(rep.shape[0]),
        candidate_prompt=ids.tolist(),
        verifier_correct=correct.int().tolist(),
        fps_indices=keep.tolist(),
        bank_prompt=ids[keep].tolist(),
    )
    return Bank(
        prompt_index=ids[keep],
        prompts=rep[keep],
        responses=roll.responses[keep],
        mask=roll.mask[keep],
        candidates=int(rep.shape[0]),
        correct_candidates=int(correct.sum()),
    ), roll, correct, emb, keep


def step_losses(impl, policy, base, roll, rewards, bank_sel: Bank, cfg):
    """GRPO + beta * KL + lambda * replay for one update; rewards enter only through advantages."""
    adv = group_advantages(rewards, cfg["group_size"])
    logp, _, logdist = sequence_logprobs(policy, roll.prompts, roll.responses, full=True)
    with torch.no_grad():
        _, _, base_logdist = sequence_logprobs(base, roll.prompts, roll.responses, full=True)
    grpo, _ = grpo_token_loss(logp, roll.old_logp, adv, roll.mask)
    kl = impl.kl_to_base(logdist, base_logdist, roll.mask)
    lb = None
    if bank_sel.responses.shape[0] > 0:
        lt, lb = impl.bank_logprobs(policy, base, bank_sel.prompts, bank_sel.responses)
        rep, met = impl.adaptive_replay_loss(lt, lb, bank_sel.mask)
    else:
        rep = torch.zeros((), device=logp.device, dtype=logp.dtype)
        met = {"gates": torch.zeros(0), "token_weights": torch.zeros(0, 1), "active_fraction": 0.0, "mean_delta": torch.zeros(0)}
    total = impl.tar_total_loss(grpo + cfg["beta_kl"] * kl, rep, lambda_rep=cfg["lambda_rep"])
    return total, {"grpo": grpo, "kl": kl, "replay": rep, "replay_metrics": met, "bank_base_logp": lb,
                   "logdist": logdist.detach(), "base_logdist": base_logdist}


def _grads(loss, params):
    if not loss.requires_grad:
        return [torch.zeros_like(p) for p in params]
    gs = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, gs)]


def _norm(gs) -> float:
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in gs))


class _InputRecorder:
    """Forward pre-hook on the actor: keeps a copy of every input it is given."""

    def __init__(self, module):
        self.inputs: list[torch.Tensor] = []
        self.handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.inputs.append(args[0].detach().clone())

    def close(self):
        self.handle.remove()


def _same_inputs(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


def run(impl, ctx, **overrides) -> dict:
    cfg = dict(DEFAULTS)
    cfg.update({k: ctx.params[k] for k in DEFAULTS if k in ctx.params})
    cfg.update(overrides)
    device = ctx.device
    task = TargetTokenTask(vocab_size=cfg["vocab_size"])
    # the tiny GRU, or the run's --policy (e.g. a checkpoint)
    policy = make_policy(ctx, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"])
    base = snapshot(policy)
    base_before, policy_before = state_copy(base), state_copy(policy)
    base_trainable = sum(int(p.requires_grad) for p in base.parameters())

    n_prompts = cfg["updates"] * cfg["prompts_per_step"]
    prompts = task.prompts(n_prompts, ctx.generator(1)).to(device)
    bank, base_roll, base_correct, bank_emb, bank_keep = build_bank(impl, base, task, prompts, ctx, cfg)
    audit = HarnessAudit()
    audit.bank(base, prompts.repeat_interleave(cfg["base_samples"], dim=0), base_roll, base_correct, bank_emb,
               bank_keep, cfg)

    # Bank audit: every entry re-verified, every entry one of the base's own samples.
    bank_incorrect = int((task.verify(bank.prompts, bank.responses, bank.mask) < 0.5).sum()) if bank.responses.shape[0] else 0
    cand_ids = torch.arange(n_prompts, device=device).repeat_interleave(cfg["base_samples"])
    not_sampled = 0
    for r in range(bank.responses.shape[0]):
        same_prompt = cand_ids == bank.prompt_index[r]
        hit = (base_roll.responses[same_prompt] == bank.responses[r]).all(1) & (base_roll.mask[same_prompt] == bank.mask[r]).all(1)
        not_sampled += int(not bool(hit.any()))
    per_prompt = torch.bincount(bank.prompt_index, minlength=n_prompts) if bank.responses.shape[0] else torch.zeros(n_prompts, dtype=torch.long)
    correct_per_prompt = base_correct.view(n_prompts, cfg["base_samples"]).sum(1)
    bank_count_mismatch = int((per_prompt.cpu() != correct_per_prompt.cpu().clamp_max(cfg["bank_k"])).sum())

    opt = torch.optim.Adam(policy.parameters(), lr=cfg["lr"])
    params = [p for p in policy.parameters() if p.requires_grad]  # a LoRA-wrapped checkpoint freezes its base weights
    gen = ctx.generator(3)
    inputs_invariant, shift_diff = True, 0.0
    active_steps = 0
    active_zero_grad = 0
    inactive_nonzero_replay = 0
    first_step_replay_abs = first_step_gate_max = float("nan")
    min_total_grad = float("inf")
    nonzero_grad_steps = 0
    for step in range(cfg["updates"]):
        idx = torch.arange(step * cfg["prompts_per_step"], (step + 1) * cfg["prompts_per_step"], device=device)
        gp = prompts[idx].repeat_interleave(cfg["group_size"], dim=0)
        roll = sample(policy, gp, cfg["max_new_tokens"], gen)
        ctx.meter.add_tokens(roll.n_tokens)
        rewards = task.verify(gp, roll.responses, roll.mask)
        sel = torch.isin(bank.prompt_index, idx)
        bank_sel = Bank(bank.prompt_index[sel], bank.prompts[sel], bank.responses[sel], bank.mask[sel], 0, 0)

        # Counterfactuals: the actor's inputs must not depend on the verifier's
        # result, and a reward shift (same advantages) must not move the gradient.
        rec = _InputRecorder(policy)
        total, parts = step_losses(impl, policy, base, roll, rewards, bank_sel, cfg)
        seen, rec.inputs = rec.inputs, []
        total_flip, _ = step_losses(impl, policy, base, roll, 1.0 - rewards, bank_sel, cfg)
        seen_flip, rec.inputs = rec.inputs, []
        total_shift, _ = step_losses(impl, policy, base, roll, rewards + 0.5, bank_sel, cfg)
        rec.close()
        inputs_invariant &= _same_inputs(seen, seen_flip)
        g_total = _grads(total, params)
        g_shift = _grads(total_shift, params)
        shift_diff = max(shift_diff, max(float((a - b).abs().max()) for a, b in zip(g_total, g_shift)))
        del total_flip

        rep = parts["replay"]
        met = parts["replay_metrics"]
        g_rep = _grads(rep, params)
        rep_norm = _norm(g_rep)
        audit.step(base, roll, bank_sel, parts, rep_norm)
        total_norm = _norm(g_total)
        min_total_grad = min(min_total_grad, total_norm)
        nonzero_grad_steps += int(total_norm > 0)
        gates = met["gates"].detach().double().cpu()
        w = met["token_weights"].detach().double().cpu()
        valid = bank_sel.mask.cpu().bool()
        active = bool((gates > 0).any())
        active_steps += int(active)
        if active and rep_norm == 0.0:
            active_zero_grad += 1
        if not active and float(rep.detach().abs()) != 0.0:
            inactive_nonzero_replay += 1
        if step == 0:
            first_step_replay_abs = float(rep.detach().abs())
            first_step_gate_max = float(gates.abs().max()) if gates.numel() else 0.0

        opt.zero_grad(set_to_none=True)
        total.backward()
        ctx.meter.optimizer_step(opt)
        wv = w[valid] if w.shape == valid.shape else torch.zeros(0, dtype=torch.float64)
        ctx.record_step(
            step=step + 1,
            phase="update",
            prompts=idx.tolist(),
            reward_mean=float(rewards.mean()),
            bank_rows=int(bank_sel.responses.shape[0]),
            replay_active=active,
            active_fraction=float(met["active_fraction"]),
            gates=gates.tolist(),
            mean_delta=met["mean_delta"].detach().double().cpu().tolist(),
            token_weight_mean=float(wv.mean()) if wv.numel() else 0.0,
            token_weight_max=float(wv.max()) if wv.numel() else 0.0,
            token_weight_positive_fraction=float((wv > 0).double().mean()) if wv.numel() else 0.0,
            grpo_loss=float(parts["grpo"].detach()),
            kl_to_base=float(parts["kl"].detach()),
            replay_loss=float(rep.detach()),
            total_loss=float(total.detach()),
            replay_grad_norm=rep_norm,
            total_grad_norm=total_norm,
        )

    base_grads = sum(int(p.grad is not None) for p in base.parameters())
    return {
        "updates": ctx.meter.updates,
        "actor_param_l2_change": param_l2_change(policy_before, policy),
        "min_step_grad_norm": min_total_grad,
        "nonzero_grad_steps": nonzero_grad_steps,
        "base_param_l2_change": param_l2_change(base_before, base),
        "base_params_with_grad": base_grads,
        "base_trainable_params": base_trainable,
        "bank_size": int(bank.responses.shape[0]),
        "bank_candidates": bank.candidates,
        "bank_correct_candidates": bank.correct_candidates,
        "bank_incorrect": bank_incorrect,
        "bank_not_base_samples": not_sampled,
        "bank_max_per_prompt": int(per_prompt.max()) if per_prompt.numel() else 0,
        "bank_count_mismatch": bank_count_mismatch,
        "actor_inputs_reward_invariant": bool(inputs_invariant),
        "reward_shift_grad_max_abs_diff": shift_diff,
        "first_step_replay_loss_abs": first_step_replay_abs,
        "first_step_gate_max": first_step_gate_max,
        "replay_active_steps": active_steps,
        "active_steps_with_zero_replay_grad": active_zero_grad,
        "inactive_steps_with_nonzero_replay": inactive_nonzero_replay,
        "sampled_tokens": ctx.meter.tokens,
        **audit.measurements(),
    }
