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


def as_bool_mask(mask: torch.Tensor, name: str = "mask", prefix: str = "") -> torch.Tensor:
    """`mask` as bool, by the interfaces' convention: bool, or 0/1 in any real dtype (integer or floating).
    Any other value (2, 0.5, NaN) or a complex mask is a ValueError whose message starts with `prefix`."""
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise ValueError(f"{prefix}{name} must be bool or real 0/1, got {mask.dtype}")
    if bool(((mask != 0) & (mask != 1)).any()):  # NaN is neither 0 nor 1
        raise ValueError(f"{prefix}{name} must be bool or hold only 0 and 1 (any real dtype)")
    return mask != 0
