"""Fast-path contract: the batched FPS (what the bank uses) against the plain per-prompt loop.

`farthest_point_prototypes` runs every prompt at once (segment max over dense prompt ranks,
float64 work a block of rows at a time) and has branches the small synthetic cases of
`fps_max_min_reference` never take: prompt ids spread over a wide range (ranks from
torch.unique instead of bincount) and more correct candidates than one float64 block holds
(several blocks per pick). Both paths are driven on the same inputs, chosen so that every
branch runs, and must pick the same candidates in the same order; the `*_cases` counts
prove each branch was reached.
"""

from __future__ import annotations

# Check code, not a mutation target of `contracts mutate`: a contract check (inputs and a comparison
# with the reference loop), like checks.py; the FPS it drives (fps.py) is mutated.
__mutate__ = False

import torch

from engine.spec import registry
from methods.tar import fps as fps_module
from methods.tar import reference as ref
from methods.tar.checks import F64, _fps, _int, _rounded, fps_case


def _wide_ids(g: torch.Generator):
    """3-6 prompts, each with a correct candidate, ids far apart (span > 4 N + 4096: the
    torch.unique branch), interleaved."""
    prompts = _int(g, 3, 6)
    sizes = [_int(g, 2, 6) for _ in range(prompts)]
    rank = torch.repeat_interleave(torch.arange(prompts), torch.tensor(sizes))
    n = int(rank.numel())
    correct = torch.rand(n, generator=g) < 0.6
    firsts = torch.cumsum(torch.tensor([0] + sizes[:-1]), 0)
    correct[firsts] = True
    spread = torch.randperm(2_000_001, generator=g)[:prompts] - 1_000_000
    dims = _int(g, 2, 12)
    emb = torch.randn(n, dims, generator=g, dtype=F64) * torch.exp(torch.randn(n, 1, generator=g, dtype=F64))
    perm = torch.randperm(n, generator=g)
    return emb[perm], correct[perm], spread[rank][perm]


def _many_rows(g: torch.Generator, dims: int):
    """Enough correct candidates that the float64 work takes more than one block of rows."""
    rows_per_block = fps_module._BLOCK_BYTES // (8 * dims)
    prompts = _int(g, 12, 20)
    n = rows_per_block + _int(g, rows_per_block // 4, rows_per_block // 2)
    ids = torch.randint(0, prompts, (n,), generator=g) * 7 - 30
    emb = torch.randn(n, dims, generator=g, dtype=F64) * torch.exp(torch.randn(n, 1, generator=g, dtype=F64))
    correct = torch.rand(n, generator=g) < 0.95
    return emb, correct, ids


def _blocks(correct: torch.Tensor, dims: int) -> int:
    """How many float64 blocks the batched FPS splits the correct rows into (its own rule)."""
    nc = int(correct.sum())
    return -(-nc * 8 * max(1, dims) // fps_module._BLOCK_BYTES) if nc else 0


@registry.check("tar.fps_batched_matches_loop")
def fps_batched_matches_loop(impl, ctx) -> dict:
    """impl.farthest_point_prototypes against the per-prompt loop on inputs taking every branch."""
    g = ctx.generator(130)
    k = int(ctx.params.get("k", 3))
    dims = int(ctx.params.get("dims", 64))
    mismatches = 0
    counts = {"cases": 0, "wide_id_cases": 0, "multi_block_cases": 0, "single_prompt_cases": 0, "k_above_count_cases": 0}
    for case in range(ctx.cases):
        inputs = [
            ("wide_id_cases", *_wide_ids(g), k),
            ("multi_block_cases", *_many_rows(g, dims), k),
            ("single_prompt_cases", *fps_case(g, dup_p=0.3)[:2], None, k),
            ("k_above_count_cases", *fps_case(g), 9),
        ]
        for label, emb, correct, ids, kk in inputs:
            e_r = _rounded(emb, ctx.dtype)
            picks = _fps(impl, ctx, emb, correct, kk, ids)
            want = ref.fps_per_prompt_loop(e_r, correct, kk, ids).tolist()
            mismatches += int(picks != want)
            counts["cases"] += 1
            if label == "wide_id_cases":
                n = int(ids.numel())
                counts[label] += int(int(ids.max() - ids.min()) + 1 > 4 * n + 4096)
            elif label == "multi_block_cases":
                counts[label] += int(_blocks(correct, emb.shape[1]) > 1)
            elif label == "k_above_count_cases":
                per = torch.bincount((ids - ids.min())[correct]) if bool(correct.any()) else torch.zeros(1)
                counts[label] += int(bool(correct.any()) and int(per.max()) < kk)
            else:
                counts[label] += 1
    return {"mismatches": mismatches, **counts}
