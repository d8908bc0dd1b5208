"""Known-bad variants of TAR, one deliberate defect each; every one must be killed.

The replay-loss mutants are built from `replay_variant`, a copy of the loss
with one switch per defect; with every switch at its default it equals
`adaptive_replay_loss` bit for bit (tests/test_tar.py checks that), so each
mutant differs from the real implementation in exactly one place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.spec import registry
from methods.common.rollout import sequence_logprobs
from methods.common.source_edit import recompile
from methods.tar import fps as fps_module
from methods.tar import reference as ref
from methods.tar.fps import TIE_TOL, _segment_fps, farthest_point_prototypes
from methods.common import masked_mean
from methods.common.masking import as_bool_mask
from methods.tar.harness import kl_to_base, trajectory_embeddings
from methods.tar.impl import IMPL
from methods.tar.replay import DENOM_EPS, adaptive_replay_loss, check_replay_inputs, compute_dtype, soft_gate, tar_total_loss


def soft_gate_unclamped(z: torch.Tensor) -> torch.Tensor:
    """phi without max(0, .): 1 - e^-z, negative for z < 0 and -inf at z = -1e4."""
    zc = z.to(compute_dtype(z.dtype))
    return (-torch.expm1(-zc)).to(z.dtype)


def replay_variant(
    logp_theta,
    logp_base,
    mask,
    *,
    phi=soft_gate,
    constant_weights=False,
    detach_gate=True,
    active_only_mean=False,
    upcast=True,
    mask_by_multiply=False,
    reject_positive=True,
    count_dtype=None,
):
    if reject_positive:
        m = check_replay_inputs(logp_theta, logp_base, mask)
    else:
        # Only the finiteness half of the validation: positive log-probs slip through.
        m = mask.bool()
        check_replay_inputs(logp_theta.detach().clamp_max(0.0), logp_base.detach().clamp_max(0.0), m)
    cd = compute_dtype(logp_theta.dtype) if upcast else logp_theta.dtype
    lt = logp_theta.to(cd)
    lb = logp_base.to(device=lt.device, dtype=cd)
    B = lt.shape[0]
    zeros = torch.zeros_like(lt)
    lt_for_gate = lt if not detach_gate else lt.detach()
    delta_g = torch.where(m, lb - lt_for_gate, zeros)
    count = m.sum(1) if count_dtype is None else m.sum(1).to(count_dtype)  # the count_dtype defect: a narrow count
    mean_delta = delta_g.sum(1) / count.clamp_min(1).to(cd)
    gate = phi(mean_delta)
    with torch.no_grad():
        delta = torch.where(m, lb - lt.detach(), zeros)
        weights = torch.where(m, phi(delta), zeros)
    if constant_weights:
        gate = torch.ones_like(gate)
        weights = m.to(cd)
    if mask_by_multiply:
        nll = -lt * m.to(cd)
    else:
        nll = torch.where(m, -lt, zeros)
    denom = torch.tensor(DENOM_EPS, dtype=cd, device=lt.device) + weights.sum(1)
    per_traj = gate * (weights * nll).sum(1) / denom
    if active_only_mean:
        n = int((gate > 0).sum())
        loss = per_traj.sum() / max(n, 1)
    else:
        loss = per_traj.sum() / max(B, 1)
    metrics = {
        "gates": gate.detach(),
        "mean_delta": mean_delta.detach(),
        "token_weights": weights,
        "weight_sum": weights.sum(1),
        "active_fraction": float((gate > 0).double().mean()) if B else 0.0,
        "num_trajectories": B,
    }
    return loss, metrics


def _variant(**switches):
    def loss(logp_theta, logp_base, mask):
        return replay_variant(logp_theta, logp_base, mask, **switches)

    return loss


def _replay(name: str, **switches):
    """The mutant `name`: the replay loss with the given switches of replay_variant (phi also swaps soft_gate)."""
    gate = {"soft_gate": switches["phi"]} if "phi" in switches else {}
    return lambda: IMPL.replace(name, adaptive_replay_loss=_variant(**switches), **gate)


# One switch each (the spec's `mutants:` says what each plants and which contracts kill it).
registry.mutant("tar.constant_sft", base="tar")(_replay("tar.constant_sft", constant_weights=True))
registry.mutant("tar.gate_not_detached", base="tar")(_replay("tar.gate_not_detached", detach_gate=False))
registry.mutant("tar.active_only_mean", base="tar")(_replay("tar.active_only_mean", active_only_mean=True))
registry.mutant("tar.no_fp32_upcast", base="tar")(_replay("tar.no_fp32_upcast", upcast=False))
registry.mutant("tar.phi_no_clamp", base="tar")(_replay("tar.phi_no_clamp", phi=soft_gate_unclamped))
registry.mutant("tar.mask_by_multiply", base="tar")(_replay("tar.mask_by_multiply", mask_by_multiply=True))
registry.mutant("tar.accepts_positive_logp", base="tar")(_replay("tar.accepts_positive_logp", reject_positive=False))


@registry.mutant("tar.total_replay_detached", base="tar")
def total_replay_detached():
    """The replay term enters the total loss's value but not its gradient (TRL PR #6140's shape of bug)."""

    def total(grpo_loss, replay_loss, lambda_rep=1.0):
        return tar_total_loss(grpo_loss, replay_loss.detach(), lambda_rep=lambda_rep)

    return IMPL.replace("tar.total_replay_detached", tar_total_loss=total)


# --- FPS ----------------------------------------------------------------------------
# Each is a call of the real FPS, the per-prompt reference loop or the batched core with one defect.


def _fps(name: str, fps) -> object:
    return IMPL.replace(name, farthest_point_prototypes=fps)


@registry.mutant("tar.fps_keeps_incorrect", base="tar")
def fps_keeps_incorrect():
    """FPS over every candidate, ignoring the verifier's marks."""
    return _fps("tar.fps_keeps_incorrect", lambda e, c, k=3, prompt_ids=None: farthest_point_prototypes(
        e, torch.ones_like(torch.as_tensor(c), dtype=torch.bool), k=k, prompt_ids=prompt_ids))


