"""The argument checks and masked building blocks the policy-gradient losses of the framework zoo share
(DAPO, Dr. GRPO, CISPO, GMPO, GPG: methods/<name>/loss.py).

Every loss here takes per-token log-probs of B rows of L slots and a response mask. The conventions are the
interfaces' (specs/*.yaml, `interface.conventions`): a mask is bool or 0/1 of any real dtype; junk (NaN, +/-inf,
+/-1e4) in masked slots is removed with torch.where before any arithmetic, so it moves neither a value nor a
gradient; arithmetic runs in float32 or wider; a bad argument is a ValueError naming it.

Each method package lists this module in `__mutate_also__`: it is the method's code on every call.
"""

from __future__ import annotations

import math

import torch

from methods.common.masking import as_bool_mask


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 or wider: float16/bfloat16 are upcast, float32/float64 kept."""
    return torch.promote_types(dtype, torch.float32)


def check_logp(logp: torch.Tensor, mask: torch.Tensor, *others: tuple[str, torch.Tensor | None]) -> torch.Tensor:
    """The [B, L] response mask as bool, after checking that logp is [B, L] and each named other tensor (old_logp,
    ...) has its shape."""
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, L], got shape {tuple(logp.shape)}")
    for name, x in others:
        if x is not None and x.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(logp.shape)} (as logp)")
    if mask.shape != logp.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(logp.shape)} (as logp)")
    return as_bool_mask(mask)


def row_counts(m: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(valid tokens per row [B], tokens N, non-empty rows G); a mask with no valid token is refused."""
    n_row = m.sum(dim=-1)
    n = int(n_row.sum())
    if n == 0:
        raise ValueError("the mask selects no response token: there is nothing to optimise")
    return n_row, n, int((n_row > 0).sum())


def check_number(name: str, value, *, low: float = 0.0, below: float | None = None) -> float:
    """`value` as a float: a finite real number, not a bool, >= low (and < below when given)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)) \
            or float(value) < low or (below is not None and float(value) >= below):
        bound = f"in [{low:g}, {below:g})" if below is not None else f">= {low:g}"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def check_clamp(value) -> float:
    """The log-ratio clamp C: in (0, 80] (exp(C) must stay finite in float32), not a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 80.0:
        raise ValueError(f"log_ratio_clamp must be in (0, 80] (exp of it must stay finite in float32), got {value!r}")
    return float(value)


def check_length(name: str, value) -> int:
    """A Python int >= 1 (a bool or a float is refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def token_advantages(advantages: torch.Tensor, m: torch.Tensor, cdt: torch.dtype) -> torch.Tensor:
    """[B] or [B, L] advantages as [B, L] at the valid tokens, 0 elsewhere (junk removed, detached); a NaN or inf
    advantage at a valid token is refused."""
    if advantages.dim() == 1 and advantages.shape[0] == m.shape[0]:
        advantages = advantages[:, None].expand(m.shape)
    elif advantages.shape != m.shape:
        raise ValueError(f"advantages must be [B] or [B, L] = {tuple(m.shape)}, got {tuple(advantages.shape)}")
    a = torch.where(m, advantages.detach().to(cdt), torch.zeros((), dtype=cdt, device=m.device))
    if not bool(torch.isfinite(a).all()):
        raise ValueError("advantages hold NaN or inf at valid response positions")
    return a


def row_advantages(advantages: torch.Tensor, has: torch.Tensor, cdt: torch.dtype) -> torch.Tensor:
    """[B] advantages (one per response), 0 for rows with no valid token (never read), detached; a NaN or inf
    advantage of a non-empty response is refused, and so is any other shape."""
    if advantages.shape != has.shape:
        raise ValueError(f"advantages must be one per response, [B] = [{has.shape[0]}], got "
                         f"{tuple(advantages.shape)}")
    a = torch.where(has, advantages.detach().to(cdt), torch.zeros((), dtype=cdt, device=has.device))
    if not bool(torch.isfinite(a).all()):
        raise ValueError("advantages hold NaN or inf for a response that has valid tokens")
    return a


def masked(x: torch.Tensor, m: torch.Tensor, cdt: torch.dtype) -> torch.Tensor:
    """x in the compute dtype at valid tokens, 0 at masked ones (selected, never multiplied: NaN * 0 = NaN)."""
    return torch.where(m, x.to(cdt), torch.zeros((), dtype=cdt, device=m.device))


def log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, m: torch.Tensor, cdt: torch.dtype) -> torch.Tensor:
    """logp - old_logp at valid tokens, 0 at masked ones; differentiable in logp only (old_logp is a constant)."""
    return masked(logp.to(cdt) - old_logp.detach().to(cdt), m, cdt)
