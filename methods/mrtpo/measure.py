"""Small measuring helpers shared by the MRTPO checks (max |x| and a NaN-keeping max)."""

from __future__ import annotations

import math

import torch

# Check code: helpers of the checks; nothing of the method runs them.
__mutate__ = False  # `contracts mutate` does not plant bugs here

NAN = float("nan")


def worst(*values: float) -> float:
    """Largest value, NaN if any is NaN (Python's max would silently skip a NaN); 0 for none."""
    vals = [float(v) for v in values]
    if any(math.isnan(v) for v in vals):
        return NAN
    return max(vals) if vals else 0.0


def maxabs(x: torch.Tensor) -> float:
    """max |x| over all entries; NaN if any entry is NaN; 0 for an empty tensor."""
    if x.numel() == 0:
        return 0.0
    x = x.detach().double().abs()
    if bool(torch.isnan(x).any()):
        return NAN
    return float(x.max())
