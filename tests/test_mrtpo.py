"""MRTPO: closed-form oracles, junk in masked slots, split invariance, gradients,
hypothesis properties on random shapes, the registered checks against the spec,
and every mutant killed by the contracts that claim it."""

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
from engine.spec import memo
from methods.common.grpo import grpo_token_loss
from methods.mrtpo import mutants as mrtpo_mutants
from methods.mrtpo.credit import beta_schedule, credit_weights, js_distance, mrtpo_advantages
from methods.mrtpo.impl import IMPL
from engine.kinds.meter import AllocationMeter
from methods.mrtpo.reference import js_distance_ref, mrtpo_advantages_ref

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "mrtpo.yaml"
LN2 = math.log(2.0)
F64 = torch.float64
HYP = settings(max_examples=30, deadline=None)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def logp(x: torch.Tensor) -> torch.Tensor:
    return x.log_softmax(-1)


def binary_js_ratio(p: float, q: float) -> float:
    """JS / ln 2 between Bernoulli(p) and Bernoulli(q), closed form via entropies,
    JS = H(m) - (H(p) + H(q)) / 2, evaluated in 40-digit decimals (the float64
    entropy difference would cancel for close p and q)."""
    from decimal import Decimal, localcontext

    with localcontext(prec=40):
        P, Q = Decimal(p), Decimal(q)

        def H(x):
            return -sum((v * v.ln() for v in (x, 1 - x) if v > 0), Decimal(0))

        return float((H((P + Q) / 2) - (H(P) + H(Q)) / 2) / Decimal(2).ln())


# --------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_js_closed_forms(dtype):
    # Bernoulli pairs
    for p, q in [(0.5, 0.5), (0.1, 0.9), (0.3, 0.31), (1e-9, 0.5), (0.999, 0.001)]:
        a = torch.tensor([[math.log(p), math.log1p(-p)]], dtype=dtype)
        b = torch.tensor([[math.log(q), math.log1p(-q)]], dtype=dtype)
        # the probabilities the rounded log-probs actually encode (they sum to 1 +- 1 ulp)
        pe, qe = float(a[0, 0].double().exp()), float(b[0, 0].double().exp())
        want = math.sqrt(max(0.0, binary_js_ratio(pe, qe)))
        tol = 1e-14 if dtype == F64 else 1e-6
        assert abs(float(js_distance(a, b)) - want) <= tol
    # uniform over V against a point mass: JS = (KL(u||m) + KL(e0||m)) / 2 in closed form
    V = 7
    u = torch.full((1, V), -math.log(V), dtype=F64)
    e0 = torch.full((1, V), -math.inf, dtype=F64)
    e0[0, 0] = 0.0
    m0, mi = (1 / V + 1) / 2, 1 / (2 * V)
    kl_u = (1 / V) * math.log((1 / V) / m0) + (V - 1) / V * math.log((1 / V) / mi)
    kl_e = math.log(1 / m0)
    want = math.sqrt((kl_u + kl_e) / 2 / LN2)
    assert abs(float(js_distance(u, e0)) - want) <= 1e-15
    # disjoint supports: exactly the maximum
    a = torch.tensor([[0.0, -math.inf]], dtype=dtype)
    b = torch.tensor([[-math.inf, 0.0]], dtype=dtype)
    assert float(js_distance(a, b)) == 1.0
    assert float(js_distance(a, a)) == 0.0


def test_weights_by_hand():
    # one response, two valid tokens and one padding slot; q known from the Bernoulli closed form
    p = [0.2, 0.5, 0.5]
    q = [0.6, 0.5, 0.9]
    la = torch.tensor([[[math.log(x), math.log1p(-x)] for x in p]], dtype=F64)
    lb = torch.tensor([[[math.log(x), math.log1p(-x)] for x in q]], dtype=F64)
    mask = torch.tensor([[True, True, False]])
    beta = 0.4
    w = credit_weights(la, lb[None], mask, beta)
    q0 = math.sqrt(binary_js_ratio(p[0], q[0]))
    q1 = 0.0  # identical distributions at t = 1
    qbar = (q0 + q1) / 2
    want = [(1 - beta) + beta * q0 / qbar, (1 - beta) + beta * q1 / qbar, 0.0]
    assert torch.allclose(w[0, 0], torch.tensor(want, dtype=F64), rtol=0, atol=1e-15)
    assert abs(float(w[0, 0, :2].mean()) - 1.0) <= 1e-15


