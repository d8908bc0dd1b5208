"""Independent per-scalar references for the MRTPO checks (no torch arithmetic).

Every reference works on plain Python floats, one scalar at a time, in
decimal arithmetic with 28 significant digits (the `decimal` module), and
rounds to a float64 only at the end. Its own error is far below float64
rounding, so a measured difference is the implementation's error. The
formulas are the page's, written the textbook way (KL to the mixture,
explicit loops), independently of the vectorised implementation.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction
from functools import lru_cache

PREC = 28


def _ctx():
    return localcontext(prec=PREC)


def _D(x: float) -> Decimal:
    return Decimal(float(x))  # exact: every float is a finite decimal


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


def js_ratio_dec(la: list[float], lb: list[float], pa: list[Decimal] | None = None,
                 pb: list[Decimal] | None = None) -> Decimal:
    """min(1, JS(p || q) / ln 2) for one pair of log-probability rows, as a Decimal.

    JS = (KL(p || m) + KL(q || m)) / 2 with m = (p + q) / 2, summed element by
    element; ln p is the given log-probability itself (exact), so each element
    costs two exponentials and one logarithm. pa / pb may pass exp_row(la) /
    exp_row(lb) computed once for several pairs."""
    with _ctx():
        p = pa if pa is not None else [_exp(x) for x in la]
        q = pb if pb is not None else [_exp(x) for x in lb]
        total = Decimal(0)
        for lai, lbi, pi, qi in zip(la, lb, p, q):
            if lai == lbi:  # p = q = m: the element is exactly 0 (ln m would only round to ln p)
                continue
            lm = ((pi + qi) / 2).ln()
            if pi > 0:
                total += pi * (_D(lai) - lm)
            if qi > 0:
                total += qi * (_D(lbi) - lm)
        r = total / 2 / _ln2()
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
        rows = int((inputs.get("dims") or {}).get("N", 4))  # the spec declares N; V is drawn per case
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
        K, B = _int(g, 1, 3), _int(g, min_b, int(opt.get("max_b", 4)))
        max_v = opt.get("max_v", 24)  # a list is cycled by case (small vocabularies, V < T, and large ones)
        max_v = max_v[case % len(max_v)] if isinstance(max_v, list) else max_v
        T, V = _int(g, 1, int(opt.get("max_t", 6))), _int(g, 2, int(max_v))
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
        K, B, T = _int(g, int(opt.get("min_k", 1)), 3), _int(g, 2, 6), _int(g, 1, 8)
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
