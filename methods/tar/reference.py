"""Independent references for the TAR checks: loops in exact rationals or 40-digit decimals, each result rounded to a
float64 once; no torch math.

Nothing here imports the method's code. `fps_per_prompt_loop` is the one
exception to "no torch": it is the naive per-prompt torch loop the vectorised
FPS is benchmarked against (same rule, one prompt at a time).
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Sequence

import torch

# The spec's fps_ties assumption, restated here rather than imported from the method: max-min
# distances within this of the largest are a tie, which the lowest index wins.
TIE_TOL = 1e-12

DENOM_EPS = 1e-8


# --- soft gate and replay loss -------------------------------------------------


_PREC = 40  # decimal digits of the loops below: each result is rounded to a float64 once


def _phi_dec(z: Decimal) -> Decimal:
    """max(1 - e^-z, 0) in decimals: the Taylor series of -expm1(-z) for small z, where 1 - e^-z would cancel."""
    if z <= 0:
        return Decimal(0)
    if z >= Decimal("0.1"):
        return 1 - (-z).exp()
    term = total = z
    k = 1
    while True:
        k += 1
        term = -term * z / k
        if abs(term) <= abs(total) * Decimal(10) ** -(_PREC + 3):
            return total
        total += term


def phi(z: float) -> float:
    """max(1 - e^-z, 0) for a Python float, correctly rounded (0 for z <= 0, NaN stays NaN)."""
    if math.isnan(z):
        return math.nan
    with localcontext(prec=_PREC):
        return float(_phi_dec(Decimal(z)))


def replay_reference(
    logp_theta: Sequence[Sequence[float]],
    logp_base: Sequence[Sequence[float]],
    mask: Sequence[Sequence[bool]],
):
    """Loss, analytic gradient d L / d logp_theta, gates and weights, by loops in 40-digit decimals, each result
    rounded to a float64 once (the contracts hold gates and weights to 1e-14, which a float64 loop rounding at
    every step could not be certified against).

    L = (1/B) sum_b g_b * sum_t w_bt (-l_bt) / (1e-8 + sum_t w_bt)
    dL/dl_bt = -(1/B) g_b w_bt / (1e-8 + sum_t w_bt) at valid t, 0 elsewhere.
    """
    B = len(logp_theta)
    grad, gates, weights = [], [], []
    with localcontext(prec=_PREC):
        eps = Decimal(DENOM_EPS)
        loss = Decimal(0)
        for b in range(B):
            valid = [t for t, v in enumerate(mask[b]) if v]
            lt = {t: Decimal(float(logp_theta[b][t])) for t in valid}
            deltas = {t: Decimal(float(logp_base[b][t])) - lt[t] for t in valid}
            mean = sum(deltas.values(), Decimal(0)) / len(valid) if valid else Decimal(0)
            g = _phi_dec(mean)
            w = {t: _phi_dec(d) for t, d in deltas.items()}
            den = eps + sum(w.values(), Decimal(0))
            loss += g * sum((w[t] * -lt[t] for t in valid), Decimal(0)) / den
            grad.append([float(-g * w[t] / den / B) if t in w else 0.0 for t in range(len(mask[b]))])
            gates.append(float(g))
            weights.append([float(w[t]) if t in w else 0.0 for t in range(len(mask[b]))])
        return (float(loss / B) if B else 0.0), grad, gates, weights


# --- farthest-point sampling ---------------------------------------------------


def cosine_distance(a: Sequence[float], b: Sequence[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b))
    na = math.sqrt(math.fsum(x * x for x in a))
    nb = math.sqrt(math.fsum(y * y for y in b))
    return 1.0 - dot / (na * nb)


def _groups(n: int, prompt_ids) -> list[tuple[int, list[int]]]:
    ids = [0] * n if prompt_ids is None else [int(p) for p in prompt_ids]
    out: dict[int, list[int]] = {}
    for i, p in enumerate(ids):
        out.setdefault(p, []).append(i)
    return sorted(out.items())


def fps_bruteforce(embeddings, correct, k: int = 3, prompt_ids=None) -> list[int]:
    """Greedy max-min FPS by explicit loops over candidates, in Python floats.

    First point: the lowest-index correct candidate of each prompt. Then the
    correct, unchosen candidate with the largest min-distance to the chosen
    set; the lowest index among those within TIE_TOL of the largest wins.
    """
    E = [[float(v) for v in row] for row in embeddings]
    C = [bool(c) for c in correct]
    out: list[int] = []
    for _, members in _groups(len(E), prompt_ids):
        cand = [i for i in members if C[i]]
        chosen: list[int] = []
        while cand and len(chosen) < k:
            if not chosen:
                best = cand[0]
            else:
                scores = [min(cosine_distance(E[i], E[j]) for j in chosen) for i in cand]
                top = max(scores)
                best = next(i for i, s in zip(cand, scores) if s >= top - TIE_TOL)
            chosen.append(best)
            cand.remove(best)
        out.extend(chosen)
    return out


def fps_maxmin_gap(embeddings, correct, picks: Sequence[int], prompt_ids=None) -> float:
    """Largest shortfall of a pick's min-distance below the best available at that step.

    Walks the given picks per prompt (any tie-break) and, at each step after
    the first, compares the chosen candidate's min cosine distance to the
    already-chosen set with the best over all correct unchosen candidates.
    0 for an exact greedy max-min sequence; inf if a pick is not a correct
    candidate of its prompt.
    """
    E = [[float(v) for v in row] for row in embeddings]
    C = [bool(c) for c in correct]
    ids = [0] * len(E) if prompt_ids is None else [int(p) for p in prompt_ids]
    by_prompt: dict[int, list[int]] = {}
    for i in picks:
        by_prompt.setdefault(ids[i], []).append(int(i))
    gap = 0.0
    for p, seq in by_prompt.items():
        pool = [i for i in range(len(E)) if ids[i] == p and C[i]]
        for s, i in enumerate(seq):
            if i not in pool:
                return math.inf
            if s == 0:
                continue
            chosen = seq[:s]
            rest = [j for j in pool if j not in chosen]
            best = max(min(cosine_distance(E[j], E[c]) for c in chosen) for j in rest)
            mine = min(cosine_distance(E[i], E[c]) for c in chosen)
            gap = max(gap, best - mine)
    return gap


def fps_per_prompt_loop(embeddings: torch.Tensor, correct: torch.Tensor, k: int = 3, prompt_ids=None,
                        unit=None) -> torch.Tensor:
    """The naive implementation: a Python loop over prompts, torch inside each one.

    Same rule as the vectorised function (float64, lowest index first and on
    ties); the baseline of the FPS benchmark. No input validation. `unit`
    replaces the division by the norm (the FPS mutants plant their defects there).
    """
    device = embeddings.device
    N = embeddings.shape[0]
    ids = torch.zeros(N, dtype=torch.long, device=device) if prompt_ids is None else torch.as_tensor(prompt_ids, device=device)
    correct = torch.as_tensor(correct, device=device).bool()
    out = []
    for p in torch.unique(ids).tolist():
        members = torch.nonzero((ids == p) & correct).flatten()
        if members.numel() == 0:
            continue
        x = embeddings[members].double()
        x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True) if unit is None else unit(x)
        chosen = [0]
        score = 1.0 - x @ x[0]
        score[0] = -math.inf
        for _ in range(1, min(int(k), members.numel())):
            j = int(torch.nonzero(score >= score.max() - TIE_TOL)[0])
            chosen.append(j)
            score = torch.minimum(score, 1.0 - x @ x[j])
            score[chosen] = -math.inf
        out.append(members[chosen])
    return torch.cat(out) if out else torch.empty(0, dtype=torch.long, device=device)


# --- the references the spec's kind contracts name ---------------------------------------------------------------
# Each takes exactly what the implementation received (float64 CPU copies) and wraps the loops above.

from engine.spec import registry  # noqa: E402


@registry.reference("tar.phi")
def phi_tensor(z: torch.Tensor, dtype=None) -> torch.Tensor:
    """phi element by element; NaN (not judged) where the value is positive but below the dtype's smallest
    normal number, where a relative error means nothing."""
    out = torch.tensor([phi(v) for v in z.reshape(-1).tolist()], dtype=torch.float64).reshape(z.shape)
    if dtype is not None:
        out = torch.where((out > 0) & (out < torch.finfo(dtype).tiny), torch.full_like(out, math.nan), out)
    return out


def _replay(lt, lb, mask):
    loss, grad, gates, weights = replay_reference(lt.tolist(), lb.tolist(), mask.bool().tolist())
    f64 = torch.float64
    return (loss, torch.tensor(grad, dtype=f64).reshape(lt.shape), torch.tensor(gates, dtype=f64),
            torch.tensor(weights, dtype=f64).reshape(lt.shape))


@registry.reference("tar.replay")
def replay_tensor(logp_theta, logp_base, mask) -> dict:
    """The replay loss, its gradient w.r.t. logp_theta, and counts that show a case is not vacuous."""
    loss, grad, gates, weights = _replay(logp_theta, logp_base, mask)
    m = mask.bool()
    return {"value": torch.tensor(loss, dtype=torch.float64), "grad": [grad], "scale": abs(loss),
            "counts": {"zero_gate_trajectories": int((gates == 0).sum()), "active_trajectories": int((gates > 0).sum()),
                       "positive_weight_tokens": int(((weights > 0) & m).sum())}}


def _mean_deltas(lt: list, lb: list, mask: list) -> list[float]:
    """Per row, the mean of log p_base - log p_theta over its valid tokens (0 for a row with none), in float64."""
    out = []
    for rt, rb, rm in zip(lt, lb, mask):
        d = [b - t for t, b, v in zip(rt, rb, rm) if v]
        out.append(math.fsum(d) / len(d) if d else 0.0)
    return out


@registry.reference("tar.replay_metrics")
def replay_metrics_tensor(logp_theta, logp_base, mask):
    """(loss, the metrics the implementation reports: gates, token_weights, active_fraction, mean_delta,
    weight_sum)."""
    loss, _, gates, weights = _replay(logp_theta, logp_base, mask)
    active = float((gates > 0).double().mean()) if gates.numel() else 0.0
    m = mask.bool()
    mean_delta = torch.tensor(_mean_deltas(logp_theta.tolist(), logp_base.tolist(), m.tolist()), dtype=torch.float64)
    weight_sum = torch.where(m, weights, 0.0).sum(dim=1)
    return torch.tensor(loss, dtype=torch.float64), {"gates": gates, "token_weights": weights, "active_fraction": active,
                                                     "mean_delta": mean_delta, "weight_sum": weight_sum}


@registry.reference("tar.replay_support")
def replay_support(logp_theta, logp_base, mask) -> dict:
    """Where d L / d logp_theta is non-zero: valid tokens with w_t > 0 of rows with g > 0."""
    _, _, gates, weights = _replay(logp_theta, logp_base, mask)
    m = mask.bool()
    active = (gates > 0)[:, None].expand_as(m)
    return {"support": m & active & (weights > 0),
            "counts": {"zero_weight_tokens_in_active_rows": int((m & active & ~(weights > 0)).sum())}}


@registry.reference("tar.total")
def total_tensor(grpo_loss, replay_loss, lambda_rep=1.0) -> dict:
    """L_GRPO + lambda_rep L_rep and its gradient w.r.t. both parts (1 and lambda_rep); lambda_rep's default is
    the page's 1."""
    lam = float(lambda_rep)
    # L_GRPO + lambda L_rep rounded once (exact rationals), as the contract's 1e-15 relative tolerance needs
    value = float(Fraction(float(grpo_loss)) + Fraction(lam) * Fraction(float(replay_loss)))
    return {"value": torch.tensor(value, dtype=torch.float64).reshape(grpo_loss.shape),
            "grad": [torch.ones_like(grpo_loss), torch.full_like(replay_loss, lam)]}


