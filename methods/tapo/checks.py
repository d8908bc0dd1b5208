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