def test_advantages_by_hand():
    # K = 1: S = A w, U = A, D = A (w - 1); s = min(1, sqrt(T / sum (w - 1)^2))
    w = torch.tensor([[[3.0, 0.5, 0.5, 0.0]]], dtype=F64) / (4.0 / 3.0)  # mean 1 over the 3 valid tokens
    mask = torch.tensor([[True, True, True, False]])
    A = torch.tensor([[2.0]], dtype=F64)
    out, met = mrtpo_advantages(A, w, mask, eps=0.0)
    d = (w[0, 0, :3] - 1.0) * 2.0
    s = min(1.0, math.sqrt(3 * 4.0 / float((d * d).sum())))
    assert abs(met["s"] - s) <= 1e-15 and met["capped"] == (s < 1)
    St = 2.0 + s * d
    std = float(St.std(unbiased=False))
    assert torch.allclose(out[0, :3], St / std, rtol=0, atol=1e-14)
    assert float(out[0, 3]) == 0.0


def test_beta_schedule_values():
    assert beta_schedule(0, 10, 0.8) == 0.0
    assert beta_schedule(-3, 10, 0.8) == 0.0
    assert beta_schedule(5, 10, 0.8) == pytest.approx(0.4, abs=1e-15)
    assert beta_schedule(2.5, 10, 0.8) == pytest.approx(0.8 * 0.15625, abs=1e-15)
    assert beta_schedule(10, 10, 0.8) == 0.8 and beta_schedule(99, 10, 0.8) == 0.8
    assert beta_schedule(0, 0, 0.8) == 0.8
    with pytest.raises(ValueError):
        beta_schedule(1, 10, 1.5)


# --------------------------------------------------------------------------- masks, junk, splits


def _batch(g, K, B, T, V, dtype=F64):
    la = logp(torch.randn(B, T, V, generator=g, dtype=F64)).to(dtype)
    ll = logp(torch.randn(K, B, T, V, generator=g, dtype=F64)).to(dtype)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = torch.arange(T)[None] < lengths[:, None]
    return la, ll, mask


@pytest.mark.parametrize("junk", [math.nan, 1.0e4, -1.0e4, math.inf, -math.inf])
def test_junk_in_padding_changes_nothing(junk):
    g = torch.Generator().manual_seed(1)
    la, ll, mask = _batch(g, 2, 4, 6, 9)
    mask[3] = False
    A = torch.randn(2, 4, generator=g, dtype=F64)
    w = credit_weights(la, ll, mask, 0.7)
    out, met = mrtpo_advantages(A, w, mask, 1e-6)
    pad = ~mask
    la2, ll2, w2, A2 = la.clone(), ll.clone(), w.clone(), A.clone()
    la2[pad] = junk
    ll2[:, pad] = junk
    w2[:, pad] = junk
    A2[:, 3] = junk  # a response with no valid token
    w_j = credit_weights(la2, ll2, mask, 0.7)
    out_j, met_j = mrtpo_advantages(A2, w2, mask, 1e-6)
    assert torch.equal(w, w_j) and torch.equal(out, out_j)
    assert met == met_j
    assert bool((w_j[:, pad] == 0).all()) and bool((out_j[pad] == 0).all())


def test_nan_in_a_valid_slot_is_not_hidden():
    g = torch.Generator().manual_seed(2)
    la, ll, mask = _batch(g, 1, 2, 4, 5)
    la[0, 1, 2] = math.nan
    w = credit_weights(la, ll, mask, 0.5)
    assert bool(torch.isnan(w[0, 0, mask[0]]).all())
    assert bool(torch.isfinite(w[0, 1]).all())


