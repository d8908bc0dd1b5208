"""Arbitrary-precision evaluations of every float64 reference the specs' contracts compare against.

Each certifier takes the reference's own arguments (float64 CPU copies of what the implementation received) and
evaluates the same mathematics again with mpmath at DPS digits, written from the formulas, not from the reference's
code: a reference whose float64 evaluation cancels or accumulates error shows as the distance between the two
(tests/test_reference_certification.py holds it to 1% of the contract's tolerance). A certifier returns the
reference's structure with nested lists of mpf in place of tensors and mpf in place of floats, and None where the
reference is undefined; parts it does not evaluate (counts, which are tallies) are left out.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import mpmath
import torch

DPS = 60
mp = mpmath.mp
mpf = mpmath.mpf
CERTIFIERS: dict[str, Callable[..., Any]] = {}


def certifier(*names: str):
    def deco(fn):
        for n in names:
            CERTIFIERS[n] = fn
        return fn

    return deco


def L(x: Any) -> Any:
    """A tensor as nested lists: mpf for floating values (exact), Python bools / ints otherwise."""
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or not x.is_floating_point():
            return x.tolist()
        return _tree(x.tolist())
    if isinstance(x, float):
        return mpf(x)
    return x


def _tree(v):
    return [_tree(x) for x in v] if isinstance(v, list) else mpf(v)


def _rows(adv, mask):
    """Per-token advantages as rows ([B] repeated along the row, or [B, L] as is)."""
    a = L(adv)
    return [[a[b]] * len(mask[b]) for b in range(len(mask))] if adv.dim() == 1 else a


def _zeros_like(x: torch.Tensor):
    return _tree(torch.zeros(x.shape, dtype=torch.float64).tolist())


def _exp(x):
    return mpmath.exp(x) if x != -mpmath.inf else mpf(0)


# --- TAPO (methods/tapo/reference.py; the page's R~, Eq15, length-aware clip) ----------------------------------


def _tapo_eps(T: int, t: int, lo, hi):
    if T == 1:
        return mpf(hi)
    rT = 1 / mpmath.sqrt(T)
    return mpf(lo) + (mpf(hi) - mpf(lo)) * (1 / mpmath.sqrt(t) - rT) / (1 - rT)


def _tapo_ratios(logp, old, mask):
    out = []
    for lr, orow, mr in zip(L(logp), L(old), mask.bool().tolist()):
        acc, t, row = mpf(0), 0, []
        for lv, ov, v in zip(lr, orow, mr):
            if not v:
                row.append(None)
                continue
            t += 1
            acc += lv - ov
            row.append(mpmath.exp(acc / t))
        out.append(row)
    return out


@certifier("tapo.prefix_ratio", "tapo.prefix_ratio_f64")
def tapo_prefix_ratio(logp, old, mask):
    return _tapo_ratios(logp, old, mask)


def _tapo_walk(logp, old, adv, mask, eps_min, eps_max, horizon):
    m = mask.bool().tolist()
    ratios, a = _tapo_ratios(logp, old, mask), _rows(adv, m)
    for b, (rr, ar, mr) in enumerate(zip(ratios, a, m)):
        T = horizon if horizon is not None else sum(mr)
        t = 0
        for j, (r, av, v) in enumerate(zip(rr, ar, mr)):
            if v:
                t += 1
                yield b, j, r, av, _tapo_eps(T, t, eps_min, eps_max)


@certifier("tapo.loss", "tapo.loss_f64")
def tapo_loss(logp, old, adv, mask, eps_min, eps_max, horizon=None, group_size=None, dtype=None):
    n = int(mask.bool().sum())
    grad = _zeros_like(logp)
    total = abs_total = mpf(0)
    for b, j, r, a, e in _tapo_walk(logp, old, adv, mask, eps_min, eps_max, horizon):
        lo, hi = 1 - e, 1 + e
        term = mpf(0) if a == 0 else -min(r * a, min(max(r, lo), hi) * a)
        total, abs_total = total + term, abs_total + abs(term)
        removed = a == 0 or (a > 0 and r > hi) or (a < 0 and r < lo)
        grad[b][j] = mpf(0) if removed else -a * r / n
    return {"value": total / n, "scale": abs_total / n, "grad": [grad]}


@certifier("tapo.loss_metrics")
def tapo_loss_metrics(logp, old, adv, mask, eps_min, eps_max, horizon=None, group_size=None, dtype=None):
    rs, es, out, act = [], [], 0, 0
    for _b, _j, r, a, e in _tapo_walk(logp, old, adv, mask, eps_min, eps_max, horizon):
        rs.append(r)
        es.append(e)
        out += r < 1 - e or r > 1 + e
        act += (a > 0 and r > 1 + e) or (a < 0 and r < 1 - e)
    n = len(rs)
    return {"tokens": n, "ratio_min": min(rs), "ratio_max": max(rs), "clip_fraction": mpf(out) / n,
            "clip_active_fraction": mpf(act) / n, "eps_lo": min(es), "eps_hi": max(es)}


def _on_policy(adv, mask):
    m = mask.bool().tolist()
    a = _rows(adv, m)
    valid = [(b, t) for b in range(len(m)) for t in range(len(m[b])) if m[b][t]]
    n = len(valid)
    grad = [[(-a[b][t] / n if m[b][t] else mpf(0)) for t in range(len(m[b]))] for b in range(len(m))]
    return -mpmath.fsum(a[b][t] for b, t in valid) / n, mpmath.fsum(abs(a[b][t]) for b, t in valid) / n, grad


@certifier("tapo.on_policy_loss")
def tapo_on_policy(logp, old, adv, mask, eps_min, eps_max, horizon=None, group_size=None):
    value, scale, grad = _on_policy(adv, mask)
    return {"value": value, "scale": scale, "grad": [grad]}


@certifier("family.tapo_on_policy")
def family_tapo_on_policy(logp, old_logp, advantages, mask, **_):
    return _on_policy(advantages, mask)[0]


@certifier("family.tapo_on_policy_grad")
def family_tapo_on_policy_grad(logp, old_logp, advantages, mask, **_):
    return _on_policy(advantages, mask)[2]


# --- GRPO (methods/grpo/reference.py; DeepSeekMath with the spec's declared choices) ---------------------------


def _grpo(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, dual_clip=None, ref_logp=None, beta=0.0,
          agg="token-mean", norm_length=None, log_ratio_clamp=20.0):
    m = mask.bool().tolist()
    lp, op, a = L(logp), L(old), _rows(adv, m)
    ref = None if ref_logp is None else L(ref_logp)
    lo, hi, C = 1 - mpf(clip_low), 1 + mpf(clip_high), mpf(log_ratio_clamp)
    counts = [sum(r) for r in m]
    n, rows = sum(counts), sum(1 for c in counts if c)
    length = len(m[0]) if norm_length is None else norm_length
    value, scale, grad = mpf(0), mpf(0), _zeros_like(logp)
    for b, mr in enumerate(m):
        for t, v in enumerate(mr):
            if not v:
                continue
            w = (mpf(1) / n if agg == "token-mean" else mpf(1) / (counts[b] * rows)
                 if agg == "seq-mean-token-mean" else mpf(1) / (rows * length))
            x = lp[b][t] - op[b][t]
            bound = abs(x) > C
            r = mpmath.exp(max(-C, min(C, x)))
            av = a[b][t]
            term = max(-r * av, -min(max(r, lo), hi) * av)
            g = mpf(0) if bound or (av > 0 and r > hi) or (av < 0 and r < lo) else -av * r
            if dual_clip is not None and av < 0 and term > -mpf(dual_clip) * av:
                term, g = -mpf(dual_clip) * av, mpf(0)
            if beta:
                d = ref[b][t] - lp[b][t]
                term += mpf(beta) * (mpmath.exp(d) - d - 1)
                g += mpf(beta) * (1 - mpmath.exp(d))
            value += w * term
            scale += w * abs(term)
            grad[b][t] = w * g
    return value, grad, scale


@certifier("grpo.loss")
def grpo_loss(logp, old_logp, advantages, mask, **kw):
    return _grpo(logp, old_logp, advantages, mask, **kw)[0]


@certifier("grpo.loss_f64")
def grpo_loss_f64(logp, old_logp, advantages, mask, dtype=None, **kw):
    value, grad, scale = _grpo(logp, old_logp, advantages, mask, **kw)
    return {"value": value, "scale": scale, "grad": [grad]}


@certifier("grpo.loss_grad")
def grpo_loss_grad(logp, old_logp, advantages, mask, **kw):
    return _grpo(logp, old_logp, advantages, mask, **kw)[1]


@certifier("grpo.loss_grads")
def grpo_loss_grads(logp, old_logp, advantages, mask, **kw):
    return [_grpo(logp, old_logp, advantages, mask, **kw)[1], _zeros_like(old_logp), _zeros_like(advantages)]


@certifier("grpo.loss_grads_kl")
def grpo_loss_grads_kl(logp, old_logp, advantages, mask, **kw):
    return [_grpo(logp, old_logp, advantages, mask, **kw)[1], _zeros_like(kw["ref_logp"])]


@certifier("family.zero_grads")
def zero_grads(logp, old_logp, advantages, mask, **_):
    return [_zeros_like(old_logp), _zeros_like(advantages)]


@certifier("grpo.loss_metrics", "grpo.loss_metrics_f64")
def grpo_metrics(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, ref_logp=None,
                 beta=0.0, log_ratio_clamp=20.0, **_):
    m = mask.bool().tolist()
    lp, op, a = L(logp), L(old_logp), _rows(advantages, m)
    ref = None if ref_logp is None else L(ref_logp)
    lo, hi, C = 1 - mpf(clip_low), 1 + mpf(clip_high), mpf(log_ratio_clamp)
    rs, kl = [], []
    below = above = dual = clamped = 0
    for b, mr in enumerate(m):
        for t, v in enumerate(mr):
            if not v:
                continue
            x = lp[b][t] - op[b][t]
            clamped += abs(x) > C
            r = mpmath.exp(max(-C, min(C, x)))
            rs.append(r)
            below += r < lo
            above += r > hi
            av = a[b][t]
            if dual_clip is not None and av < 0:
                dual += max(-r * av, -min(max(r, lo), hi) * av) > -mpf(dual_clip) * av
            if beta:
                d = ref[b][t] - lp[b][t]
                kl.append(mpmath.exp(d) - d - 1)
    n = len(rs)
    return {"tokens": n, "rows": sum(1 for r in m if any(r)), "ratio_min": min(rs), "ratio_max": max(rs),
            "clip_fraction": mpf(below + above) / n, "clip_low_fraction": mpf(below) / n,
            "clip_high_fraction": mpf(above) / n, "dual_clip_fraction": mpf(dual) / n, "clamped_tokens": clamped,
            "kl": mpmath.fsum(kl) / n if beta else mpf(0)}


@certifier("grpo.group_advantages", "grpo.control_advantages")
def grpo_group_advantages(rewards, group_size, eps=1e-6, *, mask=None):
    r = L(rewards)
    B = len(r)
    keep = [True] * B if mask is None else (mask.bool().any(-1) if mask.dim() == 2 else mask.bool()).tolist()
    out = [mpf(0)] * B
    for s in range(0, B, int(group_size)):
        idx = [i for i in range(s, s + int(group_size)) if keep[i]]
        vals = [r[i] for i in idx]
        if not idx or max(vals) == min(vals):
            continue
        mean = mpmath.fsum(vals) / len(vals)
        std = mpmath.sqrt(mpmath.fsum((v - mean) ** 2 for v in vals) / len(vals))
        for i in idx:
            out[i] = (r[i] - mean) / (std + mpf(eps))
    return out


@certifier("grpo.behaviour_logprobs")
def grpo_behaviour_logprobs(logits, tokens, temperature=1.0):
    out = []
    for lrow, trow in zip(L(logits), tokens.tolist()):
        orow = []
        for dist, tok in zip(lrow, trow):
            z = [v / mpf(temperature) for v in dist]
            orow.append(z[tok] - mpmath.log(mpmath.fsum(mpmath.exp(v) for v in z)))
        out.append(orow)
    return out


@certifier("grpo.response_mask")
def grpo_response_mask(responses, eos_id=1):
    out = []
    for row in responses.tolist():
        seen, mrow = False, []
        for tok in row:
            mrow.append(mpf(0) if seen else mpf(1))
            seen = seen or tok == eos_id
        out.append(mrow)
    return out


@certifier("family.grpo_one_token")
def family_grpo_one_token(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, **_):
    return _grpo(logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high)[0]


@certifier("family.grpo_one_token_grad")
def family_grpo_one_token_grad(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, **_):
    return _grpo(logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high)[1]


# --- GSPO (methods/gspo/reference.py; arXiv 2507.18071) ---------------------------------------------------------


def _gspo_rows(logp, old, mask, clamp):
    """Per row: (valid positions, mean log-ratio x, s = exp(min(x, clamp))) or None for an empty row."""
    out = []
    for lr, orow, mr in zip(L(logp), L(old), mask.bool().tolist()):
        idx = [t for t, v in enumerate(mr) if v]
        if not idx:
            out.append(None)
            continue
        x = mpmath.fsum(lr[t] - orow[t] for t in idx) / len(idx)
        out.append((idx, x, mpmath.exp(min(x, mpf(clamp)))))
    return out


def _gspo(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, form="sequence", log_ratio_clamp=10.0):
    m = mask.bool().tolist()
    a = _rows(advantages, m)
    lo, hi, C = 1 - mpf(clip_low), 1 + mpf(clip_high), mpf(log_ratio_clamp)
    rows_data = _gspo_rows(logp, old_logp, mask, log_ratio_clamp)
    rows = sum(1 for r in rows_data if r is not None)
    value, scale, grad = mpf(0), mpf(0), _zeros_like(logp)
    for b, row in enumerate(rows_data):
        if row is None:
            continue
        idx, x, s = row
        n = len(idx)
        c = min(max(s, lo), hi)
        for t in idx:
            av = a[b][t]
            value += max(-s * av, -c * av) / (n * rows)
            scale += abs(max(-s * av, -c * av)) / (n * rows)
            clipped = (av > 0 and s > hi) or (av < 0 and s < lo)
            grad[b][t] = mpf(0) if (x > C or clipped) else -av * s / (n * rows)
    return value, grad, scale


@certifier("gspo.loss")
def gspo_loss(*args, **kw):
    return _gspo(*args, **kw)[0]


@certifier("gspo.loss_f64")
def gspo_loss_f64(logp, old_logp, advantages, mask, dtype=None, **kw):
    value, grad, scale = _gspo(logp, old_logp, advantages, mask, **kw)
    return {"value": value, "scale": scale, "grad": [grad]}


@certifier("gspo.loss_grad")
def gspo_loss_grad(*args, **kw):
    return _gspo(*args, **kw)[1]


@certifier("gspo.loss_grads")
def gspo_loss_grads(logp, old_logp, advantages, mask, **kw):
    return [_gspo(logp, old_logp, advantages, mask, **kw)[1], _zeros_like(old_logp), _zeros_like(advantages)]


@certifier("gspo.loss_metrics", "gspo.loss_metrics_exact")
def gspo_metrics(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, log_ratio_clamp=10.0, **_):
    lo, hi, C = 1 - mpf(clip_low), 1 + mpf(clip_high), mpf(log_ratio_clamp)
    rows = [r for r in _gspo_rows(logp, old_logp, mask, log_ratio_clamp) if r is not None]
    seqs = [s for _i, _x, s in rows]
    below, above = sum(s < lo for s in seqs), sum(s > hi for s in seqs)
    n = len(seqs)
    return {"tokens": int(mask.bool().sum()), "rows": n, "seq_ratio_min": min(seqs), "seq_ratio_max": max(seqs),
            "clip_fraction": mpf(below + above) / n, "clip_low_fraction": mpf(below) / n,
            "clip_high_fraction": mpf(above) / n, "clamped_rows": sum(x > C for _i, x, _s in rows)}


@certifier("gspo.sequence_ratio")
def gspo_sequence_ratio(logp, old_logp, mask, *, log_ratio_clamp=10.0):
    return [mpf(1) if r is None else r[2] for r in _gspo_rows(logp, old_logp, mask, log_ratio_clamp)]


@certifier("gspo.sequence_ratio_grad")
def gspo_sequence_ratio_grad(logp, old_logp, mask, *, log_ratio_clamp=10.0):
    g = _zeros_like(logp)
    for b, r in enumerate(_gspo_rows(logp, old_logp, mask, log_ratio_clamp)):
        if r is not None:
            idx, x, s = r
            for t in idx:
                g[b][t] = mpf(0) if x > mpf(log_ratio_clamp) else s / len(idx)
    return g


@certifier("gspo.sequence_ratio_f64")
def gspo_sequence_ratio_f64(logp, old_logp, mask, *, log_ratio_clamp=10.0, dtype=None):
    return {"value": gspo_sequence_ratio(logp, old_logp, mask, log_ratio_clamp=log_ratio_clamp),
            "grad": [gspo_sequence_ratio_grad(logp, old_logp, mask, log_ratio_clamp=log_ratio_clamp)]}


@certifier("family.tapo_ratio_at_end")
def family_tapo_ratio_at_end(logp, old_logp, mask, **_):
    return [None if r is None else mpmath.exp(r[1]) for r in _gspo_rows(logp, old_logp, mask, mpmath.inf)]


# --- MRTPO (methods/mrtpo/reference.py; q = sqrt(JS / ln 2), Appendix D) -----------------------------------------


def _js(la, lb):
    """sqrt(JS(p || q) / ln 2), clamped into [0, 1], the textbook sum (its cancellation is harmless at DPS digits)."""
    total = mpf(0)
    for a, b in zip(la, lb):
        if a == b:  # p = q: exactly 0 (ln m would round at DPS digits and leave ~1e-60 behind)
            continue
        p, q = _exp(a), _exp(b)
        m = (p + q) / 2
        if p > 0:
            total += p * (a - mpmath.log(m))
        if q > 0:
            total += q * (b - mpmath.log(m))
    return mpmath.sqrt(min(mpf(1), max(mpf(0), total / 2 / mpmath.log(2))))


@certifier("mrtpo.js_distance", "mrtpo.js_distance_f64")
def mrtpo_js(logp_a, logp_b, chunk_elems=None):
    V = logp_a.shape[-1]
    a, b = L(logp_a.reshape(-1, V)), L(logp_b.reshape(-1, V))
    flat = [_js(x, y) for x, y in zip(a, b)]
    return _reshape(flat, list(logp_a.shape[:-1]))


def _reshape(flat, shape):
    if not shape:
        return flat[0]
    step = len(flat) // shape[0] if shape[0] else 0
    return [_reshape(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _empty_of(empty, k, b):
    if empty is None:
        return False
    e = empty[k]
    if isinstance(e, list):
        return bool(e[b] if len(e) > 1 else e[0])
    return bool(e)


def _weights(all_rows, loo_rows, mask, beta, empty):
    """w [K][B][T] from log-probability rows (nested lists of mpf, None where never read)."""
    out = []
    for k, loo in enumerate(loo_rows):
        wk = []
        for b, mr in enumerate(mask):
            valid = [t for t, v in enumerate(mr) if v]
            is_empty = loo is None or _empty_of(empty, k, b)
            q = {} if is_empty else {t: _js(all_rows[b][t], loo[b][t]) for t in valid}
            qbar = mpmath.fsum(q.values()) / len(valid) if (valid and not is_empty) else mpf(0)
            wk.append([mpf(0) if not mr[t] else mpf(1) if (is_empty or qbar == 0)
                       else (1 - mpf(beta)) + mpf(beta) * q[t] / qbar for t in range(len(mr))])
        out.append(wk)
    return out


@certifier("mrtpo.credit_weights", "mrtpo.credit_weights_f64")
def mrtpo_weights(logp_all, logp_loo, mask, beta, empty_block=None, chunk_elems=None):
    loo = [None if x is None else L(x) for x in logp_loo]
    empty = None if empty_block is None else empty_block.bool().tolist()
    return _weights(L(logp_all), loo, mask.bool().tolist(), beta, empty)


def _log_softmax_rows(x, mask):
    out = []
    for b, mr in enumerate(mask):
        row = []
        for t, v in enumerate(mr):
            if not v:
                row.append(None)
                continue
            lse = mpmath.log(mpmath.fsum(mpmath.exp(z) for z in x[b][t]))
            row.append([z - lse for z in x[b][t]])
        out.append(row)
    return out


@certifier("mrtpo.credit_weights_from_logits", "mrtpo.credit_weights_from_logits_f64")
def mrtpo_weights_from_logits(logits_all, logits_loo, mask, beta, empty_block=None, chunk_elems=None,
                              block_elems=None):
    m = mask.bool().tolist()
    loo = [None if x is None else _log_softmax_rows(L(x), m) for x in logits_loo]
    empty = None if empty_block is None else empty_block.bool().tolist()
    return _weights(_log_softmax_rows(L(logits_all), m), loo, m, beta, empty)


def _std(values):
    if not values:
        return mpf(0)
    mean = mpmath.fsum(values) / len(values)
    return mpmath.sqrt(mpmath.fsum((v - mean) ** 2 for v in values) / len(values))


@certifier("mrtpo.advantages", "mrtpo.advantages_f64")
def mrtpo_advantages(reward_advantages, weights, mask, eps=1e-6):
    radv, w, m = L(reward_advantages), L(weights), mask.bool().tolist()
    K, B = len(radv), len(radv[0])
    valid = [[t for t, v in enumerate(m[b]) if v] for b in range(B)]
    U = [mpmath.fsum(radv[k][b] for k in range(K)) if valid[b] else mpf(0) for b in range(B)]
    D = {(b, t): mpmath.fsum(radv[k][b] * w[k][b][t] for k in range(K)) - U[b] for b in range(B) for t in valid[b]}
    mu = mpmath.fsum(len(valid[b]) * U[b] ** 2 for b in range(B))
    md = mpmath.fsum(d * d for d in D.values())
    s = min(mpf(1), mpmath.sqrt(mu / md)) if md > 0 else mpf(1)
    St = {bt: U[bt[0]] + s * d for bt, d in D.items()}
    std = _std(list(St.values()))
    value = [[St[b, t] / (std + mpf(eps)) if (b, t) in St else mpf(0) for t in range(len(m[b]))] for b in range(B)]
    top = max([abs(v) for row in value for v in row] or [mpf(0)])
    return {"value": value, "scale": max(mpf(1), top),
            "scalars": {"s": s, "std": std, "second_moment_U": mu, "second_moment_D": md}}


@certifier("mrtpo.gdpo_uniform")
def mrtpo_gdpo_uniform(reward_advantages, weights, mask, eps=1e-6):
    radv, m = L(reward_advantages), mask.bool().tolist()
    U = [mpmath.fsum(col) for col in zip(*radv)]
    std = _std([U[b] for b in range(len(m)) for v in m[b] if v])
    value = [[U[b] / (std + mpf(eps)) if m[b][t] else mpf(0) for t in range(len(m[b]))] for b in range(len(m))]
    top = max([abs(v) for row in value for v in row] or [mpf(0)])
    return {"value": value, "scale": max(mpf(1), top)}


@certifier("mrtpo.reward_sum")
def mrtpo_reward_sum(reward_advantages, weights, mask, eps=1e-6):
    return [mpmath.fsum(col) for col in zip(*L(reward_advantages))]


# --- TAR (methods/tar/reference.py; phi, the gated replay, cosine FPS) -------------------------------------------


def _phi(z):
    return mpf(0) if z <= 0 else -mpmath.expm1(-z)


@certifier("tar.phi")
def tar_phi(z, dtype=None):
    return _tree_map(L(z), _phi)


def _tree_map(v, f):
    return [_tree_map(x, f) for x in v] if isinstance(v, list) else f(v)


def _replay(lt, lb, mask):
    t, bse, m = L(lt), L(lb), mask.bool().tolist()
    B = len(t)
    loss, grad, gates, weights = mpf(0), _zeros_like(lt), [], []
    for b in range(B):
        valid = [j for j, v in enumerate(m[b]) if v]
        d = {j: bse[b][j] - t[b][j] for j in valid}
        g = _phi(mpmath.fsum(d.values()) / len(valid)) if valid else mpf(0)
        w = [_phi(d[j]) if j in d else mpf(0) for j in range(len(m[b]))]
        wsum = mpmath.fsum(w)
        loss += g * mpmath.fsum(w[j] * -t[b][j] for j in valid) / (mpf(1e-8) + wsum)
        for j in valid:
            grad[b][j] = -g * w[j] / (mpf(1e-8) + wsum) / B
        gates.append(g)
        weights.append(w)
    return (loss / B if B else mpf(0)), grad, gates, weights


@certifier("tar.replay", "tar.replay_f64")
def tar_replay(logp_theta, logp_base, mask):
    loss, grad, _g, _w = _replay(logp_theta, logp_base, mask)
    return {"value": loss, "grad": [grad], "scale": abs(loss)}


@certifier("tar.replay_metrics", "tar.replay_metrics_f64")
def tar_replay_metrics(logp_theta, logp_base, mask):
    loss, _grad, gates, weights = _replay(logp_theta, logp_base, mask)
    m = mask.bool().tolist()
    t, bse = L(logp_theta), L(logp_base)
    valid = [[j for j, v in enumerate(row) if v] for row in m]
    mean_delta = [mpmath.fsum(bse[b][j] - t[b][j] for j in vs) / len(vs) if vs else mpf(0) for b, vs in enumerate(valid)]
    weight_sum = [mpmath.fsum(weights[b][j] for j in vs) for b, vs in enumerate(valid)]
    return loss, {"gates": gates, "token_weights": weights,
                  "active_fraction": mpf(sum(g > 0 for g in gates)) / len(gates) if gates else mpf(0),
                  "mean_delta": mean_delta, "weight_sum": weight_sum}


@certifier("tar.replay_support")
def tar_replay_support(logp_theta, logp_base, mask):
    _loss, _grad, gates, weights = _replay(logp_theta, logp_base, mask)
    m = mask.bool().tolist()
    return {"support": [[bool(m[b][j] and gates[b] > 0 and weights[b][j] > 0) for j in range(len(m[b]))]
                        for b in range(len(m))]}


@certifier("tar.total")
def tar_total(grpo_loss, replay_loss, lambda_rep=1.0):
    lam = mpf(float(lambda_rep))
    return {"value": L(grpo_loss) + lam * L(replay_loss), "grad": [mpf(1), lam]}


def _integers(rows: list[list[float]]) -> list[list[int]]:
    """The rows as integers times one common power of two: dot products of them are exact (Python integers)."""
    parts = [[math.frexp(v) for v in row] for row in rows]
    low = min((e for row in parts for m, e in row if m), default=0) - 53
    return [[int(m * 2.0 ** 53) << (e - 53 - low) if m else 0 for m, e in row] for row in parts]


def _fps(embeddings, correct, k=3, prompt_ids=None, tie=mpf(1e-12)):
    """Greedy max-min cosine FPS: the first pick the lowest-index correct candidate of each prompt (ascending prompt
    id), then the one whose smallest distance to the chosen is largest, ties within `tie` to the lowest index.
    Dot products are exact (integers), each distance 1 - dot / sqrt(|a|^2 |b|^2) is taken in DPS digits; each
    candidate's smallest distance is kept and lowered by each new pick."""
    C = correct.bool().tolist()
    ids = [0] * len(C) if prompt_ids is None else [int(p) for p in prompt_ids.tolist()]
    rows = embeddings.tolist()
    out = []
    for p in sorted(set(ids)):
        cand = [i for i in range(len(C)) if ids[i] == p and C[i]]
        X = dict(zip(cand, _integers([rows[i] for i in cand])))
        sq = {i: mpf(sum(x * x for x in X[i])) for i in cand}
        chosen, best = [], cand[0] if cand else None
        nearest = {i: mpmath.inf for i in cand}
        while cand and len(chosen) < int(k):
            chosen.append(best)
            cand.remove(best)
            xb = X[best]
            for i in cand:
                dot = sum(a * b for a, b in zip(X[i], xb))
                nearest[i] = min(nearest[i], 1 - mpf(dot) / mpmath.sqrt(sq[i] * sq[best]))
            if cand:
                top = max(nearest[i] for i in cand)
                best = next(i for i in cand if nearest[i] >= top - tie)
        out += chosen
    return out


