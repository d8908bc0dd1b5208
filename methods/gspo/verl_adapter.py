"""GSPO's interface from a verl policy loss: `contracts check gspo --impl verl:gspo`.

verl's `gspo` loss is the GSPO-token form: log s_i,t = logp_t - sg[logp_t] + sg[m_i], m_i the masked mean
log-ratio of the row, clamped above at 10, per-token advantages, aggregated by `loss_agg_mode`. The adapter maps:

    logp, old_logp, mask  -> log_prob, old_log_prob, response_mask (bool), as they are (junk in masked slots kept)
    advantages            -> [B] broadcast over the row, or [B, L] as given
    clip_low, clip_high   -> config.clip_ratio_low, config.clip_ratio_high (config.clip_ratio = clip_high)
    form                  -> either: verl computes the token form; with one advantage per response it has the
                             sequence form's value and gradient, which the sequence-form contracts then hold it to
    (aggregation)         -> loss_agg_mode "seq-mean-token-mean": mean over tokens, then over non-empty responses
    log_ratio_clamp       -> verl hard-codes 10; any other value is not provided

`sequence_ratio` is absent: a policy loss returns only (loss, metrics).
"""

from __future__ import annotations

from engine.spec import registry
from methods.grpo.verl_adapter import bool_mask, per_token, tokens_metrics

VERL_CLAMP = 10.0
NO_RATIO = "a verl policy loss returns only (loss, metrics), not the sequence ratio s_i"


@registry.adapter("verl", implementation="gspo")
def from_verl_policy_loss(fn) -> registry.Adapted:
    """GSPO's `gspo_loss` from verl policy loss `fn`; sequence_ratio is absent."""
    from engine.run.adapters.verl import actor_config, call_policy_loss

    def gspo_loss(logp, old_logp, advantages, mask, *, clip_low=3e-4, clip_high=4e-4, form="sequence",
                  log_ratio_clamp=VERL_CLAMP):
        if float(log_ratio_clamp) != VERL_CLAMP:
            raise registry.NotProvided("gspo_loss", f"verl clamps log s_i at {VERL_CLAMP:g}, fixed in its code; "
                                                    f"log_ratio_clamp={log_ratio_clamp} cannot be set")
        if form == "sequence" and advantages.shape != logp.shape[:1]:
            raise ValueError(f"the sequence form takes one advantage per response, got {tuple(advantages.shape)}")
        m = bool_mask(mask)
        config = actor_config(clip_ratio=clip_high, clip_ratio_low=clip_low, clip_ratio_high=clip_high,
                              rollout_n=1, loss_agg_mode="seq-mean-token-mean")
        loss, raw = call_policy_loss(fn, old_log_prob=old_logp, log_prob=logp, advantages=per_token(advantages, logp),
                                     response_mask=m, loss_agg_mode="seq-mean-token-mean", config=config)
        return loss, tokens_metrics(raw, m)

    return registry.Adapted(
        functions={"gspo_loss": gspo_loss},
        own=["gspo_loss"],
        absent={"sequence_ratio": NO_RATIO},
        notes=["clip_low -> clip_ratio_low; clip_high -> clip_ratio, clip_ratio_high; loss_agg_mode "
               "seq-mean-token-mean; [B] advantages broadcast over the row (both forms run verl's token form); "
               "tokens and rows from the mask"],
    )
