"""Known-bad MRTPO variants: each has exactly one deliberate defect and must be killed.

The variant functions re-implement the affected function with the defect in
place (rather than adding mutation switches to the method code); everything
else is the same formula.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.mrtpo import credit, mechanism
from methods.mrtpo.credit import LN2, _compute_dtype, _empty_flags, _as_loo_list
from methods.mrtpo.impl import IMPL


# --------------------------------------------------------------------------- JS variants


def _js_sampled_token(logp_a, logp_b, chunk_elems=credit.DEFAULT_CHUNK_ELEMS):
    """DEFECT: JS between the Bernoulli laws of one token (the one p_a favours: the greedy
    sample) instead of the full-vocabulary distributions."""
    cdt = _compute_dtype(torch.promote_types(logp_a.dtype, logp_b.dtype))
    idx = logp_a.argmax(dim=-1, keepdim=True)
    pa = logp_a.gather(-1, idx).squeeze(-1).double().exp()
    pb = logp_b.gather(-1, idx).squeeze(-1).double().exp()

    def ent(p):
        return -(torch.xlogy(p, p) + torch.xlogy(1 - p, 1 - p))

    js = ent((pa + pb) / 2) - (ent(pa) + ent(pb)) / 2
    return (js / LN2).clamp(0.0, 1.0).sqrt().to(cdt)


def _js_unchunked(logp_a, logp_b, chunk_elems=credit.DEFAULT_CHUNK_ELEMS):
    """DEFECT: the same arithmetic on the whole [N, V] input at once (scratch grows with N and V)."""
    cdt = _compute_dtype(torch.promote_types(logp_a.dtype, logp_b.dtype))
    V = logp_a.shape[-1]
    la = logp_a.reshape(-1, V).to(cdt)
    lb = logp_b.reshape(-1, V).to(cdt)
    ws = credit._Workspace(la.numel(), cdt, la.device, upcast=False)
    js = credit._block_terms(la, lb, ws).sum(-1, dtype=torch.float64)
    return (js / LN2).clamp(0.0, 1.0).sqrt().to(cdt).reshape(logp_a.shape[:-1])


def _js_textbook(logp_a, logp_b, chunk_elems=credit.DEFAULT_CHUNK_ELEMS):
    """DEFECT: the textbook 0.5 sum p log(p/m) + q log(q/m), evaluated in the compute dtype:
    terms of both signs cancel, so nearly identical distributions lose all their digits."""
    cdt = _compute_dtype(torch.promote_types(logp_a.dtype, logp_b.dtype))
    la, lb = logp_a.to(cdt), logp_b.to(cdt)
    lm = torch.logaddexp(la, lb) - LN2
    pa, pb = la.exp(), lb.exp()
    ta = torch.where(pa > 0, pa * (la - lm), 0.0)
    tb = torch.where(pb > 0, pb * (lb - lm), 0.0)
    js = 0.5 * (ta + tb).sum(-1)
    return (js / LN2).clamp(0.0, 1.0).sqrt()


def _js_blocked(defect: str):
    """js_distance's block loop (credit._js_blocks) with one defect in the path the default implementation runs:
    "column_tail_dropped": the column loop skips a block narrower than the others, so a partial
    last column block of a long row is never summed; "float32_accumulation": per-row sums accumulate in
    float32 instead of float64; "rows_one_by_one": one row a block, whatever fits (a loop over rows)."""

    def js_distance(logp_a, logp_b, chunk_elems=credit.DEFAULT_CHUNK_ELEMS):
        cdt = _compute_dtype(torch.promote_types(logp_a.dtype, logp_b.dtype))
        lead, V = logp_a.shape[:-1], logp_a.shape[-1]
        n = math.prod(lead)
        acc_dtype = torch.float32 if defect == "float32_accumulation" else torch.float64  # DEFECT (one of them)
        acc = torch.zeros(n, dtype=acc_dtype, device=logp_a.device)
        if n == 0:
            return acc.to(cdt).reshape(lead)
        rows_per_block, cols = credit.js_block_shape(n, V, chunk_elems)
        if defect == "rows_one_by_one":  # DEFECT: one row a block: a Python loop over rows
            rows_per_block = 1
        for r0, r1, la, lb, ws in credit._js_blocks(logp_a, logp_b, rows_per_block, cols, cdt):
            if defect == "column_tail_dropped" and la.shape[-1] < cols:  # DEFECT (the other): a partial last column block
                continue
            acc[r0:r1] += credit._block_terms(la, lb, ws).sum(dim=-1).to(acc_dtype)
        q = acc.div_(LN2).clamp_(0.0, 1.0).sqrt_()
        return q.to(cdt).reshape(lead)

    return js_distance


def _from_logits_variant(defect: str):
    """credit_weights_from_logits with one defect: "last_block_dropped": the loop over blocks of valid
    rows stops at the last whole block, so the rows of a partial last block keep q = 0; "whole_softmax":
    every valid row of every context normalised at once (the same weights, K + 1 whole log-softmaxes);
    "rows_one_by_one": one row a block, whatever fits (a Python loop over rows)."""

    def credit_weights_from_logits(logits_all, logits_loo, mask, beta, empty_block=None,
                                   chunk_elems=credit.DEFAULT_CHUNK_ELEMS, block_elems=credit.LOGITS_BLOCK_ELEMS):
        beta = float(beta)
        B, T, V = logits_all.shape
        loo = _as_loo_list(logits_loo)
        K = len(loo)
        m = mask.to(torch.bool)
        cdt = _compute_dtype(logits_all.dtype)
        device = logits_all.device
        empty = _empty_flags(empty_block, K, B, device)
        count = m.sum(dim=1).to(cdt)
        valid = m.reshape(-1).nonzero().flatten()
        q = torch.zeros(K, B * T, dtype=cdt, device=device)
        live = [k for k, lk in enumerate(loo) if lk is not None]
        step = max(1, int(block_elems) // V)
        if defect == "whole_softmax":  # DEFECT: every valid row in one block
            step = max(1, valid.numel())
        if defect == "rows_one_by_one":  # DEFECT: one row a block
            step = 1
        stop = valid.numel() // step * step if defect == "last_block_dropped" else valid.numel()  # DEFECT
        with torch.no_grad():
            for start in range(0, stop, step):
                rows = valid[start : start + step]
                la = torch.log_softmax(logits_all.reshape(-1, V).index_select(0, rows).to(cdt), dim=-1)
                for k in live:
                    lb = torch.log_softmax(loo[k].reshape(-1, V).index_select(0, rows).to(cdt), dim=-1)
                    q[k].index_copy_(0, rows, credit.js_distance(la, lb, chunk_elems=chunk_elems).to(cdt))
        ws = []
        for k in range(K):
            empty_k = torch.ones(B, dtype=torch.bool, device=device) if loo[k] is None else empty[k]
            ws.append(credit._weights_from_q(q[k].view(B, T), m, count, empty_k, beta))
        return torch.stack(ws, dim=0)

    return credit_weights_from_logits


# --------------------------------------------------------------------------- weight variants


def _weights_variant(defect: str, js=None):
    """credit_weights with one defect; `js` swaps the JS distance it uses (the JS mutants pass
    theirs, so the defect reaches the weights as it would in a real implementation)."""
    js = js or credit.js_distance

    def credit_weights(logp_all, logp_loo, mask, beta, empty_block=None, chunk_elems=credit.DEFAULT_CHUNK_ELEMS):
        beta = float(beta)
        if defect == "beta_ignored":
            beta = 1.0  # DEFECT: the warm-up coefficient is not applied
        B, T, V = logp_all.shape
        loo = _as_loo_list(logp_loo)
        K = len(loo)
        m = mask.to(torch.bool)
        cdt = _compute_dtype(logp_all.dtype)
        empty = _empty_flags(empty_block, K, B, logp_all.device)
        count = m.sum(dim=1).to(cdt)
        ws = []
        for k, lk in enumerate(loo):
            if lk is None:
                q = torch.zeros(B, T, dtype=cdt, device=logp_all.device)
                empty_k = torch.ones(B, dtype=torch.bool, device=logp_all.device)
                raw = q
            else:
                raw = js(logp_all, lk, chunk_elems=chunk_elems).to(cdt)
                if defect == "mask_by_multiplication":
                    q = raw * m.to(cdt)  # DEFECT: NaN * 0 = NaN from padding slots
                else:
                    q = torch.where(m, raw, 0.0)
                empty_k = empty[k]
            if defect == "qbar_over_padding":
                qbar = raw.mean(dim=1)  # DEFECT: mean over every position, padding included
            else:
                qbar = q.sum(dim=1) / count.clamp_min(1.0)
            if defect == "no_fallback":
                uniform = torch.zeros_like(empty_k)  # DEFECT: empty blocks and qbar = 0 are not special
            else:
                uniform = empty_k | (qbar == 0)
            if defect == "not_divided_by_qbar":
                ratio = q  # DEFECT: q itself, not q / qbar
            else:
                ratio = q / torch.where(uniform, torch.ones_like(qbar), qbar)[:, None]
            w = (1.0 - beta) + beta * ratio
            w = torch.where(uniform[:, None], torch.ones_like(w), w)
            ws.append(torch.where(m, w, torch.zeros_like(w)))
        return torch.stack(ws, dim=0)

    return credit_weights


# --------------------------------------------------------------------------- advantage variants


def _advantages_variant(defect: str):
    def mrtpo_advantages(reward_advantages, weights, mask, eps=1e-6):
        out_dtype = _compute_dtype(torch.promote_types(reward_advantages.dtype, weights.dtype))
        cdt = torch.float64
        m = mask.to(torch.bool)
        a = reward_advantages.to(cdt)
        w = torch.where(m[None], weights.to(cdt), 0.0)
        count = m.sum(dim=1).to(cdt)
        if defect == "count_float16":  # DEFECT: valid tokens counted in float16 (rounded past 2048, inf past 65,504)
            count = m.sum(dim=1).to(torch.float16).to(cdt)
        a = torch.where((count > 0)[None], a, 0.0)
        if defect == "uniform_for_negative":
            w = torch.where(a[:, :, None] < 0, torch.where(m[None], 1.0, 0.0).to(cdt), w)  # DEFECT
        S = (a[:, :, None] * w).sum(dim=0)
        U = a.sum(dim=0)
        D = torch.where(m, S - U[:, None], 0.0)
        if defect == "cap_without_length_weight":
            mom_u = (U * U).sum()  # DEFECT: sum_j U_j^2, each response counted once instead of T_j times
        else:
            mom_u = (count * U * U).sum()
        mom_d = (D * D).sum()
        if defect == "no_cap" or not bool(mom_d > 0):
            s = torch.ones((), dtype=cdt, device=S.device)  # DEFECT (no_cap): s = 1 always
        else:
            s = torch.clamp(torch.sqrt(mom_u / mom_d), max=1.0)
        St = torch.where(m, U[:, None] + s * D, 0.0)
        if defect == "std_over_padding":
            std = St.std(unbiased=False)  # DEFECT: padding zeros enter the batch std
        else:
            n = count.sum() if defect != "count_float16" else count.to(torch.float16).sum().to(cdt)
            mean = St.sum() / n.clamp_min(1)
            dev = torch.where(m, St - mean, 0.0)
            std = torch.sqrt((dev * dev).sum() / n.clamp_min(1))
        A = torch.where(m, St / (std + eps), 0.0).to(out_dtype)
        return A, {
            "s": float(s),
            "std": float(std),
            "tokens": int(count.sum()),
            "second_moment_U": float(mom_u),
            "second_moment_D": float(mom_d),
            "capped": bool(s < 1.0),
        }

    return mrtpo_advantages


def _js_vocab_uint16(logp_a, logp_b, chunk_elems=credit.DEFAULT_CHUNK_ELEMS):
    """DEFECT: the vocabulary addressed through 16-bit indices (token ids stored as uint16, as datasets of
    vocabularies under 65,536 do): past entry 65,535 the index wraps, and the sum reads the first entries again."""
    col = torch.arange(logp_a.shape[-1], device=logp_a.device) % 65536  # DEFECT
    return credit.js_distance(logp_a.index_select(-1, col), logp_b.index_select(-1, col), chunk_elems)


def _from_logits_vocab_uint16(logits_all, logits_loo, mask, beta, empty_block=None,
                              chunk_elems=credit.DEFAULT_CHUNK_ELEMS, block_elems=credit.LOGITS_BLOCK_ELEMS):
    """DEFECT: credit_weights_from_logits with the vocabulary addressed through 16-bit indices (see
    _js_vocab_uint16): every context's logits read at (index mod 65,536)."""
    col = torch.arange(logits_all.shape[-1], device=logits_all.device) % 65536  # DEFECT
    loo = [None if lk is None else lk.index_select(-1, col) for lk in _as_loo_list(logits_loo)]
    return credit.credit_weights_from_logits(logits_all.index_select(-1, col), loo, mask, beta, empty_block,
                                             chunk_elems, block_elems)