@certifier("tar.fps", "tar.fps_loop", "tar.fps_f64")
def tar_fps(embeddings, correct, k=3, prompt_ids=None):
    return {"value": [mpf(i) for i in _fps(embeddings, correct, k, prompt_ids)]}


# --- the framework zoo's papers (methods/{dapo,dr_grpo,cispo,gmpo,gpg}/reference.py) -------------------------------


def _clipped_terms(logp, old, adv, mask, clip_low, clip_high, clamp):
    """Per valid token of the PPO-clipped surrogate: (b, t, f = -min(r A, clip(r) A), d f / d logp), r the clamped
    ratio; the clipped branch and a binding clamp pass no gradient."""
    m = mask.bool().tolist()
    lp, op, a = L(logp), L(old), _rows(adv, m)
    lo, hi, C = 1 - mpf(clip_low), 1 + mpf(clip_high), mpf(clamp)
    out = []
    for b, mr in enumerate(m):
        for t, v in enumerate(mr):
            if v:
                x, av = lp[b][t] - op[b][t], a[b][t]
                r = mpmath.exp(max(-C, min(C, x)))
                f = max(-r * av, -min(max(r, lo), hi) * av)
                g = mpf(0) if abs(x) > C or (av > 0 and r > hi) or (av < 0 and r < lo) else -av * r
                out.append((b, t, f, g))
    return m, out


