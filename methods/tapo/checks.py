"""TAPO contracts: each check calls the method only through `impl` and returns measurements.

Inputs are drawn in float64 on the CPU from `ctx.generator`, cast to the dtype
under test and moved to the device; references are computed in float64 by the
plain loops of `reference.py` from the *cast* inputs, so an error figure measures
the implementation's arithmetic, not the rounding of its inputs.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.common.grpo import grpo_token_loss
from methods.tapo import reference as ref
from methods.tapo.objective import ZeroAdvantageError, compute_dtype

JUNK = (float("nan"), 1.0e4, -1.0e4)


# --- inputs ---------------------------------------------------------------


def _layout(g: torch.Generator, B: int, L: int, prompt_max: int = 4, hole_prob: float = 0.1) -> torch.Tensor:
    """Bool mask [B, L]: per row a masked prompt, a response (maybe with holes), masked padding."""
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        p = int(torch.randint(0, min(prompt_max, L - 1) + 1, (1,), generator=g))
        r = int(torch.randint(1, L - p + 1, (1,), generator=g))
        mask[b, p : p + r] = True
        holes = torch.rand(r, generator=g) < hole_prob
        holes[0] = False  # keep at least one valid token per row
        mask[b, p : p + r] &= ~holes
    return mask


def _draw(g: torch.Generator, B: int, L: int, delta_scale: float = 0.3, **layout):
    """float64 CPU logp, old_logp (old = logp + noise) and a mask; masked slots hold random finite values."""
    logp = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3.0 - 0.01
    old = logp + delta_scale * torch.randn(B, L, generator=g, dtype=torch.float64)
    mask = _layout(g, B, L, **layout)
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


def _rows(x: torch.Tensor) -> list:
    """Nested float64 lists of what the implementation actually received."""
    return x.detach().to("cpu", torch.float64).tolist() if x.dtype != torch.bool else x.cpu().tolist()


def _margin(dtype: torch.dtype) -> float:
    """Relative distance to a clip bound inside which the active set is ambiguous in `dtype`."""
    return 1e-4 if compute_dtype(dtype) == torch.float32 else 1e-10


def _nan_to_inf(x: float) -> float:
    return math.inf if math.isnan(x) else x


def lacks(impl, function: str) -> str | None:
    """Why `impl` has no `function` (an adapted framework loss has no separate ratio or schedule), or None when it
    has it. A check measuring several functions skips, and declares not applicable, what needs a missing one."""
    if registry.provides(impl, function):
        return None
    return f"no {function}: {getattr(getattr(impl, function, None), 'not_provided', None) or 'not in the implementation'}"


# --- contracts ------------------------------------------------------------


@registry.check("tapo.prefix_ratio_forward")
def prefix_ratio_forward(impl, ctx) -> dict:
    """R^_t value vs the float64 loop R~_t = exp(mean_{i<=t} delta_i), t counting valid tokens."""
    max_len = int(ctx.params.get("max_len", 48))
    max_batch = int(ctx.params.get("max_batch", 4))
    g = ctx.generator(1)
    max_abs = max_rel = 0.0
    masked_bad = tokens = 0
    for _ in range(ctx.cases):
        B, L = _dims(g, max_len, max_batch)
        logp, old, mask = _draw(g, B, L)
        lp, op, m = _dev(ctx, logp), _dev(ctx, old), _dev(ctx, mask)
        with torch.no_grad():
            out = impl.trajectory_ratio(lp, op, m)
        want = ref.prefix_ratio(_rows(lp), _rows(op), m.cpu().tolist())
        got = _rows(out)
        for b in range(B):
            for t in range(L):
                if want[b][t] is None:
                    masked_bad += int(not math.isfinite(got[b][t]))
                    continue
                tokens += 1
                err = _nan_to_inf(abs(got[b][t] - want[b][t]))
                max_abs = max(max_abs, err)
                max_rel = max(max_rel, err / abs(want[b][t]))
    return {"max_abs_err": max_abs, "max_rel_err": max_rel, "masked_nonfinite": masked_bad, "tokens": tokens, "cases": ctx.cases}


@registry.check("tapo.eq15_local_gradient")
def eq15_local_gradient(impl, ctx) -> dict:
    """Jacobian of R^ w.r.t. logp: diagonal R~_t at valid positions, every other entry exactly 0."""
    max_len = int(ctx.params.get("max_len", 12))
    max_batch = int(ctx.params.get("max_batch", 3))
    g = ctx.generator(2)
    diag_rel = offdiag = masked_diag = 0.0
    nonfinite = 0
    for _ in range(ctx.cases):
        B, L = _dims(g, max_len, max_batch)
        logp, old, mask = _draw(g, B, L)
        lp, op, m = _dev(ctx, logp), _dev(ctx, old), _dev(ctx, mask)
        jac = torch.autograd.functional.jacobian(lambda x: impl.trajectory_ratio(x, op, m), lp)
        jac = jac.detach().to("cpu", torch.float64).reshape(B * L, B * L)
        nonfinite += int((~torch.isfinite(jac)).sum())
        jac = torch.nan_to_num(jac, nan=math.inf)
        diag = jac.diagonal().tolist()
        off = jac - torch.diag(jac.diagonal())
        offdiag = max(offdiag, float(off.abs().max()))
        want = ref.prefix_ratio(_rows(lp), _rows(op), m.cpu().tolist())
        for b in range(B):
            for t in range(L):
                d = diag[b * L + t]
                if want[b][t] is None:
                    masked_diag = max(masked_diag, abs(d))
                else:
                    diag_rel = max(diag_rel, abs(d - want[b][t]) / want[b][t])
    return {
        "diag_max_rel_err": diag_rel,
        "offdiag_max_abs": offdiag,
        "masked_grad_max_abs": masked_diag,
        "nonfinite": nonfinite,
        "cases": ctx.cases,
    }


@registry.check("tapo.masked_junk_invariance")
def masked_junk_invariance(impl, ctx) -> dict:
    """NaN / +1e4 / -1e4 in prompt and padding slots of logp, old_logp and per-token advantages
    change no ratio value, no loss value and no gradient (compared bit for bit with clean inputs)."""
    max_len = int(ctx.params.get("max_len", 32))
    max_batch = int(ctx.params.get("max_batch", 4))
    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    g = ctx.generator(3)
    ratio_diff = loss_diff = grad_diff = masked_grad = 0.0
    nonfinite = 0
    no_ratio = lacks(impl, "trajectory_ratio")
    if no_ratio:  # the loss, its gradient and masked gradients are still held to bit-for-bit invariance
        ctx.not_applicable(no_ratio, "ratio_max_abs_diff")

    def run(lp, op, adv, m):
        lp = lp.clone().requires_grad_(True)
        r = torch.ones(()) if no_ratio else impl.trajectory_ratio(lp, op, m)
        loss, _ = impl.tapo_loss(lp, op, adv, m, eps_min, eps_max)
        (grad,) = torch.autograd.grad(loss, lp)
        return r.detach(), loss.detach(), grad

    for case in range(ctx.cases):
        B, L = _dims(g, max_len, max_batch)
        logp, old, mask = _draw(g, B, L, delta_scale=0.5)
        adv = torch.randn(B, L, generator=g, dtype=torch.float64)
        pattern = case % 4  # 0: NaN, 1: +1e4, 2: -1e4, 3: a random mixture of the three
        if pattern < 3:
            junk = torch.full((B, L), JUNK[pattern], dtype=torch.float64)
        else:
            pick = torch.randint(0, 3, (B, L), generator=g)
            junk = torch.tensor(JUNK, dtype=torch.float64)[pick]
        dirty = [torch.where(mask, x, junk) for x in (logp, old, adv)]
        clean = [_dev(ctx, x) for x in (logp, old, adv)]
        dirty = [_dev(ctx, x) for x in dirty]
        m = _dev(ctx, mask)
        r0, l0, g0 = run(*clean, m)
        r1, l1, g1 = run(*dirty, m)
        nonfinite += int((~torch.isfinite(r1)).sum()) + int(not bool(torch.isfinite(l1))) + int((~torch.isfinite(g1)).sum())
        ratio_diff = max(ratio_diff, float(torch.nan_to_num((r1 - r0).abs(), nan=math.inf).max()))
        loss_diff = max(loss_diff, _nan_to_inf(abs(float(l1) - float(l0))))
        grad_diff = max(grad_diff, float(torch.nan_to_num((g1 - g0).abs(), nan=math.inf).max()))
        masked = torch.where(m, torch.zeros_like(g1), g1)
        masked_grad = max(masked_grad, float(torch.nan_to_num(masked.abs(), nan=math.inf).max()))
    return {
        **({} if no_ratio else {"ratio_max_abs_diff": ratio_diff}),
        "loss_abs_diff": loss_diff,
        "grad_max_abs_diff": grad_diff,
        "masked_grad_max_abs": masked_grad,
        "nonfinite": nonfinite,
        "cases": ctx.cases,
    }


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


@registry.check("tapo.loss_forward")
def loss_forward(impl, ctx) -> dict:
    """Loss value and d loss / d logp vs the float64 loop (token mean, per-position clip bounds).

    Ratios are drawn wide enough that the clip binds on many tokens (`clipped_tokens`
    counts them, so a vacuous run shows). Tokens whose ratio sits within a
    dtype-sized relative margin of a bound are left out of the gradient
    comparison and counted in `grad_excluded`.
    """
    max_len = int(ctx.params.get("max_len", 40))
    max_batch = int(ctx.params.get("max_batch", 6))
    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    g = ctx.generator(5)
    loss_abs = loss_err = grad_rel = 0.0
    excluded = clipped = 0
    margin = _margin(ctx.dtype)
    for case in range(ctx.cases):
        B, L = _dims(g, max_len, max_batch)
        logp, old, mask = _draw(g, B, L, delta_scale=0.6)
        if case % 2:
            adv = torch.randn(B, L, generator=g, dtype=torch.float64)
            adv_rows = adv
        else:
            adv = torch.randn(B, generator=g, dtype=torch.float64)
            adv_rows = adv[:, None].expand(B, L)
        horizon = L + 3 if case % 3 == 2 else None
        lp = _dev(ctx, logp).requires_grad_(True)
        op, a, m = _dev(ctx, old), _dev(ctx, adv), _dev(ctx, mask)
        loss, _ = impl.tapo_loss(lp, op, a, m, eps_min, eps_max, horizon)
        (grad,) = torch.autograd.grad(loss, lp)
        want, want_grad, near, scale_l = ref.loss_and_grad(
            _rows(lp), _rows(op), _rows(_dev(ctx, adv_rows)), mask.tolist(), eps_min, eps_max, horizon, margin
        )
        err = _nan_to_inf(abs(float(loss.detach()) - want))
        loss_abs = max(loss_abs, err)
        loss_err = max(loss_err, err / max(scale_l, 1e-300))
        got = _rows(grad)
        scale = max(abs(x) for row in want_grad for x in row) or 1.0
        for b in range(B):
            for t in range(L):
                if near[b][t]:
                    excluded += 1
                    continue
                if mask[b, t] and want_grad[b][t] == 0.0:
                    clipped += 1
                grad_rel = max(grad_rel, _nan_to_inf(abs(got[b][t] - want_grad[b][t])) / scale)
    return {
        "loss_max_abs_err": loss_abs,
        "loss_max_scaled_err": loss_err,
        "grad_max_rel_err": grad_rel,
        "clipped_tokens": clipped,
        "grad_excluded": excluded,
        "cases": ctx.cases,
    }


@registry.check("tapo.on_policy_identity")
def on_policy_identity(impl, ctx) -> dict:
    """logp = old_logp: R^ = 1 exactly at valid positions, the loss is -mean(A) and its gradient is
    the vanilla policy gradient -A_t / N (and equals the GRPO control's gradient). The same holds when
    old_logp is the very tensor logp, grad and all: old_logp is a constant (sg) of the loss."""
    max_len = int(ctx.params.get("max_len", 40))
    max_batch = int(ctx.params.get("max_batch", 6))
    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    g = ctx.generator(6)
    ratio_dev = loss_err = grad_rel = grpo_rel = alias_rel = 0.0
    no_ratio = lacks(impl, "trajectory_ratio")
    if no_ratio:  # the loss -mean(A) and the vanilla policy gradient are still held
        ctx.not_applicable(no_ratio, "ratio_max_abs_dev")
    for _ in range(ctx.cases):
        B, L = _dims(g, max_len, max_batch)
        logp, _, mask = _draw(g, B, L)
        adv = torch.randn(B, generator=g, dtype=torch.float64)
        lp = _dev(ctx, logp).requires_grad_(True)
        op = _dev(ctx, logp).clone()  # same values, a separate tensor without grad
        a, m = _dev(ctx, adv), _dev(ctx, mask)
        if not no_ratio:
            r = impl.trajectory_ratio(lp, op, m).detach()
            ratio_dev = max(ratio_dev, float(torch.nan_to_num((torch.where(m, r, torch.ones_like(r)) - 1).abs(),
                                                              nan=math.inf).max()))
        loss, _ = impl.tapo_loss(lp, op, a, m, eps_min, eps_max)
        (grad,) = torch.autograd.grad(loss, lp)
        lq = _dev(ctx, logp).requires_grad_(True)
        grpo, _ = grpo_token_loss(lq, op, a, m, clip_eps=eps_max)
        (grpo_grad,) = torch.autograd.grad(grpo, lq)
        arow = _rows(a)
        n = int(mask.sum())
        want_loss = -sum(arow[b] for b in range(B) for t in range(L) if mask[b, t]) / n
        scale_l = sum(abs(arow[b]) for b in range(B) for t in range(L) if mask[b, t]) / n
        loss_err = max(loss_err, _nan_to_inf(abs(float(loss.detach()) - want_loss)) / max(scale_l, 1e-300))
        want = [[(-arow[b] / n if mask[b, t] else 0.0) for t in range(L)] for b in range(B)]
        scale = max(abs(x) for row in want for x in row) or 1.0
        got = _rows(grad)
        grad_rel = max(grad_rel, max(_nan_to_inf(abs(got[b][t] - want[b][t])) for b in range(B) for t in range(L)) / scale)
        grpo_rel = max(grpo_rel, float(torch.nan_to_num((grad - grpo_grad).abs(), nan=math.inf).max()) / scale)
        x = _dev(ctx, logp).requires_grad_(True)
        alias, _ = impl.tapo_loss(x, x, a, m, eps_min, eps_max)  # old_logp aliases logp
        (alias_grad,) = torch.autograd.grad(alias, x)
        got = _rows(alias_grad)
        alias_rel = max(alias_rel, max(_nan_to_inf(abs(got[b][t] - want[b][t])) for b in range(B) for t in range(L)) / scale)
    return {
        **({} if no_ratio else {"ratio_max_abs_dev": ratio_dev}),
        "loss_max_scaled_err": loss_err,
        "grad_max_rel_err": grad_rel,
        "grpo_grad_max_rel_diff": grpo_rel,
        "alias_grad_max_rel_err": alias_rel,
        "cases": ctx.cases,
    }


@registry.check("tapo.zero_advantage_rejection")
def zero_advantage_rejection(impl, ctx) -> dict:
    """All-zero advantages on a group's valid tokens are rejected with a clear error; values in
    masked slots do not count; a group with any non-zero advantage is accepted (negative control)."""
    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    g = ctx.generator(7)
    B, L = 8, 10
    logp, old, mask = _draw(g, B, L)
    lp, op, m = _dev(ctx, logp), _dev(ctx, old), _dev(ctx, mask)

    def rejected(adv: torch.Tensor, mask_=m, **kw) -> tuple[bool, str]:
        try:
            loss, _ = impl.tapo_loss(lp, op, _dev(ctx, adv), mask_, eps_min, eps_max, **kw)
        except ZeroAdvantageError as e:
            return True, str(e)
        except ValueError as e:  # a rejection, but not the documented error type
            return True, str(e)
        return False, ""

    zeros = torch.zeros(B, dtype=torch.float64)
    all_zero, message = rejected(zeros)
    junk = torch.where(mask, torch.zeros(B, L, dtype=torch.float64), torch.tensor(JUNK, dtype=torch.float64)[torch.arange(B * L) % 3].reshape(B, L))
    masked_junk, _ = rejected(junk)
    one_group = torch.cat([torch.randn(4, generator=g, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)])
    one_group_zero, _ = rejected(one_group, group_size=4)
    # a row with a non-zero advantage but no valid token, all other rows zero
    empty_row = mask.clone()
    empty_row[0] = False
    row_adv = zeros.clone()
    row_adv[0] = 1.0
    masked_row, _ = rejected(row_adv, mask_=_dev(ctx, empty_row))
    one_nonzero = zeros.clone()
    one_nonzero[3] = -0.5
    accepted = not rejected(one_nonzero)[0] and not rejected(torch.randn(B, generator=g, dtype=torch.float64), group_size=4)[0]
    return {
        "rejected_all_zero": all_zero,
        "rejected_masked_junk": masked_junk,
        "rejected_one_group_zero": one_group_zero,
        "rejected_masked_row": masked_row,
        "accepted_nonzero": accepted,
        "message_names_advantage": "advantage" in message.lower(),
    }


@registry.check("tapo.split_invariance")
def split_invariance(impl, ctx) -> dict:
    """Splitting a batch by rows and weighting each part's loss by its token count
    (metrics['tokens']) gives the full-batch loss and gradient (verl #5625)."""
    max_len = int(ctx.params.get("max_len", 32))
    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    g = ctx.generator(8)
    loss_err = grad_rel = 0.0
    for case in range(ctx.cases):
        B = int(torch.randint(2, 9, (1,), generator=g))
        L = int(torch.randint(2, max_len + 1, (1,), generator=g))
        logp, old, mask = _draw(g, B, L, delta_scale=0.6)
        adv = torch.randn(B, generator=g, dtype=torch.float64)
        cut = int(torch.randint(1, B, (1,), generator=g))
        lp = _dev(ctx, logp).requires_grad_(True)
        op, a, m = _dev(ctx, old), _dev(ctx, adv), _dev(ctx, mask)
        full, fm = impl.tapo_loss(lp, op, a, m, eps_min, eps_max)
        (g_full,) = torch.autograd.grad(full, lp)
        parts, grads, total = [], [], 0
        for sl in (slice(0, cut), slice(cut, B)):
            x = lp.detach()[sl].clone().requires_grad_(True)
            part, pm = impl.tapo_loss(x, op[sl], a[sl], m[sl], eps_min, eps_max)
            (gx,) = torch.autograd.grad(part, x)
            parts.append((float(part.detach()), pm["tokens"]))
            grads.append((gx.to(torch.float64), pm["tokens"]))
            total += pm["tokens"]
        merged = sum(p * n for p, n in parts) / total
        g_merged = torch.cat([gx * n for gx, n in grads]) / total
        g_full = g_full.to(torch.float64)
        scale = max(float(g_full.abs().max()), 1e-300)
        rows_a = _rows(a)
        *_, scale_l = ref.loss_and_grad(
            _rows(lp), _rows(op), [[x] * L for x in rows_a], mask.tolist(), eps_min, eps_max
        )
        loss_err = max(loss_err, _nan_to_inf(abs(float(merged) - float(full.detach()))) / max(scale_l, 1e-300))
        grad_rel = max(grad_rel, float(torch.nan_to_num((g_merged - g_full).abs(), nan=math.inf).max()) / scale)
    return {"loss_scaled_diff": loss_err, "grad_max_rel_diff": grad_rel, "cases": ctx.cases}


@registry.check("tapo.precision_agreement")
def precision_agreement(impl, ctx) -> dict:
    """Long responses (thousands of tokens, where a low-precision prefix sum drifts): ratio,
    loss and gradient in the dtype under test agree with the float64 loop reference."""
    length = int(ctx.params.get("long_len", 4096))
    batch = int(ctx.params.get("long_batch", 2))
    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    g = ctx.generator(9)
    ratio_rel = loss_err = grad_rel = 0.0
    excluded = tokens = 0
    margin = _margin(ctx.dtype)
    no_ratio = lacks(impl, "trajectory_ratio")
    if no_ratio:  # the loss and its gradient over ~8k tokens are still held to the float64 loop
        ctx.not_applicable(no_ratio, "ratio_max_rel_err")
    for _ in range(max(1, ctx.cases // 4)):
        logp, old, mask = _draw(g, batch, length, delta_scale=0.3, prompt_max=64, hole_prob=0.05)
        # |A| in [0.5, 2]: with ~8k tokens a smaller |A| puts float16 gradients (|A| R / N)
        # into float16's subnormal range, which measures float16 storage, not this arithmetic
        sign = torch.where(torch.rand(batch, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
        adv = sign * (0.5 + 1.5 * torch.rand(batch, generator=g, dtype=torch.float64))
        lp = _dev(ctx, logp).requires_grad_(True)
        op, a, m = _dev(ctx, old), _dev(ctx, adv), _dev(ctx, mask)
        r = None if no_ratio else impl.trajectory_ratio(lp, op, m).detach()
        loss, _ = impl.tapo_loss(lp, op, a, m, eps_min, eps_max)
        (grad,) = torch.autograd.grad(loss, lp)
        rows_l, rows_o, mrows = _rows(lp), _rows(op), mask.tolist()
        arow = _rows(a)
        want_r = ref.prefix_ratio(rows_l, rows_o, mrows)
        adv_rows = [[arow[b]] * length for b in range(batch)]
        want_l, want_g, near, scale_l = ref.loss_and_grad(rows_l, rows_o, adv_rows, mrows, eps_min, eps_max, None, margin)
        got_r, got_g = (None if r is None else _rows(r)), _rows(grad)
        scale = max(abs(x) for row in want_g for x in row) or 1.0
        for b in range(batch):
            for t in range(length):
                if want_r[b][t] is None:
                    continue
                tokens += 1
                if got_r is not None:
                    ratio_rel = max(ratio_rel, _nan_to_inf(abs(got_r[b][t] - want_r[b][t])) / want_r[b][t])
                if near[b][t]:
                    excluded += 1
                    continue
                grad_rel = max(grad_rel, _nan_to_inf(abs(got_g[b][t] - want_g[b][t])) / scale)
        loss_err = max(loss_err, _nan_to_inf(abs(float(loss.detach()) - want_l)) / max(scale_l, 1e-300))
    return {
        **({} if no_ratio else {"ratio_max_rel_err": ratio_rel}),
        "loss_scaled_err": loss_err,
        "grad_max_rel_err": grad_rel,
        "grad_excluded": excluded,
        "tokens": tokens,
    }


def _refused(fn, *args, **kwargs) -> tuple[bool, str]:
    """(refused with a ValueError, its message); an accepted call or any other exception is not a refusal."""
    try:
        out = fn(*args, **kwargs)
        if hasattr(out, "__next__"):  # a generator refuses when it is first advanced
            next(out)
    except ValueError as e:
        return True, str(e)
    except Exception:  # noqa: BLE001 - a TypeError or an IndexError is not the documented refusal
        return False, ""
    return False, ""


def _accepted(fn, *args, **kwargs) -> bool:
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - any exception on a valid input is a wrong refusal
        return False
    return True


@registry.check("tapo.input_validation")
def input_validation(impl, ctx) -> dict:
    """Each refusal the interface documents (ValueError), and the valid inputs just inside each boundary."""
    from methods.common.policy import TinyGRUPolicy
    from methods.common.rollout import sample

    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    g = ctx.generator(11)
    B, L = 4, 7
    logp, old, mask = _draw(g, B, L, delta_scale=0.5)
    lp, op, m = _dev(ctx, logp), _dev(ctx, old), _dev(ctx, mask)
    adv = _dev(ctx, torch.randn(B, generator=g, dtype=torch.float64))
    longest = int(mask.sum(dim=1).max())

    def loss(*, logp_=lp, old_=op, adv_=adv, mask_=m, lo=eps_min, hi=eps_max, **kw):
        return impl.tapo_loss(logp_, old_, adv_, mask_, lo, hi, **kw)

    no_clip = lacks(impl, "length_aware_clip")  # an adapted framework loss has no separate schedule
    if no_clip:
        ctx.not_applicable(no_clip, "clip_T_refused")
    # length_aware_clip: T must be an integer >= 1 (a bool is not one)
    clip_T_refused = bool(no_clip) or all(_refused(impl.length_aware_clip, T, eps_min, eps_max)[0]
                                    for T in (0, -1, True, 2.0))
    # 0 <= eps_min <= eps_max; both edges are valid (a fixed clip, or none at the end of a response)
    eps_refused = all(_refused(loss, lo=lo, hi=hi)[0] for lo, hi in ((-0.05, eps_max), (eps_max, eps_min)))
    eps_edges_accepted = (_accepted(loss, lo=0.0, hi=eps_max) and _accepted(loss, lo=eps_max, hi=eps_max)
                          and (bool(no_clip) or (_accepted(impl.length_aware_clip, 5, 0.0, eps_max)
                                           and _accepted(impl.length_aware_clip, 5, eps_max, eps_max))))
    # a 0/1 mask of another dtype is the bool mask: the same loss, gradient and token count
    mask_forms_agree = True
    ref_out = None
    for form in (m, m.to(ctx.dtype), m.to(torch.int64)):
        x = lp.clone().requires_grad_(True)
        try:
            value, met = impl.tapo_loss(x, op, adv, form, eps_min, eps_max)
            (grad,) = torch.autograd.grad(value, x)
        except Exception:  # noqa: BLE001 - the interface accepts a 0/1 mask
            mask_forms_agree = False
            break
        out = (float(value.detach()), grad.detach().to("cpu", torch.float64), int(met["tokens"]))
        if ref_out is None:
            ref_out = out
        elif not (out[0] == ref_out[0] and torch.equal(out[1], ref_out[1]) and out[2] == ref_out[2]):
            mask_forms_agree = False
    # horizon: an integer >= 1 (refused on one-token responses too, which no length check would) and at least
    # the longest response
    one_token = torch.zeros(B, L, dtype=torch.bool)
    one_token[:, 1] = True
    m1 = _dev(ctx, one_token)
    horizon_refused = (all(_refused(loss, horizon=h)[0] for h in (0, -1, longest - 1))
                       and all(_refused(loss, mask_=m1, horizon=h)[0] for h in (True, 2.5, 0)))
    horizon_edges_accepted = _accepted(loss, horizon=longest) and _accepted(loss, mask_=m1, horizon=1)
    # group_size: an integer >= 1 that divides the batch
    groups_refused = all(_refused(loss, group_size=s)[0] for s in (0, -1, 3))
    groups_edges_accepted = _accepted(loss, group_size=1) and _accepted(loss, group_size=B)
    # nothing to optimise: a mask with no response token, or no slot at all; the error names the mask
    empty = []
    for e_lp, e_op, e_m in ((lp, op, torch.zeros_like(m)),
                            (lp[:, :0], op[:, :0], m[:, :0])):
        refused, msg = _refused(loss, logp_=e_lp, old_=e_op, mask_=e_m)
        empty.append(refused and "mask" in msg.lower())
    empty_refused_names_mask = all(empty)
    # a NaN or inf advantage at a response token ([B] or [B, L]) is refused; huge finite ones are not
    first = int(mask[0].nonzero()[0])
    bad = []
    for v in (math.nan, math.inf, -math.inf):
        a_row = adv.clone()
        a_row[0] = v
        a_tok = adv[:, None].expand(B, L).clone()
        a_tok[0, first] = v
        bad += [_refused(loss, adv_=a_row)[0], _refused(loss, adv_=a_tok)[0]]
    nonfinite_adv_refused = all(bad)
    big = torch.finfo(ctx.dtype).max / 2  # finite, and any three of them sum to inf
    huge = torch.full((B, L), big, dtype=ctx.dtype, device=ctx.device)
    large_adv_accepted = _accepted(loss, adv_=torch.where(m, huge, -huge))
    # proximal_logprobs: inner_updates an integer >= 1; one update yields exactly one step
    policy = TinyGRUPolicy.seeded(ctx.seed, ctx.device)
    prompts = torch.randint(2, 16, (2, 3), generator=g).to(ctx.device)
    ro = sample(policy, prompts, 4, ctx.generator(12))
    proximal_refused = all(_refused(impl.proximal_logprobs, policy, ro, n)[0] for n in (0, -1, True, 1.5))
    try:
        steps = list(impl.proximal_logprobs(policy, ro, 1))
        proximal_one_update = (len(steps) == 1 and steps[0][0] == 0
                               and torch.equal(steps[0][2], ro.old_logp))
    except Exception:  # noqa: BLE001 - one update is valid
        proximal_one_update = False
    return {
        **({} if no_clip else {"clip_T_refused": clip_T_refused}),
        "eps_refused": eps_refused,
        "eps_edges_accepted": eps_edges_accepted,
        "mask_forms_agree": mask_forms_agree,
        "horizon_refused": horizon_refused,
        "horizon_edges_accepted": horizon_edges_accepted,
        "groups_refused": groups_refused,
        "groups_edges_accepted": groups_edges_accepted,
        "empty_refused_names_mask": empty_refused_names_mask,
        "nonfinite_adv_refused": nonfinite_adv_refused,
        "large_adv_accepted": large_adv_accepted,
        "proximal_refused": proximal_refused,
        "proximal_one_update": proximal_one_update,
    }