@registry.mutant("tar.fps_no_normalisation", base="tar")
def fps_no_normalisation():
    """Distance 1 - <e_i, e_j> on raw embeddings: not the cosine distance when norms differ."""
    return _fps("tar.fps_no_normalisation", lambda e, c, k=3, prompt_ids=None: ref.fps_per_prompt_loop(
        e, c, k, prompt_ids, unit=lambda x: x))


@registry.mutant("tar.fps_rounding_ties", base="tar")
def fps_rounding_ties():
    """Ties by exact equality: between scaled copies float64 rounding of 1 - cos picks, not the lowest index."""
    return _fps("tar.fps_rounding_ties", lambda e, c, k=3, prompt_ids=None: _segment_fps(e, c, k, prompt_ids, 0.0))


@registry.mutant("tar.fps_sorts_invalid", base="tar")
def fps_sorts_invalid():
    """F.normalize (eps = 1e-12) instead of validation: a zero vector stays zero, NaN stays NaN, both get sorted."""
    return _fps("tar.fps_sorts_invalid", lambda e, c, k=3, prompt_ids=None: ref.fps_per_prompt_loop(
        e, c, k, prompt_ids, unit=lambda x: F.normalize(x, dim=1)))


# --- harness steps the method decides (methods/tar/harness.py) -----------------------


@registry.mutant("tar.bank_scored_by_policy", base="tar")
def bank_scored_by_policy():
    """The bank's reference log-probs are scored by the live policy, not the frozen base: delta = 0."""

    def bank_logprobs(policy, base, prompts, responses):
        logp_theta, _ = sequence_logprobs(policy, prompts, responses)
        return logp_theta, logp_theta.detach()

    return IMPL.replace("tar.bank_scored_by_policy", bank_logprobs=bank_logprobs)


