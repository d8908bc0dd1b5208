"""The TAPO implementation bundle that checks receive (or a mutant of it)."""

from engine.spec import registry
from methods.tapo.objective import length_aware_clip, tapo_loss, trajectory_ratio
from methods.tapo.proximal import proximal_logprobs

IMPL = registry.implementation(
    "tapo",
    trajectory_ratio=trajectory_ratio,
    length_aware_clip=length_aware_clip,
    tapo_loss=tapo_loss,
    proximal_logprobs=proximal_logprobs,
)
