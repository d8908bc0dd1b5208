"""The Dr. GRPO implementation bundle that checks receive (or a mutant of it)."""

from engine.spec import registry
from methods.dr_grpo.loss import dr_grpo_loss, group_advantages

IMPL = registry.implementation("dr_grpo", group_advantages=group_advantages, dr_grpo_loss=dr_grpo_loss)