def _weighted(logp, m, terms, w):
    """{value, scale, grad} of sum_tokens w f: the scale is sum w |f|."""
    grad = _zeros_like(logp)
    for b, t, _f, g in terms:
        grad[b][t] = w * g
    return {"value": w * mpmath.fsum(f for *_x, f, _g in terms), "scale": w * mpmath.fsum(abs(f) for *_x, f, _g in terms),
            "grad": [grad]}


def _dapo(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.28, log_ratio_clamp=20.0, **_):
    m, terms = _clipped_terms(logp, old_logp, advantages, mask, clip_low, clip_high, log_ratio_clamp)
    return _weighted(logp, m, terms, mpf(1) / len(terms))


@certifier("dapo.loss")
def dapo_loss(*args, **kw):
    return _dapo(*args, **kw)["value"]


@certifier("dapo.loss_grad")
def dapo_loss_grad(*args, **kw):
    return _dapo(*args, **kw)["grad"][0]


@certifier("dapo.loss_f64")
def dapo_loss_f64(*args, **kw):
    return _dapo(*args, **kw)


@certifier("dapo.overlong_penalty")
def dapo_overlong_penalty(lengths, max_length, cache_length):
    expected = max_length - cache_length
    return [mpf(0) if y <= expected else mpf(expected - y) / cache_length if y <= max_length else mpf(-1)
            for y in lengths.tolist()]


