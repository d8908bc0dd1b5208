"""MRTPO mechanism audits: each contract re-runs the seed's mechanism and checks one of its steps.

The run itself (methods/mrtpo/mechanism.py) keeps every update's tensors; these
checks read them back and compare them with what the page says each step must
be, built independently here: the contexts (token ids), the replay's weights
(float64 textbook JS on contexts rebuilt here), beta per update (exact
rationals, n counted from 1), the float64 reference errors on the run's own
replay distributions, an arm with empty blocks and an arm where the Appendix D
cap binds. The page's own local figures are recorded beside what the run
measured, as diagnostic comparisons (never formal, never gating).
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.common.grpo import grpo_token_loss
from methods.common.policy import state_copy
from methods.common.rollout import sequence_logprobs
from methods.common.tasks import EOS, PAD
from methods.mrtpo import mechanism
from methods.mrtpo.cases import credit_batch, response_mask, to_lists
from methods.mrtpo.reference import (
    beta_schedule_ref,
    credit_weights_ref,
    gdpo_uniform_ref,
    js_distance_ref,
    mrtpo_advantages_ref,
)
from methods.mrtpo.measure import NAN, advantage_figures, maxabs as _maxabs, worst as _worst

# Check code: these audits rebuild each step independently and compare; they implement nothing the run uses.
__mutate__ = False  # `contracts mutate` does not plant bugs here


# The page's local-protocol figures (page 003, "结果、代码映射与边界"): NVIDIA A100, seeds 42/43/44,
# 3 updates each, its own randomly initialised 32-token policy.
PAGE_STUDENT_L2 = 0.034557
PAGE_REFERENCE_ERR = 3.84e-14
PAGE_CONSERVATION_ERR = 4.44e-16


def _expected_contexts(prompts: torch.Tensor, blocks: list) -> tuple[torch.Tensor, list]:
    """The page's contexts by position: full = prompt then every block in order; context k = full with
    exactly block k's span of positions removed."""
    full = torch.cat([prompts, *blocks], dim=1)
    starts, pos = [], prompts.shape[1]
    for b in blocks:
        starts.append(pos)
        pos += b.shape[1]
    idx = torch.arange(full.shape[1], device=full.device)
    loo = []
    for k, b in enumerate(blocks):
        keep = (idx < starts[k]) | (idx >= starts[k] + b.shape[1])
        loo.append(full[:, keep])
    return full, loo


# The protocol's token layout (spec assumption mechanism_protocol), written here rather than read from the run.
VERIFIER_FIRST, VERIFIER_LAST = 22, 31
CONTENT_FIRST, CONTENT_LAST = 2, 21


def _verifier(tokens: torch.Tensor) -> torch.Tensor:
    return (tokens >= VERIFIER_FIRST) & (tokens <= VERIFIER_LAST)


def _l2(a: dict, b: dict) -> float:
    """L2 norm of the difference of two parameter dicts (float64)."""
    total = math.fsum(float((a[k].double().cpu() - b[k].double().cpu()).pow(2).sum()) for k in a)
    return math.sqrt(total)


def _state_maxabs(a: dict, b: dict) -> float:
    if set(a) != set(b):
        return math.inf
    return _worst(*(_maxabs(a[k].double().cpu() - b[k].double().cpu()) for k in a))


class StudentWatch:
    """Counts every forward call of the student and the verifier tokens in what it is fed (a forward pre-hook
    put on the student by mechanism.trace's `observe`), so the run itself measures nothing."""

    def __init__(self):
        self.calls = 0
        self.verifier_tokens = 0
        self._handle = None

    def __call__(self, student: torch.nn.Module) -> None:
        self._handle = student.register_forward_pre_hook(self._see)

    def _see(self, module, args) -> None:
        self.calls += 1
        self.verifier_tokens += int(_verifier(args[0]).sum())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()


