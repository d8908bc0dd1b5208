"""Known-bad GRPO variants, one deliberate defect each (the bugs public GRPO code has shipped); every one must be
killed. A loss defect rebuilds the loss from one broken part with `build_grpo_loss`."""

from __future__ import annotations

import torch

from engine.spec import registry
from methods.grpo import loss as L
from methods.grpo.impl import IMPL


def _loss(name, **parts):
    return IMPL.replace(name, grpo_loss=L.build_grpo_loss(**parts))


# --- ratio ------------------------------------------------------------------------------------------------------


def _with_surrogate(name, surrogate=L.clipped_surrogate, guard=True):
    def surrogate_fn(lr, a, m, lo, hi, dual, clamp):
        return L.composed_surrogate(lr, a, m, lo, hi, dual, clamp, surrogate=surrogate, guard=guard)

    return _loss(name, surrogate_fn=surrogate_fn)


@registry.mutant("grpo.no_ratio_guard", base="grpo")
def no_ratio_guard():
    """The log-ratio is exponentiated unclamped: a large drift overflows to inf and NaN (OpenRLHF PR #1293)."""
    return _with_surrogate("grpo.no_ratio_guard", guard=False)


@registry.mutant("grpo.mask_by_multiply", base="grpo")
def mask_by_multiply():
    """Masked slots zeroed by multiplying with the mask: NaN * 0 = NaN leaks (OpenRLHF PR #1240)."""
    return _loss("grpo.mask_by_multiply",
                 ratio_fn=lambda logp, old, m, cdt: (logp.to(cdt) - old.detach().to(cdt)) * m.to(cdt))


@registry.mutant("grpo.ratio_detached", base="grpo")
def ratio_detached():
    """The ratio under stop-gradient: the loss value is right, no gradient reaches the policy."""
    return _loss("grpo.ratio_detached", ratio_fn=lambda logp, old, m, cdt: L.log_ratio(logp, old, m, cdt).detach())


# --- surrogate ----------------------------------------------------------------------------------------------------


@registry.mutant("grpo.symmetric_clip", base="grpo")
def symmetric_clip():
    """Both bounds from clip_low: [1 - eps_low, 1 + eps_low] where the declared bounds differ."""
    return _with_surrogate("grpo.symmetric_clip",
                           lambda ratio, a, lo, hi, dual: L.clipped_surrogate(ratio, a, lo, 2.0 - lo, dual))


@registry.mutant("grpo.clip_no_upper", base="grpo")
def clip_no_upper():
    """The clip drops its upper bound: r is only clamped from below."""
    return _with_surrogate("grpo.clip_no_upper",
                           lambda ratio, a, lo, hi, dual: L.clipped_surrogate(ratio, a, lo, float("inf"), dual))


@registry.mutant("grpo.max_not_min", base="grpo")
def max_not_min():
    """Optimistic max instead of PPO's pessimistic min."""
    def surrogate(ratio, a, lo, hi, dual):
        out = torch.minimum(ratio * -a, ratio.clamp(lo, hi) * -a)
        if dual is not None:
            out = torch.where(a < 0, torch.minimum(out, a * -float(dual)), out)
        return out

    return _with_surrogate("grpo.max_not_min", surrogate)


@registry.mutant("grpo.dual_clip_positive", base="grpo")
def dual_clip_positive():
    """The dual clip's cap -c A applied to every token, not only where A < 0: a positive advantage's loss becomes
    the constant -c A (no gradient)."""
    def surrogate(ratio, a, lo, hi, dual):
        out = L.clipped_surrogate(ratio, a, lo, hi, None)
        return out if dual is None else torch.minimum(out, a * -float(dual))

    return _with_surrogate("grpo.dual_clip_positive", surrogate)


@registry.mutant("grpo.kl_dropped", base="grpo")
def kl_dropped():
    """The KL term is computed but not added (beta ignored)."""
    def kl(logp, ref_logp, m, cdt):
        return L.k3_kl(logp, ref_logp, m, cdt) * 0.0

    return _loss("grpo.kl_dropped", kl_fn=kl)


