"""The MRTPO mechanism run: real sampling, frozen replay with verifier blocks, real updates.

A randomly initialised TinyGRUPolicy over a 32-token vocabulary samples
responses to prompts that carry no verifier information. Two programmatic
verifiers reward particular tokens. Their information blocks are token
sequences made only of reserved verifier tokens, which the policies can
never sample (a -1e4 logit bias, like PAD), so "the student never saw a
verifier token" is checkable on every tensor fed to the student. A frozen
snapshot of the behaviour policy (taken right before sampling) rescores the
same responses under the full context and under each leave-one-out context;
the student updates on the plain prompt context with MRTPO advantages.

Extends methods/common (policy, rollout, GRPO group advantages) without
changing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from methods.common.grpo import group_advantages, grpo_control_update, grpo_token_loss
from methods.common.policy import make_policy as build_policy, param_l2_change, snapshot, state_copy
from methods.common import audited, paired, sample, sequence_logprobs
from methods.common.tasks import FIRST_CONTENT

VOCAB = 32
CONTENT_END = 22  # content tokens are FIRST_CONTENT .. 21
MARK = (22, 27)  # first token of verifier block k
HINT_BASE = (23, 28)  # block k's second token: HINT_BASE[k] + (its target token % 4)
VERIFIER_TOKENS = tuple(range(22, 32))
PROMPT_LEN = 4


def student_context(prompts: torch.Tensor, blocks: list[torch.Tensor]) -> torch.Tensor:
    """What the student is conditioned on: the plain prompt, never a verifier block."""
    return prompts


def freeze(policy: torch.nn.Module) -> torch.nn.Module:
    """The replay policy: a frozen copy of the behaviour policy at sampling time."""
    return snapshot(policy)


def replay_contexts(prompts: torch.Tensor, blocks: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Full context (prompt + every block, in order) and, per reward k, the context without block k.

    Blocks are [B, L_k] token ids; L_k may be 0 (an empty block), so context k
    of an empty block k equals the full context.
    """
    full = torch.cat([prompts, *blocks], dim=1)
    loo = [torch.cat([prompts, *[b for j, b in enumerate(blocks) if j != k]], dim=1) for k in range(len(blocks))]
    return full, loo


def warmup_step(update_index: int) -> int:
    """The warm-up counter n of the update with 0-based index i: n = i + 1 (the first update has
    n = 1, so beta is already above 0 when the first weights are used)."""
    return int(update_index) + 1