def test_js_split_merge_and_block_invariance():
    g = torch.Generator().manual_seed(3)
    a = logp(torch.randn(37, 50, generator=g, dtype=F64))
    b = logp(torch.randn(37, 50, generator=g, dtype=F64))
    whole = js_distance(a, b)
    parts = torch.cat([js_distance(a[:10], b[:10]), js_distance(a[10:], b[10:])])
    assert torch.allclose(whole, parts, rtol=1e-15, atol=0)
    for chunk in (1, 7, 50, 333, 1 << 20):  # rows only, then columns of one row (chunk < V)
        assert torch.allclose(whole, js_distance(a, b, chunk_elems=chunk), rtol=1e-14, atol=1e-16)


def test_js_non_contiguous_inputs():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 9, 11, generator=g, dtype=F64)
    a = logp(logits)[:, 2:]  # a slice of a [B, L, V] tensor: rows not viewable as one block
    b = logp(torch.randn(3, 9, 11, generator=g, dtype=F64))[:, 2:]
    assert not a.is_contiguous()
    assert torch.equal(js_distance(a, b), js_distance(a.contiguous(), b.contiguous()))


def test_weights_per_response_independence():
    g = torch.Generator().manual_seed(5)
    la, ll, mask = _batch(g, 3, 5, 7, 6)
    w = credit_weights(la, ll, mask, 0.8)
    for b in range(5):
        wb = credit_weights(la[b : b + 1], ll[:, b : b + 1], mask[b : b + 1], 0.8)
        assert torch.allclose(w[:, b : b + 1], wb, rtol=1e-15, atol=0)


def test_empty_block_forms_agree():
    g = torch.Generator().manual_seed(6)
    la, ll, mask = _batch(g, 2, 3, 4, 5)
    flagged = credit_weights(la, ll, mask, 0.9, empty_block=torch.tensor([False, True]))
    per_response = credit_weights(la, ll, mask, 0.9, empty_block=torch.tensor([[False] * 3, [True] * 3]))
    none = credit_weights(la, [ll[0], None], mask, 0.9)
    assert torch.equal(flagged, per_response) and torch.equal(flagged, none)
    assert bool((flagged[1][mask] == 1).all())


def test_input_validation():
    a = torch.zeros(2, 3, dtype=F64)
    with pytest.raises(ValueError):
        js_distance(a, torch.zeros(2, 4, dtype=F64))
    with pytest.raises(ValueError):
        js_distance(a.clone().requires_grad_(), a)
    la = torch.zeros(1, 2, 3, dtype=F64)
    with pytest.raises(ValueError):
        credit_weights(la, la[None], torch.ones(1, 2, dtype=torch.bool), 1.5)
    with pytest.raises(ValueError):
        credit_weights(la, la[None], torch.ones(1, 3, dtype=torch.bool), 0.5)
    with pytest.raises(ValueError):
        mrtpo_advantages(torch.zeros(2, 1), torch.zeros(1, 1, 2), torch.ones(1, 2, dtype=torch.bool))


# --------------------------------------------------------------------------- gradients


def test_student_gradient_is_the_analytic_one():
    """On-policy PPO surrogate with MRTPO token advantages: d loss / d logp_t = -A_t / N on
    valid tokens, 0 on padding; the advantages carry no gradient of their own."""
    g = torch.Generator().manual_seed(7)
    la, ll, mask = _batch(g, 2, 4, 6, 8)
    A_k = torch.randn(2, 4, generator=g, dtype=F64)
    w = credit_weights(la, ll, mask, 0.6)
    adv, _ = mrtpo_advantages(A_k, w, mask, 1e-6)
    assert not adv.requires_grad and not w.requires_grad
    old = torch.randn(4, 6, generator=g, dtype=F64).clamp_max(-0.1)
    lp = old.clone().requires_grad_()
    loss, _ = grpo_token_loss(lp, old, adv, mask)
    (grad,) = torch.autograd.grad(loss, lp)
    n = int(mask.sum())
    want = torch.where(mask, -adv / n, torch.zeros_like(adv))
    assert torch.allclose(grad, want, rtol=0, atol=1e-15)