# --------------------------------------------------------------------------- other variants


def _linear_warmup(step, warmup_steps, beta_max):
    """DEFECT: a linear ramp instead of the smoothstep."""
    if step < 0:
        return 0.0
    if warmup_steps <= 0:
        return float(beta_max)
    return float(beta_max) * min(1.0, float(step) / float(warmup_steps))


def _student_sees_block(prompts, blocks):
    """DEFECT: the student's context carries the first verifier's information block."""
    return torch.cat([prompts, blocks[0]], dim=1)


def _live_replay(policy):
    """DEFECT: the replay 'snapshot' is the live student, so it moves with every update."""
    return policy


def _loo_equals_full(prompts, blocks):
    """DEFECT: every leave-one-out context is the full context (nothing is removed): every weight is 1
    and MRTPO collapses to GDPO."""
    full = torch.cat([prompts, *blocks], dim=1)
    return full, [full for _ in blocks]


def _loo_swapped_blocks(prompts, blocks):
    """DEFECT: context k removes the next reward's block instead of its own, so the rewards' credit maps
    swap (each still conserves its credit)."""
    full, loo = mechanism.replay_contexts(prompts, blocks)
    return full, loo[1:] + loo[:1]


def _loo_fixed_block_width(prompts, blocks):
    """DEFECT: block k is assumed to occupy positions P + k W .. P + (k+1) W, W the widest block: right
    while every block has the same width, wrong once a block is empty (another block's tokens are cut)."""
    full = torch.cat([prompts, *blocks], dim=1)
    P, W = prompts.shape[1], max(b.shape[1] for b in blocks)
    idx = torch.arange(full.shape[1], device=full.device)
    loo = [full[:, (idx < P + k * W) | (idx >= P + (k + 1) * W)] for k in range(len(blocks))]
    return full, loo


