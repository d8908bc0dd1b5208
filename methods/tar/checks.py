"""TAR contract checks: each returns named measurements; the spec's `expect:` judges them.

Every check calls the method only through `impl` (so a mutant can stand in)
and compares against `methods.tar.reference`: plain-Python float64 loops that
share no code with the implementation. Inputs are drawn on the CPU from the
run seed (`ctx.generator`) and then moved, so a seed means the same inputs on
every device.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.tar import mechanism
from methods.tar import reference as ref

F64 = torch.float64
JUNK = (float("nan"), float("inf"), float("-inf"), 1.0e4, -1.0e4, 5.0)

# The message text these checks read, per check and function: each is declared in the spec's interface
# (raises: message_contains), and tests/test_interface.py holds every spec to that.
MESSAGE_READS = {
    "tar.rejects_invalid_inputs": {"adaptive_replay_loss": ["(1, 2)"]},
    "tar.fps_rejects_bad_vectors": {"farthest_point_prototypes": ["candidate 3", "norm 0", "not finite",
                                                                  "overflows"]},
}


# --- input generation ------------------------------------------------------------


def _int(g: torch.Generator, lo: int, hi: int) -> int:
    """Uniform integer in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def replay_case(g: torch.Generator, B: int, T: int, *, valid_p: float = 0.8, delta_scale: float = 1.0):
    """float64 (logp_theta, logp_base, mask, junked copies) with a mix of active and zero-gate rows.

    delta = logp_base - logp_theta has a per-row offset so that some rows have
    a positive and some a non-positive mean; both log-probs are <= 0. Masked
    slots hold ordinary values (-1) in the clean tensors and NaN / +-inf /
    +-1e4 / +5 junk in the junked copies.
    """
    mask = torch.rand(B, T, generator=g) < valid_p
    lt = -torch.rand(B, T, generator=g, dtype=F64) * 4.0 - 0.01
    offset = torch.randn(B, 1, generator=g, dtype=F64) * 0.8 * delta_scale
    delta = (torch.randn(B, T, generator=g, dtype=F64) * delta_scale + offset)
    lb = lt + delta
    shift = torch.where(mask, lb, torch.full_like(lb, -math.inf)).amax(dim=1, keepdim=True).clamp_min(0.0)
    lt, lb = lt - shift, lb - shift
    lt = torch.where(mask, lt, torch.full_like(lt, -1.0))
    lb = torch.where(mask, lb, torch.full_like(lb, -1.0))
    pick = torch.randint(0, len(JUNK), (2, B, T), generator=g)
    junk = torch.tensor(JUNK, dtype=F64)
    lt_j = torch.where(mask, lt, junk[pick[0]])
    lb_j = torch.where(mask, lb, junk[pick[1]])
    return lt, lb, mask, lt_j, lb_j


def _on(ctx, x: torch.Tensor, dtype=None) -> torch.Tensor:
    return x.to(ctx.device, dtype or x.dtype)


def _run_replay(impl, ctx, lt, lb, mask, dtype):
    """Loss, metrics and d loss / d logp_theta (float64 on the CPU) for inputs cast to `dtype`."""
    x = _on(ctx, lt, dtype).requires_grad_(True)
    loss, metrics = impl.adaptive_replay_loss(x, _on(ctx, lb, dtype), _on(ctx, mask))
    (grad,) = torch.autograd.grad(loss, x, allow_unused=True)
    grad = torch.zeros_like(x) if grad is None else grad
    return loss.detach().double().cpu(), metrics, grad.detach().double().cpu()


def _rounded(x: torch.Tensor, dtype) -> torch.Tensor:
    """The float64 value of x after a round trip through `dtype` (what the implementation sees)."""
    return x.to(dtype).to(F64)


def _reference(lt, lb, mask):
    loss, grad, gates, weights = ref.replay_reference(lt.tolist(), lb.tolist(), mask.tolist())
    return loss, torch.tensor(grad, dtype=F64).reshape(lt.shape), torch.tensor(gates, dtype=F64), torch.tensor(weights, dtype=F64).reshape(lt.shape)