@registry.mutant("tar.kl_reversed", base="tar")
def kl_reversed():
    """The KL term in the other direction, KL(pi_base || pi_theta)."""

    def kl(logdist, base_logdist, mask):
        return kl_to_base(base_logdist, logdist, mask)

    return IMPL.replace("tar.kl_reversed", kl_to_base=kl)


@registry.mutant("tar.encoder_pools_padding", base="tar")
def encoder_pools_padding():
    """The declared encoder averages the hidden states over every response slot, padding included."""

    def embeddings(base, prompts, responses, mask):
        return trajectory_embeddings(base, prompts, responses, torch.ones_like(mask, dtype=torch.bool))

    return IMPL.replace("tar.encoder_pools_padding", trajectory_embeddings=embeddings)


@registry.mutant("tar.kl_sign_flipped", base="tar")
def kl_sign_flipped():
    """The KL term enters with the wrong sign: the regulariser pushes the policy away from the base."""

    def kl(logdist, base_logdist, mask):
        return -kl_to_base(logdist, base_logdist, mask)

    return IMPL.replace("tar.kl_sign_flipped", kl_to_base=kl)


@registry.mutant("tar.kl_zero_prob_nan", base="tar")
def kl_zero_prob_nan():
    """p log p written as exp(l) * l with no select: a zero probability (l = -inf) gives 0 * -inf = NaN."""

    def kl(logdist, base_logdist, mask):
        kl_tok = (logdist.exp() * (logdist - base_logdist)).sum(-1)
        return masked_mean(kl_tok, as_bool_mask(mask))

    return IMPL.replace("tar.kl_zero_prob_nan", kl_to_base=kl)


# --- batched-FPS defects -------------------------------------------------------------
# The bank's FPS runs `_segment_fps` (and `_dense_prompt_ranks`). These mutants are that very
# source with one edit, compiled beside the module; an edit whose text is gone raises.


def _fps_variant(name: str, edits: list[tuple[str, str, str]]):
    namespace = recompile(fps_module, ("_dense_prompt_ranks", "_segment_fps"), edits, name)
    segment = namespace["_segment_fps"]

    def fps(embeddings, correct, k=3, prompt_ids=None):
        return segment(embeddings, correct, k, prompt_ids, TIE_TOL)

    return IMPL.replace(name, farthest_point_prototypes=fps)


# Wide-range prompt ids: the torch.unique branch ranks prompts in descending id order.
_WIDE_IDS_DESCENDING = [(
    "_dense_prompt_ranks",
    "_, rank, counts = torch.unique(pid, return_inverse=True, return_counts=True)\n        return rank, counts",
    "_, rank, counts = torch.unique(pid, return_inverse=True, return_counts=True)\n"
    "        return counts.numel() - 1 - rank, counts.flip(0)",
)]
# Blocked distances: every block reads the first block's prompt ranks (wrong pick rows past block 1).
_BLOCK_GROUP_OFFSET = [("_segment_fps", "unit.index_select(0, group[lo:hi])", "unit.index_select(0, group[: hi - lo])")]
registry.mutant("tar.fps_wide_ids_descending", base="tar")(
    lambda: _fps_variant("tar.fps_wide_ids_descending", _WIDE_IDS_DESCENDING))
registry.mutant("tar.fps_block_group_offset", base="tar")(
    lambda: _fps_variant("tar.fps_block_group_offset", _BLOCK_GROUP_OFFSET))


# --- argument handling and the KL gradient ------------------------------------------


@registry.mutant("tar.fps_marks_cast_to_bool", base="tar")
def fps_marks_cast_to_bool():
    """The verifier's marks are cast to bool instead of validated: a float score or a count of 2 is taken as correct."""
    return _fps("tar.fps_marks_cast_to_bool", lambda e, c, k=3, prompt_ids=None: farthest_point_prototypes(
        e, torch.as_tensor(c).bool(), k=k, prompt_ids=prompt_ids))


