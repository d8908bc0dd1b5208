"""Fast paths added for the benchmarks equal the paths they replace."""

from __future__ import annotations

import math

import pytest
import torch

from methods.mrtpo.credit import credit_weights, credit_weights_from_logits


def logits_case(B=3, T=7, V=500, K=3, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2
    loo = [base + 0.3 * torch.randn(B, T, V, generator=g, dtype=torch.float64) for _ in range(K)]
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[0, 0] = True
    mask[1] = False  # a response with no valid token
    return base.to(dtype), [x.to(dtype) for x in loo], mask


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.float64, 1e-12), (torch.bfloat16, 2e-6)])
@pytest.mark.parametrize("block_elems", [1000, 3 * 500, 1 << 20])  # 2 rows, 3 rows, everything at once
def test_chunked_logits_path_equals_log_softmax_then_credit_weights(dtype, tol, block_elems):
    la, loo, mask = logits_case(dtype=dtype)
    loo[1] = None  # an empty block
    empty = torch.tensor([[False, False, True], [False] * 3, [False] * 3])  # [K, B]
    cdt = torch.float64 if dtype == torch.float64 else torch.float32
    ref = credit_weights(torch.log_softmax(la.to(cdt), -1), [None if x is None else torch.log_softmax(x.to(cdt), -1)
                                                             for x in loo], mask, 0.6, empty_block=empty)
    got = credit_weights_from_logits(la, loo, mask, 0.6, empty_block=empty, block_elems=block_elems, chunk_elems=700)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)
    # credit is conserved per response: weights sum to its valid length
    torch.testing.assert_close(got.sum(-1).double(), mask.sum(-1).double().expand(3, -1), rtol=1e-5, atol=1e-5)


def test_masked_rows_are_never_read():
    la, loo, mask = logits_case()
    junk = [x.clone() for x in [la] + loo]
    for x in junk:
        x[~mask] = math.nan
    clean = credit_weights_from_logits(la, loo, mask, 0.5, block_elems=1000)
    dirty = credit_weights_from_logits(junk[0], junk[1:], mask, 0.5, block_elems=1000)
    assert torch.equal(clean, dirty)


def test_logits_path_refuses_bad_shapes():
    la, loo, mask = logits_case()
    with pytest.raises(ValueError, match="logits_loo\\[1\\]"):
        credit_weights_from_logits(la, [loo[0], loo[1][:, :3]], mask, 0.5)
    with pytest.raises(ValueError, match="mask"):
        credit_weights_from_logits(la, loo, mask[:, :3], 0.5)


# --- TAPO: the fused loss (default parts) equals the loss composed from its parts ---------------

from methods.tapo import objective as tapo_obj  # noqa: E402

TAPO_COMPOSED = tapo_obj.build_tapo_loss(fused=False)
TAPO_FUSED = tapo_obj.build_tapo_loss(fused=True)