def _rel(a: float, b: float) -> float:
    """|a - b| / |b|; 0 when equal, inf when b = 0 != a, NaN when either is NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if a == b:
        return 0.0
    if b == 0 or not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / abs(b)


def _worst(*values: float) -> float:
    """The largest value, and NaN if any is NaN (Python's max() would drop a NaN that comes second)."""
    vals = [float(v) for v in values]
    if any(math.isnan(v) for v in vals):
        return math.nan
    return max(vals)


def _maxabs(t: torch.Tensor) -> float:
    """max |t| with NaN reported as NaN (never silently dropped); 0 for an empty tensor."""
    if t.numel() == 0:
        return 0.0
    if bool(torch.isnan(t).any()):
        return math.nan
    return float(t.abs().max())


def _raises_value_error(fn) -> tuple[bool, str]:
    try:
        fn()
    except ValueError as e:
        return True, str(e)
    except Exception as e:  # another exception type is not the clear rejection asked for
        return False, f"{type(e).__name__}: {e}"
    return False, ""


# --- soft gate -------------------------------------------------------------------


@registry.check("tar.soft_gate_reference")
def soft_gate_reference(impl, ctx) -> dict:
    """phi against the float64 formula on the dtype-rounded inputs, including |z| up to 1e4."""
    g = ctx.generator(10)
    grid = torch.tensor(
        [-1e4, -1e3, -88.0, -20.0, -1.0, -1e-3, -1e-8, -0.0, 0.0, 1e-8, 1e-6, 1e-4, 1e-3, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 88.0, 1e3, 1e4],
        dtype=F64,
    )
    rand = torch.randn(max(ctx.cases, 1) * 16, generator=g, dtype=F64) * torch.exp(torch.randn(max(ctx.cases, 1) * 16, generator=g, dtype=F64) * 2)
    z = _rounded(torch.cat([grid, rand]).clamp(-1e4, 1e4), ctx.dtype)
    out_t = impl.soft_gate(_on(ctx, z, ctx.dtype))
    out = out_t.detach().double().cpu()
    expect = torch.tensor([ref.phi(v) for v in z.tolist()], dtype=F64)
    err = (out - expect).abs()
    tiny = torch.finfo(ctx.dtype).tiny
    normal = expect >= tiny
    rel = err[normal] / expect[normal]
    order = torch.argsort(z, stable=True)
    so = out[order]
    nonpos = z <= 0
    return {
        "points": int(z.numel()),
        "all_finite": bool(torch.isfinite(out).all()),
        "dtype_kept": out_t.dtype == ctx.dtype,
        "max_abs_err": _maxabs(err),
        "max_rel_err": _maxabs(rel),
        "min_value": float(out.min()),
        "max_value": float(out.max()),
        "nonpositive_max_abs": _maxabs(out[nonpos]),
        "monotone": bool((so[1:] >= so[:-1]).all()),
    }


# --- replay loss -----------------------------------------------------------------


@registry.check("tar.replay_loss_reference")
def replay_loss_reference(impl, ctx) -> dict:
    """Loss, analytic gradient, gates and token weights against the float64 loop reference.

    dL/dlogp_theta,t = -(1/|B|) g w_t / (1e-8 + sum w) at valid t, 0 elsewhere.
    Inputs carry junk in padding; the reference runs on the dtype-rounded values.
    """
    g = ctx.generator(20)
    loss_abs = loss_rel = grad_abs = grad_rel = gate_err = w_err = frac_err = 0.0
    zero_gate = active = 0
    for _ in range(ctx.cases):
        B, T = _int(g, 1, 7), _int(g, 1, 12)
        _, _, mask, lt_j, lb_j = replay_case(g, B, T)
        lt_r, lb_r = _rounded(lt_j, ctx.dtype), _rounded(lb_j, ctx.dtype)
        loss, metrics, grad = _run_replay(impl, ctx, lt_j, lb_j, mask, ctx.dtype)
        r_loss, r_grad, r_gates, r_w = _reference(lt_r, lb_r, mask)
        loss_abs = _worst(loss_abs, abs(float(loss) - r_loss))
        loss_rel = _worst(loss_rel, _rel(float(loss), r_loss))
        d = _maxabs(grad - r_grad)
        grad_abs = _worst(grad_abs, d)
        scale = float(r_grad.abs().max())
        grad_rel = _worst(grad_rel, d / scale if scale > 0 else (0.0 if d == 0 else math.inf))
        gate_err = _worst(gate_err, _maxabs(metrics["gates"].detach().double().cpu() - r_gates))
        w_err = _worst(w_err, _maxabs(metrics["token_weights"].detach().double().cpu() - r_w))
        frac_err = _worst(frac_err, abs(float(metrics["active_fraction"]) - float((r_gates > 0).double().mean())))
        zero_gate += int((r_gates == 0).sum())
        active += int((r_gates > 0).sum())
    return {
        "cases": ctx.cases,
        "loss_max_abs_err": loss_abs,
        "loss_max_rel_err": loss_rel,
        "grad_max_abs_err": grad_abs,
        "grad_max_rel_err": grad_rel,
        "gate_max_abs_err": gate_err,
        "weight_max_abs_err": w_err,
        "active_fraction_err": frac_err,
        "zero_gate_trajectories": zero_gate,
        "active_trajectories": active,
    }


def _zero_gate_case(g: torch.Generator, B: int, T: int):
    """Rows whose mean delta is <= -0.25 while some single tokens have delta > 0 (w_t > 0, g = 0)."""
    mask = torch.rand(B, T, generator=g) < 0.85
    mask[:, 0] = True
    lt = -torch.rand(B, T, generator=g, dtype=F64) * 3.0 - 2.0
    delta = torch.randn(B, T, generator=g, dtype=F64) * 1.5
    delta = torch.where(mask, delta, torch.zeros_like(delta))
    n = mask.sum(1, keepdim=True).to(F64)
    mean = delta.sum(1, keepdim=True) / n
    delta = torch.where(mask, delta - mean - 0.25, torch.zeros_like(delta))
    lb = lt + delta
    shift = torch.where(mask, lb, torch.full_like(lb, -math.inf)).amax(dim=1, keepdim=True).clamp_min(0.0)
    return lt - shift, lb - shift, mask


@registry.check("tar.zero_gate")
def zero_gate(impl, ctx) -> dict:
    """Every trajectory has mean delta < 0 (gate 0) though some tokens have w_t > 0: loss and gradient exactly 0."""
    g = ctx.generator(30)
    loss_abs = grad_abs = 0.0
    pos_w_tokens = 0
    for _ in range(ctx.cases):
        B, T = _int(g, 1, 6), _int(g, 2, 12)
        lt, lb, mask = _zero_gate_case(g, B, T)
        loss, metrics, grad = _run_replay(impl, ctx, lt, lb, mask, ctx.dtype)
        loss_abs = _worst(loss_abs, _maxabs(loss))
        grad_abs = _worst(grad_abs, _maxabs(grad))
        lt_r, lb_r = _rounded(lt, ctx.dtype), _rounded(lb, ctx.dtype)
        pos_w_tokens += int(((lb_r - lt_r > 0) & mask).sum())
    # An empty bank batch (B = 0): loss exactly 0 (not 0/0), no trajectory active.
    empty = torch.zeros(0, 5, dtype=F64)
    e_loss, e_metrics, e_grad = _run_replay(impl, ctx, empty, empty, torch.zeros(0, 5, dtype=torch.bool), ctx.dtype)
    return {
        "cases": ctx.cases,
        "loss_max_abs": loss_abs,
        "grad_max_abs": grad_abs,
        "positive_weight_tokens": pos_w_tokens,
        "empty_bank_loss_abs": _maxabs(e_loss) if bool(torch.isfinite(e_loss).all()) else math.inf,
        "empty_bank_grad_shape_ok": tuple(e_grad.shape) == (0, 5),
        "empty_bank_active_fraction": float(e_metrics["active_fraction"]),
    }


@registry.check("tar.token_locality")
def token_locality(impl, ctx) -> dict:
    """The gradient reaches exactly the valid tokens with w_t > 0 in trajectories with g > 0."""
    g = ctx.generator(40)
    leak_w0 = leak_g0 = leak_pad = 0.0
    expected = hit = zero_w_in_active = 0
    for _ in range(ctx.cases):
        B, T = _int(g, 2, 7), _int(g, 2, 12)
        _, _, mask, lt_j, lb_j = replay_case(g, B, T)
        _, _, grad = _run_replay(impl, ctx, lt_j, lb_j, mask, ctx.dtype)
        lt_r, lb_r = _rounded(lt_j, ctx.dtype), _rounded(lb_j, ctx.dtype)
        _, _, r_gates, r_w = _reference(lt_r, lb_r, mask)
        active = (r_gates > 0)[:, None].expand_as(mask)
        w_pos = r_w > 0
        on = mask & active & w_pos
        leak_w0 = _worst(leak_w0, _maxabs(grad[mask & ~w_pos]))
        leak_g0 = _worst(leak_g0, _maxabs(grad[mask & ~active]))
        leak_pad = _worst(leak_pad, _maxabs(grad[~mask]))
        expected += int(on.sum())
        hit += int((grad[on] != 0).sum())
        zero_w_in_active += int((mask & active & ~w_pos).sum())
    return {
        "cases": ctx.cases,
        "grad_where_weight_zero_max_abs": leak_w0,
        "grad_in_zero_gate_rows_max_abs": leak_g0,
        "grad_in_padding_max_abs": leak_pad,
        "nonzero_where_expected_fraction": hit / expected if expected else math.nan,
        "zero_weight_tokens_in_active_rows": zero_w_in_active,
    }


@registry.check("tar.padding_invariance")
def padding_invariance(impl, ctx) -> dict:
    """NaN / +-inf / +-1e4 / +5 in padding slots change neither loss nor gradient; extra padding columns neither."""
    g = ctx.generator(50)
    loss_diff = grad_diff = pad_grad = 0.0
    wide_loss = wide_grad = 0.0
    raised = False
    all_finite = True
    for _ in range(ctx.cases):
        B, T = _int(g, 1, 6), _int(g, 1, 10)
        lt, lb, mask, lt_j, lb_j = replay_case(g, B, T)
        clean_loss, _, clean_grad = _run_replay(impl, ctx, lt, lb, mask, ctx.dtype)
        try:
            junk_loss, _, junk_grad = _run_replay(impl, ctx, lt_j, lb_j, mask, ctx.dtype)
        except ValueError:
            raised = True
            continue
        all_finite &= bool(torch.isfinite(junk_loss).all() and torch.isfinite(junk_grad).all())
        loss_diff = _worst(loss_diff, _maxabs(junk_loss - clean_loss))
        grad_diff = _worst(grad_diff, _maxabs(torch.where(mask, junk_grad - clean_grad, torch.zeros_like(junk_grad))))
        pad_grad = _worst(pad_grad, _maxabs(junk_grad[~mask]))
        # The same rows with 1-5 extra junk padding columns.
        extra = _int(g, 1, 5)
        pick = torch.randint(0, len(JUNK), (2, B, extra), generator=g)
        junk = torch.tensor(JUNK, dtype=F64)
        lt_w = torch.cat([lt_j, junk[pick[0]]], 1)
        lb_w = torch.cat([lb_j, junk[pick[1]]], 1)
        m_w = torch.cat([mask, torch.zeros(B, extra, dtype=torch.bool)], 1)
        w_loss, _, w_grad = _run_replay(impl, ctx, lt_w, lb_w, m_w, ctx.dtype)
        all_finite &= bool(torch.isfinite(w_loss).all() and torch.isfinite(w_grad).all())
        wide_loss = _worst(wide_loss, _rel(float(w_loss), float(clean_loss)))
        wide_grad = _worst(wide_grad, _maxabs(w_grad[:, :T] - clean_grad), _maxabs(w_grad[:, T:]))
    return {
        "cases": ctx.cases,
        "junk_rejected": raised,
        "all_finite": all_finite,
        "loss_max_abs_diff": loss_diff,
        "grad_valid_max_abs_diff": grad_diff,
        "grad_padding_max_abs": pad_grad,
        "extra_padding_loss_rel_diff": wide_loss,
        "extra_padding_grad_max_abs_diff": wide_grad,
    }


@registry.check("tar.zero_gate_counts_in_mean")
def zero_gate_counts_in_mean(impl, ctx) -> dict:
    """Appending m zero-gate trajectories to B scales the loss and the old rows' gradient by B / (B + m)."""
    g = ctx.generator(60)
    loss_err = grad_err = 0.0
    min_loss = math.inf
    for _ in range(ctx.cases):
        B, T = _int(g, 1, 6), _int(g, 2, 10)
        for _ in range(1000):  # redraw until the batch has an active trajectory (about one try in two)
            lt, lb, mask, _, _ = replay_case(g, B, T)
            if any(v > 0 for v in _reference(lt, lb, mask)[2].tolist()):
                break
        else:
            raise RuntimeError("could not draw a batch with an active trajectory")
        m = _int(g, 1, 3)
        zlt, zlb, zmask = _zero_gate_case(g, m, T)
        loss, _, grad = _run_replay(impl, ctx, lt, lb, mask, ctx.dtype)
        loss2, _, grad2 = _run_replay(impl, ctx, torch.cat([lt, zlt]), torch.cat([lb, zlb]), torch.cat([mask, zmask]), ctx.dtype)
        want = float(loss) * B / (B + m)
        loss_err = _worst(loss_err, _rel(float(loss2), want))
        scale = float(grad.abs().max())
        grad_err = _worst(grad_err, _maxabs(grad2[:B] - grad * B / (B + m)) / scale if scale > 0 else math.nan)
        min_loss = min(min_loss, abs(float(loss)))
    return {
        "cases": ctx.cases,
        "loss_scale_rel_err": loss_err,
        "grad_scale_rel_err": grad_err,
        "base_loss_min_abs": min_loss,
    }


@registry.check("tar.split_merge_invariance")
def split_merge_invariance(impl, ctx) -> dict:
    """L(B1 u B2) = (|B1| L(B1) + |B2| L(B2)) / |B|, and the gradient likewise, whatever the split."""
    g = ctx.generator(70)
    loss_err = grad_err = 0.0
    for _ in range(ctx.cases):
        B, T = _int(g, 2, 8), _int(g, 1, 10)
        _, _, mask, lt_j, lb_j = replay_case(g, B, T)
        cut = _int(g, 1, B - 1)
        loss, _, grad = _run_replay(impl, ctx, lt_j, lb_j, mask, ctx.dtype)
        l1, _, g1 = _run_replay(impl, ctx, lt_j[:cut], lb_j[:cut], mask[:cut], ctx.dtype)
        l2, _, g2 = _run_replay(impl, ctx, lt_j[cut:], lb_j[cut:], mask[cut:], ctx.dtype)
        merged = (cut * float(l1) + (B - cut) * float(l2)) / B
        loss_err = _worst(loss_err, _rel(float(loss), merged))
        gm = torch.cat([g1 * cut / B, g2 * (B - cut) / B])
        scale = float(grad.abs().max())
        d = _maxabs(grad - gm)
        grad_err = _worst(grad_err, d / scale if scale > 0 else (0.0 if d == 0 else math.nan))
    return {"cases": ctx.cases, "loss_rel_err": loss_err, "grad_rel_err": grad_err}


@registry.check("tar.dtype_extremes")
def dtype_extremes(impl, ctx) -> dict:
    """Moderate, tiny (~1e-6) and huge (+-1e4) deltas, and all-zero weights, in the dtype under test.

    compute error: against the float64 reference on the same dtype-rounded inputs;
    input rounding: the moderate cases against float64 on the unrounded inputs.
    """
    g = ctx.generator(80)
    finite = True
    loss_rel = grad_abs = agree_rel = 0.0
    zero_loss = zero_grad = 0.0
    for _ in range(ctx.cases):
        B, T = _int(g, 1, 6), _int(g, 2, 10)
        cases = []
        # moderate
        _, _, mask, lt_j, lb_j = replay_case(g, B, T)
        cases.append(("moderate", lt_j, lb_j, mask))
        # tiny deltas around a moderate level
        lt = -torch.rand(B, T, generator=g, dtype=F64) * 2 - 0.5
        lb = lt + torch.randn(B, T, generator=g, dtype=F64) * 1e-6
        m = torch.rand(B, T, generator=g) < 0.8
        cases.append(("tiny", lt, lb.clamp_max(0.0), m))
        # huge deltas: +1e4 (theta suppressed) and -1e4 (theta ahead). Each row is all up, all
        # down, or three quarters up, so |mean delta| >= 2.5e3 and no row's gate hangs on a
        # cancellation of +-1e4 terms (which no fp32 computation could resolve).
        pattern = torch.randint(0, 3, (B,), generator=g)
        up = torch.zeros(B, T, dtype=torch.bool)
        for b in range(B):
            if int(pattern[b]) == 0:
                up[b] = True
            elif int(pattern[b]) == 2:
                up[b, torch.randperm(T, generator=g)[: math.ceil(0.75 * T)]] = True
        small = -torch.rand(B, T, generator=g, dtype=F64)
        lt = torch.where(up, torch.full((B, T), -1e4, dtype=F64), small)
        lb = torch.where(up, small, torch.full((B, T), -1e4, dtype=F64))
        m = torch.ones(B, T, dtype=torch.bool)
        cases.append(("huge", lt, lb, m))
        # all weights zero: every delta <= 0
        lb = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 1.0
        lt = lb + torch.rand(B, T, generator=g, dtype=F64) * 2
        lt = lt.clamp_max(0.0)
        m = torch.rand(B, T, generator=g) < 0.8
        cases.append(("zero_weights", lt, lb, m))
        for kind, lt, lb, m in cases:
            loss, _, grad = _run_replay(impl, ctx, lt, lb, m, ctx.dtype)
            ok = bool(torch.isfinite(loss).all() and torch.isfinite(grad).all())
            finite &= ok
            r_loss, r_grad, _, _ = _reference(_rounded(lt, ctx.dtype), _rounded(lb, ctx.dtype), m)
            if kind == "zero_weights":
                zero_loss = _worst(zero_loss, _maxabs(loss))
                zero_grad = _worst(zero_grad, _maxabs(grad))
                continue
            if not ok:
                loss_rel = grad_abs = math.nan
                continue
            loss_rel = _worst(loss_rel, _rel(float(loss), r_loss))
            grad_abs = _worst(grad_abs, _maxabs(grad - r_grad))
            if kind == "moderate":
                o_loss, _, _, _ = _reference(lt, lb, m)
                agree_rel = _worst(agree_rel, _rel(float(loss), o_loss))
    return {
        "cases": ctx.cases,
        "all_finite": finite,
        "zero_weight_loss_abs": zero_loss,
        "zero_weight_grad_max_abs": zero_grad,
        "loss_max_rel_err": loss_rel,
        "grad_max_abs_err": grad_abs,
        "loss_rel_diff_vs_float64_inputs": agree_rel,
    }


@registry.check("tar.rejects_invalid_inputs")
def rejects_invalid_inputs(impl, ctx) -> dict:
    """Positive or non-finite log-probs at valid positions raise ValueError naming the position; padding junk does not."""
    g = ctx.generator(90)
    B, T = 3, 6
    lt, lb, mask, _, _ = replay_case(g, B, T, valid_p=1.0)
    mask[0, 4:] = False
    mask[2, 5] = False
    lb_j = torch.where(mask, lb, torch.full_like(lb, math.nan))
    dt = ctx.dtype

    def call(a, b, m=mask):
        x = _on(ctx, a, dt).requires_grad_(True)
        return impl.adaptive_replay_loss(x, _on(ctx, b, dt), _on(ctx, m))

    def bad(t, value):
        t = t.clone()
        t[1, 2] = value
        return t

    pos_theta, msg = _raises_value_error(lambda: call(bad(lt, 0.25), lb))
    names_position = "(1, 2)" in msg
    # Two bad positions: the first in row-major order is named, not the last.
    two = bad(lt, 0.25)
    two[2, 0] = 0.5
    _, msg_two = _raises_value_error(lambda: call(two, lb))
    pos_base, _ = _raises_value_error(lambda: call(lt, bad(lb, 3.0)))
    nan_theta, _ = _raises_value_error(lambda: call(bad(lt, math.nan), lb))
    inf_base, _ = _raises_value_error(lambda: call(lt, bad(lb, math.inf)))
    ninf_theta, _ = _raises_value_error(lambda: call(bad(lt, -math.inf), lb))
    ninf_base, _ = _raises_value_error(lambda: call(lt, bad(lb, -math.inf)))
    padded_junk = lt.clone()
    padded_junk[2, 5] = 7.0
    junk_raised, _ = _raises_value_error(lambda: call(padded_junk, lb_j))
    return {
        "rejects_positive_theta": pos_theta,
        "rejects_positive_base": pos_base,
        "rejects_nan_theta": nan_theta,
        "rejects_inf_base": inf_base,
        "rejects_neg_inf_theta": ninf_theta,
        "rejects_neg_inf_base": ninf_base,
        "message_names_position": names_position,
        "message_names_first_position": "(1, 2)" in msg_two,
        "accepts_junk_in_padding": not junk_raised,
    }


@registry.check("tar.total_loss_composition")
def total_loss_composition(impl, ctx) -> dict:
    """L_total = L_GRPO + lambda_rep * L_rep in value and in gradient; lambda_rep defaults to 1."""
    g = ctx.generator(100)
    val_err = grad_err = 0.0
    for lam in (None, 0.0, 0.5, 1.0, 2.5):
        a = _on(ctx, torch.randn(4, generator=g, dtype=F64), ctx.dtype).requires_grad_(True)
        b = _on(ctx, torch.randn(5, generator=g, dtype=F64), ctx.dtype).requires_grad_(True)
        grpo = (a * a).sum()
        rep = b.exp().sum()
        total = impl.tar_total_loss(grpo, rep) if lam is None else impl.tar_total_loss(grpo, rep, lambda_rep=lam)
        lv = 1.0 if lam is None else lam
        want = float(grpo.detach()) + lv * float(rep.detach())
        val_err = _worst(val_err, _rel(float(total.detach()), want))
        ga, gb = torch.autograd.grad(total, (a, b), allow_unused=True)
        ga = torch.zeros_like(a) if ga is None else ga
        gb = torch.zeros_like(b) if gb is None else gb
        grad_err = _worst(grad_err, _maxabs((ga - 2 * a).detach().double()), _maxabs((gb - lv * b.exp()).detach().double()))
    neg, _ = _raises_value_error(lambda: impl.tar_total_loss(torch.zeros(()), torch.zeros(()), lambda_rep=-1.0))
    return {"value_rel_err": val_err, "grad_max_abs_err": grad_err, "rejects_negative_lambda": neg}


# --- farthest-point sampling --------------------------------------------------------


def fps_case(g: torch.Generator, *, dup_p: float = 0.0):
    """Random batched candidates: interleaved prompts with arbitrary ids, varied norms,
    some prompts with no correct candidate, some with fewer than k."""
    P = _int(g, 1, 6)
    D = _int(g, 2, 12)
    ids, correct = [], []
    for p in range(P):
        n = _int(g, 0, 9)
        mode = _int(g, 0, 3)  # 0: none correct, 1: all correct, else random
        for _ in range(n):
            c = False if mode == 0 else True if mode == 1 else bool(torch.rand(1, generator=g) < 0.5)
            ids.append(p)
            correct.append(c)
    N = len(ids)
    if N == 0:
        ids, correct, N = [0], [False], 1
    emb = torch.randn(N, D, generator=g, dtype=F64) * torch.exp(torch.randn(N, 1, generator=g, dtype=F64) * 1.5)
    if dup_p > 0 and N > 1:
        for i in range(1, N):
            if bool(torch.rand(1, generator=g) < dup_p):
                j = _int(g, 0, i - 1)
                emb[i] = emb[j] * float(torch.rand(1, generator=g) * 3 + 0.1)
    id_map = torch.randperm(50, generator=g)[:P] - 10  # arbitrary, unsorted, possibly negative ids
    ids_t = id_map[torch.tensor(ids)]
    perm = torch.randperm(N, generator=g)
    return emb[perm], torch.tensor(correct)[perm], ids_t[perm]


def _two_direction_copies() -> torch.Tensor:
    """[16, 5] float64: scaled copies of two fixed directions, first A, A, then B, B, ..."""
    a = torch.tensor([0.3, -1.1, 0.7, 2.3, -0.4], dtype=F64)
    b = torch.tensor([-0.9, 0.2, 0.5, -1.7, 1.3], dtype=F64)
    scales = [0.3, 0.7, 1.7, 2.9, 5.3, 0.45, 1.3, 3.1, 0.9, 7.7, 0.35, 2.2, 4.4, 0.6, 1.1, 6.5]
    return torch.stack([(a if d == "A" else b) * s for d, s in zip("AABBABABBABABABA", scales)])


def _fps(impl, ctx, emb, correct, k, ids):
    out = impl.farthest_point_prototypes(_on(ctx, emb, ctx.dtype), _on(ctx, correct), k=k, prompt_ids=None if ids is None else _on(ctx, ids))
    return [int(i) for i in torch.as_tensor(out).cpu().tolist()]


@registry.check("tar.fps_excludes_incorrect")
def fps_excludes_incorrect(impl, ctx) -> dict:
    """Only correct candidates, min(k, #correct) per prompt, none for a prompt with no correct one."""
    g = ctx.generator(110)
    k = int(ctx.params.get("k", 3))
    incorrect = none_correct_picks = mismatch = dups = out_of_range = 0
    max_per_prompt = 0
    prompts_without = 0
    for c in range(ctx.cases):
        emb, correct, ids = fps_case(g)
        use_ids = None if c % 5 == 4 else ids
        if use_ids is None:
            ids = torch.zeros_like(ids)
        picks = _fps(impl, ctx, emb, correct, k, use_ids)
        N = emb.shape[0]
        out_of_range += sum(1 for i in picks if not 0 <= i < N)
        picks = [i for i in picks if 0 <= i < N]
        dups += len(picks) - len(set(picks))
        incorrect += sum(1 for i in picks if not bool(correct[i]))
        for p in torch.unique(ids).tolist():
            n_correct = int((correct & (ids == p)).sum())
            got = sum(1 for i in picks if int(ids[i]) == p)
            max_per_prompt = max(max_per_prompt, got)
            mismatch += int(got != min(k, n_correct))
            if n_correct == 0:
                prompts_without += 1
                none_correct_picks += got
    return {
        "cases": ctx.cases,
        "k": k,
        "incorrect_picked": incorrect,
        "picks_for_prompts_without_correct": none_correct_picks,
        "count_mismatch_prompts": mismatch,
        "max_picks_per_prompt": max_per_prompt,
        "duplicate_picks": dups,
        "out_of_range_picks": out_of_range,
        "prompts_without_correct": prompts_without,
    }


@registry.check("tar.fps_matches_reference")
def fps_matches_reference(impl, ctx) -> dict:
    """Picks equal the brute-force loop reference (same order), with and without scaled copies;
    every pick is a greedy max-min pick under float64 cosine distances; the declared tie-break
    holds on exact ties and on copies whose distances differ by rounding only."""
    g = ctx.generator(120)
    k = int(ctx.params.get("k", 3))
    exact = dup_exact = 0
    gap = 0.0
    for c in range(ctx.cases):
        emb, correct, ids = fps_case(g)
        e_r = _rounded(emb, ctx.dtype)
        picks = _fps(impl, ctx, emb, correct, k, ids)
        want = ref.fps_bruteforce(e_r.tolist(), correct.tolist(), k, ids.tolist())
        exact += int(picks == want)
        # Scaled copies: ties up to float64 rounding, which the declared tolerance must settle the
        # way the reference does (lowest index), and every pick stays a greedy max-min pick.
        emb2, correct2, ids2 = fps_case(g, dup_p=0.3)
        picks2 = _fps(impl, ctx, emb2, correct2, k, ids2)
        e2_r = _rounded(emb2, ctx.dtype)
        dup_exact += int(picks2 == ref.fps_bruteforce(e2_r.tolist(), correct2.tolist(), k, ids2.tolist()))
        gap = _worst(
            gap,
            ref.fps_maxmin_gap(e_r.tolist(), correct.tolist(), picks, ids.tolist()),
            ref.fps_maxmin_gap(_rounded(emb2, ctx.dtype).tolist(), correct2.tolist(), picks2, ids2.tolist()),
        )
    # Exact ties: +e1, -e1, +e2, -e2, +e3 (scaled); distances 0, 2, 1, 1, 1 from the first.
    axes = torch.tensor([[1, 0, 0], [-2, 0, 0], [0, 3, 0], [0, -1, 0], [0, 0, 5]], dtype=F64)
    tie = _fps(impl, ctx, axes, torch.ones(5, dtype=torch.bool), 3, torch.zeros(5, dtype=torch.long)) == [0, 1, 2]
    # 16 scaled copies of two directions (A A B B A B A B B A B A B A B A): 1 - cos differs between
    # copies by float64 rounding only, so B's first copy (2) and then A's second (1) must win; with
    # exact-equality ties rounding picks others. Built in float64 whatever the dtype: a narrower
    # dtype cannot hold a non-power-of-two copy exactly.
    copies = _two_direction_copies()
    dup_tie = impl.farthest_point_prototypes(_on(ctx, copies), _on(ctx, torch.ones(16, dtype=torch.bool)), k=3).cpu().tolist() == [0, 2, 1]
    # The tie tolerance is 1e-12 in cosine distance, no more and no less: from e_0, candidate 2 is
    # farther than candidate 1 by 3e-12 (not a tie: 2 is picked) or by 3e-13 (a tie: 1 is picked).
    # Eight dimensions, so a distance scaled by 1/D (a mean for the dot product) moves the tie line.
    # Built in float64 whatever the dtype (a narrower one cannot hold a 3e-13 gap).
    def near_tie(gap: float) -> list[int]:
        e = torch.zeros(3, 8, dtype=F64)
        e[0, 0] = 1.0
        for i, c in ((1, 0.5), (2, 0.5 - gap)):
            e[i, 0], e[i, 1] = c, math.sqrt(1.0 - c * c)
        out = impl.farthest_point_prototypes(_on(ctx, e), _on(ctx, torch.ones(3, dtype=torch.bool)), k=2)
        return [int(i) for i in torch.as_tensor(out).cpu().tolist()]

    tol_ok = near_tie(3e-12) == [0, 2] and near_tie(3e-13) == [0, 1]
    # First point: the lowest-index correct candidate, even when it is not "extreme".
    first = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]], dtype=F64)
    first_ok = _fps(impl, ctx, first, torch.tensor([False, True, True]), 1, None) == [1]
    return {
        "cases": ctx.cases,
        "exact_match_fraction": exact / ctx.cases if ctx.cases else math.nan,
        "duplicate_exact_match_fraction": dup_exact / ctx.cases if ctx.cases else math.nan,
        "duplicate_tie_lowest_index": bool(dup_tie),
        "max_maxmin_gap": gap,
        "tie_break_lowest_index": bool(tie),
        "tie_tolerance_1e_12": bool(tol_ok),
        "first_point_lowest_index": bool(first_ok),
    }