@certifier("dapo.dynamic_sampling_mask")
def dapo_dynamic_sampling_mask(correct, group_size):
    c = [bool(x) for x in correct.tolist()]
    out = []
    for s in range(0, len(c), group_size):
        out += [mpf(int(0 < sum(c[s:s + group_size]) < group_size))] * group_size
    return out


def _dr_grpo(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, norm_length=None,
             log_ratio_clamp=20.0, **_):
    m, terms = _clipped_terms(logp, old_logp, advantages, mask, clip_low, clip_high, log_ratio_clamp)
    rows = sum(1 for r in m if any(r))
    return _weighted(logp, m, terms, mpf(1) / (rows * (len(m[0]) if norm_length is None else norm_length)))


@certifier("dr_grpo.loss")
def dr_grpo_loss(*args, **kw):
    return _dr_grpo(*args, **kw)["value"]


@certifier("dr_grpo.loss_grad")
def dr_grpo_loss_grad(*args, **kw):
    return _dr_grpo(*args, **kw)["grad"][0]


@certifier("dr_grpo.loss_f64")
def dr_grpo_loss_f64(*args, **kw):
    return _dr_grpo(*args, **kw)


@certifier("dr_grpo.group_advantages")
def dr_grpo_group_advantages(rewards, group_size, *, mask=None):
    r = L(rewards)
    keep = [True] * len(r) if mask is None else [
        bool(any(row)) if isinstance(row, list) else bool(row) for row in mask.bool().tolist()]
    out = [mpf(0)] * len(r)
    for s in range(0, len(r), group_size):
        idx = [i for i in range(s, s + group_size) if keep[i]]
        if idx:
            mean = mpmath.fsum(r[i] for i in idx) / len(idx)
            for i in idx:
                out[i] = r[i] - mean
    return out


