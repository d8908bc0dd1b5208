"""The GSPO implementation bundle that checks receive (or a mutant of it)."""

from engine.spec import registry
from methods.gspo.loss import gspo_loss, sequence_ratio

IMPL = registry.implementation("gspo", sequence_ratio=sequence_ratio, gspo_loss=gspo_loss)