@registry.check("tar.fps_rejects_bad_vectors")
def fps_rejects_bad_vectors(impl, ctx) -> dict:
    """A zero-norm, non-finite or norm-overflowing correct embedding raises ValueError naming the
    candidate; the same junk in an incorrect candidate is never read."""
    g = ctx.generator(130)
    D = 5
    emb = torch.randn(8, D, generator=g, dtype=F64)
    correct = torch.tensor([True, False, True, True, False, True, True, False])
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    dt = ctx.dtype

    def call(e, c=correct):
        return impl.farthest_point_prototypes(_on(ctx, e, dt), _on(ctx, c), k=3, prompt_ids=_on(ctx, ids))

    def with_row(i, row):
        e = emb.clone()
        e[i] = row
        return e

    zero, msg = _raises_value_error(lambda: call(with_row(3, torch.zeros(D, dtype=F64))))
    names = "candidate 3" in msg
    nan_row = torch.randn(D, generator=g, dtype=F64)
    nan_row[2] = math.nan
    nan, msg_nan = _raises_value_error(lambda: call(with_row(5, nan_row)))
    inf_row = torch.randn(D, generator=g, dtype=F64)
    inf_row[0] = math.inf
    inf, msg_inf = _raises_value_error(lambda: call(with_row(2, inf_row)))
    # The candidate named is the first bad one in prompt order, not another: a valid row of small
    # norm (0.5) in an earlier prompt beside the zero row, and two bad rows, prompt 2's (index 6)
    # before prompt 1's (index 3) in no order but the prompts'.
    small = with_row(3, torch.zeros(D, dtype=F64))
    small[0] = small[0] / small[0].norm() * 0.5
    _, msg_small = _raises_value_error(lambda: call(small))
    two = with_row(3, torch.zeros(D, dtype=F64))
    two[6] = math.nan
    _, msg_two = _raises_value_error(lambda: call(two))
    first_bad = "candidate 3" in msg_small and "candidate 3" in msg_two and "norm 0" in msg_two
    # Norm overflow exists only for float64 inputs (float64 squares of fp32 values stay finite):
    # always built in float64.
    overflow, msg_over = _raises_value_error(
        lambda: impl.farthest_point_prototypes(
            _on(ctx, with_row(6, torch.full((D,), 1e200, dtype=F64))), _on(ctx, correct), k=3, prompt_ids=_on(ctx, ids)
        )
    )
    clean = [int(i) for i in torch.as_tensor(call(emb)).cpu().tolist()]
    junk = emb.clone()
    junk[1] = math.nan
    junk[4] = 0.0
    junk[7, 0] = math.inf
    try:
        ignored = [int(i) for i in torch.as_tensor(call(junk)).cpu().tolist()] == clean
    except Exception:  # noqa: BLE001 - junk in incorrect rows must be ignored: any refusal of it is the miss measured
        ignored = False
    # Scale invariance at the top of the dtype's range (cosine ignores norms).
    top = min(torch.finfo(dt).max / 8 / math.sqrt(D), 1e150)
    scaled = emb / emb.abs().amax(1, keepdim=True) * top
    try:
        scale_ok = [int(i) for i in torch.as_tensor(call(scaled)).cpu().tolist()] == ref.fps_bruteforce(
            _rounded(scaled, dt).tolist(), correct.tolist(), 3, ids.tolist()
        )
    except Exception:  # noqa: BLE001 - large finite rows are valid input: any refusal of them is the miss measured
        scale_ok = False
    return {
        "rejects_zero_norm": zero,
        "rejects_nan": nan,
        "rejects_inf": inf,
        "rejects_norm_overflow": overflow,
        "message_names_candidate": names,
        "message_names_first_bad_candidate": first_bad,
        # each message says what is wrong with the row: a zero, a non-finite or an overflowing norm
        "message_names_the_fault": ("norm 0" in msg and "not finite" in msg_nan and "not finite" in msg_inf
                                    and "overflows" in msg_over),
        "ignores_junk_in_incorrect": ignored,
        "large_finite_values_accepted": scale_ok,
    }


# --- mechanism run -------------------------------------------------------------------


@registry.check("tar.mechanism_run")
def mechanism_run(impl, ctx) -> dict:
    """Real bank, real GRPO + KL + replay updates on a tiny GRU; see methods/tar/mechanism.py."""
    return mechanism.run(impl, ctx)
