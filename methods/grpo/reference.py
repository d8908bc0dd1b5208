"""Independent float64 references for GRPO: plain Python loops over floats.

Nothing here calls the implementation or torch arithmetic; inputs arrive as nested lists (tensor.tolist() after a
cast to float64) and every formula is written out from DeepSeekMath (arXiv 2402.03300) again, with the choices
specs/grpo.yaml declares (population std, fully masked responses out of the group statistics, a log-ratio clamp
whose binding tokens pass no gradient, empty rows in no mean).
"""

from __future__ import annotations

import math


def group_advantages(rewards: list[float], group_size: int, eps: float = 1e-6,
                     keep: list[bool] | None = None) -> list[float]:
    """(R - group mean) / (group std + eps) per consecutive group, counted rows only; others get 0."""
    keep = [True] * len(rewards) if keep is None else keep
    out = [0.0] * len(rewards)
    for start in range(0, len(rewards), group_size):
        idx = [i for i in range(start, start + group_size) if keep[i]]
        if not idx:
            continue
        vals = [rewards[i] for i in idx]
        if max(vals) == min(vals):
            continue  # all equal (a group of one included): exactly 0
        mean = math.fsum(vals) / len(vals)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / len(vals))
        for i in idx:
            out[i] = (rewards[i] - mean) / (std + eps)
    return out


def token_terms(logp, old, adv, mask, *, clip_low, clip_high, dual_clip=None, ref=None, beta=0.0,
                clamp=20.0, margin=1e-9):
    """Per valid token (b, t): (term, d term / d logp_t, near) with `near` True where the active branch is
    ambiguous in finite precision (the ratio within `margin` of a bound, the dual cap or the clamp)."""
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    out = {}
    for b, (lrow, orow, arow, mrow) in enumerate(zip(logp, old, adv, mask)):
        for t, (l, o, a, v) in enumerate(zip(lrow, orow, arow, mrow)):
            if not v:
                continue
            x = l - o
            near = abs(abs(x) - clamp) <= margin * clamp
            if x > clamp or x < -clamp:
                x, dr = max(-clamp, min(clamp, x)), 0.0  # the clamp binds: a constant ratio
            else:
                dr = 1.0
            r = math.exp(x)
            dr *= r
            c = min(max(r, lo), hi)
            near = near or abs(r - lo) <= margin * lo or abs(r - hi) <= margin * hi
            term = max(-r * a, -c * a)
            # the clipped branch is the larger loss, and constant, when r is outside on A's side
            g = 0.0 if (a > 0 and r > hi) or (a < 0 and r < lo) else -a * dr
            if dual_clip is not None and a < 0:
                cap = -dual_clip * a
                near = near or abs(term - cap) <= margin * cap
                if term > cap:
                    term, g = cap, 0.0
            if beta:
                d = ref[b][t] - l
                term += beta * (math.exp(d) - d - 1.0)
                g += beta * (1.0 - math.exp(d))
            out[(b, t)] = (term, g, near)
    return out


def weights(mask, agg: str, norm_length: int | None = None) -> dict:
    """The weight of each valid token's term in the loss under `agg`."""
    counts = [sum(1 for v in row if v) for row in mask]
    n = sum(counts)
    rows = sum(1 for c in counts if c)
    length = len(mask[0]) if norm_length is None else norm_length
    w = {}
    for b, row in enumerate(mask):
        for t, v in enumerate(row):
            if not v:
                continue
            if agg == "token-mean":
                w[(b, t)] = 1.0 / n
            elif agg == "seq-mean-token-mean":
                w[(b, t)] = 1.0 / (counts[b] * rows)
            elif agg == "seq-mean-token-sum-norm":
                w[(b, t)] = 1.0 / (rows * length)
            else:
                raise ValueError(agg)
    return w


