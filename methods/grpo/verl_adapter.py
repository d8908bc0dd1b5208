"""GRPO's interface from a verl policy loss: `contracts check grpo --impl verl:vanilla` (or any registered loss).

verl's actor hands a policy loss `(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)` and
adds the KL term itself (verl/workers/utils/losses.py: `kl_penalty` then `agg_loss`, times `kl_loss_coef`). The
adapter makes `grpo_loss` out of exactly that composition, with the spec's inputs mapped onto verl's config:

    logp, old_logp, mask  -> log_prob, old_log_prob, response_mask (bool), as they are (junk in masked slots kept)
    advantages [B]        -> [B, L], the row's advantage at every slot (verl's advantages are per token)
    clip_low, clip_high   -> config.clip_ratio_low, config.clip_ratio_high (config.clip_ratio = clip_high)
    dual_clip c           -> config.clip_ratio_c; None -> 1e10, a cap no per-token loss reaches (verl always
                             applies the dual clip, and |loss| <= exp(20) |A| < 1e10 |A| after its clamp)
    agg, norm_length      -> loss_agg_mode (the same names), config.loss_scale_factor
    ref_logp, beta        -> verl's own kl_penalty(log_prob, ref_log_prob, "low_var_kl") (k3, clamped to
                             [-10, 10]) aggregated by agg_loss with the same mode, times beta, added to the loss
    log_ratio_clamp       -> verl hard-codes 20; any other value is not provided

`group_advantages` is not part of a policy loss (verl's GRPO advantage is compute_grpo_outcome_advantage, an
estimator of its own), so the contracts of it alone are not applicable to a loss target.
"""

from __future__ import annotations

import torch

from engine.spec import registry

VERL_CLAMP = 20.0
NO_DUAL = 1.0e10
# the rollout's mask and behaviour log-probs are made by a framework's sampler, not by its loss
NO_SAMPLER = {f: "the framework's rollout sampler is not reachable through its loss"
              for f in ("response_mask", "behaviour_logprobs")}
NO_ADVANTAGES = ("a verl policy loss is only the loss; verl's group advantage is a separate estimator "
                 "(compute_grpo_outcome_advantage), not part of the loss under check")
# the paired runs' control arm is this repository's own configuration of grpo_loss (methods/common/grpo.py)
NO_CONTROL = {f: "the control arm of this repository's paired runs, not part of a framework's loss"
              for f in ("control_loss", "control_advantages")}


def bool_mask(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def per_token(advantages: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    return advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages


def tokens_metrics(raw, m: torch.Tensor) -> dict:
    """verl's own metrics (keys without the `actor/` prefix) plus `tokens` and `rows` from the mask."""
    out = {}
    for key, value in dict(raw or {}).items():
        name = key[len("actor/"):] if isinstance(key, str) and key.startswith("actor/") else key
        out[f"verl_{name}"] = value.item() if isinstance(value, torch.Tensor) else value
    out["tokens"] = int(m.sum())
    out["rows"] = int(m.any(dim=-1).sum())
    return out


@registry.adapter("verl", implementation="grpo")
def from_verl_policy_loss(fn) -> registry.Adapted:
    """GRPO's `grpo_loss` from verl policy loss `fn` (see the module docstring); group_advantages is absent."""
    from engine.run.adapters.verl import actor_config, call_policy_loss

    def grpo_loss(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, ref_logp=None,
                  beta=0.0, agg="token-mean", norm_length=None, log_ratio_clamp=VERL_CLAMP):
        if float(log_ratio_clamp) != VERL_CLAMP:
            raise registry.NotProvided("grpo_loss", f"verl clamps the log-ratio at +-{VERL_CLAMP:g}, fixed in its "
                                                    f"code; log_ratio_clamp={log_ratio_clamp} cannot be set")
        m = bool_mask(mask)
        config = actor_config(clip_ratio=clip_high, clip_ratio_low=clip_low, clip_ratio_high=clip_high,
                              rollout_n=1, loss_agg_mode=agg, loss_scale_factor=norm_length,
                              clip_ratio_c=NO_DUAL if dual_clip is None else float(dual_clip))
        loss, raw = call_policy_loss(fn, old_log_prob=old_logp, log_prob=logp, advantages=per_token(advantages, logp),
                                     response_mask=m, loss_agg_mode=agg, config=config)
        if ref_logp is not None and float(beta) > 0.0:
            from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

            kld = kl_penalty(logprob=logp, ref_logprob=ref_logp, kl_penalty="low_var_kl")
            loss = loss + float(beta) * agg_loss(loss_mat=kld, loss_mask=m, loss_agg_mode=agg,
                                                 **config.global_batch_info)
        return loss, tokens_metrics(raw, m)

    return registry.Adapted(
        functions={"grpo_loss": grpo_loss},
        own=["grpo_loss"],
        absent={"group_advantages": NO_ADVANTAGES, **NO_SAMPLER, **NO_CONTROL},
        notes=["clip_low -> clip_ratio_low; clip_high -> clip_ratio, clip_ratio_high; dual_clip -> clip_ratio_c "
               f"(None -> {NO_DUAL:g}, never binding); agg -> loss_agg_mode; norm_length -> loss_scale_factor; "
               "beta, ref_logp -> verl's kl_penalty('low_var_kl') + agg_loss, as verl's actor adds it; [B] "
               "advantages broadcast over the row; tokens and rows from the mask"],
    )
