"""Independent per-scalar references for the MRTPO checks (no torch arithmetic).

Every reference works on plain Python floats, one scalar at a time, in
decimal arithmetic with 28 significant digits (the `decimal` module), and
rounds to a float64 only at the end. Its own error is far below float64
rounding, so a measured difference is the implementation's error. The
formulas are the page's, in explicit loops, independently of the vectorised
implementation; the JS divergence is summed as non-negative terms (no
cancellation for near-identical rows, where the textbook KL-to-the-mixture
sum loses up to 19 of its 28 digits). tests/test_reference_certification.py
holds every reference to a 50+ digit mpmath evaluation on its contracts' cases.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache

PREC = 28


def _ctx():
    return localcontext(prec=PREC)


def _exp(x: float) -> Decimal:
    if x == -math.inf:
        return Decimal(0)
    return _D(x).exp()


@lru_cache(maxsize=1)
def _ln2() -> Decimal:
    with _ctx():
        return Decimal(2).ln()


def exp_row(row: list[float]) -> list[Decimal]:
    """Probabilities of one row of log-probabilities, as Decimals."""
    with _ctx():
        return [_exp(x) for x in row]


def _D(x) -> Decimal:
    return x if isinstance(x, Decimal) else Decimal(float(x))  # exact: every float is a finite decimal


def _small(total: Decimal) -> Decimal:
    """A series term below this no longer moves `total` at the working precision."""
    return abs(total) * Decimal(10) ** -(PREC + 3)


def _expm1(d: Decimal) -> Decimal:
    """e^d - 1 to full relative precision: its Taylor series for small |d|, where exp(d) - 1 would cancel."""
    if abs(d) >= Decimal("0.1"):
        return d.exp() - 1
    term = total = d
    k = 1
    while True:
        k += 1
        term = term * d / k
        if abs(term) <= _small(total):
            return total
        total += term


def _js_element(la, lb, p: Decimal, q: Decimal) -> Decimal:
    """One element's share of JS(p || q), as a sum of non-negative terms (no cancellation near p = q).

    With s = p + q and x = (p - q) / (p + q), the element p ln(2p/s) / 2 + q ln(2q/s) / 2 is s g(x) / 4 with
    g(x) = (1 + x) ln(1 + x) + (1 - x) ln(1 - x) = sum_{k>=1} x^(2k) / (k (2k - 1)), every term >= 0. x comes from
    the log-probabilities' difference d = ln p - ln q (exact): x = tanh(d / 2) = expm1(d) / (expm1(d) + 2), so
    near p = q it keeps full relative precision where p - q would not. For |x| > 1/2 the closed form, from
    e^d directly (1 + x = 2 e^d / (e^d + 1), 1 - x = 2 / (e^d + 1)), loses less than a digit."""
    if la == -math.inf or lb == -math.inf:  # one support without the other (both -inf: la == lb, skipped)
        return (p + q) * _ln2() / 2  # g(+-1) = 2 ln 2
    d = _D(la) - _D(lb)
    if abs(d) < Decimal("0.1"):
        e = _expm1(d)
        x = e / (e + 2)
    else:
        ed = d.exp()
        x = (ed - 1) / (ed + 1)
    if abs(x) <= Decimal("0.5"):
        x2 = x * x
        power = total = x2
        k = 1
        while True:
            k += 1
            power *= x2
            term = power / (k * (2 * k - 1))
            if term <= _small(total):
                break
            total += term
        g = total
    else:
        ed = d.exp()
        hi, lo = 2 * ed / (ed + 1), 2 / (ed + 1)
        g = (hi * hi.ln() if hi > 0 else Decimal(0)) + (lo * lo.ln() if lo > 0 else Decimal(0))
    return (p + q) * g / 4


def js_ratio_dec(la: list[float], lb: list[float], pa: list[Decimal] | None = None,
                 pb: list[Decimal] | None = None) -> Decimal:
    """min(1, JS(p || q) / ln 2) for one pair of log-probability rows, as a Decimal.

    JS = (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2, summed element by element, each element written as
    a sum of non-negative terms (`_js_element`): the textbook p ln(p/m) + q ln(q/m) cancels for near-identical
    rows (two terms of opposite sign leave O(delta^2)), which left it up to 1e-9 off at 28 digits. pa / pb may
    pass exp_row(la) / exp_row(lb) computed once for several pairs."""
    with _ctx():
        p = pa if pa is not None else [_exp(x) for x in la]
        q = pb if pb is not None else [_exp(x) for x in lb]
        total = Decimal(0)
        for lai, lbi, pi, qi in zip(la, lb, p, q):
            if lai == lbi:  # p = q: the element is exactly 0
                continue
            total += _js_element(lai, lbi, pi, qi)
        r = total / _ln2()
        # JS / ln 2 lies in [0, 1] for distributions; inputs rounded to a low-precision
        # dtype no longer sum to 1 exactly, so the contract's clamp is applied here too
        return min(Decimal(1), max(Decimal(0), r))


def js_distance_ref(la: list[float], lb: list[float]) -> float:
    """sqrt(JS / ln 2) for one pair of rows (float64 result)."""
    with _ctx():
        return float(js_ratio_dec(la, lb).sqrt())


def beta_schedule_ref(step: float, warmup_steps: float, beta_max: float) -> float:
    """beta_max * (3x^2 - 2x^3), x = clamp(step / warmup, 0, 1), in exact rationals."""
    if step < 0:
        return 0.0
    if warmup_steps <= 0:
        return float(beta_max)
    x = Fraction(step) / Fraction(warmup_steps)
    x = min(Fraction(1), max(Fraction(0), x))
    return float(Fraction(beta_max) * (3 * x * x - 2 * x * x * x))


def credit_weights_ref(
    logp_all: list,  # [B][T][V] floats
    logp_loo: list,  # [K][B][T][V] floats (entry k may be None: empty block)
    mask: list,  # [B][T] bools
    beta: float,
    empty: list | None = None,  # [K][B] bools
) -> list:
    """w [K][B][T]: (1 - beta) + beta q/qbar on valid tokens, 1 if empty or qbar = 0, 0 on padding."""
    K, B = len(logp_loo), len(logp_all)
    out = []
    p_all: dict = {}  # exp of the full-context rows, shared by every reward
    with _ctx():
        bd = _D(beta)
        for k in range(K):
            wk = []
            for b in range(B):
                T = len(mask[b])
                valid = [t for t in range(T) if mask[b][t]]
                is_empty = logp_loo[k] is None or (empty is not None and empty[k][b])
                q = {}
                if not is_empty:
                    for t in valid:
                        if (b, t) not in p_all:
                            p_all[b, t] = exp_row(logp_all[b][t])
                        q[t] = js_ratio_dec(logp_all[b][t], logp_loo[k][b][t], pa=p_all[b, t]).sqrt()
                qbar = sum(q.values(), Decimal(0)) / len(valid) if (valid and not is_empty) else Decimal(0)
                row = []
                for t in range(T):
                    if not mask[b][t]:
                        row.append(0.0)
                    elif is_empty or qbar == 0:
                        row.append(1.0)
                    else:
                        row.append(float((1 - bd) + bd * q[t] / qbar))
                wk.append(row)
            out.append(wk)
    return out


def log_softmax_dec(row: list[float]) -> list[Decimal]:
    """ln softmax of one row of logits, as Decimals: x - max - ln(sum exp(x - max))."""
    with _ctx():
        top = max(_D(x) for x in row)
        shifted = [_D(x) - top for x in row]
        lse = sum((x.exp() for x in shifted), Decimal(0)).ln()
        return [x - lse for x in shifted]


def credit_weights_from_logits_ref(logits_all: list, logits_loo: list, mask: list, beta: float,
                                   empty: list | None = None) -> list:
    """w [K][B][T] from logits: each valid row log-softmaxed in decimal arithmetic (never rounded to a float), then
    credit_weights_ref; masked rows are never read (junk there changes nothing)."""
    def normalised(x):
        return [[log_softmax_dec(x[b][t]) if mask[b][t] else None for t in range(len(mask[b]))]
                for b in range(len(mask))]

    return credit_weights_ref(normalised(logits_all), [None if x is None else normalised(x) for x in logits_loo],
                              mask, beta, empty)


def mrtpo_advantages_ref(reward_adv: list, weights: list, mask: list, eps: float) -> tuple[list, float, float]:
    """(A [B][T], s, std) by the page's Appendix D, one scalar at a time."""
    K, B = len(reward_adv), len(reward_adv[0])
    with _ctx():
        e = _D(eps)
        valid = [[t for t in range(len(mask[b])) if mask[b][t]] for b in range(B)]
        U = [sum((_D(reward_adv[k][b]) for k in range(K)), Decimal(0)) if valid[b] else Decimal(0) for b in range(B)]
        S = {}
        for b in range(B):
            for t in valid[b]:
                S[b, t] = sum((_D(reward_adv[k][b]) * _D(weights[k][b][t]) for k in range(K)), Decimal(0))
        D = {bt: S[bt] - U[bt[0]] for bt in S}
        mom_u = sum((len(valid[b]) * U[b] * U[b] for b in range(B)), Decimal(0))
        mom_d = sum((d * d for d in D.values()), Decimal(0))
        s = min(Decimal(1), (mom_u / mom_d).sqrt()) if mom_d > 0 else Decimal(1)
        St = {bt: U[bt[0]] + s * D[bt] for bt in D}
        n = len(St)
        if n:
            mean = sum(St.values(), Decimal(0)) / n
            std = (sum(((v - mean) ** 2 for v in St.values()), Decimal(0)) / n).sqrt()
        else:
            std = Decimal(0)
        A = [[float(St[b, t] / (std + e)) if (b, t) in St else 0.0 for t in range(len(mask[b]))] for b in range(B)]
        return A, float(s), float(std)


def second_moments_ref(reward_adv: list, weights: list, mask: list) -> tuple[float, float]:
    """(sum_j T_j U_j^2, sum_{j,t} D_j,t^2) of Appendix D, over valid tokens, one scalar at a time."""
    K, B = len(reward_adv), len(reward_adv[0])
    with _ctx():
        mom_u = mom_d = Decimal(0)
        for b in range(B):
            valid = [t for t in range(len(mask[b])) if mask[b][t]]
            u = sum((_D(reward_adv[k][b]) for k in range(K)), Decimal(0))
            mom_u += len(valid) * u * u
            for t in valid:
                d = sum((_D(reward_adv[k][b]) * _D(weights[k][b][t]) for k in range(K)), Decimal(0)) - u
                mom_d += d * d
        return float(mom_u), float(mom_d)


def gdpo_uniform_ref(reward_adv: list, mask: list, eps: float) -> list:
    """GDPO-style uniform allocation: every valid token of response b gets U_b / (std + eps),
    the std taken over the batch's valid tokens (each response counted once per valid token)."""
    K, B = len(reward_adv), len(reward_adv[0])
    with _ctx():
        vals = []
        U = []
        for b in range(B):
            u = sum((_D(reward_adv[k][b]) for k in range(K)), Decimal(0))
            U.append(u)
            vals.extend([u] * sum(1 for x in mask[b] if x))
        if vals:
            mean = sum(vals, Decimal(0)) / len(vals)
            std = (sum(((v - mean) ** 2 for v in vals), Decimal(0)) / len(vals)).sqrt()
        else:
            std = Decimal(0)
        return [[float(U[b] / (std + _D(eps))) if mask[b][t] else 0.0 for t in range(len(mask[b]))] for b in range(B)]


# --- the same references and the MRTPO sample inputs, registered for the generic kinds (engine/kinds) ----------


def _register() -> None:
    import torch

    from engine.kinds.inputs import generator
    from engine.spec import registry
    from methods.mrtpo.cases import PAIR_KINDS, conserved_weights, credit_batch, logp_pair, response_mask

    @registry.reference("mrtpo.js_distance")
    def js_rows(logp_a, logp_b, chunk_elems=None):
        """sqrt(JS / ln 2) per row of [..., V] float64 inputs, by the per-scalar decimal reference."""
        lead, V = logp_a.shape[:-1], logp_a.shape[-1]
        rows = zip(logp_a.reshape(-1, V).tolist(), logp_b.reshape(-1, V).tolist())
        return torch.tensor([js_distance_ref(x, y) for x, y in rows], dtype=torch.float64).reshape(lead)

    @registry.reference("mrtpo.credit_weights")
    def weights(logp_all, logp_loo, mask, beta, empty_block=None, chunk_elems=None):
        """w [K, B, T] by the per-scalar decimal reference (empty_block [K, B] or None)."""
        loo = [None if x is None else x.tolist() for x in logp_loo]
        empty = None if empty_block is None else empty_block.to(torch.bool).tolist()
        return torch.tensor(credit_weights_ref(logp_all.tolist(), loo, mask.to(torch.bool).tolist(), float(beta),
                                               empty), dtype=torch.float64)

    @registry.reference("mrtpo.credit_weights_from_logits")
    def weights_from_logits(logits_all, logits_loo, mask, beta, empty_block=None, chunk_elems=None, block_elems=None):
        """w [K, B, T] from logits by the per-scalar decimal reference (log-softmax included; masked rows unread)."""
        loo = [None if x is None else x.tolist() for x in logits_loo]
        empty = None if empty_block is None else empty_block.to(torch.bool).tolist()
        return torch.tensor(credit_weights_from_logits_ref(logits_all.tolist(), loo, mask.to(torch.bool).tolist(),
                                                           float(beta), empty), dtype=torch.float64)

    @generator("mrtpo.logits_batch")
    def logits_batch(g, case, ctx, inputs):
        """A credit_weights_from_logits batch: K <= 3 contexts of logits (not near-identical ones: there q is below
        the log-softmax's own rounding, so the weights measure that rounding, not the path), NaN in masked rows, responses with padding (an empty one every other case), empty blocks,
        several blocks of valid rows with a partial last one (block_elems; a block smaller than one row every fourth
        case), a column-blocked JS inside every other case (chunk_elems < V), and in one case of four the contexts
        as a list with an empty block given as None."""
        K, B, T, V = _int(g, 1, 3), _int(g, 2, 5), _int(g, 2, 7), _int(g, 8, 40)
        scale = 0.5 + 3.0 * float(torch.rand((), generator=g))
        la = torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale
        loo = torch.stack([la + torch.randn(B, T, V, generator=g, dtype=torch.float64) * scale * 0.5
                           for _ in range(K)])
        mask = response_mask(g, B, T)
        if case % 2 and B > 2:
            mask[-1] = False
        keep = mask[:, :, None].expand(B, T, V)
        la = torch.where(keep, la, math.nan)  # masked rows are never read
        loo = torch.where(keep[None], loo, math.nan)
        empty = torch.rand(K, B, generator=g) < 0.2
        beta = {3: 0.0, 6: 1.0}.get(case % 8, float(torch.rand((), generator=g, dtype=torch.float64)))
        n_valid = int(mask.sum())
        rows = _int(g, 1, max(1, n_valid - 1))
        block = V - 1 if case % 4 == 3 else rows * V  # one row a block, or several rows with a partial last block
        chunk = V - 3 if case % 2 else 1 << 20
        if case % 4 == 1:  # the list form, one reward's block empty given as None
            loo = [None if k == case % K else x for k, x in enumerate(loo)] if K > 1 else [None]
        return {"logits_all": la, "logits_loo": loo, "mask": mask, "empty": empty, "beta": beta, "chunk": chunk,
                "block": block, "__dims__": {"K": K, "B": B, "T": T, "V": V}}

    @registry.reference("mrtpo.advantages")
    def advantages(reward_advantages, weights, mask, eps=1e-6):
        """A [B, T] by the per-scalar Appendix D reference; scale max(1, max |A|) (A grows without bound as the
        batch std shrinks), the cap s as a reported scalar, and whether the cap binds (s < 1)."""
        m = mask.to(torch.bool)
        A, s, std = mrtpo_advantages_ref(reward_advantages.tolist(), weights.tolist(), m.tolist(), float(eps))
        mom_u, mom_d = second_moments_ref(reward_advantages.tolist(), weights.tolist(), m.tolist())
        value = torch.tensor(A, dtype=torch.float64)
        scale = max(1.0, float(value.abs().max()) if value.numel() else 0.0)
        return {"value": value, "scale": scale, "counts": {"binding_cases": int(s < 1.0)},
                "scalars": {"s": s, "std": std, "second_moment_U": mom_u, "second_moment_D": mom_d}}

    @registry.reference("mrtpo.gdpo_uniform")
    def gdpo_uniform(reward_advantages, weights, mask, eps=1e-6):
        """GDPO's uniform allocation U / (std + eps) on every valid token (the weights are not read: this is what
        MRTPO must reduce to when they are all 1); scale max(1, max |A|), as advantages_reference."""
        value = torch.tensor(gdpo_uniform_ref(reward_advantages.tolist(), mask.to(torch.bool).tolist(), float(eps)),
                             dtype=torch.float64)
        return {"value": value, "scale": max(1.0, float(value.abs().max()) if value.numel() else 0.0)}

    @registry.reference("mrtpo.reward_sum")
    def reward_sum(reward_advantages, weights, mask, eps=1e-6):
        """U_b = sum_k A_k,b per response: the credit the token credits of response b must average to."""
        return torch.tensor([math.fsum(col) for col in zip(*reward_advantages.tolist())], dtype=torch.float64)

    def _int(g, lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (), generator=g))

    @generator("mrtpo.logp_pairs")
    def pairs(g, case, ctx, inputs):
        """Two [rows, V] log-distributions of the case's regime (PAIR_KINDS, in turn): unrelated, nearly
        identical, peaked, exact zeros, disjoint supports, -1e4 entries."""
        from engine.kinds.inputs import _dim

        rows = _dim((inputs.get("dims") or {}).get("N", 4), g)  # the spec declares N (a range); V is drawn per case
        regimes = (inputs.get("options") or {}).get("regimes") or PAIR_KINDS
        regime = regimes[case % len(regimes)]
        if regime.startswith("onehot"):  # one-hot rows, -inf or -1e4 elsewhere; b the next row's one-hot
            V = 8
            a = torch.full((V, V), -math.inf if regime == "onehot_inf" else -1.0e4, dtype=torch.float64)
            a.fill_diagonal_(0.0)
            return {"logp_a": a, "logp_b": a.roll(1, dims=1), "__dims__": {"N": V, "V": V}}
        V = _int(g, 2, 40)
        a, b = logp_pair(g, rows, V, regime)
        return {"logp_a": a, "logp_b": b, "__dims__": {"N": rows, "V": V}}

    @generator("mrtpo.credit_batch")
    def batch(g, case, ctx, inputs):
        """A credit_weights batch: K rewards of mixed regimes, responses with padding (an empty one every other
        case), empty blocks, a reward whose block changes nothing (identical distributions) every third case, beta
        0 (case 3 of eight), 1 (case 6) or random."""
        opt = inputs.get("options") or {}
        min_b = int(opt.get("min_b", 1))  # 2: at least two responses with tokens (a batch std that is not 0)
        K, B = _int(g, 1, int(opt.get("max_k", 3))), _int(g, min_b, int(opt.get("max_b", 4)))
        max_v = opt.get("max_v", 24)  # a list is cycled by case (small vocabularies, V < T, and large ones)
        max_v = max_v[case % len(max_v)] if isinstance(max_v, list) else max_v
        T = _int(g, int(opt.get("min_t", 1)), int(opt.get("max_t", 6)))
        V = _int(g, int(opt.get("min_v", 2)), int(max_v))
        logp_all, logp_loo = credit_batch(g, K, B, T, V)
        mask = response_mask(g, B, T)
        if case % 2 and B > max(1, min_b):  # a response without a valid token in every other case
            mask[-1] = False
        # empty blocks per (reward, response), or per reward ([K], the other form credit_weights takes)
        empty = torch.rand(K, 1 if opt.get("empty_per_reward") else B, generator=g) < 0.2
        empty = empty[:, 0] if opt.get("empty_per_reward") else empty
        if case % 3 == 2:  # a reward whose block changes nothing: identical distributions (qbar = 0)
            logp_loo[_int(g, 0, K - 1)] = logp_all.clone()
        # the ends of [0, 1] in two cases of every eight, a random beta otherwise; or the declared beta, or a
        # beta in [0.5, 1] in half the cases (beta_high) where redistribution must matter
        beta = {3: 0.0, 6: 1.0}.get(case % 8, float(torch.rand((), generator=g, dtype=torch.float64)))
        if "beta" in opt:
            beta = float(opt["beta"])
        elif opt.get("beta_range"):  # [low, high]: drawn uniformly in every case
            lo, hi = opt["beta_range"]
            beta = lo + (hi - lo) * float(torch.rand((), generator=g, dtype=torch.float64))
        elif opt.get("beta_high") and case % 2 == 0:
            beta = 0.5 + 0.5 * float(torch.rand((), generator=g, dtype=torch.float64))
        out = {"logp_all": logp_all, "logp_loo": logp_loo, "mask": mask, "empty": empty, "beta": beta,
               "__dims__": {"K": K, "B": B, "T": T, "V": V}}
        if opt.get("radv"):  # reward advantages [K, B] for the advantages downstream of the weights
            out["radv"] = torch.randn(K, B, generator=g, dtype=torch.float64)
            if opt.get("small_radv") and case % 2:  # a tiny credit (sum T U^2 far below 1): the cap s must stay 1
                out["radv"] = out["radv"] * 1.0e-3
        if opt.get("none_blocks"):  # every reward's block empty, given as None (a tie source, not a tensor)
            out["none_blocks"] = [None] * K
        if opt.get("weights"):  # weights [K, B, T] of mean 1 per response (0 on padding), as an input
            out["weights"] = conserved_weights(g, K, B, T, mask, spread=1.0)
        return out


    @generator("mrtpo.advantage_batch")
    def advantage_batch(g, case, ctx, inputs):
        """Reward advantages [K, B] and conserved weights [K, B, T] (positive, mean 1 over each response's valid
        tokens, 0 on padding); odd cases spread the weights widely (the cap binds), even ones barely."""
        opt = inputs.get("options") or {}
        K, B = _int(g, int(opt.get("min_k", 1)), 3), _int(g, int(opt.get("min_b", 2)), int(opt.get("max_b", 6)))
        T = _int(g, int(opt.get("min_t", 1)), int(opt.get("max_t", 8)))
        mask = response_mask(g, B, T)
        spread = 3.0 if case % 2 else 0.05
        if opt.get("spread"):  # [low, high]: the spread drawn uniformly per case
            lo, hi = opt["spread"]
            spread = lo + (hi - lo) * float(torch.rand((), generator=g, dtype=torch.float64))
        w = conserved_weights(g, K, B, T, mask, spread=spread)
        radv = torch.randn(K, B, generator=g, dtype=torch.float64)
        if opt.get("flip"):  # one reward's sign flipped (reward case % K): the weights serve both signs
            radv[case % K] = -radv[case % K]
        return {"radv": radv, "weights": w, "mask": mask, "__dims__": {"K": K, "B": B, "T": T}}