def measured_run(impl, ctx) -> tuple:
    """One seed of the mechanism run, watched: (trace, the measurements the `mechanism` contract reads)."""
    watch = StudentWatch()
    try:
        tr = mechanism.trace(impl, ctx, observe=watch)
    finally:
        watch.close()
    ups = tr.updates
    cons = []
    for u in ups:
        m = u.mask
        valid = m.any(dim=1)
        mean_w = torch.where(m[None], u.weights.double(), 0.0).sum(-1) / m.sum(-1).clamp_min(1).double()
        cons.append(_maxabs((mean_w - 1.0)[:, valid]))
    widths = [[b.shape[1] for b in u.blocks] for u in ups]
    out = {
        "updates": ctx.meter.updates,
        "student_l2_change": _l2(ups[0].student_before, ups[-1].student_after) if ups else 0.0,
        "min_step_l2_change": min((_l2(u.student_before, u.student_after) for u in ups), default=0.0),
        # measured after the whole run: a replay that moved at any later point counts too
        "snapshot_max_change": max((_l2(u.frozen_state, state_copy(u.frozen)) for u in ups), default=NAN),
        "student_forward_calls": watch.calls,
        "student_verifier_tokens": watch.verifier_tokens,
        "replay_saw_blocks": all(bool((_verifier(u.full).sum(dim=1) == sum(w)).all()) for u, w in zip(ups, widths)),
        "max_conservation_err": _worst(*cons) if cons else NAN,
        # the cap of each update from the tensors it was given, never from the metrics dict the call returned
        "min_s": min((advantage_figures(u.reward_adv, u.weights, u.mask, _params(ctx)[2])["s"] for u in ups),
                     default=NAN),
        "sampled_tokens": ctx.meter.tokens,
    }
    return tr, out


def _same_tokens(a: torch.Tensor, b: torch.Tensor) -> bool:
    return tuple(a.shape) == tuple(b.shape) and bool(torch.equal(a.cpu(), b.cpu()))


def _textbook_weights(logp_all, logp_loo, mask, beta, empty) -> torch.Tensor:
    """w [K, B, T] in float64 from the textbook JS, 0.5 sum p ln(p/m) + q ln(q/m), vectorised.

    Independent of the implementation's cancellation-free form; accurate far below
    the float32 tolerance it is compared at."""
    la = logp_all.double()
    m = mask.to(torch.bool)
    count = m.sum(-1).double().clamp_min(1.0)
    out = []
    for k, lb in enumerate(logp_loo):
        lb = lb.double()
        pa, pb = la.exp(), lb.exp()
        lm = torch.log((pa + pb) / 2)
        ta = torch.where(pa > 0, pa * (la - lm), 0.0)
        tb = torch.where(pb > 0, pb * (lb - lm), 0.0)
        q = torch.sqrt((0.5 * (ta + tb).sum(-1) / math.log(2.0)).clamp(0.0, 1.0))
        q = torch.where(m, q, 0.0)
        qbar = q.sum(-1) / count
        uniform = torch.full_like(qbar, bool(empty[k]), dtype=torch.bool) | (qbar == 0)
        w = (1.0 - beta) + beta * q / torch.where(uniform, 1.0, qbar)[:, None]
        w = torch.where(uniform[:, None], 1.0, w)
        out.append(torch.where(m, w, 0.0))
    return torch.stack(out, 0)


def _replay_here(frozen, context: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """The frozen replay's log-distributions of each response position, written here: one forward pass over
    context + response; the distribution of response token t is the output at position P - 1 + t."""
    with torch.no_grad():
        logits = frozen(torch.cat([context, responses], dim=1))[0]
    P, T = context.shape[1], responses.shape[1]
    return torch.log_softmax(logits[:, P - 1 : P - 1 + T].float(), dim=-1)


def _group_advantages_ref(rewards: list, group: int, eps: float = 1e-6) -> list:
    """GDPO per-reward advantages: (r - group mean) / (population group std + eps), with math.fsum."""
    out = []
    for row in rewards:
        adv = []
        for i in range(0, len(row), group):
            vals = row[i : i + group]
            mean = math.fsum(vals) / len(vals)
            std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / len(vals))
            adv.extend((v - mean) / (std + eps) for v in vals)
        out.append(adv)
    return out


def _params(ctx):
    p = ctx.params
    return float(p.get("warmup_steps", 2)), float(p.get("beta_max", 0.5)), float(p.get("eps", 1e-6))


# --------------------------------------------------------------------------- contexts