def _freeze_without_bias(policy):
    """DEFECT: the replay snapshot is rebuilt from the state dict, which leaves out the non-persistent logit
    bias: a fresh tiny policy has PAD's -1e4 but not the verifier tokens', so the frozen replay predicts
    tokens no policy of the run can sample."""
    from methods.common.policy import TinyGRUPolicy, snapshot

    if not isinstance(policy, TinyGRUPolicy):
        return snapshot(policy)
    fresh = TinyGRUPolicy(vocab_size=policy.vocab_size, hidden_size=policy.hidden_size).to(policy.pad_bias.device)
    fresh.load_state_dict(policy.state_dict())
    return snapshot(fresh)


def _freeze_once():
    """DEFECT: the replay snapshot is taken at the student's first update and never refreshed: later updates
    rescore with the initial weights, not the behaviour policy that sampled them (its own parameters never
    change, so a check that rescores with the run's snapshot agrees with it)."""
    import weakref

    from methods.common.policy import snapshot

    kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def freeze(policy):
        if policy not in kept:
            kept[policy] = snapshot(policy)
        return kept[policy]

    return freeze


def _student_context_padded(prompts, blocks):
    """DEFECT: the student's context keeps the blocks' places, filled with PAD: no verifier token reaches the
    student, but it is not the plain prompt the protocol conditions it on."""
    from methods.common.tasks import PAD

    pads = [torch.full_like(b, PAD) for b in blocks]
    return torch.cat([prompts, *pads], dim=1)


