"""TAR: soft gate, gated replay loss, FPS bank, contracts, mutants (methods/tar, specs/tar-adaptive-replay.yaml)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.spec import registry
from engine.run.context import DTYPES, CheckContext, Meter
from engine.run.expect import applies, evaluate
from engine.run.run_audit import RunAudit
from engine.spec.loader import load_spec
from methods.tar import IMPL, adaptive_replay_loss, farthest_point_prototypes, soft_gate, tar_total_loss
from methods.tar import inputs as tar_inputs
from methods.tar import reference as ref
from methods.tar.bench import make_inputs
from methods.tar.mutants import replay_variant

F64 = torch.float64
ROOT = Path(__file__).resolve().parents[1]
SPEC_PATH = ROOT / "specs" / "tar-adaptive-replay.yaml"
HYP = settings(max_examples=30, deadline=None, derandomize=True)  # reproducible in CI


def grad_of(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


def replay_case(g: torch.Generator, B: int, T: int):
    """float64 (logp_theta, logp_base, mask, junked copies): rows of either gate sign (a per-row offset of
    delta), both log-probs <= 0 at valid slots, NaN / +-inf / +-1e4 / +5 junk in the junked copies' padding."""
    junk = torch.tensor([math.nan, math.inf, -math.inf, 1.0e4, -1.0e4, 5.0], dtype=F64)
    mask = torch.rand(B, T, generator=g) < 0.8
    lt = -torch.rand(B, T, generator=g, dtype=F64) * 4 - 4
    lb = lt + torch.rand(B, 1, generator=g, dtype=F64) * 4 - 2 + torch.rand(B, T, generator=g, dtype=F64) * 3 - 1.5
    lt, lb = torch.where(mask, lt, -1.0), torch.where(mask, lb, -1.0)
    pick = torch.randint(0, len(junk), (2, B, T), generator=g)
    return lt, lb, mask, torch.where(mask, lt, junk[pick[0]]), torch.where(mask, lb, junk[pick[1]])


def zero_gate_case(g: torch.Generator, B: int, T: int):
    """Rows whose mean delta is -0.25 while single tokens have delta > 0 (w_t > 0, g = 0)."""
    mask = torch.ones(B, T, dtype=torch.bool)
    lt = -torch.rand(B, T, generator=g, dtype=F64) * 3.0 - 3.0
    delta = torch.randn(B, T, generator=g, dtype=F64)
    delta = delta - delta.mean(1, keepdim=True) - 0.25
    return lt, (lt + delta).clamp_max(-1e-3), mask


def ref_loss_grad(lt, lb, mask):
    loss, grad, gates, weights = ref.replay_reference(lt.tolist(), lb.tolist(), mask.tolist())
    return loss, torch.tensor(grad, dtype=F64).reshape(lt.shape), gates, weights


def replay_matches_reference(lt_j, lb_j, mask, loss_abs: float):
    """adaptive_replay_loss and its gradient at (junked) lt_j against the float64 reference, to 1e-12 relative
    (absolute `loss_abs` for the loss, 1e-15 for the gradient); returns (loss, grad, reference gates, weights)."""
    x = lt_j.clone().requires_grad_(True)
    loss, _ = adaptive_replay_loss(x, lb_j, mask)
    grad = grad_of(loss, x)
    r_loss, r_grad, r_gates, r_w = ref_loss_grad(lt_j, lb_j, mask)
    assert loss.item() == pytest.approx(r_loss, rel=1e-12, abs=loss_abs)
    torch.testing.assert_close(grad, r_grad, rtol=1e-12, atol=1e-15)
    return loss, grad, r_gates, r_w


# --- soft gate -----------------------------------------------------------------------


def test_soft_gate_closed_form_and_extremes():
    z = torch.tensor([-1e4, -1.0, -0.0, 0.0, 1e-12, 0.5, 1.0, 1e4], dtype=F64)
    out = soft_gate(z)
    want = torch.tensor([0, 0, 0, 0, 1e-12 - 0.5e-24, 1 - math.exp(-0.5), 1 - math.exp(-1), 1.0], dtype=F64)
    torch.testing.assert_close(out, want, rtol=1e-15, atol=0)
    assert out.dtype == F64
    for dt in DTYPES.values():
        o = soft_gate(torch.tensor([-1e4, -3.0, 0.0, 1e-3, 2.0, 1e4], dtype=dt))
        assert o.dtype == dt and torch.isfinite(o).all()
        assert o[:3].eq(0).all() and o[-1] == 1 and (o >= 0).all() and (o <= 1).all()


def test_soft_gate_rejects_integer_input():
    with pytest.raises(TypeError):
        soft_gate(torch.tensor([1, 2]))


