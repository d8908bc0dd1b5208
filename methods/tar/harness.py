"""The steps around TAR's loss that carry the method's own decisions, kept in its implementation.

The page fixes three choices the replay loss depends on but does not itself compute, and leaves a fourth
to the implementation:

* the bank's reference log-probs come from the frozen base, not the live policy (scored by
  the live policy, delta is 0 and the replay never fires);
* the KL regulariser is KL(pi_theta || pi_base) over the full vocabulary, pulling the policy
  toward the base (the reverse direction, or the wrong sign, is a different method);
* the declared encoder for the FPS bank pools the base's hidden states over valid response
  tokens only (pooling over padding moves the embeddings, and with them the prototypes);
* an update replays the bank entries of its own prompts (the spec's replay_batch assumption): the
  whole bank, or another update's prompts, replays behaviour the update never sampled.

They live here, in the implementation the contracts receive, so a defect in any of them is
one the mechanism contract must catch.
"""

from __future__ import annotations

import torch

from methods.common import masked_mean, sequence_logprobs
from methods.common.masking import as_bool_mask


@torch.no_grad()
def trajectory_embeddings(base, prompts: torch.Tensor, responses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The declared encoder [N, H] float64: mean of the base's hidden states after each valid response token."""
    P = prompts.shape[1]
    _, hidden, _ = base(torch.cat([prompts, responses], dim=1))
    h = hidden[:, P:].double()
    m = as_bool_mask(mask)[..., None]
    return torch.where(m, h, torch.zeros_like(h)).sum(1) / m.sum(1).clamp_min(1)


def bank_logprobs(policy, base, prompts: torch.Tensor, responses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p_theta with grad, log p_base without grad) of the bank tokens; the base is the frozen one."""
    logp_theta, _ = sequence_logprobs(policy, prompts, responses)
    with torch.no_grad():
        logp_base, _ = sequence_logprobs(base, prompts, responses)
    return logp_theta, logp_base


def kl_to_base(logdist: torch.Tensor, base_logdist: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token mean over valid positions of KL(pi_theta || pi_base) = sum_v p_theta (log p_theta - log p_base).

    An entry with p_theta = 0 (logdist -inf) adds 0 log 0 = 0 and gets gradient 0 (not 0 * -inf = NaN). Masked
    positions are replaced before any arithmetic, so junk there (NaN, 1e4, whose exp is inf) reaches neither the
    value nor the gradient: masking only the per-token sum left 0 * NaN in the backward pass."""
    m = as_bool_mask(mask)
    zero = torch.zeros((), dtype=logdist.dtype, device=logdist.device)
    live = m[..., None] & (logdist != float("-inf"))  # the double where: no junk and no -inf reaches autograd
    lt = torch.where(live, logdist, zero)
    lb = torch.where(live, base_logdist.to(logdist.dtype), zero)
    kl_tok = torch.where(live, lt.exp() * (lt - lb), zero).sum(-1)
    return masked_mean(kl_tok, m)


def replay_rows(bank_prompts: torch.Tensor, step_prompts: torch.Tensor) -> torch.Tensor:
    """Indices (ascending) of the bank entries replayed at an update: those whose prompt is one of its prompts."""
    return torch.nonzero(torch.isin(bank_prompts, step_prompts)).flatten()