def _cispo(logp, old_logp, advantages, mask, *, clip_low=None, clip_high=0.2, **_):
    m = mask.bool().tolist()
    lp, op, a = L(logp), L(old_logp), _rows(advantages, m)
    lo, hi = (mpf(0) if clip_low is None else 1 - mpf(clip_low)), 1 + mpf(clip_high)
    terms = []
    for b, mr in enumerate(m):
        for t, v in enumerate(mr):
            if v:
                w = min(max(mpmath.exp(lp[b][t] - op[b][t]), lo), hi)
                terms.append((b, t, -w * a[b][t] * lp[b][t], -w * a[b][t]))
    return _weighted(logp, m, terms, mpf(1) / len(terms))


@certifier("cispo.loss")
def cispo_loss(*args, **kw):
    out = _cispo(*args, **kw)
    return {"value": out["value"], "scale": out["scale"]}


@certifier("cispo.loss_grad")
def cispo_loss_grad(*args, **kw):
    return _cispo(*args, **kw)["grad"][0]


@certifier("cispo.loss_f64")
def cispo_loss_f64(*args, **kw):
    return _cispo(*args, **kw)


def _gmpo(logp, old_logp, advantages, mask, *, clip_low=0.4, clip_high=0.4, log_ratio_clamp=20.0, **_):
    """(s per row, {value, scale, grad}): s_i = exp(mean_t sgn min(sgn l, sgn clip(l))), L = -(1/G) sum A_i s_i."""
    m = mask.bool().tolist()
    lp, op, a = L(logp), L(old_logp), L(advantages)
    low, high, C = mpf(clip_low), mpf(clip_high), mpf(log_ratio_clamp)
    rows = sum(1 for r in m if any(r))
    s_all, grad, terms = [], _zeros_like(logp), []
    for b, mr in enumerate(m):
        idx = [t for t, v in enumerate(mr) if v]
        if not idx:
            s_all.append(mpf(1))
            continue
        sg = mpmath.sign(a[b])
        ks, live = [], []
        for t in idx:
            x = lp[b][t] - op[b][t]
            xc = max(-C, min(C, x))
            c = max(-low, min(high, xc))
            ks.append(sg * min(sg * xc, sg * c))
            live.append((t, abs(x) <= C and sg != 0 and sg * xc <= sg * c))
        s = mpmath.exp(mpmath.fsum(ks) / len(idx))
        s_all.append(s)
        terms.append(-a[b] * s / rows)
        for t, ok in live:
            grad[b][t] = -a[b] * s / (len(idx) * rows) if ok else mpf(0)
    return s_all, {"value": mpmath.fsum(terms), "scale": mpmath.fsum(abs(x) for x in terms), "grad": [grad]}


