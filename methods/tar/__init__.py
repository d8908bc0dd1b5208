"""TAR (arXiv 2610.24236): verifier-filtered FPS bank and gated adaptive replay.

Importing this package registers the implementation "tar", its checks and its
mutants with `engine.spec.registry`.
"""

from methods.tar.fps import farthest_point_prototypes
from methods.tar.replay import adaptive_replay_loss, soft_gate, tar_total_loss
from methods.tar.impl import IMPL
from methods.tar import checks, harness_check, inputs, mutants, reference  # noqa: F401  (registration)

__all__ = ["IMPL", "adaptive_replay_loss", "farthest_point_prototypes", "soft_gate", "tar_total_loss"]