@registry.mutant("grpo.kl_reversed", base="grpo")
def kl_reversed():
    """k3 with the ratio the wrong way up: pi/pi_ref - log(pi/pi_ref) - 1."""
    def kl(logp, ref_logp, m, cdt):
        d = L.log_ratio(logp, ref_logp, m, cdt)
        return d.exp() - d - 1.0

    return _loss("grpo.kl_reversed", kl_fn=kl)


@registry.mutant("grpo.kl_default_beta", base="grpo")
def kl_default_beta():
    """beta = 0 read as "unset": with a reference passed, the KL is added at 0.04 (TRL's former default)."""
    def grpo_loss(logp, old_logp, advantages, mask, *, ref_logp=None, beta=0.0, **options):
        beta = beta or (0.04 if ref_logp is not None else 0.0)
        return L.grpo_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp, beta=beta, **options)

    return IMPL.replace("grpo.kl_default_beta", grpo_loss=grpo_loss)


# --- aggregation --------------------------------------------------------------------------------------------------


@registry.mutant("grpo.mean_over_padded", base="grpo")
def mean_over_padded():
    """Token mean over the padded length: divided by B * L instead of the valid tokens."""
    def agg(per_token, m, mode, n_row, norm_length):
        if mode == "token-mean":
            return per_token.sum() / float(m.numel())
        return L.aggregate(per_token, m, mode, n_row, norm_length)

    return _loss("grpo.mean_over_padded", aggregate_fn=agg)


@registry.mutant("grpo.per_response_mean", base="grpo")
def per_response_mean():
    """The token mean replaced by the mean over responses of each response's token mean."""
    def agg(per_token, m, mode, n_row, norm_length):
        return L.aggregate(per_token, m, "seq-mean-token-mean" if mode == "token-mean" else mode, n_row,
                           norm_length)

    return _loss("grpo.per_response_mean", aggregate_fn=agg)


@registry.mutant("grpo.ignores_agg", base="grpo")
def ignores_agg():
    """The aggregation argument is ignored: always the token mean."""
    def agg(per_token, m, mode, n_row, norm_length):
        return L.aggregate(per_token, m, "token-mean", n_row, norm_length)

    return _loss("grpo.ignores_agg", aggregate_fn=agg)


@registry.mutant("grpo.empty_row_nan", base="grpo")
def empty_row_nan():
    """seq-mean-token-mean divides each row by its token count unguarded: an empty row gives 0/0 = NaN."""
    def agg(per_token, m, mode, n_row, norm_length):
        if mode == "seq-mean-token-mean":
            return (per_token.sum(dim=-1) / n_row.to(per_token.dtype)).mean()
        return L.aggregate(per_token, m, mode, n_row, norm_length)

    return _loss("grpo.empty_row_nan", aggregate_fn=agg)


@registry.mutant("grpo.empty_rows_counted", base="grpo")
def empty_rows_counted():
    """Empty rows count in the mean over responses (seq-mean modes divide by B)."""
    def agg(per_token, m, mode, n_row, norm_length):
        if mode == "seq-mean-token-mean":
            return (per_token.sum(dim=-1) / n_row.clamp_min(1).to(per_token.dtype)).mean()
        if mode == "seq-mean-token-sum-norm":
            return per_token.sum() / (m.shape[0] * float(m.shape[-1] if norm_length is None else norm_length))
        return L.aggregate(per_token, m, mode, n_row, norm_length)

    return _loss("grpo.empty_rows_counted", aggregate_fn=agg)


# --- group advantages ---------------------------------------------------------------------------------------------


def _rows(rewards, group_size, mask):
    keep = torch.ones_like(rewards, dtype=torch.bool) if mask is None else (
        mask.bool().any(dim=-1) if mask.dim() == 2 else mask.bool())
    return rewards.detach().double(), keep


