"""TAPO's bespoke contracts: each check calls the method only through `impl` and returns measurements.

The contracts a generic kind states (reference agreement, gradient structure, masked junk, split/merge, precision,
refusal of bad inputs) are measured by engine/kinds from the spec; what stays here has a `why:` in the spec.

Inputs are drawn in float64 on the CPU from `ctx.generator`, cast to the dtype
under test and moved to the device; references are computed in float64 by the
plain loops of `reference.py` from the *cast* inputs, so an error figure measures
the implementation's arithmetic, not the rounding of its inputs.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.common.grpo import grpo_token_loss
from engine.kinds.inputs import response_mask
from methods.tapo import reference as ref

# --- inputs ---------------------------------------------------------------


def _draw(g: torch.Generator, B: int, L: int, delta_scale: float = 0.3, **layout):
    """float64 CPU logp, old_logp (old = logp + noise) and a mask; masked slots hold random finite values."""
    logp = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3.0 - 0.01
    old = logp + delta_scale * torch.randn(B, L, generator=g, dtype=torch.float64)
    mask = response_mask(g, B, L, **layout)
    return logp, old, mask


def _dims(g: torch.Generator, max_len: int, max_batch: int) -> tuple[int, int]:
    B = int(torch.randint(1, max_batch + 1, (1,), generator=g))
    L = int(torch.randint(2, max_len + 1, (1,), generator=g))
    return B, L


def _dev(ctx, x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fresh leaf on the device (never an alias of `x`, so requires_grad_ cannot leak between inputs)."""
    if x.dtype == torch.bool:
        return x.detach().to(ctx.device).clone()
    return x.detach().to(dtype or ctx.dtype).to(ctx.device).clone()


def _rows(x: torch.Tensor) -> list:
    """Nested float64 lists of what the implementation actually received."""
    return x.detach().to("cpu", torch.float64).tolist() if x.dtype != torch.bool else x.cpu().tolist()


def _nan_to_inf(x: float) -> float:
    return math.inf if math.isnan(x) else x


def lacks(impl, function: str) -> str | None:
    """Why `impl` has no `function` (an adapted framework loss has no separate ratio or schedule), or None when it
    has it. A check measuring several functions skips, and declares not applicable, what needs a missing one."""
    if registry.provides(impl, function):
        return None
    return f"no {function}: {getattr(getattr(impl, function, None), 'not_provided', None) or 'not in the implementation'}"


# --- contracts ------------------------------------------------------------


CLIP_HORIZONS = (1, 2, 3, 4, 5, 8, 17, 64, 257, 1024, 4096)


@registry.check("tapo.clip_schedule")
def clip_schedule(impl, ctx) -> dict:
    """eps_t against the float64 loop formula for several T: eps_1 = eps_max, eps_T = eps_min,
    non-increasing in t, inside [eps_min, eps_max], length T, and T = 1 gives [eps_max]."""
    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    lo = torch.tensor(eps_min, dtype=ctx.dtype).item()
    hi = torch.tensor(eps_max, dtype=ctx.dtype).item()
    first = last = max_abs = 0.0
    t1_err = math.inf
    violations = out_of_range = length_mismatch = 0
    for T in CLIP_HORIZONS:
        eps = impl.length_aware_clip(T, eps_min, eps_max, dtype=ctx.dtype, device=ctx.device)
        got = eps.detach().to("cpu", torch.float64).flatten().tolist()
        if len(got) != T:
            length_mismatch += 1
            continue
        want = ref.clip_eps(T, eps_min, eps_max)
        max_abs = max(max_abs, max(_nan_to_inf(abs(a - b)) for a, b in zip(got, want)))
        first = max(first, _nan_to_inf(abs(got[0] - eps_max)))
        if T > 1:  # T = 1 has one entry, eps_max (its own measurement, t1_err)
            last = max(last, _nan_to_inf(abs(got[-1] - eps_min)))
        violations += sum(1 for a, b in zip(got, got[1:]) if not b <= a)
        out_of_range += sum(1 for a in got if not lo <= a <= hi)
        if T == 1:
            t1_err = _nan_to_inf(abs(got[0] - eps_max))
    return {
        "max_abs_err": max_abs,
        "first_err": first,
        "last_err": last,
        "t1_err": t1_err,
        "monotone_violations": violations,
        "out_of_range": out_of_range,
        "length_mismatches": length_mismatch,
        "cases": len(CLIP_HORIZONS),
    }


