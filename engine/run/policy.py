"""`--policy`: what the mechanism runs train instead of the methods' tiny policies.

`hf:PATH` is a local Hugging Face causal-LM checkpoint (methods/hfpolicy, the
optional `[hf]` extra). A policy provider is any object with

    build(seed=, device=, vocab_size=, hidden_size=) -> torch.nn.Module
        a fresh policy speaking the tiny policies' interface
        (methods/common/policy.py: `forward(tokens, state) -> logits, hidden, state`);
    subjects() -> list of in-toto subjects the receipt must bind (its code, its weights);
    describe() -> a JSON-able dict for the receipt (no absolute paths).

Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

import importlib
import re

from engine.errors import UsageError

# scheme -> module with `find(location)` (a cheap check: no torch, no loading) and
# `load(location, **options)` (returns a provider)
SCHEMES = {"hf": "methods.hfpolicy"}
_SCHEME_RE = re.compile(r"^([a-z][a-z0-9]*):(.*)$", re.S)


def parse_policy(text: str) -> tuple[str, str]:
    """`hf:PATH` -> ("hf", "PATH"); anything else is a usage error naming the valid forms."""
    m = _SCHEME_RE.match(text or "")
    if not m or m.group(1) not in SCHEMES or not m.group(2).strip():
        forms = ", ".join(f"{s}:PATH" for s in SCHEMES)
        raise UsageError(f"--policy {text!r} is not a policy; use {forms} (a local checkpoint folder), "
                         "or leave --policy out for the methods' tiny policies")
    return m.group(1), m.group(2).strip()


def check_policy(text: str) -> None:
    """Refuse an unusable `--policy` early (a missing folder, a hub id), before torch is imported."""
    scheme, location = parse_policy(text)
    importlib.import_module(SCHEMES[scheme]).find(location)


def load_policy(text: str, lora_rank: int | None = None):
    """The provider for `--policy TEXT` (loads the checkpoint: seconds to minutes)."""
    scheme, location = parse_policy(text)
    module = importlib.import_module(SCHEMES[scheme])
    return module.load(location, lora_rank=lora_rank)