@registry.check("mrtpo.loo_contexts")
def loo_contexts(impl, ctx):
    """Per update: context k is the full context minus exactly block k (token ids); the full context is the
    prompt and every block in order; the student's context is the prompt alone."""
    tr = mechanism.trace(impl, ctx)
    full_bad = loo_bad = student_bad = loo_equal_full = checked = 0
    student_block_tokens = 0
    block_bad = 0
    for u in tr.updates:
        # the protocol's blocks: [marker_k, hint_base_k + target_k mod 4], target 0 the last prompt token,
        # target 1 the first
        for k, tgt in enumerate((u.prompts[:, -1], u.prompts[:, 0])):
            want = torch.stack([torch.full_like(tgt, mechanism.MARK[k]), mechanism.HINT_BASE[k] + tgt % 4], dim=1)
            block_bad += int(not _same_tokens(u.blocks[k], want))
        full, loo = _expected_contexts(u.prompts, u.blocks)
        full_bad += int(not _same_tokens(u.full, full))
        if len(u.loo) != len(loo):
            loo_bad += len(loo)
        else:
            for k, (got, want) in enumerate(zip(u.loo, loo)):
                loo_bad += int(not _same_tokens(got, want))
                # a non-empty block removed must leave a shorter context than the full one
                loo_equal_full += int(u.blocks[k].shape[1] > 0 and _same_tokens(got, u.full))
                checked += 1
        # the same builder with an empty block (the harness may meet one): still exactly block k removed
        blocks = [u.blocks[0][:, :0], *u.blocks[1:]]
        got_full, got_loo = impl.replay_contexts(u.prompts, blocks)
        want_full, want_loo = _expected_contexts(u.prompts, blocks)
        full_bad += int(not _same_tokens(got_full, want_full))
        loo_bad += sum(int(not _same_tokens(x, y)) for x, y in zip(got_loo, want_loo)) + abs(len(got_loo) - len(want_loo))
        student_bad += int(not _same_tokens(u.student_ctx, u.prompts))
        student_block_tokens += int(_verifier(u.student_ctx).sum())
    return {
        "block_mismatches": block_bad,
        "full_context_mismatches": full_bad,
        "loo_context_mismatches": loo_bad,
        "loo_contexts_equal_to_full": loo_equal_full,
        "student_context_mismatches": student_bad,
        "student_block_tokens": student_block_tokens,
        "loo_contexts_checked": checked,
    }


# --------------------------------------------------------------------------- the run's credit


@registry.check("mrtpo.replay_credit")
def replay_credit(impl, ctx):
    """Per update: beta follows the smoothstep from n = 1; the weights the update used equal float64
    textbook weights from contexts rebuilt here and rescored here by the same frozen replay; the reward
    advantages are GDPO's per group; the token advantages equal the per-scalar reference on the weights;
    weights spread (beta > 0) and differ between rewards."""
    W, bmax, eps = _params(ctx)
    group = int(ctx.params.get("group_size", 8))
    tr = mechanism.trace(impl, ctx)
    beta_err = w_err = a_err = radv_err = 0.0
    reward_bad = step_bad = 0
    spread_min = diff_min = math.inf
    with_beta = 0
    for u in tr.updates:
        beta_ref = beta_schedule_ref(u.index + 1, W, bmax)
        beta_err = _worst(beta_err, abs(u.beta - beta_ref))
        full, loo = _expected_contexts(u.prompts, u.blocks)
        la = _replay_here(u.frozen, full, u.responses)
        ll = [_replay_here(u.frozen, c, u.responses) for c in loo]
        empty = [b.shape[1] == 0 for b in u.blocks]
        ref = _textbook_weights(la, ll, u.mask, beta_ref, empty)
        w_err = _worst(w_err, _maxabs(u.weights.double() - ref))
        for k, tgt in enumerate((u.prompts[:, -1], u.prompts[:, 0])):  # the two verifiers, re-run here
            hit = ((u.responses == tgt[:, None]) & u.mask).any(dim=1)
            reward_bad += int((u.rewards[k].cpu() != hit.cpu().to(u.rewards.dtype)).sum())
        row = ctx.steps[u.index] if u.index < len(ctx.steps) else {}
        m = u.mask
        fig = advantage_figures(u.reward_adv, u.weights, u.mask, eps)  # the record holds ours, not the report
        want_row = {"step": u.index + 1, "beta": u.beta, "s": fig["s"], "capped": fig["capped"]}
        for k in range(u.weights.shape[0]):
            v = u.weights[k][m].double()
            want_row.update({f"w{k}_mean": float(v.mean()), f"w{k}_std": float(v.std(unbiased=False)),
                             f"w{k}_min": float(v.min()), f"w{k}_max": float(v.max())})
        for key, want in want_row.items():
            got = row.get(key)
            ok = isinstance(got, (int, float)) and abs(float(got) - float(want)) <= 1e-12 * max(1.0, abs(float(want)))
            step_bad += int(not ok)
        radv_ref = torch.tensor(_group_advantages_ref(u.rewards.double().cpu().tolist(), group), dtype=torch.float64)
        radv_err = _worst(radv_err, _maxabs(u.reward_adv.double().cpu() - radv_ref))
        refA, _, _ = mrtpo_advantages_ref(*to_lists(u.reward_adv, u.weights), u.mask.tolist(), eps)
        refA = torch.tensor(refA, dtype=torch.float64)
        a_err = _worst(a_err, _maxabs(u.advantages.double().cpu() - refA) / max(1.0, _maxabs(refA)))
        if u.beta > 0:
            with_beta += 1
            m = u.mask
            for k in range(u.weights.shape[0]):
                spread_min = min(spread_min, float(u.weights[k][m].double().std(unbiased=False)))
            for j in range(u.weights.shape[0]):
                for k in range(j + 1, u.weights.shape[0]):
                    if not _same_tokens(u.blocks[j], u.blocks[k]):
                        diff_min = min(diff_min, _maxabs((u.weights[j] - u.weights[k])[m]))
    return {
        "beta_max_err": beta_err,
        "run_weights_max_abs_err": w_err,
        "run_advantages_max_scaled_err": a_err,
        "reward_advantages_max_abs_err": radv_err,
        "reward_mismatches": reward_bad,
        "step_record_mismatches": step_bad,
        "min_weight_spread": spread_min if math.isfinite(spread_min) else NAN,
        "min_credit_map_diff": diff_min if math.isfinite(diff_min) else NAN,
        "updates_with_beta": with_beta,
    }


