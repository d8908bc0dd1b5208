"""Exact sums for the float64 references at training sizes (the scale tier).

The per-scalar loop references are the standard; at 8 x 40,000 tokens a loop costs seconds per call, so the scale
tier's references compute each element in float64 tensor arithmetic (one correctly rounded operation after
another: a relative error of a few 1e-16 per element, in another precision and another order of operations than
the float32 implementation under test) and every sum that the contracts compare with `math.fsum` (the correctly
rounded sum of the float64 terms, whatever their number), so no accumulation error grows with the length.
Each of these references is held to the loop reference on small inputs (tests/test_scale.py).
"""

from __future__ import annotations

import math

import torch

# Check code, not a mutation target: it only sums what the references computed.
__mutate__ = False


def fsum(x: torch.Tensor) -> float:
    """The correctly rounded sum of every element of a float64 tensor."""
    return math.fsum(x.detach().to(torch.float64).reshape(-1).tolist())


def fsum_rows(x: torch.Tensor) -> torch.Tensor:
    """[B] float64: the correctly rounded sum of each row of a [B, L] tensor (of each [B, ...] slice)."""
    x = x.detach().to(torch.float64).reshape(x.shape[0], -1)
    return torch.tensor([math.fsum(row) for row in x.tolist()], dtype=torch.float64)