def _advantages_reporting_padded_tokens(reward_adv, weights, mask, eps=1e-6):
    """DEFECT (of the report only): metrics['tokens'] counts every slot of the batch, padding included."""
    A, metrics = IMPL.mrtpo_advantages(reward_adv, weights, mask, eps)
    return A, {**metrics, "tokens": int(mask.numel())}


def _warmup_from_zero(update_index):
    """DEFECT: the warm-up counts the first update as n = 0, so the first update runs at beta = 0."""
    return int(update_index)


# --------------------------------------------------------------------------- registration
# One statement a mutant, its name literal in registry.mutant(...) so the static registry reads it.


def _with(name: str, **functions):
    """The factory of mutant `name`: the implementation with the given interface functions replaced."""
    return lambda: IMPL.replace(name, **functions)


def _js(name: str, js):
    """A JS mutant: js_distance replaced, and credit_weights computing its weights with that JS (so the defect
    reaches the weights as it would in a real implementation)."""
    return _with(name, js_distance=js, credit_weights=_weights_variant("none", js=js))


registry.mutant("mrtpo.js_sampled_token", base="mrtpo")(_js("mrtpo.js_sampled_token", _js_sampled_token))
registry.mutant("mrtpo.js_unchunked", base="mrtpo")(_js("mrtpo.js_unchunked", _js_unchunked))
registry.mutant("mrtpo.js_textbook_formula", base="mrtpo")(_js("mrtpo.js_textbook_formula", _js_textbook))
registry.mutant("mrtpo.js_float32_accumulation", base="mrtpo")(
    _js("mrtpo.js_float32_accumulation", _js_blocked("float32_accumulation")))