@registry.check("tapo.on_policy_identity")
def on_policy_identity(impl, ctx) -> dict:
    """logp = old_logp: R^ = 1 exactly at valid positions, the loss is -mean(A) and its gradient is
    the vanilla policy gradient -A_t / N (and equals the GRPO control's gradient). The same holds when
    old_logp is the very tensor logp, grad and all: old_logp is a constant (sg) of the loss."""
    max_len = int(ctx.params.get("max_len", 40))
    max_batch = int(ctx.params.get("max_batch", 6))
    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    g = ctx.generator(6)
    ratio_dev = loss_err = grad_rel = grpo_rel = alias_rel = 0.0
    no_ratio = lacks(impl, "trajectory_ratio")
    if no_ratio:  # the loss -mean(A) and the vanilla policy gradient are still held
        ctx.not_applicable(no_ratio, "ratio_max_abs_dev")
    for _ in range(ctx.cases):
        B, L = _dims(g, max_len, max_batch)
        logp, _, mask = _draw(g, B, L)
        adv = torch.randn(B, generator=g, dtype=torch.float64)
        lp = _dev(ctx, logp).requires_grad_(True)
        op = _dev(ctx, logp).clone()  # same values, a separate tensor without grad
        a, m = _dev(ctx, adv), _dev(ctx, mask)
        if not no_ratio:
            r = impl.trajectory_ratio(lp, op, m).detach()
            ratio_dev = max(ratio_dev, float(torch.nan_to_num((torch.where(m, r, torch.ones_like(r)) - 1).abs(),
                                                              nan=math.inf).max()))
        loss, _ = impl.tapo_loss(lp, op, a, m, eps_min, eps_max)
        (grad,) = torch.autograd.grad(loss, lp)
        lq = _dev(ctx, logp).requires_grad_(True)
        grpo, _ = grpo_token_loss(lq, op, a, m, clip_eps=eps_max)
        (grpo_grad,) = torch.autograd.grad(grpo, lq)
        arow = _rows(a)
        n = int(mask.sum())
        want_loss = -sum(arow[b] for b in range(B) for t in range(L) if mask[b, t]) / n
        scale_l = sum(abs(arow[b]) for b in range(B) for t in range(L) if mask[b, t]) / n
        loss_err = max(loss_err, _nan_to_inf(abs(float(loss.detach()) - want_loss)) / max(scale_l, 1e-300))
        want = [[(-arow[b] / n if mask[b, t] else 0.0) for t in range(L)] for b in range(B)]
        scale = max(abs(x) for row in want for x in row) or 1.0
        got = _rows(grad)
        grad_rel = max(grad_rel, max(_nan_to_inf(abs(got[b][t] - want[b][t])) for b in range(B) for t in range(L)) / scale)
        grpo_rel = max(grpo_rel, float(torch.nan_to_num((grad - grpo_grad).abs(), nan=math.inf).max()) / scale)
        x = _dev(ctx, logp).requires_grad_(True)
        alias, _ = impl.tapo_loss(x, x, a, m, eps_min, eps_max)  # old_logp aliases logp
        (alias_grad,) = torch.autograd.grad(alias, x)
        got = _rows(alias_grad)
        alias_rel = max(alias_rel, max(_nan_to_inf(abs(got[b][t] - want[b][t])) for b in range(B) for t in range(L)) / scale)
    return {
        **({} if no_ratio else {"ratio_max_abs_dev": ratio_dev}),
        "loss_max_scaled_err": loss_err,
        "grad_max_rel_err": grad_rel,
        "grpo_grad_max_rel_diff": grpo_rel,
        "alias_grad_max_rel_err": alias_rel,
        "cases": ctx.cases,
    }
