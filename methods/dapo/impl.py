"""The DAPO implementation bundle that checks receive (or a mutant of it)."""

from engine.spec import registry
from methods.dapo.loss import dapo_loss, dynamic_sampling_mask, overlong_penalty

IMPL = registry.implementation("dapo", dapo_loss=dapo_loss, overlong_penalty=overlong_penalty,
                               dynamic_sampling_mask=dynamic_sampling_mask)