@registry.check("mrtpo.replay_reference_f64")
def replay_reference_f64(impl, ctx):
    """float64 JS and weight errors against the per-scalar decimal reference on the run's own replay
    distributions (a few responses per update) and on synthetic batches; float64 conservation; the page's
    figures recorded beside them."""
    W, bmax, eps = _params(ctx)
    per_update = int(ctx.params.get("reference_responses", 4))
    tr = mechanism.trace(impl, ctx)
    js_err = w_err = cons = 0.0
    rows = 0
    for u in tr.updates:
        B = u.mask.shape[0]
        pick = torch.linspace(0, B - 1, min(per_update, B)).round().long().to(u.mask.device)
        m = u.mask.index_select(0, pick)
        la = u.logp_all.index_select(0, pick).double()
        ll = torch.stack([x.index_select(0, pick).double() for x in u.logp_loo])
        empty = torch.tensor(u.empty, dtype=torch.bool)
        w = impl.credit_weights(la, ll, m, u.beta, empty_block=empty.to(la.device))
        ref = credit_weights_ref(*to_lists(la, ll), m.tolist(), u.beta, empty[:, None].expand(-1, m.shape[0]).tolist())
        w_err = _worst(w_err, _maxabs(w.double().cpu() - torch.tensor(ref, dtype=torch.float64)))
        valid = m.reshape(-1).nonzero().flatten()
        a_rows = la.reshape(-1, la.shape[-1]).index_select(0, valid)
        for k in range(ll.shape[0]):
            b_rows = ll[k].reshape(-1, la.shape[-1]).index_select(0, valid)
            q = impl.js_distance(a_rows, b_rows).double().cpu().tolist()
            for r, (xa, xb) in enumerate(zip(*to_lists(a_rows, b_rows))):
                js_err = _worst(js_err, abs(q[r] - js_distance_ref(xa, xb)))
                rows += 1
        wl = w.double().cpu().tolist()
        for k in range(len(wl)):
            for b in range(m.shape[0]):
                vals = [wl[k][b][t] for t in range(m.shape[1]) if m[b, t]]
                if vals:
                    cons = _worst(cons, abs(math.fsum(vals) / len(vals) - 1.0))
    g = ctx.generator(601)
    syn_err = 0.0
    for _ in range(ctx.cases):
        K, B, T, V = 2, 3, 5, 32
        la, ll = credit_batch(g, K, B, T, V)
        m = response_mask(g, B, T)
        beta = float(torch.rand((), generator=g, dtype=torch.float64))
        w = impl.credit_weights(la.to(ctx.device), ll.to(ctx.device), m.to(ctx.device), beta)
        ref = credit_weights_ref(*to_lists(la, ll), m.tolist(), beta)
        syn_err = _worst(syn_err, _maxabs(w.double().cpu() - torch.tensor(ref, dtype=torch.float64)))
    note = ("page: A100, its own 32-token toy policy and reference; here: the run's own float32 replay "
            "distributions upcast to float64, a few responses per update, 28-digit decimal reference")
    ctx.record_comparison("page_js_weight_reference_error", "mrtpo (this run, float64)", "page 003 (A100 run)",
                          [_worst(js_err, w_err)], [PAGE_REFERENCE_ERR], "max abs error", formal=False, note=note)
    ctx.record_comparison("page_credit_conservation_error", "mrtpo (this run, float64)", "page 003 (A100 run)",
                          [cons], [PAGE_CONSERVATION_ERR], "max abs error", formal=False, note=note)
    return {
        "replay_js_max_abs_err": js_err,
        "replay_weights_max_abs_err": w_err,
        "replay_conservation_err": cons,
        "synthetic_weights_max_abs_err": syn_err,
        "replay_js_rows": rows,
    }