registry.mutant("mrtpo.js_column_tail_dropped", base="mrtpo")(
    _js("mrtpo.js_column_tail_dropped", _js_blocked("column_tail_dropped")))
registry.mutant("mrtpo.js_vocab_uint16", base="mrtpo")(_js("mrtpo.js_vocab_uint16", _js_vocab_uint16))
registry.mutant("mrtpo.logits_vocab_uint16", base="mrtpo")(
    _with("mrtpo.logits_vocab_uint16", credit_weights_from_logits=_from_logits_vocab_uint16))
registry.mutant("mrtpo.advantages_count_float16", base="mrtpo")(
    _with("mrtpo.advantages_count_float16", mrtpo_advantages=_advantages_variant("count_float16")))
registry.mutant("mrtpo.js_rows_one_by_one", base="mrtpo")(
    _js("mrtpo.js_rows_one_by_one", _js_blocked("rows_one_by_one")))
registry.mutant("mrtpo.qbar_over_padding", base="mrtpo")(
    _with("mrtpo.qbar_over_padding", credit_weights=_weights_variant("qbar_over_padding")))
registry.mutant("mrtpo.weights_not_divided_by_qbar", base="mrtpo")(
    _with("mrtpo.weights_not_divided_by_qbar", credit_weights=_weights_variant("not_divided_by_qbar")))
registry.mutant("mrtpo.no_uniform_fallback", base="mrtpo")(
    _with("mrtpo.no_uniform_fallback", credit_weights=_weights_variant("no_fallback")))
registry.mutant("mrtpo.beta_ignored", base="mrtpo")(
    _with("mrtpo.beta_ignored", credit_weights=_weights_variant("beta_ignored")))
registry.mutant("mrtpo.mask_by_multiplication", base="mrtpo")(
    _with("mrtpo.mask_by_multiplication", credit_weights=_weights_variant("mask_by_multiplication")))