@registry.mutant("tar.mask_cast_to_bool", base="tar")
def mask_cast_to_bool():
    """The replay mask is cast to bool instead of validated: a float or weighted mask is silently read as 0/1."""

    def loss(logp_theta, logp_base, mask):
        return adaptive_replay_loss(logp_theta, logp_base, torch.as_tensor(mask).bool())

    return IMPL.replace("tar.mask_cast_to_bool", adaptive_replay_loss=loss)


@registry.mutant("tar.kl_detached", base="tar")
def kl_detached():
    """The KL term's value is right but its gradient is cut: the regulariser never pulls the policy to the base."""

    def kl(logdist, base_logdist, mask):
        return kl_to_base(logdist, base_logdist, mask).detach()

    return IMPL.replace("tar.kl_detached", kl_to_base=kl)


@registry.mutant("tar.encoder_empty_nan", base="tar")
def encoder_empty_nan():
    """The encoder divides by the raw valid-token count: an empty response's embedding is 0/0 = NaN."""

    @torch.no_grad()
    def embeddings(base, prompts, responses, mask):
        _, hidden, _ = base(torch.cat([prompts, responses], dim=1))
        h = hidden[:, prompts.shape[1]:].double()
        m = mask.bool()[..., None]
        return torch.where(m, h, torch.zeros_like(h)).sum(1) / m.sum(1)

    return IMPL.replace("tar.encoder_empty_nan", trajectory_embeddings=embeddings)


@registry.mutant("tar.replay_whole_bank", base="tar")
def replay_whole_bank():
    """Every update replays the whole bank, not only the entries of its own prompts."""

    def rows(bank_prompts, step_prompts):
        return torch.arange(bank_prompts.numel(), device=bank_prompts.device)

    return IMPL.replace("tar.replay_whole_bank", replay_rows=rows)


# --- what crosses into the supervisor's policy, and what the replay loss reports -------------------------------


@registry.mutant("tar.bank_replay_gradient_reversed", base="tar")
def bank_replay_gradient_reversed():
    """bank_logprobs returns the policy's exact log-probs of the bank tokens with their gradient into the policy
    reversed (sg[l] - (l - sg[l])): the replay pushes the bank's tokens down while every value is right."""

    def bank_logprobs(policy, base, prompts, responses):
        logp_theta, logp_base = IMPL.bank_logprobs(policy, base, prompts, responses)
        return logp_theta.detach() - (logp_theta - logp_theta.detach()), logp_base

    return IMPL.replace("tar.bank_replay_gradient_reversed", bank_logprobs=bank_logprobs)


@registry.mutant("tar.reports_no_replay", base="tar")
def reports_no_replay():
    """The replay loss as it is, its metrics saying no trajectory was ever gated in (gates and weights 0)."""

    def replay(logp_theta, logp_base, mask):
        loss, metrics = adaptive_replay_loss(logp_theta, logp_base, mask)
        zeros = torch.zeros_like(metrics["gates"])
        return loss, {**metrics, "gates": zeros, "token_weights": torch.zeros_like(metrics["token_weights"]),
                      "weight_sum": zeros, "active_fraction": 0.0}

    return IMPL.replace("tar.reports_no_replay", adaptive_replay_loss=replay)


# --- pairing defects of the mechanism run (methods/common/paired.py) -------------------------------------

from methods.common.paired import defect  # noqa: E402

registry.mutant("tar.control_trained_weights", base="tar")(defect(IMPL, "tar.control_trained_weights"))
registry.mutant("tar.control_other_stream", base="tar")(defect(IMPL, "tar.control_other_stream"))
registry.mutant("tar.same_stream_every_seed", base="tar")(defect(IMPL, "tar.same_stream_every_seed"))
registry.mutant("tar.control_adv_whole_batch", base="tar")(defect(IMPL, "tar.control_adv_whole_batch"))
registry.mutant("tar.control_never_moves", base="tar")(defect(IMPL, "tar.control_never_moves"))


# --- counts and ids in narrow dtypes (seen only at training sizes: the scale tier) ---------------------------------