# --------------------------------------------------------------------------- arms


@registry.check("mrtpo.empty_block_arm")
def empty_block_arm(impl, ctx):
    """Per update, the same frozen replay and responses with block 0 empty, then with every block empty:
    the empty block's weights are exactly 1 and the other rewards' weights are still their own (float64
    textbook weights on contexts rebuilt here); with every block empty D = 0, s = 1 and A is GDPO's."""
    W, bmax, eps = _params(ctx)
    tr = mechanism.trace(impl, ctx)
    one_dev = all_dev = mom_d = s_dev = gdpo = other_err = 0.0
    arms = 0
    for u in tr.updates:
        m = u.mask
        for n_empty in (1, len(u.blocks)):
            blocks = [b[:, :0] if k < n_empty else b for k, b in enumerate(u.blocks)]
            full, loo = impl.replay_contexts(u.prompts, blocks)
            la = mechanism.replay(u.frozen, full, u.responses)
            ll = [mechanism.replay(u.frozen, c, u.responses) for c in loo]
            flags = torch.tensor([b.shape[1] == 0 for b in blocks], dtype=torch.bool, device=m.device)
            w = impl.credit_weights(la, ll, m, u.beta, empty_block=flags)
            dev = _maxabs((w.double()[:n_empty] - 1.0)[:, m])
            A, metrics = impl.mrtpo_advantages(u.reward_adv, w, m, eps)
            arms += 1
            if n_empty < len(u.blocks):
                one_dev = _worst(one_dev, dev)
                # the other rewards keep their own credit: contexts rebuilt here, rescored by the same replay
                want_full, want_loo = _expected_contexts(u.prompts, blocks)
                ref = _textbook_weights(_replay_here(u.frozen, want_full, u.responses),
                                        [_replay_here(u.frozen, c, u.responses) for c in want_loo],
                                        m, u.beta, [b.shape[1] == 0 for b in blocks])
                other_err = _worst(other_err, _maxabs(w.double()[n_empty:] - ref[n_empty:]))
                continue
            all_dev = _worst(all_dev, dev)
            fig = advantage_figures(u.reward_adv, w, m, eps)  # from the weights it returned, not its report
            mom_d = _worst(mom_d, abs(fig["second_moment_D"]))
            s_dev = _worst(s_dev, abs(fig["s"] - 1.0))
            ref = torch.tensor(gdpo_uniform_ref(u.reward_adv.double().cpu().tolist(), m.tolist(), eps),
                               dtype=torch.float64)
            gdpo = _worst(gdpo, _maxabs(A.double().cpu() - ref) / max(1.0, _maxabs(ref)))
    return {
        "one_empty_weight_max_dev": one_dev,
        "one_empty_other_weights_max_abs_err": other_err,
        "all_empty_weight_max_dev": all_dev,
        "all_empty_second_moment_D": mom_d,
        "all_empty_s_dev": s_dev,
        "all_empty_gdpo_max_scaled_err": gdpo,
        "arms": arms,
    }