# the same weights without the input checks: beta = 1.5 or a mask of the wrong shape is not refused
registry.mutant("mrtpo.weights_unchecked", base="mrtpo")(
    _with("mrtpo.weights_unchecked", credit_weights=_weights_variant("none")))
registry.mutant("mrtpo.no_second_moment_cap", base="mrtpo")(
    _with("mrtpo.no_second_moment_cap", mrtpo_advantages=_advantages_variant("no_cap")))
registry.mutant("mrtpo.std_over_padding", base="mrtpo")(
    _with("mrtpo.std_over_padding", mrtpo_advantages=_advantages_variant("std_over_padding")))
registry.mutant("mrtpo.uniform_for_negative", base="mrtpo")(
    _with("mrtpo.uniform_for_negative", mrtpo_advantages=_advantages_variant("uniform_for_negative")))
registry.mutant("mrtpo.cap_without_length_weight", base="mrtpo")(
    _with("mrtpo.cap_without_length_weight", mrtpo_advantages=_advantages_variant("cap_without_length_weight")))
registry.mutant("mrtpo.logits_last_block_dropped", base="mrtpo")(
    _with("mrtpo.logits_last_block_dropped", credit_weights_from_logits=_from_logits_variant("last_block_dropped")))
registry.mutant("mrtpo.logits_whole_softmax", base="mrtpo")(
    _with("mrtpo.logits_whole_softmax", credit_weights_from_logits=_from_logits_variant("whole_softmax")))
registry.mutant("mrtpo.logits_rows_one_by_one", base="mrtpo")(
    _with("mrtpo.logits_rows_one_by_one", credit_weights_from_logits=_from_logits_variant("rows_one_by_one")))
registry.mutant("mrtpo.linear_warmup", base="mrtpo")(_with("mrtpo.linear_warmup", beta_schedule=_linear_warmup))
registry.mutant("mrtpo.warmup_from_zero", base="mrtpo")(_with("mrtpo.warmup_from_zero", warmup_step=_warmup_from_zero))
registry.mutant("mrtpo.student_sees_verifier_block", base="mrtpo")(
    _with("mrtpo.student_sees_verifier_block", student_context=_student_sees_block))
registry.mutant("mrtpo.reports_padded_tokens", base="mrtpo")(
    _with("mrtpo.reports_padded_tokens", mrtpo_advantages=_advantages_reporting_padded_tokens))
registry.mutant("mrtpo.student_context_padded", base="mrtpo")(
    _with("mrtpo.student_context_padded", student_context=_student_context_padded))
registry.mutant("mrtpo.replay_with_live_policy", base="mrtpo")(
    _with("mrtpo.replay_with_live_policy", freeze=_live_replay))
registry.mutant("mrtpo.freeze_without_bias", base="mrtpo")(
    _with("mrtpo.freeze_without_bias", freeze=_freeze_without_bias))
registry.mutant("mrtpo.snapshot_taken_once", base="mrtpo")(
    _with("mrtpo.snapshot_taken_once", freeze=_freeze_once()))
registry.mutant("mrtpo.loo_equals_full", base="mrtpo")(_with("mrtpo.loo_equals_full", replay_contexts=_loo_equals_full))
registry.mutant("mrtpo.loo_swapped_blocks", base="mrtpo")(
    _with("mrtpo.loo_swapped_blocks", replay_contexts=_loo_swapped_blocks))
registry.mutant("mrtpo.loo_fixed_block_width", base="mrtpo")(
    _with("mrtpo.loo_fixed_block_width", replay_contexts=_loo_fixed_block_width))

# --- pairing defects of the mechanism run (methods/common/paired.py) -------------------------------------

from methods.common.paired import defect  # noqa: E402

