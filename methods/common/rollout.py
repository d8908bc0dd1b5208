"""Real sampling from a policy, and response log-probabilities under any context."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from methods.common import paired
from methods.common.tasks import EOS, PAD
from methods.grpo.sampler import behaviour_logprobs, response_mask


@dataclass
class Rollout:
    prompts: torch.Tensor  # [B, P] context the policy saw
    responses: torch.Tensor  # [B, T]; PAD after EOS
    mask: torch.Tensor  # [B, T] bool; True for response tokens up to and including EOS
    old_logp: torch.Tensor  # [B, T] behaviour log-probs at the sampling temperature (0 where masked)

    @property
    def n_tokens(self) -> int:
        return int(self.mask.sum())


@torch.no_grad()
def sample(
    policy,
    prompts: torch.Tensor,
    max_new_tokens: int,
    generator: torch.Generator,
    temperature: float = 1.0,
) -> Rollout:
    """Autoregressive sampling; the behaviour log-probs are taken at the sampling temperature
    (TRL #4159: log-probs at another temperature make the on-policy ratio wrong)."""
    device = next(policy.parameters()).device
    prompts = prompts.to(device)
    B = prompts.shape[0]
    logits, _, state = policy(prompts)
    step_logits = logits[:, -1]
    tokens, logps = [], []
    done = torch.zeros(B, dtype=torch.bool, device=device)
    record = paired.drawing(generator)  # inside a mechanism run's arm: this draw is logged for paired_control
    uniforms = []
    for _ in range(max_new_tokens):
        logp = F.log_softmax(step_logits.double() / temperature, dim=-1)
        # Draw on the CPU generator so a seed gives the same samples on every device.
        u = torch.rand(B, 1, generator=generator, dtype=torch.float64)
        if record is not None:
            uniforms.append(u)
        u = u.to(device)
        cdf = logp.exp().cumsum(-1)
        tok = torch.searchsorted(cdf, u * cdf[:, -1:]).clamp_max(logp.shape[-1] - 1).squeeze(-1)
        tok = torch.where(done, torch.full_like(tok, PAD), tok)
        tokens.append(tok)
        logps.append(behaviour_logprobs(step_logits[:, None], tok[:, None], temperature)[:, 0].float())
        done = done | (tok == EOS)
        logits, _, state = policy(tok[:, None], state)
        step_logits = logits[:, -1]
    responses = torch.stack(tokens, 1)
    mask = response_mask(responses, EOS)
    old_logp = torch.where(mask, torch.stack(logps, 1), torch.zeros_like(mask, dtype=torch.float32))
    if record is not None:
        paired.log_draw(record, policy, uniforms, responses, mask)
    return Rollout(prompts=prompts, responses=responses, mask=mask, old_logp=old_logp)


def sequence_logprobs(
    policy,
    context: torch.Tensor,
    responses: torch.Tensor,
    temperature: float = 1.0,
    full: bool = False,
):
    """Log-probs of `responses` given `context` ([B, P] + [B, T]).

    Returns (logp [B, T], hidden [B, T, H]) and, with `full=True`, also the
    full-vocabulary log-distribution [B, T, V] at every response position.
    """
    inp = torch.cat([context, responses[:, :-1]], dim=1)
    logits, hidden, _ = policy(inp)
    P = context.shape[1]
    logits = logits[:, P - 1 :]
    hidden = hidden[:, P - 1 :]
    logdist = F.log_softmax(logits.float() / temperature, dim=-1)
    logp = logdist.gather(-1, responses[..., None]).squeeze(-1)
    if full:
        return logp, hidden, logdist
    return logp, hidden
