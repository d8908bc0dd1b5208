"""The toy method: a weighted mean over the last dim. Every line of `weighted_mean` is mutated by the tests."""

import torch


def weighted_mean(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    total = (x * w).sum(dim=-1)
    return total / w.sum(dim=-1).clamp_min(1e-30)


def unused_scale(x):  # no contract calls this: none of its lines may be mutated
    return x * 3 + 1
