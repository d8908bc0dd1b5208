"""TAR mechanism run: a real verifier-filtered FPS bank and real gated-replay updates.

Per seed: a randomly initialised GRU policy (vocabulary 16, hidden 8); the base
is a frozen copy of it. For every training prompt the base samples 8
responses, the task's programmatic verifier marks them, and the
implementation's FPS keeps at most 3 correct ones, chosen on the base's own
hidden states (the bank holds only the base's samples: no gold or written
answers). Each update the policy samples 2 groups of 6 responses and trains on
GRPO + full-vocabulary KL(pi_theta || pi_base) + lambda_rep * TAR replay over
the bank entries of the step's prompts, through the implementation under test.

The encoder, the bank's reference scoring, the KL term and the replay batch are the implementation's
(`impl.trajectory_embeddings`, `impl.bank_logprobs`, `impl.kl_to_base`, `impl.replay_rows`: they carry the
method's decisions). This module is only the run; everything it is judged by (the bank's
contents, the counterfactuals, the gradients of each term, the harness steps against float64
references, the receipt's step records) is measured by methods/tar/audit.py on the run's own
tensors.

The settings come from the contract's `params` only: the page's protocol is declared in the
spec, and a second copy of it here could drift from it unnoticed.

The hidden state is a declared encoder, not a semantic one: it exercises the
FPS definition and says nothing about the coverage of reasoning modes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.common import TargetTokenTask, audited, group_advantages, grpo_control_update, grpo_token_loss, make_policy, paired, sample, sequence_logprobs, snapshot
from methods.tar.audit import RunAudit

SETTINGS = ("updates", "prompts_per_step", "group_size", "base_samples", "bank_k", "max_new_tokens", "vocab_size",
            "hidden_size", "lr", "beta_kl", "lambda_rep")


def settings(params) -> dict:
    """The run's settings from the contract's params; a missing one is a spec error, never a silent default."""
    missing = [k for k in SETTINGS if k not in params]
    if missing:
        raise ValueError(f"the TAR mechanism contract's params must set {', '.join(missing)}")
    return {k: params[k] for k in SETTINGS}


@dataclass
class Bank:
    prompt_index: torch.Tensor  # [R] which training prompt each entry belongs to
    prompts: torch.Tensor  # [R, P]
    responses: torch.Tensor  # [R, T]
    mask: torch.Tensor  # [R, T]

    def rows(self, index: torch.Tensor) -> "Bank":
        """The entries at `index` (B_rep of an update, as impl.replay_rows chose them)."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.prompt_index.device)
        return Bank(self.prompt_index[index], self.prompts[index], self.responses[index], self.mask[index])


@dataclass
class BankSource:
    """What the bank was chosen from: the base's candidates, their marks and embeddings, the FPS picks."""

    prompts: torch.Tensor  # [N, P] each candidate's prompt
    roll: object  # the base's Rollout of the N candidates
    prompt_ids: torch.Tensor  # [N] training-prompt index of each candidate
    correct: torch.Tensor  # [N] bool, the verifier's marks
    embeddings: torch.Tensor  # [N, H] the declared encoder's output
    keep: torch.Tensor  # the FPS picks (indices into the candidates)


def build_bank(impl, base, task, prompts, ctx, cfg) -> tuple[Bank, BankSource]:
    n = cfg["base_samples"]
    rep = prompts.repeat_interleave(n, dim=0)
    roll = sample(base, rep, cfg["max_new_tokens"], ctx.generator(2))
    ctx.meter.add_tokens(roll.n_tokens)
    correct = task.verify(rep, roll.responses, roll.mask).bool()
    emb = impl.trajectory_embeddings(base, rep, roll.responses, roll.mask)
    ids = torch.arange(prompts.shape[0], device=prompts.device).repeat_interleave(n)
    keep = impl.farthest_point_prototypes(emb, correct, k=cfg["bank_k"], prompt_ids=ids)
    keep = torch.as_tensor(keep, dtype=torch.long, device=prompts.device)
    bank = Bank(prompt_index=ids[keep], prompts=rep[keep], responses=roll.responses[keep], mask=roll.mask[keep])
    return bank, BankSource(prompts=rep, roll=roll, prompt_ids=ids, correct=correct, embeddings=emb, keep=keep)


def step_losses(impl, policy, base, roll, rewards, bank_sel: Bank, cfg):
    """GRPO + beta * KL + lambda * replay for one update; rewards enter only through advantages."""
    adv = group_advantages(rewards, cfg["group_size"])
    logp, _, logdist = sequence_logprobs(policy, roll.prompts, roll.responses, full=True)
    with torch.no_grad():
        _, _, base_logdist = sequence_logprobs(base, roll.prompts, roll.responses, full=True)
    grpo, _ = grpo_token_loss(logp, roll.old_logp, adv, roll.mask)
    kl = impl.kl_to_base(logdist, base_logdist, roll.mask)
    lt = lb = met = None
    if bank_sel.responses.shape[0]:
        lt, lb = impl.bank_logprobs(policy, base, bank_sel.prompts, bank_sel.responses)
        rep, met = impl.adaptive_replay_loss(lt, lb, bank_sel.mask)
    else:
        rep = torch.zeros((), device=logp.device, dtype=logp.dtype)
    total = impl.tar_total_loss(grpo + cfg["beta_kl"] * kl, rep, lambda_rep=cfg["lambda_rep"])
    return total, {"grpo": grpo, "kl": kl, "replay": rep, "replay_metrics": met, "bank_logp": lt, "advantages": adv,
                   "logp": logp,
                   "bank_base_logp": lb, "logdist": logdist, "base_logdist": base_logdist}


