"""The two decisions of the shared rollout sampler (methods/common/rollout.sample) that GRPO's ratio depends on.

The control's rollout is specified in specs/grpo.yaml: the mask covers every sampled token up to and including the
first EOS and nothing after it, and the behaviour log-probs (the ratio's denominator) are the sampled tokens'
log-probs under the sampling distribution, at the sampling temperature (TRL #4159: log-probs at temperature 1 of
tokens sampled at 0.7 make the first, on-policy ratio differ from 1). The sampler calls these, so the functions
the spec checks are the ones every mechanism run samples with.
"""

from __future__ import annotations

import math

import torch


def response_mask(responses: torch.Tensor, eos_id: int = 1) -> torch.Tensor:
    """[B, T] bool: True at each sampled token up to and including the row's first EOS, False after it."""
    if responses.dim() != 2 or responses.is_floating_point() or responses.dtype == torch.bool:
        raise TypeError(f"responses must be integer token ids [B, T], got {responses.dtype} {tuple(responses.shape)}")
    eos = (responses == eos_id).to(torch.int32)
    return (torch.cumsum(eos, dim=1) - eos) == 0  # no EOS strictly before t


def behaviour_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) at `tokens`, in float64: [B, T, V] logits and [B, T] ids -> [B, T]."""
    if isinstance(temperature, bool) or not (float(temperature) > 0.0) or not math.isfinite(float(temperature)):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    logdist = torch.log_softmax(logits.double() / float(temperature), dim=-1)
    return logdist.gather(-1, tokens[..., None].long()).squeeze(-1)
