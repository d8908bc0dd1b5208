"""The implementation object checks receive (a mutant replaces some of its functions)."""

from engine.spec import registry
from methods.tar.fps import farthest_point_prototypes
from methods.tar.harness import bank_logprobs, kl_to_base, replay_rows, trajectory_embeddings
from methods.tar.replay import adaptive_replay_loss, soft_gate, tar_total_loss

IMPL = registry.implementation(
    "tar",
    soft_gate=soft_gate,
    farthest_point_prototypes=farthest_point_prototypes,
    adaptive_replay_loss=adaptive_replay_loss,
    tar_total_loss=tar_total_loss,
    trajectory_embeddings=trajectory_embeddings,
    bank_logprobs=bank_logprobs,
    kl_to_base=kl_to_base,
    replay_rows=replay_rows,
)