# Each trajectory's valid-token count kept in int16: past 32,767 tokens it wraps negative, and the gate is phi of
# the row's delta sum, not of its mean.
registry.mutant("tar.replay_count_int16", base="tar")(_replay("tar.replay_count_int16", count_dtype=torch.int16))


def _fps_ids_int16(embeddings, correct, k=3, prompt_ids=None):
    """farthest_point_prototypes with the prompt ids kept in int16: ids past 32,767 wrap, so prompts 65,536 apart
    share a bank and the picks come out in another prompt order."""
    ids = None if prompt_ids is None else torch.as_tensor(prompt_ids).to(torch.int16)  # DEFECT
    return farthest_point_prototypes(embeddings, correct, k, ids)


registry.mutant("tar.fps_ids_int16", base="tar")(
    lambda: IMPL.replace("tar.fps_ids_int16", farthest_point_prototypes=_fps_ids_int16))


# --- promises the interface declares that no case tried before ------------------------------------------------


@registry.mutant("tar.kl_masked_after_sum", base="tar")
def kl_masked_after_sum():
    """kl_to_base masks only the per-token sum: junk at a masked position (NaN, or 1e4 whose exp is inf) leaves a
    NaN gradient there (0 * NaN in the backward pass), though the value is right."""
    from methods.common import masked_mean
    from methods.common.masking import as_bool_mask

    def kl(logdist, base_logdist, mask):
        kl_tok = (logdist.exp() * (logdist - base_logdist)).sum(-1)
        return masked_mean(kl_tok, as_bool_mask(mask))

    return IMPL.replace("tar.kl_masked_after_sum", kl_to_base=kl)


def _bool_only(fn, name):
    def call(*args, **kwargs):
        mask = kwargs.get("mask", args[-1] if args else None)
        if mask is not None and mask.dtype != torch.bool:
            raise ValueError(f"{name}: mask must be a bool tensor")
        return fn(*args, **kwargs)
    return call


@registry.mutant("tar.kl_mask_bool_only", base="tar")
def kl_mask_bool_only():
    """kl_to_base takes only a bool mask: a 0/1 float or integer mask, which the interface accepts, is refused."""
    return IMPL.replace("tar.kl_mask_bool_only", kl_to_base=_bool_only(kl_to_base, "kl_to_base"))


@registry.mutant("tar.encoder_mask_bool_only", base="tar")
def encoder_mask_bool_only():
    """trajectory_embeddings takes only a bool mask: a 0/1 float or integer mask is refused."""
    return IMPL.replace("tar.encoder_mask_bool_only",
                        trajectory_embeddings=_bool_only(trajectory_embeddings, "trajectory_embeddings"))


@registry.mutant("tar.mean_delta_over_padding", base="tar")
def mean_delta_over_padding():
    """metrics['mean_delta'] reported over the padded length T, not each row's valid tokens (the gate is right)."""
    def replay(logp_theta, logp_base, mask):
        loss, metrics = adaptive_replay_loss(logp_theta, logp_base, mask)
        n = torch.as_tensor(mask).to(torch.bool).sum(dim=1).clamp_min(1).to(metrics["mean_delta"].dtype)
        T = max(int(torch.as_tensor(mask).shape[-1]), 1)
        return loss, {**metrics, "mean_delta": metrics["mean_delta"] * n / T}

    return IMPL.replace("tar.mean_delta_over_padding", adaptive_replay_loss=replay)


@registry.mutant("tar.weight_sum_with_guard", base="tar")
def weight_sum_with_guard():
    """metrics['weight_sum'] reported with the 1e-8 denominator guard added (the loss is right)."""
    def replay(logp_theta, logp_base, mask):
        loss, metrics = adaptive_replay_loss(logp_theta, logp_base, mask)
        return loss, {**metrics, "weight_sum": metrics["weight_sum"] + DENOM_EPS}

    return IMPL.replace("tar.weight_sum_with_guard", adaptive_replay_loss=replay)