# --------------------------------------------------------------------------- hypothesis


shapes = st.tuples(st.integers(0, 3), st.integers(1, 4), st.integers(1, 40))


@HYP
@given(shape=shapes, seed=st.integers(0, 2**31 - 1), scale=st.floats(0.01, 30.0))
def test_js_properties_random_shapes(shape, seed, scale):
    lead0, lead1, V = shape
    g = torch.Generator().manual_seed(seed)
    a = logp(torch.randn(lead0, lead1, V, generator=g, dtype=F64) * scale)
    b = logp(torch.randn(lead0, lead1, V, generator=g, dtype=F64) * scale)
    q = js_distance(a, b)
    assert q.shape == (lead0, lead1)
    assert torch.equal(q, js_distance(b, a))
    assert bool(((q >= 0) & (q <= 1)).all())
    assert bool((js_distance(a, a) == 0).all())
    if q.numel():
        want = js_distance_ref(a[0, 0].tolist(), b[0, 0].tolist())
        assert abs(float(q[0, 0]) - want) <= 1e-14


@HYP
@given(K=st.integers(1, 3), B=st.integers(1, 5), T=st.integers(1, 7), V=st.integers(1, 9),
       beta=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1))
def test_weights_conserve_credit_random_shapes(K, B, T, V, beta, seed):
    g = torch.Generator().manual_seed(seed)
    la, ll, mask = _batch(g, K, B, T, V)
    w = credit_weights(la, ll, mask, beta)
    assert w.shape == (K, B, T)
    assert bool((w[:, ~mask] == 0).all())
    assert bool((w[:, mask] >= (1 - beta) - 1e-15).all())
    valid = mask.any(1)
    mean = w.sum(-1)[:, valid] / mask.sum(-1)[valid]
    assert torch.allclose(mean, torch.ones_like(mean), rtol=0, atol=1e-14)


@HYP
@given(K=st.integers(1, 3), B=st.integers(2, 6), T=st.integers(1, 8), spread=st.floats(0.0, 4.0),
       seed=st.integers(0, 2**31 - 1))
def test_advantages_random_shapes(K, B, T, spread, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None] < lengths[:, None]
    raw = torch.exp(spread * torch.randn(K, B, T, generator=g, dtype=F64))
    raw = torch.where(mask[None], raw, 0.0)
    w = raw / (raw.sum(-1, keepdim=True) / mask.sum(-1)[None, :, None])
    A = torch.randn(K, B, generator=g, dtype=F64)
    out, met = mrtpo_advantages(A, w, mask, 1e-6)
    neg, met_neg = mrtpo_advantages(-A, w, mask, 1e-6)
    assert torch.equal(out, -neg) and met["s"] == met_neg["s"]
    assert bool((out[~mask] == 0).all())
    # the cap: sum (S~ - U)^2 <= sum T U^2, read off the output
    U = A.sum(0)
    St = out * (met["std"] + 1e-6)
    D = torch.where(mask, St - U[:, None], 0.0)
    mom_u = float((mask.sum(1) * U * U).sum())
    assert float((D * D).sum()) <= mom_u * (1 + 1e-9) + 1e-300
    ref, s_ref, _ = mrtpo_advantages_ref(A.tolist(), w.tolist(), mask.tolist(), 1e-6)
    scale = max(1.0, float(torch.tensor(ref).abs().max()))
    assert float((out - torch.tensor(ref, dtype=F64)).abs().max()) / scale <= 1e-13
    assert abs(met["s"] - s_ref) <= 1e-14


@HYP
@given(W=st.floats(0.5, 100.0), bmax=st.floats(0.0, 1.0))
def test_beta_schedule_monotone_bounded(W, bmax):
    vals = [beta_schedule(W * i / 40, W, bmax) for i in range(-4, 45)]
    assert all(0.0 <= v <= bmax for v in vals)
    assert all(b >= a for a, b in zip(vals, vals[1:]))
    assert vals[-1] == bmax


# --------------------------------------------------------------------------- pieces of the harness