def loss_and_grad(logp, old, adv, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, ref=None, beta=0.0,
                  agg="token-mean", norm_length=None, clamp=20.0, margin=1e-9):
    """(loss, grad rows [B][L], near rows [B][L], scale) of the GRPO loss; `adv` is [B][L] (broadcast a [B] one
    first). scale = the weighted sum of |term|, the size a rounding error of the loss is relative to."""
    terms = token_terms(logp, old, adv, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, ref=ref,
                        beta=beta, clamp=clamp, margin=margin)
    w = weights(mask, agg, norm_length)
    loss = math.fsum(w[k] * terms[k][0] for k in terms)
    scale = math.fsum(w[k] * abs(terms[k][0]) for k in terms)
    grad = [[0.0] * len(row) for row in mask]
    near = [[False] * len(row) for row in mask]
    for (b, t), (_, g, nr) in terms.items():
        grad[b][t] = w[(b, t)] * g
        near[b][t] = nr
    return loss, grad, near, scale


def metrics(logp, old, adv, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, ref=None, beta=0.0,
            clamp=20.0, margin=1e-5) -> dict:
    """The loss's metrics from the same loop: counts over valid tokens, each NaN (undefined) where a token lies
    within `margin` (relative) of the boundary that decides it, so float32 rounding cannot flip a count."""
    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    nan = math.nan
    ratios, kl = [], []
    below = above = dual = clamped = 0
    tie_clip = tie_dual = tie_clamp = False
    rows = 0
    for b, (lrow, orow, arow, mrow) in enumerate(zip(logp, old, adv, mask)):
        rows += any(mrow)
        for t, (l, o, a, v) in enumerate(zip(lrow, orow, arow, mrow)):
            if not v:
                continue
            x = l - o
            tie_clamp = tie_clamp or abs(abs(x) - clamp) <= margin * clamp
            clamped += abs(x) > clamp
            r = math.exp(max(-clamp, min(clamp, x)))
            ratios.append(r)
            tie_clip = tie_clip or abs(r - lo) <= margin * lo or abs(r - hi) <= margin * hi
            below += r < lo
            above += r > hi
            if dual_clip is not None and a < 0:
                term, cap = max(-r * a, -min(max(r, lo), hi) * a), -dual_clip * a
                tie_dual = tie_dual or abs(term - cap) <= margin * cap
                dual += term > cap
            if beta:
                d = ref[b][t] - l
                kl.append(math.exp(d) - d - 1.0)
    n = len(ratios)
    return {"tokens": n, "rows": rows, "ratio_min": min(ratios), "ratio_max": max(ratios),
            "clip_fraction": nan if tie_clip else (below + above) / n,
            "clip_low_fraction": nan if tie_clip else below / n, "clip_high_fraction": nan if tie_clip else above / n,
            "dual_clip_fraction": nan if tie_dual else dual / n, "clamped_tokens": nan if tie_clamp else clamped,
            "kl": math.fsum(kl) / n if beta else 0.0}


def response_mask(responses, eos_id: int = 1) -> list[list[float]]:
    """1.0 up to and including each row's first EOS, 0.0 after it."""
    out = []
    for row in responses:
        seen, mrow = False, []
        for tok in row:
            mrow.append(0.0 if seen else 1.0)
            seen = seen or tok == eos_id
        out.append(mrow)
    return out


def behaviour_logprobs(logits, tokens, temperature: float = 1.0) -> list[list[float]]:
    """log softmax(logits / temperature) at each token, with a max-shifted log-sum-exp."""
    out = []
    for lrow, trow in zip(logits, tokens):
        orow = []
        for dist, tok in zip(lrow, trow):
            z = [v / temperature for v in dist]
            top = max(z)
            orow.append(z[tok] - top - math.log(math.fsum(math.exp(v - top) for v in z)))
        out.append(orow)
    return out


# --- the same loops, registered for the generic kinds (engine/kinds) ------------------------------------------