@certifier("gmpo.geometric_ratio")
def gmpo_geometric_ratio(*args, **kw):
    return _gmpo(*args, **kw)[0]


@certifier("gmpo.loss")
def gmpo_loss(*args, **kw):
    return _gmpo(*args, **kw)[1]["value"]


@certifier("gmpo.loss_grad")
def gmpo_loss_grad(*args, **kw):
    return _gmpo(*args, **kw)[1]["grad"][0]


@certifier("gmpo.loss_f64")
def gmpo_loss_f64(*args, **kw):
    return _gmpo(*args, **kw)[1]


def _gpg(logp, advantages, mask, **_):
    m = mask.bool().tolist()
    lp, a = L(logp), _rows(advantages, m)
    terms = [(b, t, -a[b][t] * lp[b][t], -a[b][t]) for b, mr in enumerate(m) for t, v in enumerate(mr) if v]
    return _weighted(logp, m, terms, mpf(1) / len(terms))


@certifier("gpg.loss")
def gpg_loss(*args, **kw):
    return _gpg(*args, **kw)["value"]


@certifier("gpg.loss_grad", "family.grpo_on_policy_grad")
def gpg_loss_grad(*args, **kw):
    """-A / N per valid token: GPG's gradient, and GRPO's at logp == old_logp (every ratio 1, no clip binding)."""
    return _gpg(*args, **kw)["grad"][0]