@registry.mutant("grpo.adv_not_std_normalised", base="grpo")
def adv_not_std_normalised():
    """Group advantages centred but not divided by the group std."""
    def group_advantages(rewards, group_size, eps=1e-6, *, mask=None):
        r, keep = _rows(rewards, group_size, mask)
        scaled = L.group_advantages(rewards, group_size, eps, mask=mask).double()
        g = torch.where(keep, r, 0.0).reshape(-1, group_size)
        k = keep.reshape(-1, group_size)
        mean = g.sum(1, keepdim=True) / k.sum(1, keepdim=True).clamp_min(1)
        out = torch.where(k, g - mean, 0.0).reshape(-1)
        return torch.where(scaled != 0, out, 0.0).to(rewards.dtype)

    return IMPL.replace("grpo.adv_not_std_normalised", group_advantages=group_advantages)


@registry.mutant("grpo.adv_batch_normalised", base="grpo")
def adv_batch_normalised():
    """Advantages normalised over the whole batch instead of per group."""
    def group_advantages(rewards, group_size, eps=1e-6, *, mask=None):
        L.group_advantages(rewards, group_size, eps, mask=mask)  # the same refusals
        return L.group_advantages(rewards, rewards.shape[0], eps, mask=mask)

    return IMPL.replace("grpo.adv_batch_normalised", group_advantages=group_advantages)


@registry.mutant("grpo.adv_counts_masked_rows", base="grpo")
def adv_counts_masked_rows():
    """Fully masked responses still move their group's mean and std (verl PR #6452)."""
    def group_advantages(rewards, group_size, eps=1e-6, *, mask=None):
        _, keep = _rows(rewards, group_size, mask)
        out = L.group_advantages(rewards, group_size, eps)
        return torch.where(keep, out, torch.zeros_like(out))

    return IMPL.replace("grpo.adv_counts_masked_rows", group_advantages=group_advantages)


@registry.mutant("grpo.adv_one_pass_variance", base="grpo")
def adv_one_pass_variance():
    """The variance as E[x^2] - E[x]^2 in float32: low-variance groups get shrunken advantages (verl PR #6348)."""
    def group_advantages(rewards, group_size, eps=1e-6, *, mask=None):
        ref = L.group_advantages(rewards, group_size, eps, mask=mask)
        _, keep = _rows(rewards, group_size, mask)
        r = torch.where(keep, rewards.detach().float(), 0.0).reshape(-1, group_size)
        k = keep.reshape(-1, group_size)
        n = k.sum(1, keepdim=True).clamp_min(1).float()
        mean = r.sum(1, keepdim=True) / n
        var = ((r * r).sum(1, keepdim=True) / n - mean * mean).clamp_min(0)
        out = torch.where(k, (r - mean) / (var.sqrt() + eps), 0.0).reshape(-1)
        return torch.where(ref != 0, out.to(rewards.dtype), ref)

    return IMPL.replace("grpo.adv_one_pass_variance", group_advantages=group_advantages)


@registry.mutant("grpo.adv_row_index_uint16", base="grpo")
def adv_row_index_uint16():
    """The rows are addressed through a 16-bit counter: past 65,535 responses the index wraps, and the later rows
    are normalised with the first rows' rewards (a batch that size exists only at training scale)."""
    def group_advantages(rewards, group_size, eps=1e-6, *, mask=None):
        L.group_advantages(rewards, group_size, eps, mask=mask)  # the same refusals
        row = torch.arange(rewards.shape[0], device=rewards.device) % 65536  # DEFECT: a uint16 row index
        keep = None if mask is None else mask.index_select(0, row)
        return L.group_advantages(rewards.index_select(0, row), group_size, eps, mask=keep)

    return IMPL.replace("grpo.adv_row_index_uint16", group_advantages=group_advantages)


# --- precision and refusals -----------------------------------------------------------------------------------------


def in_input_dtype(loss_fn):
    """`loss_fn` with the loss handed back in the input's dtype: a bfloat16/float16 call rounds it (GSPO's too)."""
    def loss(logp, *args, **kwargs):
        value, metrics = loss_fn(logp, *args, **kwargs)
        return value.to(logp.dtype), metrics

    return loss


