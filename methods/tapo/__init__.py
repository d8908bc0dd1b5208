"""TAPO (tapo-trajectory): importing this package registers the implementation, checks and mutants."""

from methods.tapo import impl, checks, fastpath, inputs, learning, mechanism, mutants, verl_adapter  # noqa: F401  (registration side effects)
from methods.tapo.objective import (  # noqa: F401
    ZeroAdvantageError,
    length_aware_clip,
    tapo_loss,
    trajectory_ratio,
)
