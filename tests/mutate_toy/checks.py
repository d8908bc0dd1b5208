"""The toy's implementation and its one contract (a float64 value and gradient against the closed form)."""

import torch

from engine.spec import registry
from mutate_toy.method import weighted_mean

IMPL = registry.implementation("mutate_toy", weighted_mean=weighted_mean)


@registry.check("mutate_toy.value_and_grad")
def value_and_grad(impl, ctx):
    g = ctx.generator()
    x = torch.randn(3, 5, generator=g, dtype=torch.float64)
    w = 1.0 + torch.rand(3, 5, generator=g, dtype=torch.float64)  # every row's weights sum to more than 1
    xx = x.clone().requires_grad_(True)
    out = impl.weighted_mean(xx, w)
    (grad,) = torch.autograd.grad(out.sum(), xx)
    ref = (x * w).sum(-1) / w.sum(-1)
    gref = w / w.sum(-1, keepdim=True)
    return {"max_abs_err": (out - ref).abs().max(), "grad_max_abs_err": (grad - gref).abs().max()}


@registry.mutant("mutate_toy.plain_mean", base="mutate_toy")
def plain_mean():
    """Ignores the weights (the spec needs one mutant its contract kills)."""
    return IMPL.replace("mutate_toy.plain_mean", weighted_mean=lambda x, w: x.mean(-1))
