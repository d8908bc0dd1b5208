"""TAR (arXiv 2610.24236): verifier-filtered FPS bank and gated adaptive replay.

Importing this package registers the implementation "tar", its checks and its
mutants with `engine.spec.registry`.
"""

from methods.tar.fps import farthest_point_prototypes
from methods.tar.replay import adaptive_replay_loss, soft_gate, tar_total_loss
from methods.tar.impl import IMPL
from methods.tar import checks, harness_check, inputs, mutants, reference  # noqa: F401  (registration)

# The mask convention's check and the masked mean moved to methods/common (one copy for every method); TAR's
# interface runs them on every call, so its mutants cover them as they covered the inline copies.
__mutate_also__ = ("methods.common.masking",)

__all__ = ["IMPL", "adaptive_replay_loss", "farthest_point_prototypes", "soft_gate", "tar_total_loss"]