_register()


# --- the scale tier: the same formulas at the page's vocabulary and training lengths -------------------------------
# The decimal references cost about 0.1 ms per vocabulary entry: 15 s for one row of 150k. Here each element is a
# float64 tensor operation (the textbook KL-to-the-mixture form, another computation than the implementation's
# tanh form in float32) and every sum is exact (methods/common/exact.py); tests/test_scale.py holds them to the
# decimal references on small inputs.


def _scale_register() -> None:
    import torch

    from engine.spec import registry
    from methods.common.exact import fsum, fsum_rows

    f64 = torch.float64
    ln2 = math.log(2.0)

    def js_f64(la: torch.Tensor, lb: torch.Tensor) -> torch.Tensor:
        """sqrt(min(1, JS / ln 2)) of each row of two [n, V] float64 log-distributions (-inf allowed)."""
        if la.shape[0] == 0:
            return torch.zeros(0, dtype=f64)
        lm = torch.logaddexp(la, lb) - ln2
        same = la == lb  # p = q = m: exactly 0 (ln m would only round to ln p)
        p, q = la.exp(), lb.exp()
        t = torch.where((p > 0) & ~same, p * (la - lm), 0.0) + torch.where((q > 0) & ~same, q * (lb - lm), 0.0)
        # float64 pairwise sums over V: at most about log2(V) * 1.1e-16 * sum |t| off, 1e-15 at the page's
        # vocabulary, where the float32 tolerances are 1e-6 (an exact fsum costs half a second a million entries)
        return (t.sum(-1) / 2.0 / ln2).clamp(0.0, 1.0).sqrt()

    @registry.reference("mrtpo.js_distance_f64")
    def js_rows(logp_a, logp_b, chunk_elems=None):
        lead, V = logp_a.shape[:-1], logp_a.shape[-1]
        return js_f64(logp_a.reshape(-1, V).to(f64), logp_b.reshape(-1, V).to(f64)).reshape(lead)

    def weights_f64(logp_all, logp_loo, mask, beta, empty_block=None):
        m = mask.to(torch.bool)
        B, T, V = logp_all.shape
        loo = [logp_loo[k] for k in range(logp_loo.shape[0])] if isinstance(logp_loo, torch.Tensor) else list(logp_loo)
        K = len(loo)
        empty = torch.zeros(K, B, dtype=torch.bool) if empty_block is None else empty_block.to(torch.bool)
        empty = empty[:, None].expand(K, B) if empty.dim() == 1 else empty.expand(K, B)
        rows = m.reshape(-1).nonzero().flatten()
        full = logp_all.reshape(-1, V).index_select(0, rows).to(f64)
        count = m.sum(-1)
        out = torch.zeros(K, B, T, dtype=f64)
        for k, lk in enumerate(loo):
            w = torch.ones(B, T, dtype=f64)
            if lk is not None:
                q = torch.zeros(B * T, dtype=f64)
                q[rows] = js_f64(full, lk.reshape(-1, V).index_select(0, rows).to(f64))
                q = q.reshape(B, T)
                qbar = fsum_rows(q) / count.clamp_min(1).to(f64)
                uniform = empty[k] | (qbar == 0)
                ratio = q / torch.where(uniform, torch.ones_like(qbar), qbar)[:, None]
                w = torch.where(uniform[:, None], w, (1.0 - float(beta)) + float(beta) * ratio)
            out[k] = torch.where(m, w, 0.0)
        return out

    @registry.reference("mrtpo.credit_weights_f64")
    def weights(logp_all, logp_loo, mask, beta, empty_block=None, chunk_elems=None):
        """w [K, B, T]: `credit_weights_ref` at the page's vocabulary."""
        return weights_f64(logp_all, logp_loo, mask, beta, empty_block)

    @registry.reference("mrtpo.credit_weights_from_logits_f64")
    def weights_from_logits(logits_all, logits_loo, mask, beta, empty_block=None, chunk_elems=None, block_elems=None):
        """The same weights from logits, each context log-softmaxed in float64 first."""
        loo = [logits_loo[k] for k in range(logits_loo.shape[0])] if isinstance(logits_loo, torch.Tensor) \
            else list(logits_loo)
        return weights_f64(logits_all.to(f64).log_softmax(-1),
                           [None if x is None else x.to(f64).log_softmax(-1) for x in loo], mask, beta, empty_block)

    @registry.reference("mrtpo.advantages_f64")
    def advantages(reward_advantages, weights, mask, eps=1e-6):
        """`mrtpo_advantages_ref` at training lengths: S, U, D per token in float64, the moments, the mean and
        the std summed exactly; scale max(1, max |A|), the cap s as a reported scalar, and whether it binds."""
        m = mask.to(torch.bool)
        count = m.sum(-1)
        a = torch.where((count > 0)[None], reward_advantages.to(f64), 0.0)
        w = torch.where(m[None], weights.to(f64), 0.0)
        S = torch.where(m, (a[:, :, None] * w).sum(0), 0.0)  # K <= 3 terms a token
        U = a.sum(0)
        D = torch.where(m, S - U[:, None], 0.0)
        mom_u = fsum(count.to(f64) * U * U)
        mom_d = fsum(D * D)
        s = min(1.0, math.sqrt(mom_u / mom_d)) if mom_d > 0 else 1.0
        St = torch.where(m, U[:, None] + s * D, 0.0)
        n = int(count.sum())
        mean = fsum(St) / n if n else 0.0
        std = math.sqrt(fsum(torch.where(m, St - mean, 0.0) ** 2) / n) if n else 0.0
        A = torch.where(m, St / (std + float(eps)), 0.0)
        return {"value": A, "scale": max(1.0, float(A.abs().max()) if A.numel() else 0.0), "scalars": {"s": s},
                "counts": {"binding_cases": int(s < 1.0)}}

    import engine.kinds.inputs as inputs_mod

    @inputs_mod.generator("mrtpo.page_vocab_pairs")
    def page_pairs(g, case, ctx, inputs):
        """Two [N, V] log-distributions at the page's vocabulary: options rows [lo, hi] and vocab [lo, hi] drawn
        per case, the regime (options regimes) by case."""
        from methods.mrtpo.cases import logp_pair

        opt = inputs.get("options") or {}
        rows = int(torch.randint(opt["rows"][0], opt["rows"][1] + 1, (), generator=g))
        V = int(torch.randint(opt["vocab"][0], opt["vocab"][1] + 1, (), generator=g))
        regimes = opt.get("regimes") or ["random"]
        a, b = logp_pair(g, rows, V, regimes[case % len(regimes)])
        return {"logp_a": a, "logp_b": b, "__dims__": {"N": rows, "V": V}}

    @inputs_mod.generator("mrtpo.page_vocab_batch")
    def page_batch(g, case, ctx, inputs):
        """A credit_weights batch at the page's vocabulary, drawn lean (one normal draw a context): logp_all
        [B, T, V] the log-softmax of spread logits, each reward's leave-one-out context those logits plus noise
        of its own size (1e-3 to 1: nearly identical to unrelated), prefix masks (the first row full), empty
        blocks with probability 0.2, beta uniform in [0, 1]. options: k, b, t, vocab as [lo, hi]."""
        from methods.mrtpo.cases import response_mask

        opt = inputs.get("options") or {}

        def draw_int(key, default):
            lo, hi = opt.get(key, default)
            return int(torch.randint(lo, hi + 1, (), generator=g))

        K, B, T, V = draw_int("k", [1, 3]), draw_int("b", [1, 2]), draw_int("t", [1, 6]), draw_int("vocab", [2, 24])
        logits = torch.randn(B, T, V, generator=g, dtype=f64) * (0.5 + 1.5 * float(torch.rand((), generator=g)))
        loo = []
        for _ in range(K):
            noise = 10.0 ** (-3.0 + 3.0 * float(torch.rand((), generator=g, dtype=f64)))
            loo.append((logits + noise * torch.randn(B, T, V, generator=g, dtype=f64)).log_softmax(-1))
        mask = response_mask(g, B, T)
        empty = torch.rand(K, B, generator=g) < 0.2
        beta = float(torch.rand((), generator=g, dtype=f64))
        return {"logp_all": logits.log_softmax(-1), "logp_loo": torch.stack(loo, 0), "mask": mask, "empty": empty,
                "beta": beta, "__dims__": {"K": K, "B": B, "T": T, "V": V}}


_scale_register()
