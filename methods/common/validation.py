"""The learning kind's validation tasks (engine/kinds/learning.py): a task's prompts, and its accuracy per prompt
over responses sampled from a policy, registered by name so the engine reaches them without importing methods/."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.kinds.learning import learning_task
from methods.common.rollout import sample
from methods.common.tasks import TargetTokenTask


@dataclass(frozen=True)
class Validated:
    """`task` (prompts, context, verify -> [B] rewards in [0, 1]) as the learning kind validates on it."""

    task: Any

    def prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return self.task.prompts(n, generator)

    def accuracy(self, policy, prompts: torch.Tensor, samples: int, max_new_tokens: int,
                 generator: torch.Generator) -> tuple[list[float], int]:
        """The mean reward per prompt over `samples` responses sampled from `policy`, and the tokens sampled."""
        rep = prompts.repeat_interleave(samples, dim=0)
        device = next(policy.parameters()).device
        ro = sample(policy, self.task.context(rep).to(device), max_new_tokens, generator)
        r = self.task.verify(rep.to(device), ro.responses, ro.mask).double().cpu()
        return r.view(-1, samples).mean(1).tolist(), ro.n_tokens


@learning_task("target_token")
def _target_token(params: dict) -> Validated:
    return Validated(TargetTokenTask(vocab_size=int(params.get("vocab_size", 16)),
                                     prompt_len=int(params.get("prompt_len", 4))))
