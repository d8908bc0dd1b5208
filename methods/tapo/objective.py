"""TAPO (arXiv 2610.13020): prefix-trajectory ratio, length-aware clipping, clipped surrogate.

Notation (page 004, "核心公式"): for the response tokens t = 1..T of one response
(prompt and padding excluded, t counts valid response tokens only),

    R~_t = exp( (1/t) * sum_{i<=t} (l_theta,i - l_old,i) )                 prefix ratio
    R^_t = sg[R~_t] * pi_theta(o_t|s_t) / sg[pi_theta(o_t|s_t)]           Eq15 local surrogate ratio
    eps_t = eps_min + (eps_max - eps_min) * (t^-1/2 - T^-1/2) / (1 - T^-1/2)

R^_t has the value R~_t and the gradient R~_t * grad l_theta,t: no 1/t dilution and
no gradient into earlier positions.

Choices this module makes (the page is silent on them; each is stated in the spec):

* Arithmetic is done in float32 or wider: float16/bfloat16 inputs are upcast to
  float32 (the compute dtype) and results come back in the compute dtype.
* Junk is removed with ``torch.where``, never by multiplying it by 0, so NaN or
  +/-1e4 in prompt/padding slots changes no value and no gradient (the fused
  loss multiplies by a 0/1 mask only values that are finite by then).
  Masked positions of ``trajectory_ratio`` hold exactly 1.0 with zero gradient.
* A mask may have holes (e.g. tool output inside a response): t counts valid
  tokens only, so a hole neither advances t nor enters the prefix mean.
* T of the clip schedule is, per response, its own number of valid response
  tokens (so eps_1 = eps_max and eps_T = eps_min hold on every response); with
  ``horizon=H`` every response uses T = H instead (a response longer than H is
  an error, not a silent truncation).
* T = 1: eps_1 = eps_max. The formula is 0/0 there; every T > 1 gives
  eps_1 = eps_max, and a one-token response has no history whose drift would
  call for a tighter bound (R~_1 is the plain token ratio).
* Loss aggregation: token mean over all valid response tokens of the call,
  the same aggregation as the GRPO control (methods.common.grpo_token_loss).
  The returned ``metrics["tokens"]`` lets a trainer that splits a batch weight
  each part by its token count so the result equals the full-batch loss.
* A group whose advantages are all exactly zero on its valid tokens is
  rejected with ZeroAdvantageError (a ValueError). Advantage values in masked
  slots do not count. Without ``group_size`` the whole call is one group.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

__all__ = [
    "ZeroAdvantageError",
    "as_bool_mask",
    "prefix_log_ratio",
    "trajectory_ratio",
    "clip_schedule",
    "length_aware_clip",
    "tapo_loss",
    "build_tapo_loss",
    "reject_zero_advantage_groups",
    "ppo_surrogate",
]


class ZeroAdvantageError(ValueError):
    """A group whose advantages are all zero: it carries no learning signal and is rejected."""


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 or wider: float16/bfloat16 are upcast, float32/float64 are kept."""
    return torch.promote_types(dtype, torch.float32)