def clip_clamped(loss_fn, clip_low: float, clip_high: float):
    """`loss_fn` with out-of-range clip bounds clamped into range instead of refused (GSPO's too)."""
    def loss(*args, clip_low=clip_low, clip_high=clip_high, **kwargs):
        return loss_fn(*args, clip_low=min(max(float(clip_low), 0.0), 0.99), clip_high=max(float(clip_high), 0.0),
                       **kwargs)

    return loss


@registry.mutant("grpo.loss_in_input_dtype", base="grpo")
def loss_in_input_dtype():
    """The loss handed back in the input's dtype: a bfloat16/float16 call rounds the loss to 8/11 bits."""
    return IMPL.replace("grpo.loss_in_input_dtype", grpo_loss=in_input_dtype(L.grpo_loss))


@registry.mutant("grpo.clip_unchecked", base="grpo")
def clip_unchecked():
    """Out-of-range clip bounds are silently clamped into range instead of refused."""
    return IMPL.replace("grpo.clip_unchecked", grpo_loss=clip_clamped(L.grpo_loss, 0.2, 0.2))


@registry.mutant("grpo.group_size_unchecked", base="grpo")
def group_size_unchecked():
    """group_advantages coerces group_size with int(): True becomes 1, 2.5 becomes 2, silently."""
    def group_advantages(rewards, group_size, eps=1e-6, *, mask=None):
        return L.group_advantages(rewards, max(int(group_size), 1), eps, mask=mask)

    return IMPL.replace("grpo.group_size_unchecked", group_advantages=group_advantages)


# --- the shared sampler -------------------------------------------------------------------------------------------


@registry.mutant("grpo.mask_drops_eos", base="grpo")
def mask_drops_eos():
    """The response mask stops before the EOS token: the last valid token gets no old log-prob and no gradient."""
    def response_mask(responses, eos_id=1):
        return torch.cumsum((responses == eos_id).to(torch.int32), dim=1) == 0

    return IMPL.replace("grpo.mask_drops_eos", response_mask=response_mask)


@registry.mutant("grpo.behaviour_logprobs_at_t1", base="grpo")
def behaviour_logprobs_at_t1():
    """Behaviour log-probs taken at temperature 1 whatever the sampling temperature (TRL #4159)."""
    from methods.grpo.sampler import behaviour_logprobs

    return IMPL.replace("grpo.behaviour_logprobs_at_t1",
                        behaviour_logprobs=lambda logits, tokens, temperature=1.0: behaviour_logprobs(logits, tokens))


@registry.mutant("grpo.sampler_unchecked", base="grpo")
def sampler_unchecked():
    """The sampler's functions take anything: float or bool token ids, a temperature of 0 or below."""
    def response_mask(responses, eos_id=1):
        eos = (responses == eos_id).to(torch.int32)
        return (torch.cumsum(eos, dim=1) - eos) == 0

    def behaviour_logprobs(logits, tokens, temperature=1.0):
        return torch.log_softmax(logits.double() / float(temperature), dim=-1).gather(-1, tokens[..., None].long())[..., 0]

    return IMPL.replace("grpo.sampler_unchecked", response_mask=response_mask, behaviour_logprobs=behaviour_logprobs)


@registry.mutant("grpo.old_logp_not_detached", base="grpo")
def old_logp_not_detached():
    """The log-ratio without old_logp.detach(): a behaviour log-prob that requires grad receives one."""
    return _loss("grpo.old_logp_not_detached",
                 ratio_fn=lambda logp, old, m, cdt: torch.where(m, logp.to(cdt) - old.to(cdt), torch.zeros((), dtype=cdt)))


# --- token counts in narrow dtypes (seen only past 2^15 tokens in a row: the scale tier) ------------------------------


def _narrow_counts(dtype):
    def aggregate(per_token, m, agg, n_row, norm_length):
        return L.aggregate(per_token, m, agg, m.sum(dim=-1).to(dtype), norm_length)  # DEFECT: counts in `dtype`

    return aggregate


