"""Hugging Face causal-LM checkpoints as the mechanism runs' policy (`--policy hf:PATH`, the [hf] extra).

Registers no check: it only supplies a policy provider (engine/run/policy.py). The
engine imports every package under methods/, and the base install has no
transformers, so nothing here imports transformers or peft until `load` runs.
"""

from __future__ import annotations


def find(location: str):
    """The checkpoint folder at `location`, checked without importing torch or transformers."""
    from methods.hfpolicy.checkpoint import find_checkpoint

    return find_checkpoint(location)


def load(location: str, lora_rank: int | None = None):
    """A provider for the local checkpoint folder `location` (LoRA rank 8 unless given; 0 = full weights)."""
    from methods.hfpolicy.provider import HFPolicyProvider

    return HFPolicyProvider(find(location), lora_rank=8 if lora_rank is None else lora_rank)