def _register() -> None:
    import torch

    from engine.spec import registry

    def lists(logp, old, advantages, mask):
        m = mask.to(torch.bool)
        lp = torch.where(m, logp, 0.0).tolist()  # junk in masked slots is not the reference's business
        op = torch.where(m, old, 0.0).tolist()
        a = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        return lp, op, torch.where(m, a, 0.0).tolist(), m.tolist()

    def run(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, ref_logp=None,
            beta=0.0, agg="token-mean", norm_length=None, log_ratio_clamp=20.0):
        lp, op, a, m = lists(logp, old_logp, advantages, mask)
        ref = None if ref_logp is None else torch.where(mask.to(torch.bool), ref_logp, 0.0).tolist()
        return loss_and_grad(lp, op, a, m, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, ref=ref,
                             beta=beta, agg=agg, norm_length=norm_length, clamp=log_ratio_clamp)

    @registry.reference("grpo.loss")
    def loss_tensor(*args, **kwargs):
        """The GRPO loss as a float64 scalar tensor."""
        return torch.tensor(run(*args, **kwargs)[0], dtype=torch.float64)

    @registry.reference("grpo.loss_metrics")
    def metrics_dict(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None,
                     ref_logp=None, beta=0.0, log_ratio_clamp=20.0, **_):
        """The metrics grpo_loss returns beside the loss (the aggregation mode changes none of them)."""
        lp, op, a, m = lists(logp, old_logp, advantages, mask)
        ref = None if ref_logp is None else torch.where(mask.to(torch.bool), ref_logp, 0.0).tolist()
        return metrics(lp, op, a, m, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, ref=ref,
                       beta=beta, clamp=log_ratio_clamp)

    @registry.reference("grpo.loss_grads")
    def loss_grads(logp, old_logp, advantages, mask, **kwargs):
        """(d loss / d logp, d loss / d old_logp, d loss / d advantages): the behaviour log-probs and the
        advantages are constants of the loss, so their gradients are exactly 0."""
        return [loss_grad_tensor(logp, old_logp, advantages, mask, **kwargs), torch.zeros_like(old_logp,
                dtype=torch.float64), torch.zeros_like(advantages, dtype=torch.float64)]

    @registry.reference("family.zero_grads")
    def zero_grads(logp, old_logp, advantages, mask, **_):
        """d loss / d old_logp and d loss / d advantages: 0, both are constants of the loss."""
        return [torch.zeros_like(old_logp, dtype=torch.float64), torch.zeros_like(advantages, dtype=torch.float64)]

    @registry.reference("grpo.loss_grads_kl")
    def loss_grads_kl(logp, old_logp, advantages, mask, **kwargs):
        """d loss / d logp and d loss / d ref_logp = 0: the reference policy's log-probs are a constant of the loss."""
        return [loss_grad_tensor(logp, old_logp, advantages, mask, **kwargs),
                torch.zeros_like(kwargs["ref_logp"], dtype=torch.float64)]

    @registry.reference("grpo.response_mask")
    def mask_tensor(responses, eos_id=1):
        return torch.tensor(response_mask(responses.tolist(), eos_id), dtype=torch.float64)

    @registry.reference("grpo.behaviour_logprobs")
    def behaviour_tensor(logits, tokens, temperature=1.0):
        return torch.tensor(behaviour_logprobs(logits.tolist(), tokens.tolist(), temperature), dtype=torch.float64)

    @registry.reference("grpo.loss_grad")
    def loss_grad_tensor(*args, **kwargs):
        """d loss / d logp [B, L]; NaN where the active branch is ambiguous in finite precision (a ratio within
        1e-9 of a bound, the dual cap or the clamp), 0 at masked slots."""
        _, grad, near, _ = run(*args, **kwargs)
        g = torch.tensor(grad, dtype=torch.float64)
        return torch.where(torch.tensor(near), torch.full_like(g, math.nan), g)

    @registry.reference("grpo.group_advantages")
    def advantages_tensor(rewards, group_size, eps=1e-6, *, mask=None):
        keep = None if mask is None else (mask.to(torch.bool).any(-1) if mask.dim() == 2 else mask.to(torch.bool))
        return torch.tensor(group_advantages(rewards.tolist(), group_size, eps,
                                             None if keep is None else keep.tolist()), dtype=torch.float64)

    # The control arm's configuration (the pages' GRPO control): one clip eps on both sides, the token mean over the
    # call's valid tokens, no KL, no dual clip; its advantages count every row.
    @registry.reference("grpo.control_loss")
    def control_loss(logp, old_logp, advantages, mask, clip_eps=0.2):
        return torch.tensor(run(logp, old_logp, advantages, mask, clip_low=clip_eps, clip_high=clip_eps)[0],
                            dtype=torch.float64)

    @registry.reference("grpo.control_loss_grad")
    def control_loss_grad(logp, old_logp, advantages, mask, clip_eps=0.2):
        return loss_grad_tensor(logp, old_logp, advantages, mask, clip_low=clip_eps, clip_high=clip_eps)

    @registry.reference("grpo.control_loss_metrics")
    def control_loss_metrics(logp, old_logp, advantages, mask, clip_eps=0.2):
        return metrics_dict(logp, old_logp, advantages, mask, clip_low=clip_eps, clip_high=clip_eps)

    @registry.reference("grpo.control_advantages")
    def control_advantages(rewards, group_size, eps=1e-6):
        return torch.tensor(group_advantages(rewards.tolist(), group_size, eps), dtype=torch.float64)

    @registry.reference("family.tapo_on_policy")
    def tapo_on_policy(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, **_):
        """TAPO's loss (methods/tapo) at logp == old_logp with eps_max = eps_min = the clip: on-policy TAPO is GRPO."""
        from methods.tapo.objective import tapo_loss

        return tapo_loss(logp, logp.detach().clone(), advantages, mask, clip_low, clip_high)[0].detach()

    @registry.reference("family.tapo_on_policy_grad")
    def tapo_on_policy_grad(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, **_):
        from methods.tapo.objective import tapo_loss

        x = logp.detach().clone().requires_grad_(True)
        loss, _ = tapo_loss(x, logp.detach().clone(), advantages, mask, clip_low, clip_high)
        (g,) = torch.autograd.grad(loss, x)
        return g


