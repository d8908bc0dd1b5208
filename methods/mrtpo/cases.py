"""Random inputs for the MRTPO checks, drawn on a seeded CPU generator in float64.

Checks cast them to the dtype under test and move them to the device, so a
seed gives the same inputs everywhere. Kinds of distribution pairs cover the
regimes the JS distance must handle: unrelated, nearly identical (tiny JS,
where cancellation would show), peaked (probabilities near e^-40), exact
zeros (-inf), disjoint supports (JS = ln 2) and -1e4 log-probabilities.
"""

from __future__ import annotations

import math

import torch

PAIR_KINDS = ("random", "close", "peaked", "zeros", "disjoint", "tiny")


def _randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _uniform(g, lo, hi):
    return lo + (hi - lo) * float(torch.rand((), generator=g, dtype=torch.float64))


def logp_pair(g: torch.Generator, rows: int, V: int, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two [rows, V] float64 log-probability tensors of the given kind."""
    if kind == "random":
        a = _randn(g, rows, V) * _uniform(g, 0.2, 3.0)
        b = _randn(g, rows, V) * _uniform(g, 0.2, 3.0)
    elif kind == "close":
        a = _randn(g, rows, V) * _uniform(g, 0.5, 3.0)
        delta = 10.0 ** _uniform(g, -6.0, -2.0)
        b = a + delta * _randn(g, rows, V)
    elif kind == "peaked":
        a = _randn(g, rows, V) * 20.0
        b = a + _randn(g, rows, V) * _uniform(g, 0.01, 3.0)
    elif kind == "zeros":
        a = _randn(g, rows, V)
        b = _randn(g, rows, V)
        za = torch.rand(rows, V, generator=g) < 0.3
        zb = torch.rand(rows, V, generator=g) < 0.3
        za[:, 0] = False  # every row keeps some mass
        zb[:, -1] = False
        a = a.masked_fill(za, -math.inf)
        b = b.masked_fill(zb, -math.inf)
    elif kind == "disjoint":
        half = max(1, V // 2)
        a = _randn(g, rows, V)
        b = _randn(g, rows, V)
        a[:, half:] = -math.inf
        b[:, :half] = -math.inf
        if V == 1:
            b = a.clone()
    elif kind == "tiny":
        a = _randn(g, rows, V)
        b = _randn(g, rows, V)
        a = a.masked_fill(torch.rand(rows, V, generator=g) < 0.4, -1.0e4)
        b = b.masked_fill(torch.rand(rows, V, generator=g) < 0.4, -1.0e4)
        a[:, 0] = 0.0
        b[:, 0] = 0.0
    else:
        raise ValueError(kind)
    return a.log_softmax(-1), b.log_softmax(-1)


def response_mask(g: torch.Generator, B: int, T: int, allow_empty: bool = True) -> torch.Tensor:
    """[B, T] prefix masks (response tokens, then padding); row 0 full, row 1 non-empty, others
    of any length (0 too, unless allow_empty is False)."""
    lo = 0 if allow_empty else 1
    lengths = torch.randint(lo, T + 1, (B,), generator=g)
    lengths[0] = T
    if B >= 2:
        lengths[1] = lengths[1].clamp_min(1)
    return torch.arange(T)[None, :] < lengths[:, None]


def credit_batch(g: torch.Generator, K: int, B: int, T: int, V: int, kinds=PAIR_KINDS):
    """logp_all [B, T, V], logp_loo [K, B, T, V] (float64), each reward's pairs of one kind.

    Reward k uses kind kinds[k % len(kinds)] shifted by a random offset, so a
    batch mixes regimes; logp_loo[k] differs from logp_all row by row."""
    loo = []
    base = _randn(g, B, T, V) * _uniform(g, 0.5, 2.0)
    logp_all = base.log_softmax(-1)
    off = int(torch.randint(0, len(kinds), (), generator=g))
    for k in range(K):
        kind = kinds[(k + off) % len(kinds)]
        _, b = logp_pair(g, B * T, V, kind)
        if kind in ("close", "peaked"):
            # perturb logp_all itself so the pair is close / peaked relative to it
            scale = 10.0 ** _uniform(g, -5.0, -1.0) if kind == "close" else _uniform(g, 0.5, 3.0)
            b = (logp_all.reshape(B * T, V) + scale * _randn(g, B * T, V)).log_softmax(-1)
        loo.append(b.reshape(B, T, V))
    return logp_all, torch.stack(loo, 0)


def conserved_weights(g, K: int, B: int, T: int, mask: torch.Tensor, spread: float) -> torch.Tensor:
    """Positive weights with mean 1 over each response's valid tokens (0 on padding)."""
    raw = torch.exp(spread * torch.randn(K, B, T, generator=g, dtype=torch.float64))
    raw = torch.where(mask[None], raw, 0.0)
    mean = raw.sum(-1, keepdim=True) / mask.sum(-1).clamp_min(1)[None, :, None]
    return torch.where(mask[None], raw / mean.clamp_min(1e-300), 0.0)


def to_lists(*tensors: torch.Tensor):
    return [t.detach().double().cpu().tolist() for t in tensors]