def run(impl, ctx) -> dict:
    cfg = settings(ctx.params)
    device = ctx.device
    task = TargetTokenTask(vocab_size=cfg["vocab_size"])
    # the tiny GRU, or the run's --policy (e.g. a checkpoint)
    policy = paired.arm_policy(impl, lambda: make_policy(ctx, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"]))
    base = snapshot(policy)
    audit = RunAudit(ctx, task, policy, base)

    n_prompts = cfg["updates"] * cfg["prompts_per_step"]
    prompts = task.prompts(n_prompts, ctx.generator(1)).to(device)
    bank, source = build_bank(impl, base, task, prompts, ctx, cfg)
    audit.bank(bank, source)

    opt = torch.optim.Adam(policy.parameters(), lr=cfg["lr"])
    gen = paired.stream(ctx, impl, 3)  # the GRPO control draws the same stream
    for step in range(cfg["updates"]):
        idx = torch.arange(step * cfg["prompts_per_step"], (step + 1) * cfg["prompts_per_step"], device=device)
        gp = prompts[idx].repeat_interleave(cfg["group_size"], dim=0)
        roll = sample(policy, gp, cfg["max_new_tokens"], gen)
        ctx.meter.add_tokens(roll.n_tokens)
        rewards = task.verify(gp, roll.responses, roll.mask)
        bank_sel = bank.rows(impl.replay_rows(bank.prompt_index, idx))

        def losses(r, roll=roll, bank_sel=bank_sel):
            return step_losses(impl, policy, base, roll, r, bank_sel, cfg)

        with audit.actor_inputs():
            total, parts = losses(rewards)
        audit.update(step, idx, roll, rewards, bank_sel, total, parts, losses)
        # what the total loss read, for the arm audit; the bank's base log-probs are rescored from the policy's
        # weights at its first draw (the base is that policy), not from the run's own base copy
        lb = parts["bank_base_logp"]
        paired.record_update(total, {
            "logp": parts["logp"], "old_logp": roll.old_logp, "advantages": parts["advantages"], "mask": roll.mask,
            "rewards": rewards, "prompts": roll.prompts, "responses": roll.responses, "logdist": parts["logdist"],
            "base_logdist": parts["base_logdist"], "bank_logp": parts["bank_logp"], "bank_base_logp": lb,
            "bank_mask": bank_sel.mask}, [] if lb is None else
            [paired.claim("bank_base_logp", lb, bank_sel.prompts, bank_sel.responses, bank_sel.mask)])

        opt.zero_grad()
        # the supervisor audits the gradient the backward leaves in its policy: the candidate's bank_logprobs
        # scored it through a handle, so what reaches it through the bank log-probs is the candidate's own VJP
        upstream = audited.backward(ctx, total, policy, arm="tar", where=f"step {step}",
                                    scored=audit.scored(roll, bank_sel, parts))
        audit.backward_done(upstream)
        ctx.meter.optimizer_step(opt)
    return {"updates": ctx.meter.updates, **audit.measurements()}


from engine.kinds.paired_control import paired_run  # noqa: E402  (below: the lines above keep their numbers)


def grpo_control(impl, ctx) -> None:
    """The GRPO control arm of the run: the same seeded policy, prompts, sampling stream and number of updates as
    `run`, trained on GRPO alone (no KL to the base, no replay)."""
    cfg = settings(ctx.params)
    task = TargetTokenTask(vocab_size=cfg["vocab_size"])
    policy = paired.arm_policy(impl, lambda: make_policy(ctx, vocab_size=cfg["vocab_size"],
                                                         hidden_size=cfg["hidden_size"]))
    prompts = task.prompts(cfg["updates"] * cfg["prompts_per_step"], ctx.generator(1)).to(ctx.device)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg["lr"])
    gen = paired.stream(ctx, impl, 3)
    for step in range(cfg["updates"]):
        gp = prompts[step * cfg["prompts_per_step"]:(step + 1) * cfg["prompts_per_step"]]
        gp = gp.repeat_interleave(cfg["group_size"], dim=0)
        grpo_control_update(ctx, policy, opt, gp, cfg["max_new_tokens"], gen, cfg["group_size"], task.verify)


@paired_run("tar.mechanism")
def paired_arms(impl, ctx) -> None:
    """The TAR arm (`run`) and its GRPO control, each under the arm record (paired_control)."""
    for arm in paired.arms(ctx, ("tar", "grpo-control"), method="tar"):
        (run if arm == "tar" else grpo_control)(impl, ctx)
