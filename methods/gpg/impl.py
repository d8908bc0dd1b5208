"""The GPG implementation bundle that checks receive (or a mutant of it)."""

from engine.spec import registry
from methods.gpg.loss import gpg_advantages, gpg_loss

IMPL = registry.implementation("gpg", gpg_advantages=gpg_advantages, gpg_loss=gpg_loss)
