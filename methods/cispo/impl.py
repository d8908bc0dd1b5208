"""The CISPO implementation bundle that checks receive (or a mutant of it)."""

from engine.spec import registry
from methods.cispo.loss import cispo_loss

IMPL = registry.implementation("cispo", cispo_loss=cispo_loss)