@registry.check("mrtpo.cap_binding_arm")
def cap_binding_arm(impl, ctx):
    """Per update, the update's own weights with opposing rewards (A_2 = -r A_1): the Appendix D cap binds
    (s < 1, by the decimal reference on these tensors) and the output is tight: (s D)^2 summed = sum T U^2, read
    off the output A (std + eps) and recomputed here."""
    W, bmax, eps = _params(ctx)
    r = float(ctx.params.get("opposition", 0.98))
    tr = mechanism.trace(impl, ctx)
    s_max = -math.inf
    out_gap = a_err = 0.0
    for u in tr.updates:
        m = u.mask
        a0 = u.reward_adv[0].double()
        radv = torch.stack([a0] + [-r * a0 for _ in range(u.weights.shape[0] - 1)]).to(u.reward_adv.dtype)
        A, _ = impl.mrtpo_advantages(radv, u.weights, m, eps)
        refA, ref_s, ref_std = mrtpo_advantages_ref(*to_lists(radv, u.weights), m.tolist(), eps)
        rl, wl, Al = to_lists(radv, u.weights, A)
        K, B, T = u.weights.shape
        valid = [[t for t in range(T) if m[b, t]] for b in range(B)]
        U = [math.fsum(rl[k][b] for k in range(K)) if valid[b] else 0.0 for b in range(B)]
        mom_u = math.fsum(len(valid[b]) * U[b] ** 2 for b in range(B))
        # the capped redistribution read off the output: S~ - U = A (std + eps) - U
        out_d = math.fsum((Al[b][t] * (ref_std + eps) - U[b]) ** 2 for b in range(B) for t in valid[b])
        # that the cap binds is read off these tensors by the decimal reference; that the output is capped and
        # tight, off the output A. The s the call reports is not read: reported_metrics_agree compares it.
        s_max = max(s_max, ref_s)
        out_gap = _worst(out_gap, abs(out_d / mom_u - 1.0) if mom_u > 0 else NAN)
        refA = torch.tensor(refA, dtype=torch.float64)
        a_err = _worst(a_err, _maxabs(A.double().cpu() - refA) / max(1.0, _maxabs(refA)))
    return {
        "max_s": s_max if math.isfinite(s_max) else NAN,
        "output_tightness_gap": out_gap,
        "advantages_max_scaled_err": a_err,
    }


# --------------------------------------------------------------------------- protocol and updates


@registry.check("mrtpo.protocol")
def protocol(impl, ctx):
    """The run follows the declared protocol: a 32-token vocabulary with PAD 0, EOS 1, content tokens 2..21 and
    verifier tokens 22..31 (a -1e4 logit bias on PAD and every verifier token, in the student and in each frozen
    replay); prompts of 4 content tokens drawn over all of 2..21; the blocks' alphabet exactly the 10 verifier
    tokens (two markers and two hint ranges of 4, all distinct); responses of content tokens, EOS and PAD only."""
    p = ctx.params
    vocab, prompt_len, bias = int(p.get("vocab", 32)), int(p.get("prompt_len", 4)), float(p.get("bias", -1.0e4))
    hidden = int(p.get("hidden_size", 16))
    tr = mechanism.trace(impl, ctx)
    want_bias = torch.zeros(vocab)
    want_bias[PAD] = bias
    want_bias[VERIFIER_FIRST : VERIFIER_LAST + 1] = bias
    bias_bad = shape_bad = foreign = hidden_bad = 0
    tiny = getattr(ctx, "policy_factory", None) is None  # the hidden size is the tiny model's only
    for u in tr.updates:
        shape_bad += int(u.logp_all.shape[-1] != vocab) + sum(int(x.shape[-1] != vocab) for x in u.logp_loo)
        shape_bad += int(u.prompts.shape[1] != prompt_len)
        got = getattr(u.frozen, "pad_bias", None)
        bias_bad += int(got is None or tuple(got.shape) != (vocab,) or not torch.equal(got.float().cpu(), want_bias))
        if tiny:
            hidden_bad += int(getattr(u.frozen, "hidden_size", None) != hidden)
        r = u.responses[u.mask]
        foreign += int(((r < CONTENT_FIRST) & (r != EOS) & (r != PAD)).sum() + (r > CONTENT_LAST).sum())
        foreign += int(((u.prompts < CONTENT_FIRST) | (u.prompts > CONTENT_LAST)).sum())
    # the prompt generator over many draws: exactly the content tokens, every one of them
    drawn = mechanism.make_prompts(4096, torch.Generator().manual_seed(ctx.seed)).unique().tolist()
    prompt_tokens_ok = drawn == list(range(CONTENT_FIRST, CONTENT_LAST + 1))
    alphabet = [mechanism.MARK[k] for k in range(len(mechanism.MARK))]
    alphabet += [mechanism.HINT_BASE[k] + i for k in range(len(mechanism.HINT_BASE)) for i in range(4)]
    alphabet_ok = sorted(alphabet) == list(range(VERIFIER_FIRST, VERIFIER_LAST + 1))
    return {
        "bias_mismatches": bias_bad,
        "shape_mismatches": shape_bad,
        "hidden_size_mismatches": hidden_bad,
        "foreign_tokens": foreign,
        "prompt_tokens_cover_content": prompt_tokens_ok,
        "block_alphabet_is_verifier_tokens": alphabet_ok,
        "updates_checked": len(tr.updates),
    }


