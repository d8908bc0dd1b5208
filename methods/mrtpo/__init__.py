"""MRTPO (arXiv 2610.21439 v1): token-level multi-reward credit from a frozen replay.

Importing the package registers the implementation "mrtpo", its checks and its mutants.
"""

from methods.mrtpo.credit import beta_schedule, credit_weights, credit_weights_from_logits, js_distance, mrtpo_advantages
from methods.mrtpo.mechanism import freeze, replay_contexts, student_context, warmup_step
from methods.mrtpo.impl import IMPL
from methods.mrtpo import checks, fastpath_checks, mechanism_checks, mutants, reference  # noqa: F401  (registration)

# credit_weights, credit_weights_from_logits and mrtpo_advantages run the shared mask convention
# (methods/common/masking.py) on every call, so MRTPO's mutants cover it as TAR's do.
__mutate_also__ = ("methods.common.masking",)

__all__ = [
    "IMPL",
    "js_distance",
    "beta_schedule",
    "credit_weights",
    "credit_weights_from_logits",
    "mrtpo_advantages",
    "student_context",
    "freeze",
    "replay_contexts",
    "warmup_step",
]
