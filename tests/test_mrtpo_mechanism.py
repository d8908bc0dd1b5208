"""MRTPO mechanism audits and fast paths: the context builder by hand, the warm-up origin, the run's
kept tensors, the page's figures in every receipt, and mutant copies faithful but for their defect.

(The spec's contracts and mutants themselves run in tests/test_mrtpo.py, parametrised over the spec.)
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.run.context import CheckContext, Meter
from engine.spec import registry
from methods.mrtpo import mechanism, mechanism_checks
from methods.mrtpo import mutants as mrtpo_mutants
from methods.mrtpo.credit import credit_weights_from_logits, js_block_shape, js_distance
from methods.mrtpo.impl import IMPL

F64 = torch.float64
RUN = {"updates": 3, "prompts": 4, "group_size": 8, "max_new_tokens": 8, "lr": 0.01, "warmup_steps": 2,
       "beta_max": 0.5, "eps": 1.0e-6}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _ctx(seed=42, params=RUN, cases=1, dtype=torch.float32):
    torch.manual_seed(seed)
    return CheckContext(device=torch.device("cpu"), dtype=dtype, seed=seed, cases=cases, params=dict(params),
                        meter=Meter(max_updates=8, max_tokens=2000))


def test_replay_contexts_by_hand():
    prompts = torch.tensor([[2, 3, 4], [5, 6, 7]])
    b0 = torch.tensor([[22, 23], [22, 24]])
    b1 = torch.tensor([[27, 28], [27, 29]])
    full, loo = IMPL.replay_contexts(prompts, [b0, b1])
    assert full.tolist() == [[2, 3, 4, 22, 23, 27, 28], [5, 6, 7, 22, 24, 27, 29]]
    assert loo[0].tolist() == [[2, 3, 4, 27, 28], [5, 6, 7, 27, 29]]  # without block 0 only
    assert loo[1].tolist() == [[2, 3, 4, 22, 23], [5, 6, 7, 22, 24]]  # without block 1 only
    full, loo = IMPL.replay_contexts(prompts, [b0[:, :0], b1])  # an empty block: its context is the full one
    assert torch.equal(loo[0], full) and loo[1].tolist() == prompts.tolist()


def test_expected_contexts_agree_with_the_builder_and_catch_each_context_mutant():
    g = torch.Generator().manual_seed(3)
    prompts = mechanism.make_prompts(5, g)
    blocks = mechanism.info_blocks(prompts)
    want_full, want_loo = mechanism_checks._expected_contexts(prompts, blocks)
    got_full, got_loo = IMPL.replay_contexts(prompts, blocks)
    assert torch.equal(want_full, got_full) and all(torch.equal(a, b) for a, b in zip(want_loo, got_loo))
    for bad in (mrtpo_mutants._loo_equals_full, mrtpo_mutants._loo_swapped_blocks):
        _, loo = bad(prompts, blocks)
        assert not all(mechanism_checks._same_tokens(a, b) for a, b in zip(loo, want_loo))
    # the fixed-width builder is right while every block has the same width, wrong once one is empty
    _, loo = mrtpo_mutants._loo_fixed_block_width(prompts, blocks)
    assert all(torch.equal(a, b) for a, b in zip(loo, want_loo))
    empty = [blocks[0][:, :0], blocks[1]]
    _, loo = mrtpo_mutants._loo_fixed_block_width(prompts, empty)
    _, want = mechanism_checks._expected_contexts(prompts, empty)
    assert not mechanism_checks._same_tokens(loo[0], want[0])


def test_warmup_counts_the_first_update_as_one():
    assert [IMPL.warmup_step(i) for i in range(3)] == [1, 2, 3]
    tr = mechanism.trace(IMPL, _ctx())
    assert [u.beta for u in tr.updates] == [0.25, 0.5, 0.5]  # 0.5 * smoothstep(1/2), then beta_max


def test_trace_keeps_what_each_update_used():
    ctx = _ctx(43)
    tr = mechanism.trace(IMPL, ctx)
    assert len(tr.updates) == 3 and ctx.meter.updates == 3
    # each update starts where the previous one ended, and moved the student
    for u, nxt in zip(tr.updates, tr.updates[1:]):
        assert mechanism_checks._state_maxabs(u.student_after, nxt.student_before) == 0
    assert all(mechanism_checks._l2(u.student_before, u.student_after) > 0 for u in tr.updates)
    for u in tr.updates:
        K, B, T = u.weights.shape
        assert K == 2 and u.logp_all.shape == (B, T, mechanism.VOCAB) and len(u.logp_loo) == 2
        assert torch.equal(u.student_ctx, u.prompts)
        assert not any(p.requires_grad for p in u.frozen.parameters())
        # what the update used is what the builder makes from its own prompts and blocks
        full, loo = IMPL.replay_contexts(u.prompts, u.blocks)
        assert torch.equal(full, u.full) and all(torch.equal(a, b) for a, b in zip(loo, u.loo))


def test_textbook_weights_match_the_decimal_reference():
    from methods.mrtpo.cases import credit_batch, response_mask, to_lists
    from methods.mrtpo.reference import credit_weights_ref

    g = torch.Generator().manual_seed(5)
    la, ll = credit_batch(g, 2, 3, 4, 12)
    mask = response_mask(g, 3, 4)
    w = mechanism_checks._textbook_weights(la, list(ll), mask, 0.6, [False, False])
    ref = torch.tensor(credit_weights_ref(*to_lists(la, ll), mask.tolist(), 0.6), dtype=F64)
    assert (w - ref).abs().max() < 1e-9  # an independent formula, well inside the float32 tolerance it serves


def test_page_figures_are_recorded_as_diagnostic_comparisons():
    reg = registry.load()
    ctx = _ctx()
    out = reg.get_check("mrtpo.mechanism")(IMPL, ctx)
    (c,) = ctx.comparisons
    assert c["name"] == "page_student_l2_change" and c["formal"] is False
    assert c["control_values"] == [0.034557] and c["method_values"] == [out["student_l2_change"]]
    ctx = _ctx(params={**RUN, "reference_responses": 2}, cases=1)
    out = reg.get_check("mrtpo.replay_reference_f64")(IMPL, ctx)
    got = {c["name"]: c for c in ctx.comparisons}
    assert set(got) == {"page_js_weight_reference_error", "page_credit_conservation_error"}
    assert got["page_js_weight_reference_error"]["control_values"] == [3.84e-14]
    assert got["page_credit_conservation_error"]["control_values"] == [4.44e-16]
    assert all(c["formal"] is False for c in got.values())
    assert got["page_js_weight_reference_error"]["method_values"] == [
        max(out["replay_js_max_abs_err"], out["replay_weights_max_abs_err"])]


def test_cap_arm_binds_and_empty_arm_is_uniform_on_the_run():
    reg = registry.load()
    cap = reg.get_check("mrtpo.cap_binding_arm")(IMPL, _ctx(44))
    assert cap["max_s"] < 1 and cap["output_tightness_gap"] < 1e-6
    empty = reg.get_check("mrtpo.empty_block_arm")(IMPL, _ctx(44))
    assert empty["one_empty_weight_max_dev"] == 0 and empty["all_empty_second_moment_D"] == 0


def test_block_shapes_select_each_js_path():
    assert js_block_shape(2, 150_000)[1] < 150_000  # few rows, large vocabulary: column blocks
    assert js_block_shape(32, 150_000) == (2, 150_000)  # whole rows
    assert js_block_shape(3, 40, chunk_elems=7) == (1, 7)  # a block smaller than a row


@pytest.mark.parametrize("shape,chunk", [((2, 150_000), 1 << 20), ((3, 41), 7), ((5, 30), 1 << 20), ((4, 6, 33), 10)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_js_mutant_copy_is_faithful_but_for_its_defect(shape, chunk, dtype):
    g = torch.Generator().manual_seed(11)
    a = torch.randn(*shape, generator=g, dtype=F64).log_softmax(-1).to(dtype)
    b = torch.randn(*shape, generator=g, dtype=F64).log_softmax(-1).to(dtype)
    same = mrtpo_mutants._js_blocked("none")(a, b, chunk_elems=chunk)
    assert torch.equal(same, js_distance(a, b, chunk_elems=chunk))
    if js_block_shape(math.prod(shape[:-1]), shape[-1], chunk)[1] < shape[-1] and shape[-1] % min(chunk, shape[-1]):
        dropped = mrtpo_mutants._js_blocked("column_tail_dropped")(a, b, chunk_elems=chunk)
        assert not torch.equal(dropped, same)


def test_from_logits_mutant_copy_is_faithful_but_for_its_defect():
    g = torch.Generator().manual_seed(12)
    B, T, V = 3, 5, 17
    la = torch.randn(B, T, V, generator=g, dtype=F64)
    ll = [la + torch.randn(B, T, V, generator=g, dtype=F64), None]
    mask = torch.arange(T)[None] < torch.tensor([5, 3, 0])[:, None]
    for block in (V, 3 * V, 100 * V):
        same = mrtpo_mutants._from_logits_variant("none")(la, ll, mask, 0.7, block_elems=block)
        assert torch.equal(same, credit_weights_from_logits(la, ll, mask, 0.7, block_elems=block))
    dropped = mrtpo_mutants._from_logits_variant("last_block_dropped")(la, ll, mask, 0.7, block_elems=3 * V)
    assert not torch.equal(dropped, same)  # 8 valid rows in blocks of 3: the last 2 rows are lost


def test_the_run_measures_nothing_itself_and_the_watch_sees_every_student_call():
    """The measurements come from check code: a watch put on the student through `observe`."""
    seen = []
    tr = mechanism.trace(IMPL, _ctx(), observe=seen.append)
    assert len(seen) == 1 and isinstance(seen[0], torch.nn.Module)
    ctx = _ctx()
    tr2, out = mechanism_checks.measured_run(IMPL, ctx)
    # sampling: one call for the prompt and one per new token; the update: one scoring call
    assert out["student_forward_calls"] == 3 * (1 + RUN["max_new_tokens"] + 1)
    assert out["student_verifier_tokens"] == 0 and out["replay_saw_blocks"] and out["snapshot_max_change"] == 0
    assert out["updates"] == 3 and out["min_step_l2_change"] > 0
    assert torch.equal(tr.updates[0].responses, tr2.updates[0].responses)  # the watch changes nothing
    # the watch counts what a leaking student context would feed it
    bad = IMPL.replace("leak", student_context=mrtpo_mutants._student_sees_block)
    _, leaked = mechanism_checks.measured_run(bad, _ctx())
    assert leaked["student_verifier_tokens"] > 0


def test_update_replay_reproduces_the_run_and_catches_a_padded_context():
    reg = registry.load()
    out = reg.get_check("mrtpo.student_updates")(IMPL, _ctx())
    assert out["after_state_max_err"] == 0 and out["step_row_mismatches"] == 0 and out["updates_replayed"] == 3
    bad = reg.get_mutant("mrtpo.student_context_padded").factory()
    out = reg.get_check("mrtpo.student_updates")(bad, _ctx())
    assert out["behaviour_logp_max_err"] > 1e-3 and out["after_state_max_err"] > 1e-4


def test_protocol_catches_a_snapshot_without_the_verifier_bias():
    reg = registry.load()
    params = {**RUN, "vocab": 32, "prompt_len": 4, "bias": -1.0e4, "hidden_size": 16}
    out = reg.get_check("mrtpo.protocol")(IMPL, _ctx(params=params))
    assert out["bias_mismatches"] == 0 and out["block_alphabet_is_verifier_tokens"] and out["foreign_tokens"] == 0
    bad = reg.get_mutant("mrtpo.freeze_without_bias").factory()
    out = reg.get_check("mrtpo.protocol")(bad, _ctx(params=params))
    assert out["bias_mismatches"] == 3


def test_input_checks_count_every_case_and_catch_missing_refusals():
    """The spec's refusal contract over the five functions: every case held on the method; the planted mutant
    misses refusals, and each missed case names its function, its row and what happened instead."""
    from pathlib import Path

    from engine.kinds import get_kind
    from engine.spec.loader import load_spec

    root = Path(__file__).resolve().parent.parent
    spec = load_spec(root / "specs" / "mrtpo.yaml", root).data
    params = next(c for c in spec["contracts"] if c["id"] == "input_checks")["params"]
    out = get_kind("refusal").measure(IMPL, _ctx(dtype=F64, params=params), params)
    assert out["not_refused"] == 0 and out["wrongly_refused"] == 0 and out["accepted_differs"] == 0
    # every declared row ran (the tables grow as the interface's promises get cases), bar the rows that move an
    # input to the CPU it is on already (they mutate nothing)
    def ran(table):
        rows = [r if isinstance(r, list) else [r] for r in params[table]]
        return sum(not any(str(m.get("device", "")).startswith("cpu") for m in r) for r in rows)

    assert out["refused"] == ran("refuse") >= 38 and out["accepted"] == ran("accept") >= 30
    bad = registry.load().get_mutant("mrtpo.weights_unchecked").factory()
    ctx = _ctx(dtype=F64, params=params)
    out = get_kind("refusal").measure(bad, ctx, params)
    assert out["not_refused"] > 0
    # not a bare count: each missed case names its function, its case and what happened instead
    missed = [e for e in ctx.case_log if e["metrics"].get("not_refused")]
    assert len(missed) == out["not_refused"]
    assert all(e["argument"].startswith("refuse: credit_weights: ") and ("returned" in e["argument"]
                                                                         or "raised" in e["argument"])
               for e in missed), missed


def test_fewer_blocks_and_doubled_logits_blocks_only_change_memory():
    g = torch.Generator().manual_seed(13)
    a = torch.randn(16, 3000, generator=g, dtype=F64).log_softmax(-1)
    b = torch.randn(16, 3000, generator=g, dtype=F64).log_softmax(-1)
    assert torch.equal(mrtpo_mutants._js_blocked("fewer_blocks")(a, b), js_distance(a, b))
    la = torch.randn(3, 5, 17, generator=g, dtype=F64)
    ll = [la + torch.randn(3, 5, 17, generator=g, dtype=F64)]
    mask = torch.ones(3, 5, dtype=torch.bool)
    doubled = mrtpo_mutants._from_logits_variant("block_doubled")(la, ll, mask, 0.4, block_elems=2 * 17)
    assert torch.equal(doubled, credit_weights_from_logits(la, ll, mask, 0.4, block_elems=2 * 17))
