"""TAR's bespoke checks: the mechanism run and the FPS's refusal of embeddings it cannot place.

Every other TAR contract is a generic kind declared in the spec (engine/kinds). A check calls the method only
through `impl` (so a mutant can stand in) and compares against `methods.tar.reference`.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.tar import mechanism
from methods.tar import reference as ref

F64 = torch.float64

# The message text these checks read, per check and function: each is declared in the spec's interface
# (raises: message_contains), and tests/test_interface.py holds every spec to that.
MESSAGE_READS = {
    "tar.fps_rejects_bad_vectors": {"farthest_point_prototypes": ["candidate 3", "norm 0", "not finite",
                                                                  "overflows"]},
}


def on(ctx, x: torch.Tensor, dtype=None) -> torch.Tensor:
    """x on the run's device, in `dtype` (default: its own)."""
    return x.to(ctx.device, dtype or x.dtype)


def raises(kind, fn) -> tuple[bool, str]:
    """(whether fn raised `kind`, the message); another exception type is not the documented rejection."""
    try:
        fn()
    except kind as e:
        return True, str(e)
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"
    return False, ""


def picks(impl, ctx, emb, correct, k, ids, dtype=None) -> list[int]:
    """The FPS's picks as a list of ints (embeddings in `dtype`, default the dtype under test)."""
    out = impl.farthest_point_prototypes(on(ctx, emb, dtype or ctx.dtype), on(ctx, correct), k=k,
                                         prompt_ids=None if ids is None else on(ctx, ids))
    return [int(i) for i in torch.as_tensor(out).cpu().tolist()]


@registry.check("tar.fps_rejects_bad_vectors")
def fps_rejects_bad_vectors(impl, ctx) -> dict:
    """A zero-norm, non-finite or norm-overflowing correct embedding raises ValueError naming the
    candidate; the same junk in an incorrect candidate is never read."""
    g = ctx.generator(130)
    D = 5
    emb = torch.randn(8, D, generator=g, dtype=F64)
    correct = torch.tensor([True, False, True, True, False, True, True, False])
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    dt = ctx.dtype

    def call(e, dtype=dt):
        return picks(impl, ctx, e, correct, 3, ids, dtype)

    def with_row(i, row):
        e = emb.clone()
        e[i] = row
        return e

    zero, msg = raises(ValueError, lambda: call(with_row(3, torch.zeros(D, dtype=F64))))
    names = "candidate 3" in msg
    nan_row = torch.randn(D, generator=g, dtype=F64)
    nan_row[2] = math.nan
    nan, msg_nan = raises(ValueError, lambda: call(with_row(5, nan_row)))
    inf_row = torch.randn(D, generator=g, dtype=F64)
    inf_row[0] = math.inf
    inf, msg_inf = raises(ValueError, lambda: call(with_row(2, inf_row)))
    # The candidate named is the first bad one in prompt order, not another: a valid row of small
    # norm (0.5) in an earlier prompt beside the zero row, and two bad rows, prompt 2's (index 6)
    # before prompt 1's (index 3) in no order but the prompts'.
    small = with_row(3, torch.zeros(D, dtype=F64))
    small[0] = small[0] / small[0].norm() * 0.5
    _, msg_small = raises(ValueError, lambda: call(small))
    two = with_row(3, torch.zeros(D, dtype=F64))
    two[6] = math.nan
    _, msg_two = raises(ValueError, lambda: call(two))
    first_bad = "candidate 3" in msg_small and "candidate 3" in msg_two and "norm 0" in msg_two
    # Norm overflow exists only for float64 inputs (float64 squares of fp32 values stay finite):
    # always built in float64.
    overflow, msg_over = raises(ValueError, lambda: call(with_row(6, torch.full((D,), 1e200, dtype=F64)), F64))
    clean = call(emb)
    junk = emb.clone()
    junk[1] = math.nan
    junk[4] = 0.0
    junk[7, 0] = math.inf
    try:
        ignored = call(junk) == clean
    except Exception:  # noqa: BLE001 - junk in incorrect rows must be ignored: any refusal of it is the miss measured
        ignored = False
    # Scale invariance at the top of the dtype's range (cosine ignores norms).
    top = min(torch.finfo(dt).max / 8 / math.sqrt(D), 1e150)
    scaled = emb / emb.abs().amax(1, keepdim=True) * top
    try:
        scale_ok = call(scaled) == ref.fps_bruteforce(scaled.to(dt).to(F64).tolist(), correct.tolist(), 3, ids.tolist())
    except Exception:  # noqa: BLE001 - large finite rows are valid input: any refusal of them is the miss measured
        scale_ok = False
    return {
        "rejects_zero_norm": zero,
        "rejects_nan": nan,
        "rejects_inf": inf,
        "rejects_norm_overflow": overflow,
        "message_names_candidate": names,
        "message_names_first_bad_candidate": first_bad,
        # each message says what is wrong with the row: a zero, a non-finite or an overflowing norm
        "message_names_the_fault": ("norm 0" in msg and "not finite" in msg_nan and "not finite" in msg_inf
                                    and "overflows" in msg_over),
        "ignores_junk_in_incorrect": ignored,
        "large_finite_values_accepted": scale_ok,
    }


# --- mechanism run -------------------------------------------------------------------


@registry.check("tar.mechanism_run")
def mechanism_run(impl, ctx) -> dict:
    """Real bank, real GRPO + KL + replay updates on a tiny GRU; see methods/tar/mechanism.py."""
    return mechanism.run(impl, ctx)