_register()


# --- the scale tier: the same formulas at training sizes (methods/common/exact.py says why) ------------------------


def scale_terms(logp, old, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, ref_logp=None, beta=0.0,
                log_ratio_clamp=20.0, margin=1e-9):
    """Per token, in float64 tensors: (term f, d f / d logp, near, ratio, bool mask, advantages): `token_terms`
    element by element (the clamp, the clip, the dual cap, the k3 KL), `near` where the active branch is
    ambiguous within a relative `margin`."""
    import torch

    f64 = torch.float64
    m = mask.to(torch.bool)
    zero = torch.zeros((), dtype=f64)
    a = advantages.to(f64)
    a = torch.where(m, a[:, None].expand(m.shape) if a.dim() == 1 else a, zero)
    lp = torch.where(m, logp.to(f64), zero)
    x = torch.where(m, lp - old.to(f64), zero)
    C = float(log_ratio_clamp)
    lo, hi = 1.0 - float(clip_low), 1.0 + float(clip_high)
    bound = x.abs() > C
    r = x.clamp(-C, C).exp()
    c = r.clamp(lo, hi)
    term = torch.maximum(-r * a, -c * a)
    g = torch.where(((a > 0) & (r > hi)) | ((a < 0) & (r < lo)) | bound, zero, -a * r)
    near = ((x.abs() - C).abs() <= margin * C) | ((r - lo).abs() <= margin * lo) | ((r - hi).abs() <= margin * hi)
    if dual_clip is not None:
        cap = -float(dual_clip) * a
        neg = a < 0
        near |= neg & ((term - cap).abs() <= margin * cap.abs())
        capped = neg & (term > cap)
        term = torch.where(capped, cap, term)
        g = torch.where(capped, zero, g)
    if beta:
        d = torch.where(m, ref_logp.to(f64), zero) - lp
        term = term + float(beta) * (d.exp() - d - 1.0)
        g = g + float(beta) * (1.0 - d.exp())
    return torch.where(m, term, zero), torch.where(m, g, zero), near & m, torch.where(m, r, zero), m, a


