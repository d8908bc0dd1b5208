"""The GMPO implementation bundle that checks receive (or a mutant of it)."""

from engine.spec import registry
from methods.gmpo.loss import geometric_ratio, gmpo_loss

IMPL = registry.implementation("gmpo", geometric_ratio=geometric_ratio, gmpo_loss=gmpo_loss)
