"""GSPO (arXiv 2507.18071): the sequence-level ratio, its clip, and the GSPO-token form.

For response i with valid tokens t = 1..|y_i| (prompt, padding and holes excluded),

    s_i    = exp( (1/|y_i|) sum_t (logp_i,t - old_i,t) )                         sequence ratio (geometric mean)
    f_i    = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)             per response (form "sequence")
    s_i,t  = sg[s_i] * pi(y_t) / sg[pi(y_t)]                                      GSPO-token (form "token")
    f_i,t  = -min(s_i,t A_i,t, clip(s_i,t, 1 - eps_low, 1 + eps_high) A_i,t)

The loss is the mean over non-empty responses of f_i (sequence form) or of the mean of f_i,t over the response's
tokens (token form). With one advantage per response the two forms have the same value and gradient
(d f / d logp_t = -A s_i / |y_i| at unclipped responses).

Choices the paper leaves open (stated in specs/gspo.yaml):

* Arithmetic in float32 or wider; the masked mean is taken after junk is removed with torch.where.
* log s_i is clamped above at log_ratio_clamp (10, as verl) so s_i cannot overflow; a response whose clamp binds
  has a constant ratio (no gradient), reported in metrics["clamped_rows"]. There is no lower clamp: exp of a very
  negative mean is 0, not an overflow.
* An empty response (no valid token) has s_i = 1, no gradient, and counts in no mean; a call with none non-empty
  is refused. The paper's bounds are eps_low = 3e-4, eps_high = 4e-4 (the defaults).
"""

from __future__ import annotations

import math

import torch

from methods.grpo.loss import check_clip, check_pair, clipped_surrogate, compute_dtype, log_ratio, masked_advantages

FORMS = ("sequence", "token")
LOG_RATIO_CLAMP = 10.0
CLIP_LOW, CLIP_HIGH = 3e-4, 4e-4

__all__ = ["FORMS", "LOG_RATIO_CLAMP", "CLIP_LOW", "CLIP_HIGH", "build_gspo", "sequence_ratio", "gspo_loss"]


def _check_clamp(log_ratio_clamp) -> None:
    if isinstance(log_ratio_clamp, bool) or not (float(log_ratio_clamp) > 0.0) or float(log_ratio_clamp) > 80.0:
        raise ValueError(f"log_ratio_clamp must be in (0, 80] (exp of it must stay finite in float32), "
                         f"got {log_ratio_clamp!r}")


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, m: torch.Tensor, cdt: torch.dtype):
    """(log s_i [B] before the clamp, with gradient; valid tokens per row [B])."""
    n_row = m.sum(dim=-1)
    return log_ratio(logp, old_logp, m, cdt).sum(dim=-1) / n_row.clamp_min(1).to(cdt), n_row


def clamp_log_ratio(log_s: torch.Tensor, clamp: float) -> torch.Tensor:
    """The overflow guard: log s clamped above (a binding clamp passes no gradient)."""
    return log_s.clamp(max=clamp)


def token_log_ratio(logp: torch.Tensor, log_s: torch.Tensor, m: torch.Tensor, cdt: torch.dtype) -> torch.Tensor:
    """log s_i,t = logp_t - sg[logp_t] + sg[log s_i]: value log s_i, gradient d logp_t (GSPO-token)."""
    zero = torch.zeros((), dtype=cdt, device=logp.device)
    lp = logp.to(cdt)
    return torch.where(m, lp - lp.detach(), zero) + log_s.detach()[:, None]


def response_mean(per_row: torch.Tensor, has: torch.Tensor, rows: int) -> torch.Tensor:
    """Mean over non-empty responses of a [B] per-response loss (0 at empty rows)."""
    return per_row.sum() / rows


def token_mean_per_row(per_token: torch.Tensor, n_row: torch.Tensor) -> torch.Tensor:
    """[B]: the mean of a [B, L] per-token loss (0 at masked slots) over each row's valid tokens; 0 for empty rows."""
    return per_token.sum(dim=-1) / n_row.clamp_min(1).to(per_token.dtype)


def outside_bounds(s, log_s, lo, hi, clamp):
    """The rows the metrics count (strictly): s_i below 1 - clip_low, above 1 + clip_high, and a mean log-ratio
    above the clamp. A row exactly on a bound lies inside it: the clip there changes neither value nor gradient."""
    return s < lo, s > hi, log_s > clamp