def as_bool_mask(mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The response mask as bool; a non-0/1 mask is refused (an advantage tensor passed
    where the mask belonged silently weighted verl's loss, verl #2506)."""
    if mask.shape != shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(shape)} (same as logp)")
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(
            "mask must be boolean or hold only 0 and 1; it holds other values "
            "(was an advantage or log-prob tensor passed as the mask?)"
        )
    return mask != 0


def valid_count(mask: torch.Tensor) -> torch.Tensor:
    """Number of valid tokens up to and including each position, as int32 (exact below 2^31).

    A bool cumsum goes through int64 and was 4-5x slower on CPU than this uint8 -> int32 one at
    [8, 16384] (benchmarks/tapo_loss.py); the values are the same.
    """
    return mask.view(torch.uint8).cumsum(dim=-1, dtype=torch.int32)


def prefix_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log R~_t = (1/t) sum_{i<=t} (l_theta,i - l_old,i), t counting valid tokens; detached.

    One masked cumulative sum over the last dimension (O(T)); 0 at masked positions.
    """
    m = as_bool_mask(mask, logp.shape)
    cdt = compute_dtype(logp.dtype)
    with torch.no_grad():
        zero = torch.zeros((), dtype=cdt, device=logp.device)
        delta = torch.where(m, logp.detach().to(cdt) - old_logp.detach().to(cdt), zero)
        count = valid_count(m).clamp_min_(1).to(cdt)
        return torch.where(m, delta.cumsum(dim=-1) / count, zero)


class _LocalRatio(torch.autograd.Function):
    """sg[R~] * exp(l - sg[l]) as one node: value R~_t, gradient R~_t * d l_t at valid positions, 0 elsewhere.

    The same numbers as building it from where/exp/mul (exp(0) = 1 exactly, so
    the chain rule multiplies by R~_t and nothing else), in one backward
    multiply instead of five graph nodes: at 16k-token responses the graph
    overhead was a third of the loss's time (benchmarks/tapo_loss.py).
    """

    @staticmethod
    def forward(ctx, logp: torch.Tensor, r_tilde: torch.Tensor, grad_scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(grad_scale)
        ctx.logp_dtype = logp.dtype
        return r_tilde

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (grad_scale,) = ctx.saved_tensors
        # A token whose incoming gradient is 0 (the clip or a zero advantage removed it) gets exactly 0, also
        # where R~_t overflowed: 0 * inf would be NaN, and one NaN token poisons the whole update.
        g = torch.where(grad == 0, torch.zeros((), dtype=grad.dtype, device=grad.device), grad * grad_scale)
        return g.to(ctx.logp_dtype), None, None


def trajectory_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """R^_t [B, T]: value R~_t, gradient R~_t * d logp_t only (Eq15).

    Masked positions hold 1.0 and pass no gradient; junk there (NaN, +/-1e4) changes nothing.
    """
    m = as_bool_mask(mask, logp.shape)
    r_tilde = torch.exp(prefix_log_ratio(logp, old_logp, m))  # sg[R~_t]; exactly 1 where masked
    if not logp.requires_grad:
        return r_tilde
    # pi_theta / sg[pi_theta] = exp(l - sg[l]): value exactly 1, gradient d l_t; masked: no gradient.
    grad_scale = torch.where(m, r_tilde, torch.zeros((), dtype=r_tilde.dtype, device=r_tilde.device))
    return _LocalRatio.apply(logp, r_tilde, grad_scale)


def clip_schedule(pos: torch.Tensor, T: torch.Tensor, eps_min: float, eps_max: float) -> torch.Tensor:
    """eps at position `pos` (1-based) of a response with horizon `T` (broadcasting floating tensors).

    Computed in the wider of the inputs' dtypes and float32. T = 1 gives eps_max (see the module docstring).
    """
    _check_eps(eps_min, eps_max)
    cdt = compute_dtype(torch.promote_types(pos.dtype, T.dtype))
    T = T.to(cdt)
    rT = T.rsqrt()
    longer = T > 1
    # (pos^-1/2 - T^-1/2) / (1 - T^-1/2) with the division done once per response, not per token;
    # T = 1 gets 0 / 1 here and eps_max below.
    inv_den = torch.where(longer, (1.0 - rT).reciprocal(), torch.zeros_like(rT))
    frac = pos.to(cdt).rsqrt().sub_(rT).mul_(inv_den)
    eps = frac.mul_(eps_max - eps_min).add_(eps_min)
    return torch.where(longer, eps, torch.full_like(eps, eps_max)) if not bool(longer.all()) else eps


def length_aware_clip(
    T: int,
    eps_min: float,
    eps_max: float,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """eps_t for t = 1..T as a [T] tensor: eps_1 = eps_max, eps_T = eps_min, non-increasing."""
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"T must be an integer >= 1, got {T!r}")
    pos = torch.arange(1, T + 1, dtype=torch.float64, device=device)
    eps = clip_schedule(pos, torch.tensor(float(T), dtype=torch.float64, device=device), eps_min, eps_max)
    return eps.to(dtype)


def _check_eps(eps_min: float, eps_max: float) -> None:
    if not (0.0 <= float(eps_min) <= float(eps_max)):
        raise ValueError(f"need 0 <= eps_min <= eps_max, got eps_min={eps_min}, eps_max={eps_max}")


def _check_horizon(horizon) -> None:
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")


def reject_zero_advantage_groups(adv: torch.Tensor, mask: torch.Tensor, group_size: int | None) -> None:
    """Raise ZeroAdvantageError if any group's advantages are all zero on its valid tokens.

    `adv` is [B, T] with masked slots already replaced by 0; `mask` is bool [B, T].
    """
    reject_silent_rows(((adv != 0) & mask).any(dim=-1), group_size)


def _check_groups(B: int, group_size: int | None) -> int:
    if group_size is None:
        group_size = B
    if group_size < 1 or B % group_size:
        raise ValueError(f"batch of {B} rows does not split into groups of {group_size}")
    return group_size


def reject_silent_rows(row_has_signal: torch.Tensor, group_size: int | None) -> None:
    """The guard on per-row flags [B] (some valid token has a non-zero advantage): the fused loss
    knows them from [B] advantages and row lengths without a pass over the tokens."""
    group_size = _check_groups(row_has_signal.shape[0], group_size)
    group_has_signal = row_has_signal.reshape(-1, group_size).any(dim=-1)
    if not bool(group_has_signal.all()):
        bad = torch.nonzero(~group_has_signal).flatten().tolist()
        raise ZeroAdvantageError(
            f"advantages are all zero on the valid tokens of group(s) {bad} (group size {group_size}): "
            "such a group carries no learning signal and is rejected; resample or drop it"
        )


def ppo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """Per-token PPO loss -min(R A, clip(R, 1 - eps, 1 + eps) A) with per-position bounds.

    A token with A = 0 contributes exactly 0 (the paper's term, whatever R): selected with torch.where, so an
    overflowed R (inf * 0 = NaN) reaches neither the value nor, through the unselected branch, the gradient."""
    clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps)
    term = -torch.minimum(ratio * adv, clipped * adv)
    return torch.where(adv == 0, torch.zeros((), dtype=term.dtype, device=term.device), term)


class _FusedLoss(torch.autograd.Function):
    """The whole clipped surrogate + token mean as one autograd node (see `_fused_tapo_loss`).

    Backward is the analytic gradient (-g / n) * A_t * [the clip does not zero token t] * R~_t,
    with `coef` = A_t * [...] (0 where masked) and R~ saved by the forward: two multiplies
    instead of the where/mul/clamp/minimum/neg/sum nodes the composed loss records.
    The products are taken in the order the composed graph takes them, so the gradient is
    the same number. (One exception, a rounding tie: R outside its bound with R A and
    clip(R) A rounding to the same float. torch.minimum's backward then sends half the
    gradient through the unclipped branch; here the clip zeroes it, as without the tie.)
    """

    @staticmethod
    def forward(ctx, logp: torch.Tensor, loss: torch.Tensor, coef: torch.Tensor, r_tilde: torch.Tensor,
                n_valid: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(coef, r_tilde, n_valid)
        ctx.logp_dtype = logp.dtype
        return loss

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        coef, r_tilde, n_valid = ctx.saved_tensors
        g = torch.mul(coef, -(grad / n_valid)).mul_(r_tilde)
        return g.to(ctx.logp_dtype), None, None, None, None


def _fused_tapo_loss(logp, old_logp, advantages, m, eps_min, eps_max, horizon, group_size):
    """`tapo_loss` of the default parts in few passes over the tokens; None if a ratio overflowed.

    The same numbers as the composed loss (the same float operations on the same values at
    valid tokens), computed differently:

    * junk is removed once: delta = where(m, logp - old, 0); everything after it is finite,
      so masked slots are then zeroed by multiplying with a float 0/1 mask (bool-mask kernels
      cost 4-6 float adds each on CPU). A ratio that overflows breaks that premise: the caller
      sees None and runs the composed loss instead.
    * one autograd node (`_FusedLoss`) instead of the surrogate's graph.
    * -min(R A, clip(R) A) and the metrics from one clamp: sign(R - clip(R)) is +1 above the
      bound, -1 below, 0 inside, exactly; the clip zeroes the gradient where it has A's sign.
    * eps_lo / eps_hi from each row's first and last valid position: eps is non-increasing in
      t, rounding included (every step is a monotone float operation).
    * [B] advantages: the finiteness test and the zero-advantage guard read [B] values.
    """
    cdt = compute_dtype(logp.dtype)
    dev = logp.device
    zero = torch.zeros((), dtype=cdt, device=dev)
    cnt = valid_count(m)
    n_row = cnt[:, -1].clone()
    n_valid = int(n_row.sum())
    if n_valid == 0:
        raise ValueError("the mask selects no response token: there is nothing to optimise")
    mf = m.view(torch.uint8).to(cdt)
    if advantages.dim() == 1:
        has_tok = n_row > 0
        a = torch.where(has_tok, advantages.detach().to(cdt), zero)  # rows without a token do not count
        if not bool(torch.isfinite(a).all()):
            raise ValueError("advantages hold NaN or inf at valid response positions")
        reject_silent_rows(a != 0, group_size)
        am = a[:, None] * mf
        adv_sign = a.sign()[:, None]
    else:
        am = torch.where(m, advantages.detach().to(cdt), zero)
        # A finite sum proves every term finite; only a non-finite one pays for the elementwise test.
        if not bool(torch.isfinite(am.sum())) and not bool(torch.isfinite(am).all()):
            raise ValueError("advantages hold NaN or inf at valid response positions")
        reject_silent_rows(am.abs().amax(dim=-1) > 0, group_size)
        adv_sign = am.sign()

    # log R~_t = prefix sum / valid count, then R~_t, in place in one buffer.
    r = torch.sub(logp.detach().to(cdt), old_logp.detach().to(cdt))
    torch.where(m, r, zero, out=r)
    r.cumsum_(dim=-1)
    count = cnt.clamp_min_(1).to(cdt)
    r.div_(count).exp_()

    if horizon is None:
        T = count[:, -1:]
    else:  # an integer >= 1: tapo_loss checked it
        longest = int(n_row.max())
        if longest > horizon:
            raise ValueError(f"a response has {longest} valid tokens, more than horizon={horizon}")
        T = torch.full_like(count[:, :1], horizon)
    # clip_schedule's operations in its order; a T = 1 row gets 0 * (eps_max - eps_min) + eps_max.
    rT = T.rsqrt()
    longer = T > 1
    inv_den = torch.where(longer, (1.0 - rT).reciprocal(), torch.zeros_like(rT))
    base = torch.full_like(rT, eps_min).masked_fill_(~longer, eps_max)

    def schedule(pos):
        return pos.rsqrt_().sub_(rT).mul_(inv_den).mul_(eps_max - eps_min).add_(base)

    eps = schedule(count)
    lo = torch.rsub(eps, 1.0)
    hi = eps.add_(1.0)
    c = torch.clamp(r, lo, hi)
    rA = r * am
    cA = c * am
    n = torch.tensor(n_valid, dtype=cdt, device=dev)
    loss = torch.minimum(rA, cA, out=rA).sum().neg_().div_(n)

    side = torch.sub(r, c, out=c).sign_().mul_(mf)  # +1 above its bound, -1 below, 0 inside or masked
    active = (side * adv_sign).relu_()  # 1 where the clip zeroes the gradient
    coef = torch.addcmul(am, am, active, value=-1.0) if logp.requires_grad else None  # A, 0 where active
    big = torch.finfo(cdt).max
    hide = torch.mul(mf, -big, out=lo).add_(big)  # 0 at valid tokens, the largest float at masked ones
    acc = torch.float64 if (cdt == torch.float32 and m.numel() >= 2**24) else cdt  # counts stay exact
    ends = schedule(torch.stack([torch.ones_like(n_row), n_row], dim=1).clamp_min_(1).to(cdt))
    inf = float("inf")
    has_tok = (n_row > 0)[:, None]
    stats = torch.stack([
        loss,
        torch.add(r, hide, out=rA).amin(),
        torch.sub(r, hide, out=cA).amax(),
        side.abs_().sum(dtype=acc).to(cdt) / n,
        active.sum(dtype=acc).to(cdt) / n,
        torch.where(has_tok, ends[:, 1:], inf).amin(),
        torch.where(has_tok, ends[:, :1], -inf).amax(),
    ]).tolist()
    # A ratio overflowed (or is NaN). With every ratio finite a non-finite loss (R A overflowing) has the same
    # per-token terms in the composed loss, so only the ratio decides.
    if not math.isfinite(stats[2]):
        return None
    if logp.requires_grad:
        loss = _FusedLoss.apply(logp, loss, coef, r, n)
    names = ("ratio_min", "ratio_max", "clip_fraction", "clip_active_fraction", "eps_lo", "eps_hi")
    metrics = dict(zip(names[:4], stats[1:5]))
    metrics["tokens"] = n_valid
    metrics.update(zip(names[4:], stats[5:]))
    return loss, metrics


def build_tapo_loss(
    ratio_fn: Callable[..., torch.Tensor] = trajectory_ratio,
    schedule_fn: Callable[..., torch.Tensor] = clip_schedule,
    guard_fn: Callable[..., None] = reject_zero_advantage_groups,
    surrogate_fn: Callable[..., torch.Tensor] = ppo_surrogate,
    *,
    fused: bool | None = None,
    fused_fn: Callable[..., tuple | None] | None = None,
):
    """The TAPO loss assembled from its parts (ratio, clip schedule, zero-advantage guard,
    surrogate). The method uses the defaults; a mutant swaps exactly one part.

    With every part the default (and `fused` not False) the loss runs `_fused_tapo_loss`, the
    same numbers in fewer passes; a swapped part, or ``fused=False``, runs the parts as given.
    `fused_fn` stands in for `_fused_tapo_loss` (how the fused-path mutants are built).
    """
    defaults = (ratio_fn, schedule_fn, guard_fn, surrogate_fn) == (
        trajectory_ratio, clip_schedule, reject_zero_advantage_groups, ppo_surrogate)
    if fused and not defaults:
        raise ValueError("the fused loss computes the default parts only")
    use_fused = defaults if fused is None else fused

    def tapo_loss(
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        eps_min: float,
        eps_max: float,
        horizon: int | None = None,
        *,
        group_size: int | None = None,
    ):
        """Token-mean clipped surrogate with R^_t and [1 - eps_t, 1 + eps_t] over response tokens.

        `advantages` is [B] (one per response) or [B, T]. Returns (loss, metrics) where
        metrics holds plain floats: ratio_min, ratio_max, clip_fraction (valid tokens whose
        R^ lies outside its bounds), clip_active_fraction (tokens whose gradient the clip
        zeroes), tokens, eps_lo, eps_hi.
        """
        if logp.dim() != 2:
            raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
        if old_logp.shape != logp.shape:
            raise ValueError(f"old_logp has shape {tuple(old_logp.shape)}, expected {tuple(logp.shape)}")
        m = as_bool_mask(mask, logp.shape)
        _check_eps(eps_min, eps_max)
        if horizon is not None:
            _check_horizon(horizon)
        cdt = compute_dtype(logp.dtype)
        zero = torch.zeros((), dtype=cdt, device=logp.device)

        if advantages.dim() == 1 and advantages.shape[0] == logp.shape[0]:
            adv = advantages[:, None].expand_as(logp)
        elif advantages.shape == logp.shape:
            adv = advantages
        else:
            raise ValueError(
                f"advantages must be [B] or [B, T] = {tuple(logp.shape)}, got {tuple(advantages.shape)}"
            )
        if use_fused and logp.shape[-1] > 0:
            out = (fused_fn or _fused_tapo_loss)(logp, old_logp, advantages if advantages.dim() == 1 else adv, m,
                                   eps_min, eps_max, horizon, group_size)
            if out is not None:
                return out
        adv = torch.where(m, adv.detach().to(cdt), zero)

        n_valid = m.sum()
        if int(n_valid) == 0:
            raise ValueError("the mask selects no response token: there is nothing to optimise")
        if not bool(torch.isfinite(adv).all()):
            raise ValueError("advantages hold NaN or inf at valid response positions")
        guard_fn(adv, m, group_size)

        # Positions and lengths in the compute dtype: exact integers there (< 2^24), and the schedule
        # then runs in float32 for float32 inputs instead of float64 (half the time at 16k tokens).
        count = valid_count(m).clamp_min_(1).to(cdt)
        if horizon is None:
            T = count[:, -1:]
        else:
            longest = int(m.sum(dim=-1).max())
            if longest > horizon:
                raise ValueError(f"a response has {longest} valid tokens, more than horizon={horizon}")
            T = torch.full_like(count[:, :1], horizon)
        eps = schedule_fn(count, T, eps_min, eps_max).to(cdt)

        ratio = ratio_fn(logp, old_logp, m)
        per_token = surrogate_fn(ratio, adv, eps)
        loss = torch.where(m, per_token, zero).sum() / n_valid.to(cdt)

        with torch.no_grad():
            r = ratio.detach()
            below, above = r < 1.0 - eps, r > 1.0 + eps
            active = ((adv > 0) & above) | ((adv < 0) & below)
            # One masked select serves four extrema: +inf at masked positions hides them from a min,
            # -inf from a max (adding 0 leaves a valid value, NaN included, as it is).
            hide = torch.where(m, zero, torch.tensor(float("inf"), dtype=cdt, device=logp.device))
            stats = torch.stack(
                [
                    (r + hide).min(),
                    (r - hide).max(),
                    ((below | above) & m).sum().to(cdt) / n_valid,
                    (active & m).sum().to(cdt) / n_valid,
                    n_valid.to(cdt),
                    (eps + hide).min(),
                    (eps - hide).max(),
                ]
            ).tolist()
        names = ("ratio_min", "ratio_max", "clip_fraction", "clip_active_fraction", "tokens", "eps_lo", "eps_hi")
        metrics = dict(zip(names, stats))
        metrics["tokens"] = int(metrics["tokens"])
        return loss, metrics

    return tapo_loss


tapo_loss = build_tapo_loss()
