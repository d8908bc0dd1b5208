"""The GRPO implementation bundle that checks receive (or a mutant of it); the control arm calls these too."""

from engine.spec import registry
from methods.grpo.loss import group_advantages, grpo_loss
from methods.grpo.sampler import behaviour_logprobs, response_mask

IMPL = registry.implementation("grpo", group_advantages=group_advantages, grpo_loss=grpo_loss,
                               response_mask=response_mask, behaviour_logprobs=behaviour_logprobs)
