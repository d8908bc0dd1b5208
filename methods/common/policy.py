"""A tiny seeded GRU language model: real sampling, real gradients, in milliseconds."""

from __future__ import annotations

import copy

import torch
from torch import nn

from methods.common.tasks import PAD


class TinyGRUPolicy(nn.Module):
    """Embedding -> one GRU layer -> vocabulary logits.

    `forward(tokens)` returns logits [B, L, V] and hidden states [B, L, H];
    the logits at position i predict token i + 1.
    """

    def __init__(self, vocab_size: int = 16, hidden_size: int = 8, embed_size: int | None = None):
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        embed_size = embed_size or hidden_size
        self.embed = nn.Embedding(vocab_size, embed_size)
        self.gru = nn.GRU(embed_size, hidden_size, batch_first=True)
        self.head = nn.Linear(hidden_size, vocab_size)
        # PAD is never a content token: a large finite negative logit keeps it
        # unsampled while every log-prob stays finite (no -inf * 0 = NaN downstream).
        pad_bias = torch.zeros(vocab_size)
        pad_bias[PAD] = -1.0e4
        self.register_buffer("pad_bias", pad_bias, persistent=False)

    def forward(self, tokens: torch.Tensor, state: torch.Tensor | None = None):
        hidden, last = self.gru(self.embed(tokens), state)
        return self.head(hidden) + self.pad_bias, hidden, last

    @classmethod
    def seeded(cls, seed: int, device: torch.device | str = "cpu", **kwargs) -> "TinyGRUPolicy":
        """Random init from `seed` on the CPU, then moved: the same weights on every device."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            policy = cls(**kwargs)
        return policy.to(device)


def snapshot(policy: nn.Module) -> nn.Module:
    """A frozen copy: no parameter of it requires grad."""
    frozen = copy.deepcopy(policy)
    for p in frozen.parameters():
        p.requires_grad_(False)
    frozen.eval()
    return frozen


def param_l2_change(before: dict[str, torch.Tensor], module: nn.Module) -> float:
    """L2 norm of the parameter change since `before` (a detached state_dict copy)."""
    total = torch.zeros((), dtype=torch.float64)
    for name, p in module.state_dict().items():
        total += (p.detach().double().cpu() - before[name].double().cpu()).pow(2).sum()
    return float(total.sqrt())


def state_copy(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def make_policy(ctx, vocab_size: int = 16, hidden_size: int = 8) -> nn.Module:
    """The policy a mechanism run trains, seeded from `ctx.seed` and on `ctx.device`.

    A seeded TinyGRUPolicy, unless the run was given another policy
    (`contracts check --policy hf:PATH` sets `ctx.policy_factory`). Mechanism
    runs build every policy through here, so a real checkpoint can stand in for
    the tiny model without any change to the method's code; `hidden_size` only
    applies to the tiny model.
    """
    factory = getattr(ctx, "policy_factory", None)
    if factory is not None:
        return factory(seed=ctx.seed, device=ctx.device, vocab_size=vocab_size, hidden_size=hidden_size)
    return TinyGRUPolicy.seeded(ctx.seed, ctx.device, vocab_size=vocab_size, hidden_size=hidden_size)
