"""Independent float64 references for GSPO (arXiv 2507.18071): plain Python loops over floats.

Inputs are nested lists (tensor.tolist() after a cast to float64); nothing here calls the implementation or torch
arithmetic. The declared choices of specs/gspo.yaml: empty rows have s = 1 and count in no mean; log s is clamped
above (a binding clamp passes no gradient); the loss is the mean over non-empty responses.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext


def sequence_ratio(logp, old, mask, clamp: float = 10.0) -> list[float]:
    """s_i = exp(mean of logp - old over the row's valid tokens), clamped above; 1.0 for an empty row.

    Evaluated in 50-digit decimals and rounded once: at log-ratios of a few hundred, a float64 difference or mean
    is off by ~1e-14 absolute, which exp turns into ~1e-14 relative, over 1% of the contracts' 1e-12."""
    out = []
    with localcontext() as ctx:
        ctx.prec = 50
        for lrow, orow, mrow in zip(logp, old, mask):
            d = [Decimal(l) - Decimal(o) for l, o, v in zip(lrow, orow, mrow) if v]
            out.append(float(min(Decimal(clamp), sum(d, Decimal(0)) / len(d)).exp()) if d else 1.0)
    return out


def loss_and_grad(logp, old, adv, mask, *, clip_low=3e-4, clip_high=4e-4, clamp=10.0, margin=1e-9):
    """(loss, grad rows, near rows, scale). `adv` is [B][L] (a per-response advantage repeated along the row is the
    sequence form; per-token values are the GSPO-token form). Per response: mean over its tokens of
    -min(s A_t, clip(s) A_t), whose gradient at token t is -A_t s / |y| when unclipped (the token form's
    sg[s] pi/sg[pi] has gradient s d logp_t, weighted 1/|y| by the mean); then the mean over non-empty rows."""
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    rows = sum(1 for mrow in mask if any(mrow))
    loss_terms, abs_terms = [], []
    grad = [[0.0] * len(mrow) for mrow in mask]
    near = [[False] * len(mrow) for mrow in mask]
    for b, (lrow, orow, arow, mrow) in enumerate(zip(logp, old, adv, mask)):
        idx = [t for t, v in enumerate(mrow) if v]
        if not idx:
            continue
        n = len(idx)
        x = math.fsum(lrow[t] - orow[t] for t in idx) / n
        binds = x > clamp
        s = math.exp(min(x, clamp))
        c = min(max(s, lo), hi)
        close = abs(x - clamp) <= margin * clamp or abs(s - lo) <= margin or abs(s - hi) <= margin
        for t in idx:
            a = arow[t]
            term = max(-s * a, -c * a)
            loss_terms.append(term / (n * rows))
            abs_terms.append(abs(term) / (n * rows))
            clipped = (a > 0 and s > hi) or (a < 0 and s < lo)
            grad[b][t] = 0.0 if (binds or clipped) else -a * s / (n * rows)
            near[b][t] = close
    return math.fsum(loss_terms), grad, near, math.fsum(abs_terms)


def metrics(logp, old, mask, *, clip_low=3e-4, clip_high=4e-4, clamp=10.0, margin=1e-6, exact=False) -> dict:
    """The loss's metrics from the same loop, over non-empty responses; a count is NaN (undefined) where some s_i
    lies within `margin` (relative) of the boundary that decides it. With `exact` (inputs whose log-ratios, means
    and bounds are exact in every dtype tried: dyadic values), a row exactly on a boundary is decided as the
    interface says, strictly (below 1 - clip_low, above 1 + clip_high, a mean that exceeds the clamp)."""
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    nan = math.nan
    seqs, below, above, clamped, tie_clip, tie_clamp = [], 0, 0, 0, False, False
    for lrow, orow, mrow in zip(logp, old, mask):
        d = [l - o for l, o, v in zip(lrow, orow, mrow) if v]
        if not d:
            continue
        x = math.fsum(d) / len(d)
        tie_clamp = not exact and (tie_clamp or abs(x - clamp) <= margin * clamp)
        clamped += x > clamp
        s = math.exp(min(x, clamp))
        seqs.append(s)
        tie_clip = not exact and (tie_clip or abs(s - lo) <= margin or abs(s - hi) <= margin)
        below += s < lo
        above += s > hi
    rows = len(seqs)
    return {"tokens": sum(1 for row in mask for v in row if v), "rows": rows, "seq_ratio_min": min(seqs),
            "seq_ratio_max": max(seqs), "clip_fraction": nan if tie_clip else (below + above) / rows,
            "clip_low_fraction": nan if tie_clip else below / rows,
            "clip_high_fraction": nan if tie_clip else above / rows, "clamped_rows": nan if tie_clamp else clamped}


# --- the same loops, registered for the generic kinds (engine/kinds) ------------------------------------------


def _register() -> None:
    import torch

    from engine.spec import registry

    def lists(logp, old, advantages, mask):
        m = mask.to(torch.bool)
        a = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        return (torch.where(m, logp, 0.0).tolist(), torch.where(m, old, 0.0).tolist(),
                torch.where(m, a, 0.0).tolist(), m.tolist())

    def run(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, form="sequence",
            log_ratio_clamp=10.0):
        return loss_and_grad(*lists(logp, old_logp, advantages, mask), clip_low=clip_low, clip_high=clip_high,
                             clamp=log_ratio_clamp)

    @registry.reference("gspo.loss")
    def loss_tensor(*args, **kwargs):
        """The GSPO loss as a float64 scalar tensor (either form: the loop takes per-token advantages)."""
        return torch.tensor(run(*args, **kwargs)[0], dtype=torch.float64)

    @registry.reference("gspo.loss_metrics")
    def metrics_dict(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, log_ratio_clamp=10.0, **_):
        """The metrics gspo_loss returns beside the loss (the same in both forms)."""
        lp, op, _, m = lists(logp, old_logp, advantages, mask)
        return metrics(lp, op, m, clip_low=clip_low, clip_high=clip_high, clamp=log_ratio_clamp)

    @registry.reference("gspo.loss_metrics_exact")
    def metrics_exact(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, log_ratio_clamp=10.0, **_):
        """The metrics on inputs built to sit exactly on a bound or the clamp: every count decided, none NaN."""
        lp, op, _, m = lists(logp, old_logp, advantages, mask)
        return metrics(lp, op, m, clip_low=clip_low, clip_high=clip_high, clamp=log_ratio_clamp, exact=True)

    @registry.reference("gspo.loss_grad")
    def loss_grad_tensor(*args, **kwargs):
        """d loss / d logp [B, L]; NaN where s_i is within 1e-9 of a bound or the clamp, 0 at masked slots."""
        _, grad, near, _ = run(*args, **kwargs)
        g = torch.tensor(grad, dtype=torch.float64)
        return torch.where(torch.tensor(near), torch.full_like(g, math.nan), g)

    @registry.reference("gspo.loss_grads")
    def loss_grads(logp, old_logp, advantages, mask, **kwargs):
        """(d loss / d logp, d / d old_logp = 0, d / d advantages = 0): the last two are constants of the loss."""
        return [loss_grad_tensor(logp, old_logp, advantages, mask, **kwargs),
                torch.zeros_like(old_logp, dtype=torch.float64), torch.zeros_like(advantages, dtype=torch.float64)]

    @registry.reference("gspo.sequence_ratio")
    def ratio_tensor(logp, old_logp, mask, *, log_ratio_clamp=10.0):
        m = mask.to(torch.bool)
        return torch.tensor(sequence_ratio(torch.where(m, logp, 0.0).tolist(), torch.where(m, old_logp, 0.0).tolist(),
                                           m.tolist(), log_ratio_clamp), dtype=torch.float64)

    @registry.reference("gspo.sequence_ratio_grad")
    def ratio_grad_tensor(logp, old_logp, mask, *, log_ratio_clamp=10.0):
        """d sum_i s_i / d logp: s_i / |y_i| at row i's valid tokens, 0 where the clamp binds (NaN within 1e-9 of
        it), at masked slots and on empty rows (s = 1 is a constant there)."""
        m = mask.to(torch.bool)
        s = sequence_ratio(torch.where(m, logp, 0.0).tolist(), torch.where(m, old_logp, 0.0).tolist(), m.tolist(),
                           log_ratio_clamp)
        g = torch.zeros(logp.shape, dtype=torch.float64)
        for i, (row, si) in enumerate(zip(m.tolist(), s)):
            n = sum(row)
            if not n:
                continue
            x = math.fsum(float(logp[i, t]) - float(old_logp[i, t]) for t in range(len(row)) if row[t]) / n
            value = math.nan if abs(x - log_ratio_clamp) <= 1e-9 * log_ratio_clamp else \
                0.0 if x > log_ratio_clamp else si / n
            g[i] = torch.where(m[i], torch.tensor(value, dtype=torch.float64), torch.zeros((), dtype=torch.float64))
        return g

    @registry.reference("family.tapo_ratio_at_end")
    def tapo_ratio_at_end(logp, old_logp, mask, **_):
        """TAPO's prefix ratio R~_T (methods/tapo) at each response's last valid token: GSPO's s_i. NaN for an
        empty row (TAPO has no position there)."""
        from methods.tapo.objective import trajectory_ratio

        m = mask.to(torch.bool)
        r = trajectory_ratio(logp, old_logp, m).detach().double()
        n = m.sum(-1)
        last = (torch.cumsum(m.long(), -1) == n[:, None]) & m
        end = torch.where(last, r, 0.0).sum(-1)
        return torch.where(n > 0, end, torch.full_like(end, math.nan))

    @registry.reference("family.grpo_one_token")
    def grpo_one_token(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, log_ratio_clamp=10.0,
                       **_):
        """GRPO's loss (methods/grpo, token mean) with GSPO's bounds: on one-token responses it is GSPO."""
        from methods.grpo.loss import grpo_loss

        return grpo_loss(logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high)[0].detach()

    @registry.reference("family.grpo_one_token_grad")
    def grpo_one_token_grad(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, **_):
        from methods.grpo.loss import grpo_loss

        x = logp.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(grpo_loss(x, old_logp, advantages, mask, clip_low=clip_low,
                                             clip_high=clip_high)[0], x)
        return g


_register()


# --- the scale tier: the same formulas at training sizes (methods/common/exact.py says why) ------------------------


def _scale_register() -> None:
    import torch

    from engine.spec import registry
    from methods.common.exact import fsum, fsum_rows

    f64 = torch.float64

    def log_ratio_rows(logp, old, mask):
        """(the mean log-ratio x_i per row, exact sum over its valid tokens; valid tokens per row; bool mask)."""
        m = mask.to(torch.bool)
        d = torch.where(m, logp.to(f64) - old.to(f64), torch.zeros((), dtype=f64))
        n = m.sum(-1)
        return fsum_rows(d) / n.clamp_min(1).to(f64), n, m

    def margin_of(dtype) -> float:
        return 1e-9 if dtype in (None, torch.float64) else 1e-6  # s_i's float32 rounding is about 1e-7

    @registry.reference("gspo.sequence_ratio_f64")
    def ratio_f64(logp, old_logp, mask, *, log_ratio_clamp=10.0, dtype=None):
        """s_i = exp(min(x_i, clamp)), 1 for an empty row, and d sum_i s_i / d logp (s_i / |y_i| at row i's valid
        tokens, 0 where the clamp binds, NaN within the margin of it): `sequence_ratio` at training sizes."""
        x, n, m = log_ratio_rows(logp, old_logp, mask)
        C = float(log_ratio_clamp)
        s = torch.where(n > 0, x.clamp(max=C).exp(), torch.ones_like(x))
        per = torch.where(x > C, torch.zeros_like(s), s / n.clamp_min(1).to(f64))
        per = torch.where((x - C).abs() <= margin_of(dtype) * C, torch.full_like(per, math.nan), per)
        g = torch.where(m & (n > 0)[:, None], per[:, None].expand(m.shape), torch.zeros((), dtype=f64))
        return {"value": s, "grad": [g]}

    @registry.reference("gspo.loss_f64")
    def loss_f64(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, form="sequence",
                 log_ratio_clamp=10.0, dtype=None):
        """The sequence-form GSPO loss (mean over non-empty responses of -min(s A, clip(s) A)), its scale and
        d loss / d logp (NaN where s_i is within the margin of a bound or the clamp): `loss_and_grad` at
        training sizes, per-token advantages excluded (the sequence form takes [B])."""
        if form != "sequence" or advantages.dim() != 1:
            raise ValueError("gspo.loss_f64 is the sequence form: one advantage per response")
        x, n, m = log_ratio_rows(logp, old_logp, mask)
        C = float(log_ratio_clamp)
        lo, hi = 1.0 - float(clip_low), 1.0 + float(clip_high)
        has = n > 0
        rows = int(has.sum())
        a = torch.where(has, advantages.to(f64), torch.zeros((), dtype=f64))
        s = x.clamp(max=C).exp()
        term = torch.where(has, torch.maximum(-s * a, -s.clamp(lo, hi) * a), torch.zeros((), dtype=f64))
        clipped = ((a > 0) & (s > hi)) | ((a < 0) & (s < lo)) | (x > C)
        per = torch.where(clipped | ~has, torch.zeros_like(s), -a * s / (n.clamp_min(1).to(f64) * rows))
        margin = margin_of(dtype)
        near = ((x - C).abs() <= margin * C) | ((s - lo).abs() <= margin) | ((s - hi).abs() <= margin)
        per = torch.where(near & has, torch.full_like(per, math.nan), per)
        g = torch.where(m, per[:, None].expand(m.shape), torch.zeros((), dtype=f64))
        return {"value": torch.tensor(fsum(term) / rows, dtype=f64), "scale": fsum(term.abs()) / rows, "grad": [g],
                "counts": {"clipped_rows": int((clipped & has).sum()), "grad_excluded_rows": int((near & has).sum())}}

    @registry.reference("gspo.loss_counts")
    def loss_counts(logp, old_logp, advantages, mask, **_):
        """The counts gspo_loss reports: the valid tokens and the non-empty responses, exactly."""
        n = mask.to(torch.bool).sum(-1)
        return {"tokens": int(n.sum()), "rows": int((n > 0).sum())}


_scale_register()
