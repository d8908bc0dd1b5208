"""TAR's bespoke check: the mechanism run.

Every other TAR contract is a generic kind declared in the spec (engine/kinds). A check calls the method only
through `impl` (so a mutant can stand in).
"""

from __future__ import annotations

import torch

from engine.spec import registry
from methods.tar import mechanism

F64 = torch.float64

# --- mechanism run -------------------------------------------------------------------


@registry.check("tar.mechanism_run")
def mechanism_run(impl, ctx) -> dict:
    """Real bank, real GRPO + KL + replay updates on a tiny GRU; see methods/tar/mechanism.py."""
    return mechanism.run(impl, ctx)
