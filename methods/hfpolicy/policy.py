"""A causal LM wearing the tiny policies' interface.

`forward(tokens, state)` takes task token ids [B, L] and returns task-vocabulary
logits [B, L, V], the last layer's hidden states [B, L, H] and the KV cache as
`state`, like TinyGRUPolicy, so `sample`, `sequence_logprobs` and every
mechanism run work on it unchanged. The distribution is the model's own
next-token distribution restricted to the task's V tokens (a softmax over
their logits): the mechanisms' verifiers, reserved tokens and full-distribution
quantities are defined over the task vocabulary.
"""

from __future__ import annotations

import torch
from torch import nn

from methods.common.tasks import PAD


class HFPolicy(nn.Module):
    def __init__(self, model: nn.Module, token_ids: list[int], prefix_ids: list[int], cache_arg: str = "cache"):
        super().__init__()
        self.model = model
        self.vocab_size = len(token_ids)
        self.cache_arg = cache_arg  # "cache" in transformers 5, "past_key_values" before
        # Buffers are not persistent: state_dict() stays the model's own weights.
        self.register_buffer("token_ids", torch.tensor(token_ids, dtype=torch.long), persistent=False)
        self.register_buffer("prefix_ids", torch.tensor(prefix_ids, dtype=torch.long), persistent=False)
        # Same role as TinyGRUPolicy.pad_bias: PAD (and any token a method reserves) is never sampled,
        # while every log-prob stays finite.
        pad_bias = torch.zeros(self.vocab_size)
        pad_bias[PAD] = -1.0e4
        self.register_buffer("pad_bias", pad_bias, persistent=False)

    def forward(self, tokens: torch.Tensor, state=None):
        ids = self.token_ids[tokens]
        k = 0
        if state is None and self.prefix_ids.numel():
            # A fresh sequence starts with the task's instruction; its positions are cut from the outputs
            # so callers see exactly the positions they passed.
            k = self.prefix_ids.numel()
            ids = torch.cat([self.prefix_ids.expand(ids.shape[0], -1), ids], dim=1)
        out = self.model(input_ids=ids, use_cache=True, output_hidden_states=True, **{self.cache_arg: state})
        logits = out.logits[:, k:].index_select(-1, self.token_ids).float() + self.pad_bias
        hidden = out.hidden_states[-1][:, k:]
        cache = getattr(out, "cache", None)
        if cache is None:
            cache = getattr(out, "past_key_values", None)
        return logits, hidden, cache