@registry.reference("tar.fps")
def fps_tensor(embeddings, correct, k=3, prompt_ids=None) -> dict:
    """The brute-force FPS picks, and how many prompts have no correct candidate."""
    picks = fps_bruteforce(embeddings.tolist(), correct.bool().tolist(), int(k),
                           None if prompt_ids is None else prompt_ids.tolist())
    ids = torch.zeros(len(correct), dtype=torch.long) if prompt_ids is None else prompt_ids.long()
    without = sum(int(not bool(correct.bool()[ids == p].any())) for p in torch.unique(ids).tolist())
    return {"value": torch.tensor(picks, dtype=torch.float64), "counts": {"prompts_without_correct": without}}


# The batched FPS's block size, restated (tests/test_tar.py holds it equal to methods/tar/fps.py's): a case whose
# correct rows take more than one float64 block of this many bytes drives the multi-block branch.
BLOCK_BYTES = 1 << 20


@registry.reference("tar.fps_loop")
def fps_loop_tensor(embeddings, correct, k=3, prompt_ids=None) -> dict:
    """The plain per-prompt loop's picks, and which branch of the batched FPS the case takes."""
    picks = fps_per_prompt_loop(embeddings, correct, int(k), prompt_ids)
    c = correct.bool()
    n, nc, dims = int(c.numel()), int(c.sum()), embeddings.shape[1]
    wide = prompt_ids is not None and int(prompt_ids.max() - prompt_ids.min()) + 1 > 4 * n + 4096
    blocks = -(-nc * 8 * max(1, dims) // BLOCK_BYTES) if nc else 0
    ids = torch.zeros(n, dtype=torch.long) if prompt_ids is None else prompt_ids.long()
    per = torch.bincount((ids - ids.min())[c]) if nc else torch.zeros(1, dtype=torch.long)
    counts = {"wide_id_cases": int(wide), "multi_block_cases": int(blocks > 1),
              "single_prompt_cases": int(prompt_ids is None), "k_above_count_cases": int(nc > 0 and int(per.max()) < k)}
    return {"value": picks.to(torch.float64), "counts": counts}


# --- the scale tier: the same rules at training sizes (methods/common/exact.py says why) ---------------------------


def _scale_register() -> None:
    from engine.kinds.inputs import generator
    from methods.common.exact import fsum, fsum_rows

    f64 = torch.float64

    def replay_f64(lt, lb, mask):
        """(loss, d loss / d logp_theta, gates [B], weights [B, T]): `replay_reference` per element in float64,
        the row sums (mean delta, sum w, sum w (-l)) and the mean over trajectories exact."""
        m = mask.to(torch.bool)
        zero = torch.zeros((), dtype=f64)
        lt, lb = torch.where(m, lt.to(f64), zero), torch.where(m, lb.to(f64), zero)
        delta = lb - lt
        n = m.sum(-1)
        mean = fsum_rows(delta) / n.clamp_min(1).to(f64)
        gate = torch.where((n > 0) & (mean > 0), -torch.expm1(-mean.clamp_min(0.0)), zero)
        w = torch.where(m & (delta > 0), -torch.expm1(-delta.clamp_min(0.0)), zero)
        wsum = fsum_rows(w)
        num = fsum_rows(w * -lt)
        B = m.shape[0]
        loss = fsum(gate * num / (DENOM_EPS + wsum)) / B if B else 0.0
        grad = torch.where(m, -(gate / (DENOM_EPS + wsum))[:, None] * w / B, zero)
        return loss, grad, gate, w

    @registry.reference("tar.replay_f64")
    def replay_tensor_f64(logp_theta, logp_base, mask) -> dict:
        """`tar.replay` at training sizes: the loss, its gradient and the same counts."""
        loss, grad, gates, weights = replay_f64(logp_theta, logp_base, mask)
        m = mask.to(torch.bool)
        return {"value": torch.tensor(loss, dtype=f64), "grad": [grad], "scale": abs(loss),
                "counts": {"zero_gate_trajectories": int((gates == 0).sum()),
                           "active_trajectories": int((gates > 0).sum()),
                           "positive_weight_tokens": int(((weights > 0) & m).sum())}}

    @registry.reference("tar.replay_metrics_f64")
    def replay_metrics_f64(logp_theta, logp_base, mask):
        """(loss, gates, token_weights, active_fraction) at training sizes, as `tar.replay_metrics`."""
        loss, _, gates, weights = replay_f64(logp_theta, logp_base, mask)
        active = float((gates > 0).to(f64).mean()) if gates.numel() else 0.0
        return torch.tensor(loss, dtype=f64), {"gates": gates, "token_weights": weights, "active_fraction": active}

    @registry.reference("tar.fps_f64")
    def fps_f64(embeddings, correct, k=3, prompt_ids=None) -> dict:
        """`fps_bruteforce` for tens of thousands of prompts at once: each prompt's correct candidates (ascending
        index) padded to the largest count, their float64 cosine distances as one [P, M, M] Gram matrix (another
        computation than the implementation's per-pick dot products), then the same greedy rule for every prompt
        together: first the lowest-index correct candidate, then the largest min-distance to the chosen set, the
        lowest index within TIE_TOL of it. Picks grouped by ascending prompt id; the prompts without a correct
        candidate counted."""
        c = correct.to(torch.bool)
        n = c.numel()
        ids = torch.zeros(n, dtype=torch.long) if prompt_ids is None else prompt_ids.long()
        present = torch.unique(ids)
        cand = c.nonzero().flatten()
        without = int(present.numel()) - int(torch.unique(ids[cand]).numel()) if cand.numel() else int(present.numel())
        if cand.numel() == 0 or int(k) == 0:
            return {"value": torch.zeros(0, dtype=f64), "counts": {"prompts_without_correct": without}}
        cid = ids[cand]
        order = torch.argsort(cid * n + cand)  # by prompt id, then by index (n > every index)
        cand, cid = cand[order], cid[order]
        _, rank, counts = torch.unique(cid, return_inverse=True, return_counts=True)
        P, M = counts.numel(), int(counts.max())
        start = torch.cumsum(counts, 0) - counts
        slot = torch.arange(cand.numel()) - start[rank]
        member = torch.full((P, M), -1, dtype=torch.long)
        member[rank, slot] = cand
        valid = member >= 0
        x = embeddings.to(f64)[member.clamp_min(0)]
        unit = x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-300)
        dist = 1.0 - unit @ unit.transpose(1, 2)  # [P, M, M]
        neg = torch.full((P, M), -math.inf, dtype=f64)
        score = torch.where(valid, torch.full((P, M), math.inf, dtype=f64), neg)
        picks = []
        pick = torch.zeros(P, dtype=torch.long)  # slot 0: the lowest-index correct candidate
        rows = torch.arange(P)
        for step in range(min(int(k), M)):
            if step:
                best = score.max(dim=1, keepdim=True).values
                at = torch.where(score >= best - TIE_TOL, torch.arange(M).expand(P, M), torch.full((P, M), M))
                pick = at.min(dim=1).values
            picks.append(torch.where(step < counts, member[rows, pick.clamp_max(M - 1)], -1))
            score = torch.minimum(score, dist[rows, pick.clamp_max(M - 1)])
            score[rows, pick.clamp_max(M - 1)] = -math.inf
            score = torch.where(valid, score, neg)
        chosen = torch.stack(picks, 1).reshape(-1)
        return {"value": chosen[chosen >= 0].to(f64), "counts": {"prompts_without_correct": without}}

    @generator("tar.fps_bank")
    def fps_bank(g, case, ctx, inputs) -> dict:
        """A bank at training size: options prompts [lo, hi] with `samples` candidates each (the page samples 8),
        embeddings of dims [lo, hi] with varied norms, the verifier's marks with probability 0.5 (some prompts get
        no correct candidate), prompt ids distinct dataset-row ids in [0, 2^20) (past 2^15 and 2^16), the
        candidates shuffled."""
        opt = inputs.get("options") or {}

        def draw_int(key, default):
            lo, hi = opt.get(key, default)
            return int(torch.randint(lo, hi + 1, (), generator=g))

        P, S, D = draw_int("prompts", [4, 8]), int(opt.get("samples", 8)), draw_int("dims", [2, 12])
        N = P * S
        ids = torch.randperm(1 << 20, generator=g)[:P].repeat_interleave(S)
        emb = torch.randn(N, D, generator=g, dtype=f64) * torch.exp(torch.randn(N, 1, generator=g, dtype=f64))
        correct = torch.rand(N, generator=g) < 0.5
        perm = torch.randperm(N, generator=g)
        return {"embeddings": emb[perm], "correct": correct[perm], "prompt_ids": ids[perm], "k": int(opt.get("k", 3)),
                "__dims__": {"N": N, "D": D, "P": P}}


