"""TAPO's interface from a verl policy loss: `contracts check tapo-trajectory --impl verl:NAME`.

A verl policy loss is only the loss: `fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights) -> (loss, metrics)`. It becomes TAPO's `tapo_loss` as follows (the contract's inputs onto
what verl's actor hands a policy loss, engine/run/adapters/verl.py):

    logp, old_logp   -> log_prob, old_log_prob, [B, L] as they are (junk in masked slots kept: verl's
                        response_mask has holes too, in multi-turn rollouts)
    mask             -> response_mask, bool (verl's actor converts it so)
    advantages [B]   -> [B, L], the row's advantage at every slot (verl's advantages are per token)
    eps_max          -> config.clip_ratio and config.clip_ratio_high (the bound at t = 1, the one a constant-clip
                        loss and the GRPO control use)
    eps_min          -> config.clip_ratio_low (the bound at t = T)
    horizon          -> config.loss_scale_factor (verl's constant response horizon); None: each row's own length
    group_size       -> config.rollout_n (verl's group size); None: the call's B rows are one group
    loss_agg_mode    -> "token-mean" (TAPO's aggregation, spec assumption `aggregation`)

The loss comes back as it is. Its metrics are read by TAPO's names, bare or with verl's `actor/` prefix
(`actor/ratio_min`, ...); `tokens`, when the loss does not report it, is the number of valid tokens in the mask,
which is what verl's own aggregation divides by (`batch_num_tokens`).

What a loss cannot be held to: it has no `trajectory_ratio` and no `length_aware_clip`, so the contracts of those
alone are not applicable, and the ratio or schedule measurements of the others are not measured (the receipt
says which; the run is `partial`, never `passed`). `proximal_logprobs` is the adapter's, not the loss's: verl's
trainer scores `old_log_prob` once per batch with the behaviour policy and takes its PPO epochs against it, which
is what the project's proximal_logprobs does, so the mechanism run drives the verl loss in that loop.
"""

from __future__ import annotations

import torch

from engine.spec import registry

METRICS = ("tokens", "ratio_min", "ratio_max", "clip_fraction", "clip_active_fraction", "eps_lo", "eps_hi")
NO_RATIO = "a verl policy loss returns only (loss, metrics), not the ratio R^_t"
NO_CLIP = "a verl policy loss returns only (loss, metrics), not the clip schedule eps_t"
PROXIMAL = ("verl's trainer scores old_log_prob once per batch and takes every PPO epoch against it; the adapter "
            "supplies the project's proximal_logprobs, which does the same")


def config_for(eps_min: float, eps_max: float, horizon: int | None, group_size: int):
    """verl's ActorConfig carrying TAPO's inputs (see the module docstring)."""
    from engine.run.adapters.verl import actor_config

    # TAPO's bounds exist only in this mapping (verl's signature has no eps): a pair no clip range can be made of
    # is refused here, as TAPO's interface documents, rather than handed to verl as a meaningless config
    if not 0.0 <= float(eps_min) <= float(eps_max):
        raise ValueError(f"need 0 <= eps_min <= eps_max, got eps_min={eps_min}, eps_max={eps_max}")
    return actor_config(clip_ratio=eps_max, clip_ratio_low=eps_min, clip_ratio_high=eps_max, rollout_n=group_size,
                        loss_agg_mode="token-mean", loss_scale_factor=horizon)


def _metrics(raw, mask: torch.Tensor) -> dict:
    out = {}
    for key, value in dict(raw or {}).items():
        name = key[len("actor/"):] if isinstance(key, str) and key.startswith("actor/") else key
        if name in METRICS:
            out[name] = value.item() if isinstance(value, torch.Tensor) else value
    out.setdefault("tokens", int(mask.sum()))
    return out


@registry.adapter("verl", implementation="tapo")
def from_verl_policy_loss(fn) -> registry.Adapted:
    """TAPO's `tapo_loss` from verl policy loss `fn`; the ratio and schedule functions are absent."""
    from engine.run.adapters.verl import call_policy_loss
    from methods.tapo.proximal import proximal_logprobs

    def tapo_loss(logp, old_logp, advantages, mask, eps_min, eps_max, horizon=None, *, group_size=None):
        m = mask if mask.dtype == torch.bool else mask != 0
        adv = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        config = config_for(eps_min, eps_max, horizon, logp.shape[0] if group_size is None else group_size)
        loss, metrics = call_policy_loss(fn, old_log_prob=old_logp, log_prob=logp, advantages=adv, response_mask=m,
                                         loss_agg_mode="token-mean", config=config)
        return loss, _metrics(metrics, m)

    return registry.Adapted(
        functions={"tapo_loss": tapo_loss, "proximal_logprobs": proximal_logprobs},
        own=["tapo_loss"],
        supplied={"proximal_logprobs": PROXIMAL},
        absent={"trajectory_ratio": NO_RATIO, "length_aware_clip": NO_CLIP},
        notes=["eps_max -> clip_ratio, clip_ratio_high; eps_min -> clip_ratio_low; horizon -> loss_scale_factor; "
               "group_size -> rollout_n; loss_agg_mode token-mean; [B] advantages broadcast over the row; tokens "
               "from the mask unless the loss reports it"],
    )