def test_allocation_meter_counts_storage():
    x = torch.randn(100)
    with AllocationMeter() as m:
        a = torch.empty(1000)  # 4000 bytes
        view, same = a[10:20], a.mul_(2)  # no new storage
        del a, view, same
        d = torch.zeros(500, dtype=F64)  # 4000 bytes
        e = x + 1  # 400 bytes
        f = x[3:5]  # view of an outside tensor: not counted
    assert m.peak_bytes == 4400 and m.current_bytes == 4400
    del d, e, f


def test_js_memory_is_fixed_at_150k_vocabulary():
    """One block of scratch whatever the rows: 8 rows (one row cut into column blocks) and 64 rows both stay
    under one [N, V] float32 tensor, the page's budget (assumption memory)."""
    g = torch.Generator().manual_seed(8)
    for rows in (8, 64):
        a = logp(torch.randn(rows, 150_000, generator=g))
        b = logp(torch.randn(rows, 150_000, generator=g))
        with AllocationMeter() as m:
            q = js_distance(a, b)
        assert m.peak_bytes <= rows * 150_000 * 4
        assert bool(torch.isfinite(q).all())


def test_mutant_copies_are_faithful_but_for_their_defect():
    """The mutants re-implement credit_weights / mrtpo_advantages; with no defect they must
    equal the real functions, so each mutant differs by exactly its one defect."""
    g = torch.Generator().manual_seed(9)
    for _ in range(5):
        la, ll, mask = _batch(g, 2, 4, 5, 7)
        empty = torch.rand(2, 4, generator=g) < 0.3
        same_w = mrtpo_mutants._weights_variant("none")(la, ll, mask, 0.7, empty_block=empty)
        assert torch.equal(same_w, credit_weights(la, ll, mask, 0.7, empty_block=empty))
        A = torch.randn(2, 4, generator=g, dtype=F64)
        a1, m1 = mrtpo_mutants._advantages_variant("none")(A, same_w, mask, 1e-6)
        a2, m2 = mrtpo_advantages(A, same_w, mask, 1e-6)
        assert torch.equal(a1, a2) and m1 == m2


def test_declared_generators_cover_the_regimes_their_contracts_claim():
    """The kind contracts' MRTPO generators draw what the descriptions promise, on every budget seed: every pair
    regime for js_reference, and for weights_reference empty responses, empty blocks, identical distributions and
    beta at 0, 1 and in between; advantages_reference's batches let the cap bind and not bind."""
    from engine.kinds import inputs as inputs_mod

    spec = {c["id"]: c for c in _spec()["contracts"]}
    for seed in (42, 43, 44):
        drawn = [inputs_mod.draw(spec["weights_reference"]["params"]["inputs"], seed, i)[0] for i in range(8)]
        assert any(not bool(d["mask"].any(1).all()) for d in drawn)  # a response without a valid token
        assert any(bool(d["empty"].any()) for d in drawn)
        assert any(bool((d["logp_loo"] == d["logp_all"]).all(-1).all(-1).all(-1).any()) for d in drawn)
        betas = {d["beta"] for d in drawn}
        assert {0.0, 1.0} & betas and any(0 < b < 1 for b in betas)
        pairs = [inputs_mod.draw(spec["js_reference"]["params"]["inputs"], seed, i)[0] for i in range(12)]
        assert all(p["logp_a"].shape == p["logp_b"].shape and 2 <= p["logp_a"].shape[0] <= 8 for p in pairs)
        assert any(bool(torch.isinf(p["logp_b"]).any()) for p in pairs)  # exact zeros and disjoint supports
        adv = [inputs_mod.draw(spec["advantages_reference"]["params"]["inputs"], seed, i)[0] for i in range(12)]
        for a in adv:
            valid = a["mask"].any(1)
            means = a["weights"].sum(-1)[:, valid] / a["mask"].sum(1)[valid]
            assert torch.allclose(means, torch.ones_like(means))  # conserved weights


