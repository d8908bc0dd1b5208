"""Masked reductions that a NaN in a masked slot cannot poison.

`x * mask` turns NaN * 0 into NaN (OpenRLHF PR #1240); `torch.where` selects
instead of multiplying, so junk in prompt or padding slots never reaches a sum
or a gradient.
"""

from __future__ import annotations

import torch


def valid_where(x: torch.Tensor, mask: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """`x` where `mask` is true, `fill` elsewhere (no gradient reaches masked slots)."""
    return torch.where(mask.bool(), x, torch.full_like(x, fill))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    y = valid_where(x, mask)
    return y.sum() if dim is None else y.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean over valid slots; an all-masked reduction gives 0, not NaN."""
    m = mask.bool()
    count = m.sum() if dim is None else m.sum(dim)
    return masked_sum(x, m, dim) / count.clamp_min(1).to(x.dtype)