registry.mutant("mrtpo.control_trained_weights", base="mrtpo")(defect(IMPL, "mrtpo.control_trained_weights"))
registry.mutant("mrtpo.control_other_stream", base="mrtpo")(defect(IMPL, "mrtpo.control_other_stream"))
registry.mutant("mrtpo.same_stream_every_seed", base="mrtpo")(defect(IMPL, "mrtpo.same_stream_every_seed"))
registry.mutant("mrtpo.control_adv_whole_batch", base="mrtpo")(defect(IMPL, "mrtpo.control_adv_whole_batch"))
registry.mutant("mrtpo.control_never_moves", base="mrtpo")(defect(IMPL, "mrtpo.control_never_moves"))
registry.mutant("mrtpo.method_grad_negated", base="mrtpo")(defect(IMPL, "mrtpo.method_grad_negated"))
registry.mutant("mrtpo.method_grad_frozen", base="mrtpo")(defect(IMPL, "mrtpo.method_grad_frozen"))
registry.mutant("mrtpo.control_grad_negated", base="mrtpo")(defect(IMPL, "mrtpo.control_grad_negated"))


# --------------------------------------------------------------------------- promises the interface declares


@registry.mutant("mrtpo.second_moment_u_unweighted", base="mrtpo")
def second_moment_u_unweighted():
    """DEFECT: metrics['second_moment_U'] reported as sum_j U_j^2, without each response's T_j (the cap itself is right)."""
    def mrtpo_advantages(reward_advantages, weights, mask, eps=1e-6):
        adv, metrics = credit.mrtpo_advantages(reward_advantages, weights, mask, eps)
        m = mask.to(torch.bool).any(dim=-1)
        u = reward_advantages.double().sum(dim=0)
        return adv, {**metrics, "second_moment_U": float(torch.where(m, u * u, 0.0).sum())}

    return IMPL.replace("mrtpo.second_moment_u_unweighted", mrtpo_advantages=mrtpo_advantages)


@registry.mutant("mrtpo.eps_fixed", base="mrtpo")
def eps_fixed():
    """DEFECT: eps validated, then ignored: the std always gets 1e-6."""
    def mrtpo_advantages(reward_advantages, weights, mask, eps=1e-6):
        credit.mrtpo_advantages(reward_advantages, weights, mask, eps)  # its refusals
        return credit.mrtpo_advantages(reward_advantages, weights, mask)

    return IMPL.replace("mrtpo.eps_fixed", mrtpo_advantages=mrtpo_advantages)


@registry.mutant("mrtpo.integer_mask_refused", base="mrtpo")
def integer_mask_refused():
    """DEFECT: a 0/1 integer mask, which the interface accepts, is refused (a float or bool one is taken)."""
    def refusing(fn, name):
        def call(*args, **kwargs):
            mask = args[2] if len(args) > 2 else kwargs.get("mask")
            if mask is not None and not (mask.dtype == torch.bool or mask.is_floating_point()):
                raise ValueError(f"{name}: mask must be bool or floating")
            return fn(*args, **kwargs)
        return call

    return IMPL.replace("mrtpo.integer_mask_refused",
                        credit_weights=refusing(credit.credit_weights, "credit_weights"),
                        credit_weights_from_logits=refusing(credit.credit_weights_from_logits,
                                                            "credit_weights_from_logits"),
                        mrtpo_advantages=refusing(credit.mrtpo_advantages, "mrtpo_advantages"))


@registry.mutant("mrtpo.logits_global_shift", base="mrtpo")
def logits_global_shift():
    """DEFECT: credit_weights_from_logits shifts every context by one global max of logits_all for stability: junk in
    a masked row (never to be read) sets it, NaN poisons every weight."""
    def credit_weights_from_logits(logits_all, logits_loo, mask, beta, empty_block=None, **kwargs):
        shift = logits_all.detach().amax()
        loo = [None if x is None else x - shift for x in _as_loo_list(logits_loo)]
        return credit.credit_weights_from_logits(logits_all - shift, loo, mask, beta, empty_block=empty_block,
                                                 **kwargs)

    return IMPL.replace("mrtpo.logits_global_shift", credit_weights_from_logits=credit_weights_from_logits)

