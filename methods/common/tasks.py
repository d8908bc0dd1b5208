"""Synthetic verifiable tasks with programmatic verifiers (no gold text enters training)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD = 0
EOS = 1
FIRST_CONTENT = 2


@dataclass(frozen=True)
class TargetTokenTask:
    """Prompt: random content tokens. Correct: the response contains the prompt's last token.

    With a random policy over 16 tokens and 6-token responses about a third of
    samples are correct, so GRPO groups have reward variance from the start.
    """

    vocab_size: int = 16
    prompt_len: int = 4

    def prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(FIRST_CONTENT, self.vocab_size, (n, self.prompt_len), generator=generator)

    def verify(self, prompts: torch.Tensor, responses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """1.0 where a valid response token equals the prompt's last token, else 0.0."""
        target = prompts[:, -1:].to(responses.device)
        hit = (responses == target) & mask.bool()
        return hit.any(dim=1).to(torch.float32)

    def context(self, prompts: torch.Tensor) -> torch.Tensor:
        """What the policy is conditioned on: the prompt itself."""
        return prompts