@HYP
@given(st.lists(st.floats(min_value=-1e4, max_value=1e4, allow_nan=False), min_size=1, max_size=40))
def test_soft_gate_matches_reference_and_is_monotone(values):
    z = torch.tensor(values, dtype=F64)
    out = soft_gate(z)
    want = torch.tensor([ref.phi(v) for v in values], dtype=F64)
    torch.testing.assert_close(out, want, rtol=1e-14, atol=1e-300)
    order = torch.argsort(z)
    assert (out[order][1:] >= out[order][:-1]).all()


# --- replay loss ---------------------------------------------------------------------


def test_replay_loss_closed_form():
    # Row 0: delta = [1, 0] -> mean 0.5, g = 1 - e^-0.5, w = [1 - e^-1, 0]; NLL of token 0 is 2.
    # Row 1: delta = [-0.5, 0.25] -> mean -0.125 -> g = 0 (but w_1 > 0).
    lt = torch.tensor([[-2.0, -1.0], [-1.0, -1.0]], dtype=F64, requires_grad=True)
    lb = torch.tensor([[-1.0, -1.0], [-1.5, -0.75]], dtype=F64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    loss, m = adaptive_replay_loss(lt, lb, mask)
    g0, w0 = 1 - math.exp(-0.5), 1 - math.exp(-1.0)
    want = 0.5 * g0 * (w0 * 2.0) / (1e-8 + w0)
    assert loss.item() == pytest.approx(want, rel=1e-15)
    assert m["gates"].tolist() == pytest.approx([g0, 0.0], rel=1e-15)
    assert m["active_fraction"] == 0.5
    assert m["token_weights"][1, 1].item() == pytest.approx(1 - math.exp(-0.25), rel=1e-15)
    grad = grad_of(loss, lt)
    want_grad = torch.tensor([[-0.5 * g0 * w0 / (1e-8 + w0), 0.0], [0.0, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, want_grad, rtol=1e-15, atol=0)


def test_replay_all_zero_weights_is_zero_not_nan_in_every_dtype():
    for dt in DTYPES.values():
        lb = torch.tensor([[-3.0, -2.0, -5.0]], dtype=dt)
        lt = torch.tensor([[-1.0, -2.0, -0.5]], dtype=dt, requires_grad=True)
        loss, m = adaptive_replay_loss(lt, lb, torch.ones(1, 3, dtype=torch.bool))
        g = grad_of(loss, lt)
        assert loss.item() == 0.0 and torch.equal(g, torch.zeros_like(g)), dt
        assert m["weight_sum"].item() == 0.0


def test_replay_half_inputs_computed_in_fp32():
    lt = torch.tensor([[-1e4] * 8], dtype=torch.float16, requires_grad=True)
    lb = torch.zeros(1, 8, dtype=torch.float16)
    loss, _ = adaptive_replay_loss(lt, lb, torch.ones(1, 8, dtype=torch.bool))
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(1e4)  # 8e4 would overflow fp16 sums
    assert grad_of(loss, lt).dtype == torch.float16


def test_replay_empty_bank_and_empty_row():
    lt = torch.zeros(0, 5, dtype=F64, requires_grad=True)
    loss, m = adaptive_replay_loss(lt, torch.zeros(0, 5, dtype=F64), torch.zeros(0, 5, dtype=torch.bool))
    assert loss.item() == 0.0 and m["num_trajectories"] == 0
    # A row with no valid token: gate 0, still counted in |B|.
    lt = torch.tensor([[-3.0, -1.0], [-1.0, -1.0]], dtype=F64, requires_grad=True)
    lb = torch.tensor([[-1.0, -1.0], [5.0, 5.0]], dtype=F64)  # positive junk in the empty row's padding
    mask = torch.tensor([[True, True], [False, False]])
    loss, m = adaptive_replay_loss(lt, lb, mask)
    alone, _ = adaptive_replay_loss(lt[:1], lb[:1], mask[:1])
    assert m["gates"][1].item() == 0.0
    assert loss.item() == pytest.approx(alone.item() / 2, rel=1e-15)


def test_replay_junk_in_padding_changes_nothing():
    g = torch.Generator().manual_seed(0)
    lt, lb, mask, lt_j, lb_j = replay_case(g, 5, 9)
    assert not torch.isfinite(lt_j[~mask]).all()  # the junk really is there
    a = lt.clone().requires_grad_(True)
    b = lt_j.clone().requires_grad_(True)
    la, _ = adaptive_replay_loss(a, lb, mask)
    lj, _ = adaptive_replay_loss(b, lb_j, mask)
    assert torch.equal(la, lj)
    ga, gj = grad_of(la, a), grad_of(lj, b)
    assert torch.equal(ga, gj) and (gj[~mask] == 0).all()


def test_replay_gradient_matches_analytic_and_locality():
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        _, _, mask, lt_j, lb_j = replay_case(g, 6, 11)
        _, grad, r_gates, r_w = replay_matches_reference(lt_j, lb_j, mask, loss_abs=1e-300)
        on = mask & (torch.tensor(r_gates, dtype=F64) > 0)[:, None] & (torch.tensor(r_w, dtype=F64) > 0)
        assert (grad[~on] == 0).all() and (grad[on] != 0).all()


def test_replay_gradient_has_no_second_order_path():
    """With g and w detached, L is linear in logp_theta: the gradient is the analytic constant."""
    torch.manual_seed(3)
    lt = -torch.rand(3, 4, dtype=F64) - 0.1
    lb = lt + torch.randn(3, 4, dtype=F64) * 0.5
    lb = lb.clamp_max(0.0)
    mask = torch.rand(3, 4) < 0.9

    def f(x):
        return adaptive_replay_loss(x, lb, mask)[0]

    x = lt.clone().requires_grad_(True)
    # g and w are detached, so the gradient is a constant of logp_theta: no second-order path.
    (g1,) = torch.autograd.grad(f(x), x, create_graph=True)
    assert not g1.requires_grad
    _, r_grad, _, _ = ref_loss_grad(lt, lb, mask)
    torch.testing.assert_close(g1, r_grad, rtol=1e-12, atol=1e-15)


@HYP
@given(st.integers(1, 6), st.integers(1, 10), st.integers(0, 2**31 - 1))
def test_replay_split_merge_and_zero_gate_rows(B, T, seed):
    g = torch.Generator().manual_seed(seed)
    _, _, mask, lt_j, lb_j = replay_case(g, B, T)
    loss, _, _, _ = replay_matches_reference(lt_j, lb_j, mask, loss_abs=1e-15)
    # Appending m zero-gate rows scales the loss by B / (B + m).
    zlt, zlb, zm = zero_gate_case(g, 2, T)
    big, _ = adaptive_replay_loss(torch.cat([lt_j, zlt]), torch.cat([lb_j, zlb]), torch.cat([mask, zm]))
    assert big.item() == pytest.approx(loss.item() * B / (B + 2), rel=1e-12, abs=1e-300)
    # Split/merge.
    if B > 1:
        cut = B // 2
        l1, _ = adaptive_replay_loss(lt_j[:cut], lb_j[:cut], mask[:cut])
        l2, _ = adaptive_replay_loss(lt_j[cut:], lb_j[cut:], mask[cut:])
        assert loss.item() == pytest.approx((cut * l1.item() + (B - cut) * l2.item()) / B, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize(
    "where, value",
    [("theta", 0.3), ("base", 1e-6), ("theta", math.nan), ("base", math.inf), ("theta", -math.inf), ("base", math.nan)],
)
def test_replay_rejects_invalid_valid_positions(where, value):
    lt = torch.full((2, 3), -1.0, dtype=F64)
    lb = torch.full((2, 3), -0.5, dtype=F64)
    (lt if where == "theta" else lb)[1, 2] = value
    with pytest.raises(ValueError, match=r"\(1, 2\)"):
        adaptive_replay_loss(lt.requires_grad_(True), lb, torch.ones(2, 3, dtype=torch.bool))


def test_replay_rejects_shape_mismatch_and_bad_mask():
    lt = torch.full((2, 3), -1.0)
    with pytest.raises(ValueError, match="same shape"):
        adaptive_replay_loss(lt, torch.full((2, 4), -1.0), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="0 and 1"):
        adaptive_replay_loss(lt, lt, torch.full((2, 3), 2))
    with pytest.raises(ValueError, match="0 and 1"):
        adaptive_replay_loss(lt, lt, torch.full((2, 3), 0.5))
    # a float 0/1 mask is the bool mask (the interfaces' mask convention)
    assert float(adaptive_replay_loss(lt, lt - 1.0, torch.ones(2, 3))[0]) == \
        float(adaptive_replay_loss(lt, lt - 1.0, torch.ones(2, 3, dtype=torch.bool))[0])


def test_tar_total_loss():
    a = torch.tensor(2.0, dtype=F64, requires_grad=True)
    b = torch.tensor(3.0, dtype=F64, requires_grad=True)
    t = tar_total_loss(a * a, b * b)
    assert t.item() == 13.0
    ga, gb = torch.autograd.grad(t, (a, b))
    assert ga.item() == 4.0 and gb.item() == 6.0
    t = tar_total_loss(a * a, b * b, lambda_rep=0.5)
    assert t.item() == 8.5 and torch.autograd.grad(t, b)[0].item() == 3.0
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            tar_total_loss(a, b, lambda_rep=bad)


# --- FPS -----------------------------------------------------------------------------


def test_fps_closed_form_ties_and_first_point():
    axes = torch.tensor([[1.0, 0, 0], [-2, 0, 0], [0, 3, 0], [0, -1, 0], [0, 0, 5]])
    assert farthest_point_prototypes(axes, torch.ones(5, dtype=torch.bool), k=3).tolist() == [0, 1, 2]
    # the first point is the lowest-index *correct* candidate
    assert farthest_point_prototypes(axes, torch.tensor([0, 0, 1, 1, 1]), k=2).tolist() == [2, 3]
    # k larger than the correct count; k = 0
    assert farthest_point_prototypes(axes, torch.tensor([0, 1, 0, 0, 1]).bool(), k=3).tolist() == [1, 4]
    assert farthest_point_prototypes(axes, torch.ones(5, dtype=torch.bool), k=0).tolist() == []


def test_fps_batched_prompts_excludes_incorrect_and_empty_prompts():
    emb = torch.randn(12, 4, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([7, 3, 7, 3, 9, 9, 3, 7, 9, 3, 7, 3])
    correct = torch.tensor([1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 1, 0]).bool()  # prompt 9: no correct candidate
    out = farthest_point_prototypes(emb, correct, k=3, prompt_ids=ids).tolist()
    assert all(bool(correct[i]) for i in out)
    assert [int(ids[i]) for i in out] == [3, 3, 3, 7, 7, 7]  # ascending prompt id; none for 9
    assert out == ref.fps_bruteforce(emb.tolist(), correct.tolist(), 3, ids.tolist())
    assert farthest_point_prototypes(emb, torch.zeros(12, dtype=torch.bool), prompt_ids=ids).numel() == 0


@HYP
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.sampled_from(list(DTYPES)))
def test_fps_equals_bruteforce_and_per_prompt_loop(seed, k, dtype):
    g = torch.Generator().manual_seed(seed)
    emb, correct, ids = tar_inputs.fps_case(g)
    x = emb.to(DTYPES[dtype])
    out = farthest_point_prototypes(x, correct, k=k, prompt_ids=ids)
    assert out.dtype == torch.long
    assert out.tolist() == ref.fps_bruteforce(x.double().tolist(), correct.tolist(), k, ids.tolist())
    assert out.tolist() == ref.fps_per_prompt_loop(x, correct, k, ids).tolist()
    assert ref.fps_maxmin_gap(x.double().tolist(), correct.tolist(), out.tolist(), ids.tolist()) <= 1e-12


@HYP
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.sampled_from(list(DTYPES)))
def test_fps_scaled_copies_tie_to_the_lowest_index_not_to_rounding(seed, k, dtype):
    # Scaled copies of earlier candidates: their 1 - cos differ by float64 rounding only.
    # A few percent of such cases meet a rounding tie, so each example tries several.
    g = torch.Generator().manual_seed(seed)
    for _ in range(8):
        emb, correct, ids = tar_inputs.fps_case(g, dup_p=0.4)
        x = emb.to(DTYPES[dtype])
        out = farthest_point_prototypes(x, correct, k=k, prompt_ids=ids).tolist()
        assert out == ref.fps_bruteforce(x.double().tolist(), correct.tolist(), k, ids.tolist())
        assert out == ref.fps_per_prompt_loop(x, correct, k, ids).tolist()


def test_fps_copies_of_two_directions_pick_first_copies_first():
    a = torch.tensor([0.3, -1.1, 0.7, 2.3, -0.4], dtype=F64)
    b = torch.tensor([-0.9, 0.2, 0.5, -1.7, 1.3], dtype=F64)
    scales = [0.3, 0.7, 1.7, 2.9, 5.3, 0.45, 1.3, 3.1, 0.9, 7.7, 0.35, 2.2, 4.4, 0.6, 1.1, 6.5]
    copies = torch.stack([(a if d == "A" else b) * s for d, s in zip("AABBABABBABABABA", scales)])
    ones = torch.ones(16, dtype=torch.bool)
    assert farthest_point_prototypes(copies, ones, k=3).tolist() == [0, 2, 1]
    assert ref.fps_bruteforce(copies.tolist(), [True] * 16, 3) == [0, 2, 1]
    # the mutant with exact-equality ties lets float64 rounding of 1 - cos choose, on every seed
    mutant = registry.load().get_mutant("tar.fps_rounding_ties").factory()
    assert mutant.farthest_point_prototypes(copies, ones, k=3).tolist() != [0, 2, 1]


def test_fps_scale_and_permutation_of_other_prompts_do_not_matter():
    g = torch.Generator().manual_seed(5)
    emb, correct, ids = tar_inputs.fps_case(g)
    base = farthest_point_prototypes(emb, correct, prompt_ids=ids)
    scaled = farthest_point_prototypes(emb * torch.rand(emb.shape[0], 1, generator=g, dtype=F64).add(0.1) * 1e3, correct, prompt_ids=ids)
    assert torch.equal(base, scaled)


@pytest.mark.parametrize("row, match", [
    (torch.zeros(3), "norm 0"),
    (torch.tensor([1.0, math.nan, 0.0]), "not finite"),
    (torch.tensor([math.inf, 0.0, 0.0]), "not finite"),
    (torch.tensor([1e200, 1e200, 0.0], dtype=F64), "overflows"),
    (torch.tensor([1e-200, 0.0, 0.0], dtype=F64), "norm 0"),
])
def test_fps_rejects_bad_correct_vectors(row, match):
    emb = torch.randn(4, 3, dtype=F64)
    emb[2] = row.to(F64)
    with pytest.raises(ValueError, match=f"candidate 2.*{match}|{match}"):
        farthest_point_prototypes(emb, torch.ones(4, dtype=torch.bool))
    # the same junk in an incorrect candidate is never read
    out = farthest_point_prototypes(emb, torch.tensor([True, True, False, True]))
    assert 2 not in out.tolist()


def test_fps_names_the_first_bad_row_in_prompt_order():
    # candidate 1 (prompt 5) has the lower index, candidate 4 (prompt 1) comes first in prompt order
    emb = torch.randn(6, 3, dtype=F64)
    emb[1] = 0.0
    emb[4, 0] = math.nan
    with pytest.raises(ValueError, match="candidate 4 is not finite"):
        farthest_point_prototypes(emb, torch.ones(6, dtype=torch.bool), prompt_ids=torch.tensor([5, 5, 1, 2, 1, 2]))


@pytest.mark.parametrize("seed", range(4))
def test_fps_prompt_ids_of_any_range_give_the_same_picks(seed):
    # ids far apart (ranked without a bincount over their range) or narrow and signed
    emb, correct, ids = tar_inputs.fps_case(torch.Generator().manual_seed(seed))
    base = farthest_point_prototypes(emb, correct, k=3, prompt_ids=ids)
    for wide in (ids * 10**12 - 3, ids.to(torch.int32) * 50_000, (ids * 3 - 50).to(torch.int8)):
        assert torch.equal(farthest_point_prototypes(emb, correct, k=3, prompt_ids=wide), base)
    assert base.tolist() == ref.fps_bruteforce(emb.tolist(), correct.tolist(), 3, ids.tolist())


def test_fps_rejects_bad_arguments():
    with pytest.raises(ValueError):
        farthest_point_prototypes(torch.randn(3, 2), torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError):
        farthest_point_prototypes(torch.randn(3, 2), torch.ones(3, dtype=torch.bool), k=-1)
    with pytest.raises(ValueError):
        farthest_point_prototypes(torch.randn(3, 2), torch.ones(3, dtype=torch.bool), prompt_ids=torch.zeros(3))
    with pytest.raises(ValueError):
        farthest_point_prototypes(torch.arange(6).reshape(3, 2), torch.ones(3, dtype=torch.bool))


def test_fps_benchmark_shape_identical_picks():
    emb, correct, ids = make_inputs(512, 32, 64)
    fast = farthest_point_prototypes(emb, correct, 3, ids)
    slow = ref.fps_per_prompt_loop(emb, correct, 3, ids)
    assert torch.equal(fast, slow) and fast.numel() == 3 * 512


# --- registry, spec, checks and mutants ------------------------------------------------


def test_registry_static_view_sees_everything():
    reg = registry.load()
    static = registry.static_names()
    tar_checks_rt = {c for c in reg.checks if c.startswith("tar.")}
    assert tar_checks_rt == {c for c in static.checks if c.startswith("tar.")}
    assert {m for m in reg.mutants if m.startswith("tar.")} == {m for m, b in static.mutants.items() if b == "tar"}
    assert static.implementations["tar"] == IMPL.functions


def test_replay_variant_defaults_equal_the_implementation():
    g = torch.Generator().manual_seed(9)
    for dt in DTYPES.values():
        _, _, mask, lt_j, lb_j = replay_case(g, 4, 7)
        a = lt_j.to(dt).requires_grad_(True)
        b = lt_j.to(dt).requires_grad_(True)
        la, ma = adaptive_replay_loss(a, lb_j.to(dt), mask)
        lv, mv = replay_variant(b, lb_j.to(dt), mask)
        assert torch.equal(la, lv) and torch.equal(grad_of(la, a), grad_of(lv, b))
        assert torch.equal(ma["gates"], mv["gates"]) and torch.equal(ma["token_weights"], mv["token_weights"])


@pytest.fixture(scope="module")
def spec():
    return load_spec(SPEC_PATH, ROOT)


def _ctx(contract, dtype, seed=42, meter=None):
    budget = load_spec(SPEC_PATH, ROOT).data["budget"]
    return CheckContext(
        device=torch.device("cpu"), dtype=DTYPES[dtype], seed=seed, cases=contract["cases"],
        params=dict(contract.get("params") or {}),
        meter=meter or Meter(max_updates=budget["max_updates_per_seed"], max_tokens=budget["max_tokens_per_seed"]),
    )


def _failures(impl, contract, dtype):
    """Failed expectations of one contract for one dtype (a raising check counts as a failure), and, as the runner
    counts them, the updates of its runs outside the gradient audit's tolerances."""
    check = registry.load().get_check(contract["check"])
    ctx = _ctx(contract, dtype)
    try:
        measured = check(impl, ctx)
    except Exception as e:  # an error kills a mutant just as a failure does
        return [f"raised {type(e).__name__}: {e}"]
    records = [evaluate(e, measured, dtype) for e in contract["expect"] if applies(e, dtype)]
    assert records, f"{contract['id']}: no expectation applies to {dtype}"
    audit = [RunAudit.describe(e) for e in ctx.audit.failures()] if ctx.audit is not None else []
    return [f"{r['metric']}={r['value']} {r['op']} {r['threshold']}" for r in records if not r["passed"]] + audit


def test_spec_validates_and_names_every_check(spec):
    by_id = {c["id"]: c for c in spec.data["contracts"]}
    checks = {c["check"] for c in by_id.values() if not c["check"].startswith("kind:")}
    assert checks == {c for c in registry.load().checks if c.startswith("tar.")}
    assert len(checks) <= 7 and all(c.get("why") for c in by_id.values() if c["kind"] in ("bespoke", "mechanism"))
    assert all(c.get("tier") in ("math", "budget", "scale") for c in by_id.values())
    killers = {cid for m in spec.data["mutants"] for cid in m["killed_by"]}
    assert killers == {c["id"] for c in spec.data["contracts"]}
    assert {m["mutant"] for m in spec.data["mutants"]} == {m for m in registry.load().mutants if m.startswith("tar.")}


def test_every_contract_holds_on_the_real_implementation(spec):
    problems = {}
    for c in spec.data["contracts"]:
        for dt in c["dtypes"]:
            f = _failures(IMPL, c, dt)
            if f:
                problems[(c["id"], dt)] = f
    assert not problems, problems


def test_every_mutant_is_killed_by_every_contract_that_claims_it(spec):
    by_id = {c["id"]: c for c in spec.data["contracts"]}
    survived = []
    for m in spec.data["mutants"]:
        impl = registry.load().get_mutant(m["mutant"]).factory()
        for cid in m["killed_by"]:
            c = by_id[cid]
            if not any(_failures(impl, c, dt) for dt in c["dtypes"]):
                survived.append((m["id"], cid))
    assert not survived, f"mutants not killed by a contract that claims them: {survived}"


def test_mechanism_records_steps_and_stays_in_budget(spec):
    c = next(c for c in spec.data["contracts"] if c["kind"] == "mechanism")
    meter = Meter(max_updates=spec.data["budget"]["max_updates_per_seed"], max_tokens=spec.data["budget"]["max_tokens_per_seed"])
    ctx = _ctx(c, "float32", seed=43, meter=meter)
    out = registry.load().get_check(c["check"])(IMPL, ctx)
    assert out["updates"] == 3 and len(ctx.steps) == 4
    bank, updates = ctx.steps[0], ctx.steps[1:]
    assert bank["phase"] == "bank" and bank["candidates"] == 48 and len(bank["verifier_correct"]) == 48
    assert all(bank["verifier_correct"][i] == 1 for i in bank["fps_indices"])
    # policy = base at the first update, so no replay; within float32 noise, not exactly: the actor (train
    # mode, with grad) and the frozen base (eval) can take CPU GRU kernels that differ in the last bit.
    assert abs(updates[0]["replay_loss"]) <= 1e-5 and max(updates[0]["gates"], default=0.0) <= 1e-5
    for s in updates:
        for key in ("replay_active", "gates", "token_weight_mean", "replay_grad_norm", "grpo_loss", "kl_to_base"):
            assert key in s
    assert out["sampled_tokens"] <= spec.data["budget"]["max_tokens_per_seed"]


def test_replay_sends_no_gradient_to_the_base_logprobs():
    g = torch.Generator().manual_seed(4)
    _, lb, mask, lt_j, _ = replay_case(g, 4, 6)
    x = lt_j.clone().requires_grad_(True)
    b = lb.clone().requires_grad_(True)
    loss, _ = adaptive_replay_loss(x, b, mask)
    gx, gb = torch.autograd.grad(loss, (x, b), allow_unused=True)
    assert gb is None and gx is not None


# --- harness steps the method decides (methods/tar/harness.py) ----------------------


def test_kl_to_base_is_kl_theta_to_base_in_closed_form():
    from methods.tar.harness import kl_to_base

    # two positions, vocabulary 2; the second position is padding holding junk
    p = torch.tensor([[[0.75, 0.25], [0.5, 0.5]]], dtype=torch.float64)
    q = torch.tensor([[[0.5, 0.5], [0.9, 0.1]]], dtype=torch.float64)
    mask = torch.tensor([[True, False]])
    got = kl_to_base(p.log(), q.log(), mask)
    want = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    reverse = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    assert float(got) == pytest.approx(want, rel=1e-14) and abs(want - reverse) > 1e-2
    assert float(kl_to_base(q.log(), q.log(), torch.ones(1, 2, dtype=torch.bool))) == 0.0
    lp = p.log().requires_grad_(True)
    (g,) = torch.autograd.grad(kl_to_base(lp, q.log(), mask), lp)
    assert torch.equal(g[0, 1], torch.zeros(2, dtype=torch.float64))  # padding gets no gradient


def test_encoder_pools_valid_tokens_only():
    from methods.common.policy import TinyGRUPolicy
    from methods.tar.harness import trajectory_embeddings

    base = TinyGRUPolicy.seeded(5)
    prompts = torch.tensor([[3, 4, 5, 6], [3, 4, 5, 6]])
    responses = torch.tensor([[7, 1, 0, 0], [7, 1, 9, 12]])  # same valid tokens, different junk after EOS
    mask = torch.tensor([[True, True, False, False]] * 2)
    e = trajectory_embeddings(base, prompts, responses, mask)
    assert e.dtype == torch.float64 and torch.equal(e[0], e[1])
    _, hidden, _ = base(torch.cat([prompts, responses], 1))
    torch.testing.assert_close(e[0], hidden[0, 4:6].double().mean(0), rtol=1e-15, atol=0)


def test_bank_logprobs_come_from_the_frozen_base():
    from methods.common import sequence_logprobs, snapshot
    from methods.common.policy import TinyGRUPolicy
    from methods.tar.harness import bank_logprobs

    policy = TinyGRUPolicy.seeded(6)
    base = snapshot(policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.3)
    prompts, responses = torch.tensor([[3, 4, 5, 6]]), torch.tensor([[7, 8, 1]])
    lt, lb = bank_logprobs(policy, base, prompts, responses)
    assert lt.requires_grad and not lb.requires_grad
    with torch.no_grad():
        want, _ = sequence_logprobs(base, prompts, responses)
    assert torch.equal(lb, want) and not torch.allclose(lt.detach(), lb)


@pytest.mark.parametrize("seed", [42, 43, 44])
def test_mechanism_replay_fires_and_harness_matches_its_references(spec, seed):
    c = next(c for c in spec.data["contracts"] if c["kind"] == "mechanism")
    out = registry.load().get_check(c["check"])(IMPL, _ctx(c, "float32", seed=seed))
    assert out["replay_fired_steps"] >= 1 and out["replay_fired_max_grad_norm"] > 0
    assert out["bank_base_logp_max_abs_err"] <= 1e-5 and out["kl_max_abs_err"] <= 1e-6
    assert out["encoder_max_abs_err"] <= 1e-12 and out["bank_fps_mismatch"] == 0 and out["padded_candidates"] >= 1


def test_fps_source_mutants_are_edits_of_the_batched_fps():
    from methods.tar import mutants

    with pytest.raises(RuntimeError, match="expected once"):
        mutants._fps_variant("x", [("_segment_fps", "no such text", "")])
    same = mutants._fps_variant("same", [])
    g = torch.Generator().manual_seed(2)
    for _ in range(4):
        emb, correct, ids = tar_inputs.fps_case(g)
        assert torch.equal(same.farthest_point_prototypes(emb, correct, 3, ids),
                           IMPL.farthest_point_prototypes(emb, correct, 3, ids))


def test_fps_fast_path_inputs_take_each_branch():
    from methods.tar import fps

    assert ref.BLOCK_BYTES == fps._BLOCK_BYTES  # the reference's branch counts use the FPS's own block size
    g = torch.Generator().manual_seed(3)
    emb, correct, ids = tar_inputs._wide_ids(g)
    assert int(ids.max() - ids.min()) + 1 > 4 * ids.numel() + 4096 and len(set(ids[correct].tolist())) >= 3
    emb, correct, ids = tar_inputs._many_rows(g, 64)
    assert ref.fps_loop_tensor(emb, correct, 3, ids)["counts"]["multi_block_cases"] == 1


# --- mutation targets ----------------------------------------------------------------


def test_mutation_targets_are_the_code_the_default_run_uses():
    """`contracts mutate` mutates what implements TAR (loss, FPS, harness steps, the mechanism run, the shared mask
    check every interface call runs), never the modules that only measure or benchmark it."""
    import sys

    from engine.run.mutate.generate import target_modules

    modules = sorted({getattr(IMPL, f).__module__ for f in IMPL.functions})
    got = {m.rpartition(".")[2] for m, _ in target_modules(modules, {m: sys.modules[m].__file__ for m in modules})}
    assert got == {"fps", "harness", "mechanism", "replay", "masking"}  # masking: declared in __mutate_also__


def test_mechanism_settings_come_from_the_spec_only(spec):
    from methods.tar import mechanism

    c = next(c for c in spec.data["contracts"] if c["kind"] == "mechanism")
    assert set(c["params"]) == set(mechanism.SETTINGS)
    assert mechanism.settings(c["params"]) == {k: c["params"][k] for k in mechanism.SETTINGS}
    partial = {k: v for k, v in c["params"].items() if k not in ("lr", "bank_k")}
    with pytest.raises(ValueError, match="must set bank_k, lr$"):
        mechanism.settings(partial)


def test_an_update_without_bank_rows_equals_the_replay_of_an_empty_batch(spec):
    """Why `if bank_sel.responses.shape[0]` may skip the replay call (and why its shape[1] mutants are listed as
    equivalent): on an empty selection the implementation returns a zero loss with a zero gradient, so the
    update is the same whichever branch runs."""
    from methods.common import TargetTokenTask, sample, snapshot
    from methods.common.policy import TinyGRUPolicy
    from methods.tar import mechanism

    c = next(c for c in spec.data["contracts"] if c["kind"] == "mechanism")
    cfg = mechanism.settings(c["params"])
    task = TargetTokenTask(vocab_size=cfg["vocab_size"])
    policy = TinyGRUPolicy.seeded(7, vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"])
    base = snapshot(policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05)
    prompts = task.prompts(2, torch.Generator().manual_seed(1)).repeat_interleave(cfg["group_size"], 0)
    roll = sample(policy, prompts, cfg["max_new_tokens"], torch.Generator().manual_seed(2))
    rewards = task.verify(prompts, roll.responses, roll.mask)
    T = roll.responses.shape[1]
    empty = mechanism.Bank(torch.zeros(0, dtype=torch.long), torch.zeros(0, prompts.shape[1], dtype=torch.long),
                           torch.zeros(0, T, dtype=torch.long), torch.zeros(0, T, dtype=torch.bool))
    skipped, parts = mechanism.step_losses(IMPL, policy, base, roll, rewards, empty, cfg)
    assert parts["replay_metrics"] is None  # the zero branch ran
    lt, lb = IMPL.bank_logprobs(policy, base, empty.prompts, empty.responses)
    rep, _ = IMPL.adaptive_replay_loss(lt, lb, empty.mask)
    called = IMPL.tar_total_loss(parts["grpo"] + cfg["beta_kl"] * parts["kl"], rep, lambda_rep=cfg["lambda_rep"])
    params = list(policy.parameters())
    assert float(rep.detach()) == 0.0 and torch.equal(skipped.detach(), called.detach())
    for a, b in zip(torch.autograd.grad(skipped, params, retain_graph=True), torch.autograd.grad(called, params)):
        assert torch.equal(a, b)


def test_kl_to_base_reads_a_zero_probability_as_0_log_0_with_a_zero_gradient():
    """logdist -inf (p_theta = 0): the entry adds 0 log 0 = 0 and gets gradient 0, not 0 * -inf = NaN; where the
    base gives 0 probability to an entry the policy does not, the KL is +inf."""
    from methods.tar.harness import kl_to_base

    ninf = -math.inf
    ld = torch.log_softmax(torch.tensor([[[0.0, ninf, 1.0], [0.5, 0.0, ninf]]], dtype=torch.float64), -1)
    bd = torch.log_softmax(torch.tensor([[[0.2, 0.0, 1.0], [0.0, 0.3, 0.1]]], dtype=torch.float64), -1)
    x = ld.clone().requires_grad_(True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    kl = kl_to_base(x, bd, mask)
    (g,) = torch.autograd.grad(kl, x)
    p = ld.exp()
    want = torch.where(p > 0, p * (ld - bd), torch.zeros_like(p)).sum(-1).mean()
    assert float(kl.detach()) == pytest.approx(float(want), rel=1e-14) and not bool(torch.isnan(g).any())
    assert float(g[0, 0, 1]) == 0.0 and float(g[0, 1, 2]) == 0.0
    assert float(kl_to_base(bd, ld, mask)) == math.inf