@registry.mutant("grpo.token_count_int16", base="grpo")
def token_count_int16():
    """Each response's valid-token count is kept in int16: a response past 32,767 tokens wraps negative, and the
    token mean (and the per-response mean) divides by it."""
    return _loss("grpo.token_count_int16", aggregate_fn=_narrow_counts(torch.int16))


@registry.mutant("grpo.token_count_float16", base="grpo")
def token_count_float16():
    """The valid-token counts are kept in float16: exact to 2048, rounded to a multiple of 32 past 32,768, and the
    batch's total overflows to inf past 65,504 tokens (the loss becomes 0)."""
    return _loss("grpo.token_count_float16", aggregate_fn=_narrow_counts(torch.float16))


# --- the control arm's wrapper (methods/common/grpo.py) ----------------------------------------------------------


@registry.mutant("grpo.control_seq_mean", base="grpo")
def control_seq_mean():
    """The control arm's wrapper passes the paper's seq-mean aggregation: the pages' control is the token mean."""
    def control_loss(logp, old_logp, advantages, mask, clip_eps=0.2):
        return L.grpo_loss(logp, old_logp, advantages, mask, clip_low=clip_eps, clip_high=clip_eps,
                           agg="seq-mean-token-mean")

    return IMPL.replace("grpo.control_seq_mean", control_loss=control_loss)


@registry.mutant("grpo.control_clip_low_only", base="grpo")
def control_clip_low_only():
    """The control arm's wrapper passes its clip eps as clip_low only: the upper bound stays at grpo_loss's default."""
    def control_loss(logp, old_logp, advantages, mask, clip_eps=0.2):
        return L.grpo_loss(logp, old_logp, advantages, mask, clip_low=clip_eps)

    return IMPL.replace("grpo.control_clip_low_only", control_loss=control_loss)


@registry.mutant("grpo.control_adv_batch", base="grpo")
def control_adv_batch():
    """The control arm's advantages normalised over the whole batch instead of per group of group_size."""
    def control_advantages(rewards, group_size, eps=1e-6):
        return L.group_advantages(rewards, rewards.shape[0], eps)

    return IMPL.replace("grpo.control_adv_batch", control_advantages=control_advantages)


# --- promises the interface declares (each found surviving a held-out batch of realistic bugs) --------------------


@registry.mutant("grpo.adv_validates_masked_rewards", base="grpo")
def adv_validates_masked_rewards():
    """group_advantages refuses a NaN reward on a fully masked row, which the interface says is never read."""
    def group_advantages(rewards, group_size, eps=1e-6, *, mask=None):
        if not bool(torch.isfinite(rewards).all()):
            raise ValueError("rewards hold NaN or inf")
        return L.group_advantages(rewards, group_size, eps, mask=mask)

    return IMPL.replace("grpo.adv_validates_masked_rewards", group_advantages=group_advantages)


@registry.mutant("grpo.adv_mask_bool_only", base="grpo")
def adv_mask_bool_only():
    """group_advantages takes only a bool mask: a 0/1 float or integer mask, which the interface accepts, is refused."""
    def group_advantages(rewards, group_size, eps=1e-6, *, mask=None):
        if mask is not None and mask.dtype != torch.bool:
            raise ValueError("mask must be a bool tensor")
        return L.group_advantages(rewards, group_size, eps, mask=mask)

    return IMPL.replace("grpo.adv_mask_bool_only", group_advantages=group_advantages)


@registry.mutant("grpo.adv_checked_on_empty_rows", base="grpo")
def adv_checked_on_empty_rows():
    """grpo_loss validates [B] advantages before masking: a NaN advantage of an empty response is refused."""
    def grpo_loss(logp, old_logp, advantages, mask, **kwargs):
        if advantages.dim() == 1 and not bool(torch.isfinite(advantages).all()):
            raise ValueError("advantages hold NaN or inf")
        return L.grpo_loss(logp, old_logp, advantages, mask, **kwargs)

    return IMPL.replace("grpo.adv_checked_on_empty_rows", grpo_loss=grpo_loss)


