"""GRPO's and GSPO's interfaces from TRL: `contracts check grpo|gspo --impl trl:GRPOTrainer`.

TRL computes the loss inside `GRPOTrainer._compute_loss(model, inputs)` after the model's per-token log-probs.
The adapter makes a trainer with `object.__new__` (as TRL's own tests do), sets the attributes `_compute_loss`
reads (trl 1.16.0), and overrides `_get_per_token_logps_and_entropies` on that instance to return the contract's
`logp` (entropies 0: no entropy bonus is configured). Mapping:

    grpo agg token-mean              -> loss_type "bnpo"
    grpo agg seq-mean-token-mean     -> loss_type "grpo"
    grpo agg seq-mean-token-sum-norm -> loss_type "dr_grpo", max_completion_length = norm_length (or L)
    clip_low, clip_high              -> epsilon_low, epsilon_high
    ref_logp, beta                   -> inputs["ref_per_token_logps"], beta (TRL's k3, no clamp)
    gspo (either form, [B] advantages) -> importance_sampling_level "sequence", loss_type "grpo"
    dual_clip, per-token GSPO advantages, log_ratio_clamp: TRL has no such thing; the first two are not provided,
    the clamp is not applied (TRL has none), which the overflow contract measures.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import torch

from engine.spec import registry
from methods.grpo.verl_adapter import NO_CONTROL, NO_SAMPLER

LOSS_TYPES = {"token-mean": "bnpo", "seq-mean-token-mean": "grpo", "seq-mean-token-sum-norm": "dr_grpo"}
NO_ADVANTAGES = ("TRL computes advantages inside _generate_and_score_completions, from a model's generations; "
                 "only the loss is reachable without a model")
NO_RATIO = "TRL computes the sequence ratio inline in _compute_loss and does not return it"


def _accelerator():
    return SimpleNamespace(gather=lambda t: t, gather_for_metrics=lambda t: t, num_processes=1, sync_gradients=True,
                           reduce=lambda t, reduction="sum": t)


def make_trainer(cls, *, loss_type: str, level: str, clip_low: float, clip_high: float, beta: float,
                 max_completion_length: int | None):
    """A GRPOTrainer without a model: only the state `_compute_loss` reads (trl 1.16.0)."""
    tr = object.__new__(cls)
    tr.loss_type, tr.importance_sampling_level = loss_type, level
    tr.epsilon_low, tr.epsilon_high, tr.beta = float(clip_low), float(clip_high), float(beta)
    tr.args = SimpleNamespace(delta=None, use_bias_correction_kl=False)
    tr.top_entropy_quantile, tr.off_policy_mask_threshold = 1.0, None
    tr.use_vllm, tr.vllm_importance_sampling_correction = False, False
    tr.model = SimpleNamespace(training=False)  # eval mode: no gradient-accumulation normaliser
    tr.current_gradient_accumulation_steps = 1
    tr.max_completion_length = max_completion_length
    tr.accelerator = _accelerator()
    tr._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    tr._entropy_bonus_enabled, tr.aux_loss_enabled = False, False
    return tr


def compute_loss(tr, logp, old_logp, advantages, mask, ref_logp=None):
    m = mask if mask.dtype == torch.bool else mask != 0
    tr._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
    B, L = logp.shape
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, L, dtype=torch.long), "completion_mask": m.long(),
              "advantages": advantages, "old_per_token_logps": old_logp}
    if ref_logp is not None:
        inputs["ref_per_token_logps"] = ref_logp
    loss = tr._compute_loss(None, inputs)
    return loss, {"tokens": int(m.sum()), "rows": int(m.any(dim=-1).sum())}


@registry.adapter("trl", implementation="grpo")
def grpo_from_trl(cls) -> registry.Adapted:
    from engine.run.adapters.trl import unpin

    cls, pinned = unpin(cls)  # trl:LOSS_TYPE: that loss type only; another aggregation is not provided

    def grpo_loss(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, ref_logp=None,
                  beta=0.0, agg="token-mean", norm_length=None, log_ratio_clamp=20.0):
        if dual_clip is not None:
            raise registry.NotProvided("grpo_loss", "TRL has no dual clip for negative advantages (its `delta` caps "
                                                    "the ratio from above, another thing)")
        if agg not in LOSS_TYPES:
            raise ValueError(f"agg must be one of {', '.join(LOSS_TYPES)}; got {agg!r}")
        if pinned is not None and LOSS_TYPES[agg] != pinned:
            raise registry.NotProvided("grpo_loss", f"trl:{pinned} aggregates as loss_type {pinned!r}; agg={agg!r} "
                                                    f"is loss_type {LOSS_TYPES[agg]!r}")
        use_kl = ref_logp is not None and float(beta) > 0.0
        tr = make_trainer(cls, loss_type=LOSS_TYPES[agg], level="token", clip_low=clip_low, clip_high=clip_high,
                          beta=float(beta) if use_kl else 0.0,
                          max_completion_length=norm_length or logp.shape[-1])
        return compute_loss(tr, logp, old_logp, advantages, mask, ref_logp if use_kl else None)

    return registry.Adapted(functions={"grpo_loss": grpo_loss}, own=["grpo_loss"],
                            absent={"group_advantages": NO_ADVANTAGES, **NO_SAMPLER, **NO_CONTROL},
                            notes=["agg token-mean -> bnpo, seq-mean-token-mean -> grpo, seq-mean-token-sum-norm -> "
                                   "dr_grpo (max_completion_length = norm_length or L); clip_low/high -> "
                                   "epsilon_low/high; beta, ref_logp -> beta, ref_per_token_logps; no dual clip, "
                                   "no log-ratio clamp in TRL"])


@registry.adapter("trl", implementation="gspo")
def gspo_from_trl(cls) -> registry.Adapted:
    from engine.run.adapters.trl import unpin

    cls, pinned = unpin(cls)  # trl:LOSS_TYPE: GSPO's setup is loss_type grpo at the sequence level, no other

    def gspo_loss(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, form="sequence",
                  log_ratio_clamp=10.0):
        if advantages.dim() != 1:
            raise registry.NotProvided("gspo_loss", "TRL has no GSPO-token form: per-token advantages at its "
                                                    "sequence level mix the tokens' advantages in the gradient")
        if pinned not in (None, "grpo"):
            raise registry.NotProvided("gspo_loss", f"trl:{pinned} is not GSPO's setup (loss_type 'grpo' at "
                                                    "importance_sampling_level 'sequence')")
        tr = make_trainer(cls, loss_type="grpo", level="sequence", clip_low=clip_low, clip_high=clip_high, beta=0.0,
                          max_completion_length=logp.shape[-1])
        return compute_loss(tr, logp, old_logp, advantages, mask)

    return registry.Adapted(functions={"gspo_loss": gspo_loss}, own=["gspo_loss"],
                            absent={"sequence_ratio": NO_RATIO},
                            notes=["importance_sampling_level sequence, loss_type grpo (mean over tokens, then over "
                                   "responses); clip_low/high -> epsilon_low/high; [B] advantages only"])
