"""GRPO (grpo), the pages' control: importing this package registers the implementation and mutants.

`methods.common.grpo` (what every mechanism run's control arm calls) delegates here, so the loss that
specs/grpo.yaml checks is the one the control trains with.
"""

from methods.grpo import impl, mutants, reference, trl_adapter, verl_adapter  # noqa: F401  (registration side effects)

# The control arm's wrapper is GRPO's code too: its executed lines are mutated and judged by grpo's contracts.
__mutate_also__ = ("methods.common.grpo",)
from methods.grpo.loss import AGG_MODES, group_advantages, grpo_loss  # noqa: F401
