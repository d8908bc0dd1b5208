"""The mechanism runs' side of the supervisor's gradient audit (engine/run/run_audit.py).

Every optimiser update of every arm takes its backward through `backward`, naming what its loss was computed
from; the audit compares the gradient that backward leaves in the policy with its own autograd of the declared
scoring. `declared_logprobs` is that scoring, written here from the interface's words (the Policy type of each
spec: the logits at position i give the distribution of token i + 1, log_softmax at temperature 1), apart from
rollout.sequence_logprobs, which the registered implementations use.
"""

from __future__ import annotations

import torch

from engine.run import run_audit
from engine.run.run_audit import Scored

# Check code, not a mutation target: it measures the runs' updates and decides nothing in them.
__mutate__ = False


def declared_logprobs(module: torch.nn.Module, prompts: torch.Tensor, responses: torch.Tensor,
                      full: bool = False) -> torch.Tensor:
    """log pi(response token t | prompt, earlier response tokens) [B, T] (`full`: the whole distribution
    [B, T, V]) by the declared convention, in the module's own dtype (the audit's float64 copy)."""
    P, T = prompts.shape[1], responses.shape[1]
    logits = module(torch.cat([prompts, responses[:, :-1]], dim=1))[0]
    logdist = torch.log_softmax(logits[:, P - 1 : P - 1 + T], dim=-1)
    return logdist if full else logdist.gather(-1, responses[..., None]).squeeze(-1)


def responses(name: str, used: torch.Tensor, prompts: torch.Tensor, responses: torch.Tensor, mask: torch.Tensor,
              full: bool = False) -> Scored:
    """`used` is the log-prob (`full`: log-distribution) of `responses` after `prompts` the loss read."""
    return Scored(name, used, lambda m: declared_logprobs(m, prompts, responses, full), mask)


def backward(ctx, loss: torch.Tensor, policy: torch.nn.Module, *, arm: str, scored: list[Scored],
             where: str = "") -> dict[str, torch.Tensor]:
    """`loss.backward()` under the audit; the gradient each scored tensor received in it (its upstream)."""
    with run_audit.of(ctx).backward(arm=arm, policy=policy, scored=scored, where=where) as upstream:
        if loss.requires_grad:
            loss.backward()
    return upstream