def make_prompts(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(FIRST_CONTENT, CONTENT_END, (n, PROMPT_LEN), generator=g)


def targets(prompts: torch.Tensor) -> list[torch.Tensor]:
    """Verifier k rewards a response that contains target k: the prompt's last / first token."""
    return [prompts[:, -1], prompts[:, 0]]


def verify(prompts: torch.Tensor, responses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Rewards [K=2, B] in {0, 1}: does a valid response token equal target k?"""
    out = []
    for tgt in targets(prompts):
        hit = (responses == tgt.to(responses.device)[:, None]) & mask
        out.append(hit.any(dim=1).to(torch.float32))
    return torch.stack(out, 0)


def info_blocks(prompts: torch.Tensor) -> list[torch.Tensor]:
    """Verifier k's information block [B, 2]: its marker and a hint about its target."""
    blocks = []
    for k, tgt in enumerate(targets(prompts)):
        mark = torch.full_like(tgt, MARK[k])
        hint = HINT_BASE[k] + tgt % 4
        blocks.append(torch.stack([mark, hint], dim=1))
    return blocks


def make_policy(ctx, hidden: int = 16) -> torch.nn.Module:
    policy = build_policy(ctx, vocab_size=VOCAB, hidden_size=hidden)  # the tiny GRU, or the run's --policy
    with torch.no_grad():
        policy.pad_bias[list(VERIFIER_TOKENS)] = -1.0e4  # never sampled, never predicted
    return policy


def _weight_stats(w: torch.Tensor, mask: torch.Tensor) -> dict:
    out = {}
    for k in range(w.shape[0]):
        v = w[k][mask].double()
        out[f"w{k}_mean"] = float(v.mean())
        out[f"w{k}_std"] = float(v.std(unbiased=False))
        out[f"w{k}_min"] = float(v.min())
        out[f"w{k}_max"] = float(v.max())
    return out


@dataclass
class Update:
    """What one update of the mechanism run used, kept so contracts can audit it afterwards."""

    index: int  # 0-based
    prompts: torch.Tensor  # [B, P]
    blocks: list  # K tensors [B, L_k]
    student_ctx: torch.Tensor  # what impl.student_context returned
    full: torch.Tensor  # the replay's full context (impl.replay_contexts)
    loo: list  # the replay's leave-one-out contexts (impl.replay_contexts)
    frozen: torch.nn.Module  # the replay policy of this update
    responses: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] bool
    logp_all: torch.Tensor  # [B, T, V] float32, the frozen replay under `full`
    logp_loo: list  # K tensors [B, T, V] float32 under `loo`
    empty: list  # K bools: block k has no tokens
    rewards: torch.Tensor  # [K, B] the verifiers' rewards
    beta: float
    weights: torch.Tensor  # [K, B, T] the credit weights the update used
    reward_adv: torch.Tensor  # [K, B]
    advantages: torch.Tensor  # [B, T] the token advantages the update used
    metrics: dict
    old_logp: torch.Tensor  # [B, T] the behaviour log-probs of the sampled tokens (the ratio's denominator)
    update_ctx: torch.Tensor  # what the student was scored on for its update (impl.student_context)
    frozen_state: dict  # the replay policy's parameters right after impl.freeze
    student_before: dict  # the student's parameters before this update's optimiser step
    student_after: dict  # ... and after it


@dataclass
class Trace:
    """One seed's mechanism run: every update's tensors (the checks measure them)."""

    updates: list = field(default_factory=list)


def replay(frozen: torch.nn.Module, context: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """The frozen replay's full-vocabulary log-distributions [B, T, V] of `responses` after `context`."""
    with torch.no_grad():
        return sequence_logprobs(frozen, context, responses, full=True)[2]


def trace(impl, ctx, observe=None) -> Trace:
    """One seed of the mechanism run, keeping every update's tensors for the audit contracts.

    `observe(student)`, when given, is called once with the student before its first use, so a check
    can watch everything the student is fed (a forward pre-hook) without the run measuring itself.
    """
    p = ctx.params
    updates = int(p.get("updates", 3))
    n_prompts = int(p.get("prompts", 4))
    group = int(p.get("group_size", 8))
    max_new = int(p.get("max_new_tokens", 8))
    lr = float(p.get("lr", 1e-2))
    warmup = float(p.get("warmup_steps", 2))
    beta_max = float(p.get("beta_max", 0.5))
    eps = float(p.get("eps", 1e-6))
    device = ctx.device

    student = paired.arm_policy(impl, lambda: make_policy(ctx, int(p.get("hidden_size", 16))))
    if observe is not None:
        observe(student)
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    g = paired.stream(ctx, impl, 7)  # prompts and sampling; the GRPO control draws the same stream
    kept: list[Update] = []
    for step in range(updates):
        prompts = make_prompts(n_prompts, g).repeat_interleave(group, dim=0).to(device)
        blocks = info_blocks(prompts)
        frozen = impl.freeze(student)
        frozen_state = state_copy(frozen)
        s_ctx = impl.student_context(prompts, blocks)
        roll = sample(student, s_ctx, max_new, g)
        ctx.meter.add_tokens(roll.n_tokens)
        mask = roll.mask
        rewards = verify(prompts, roll.responses, mask)
        reward_adv = torch.stack([group_advantages(r, group) for r in rewards], 0)

        full, loo = impl.replay_contexts(prompts, blocks)
        logp_all = replay(frozen, full, roll.responses)
        logp_loo = [replay(frozen, c, roll.responses) for c in loo]
        empty = [b.shape[1] == 0 for b in blocks]
        beta = impl.beta_schedule(impl.warmup_step(step), warmup, beta_max)
        w = impl.credit_weights(logp_all, logp_loo, mask, beta,
                                empty_block=torch.tensor(empty, dtype=torch.bool, device=device))
        adv, metrics = impl.mrtpo_advantages(reward_adv, w, mask, eps)

        before = state_copy(student)
        u_ctx = impl.student_context(prompts, blocks)
        logp, _ = sequence_logprobs(student, u_ctx, roll.responses)
        loss, info = grpo_token_loss(logp, roll.old_logp, adv.detach().to(logp.dtype), mask)
        # what the loss read, and the replay's scoring as the snapshot gave it: the arm audit rescores the replay
        # from the student's own weights at sampling time, not from the run's snapshot
        paired.record_update(loss, {"logp": logp, "old_logp": roll.old_logp, "advantages": adv, "mask": mask,
                                    "prompts": roll.prompts, "responses": roll.responses},
                             [paired.claim("replay_full", logp_all, full, roll.responses, mask, full=True,
                                           sampled=(roll.responses, mask)),
                              *[paired.claim(f"replay_without_{k}", lk, c, roll.responses, mask, full=True,
                                             sampled=(roll.responses, mask)) for k, (lk, c) in enumerate(zip(logp_loo, loo))]])
        opt.zero_grad(set_to_none=True)
        audited.backward(ctx, loss, student, arm="mrtpo", scored=[audited.responses("logp", logp, prompts, roll.responses, mask)])
        grad_norm = torch.sqrt(sum((q.grad.double() ** 2).sum() for q in student.parameters() if q.grad is not None))
        ctx.meter.optimizer_step(opt)
        after = state_copy(student)

        kept.append(Update(index=step, prompts=prompts, blocks=blocks, student_ctx=s_ctx, full=full, loo=list(loo),
                           frozen=frozen, responses=roll.responses, mask=mask, logp_all=logp_all,
                           logp_loo=logp_loo, empty=empty, rewards=rewards, beta=float(beta), weights=w.detach(),
                           reward_adv=reward_adv, advantages=adv.detach(), metrics=metrics, old_logp=roll.old_logp,
                           update_ctx=u_ctx, frozen_state=frozen_state, student_before=before, student_after=after))
        ctx.record_step(
            step=step + 1,
            loss=float(loss.detach()),
            beta=beta,
            **_cap_figures(reward_adv, w, mask, eps),
            grad_norm=float(grad_norm),
            student_l2_change=param_l2_change(before, student),
            snapshot_param_change=param_l2_change(frozen_state, frozen),
            reward_mean=[float(r.mean()) for r in rewards],
            tokens=roll.n_tokens,
            **_weight_stats(w, mask),
        )
    return Trace(updates=kept)


from engine.kinds.paired_control import paired_run  # noqa: E402  (below: the lines above keep their numbers)
import contextvars  # noqa: E402

# Set for a run whose only reader is the learning kind (it measures the arms' policies, never the run's step records
# or reports): the exact per-update figures below cost more than the update itself at the learning budget.
_OUTCOME_ONLY: contextvars.ContextVar = contextvars.ContextVar("mrtpo_outcome_only", default=False)


def _cap_figures(reward_adv, weights, mask, eps) -> dict:
    """The step record's cap, std and whether the cap bound, computed from the update's tensors: the metrics dict
    mrtpo_advantages returned is its report, compared by reported_metrics_agree, never recorded as the run's."""
    from methods.mrtpo.measure import advantage_figures

    if _OUTCOME_ONLY.get():
        return {}

    fig = advantage_figures(reward_adv, weights, mask, eps)
    return {"s": fig["s"], "adv_std": fig["std"], "capped": fig["capped"]}


def grpo_control(impl, ctx) -> None:
    """The GRPO control arm of the run: the same seeded student, prompts, sampling stream and number of updates as
    `trace`, trained on GRPO group advantages of the summed verifier rewards (no replay, no credit weights)."""
    p = ctx.params
    updates, n_prompts, group = int(p.get("updates", 3)), int(p.get("prompts", 4)), int(p.get("group_size", 8))
    student = paired.arm_policy(impl, lambda: make_policy(ctx, int(p.get("hidden_size", 16))))
    opt = torch.optim.Adam(student.parameters(), lr=float(p.get("lr", 1e-2)))
    g = paired.stream(ctx, impl, 7)
    for _ in range(updates):
        prompts = make_prompts(n_prompts, g).repeat_interleave(group, dim=0).to(ctx.device)
        grpo_control_update(ctx, student, opt, prompts, int(p.get("max_new_tokens", 8)), g, group,
                            lambda pr, responses, mask: verify(pr, responses, mask).sum(0), arm="grpo-control")


@paired_run("mrtpo.mechanism")
def paired_arms(impl, ctx) -> None:
    """The MRTPO arm (`trace`) and its GRPO control, each under the arm record (paired_control)."""
    from methods.mrtpo.measure import report_advantages

    outcome_only = bool(ctx.__dict__.get("paired_outcome_only"))
    token = _OUTCOME_ONLY.set(outcome_only)
    try:
        for arm in paired.arms(ctx, ("mrtpo", "grpo-control"), method="mrtpo"):
            if arm == "mrtpo":
                updates = trace(impl, ctx).updates
                if not outcome_only:
                    report_advantages(ctx, updates)  # what mrtpo_advantages reported, beside ours
            else:
                grpo_control(impl, ctx)
    finally:
        _OUTCOME_ONLY.reset(token)


class TwoTargetTask:
    """The run's task for the learning kind: a plain prompt (the student's context), rewarded by the mean of the
    two verifiers (0, 0.5 or 1)."""

    def prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return make_prompts(n, generator)

    def context(self, prompts: torch.Tensor) -> torch.Tensor:
        return prompts

    def verify(self, prompts: torch.Tensor, responses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return verify(prompts, responses, mask).mean(0)


from engine.kinds.learning import learning_task  # noqa: E402
from methods.common.validation import Validated  # noqa: E402

learning_task("mrtpo.two_targets")(lambda params: Validated(TwoTargetTask()))