def tapo_case(seed, B, L, dtype, junk=None, per_token=False, holes=True, delta=0.5):
    """Prompt slot, holes, padding; junk (if any) in every masked slot of logp, old_logp and per-token A."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3 - 0.01
    old = logp + delta * torch.randn(B, L, generator=g, dtype=torch.float64)
    mask = torch.rand(B, L, generator=g) < (0.7 if holes else 2.0)
    if L > 1:
        mask[:, 0] = False  # a prompt slot
        mask[:, 1] = True
        if seed % 2:
            mask[-1, 2:] = False  # a T = 1 response
    adv = torch.randn(B, L, generator=g, dtype=torch.float64) if per_token else torch.randn(B, generator=g,
                                                                                              dtype=torch.float64)
    if junk is not None:
        logp, old = (torch.where(mask, x, torch.full_like(x, junk)) for x in (logp, old))
        if per_token:
            adv = torch.where(mask, adv, torch.full_like(adv, junk))
    return logp.to(dtype), old.to(dtype), adv.to(dtype), mask


def tapo_run(loss_fn, logp, old, adv, mask, **kw):
    lp = logp.clone().requires_grad_(True)
    loss, met = loss_fn(lp, old, adv, mask, 0.1, 0.2, **kw)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad, met


def assert_same_tapo(a, b):
    # the same float operations on the same values: equal, not close (NaN equal to NaN)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=0, equal_nan=True)
    assert list(a[2]) == list(b[2])
    assert all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a[2].values(), b[2].values())), (a[2], b[2])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("junk", [None, math.nan, 1e4, -math.inf])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("horizon", [None, 40])
@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (4, 2), (5, 13), (3, 37)])
def test_fused_tapo_loss_equals_composed(dtype, junk, per_token, horizon, shape, monkeypatch):
    handed_back = []  # calls the fused loss handed to the composed one: none here, or nothing is compared
    real = tapo_obj._fused_tapo_loss

    def spy(*args):
        out = real(*args)
        handed_back.append(out is None)
        return out

    monkeypatch.setattr(tapo_obj, "_fused_tapo_loss", spy)
    clipped = 0.0
    for seed in range(3):
        for holes in (True, False):
            case = tapo_case(seed, *shape, dtype, junk, per_token, holes, delta=0.5 + seed)
            kw = {} if horizon is None else {"horizon": horizon}
            fused = tapo_run(TAPO_FUSED, *case, **kw)
            assert_same_tapo(fused, tapo_run(TAPO_COMPOSED, *case, **kw))
            assert fused[1].dtype == dtype and fused[0].dtype == tapo_obj.compute_dtype(dtype)
            clipped = max(clipped, fused[2]["clip_active_fraction"])
    assert handed_back == [False] * 6
    if shape[1] > 2:  # the clip zeroed some gradient, so the comparison covered the clipped branch
        assert clipped > 0


def test_fused_tapo_loss_without_grad_and_with_empty_rows():
    logp, old, adv, mask = tapo_case(4, 6, 9, torch.float32)
    mask[2] = False  # a row without a response token: its (junk) advantage counts nowhere
    adv[2] = math.nan
    for fn in (TAPO_FUSED, TAPO_COMPOSED):
        loss, met = fn(logp, old, adv, mask, 0.1, 0.3, group_size=3)
        assert not loss.requires_grad
    fused = TAPO_FUSED(logp, old, adv, mask, 0.1, 0.3, group_size=3)
    composed = TAPO_COMPOSED(logp, old, adv, mask, 0.1, 0.3, group_size=3)
    assert torch.equal(fused[0], composed[0]) and fused[1] == composed[1]


def test_fused_tapo_loss_overflowing_ratio_takes_the_composed_path():
    # R~ overflows float32 at a valid token followed by padding: multiplying padding by a 0 mask
    # would turn inf into NaN, so the fused loss must hand the call to the composed one.
    logp, old, adv, mask = tapo_case(5, 3, 8, torch.float32, junk=math.nan, holes=False)
    mask[0, 5:] = False
    old[0, 1:5] = -400.0
    adv[0] = 1.0
    got = tapo_run(TAPO_FUSED, logp, old, adv, mask)
    want = tapo_run(TAPO_COMPOSED, logp, old, adv, mask)
    assert math.isinf(want[2]["ratio_max"]) and math.isfinite(float(want[0]))
    assert_same_tapo(got, want)


@pytest.mark.parametrize("bad", ["empty", "nonfinite", "zero_group", "split", "horizon"])
@pytest.mark.parametrize("per_token", [False, True])
def test_fused_tapo_loss_raises_what_the_composed_raises(bad, per_token):
    logp, old, adv, mask = tapo_case(6, 4, 7, torch.float64, per_token=per_token)
    kw = {}
    if bad == "empty":
        mask = torch.zeros_like(mask)
    elif bad == "nonfinite":
        adv[1] = math.inf
    elif bad == "zero_group":
        adv[2:] = 0.0
        kw["group_size"] = 2
    elif bad == "split":
        kw["group_size"] = 3
    else:
        kw["horizon"] = 2
    errors = []
    for fn in (TAPO_FUSED, TAPO_COMPOSED):
        with pytest.raises(ValueError) as info:
            fn(logp, old, adv, mask, 0.1, 0.2, **kw)
        errors.append((info.type, str(info.value)))
    assert errors[0] == errors[1]


def test_swapped_part_runs_composed_and_defaults_run_fused(monkeypatch):
    calls = []
    real = tapo_obj._fused_tapo_loss
    monkeypatch.setattr(tapo_obj, "_fused_tapo_loss", lambda *a: calls.append(1) or real(*a))
    logp, old, adv, mask = tapo_case(7, 3, 6, torch.float64)

    def surrogate(ratio, adv, eps):
        return tapo_obj.ppo_surrogate(ratio, adv, eps)

    tapo_obj.build_tapo_loss(surrogate_fn=surrogate)(logp, old, adv, mask, 0.1, 0.2)
    tapo_obj.build_tapo_loss(fused=False)(logp, old, adv, mask, 0.1, 0.2)
    assert calls == []
    tapo_obj.tapo_loss(logp, old, adv, mask, 0.1, 0.2)
    assert calls == [1]
    with pytest.raises(ValueError, match="default parts"):
        tapo_obj.build_tapo_loss(surrogate_fn=surrogate, fused=True)