def test_static_and_runtime_registries_agree():
    reg = registry.load()
    static = registry.static_names()
    runtime_checks = {n for n in reg.checks if n.startswith("mrtpo.")}
    assert runtime_checks == {n for n in static.checks if n.startswith("mrtpo.")}
    runtime_mutants = {n for n in reg.mutants if n.startswith("mrtpo.")}
    assert runtime_mutants == {n for n, base in static.mutants.items() if base == "mrtpo"}
    assert static.implementations["mrtpo"] == IMPL.functions


# --------------------------------------------------------------------------- checks against the spec


def _spec() -> dict:
    # Validated once per process (engine/spec/memo.py; each call gets its own copy): validating the spec costs
    # about a second, and the contract and mutant cases below call this 150 times.
    return memo.load_spec(SPEC, ROOT).data


def _run(impl, contract, dtype, seed=42):
    budget = _spec()["budget"]
    ctx = CheckContext(device=torch.device("cpu"), dtype=DTYPES[dtype], seed=seed, cases=contract["cases"],
                       params=dict(contract.get("params") or {}),
                       meter=Meter(max_updates=budget["max_updates_per_seed"], max_tokens=budget["max_tokens_per_seed"]))
    torch.manual_seed(seed)
    out = registry.load().get_check(contract["check"])(impl, ctx)
    records = [evaluate(e, out, dtype) for e in contract["expect"] if applies(e, dtype)]
    # as the runner counts them: an update of the contract's runs outside the gradient audit's tolerances
    records += [{"metric": "gradient_audit", "passed": False, "why": RunAudit.describe(e)}
                for e in (ctx.audit.failures() if ctx.audit is not None else [])]
    return records, out


CONTRACTS = [c["id"] for c in _spec()["contracts"]]
MUTANTS = [m["id"] for m in _spec()["mutants"]]


def test_every_check_is_in_the_spec():
    """Each bespoke check serves a contract with a reason; every other contract is measured by a generic kind."""
    contracts = _spec()["contracts"]
    bespoke = {c["id"]: c["check"] for c in contracts if not c["check"].startswith("kind:")}
    assert set(bespoke.values()) == {n for n in registry.load().checks if n.startswith("mrtpo.")}
    assert {c["id"] for c in contracts if c["check"] == "kind:budget"} >= {"js_memory", "logits_memory"}
    assert all(c.get("tier") in ("math", "budget", "scale") for c in contracts)
    assert {c["id"] for c in contracts if c["tier"] == "scale"} == {"scale_js", "scale_credit_weights",
                                                                    "scale_from_logits", "scale_advantages"}
    assert {c["id"] for c in contracts if c["tier"] == "budget"} == {
        c["id"] for c in contracts if c["check"] == "kind:budget"}
    assert {m["mutant"] for m in _spec()["mutants"]} == {n for n in registry.load().mutants if n.startswith("mrtpo.")}


@pytest.mark.parametrize("cid", CONTRACTS)
def test_contract_holds_on_the_implementation(cid):
    contract = next(c for c in _spec()["contracts"] if c["id"] == cid)
    for dtype in contract["dtypes"]:
        records, out = _run(IMPL, contract, dtype)
        assert records, f"no expectation applies to {cid} in {dtype}"
        failed = [r for r in records if not r["passed"]]
        assert not failed, f"{cid} [{dtype}]: {failed} (measured {out})"


@pytest.mark.parametrize("mid", MUTANTS)
def test_mutant_is_killed_by_every_contract_that_claims_it(mid):
    spec = _spec()
    m = next(x for x in spec["mutants"] if x["id"] == mid)
    impl = registry.load().get_mutant(m["mutant"]).factory()
    for cid in m["killed_by"]:
        contract = next(c for c in spec["contracts"] if c["id"] == cid)
        killed = False
        for dtype in contract["dtypes"]:  # stop at the first dtype that kills it
            try:
                records, _ = _run(impl, contract, dtype)
            except Exception:  # a check that errors on the mutant also kills it
                killed = True
            else:
                killed = not all(r["passed"] for r in records)
            if killed:
                break
        assert killed, f"mutant {mid} survives contract {cid}"