@certifier("gpg.loss_f64")
def gpg_loss_f64(*args, **kw):
    return _gpg(*args, **kw)


@certifier("gpg.advantages_grad")
def gpg_advantages_grad(logp, advantages, mask, **_):
    return _zeros_like(advantages)


@certifier("gpg.advantages")
def gpg_advantages(rewards, group_size, *, f_norm=1.0):
    r = L(rewards)
    B = len(r)
    groups = [r[s:s + group_size] for s in range(0, B, group_size)]
    flat = [max(g) == min(g) for g in groups]
    m_rows = group_size * sum(flat)
    alpha = mpf(B) / (B - m_rows) if m_rows < B else mpf(1)
    out = []
    for g, f in zip(groups, flat):
        mean = mpmath.fsum(g) / len(g)
        out += [mpf(0) if f else alpha * (x - mean) / mpf(f_norm) for x in g]
    return out


@certifier("zoo.counts")
def zoo_counts(*args, **_):
    """The counts every zoo loss reports: N valid tokens and the non-empty responses of the mask (the last
    positional argument)."""
    m = args[-1].bool().tolist()
    return {"tokens": sum(sum(r) for r in m), "rows": sum(1 for r in m if any(r))}


@certifier("gspo.loss_counts", "tapo.loss_counts")
def loss_counts(logp, old_logp, advantages, mask, *_, **__):
    """The counts tapo_loss and gspo_loss report: N valid tokens and the non-empty responses (the fourth argument)."""
    return zoo_counts(mask)


# --- the GRPO control arm every method page compares against (methods/common/grpo.py, one symmetric clip) --------


@certifier("grpo.control_loss")
def grpo_control_loss(logp, old_logp, advantages, mask, clip_eps=0.2):
    return _grpo(logp, old_logp, advantages, mask, clip_low=clip_eps, clip_high=clip_eps)[0]


@certifier("grpo.control_loss_grad")
def grpo_control_loss_grad(logp, old_logp, advantages, mask, clip_eps=0.2):
    return _grpo(logp, old_logp, advantages, mask, clip_low=clip_eps, clip_high=clip_eps)[1]


@certifier("grpo.control_loss_metrics")
def grpo_control_loss_metrics(logp, old_logp, advantages, mask, clip_eps=0.2):
    return grpo_metrics(logp, old_logp, advantages, mask, clip_low=clip_eps, clip_high=clip_eps)