def build_gspo(log_ratio_fn=sequence_log_ratio, clamp_fn=clamp_log_ratio, token_ratio_fn=token_log_ratio,
               surrogate_fn=clipped_surrogate, row_fn=token_mean_per_row, mean_fn=response_mean,
               outside_fn=outside_bounds):
    """(sequence_ratio, gspo_loss) assembled from their parts; the method uses the defaults, a mutant swaps one."""

    def sequence_ratio(logp, old_logp, mask, *, log_ratio_clamp: float = LOG_RATIO_CLAMP):
        """s_i [B] = exp(masked mean log-ratio), clamped above at exp(log_ratio_clamp); 1 for an empty row."""
        m = check_pair(logp, old_logp, mask)
        _check_clamp(log_ratio_clamp)
        log_s, _ = log_ratio_fn(logp, old_logp, m, compute_dtype(logp.dtype))
        return clamp_fn(log_s, float(log_ratio_clamp)).exp()

    def gspo_loss(
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        clip_low: float = CLIP_LOW,
        clip_high: float = CLIP_HIGH,
        form: str = "sequence",
        log_ratio_clamp: float = LOG_RATIO_CLAMP,
    ):
        """GSPO loss (see the module docstring): mean over non-empty responses. `advantages` is [B], or [B, L] in
        the token form. Returns (loss, metrics): tokens, rows (non-empty responses), seq_ratio_min, seq_ratio_max,
        clip_fraction (non-empty responses whose s_i lies outside the bounds), clip_low_fraction,
        clip_high_fraction, clamped_rows."""
        m = check_pair(logp, old_logp, mask)
        check_clip(clip_low, clip_high)
        _check_clamp(log_ratio_clamp)
        if form not in FORMS:
            raise ValueError(f"form must be one of {', '.join(FORMS)}; got {form!r}")
        if form == "sequence" and advantages.shape != logp.shape[:1]:
            raise ValueError(f"the sequence form takes one advantage per response, [B] = [{logp.shape[0]}], got "
                             f"{tuple(advantages.shape)}; per-token advantages need form='token'")
        cdt = compute_dtype(logp.dtype)
        zero = torch.zeros((), dtype=cdt, device=logp.device)
        log_s, n_row = log_ratio_fn(logp, old_logp, m, cdt)
        has = n_row > 0
        rows = int(has.sum())
        if rows == 0:
            raise ValueError("the mask selects no response token: there is nothing to optimise")
        C = float(log_ratio_clamp)
        lo, hi = 1.0 - float(clip_low), 1.0 + float(clip_high)
        if form == "sequence":
            adv = torch.where(has, advantages.detach().to(cdt), zero)
            if not bool(torch.isfinite(adv).all()):
                raise ValueError("advantages hold NaN or inf for a response that has valid tokens")
            s = clamp_fn(log_s, C).exp()
            per_row = surrogate_fn(s, adv, lo, hi, None)
        else:
            a = masked_advantages(advantages, m, cdt)  # refuses NaN/inf at valid tokens
            # the clamp, where it binds, leaves a constant, as in the sequence form
            ratio = clamp_fn(token_ratio_fn(logp, log_s, m, cdt), C).exp()
            per_row = row_fn(surrogate_fn(ratio, a, lo, hi, None), n_row)
        loss = mean_fn(per_row, has, rows)

        with torch.no_grad():
            ld = log_s.detach()
            s = ld.clamp(max=C).exp()
            big = torch.where(has, zero, torch.tensor(math.inf, dtype=cdt, device=s.device))
            below, above, clamped = outside_fn(s, ld, lo, hi, C)
            stats = torch.stack([(s + big).amin(), (s - big).amax(), (below & has).sum().to(cdt),
                                 (above & has).sum().to(cdt), (clamped & has).sum().to(cdt)]).tolist()
        metrics = {"tokens": int(n_row.sum()), "rows": rows, "seq_ratio_min": stats[0], "seq_ratio_max": stats[1],
                   "clip_fraction": (stats[2] + stats[3]) / rows, "clip_low_fraction": stats[2] / rows,
                   "clip_high_fraction": stats[3] / rows, "clamped_rows": int(stats[4])}
        return loss, metrics

    return sequence_ratio, gspo_loss


sequence_ratio, gspo_loss = build_gspo()
