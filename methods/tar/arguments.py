"""Argument contracts: what the FPS bank, the replay loss and the total loss refuse, and what they accept.

The formula contracts call the method with well-formed arguments only, so a guard that lets a
wrong argument through (a float mask read as bool, verifier marks of 2, k = True, prompt ids
in float) would pass them all and then be silently misread in a run. Each case here passes one
defective argument and expects the documented rejection (ValueError, TypeError for soft_gate),
beside its well-formed twin, which must be accepted and give the same result as the canonical
form (integer 0/1 marks and masks as bool, an int32 id tensor as int64 ids). The FPS's default
k is the page's 3.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.tar.checks import F64, on, picks, raises

# Check code, not a mutation target of `contracts mutate` (like checks.py): it only calls the method.
__mutate__ = False


def _raises(kind, fn) -> bool:
    return raises(kind, fn)[0]


def _accepts(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a refusal of a valid input is the miss measured (None: not accepted)
        return None


# Mutations that hand a tensor of the wrong dtype class (the interface's conventions: TypeError).
_DTYPE_CLASS = frozenset({"embeddings_integer", "ids_float", "ids_complex", "ids_bool", "theta_integer", "base_integer"})


@registry.check("tar.fps_rejects_bad_arguments")
def fps_rejects_bad_arguments(impl, ctx) -> dict:
    """Malformed verifier marks, prompt ids, k and embeddings raise ValueError; their well-formed twins
    (integer or float 0/1 marks, int32 ids, k = 0) are accepted; k defaults to 3."""
    g = ctx.generator(140)
    N, D = 12, 4
    emb = torch.randn(N, D, generator=g, dtype=F64) * torch.exp(torch.randn(N, 1, generator=g, dtype=F64))
    ids = torch.tensor([5, 5, 5, 5, 5, -2, -2, -2, 9, 9, 9, 9])
    correct = torch.tensor([1, 1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 1], dtype=torch.bool)
    dt = ctx.dtype

    def fps(e=emb, c=correct, k=3, p=ids, **kw):
        args = {} if k is None else {"k": k}
        out = impl.farthest_point_prototypes(on(ctx, e, dt if e.is_floating_point() else e.dtype), on(ctx, c),
                                             prompt_ids=None if p is None else on(ctx, p), **args, **kw)
        return [int(i) for i in torch.as_tensor(out).cpu().tolist()]

    want = picks(impl, ctx, emb, correct, 3, ids)
    bad = {
        "correct_fraction": lambda: fps(c=correct.to(F64) * 0.5),
        "correct_value_2": lambda: fps(c=correct.long() * 2),
        "correct_shape": lambda: fps(c=correct[:-1]),
        "embeddings_1d": lambda: fps(e=emb[0]),
        "embeddings_integer": lambda: fps(e=(emb * 10).long()),
        "embeddings_no_dims": lambda: fps(e=emb[:, :0]),  # every norm is 0
        "k_bool": lambda: fps(k=True),
        "k_fraction": lambda: fps(k=2.5),
        "k_negative": lambda: fps(k=-1),
        "ids_float": lambda: fps(p=ids.to(F64)),
        "ids_complex": lambda: fps(p=ids.to(torch.complex64)),
        "ids_bool": lambda: fps(p=ids > 0),
        "ids_shape": lambda: fps(p=ids[:-1]),
    }
    # the interface's convention: a tensor of the wrong dtype class is a TypeError, a wrong shape or value a ValueError
    rejected = {name: _raises(TypeError if name in _DTYPE_CLASS else ValueError, fn) for name, fn in bad.items()}
    int_marks = _accepts(lambda: fps(c=correct.long()))
    float_marks = _accepts(lambda: fps(c=correct.to(F64)))
    int32_ids = _accepts(lambda: fps(p=ids.int()))
    k_zero = _accepts(lambda: fps(k=0))
    default_k = _accepts(lambda: fps(k=None))
    return {
        **{f"rejects_{name}": v for name, v in rejected.items()},
        "integer_marks_accepted_as_bool": int_marks == want,
        "float_marks_accepted_as_bool": float_marks == want,
        "int32_ids_accepted": int32_ids == want,
        "k_zero_picks_nothing": k_zero == [],
        "default_k_is_3": default_k == want and len(want) == 6,  # 3 of prompt 5's five, 2 of -2, 1 of 9
    }


@registry.check("tar.replay_rejects_bad_arguments")
def replay_rejects_bad_arguments(impl, ctx) -> dict:
    """Malformed log-prob tensors and masks raise ValueError, a non-float soft_gate input TypeError and a
    non-finite lambda_rep ValueError; an integer or float 0/1 mask is accepted as the bool mask."""
    g = ctx.generator(150)
    lt = -torch.rand(3, 5, generator=g, dtype=F64) * 4 - 4
    lb = lt + torch.rand(3, 5, generator=g, dtype=F64) * 4 - 2
    mask = torch.rand(3, 5, generator=g) < 0.8
    mask[:, 0] = True
    dt = ctx.dtype

    def loss(a=lt, b=lb, m=mask):
        x = on(ctx, a, dt if a.is_floating_point() else a.dtype)
        y = on(ctx, b, dt if b.is_floating_point() else b.dtype)
        out, _ = impl.adaptive_replay_loss(x, y, on(ctx, m))
        return float(out.detach())

    want = loss()
    bad = {
        "theta_1d": lambda: loss(a=lt[0], b=lb[0], m=mask[0]),
        "base_shape": lambda: loss(b=lb[:, :-1]),
        "mask_shape": lambda: loss(m=mask[:, :-1]),
        "theta_integer": lambda: loss(a=lt.round().long()),
        "base_integer": lambda: loss(b=lb.round().long()),
        "mask_fraction": lambda: loss(m=mask.to(F64) * 0.5),
        "mask_complex": lambda: loss(m=mask.to(torch.complex64)),
        "mask_value_2": lambda: loss(m=mask.long() * 2),
    }
    # the interface's convention: a tensor of the wrong dtype class is a TypeError, a wrong shape or value a ValueError
    rejected = {name: _raises(TypeError if name in _DTYPE_CLASS else ValueError, fn) for name, fn in bad.items()}
    gate_int = _raises(TypeError, lambda: impl.soft_gate(on(ctx, torch.arange(3))))
    lam = {v: _raises(ValueError, lambda v=v: impl.tar_total_loss(torch.zeros(()), torch.zeros(()), lambda_rep=v))
           for v in (math.nan, math.inf, -1.0)}
    int_mask = _accepts(lambda: loss(m=mask.long()))
    float_mask = _accepts(lambda: loss(m=mask.to(F64)))
    return {
        **{f"rejects_{name}": v for name, v in rejected.items()},
        "integer_mask_accepted_as_bool": int_mask == want,
        "float_mask_accepted_as_bool": float_mask == want,
        "soft_gate_rejects_integer": gate_int,
        "rejects_nan_lambda": lam[math.nan],
        "rejects_inf_lambda": lam[math.inf],
        "rejects_negative_lambda": lam[-1.0],
    }