@registry.mutant("grpo.kl_token_mean", base="grpo")
def kl_token_mean():
    """The KL term added after aggregation as a token mean, whatever agg: right in token-mean mode only."""
    def grpo_loss(logp, old_logp, advantages, mask, *, beta=0.0, ref_logp=None, **kwargs):
        loss, metrics = L.grpo_loss(logp, old_logp, advantages, mask, beta=beta, ref_logp=ref_logp, **kwargs)
        if float(beta) > 0.0:
            m = L.check_pair(logp, old_logp, mask)
            kl = L.k3_kl(logp, ref_logp, m, L.compute_dtype(logp.dtype))
            loss = L.grpo_loss(logp, old_logp, advantages, mask, ref_logp=ref_logp, **kwargs)[0]
            loss = loss + float(beta) * kl.sum() / m.sum()
        return loss, metrics

    return IMPL.replace("grpo.kl_token_mean", grpo_loss=grpo_loss)


@registry.mutant("grpo.kl_in_input_dtype", base="grpo")
def kl_in_input_dtype():
    """The k3 term computed in the inputs' dtype: bfloat16 inputs round exp(d) - d - 1, which cancels."""
    return _loss("grpo.kl_in_input_dtype",
                 kl_fn=lambda logp, ref, m, cdt: L.k3_kl(logp, ref, m, logp.dtype).to(cdt))


@registry.mutant("grpo.kl_mask_by_multiply", base="grpo")
def kl_mask_by_multiply():
    """The k3 term's masked slots zeroed by multiplying with the mask: junk in ref_logp leaks (NaN * 0)."""
    def kl_fn(logp, ref, m, cdt):
        d = (ref.detach().to(cdt) - logp.to(cdt)) * m.to(cdt)
        return d.exp() - d - 1.0

    return _loss("grpo.kl_mask_by_multiply", kl_fn=kl_fn)


@registry.mutant("grpo.ratio_max_over_padding", base="grpo")
def ratio_max_over_padding():
    """metrics['ratio_max'] taken over every slot: padding's ratio exp(0) = 1 wins when every valid ratio is below 1."""
    def surrogate_fn(lr, a, m, lo, hi, dual, clamp):
        f, stats = L.fused_surrogate(lr, a, m, lo, hi, dual, clamp)
        stats = stats.clone()
        stats[1] = lr.detach().clamp(-clamp, clamp).exp().amax().to(stats.dtype)
        return f, stats

    return _loss("grpo.ratio_max_over_padding", surrogate_fn=surrogate_fn)


@registry.mutant("grpo.clamp_fixed", base="grpo")
def clamp_fixed():
    """log_ratio_clamp validated, then ignored: the log-ratio is always clamped at 20."""
    def grpo_loss(logp, old_logp, advantages, mask, *, log_ratio_clamp=20.0, **kwargs):
        L.grpo_loss(logp, old_logp, advantages, mask, log_ratio_clamp=log_ratio_clamp, **kwargs)  # its refusals
        return L.grpo_loss(logp, old_logp, advantages, mask, **kwargs)

    return IMPL.replace("grpo.clamp_fixed", grpo_loss=grpo_loss)


@registry.mutant("grpo.mask_fixed_eos", base="grpo")
def mask_fixed_eos():
    """The sampler's mask ignores eos_id: it always ends at token 1."""
    from methods.grpo.sampler import response_mask

    return IMPL.replace("grpo.mask_fixed_eos", response_mask=lambda responses, eos_id=1: response_mask(responses))


@registry.mutant("grpo.behaviour_logprobs_in_input_dtype", base="grpo")
def behaviour_logprobs_in_input_dtype():
    """The behaviour log-probs computed in the logits' dtype, converted to float64 only at the end."""
    def behaviour_logprobs(logits, tokens, temperature=1.0):
        from methods.grpo.sampler import behaviour_logprobs as honest

        honest(logits, tokens, temperature)  # its refusals
        lp = torch.log_softmax(logits / temperature, dim=-1)
        return lp.gather(-1, tokens[..., None].long())[..., 0].double()

    return IMPL.replace("grpo.behaviour_logprobs_in_input_dtype", behaviour_logprobs=behaviour_logprobs)