_scale_register()


@registry.reference("tar.step_loss")
def step_loss(logp, old_logp, advantages, mask, logdist, base_logdist, bank_logp=None, bank_base_logp=None,
              bank_mask=None, *, beta_kl, lambda_rep=1.0, clip_eps=0.2):
    """One update of the TAR arm by loops: L_GRPO (the control's clipped token mean, methods/grpo's reference)
    + beta_kl * the token mean over valid tokens of the full-vocabulary KL(pi_theta || pi_base) + lambda_rep *
    L_rep (0 without bank rows)."""
    from methods.grpo import reference as grpo_ref

    m = mask.to(torch.bool)
    adv = advantages[:, None].expand(m.shape) if advantages.dim() == 1 else advantages
    zero = lambda x: torch.where(m, x, 0.0).tolist()  # noqa: E731  (junk in masked slots is not the loss's)
    grpo, *_ = grpo_ref.loss_and_grad(zero(logp), zero(old_logp), zero(adv), m.tolist(), clip_low=clip_eps,
                                      clip_high=clip_eps)
    kl_terms = []
    for b, row in enumerate(m.tolist()):
        for t, valid in enumerate(row):
            if valid:
                p, q = logdist[b][t].tolist(), base_logdist[b][t].tolist()
                kl_terms.append(math.fsum(math.exp(lp) * (lp - lq) for lp, lq in zip(p, q)))
    kl = math.fsum(kl_terms) / len(kl_terms) if kl_terms else 0.0
    rep = 0.0
    if bank_logp is not None and bank_logp.shape[0]:
        rep = replay_reference(bank_logp.tolist(), bank_base_logp.tolist(), bank_mask.bool().tolist())[0]
    return torch.tensor(grpo + float(beta_kl) * kl + float(lambda_rep) * float(rep), dtype=torch.float64)