@registry.check("mrtpo.student_updates")
def student_updates(impl, ctx):
    """The student's updates replayed here from the run's own tensors: the student starts from the seeded
    policy, each update starts where the previous one ended, the old log-probs are the behaviour policy's, and
    one Adam step (lr of the spec) on the PPO-clip surrogate of the plain prompt with the update's own token
    advantages gives exactly the student the run kept; each step row of the receipt (loss, grad norm, L2
    changes, reward means, tokens, advantage std) is the update's own."""
    W, bmax, eps = _params(ctx)
    lr = float(ctx.params.get("lr", 1e-2))
    tr = mechanism.trace(impl, ctx)
    pol = mechanism.make_policy(ctx)  # the seeded initial student
    init_err = _state_maxabs(state_copy(pol), tr.updates[0].student_before) if tr.updates else NAN
    opt = torch.optim.Adam(pol.parameters(), lr=lr)
    cont_err = behaviour_err = after_err = 0.0
    row_bad = 0
    for u in tr.updates:
        cont_err = _worst(cont_err, _state_maxabs(state_copy(pol), u.student_before))
        logp, _ = sequence_logprobs(pol, u.prompts, u.responses)  # the plain prompt, per the protocol
        behaviour_err = _worst(behaviour_err, _maxabs(torch.where(u.mask, logp.detach() - u.old_logp, 0.0)))
        loss, _ = grpo_token_loss(logp, u.old_logp, u.advantages.to(logp.dtype), u.mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = math.sqrt(math.fsum(float(q.grad.double().pow(2).sum()) for q in pol.parameters()
                                        if q.grad is not None))
        opt.step()
        after_err = _worst(after_err, _state_maxabs(state_copy(pol), u.student_after))
        _, _, ref_std = mrtpo_advantages_ref(*to_lists(u.reward_adv, u.weights), u.mask.tolist(), eps)
        row = ctx.steps[u.index] if u.index < len(ctx.steps) else {}
        want = {"loss": float(loss.detach()), "grad_norm": grad_norm,
                "student_l2_change": _l2(u.student_before, u.student_after),
                "snapshot_param_change": _l2(u.frozen_state, state_copy(u.frozen)),
                "tokens": int(u.mask.sum()), "adv_std": ref_std}
        for key, value in want.items():
            got = row.get(key)
            ok = isinstance(got, (int, float)) and abs(float(got) - value) <= 1e-5 * max(1.0, abs(value))
            row_bad += int(not ok)
        got = row.get("reward_mean")
        means = [float(r.double().mean()) for r in u.rewards]
        row_bad += int(not (isinstance(got, list) and len(got) == len(means)
                            and all(abs(float(a) - b) <= 1e-6 for a, b in zip(got, means))))
    return {
        "initial_state_max_err": init_err,
        "continuity_max_err": cont_err,
        "behaviour_logp_max_err": behaviour_err,
        "after_state_max_err": after_err,
        "step_row_mismatches": row_bad,
        "updates_replayed": len(tr.updates),
    }