def _scale_register() -> None:
    import torch

    from engine.spec import registry
    from methods.common.exact import fsum, fsum_rows

    def margin_of(dtype) -> float:
        # float32 arithmetic puts a ratio about 1e-7 (relative) off its float64 value: a token that close to a
        # bound is on either side of it, so its gradient (and the counts it decides) are not judged
        return 1e-9 if dtype in (None, torch.float64) else 1e-5

    @registry.reference("grpo.loss_f64")
    def loss_f64(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, ref_logp=None,
                 beta=0.0, agg="token-mean", norm_length=None, log_ratio_clamp=20.0, dtype=None):
        """The GRPO loss, its scale (the weighted sum of |f|) and d loss / d logp (NaN where ambiguous), each term
        in float64 and every sum exact: `loss_and_grad` at training sizes."""
        term, g, near, _, m, _ = scale_terms(logp, old_logp, advantages, mask, clip_low=clip_low,
                                             clip_high=clip_high, dual_clip=dual_clip, ref_logp=ref_logp, beta=beta,
                                             log_ratio_clamp=log_ratio_clamp, margin=margin_of(dtype))
        counts = m.sum(dim=-1)
        n, rows = int(counts.sum()), int((counts > 0).sum())
        length = m.shape[-1] if norm_length is None else int(norm_length)
        if agg == "token-mean":
            value, scale = fsum(term) / n, fsum(term.abs()) / n
            w = torch.full(m.shape, 1.0 / n, dtype=torch.float64)
        elif agg == "seq-mean-token-mean":
            per = counts.clamp_min(1).to(torch.float64)
            value = fsum(fsum_rows(term) / per) / rows
            scale = fsum(fsum_rows(term.abs()) / per) / rows
            w = (1.0 / (per * rows))[:, None].expand(m.shape)
        elif agg == "seq-mean-token-sum-norm":
            value, scale = fsum(term) / (rows * length), fsum(term.abs()) / (rows * length)
            w = torch.full(m.shape, 1.0 / (rows * length), dtype=torch.float64)
        else:
            raise ValueError(agg)
        grad = torch.where(near, torch.full_like(g, math.nan), w * g)
        return {"value": torch.tensor(value, dtype=torch.float64), "scale": scale, "grad": [grad],
                "counts": {"grad_excluded": int(near.sum())}}

    @registry.reference("grpo.loss_metrics_f64")
    def metrics_f64(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None,
                    ref_logp=None, beta=0.0, log_ratio_clamp=20.0, **_):
        """`metrics` at training sizes; a count is NaN (not judged) when a token lies within 1e-5 (relative) of
        the bound that decides it, as in the loop."""
        margin = 1e-5
        term, _, _, r, m, a = scale_terms(logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                                          dual_clip=None, ref_logp=ref_logp, beta=0.0,
                                          log_ratio_clamp=log_ratio_clamp, margin=margin)
        lo, hi = 1.0 - float(clip_low), 1.0 + float(clip_high)
        x = torch.where(m, logp.to(torch.float64) - old_logp.to(torch.float64), 0.0)
        C = float(log_ratio_clamp)
        n = int(m.sum())
        rv = r[m]
        tie_clip = bool((((rv - lo).abs() <= margin * lo) | ((rv - hi).abs() <= margin * hi)).any())
        tie_clamp = bool(((x[m].abs() - C).abs() <= margin * C).any())
        below, above = int((rv < lo).sum()), int((rv > hi).sum())
        nan = math.nan
        dual = 0.0
        if dual_clip is not None:
            cap = -float(dual_clip) * a
            neg = m & (a < 0)
            tie_dual = bool(((term - cap).abs()[neg] <= margin * cap.abs()[neg]).any())
            dual = nan if tie_dual else int((neg & (term > cap)).sum()) / n
        kl = 0.0
        if beta:
            d = torch.where(m, ref_logp.to(torch.float64) - logp.to(torch.float64), 0.0)
            kl = fsum(torch.where(m, d.exp() - d - 1.0, 0.0)) / n
        return {"tokens": n, "rows": int((m.sum(-1) > 0).sum()), "ratio_min": float(rv.min()),
                "ratio_max": float(rv.max()), "clip_fraction": nan if tie_clip else (below + above) / n,
                "clip_low_fraction": nan if tie_clip else below / n, "clip_high_fraction": nan if tie_clip else above / n,
                "dual_clip_fraction": dual, "clamped_tokens": nan if tie_clamp else int((x[m].abs() > C).sum()),
                "kl": kl}


_scale_register()
