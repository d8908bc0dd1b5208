"""TAR's sample inputs that YAML cannot say: FPS candidates grouped by prompt (ragged groups, arbitrary ids,
scaled copies) and the batched FPS's branch-taking cases. Everything else is declared in the spec."""

from __future__ import annotations

import torch

from engine.kinds.inputs import generator
from methods.tar.reference import BLOCK_BYTES

# Input generation, not a mutation target of `contracts mutate`: it only draws what the contracts feed the method.
__mutate__ = False

F64 = torch.float64


def _int(g: torch.Generator, lo: int, hi: int) -> int:
    """Uniform integer in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def fps_case(g: torch.Generator, *, dup_p: float = 0.0):
    """Interleaved prompts with arbitrary (unsorted, negative) ids and varied norms; some prompts have no
    correct candidate, some fewer than k; with dup_p, scaled copies of earlier candidates (ties up to rounding)."""
    ids, correct = [], []
    for p in range(_int(g, 1, 6)):
        mode = _int(g, 0, 3)  # 0: none correct, 1: all correct, else random
        for _ in range(_int(g, 0, 9)):
            ids.append(p)
            correct.append(False if mode == 0 else True if mode == 1 else bool(torch.rand(1, generator=g) < 0.5))
    if not ids:
        ids, correct = [0], [False]
    N, D = len(ids), _int(g, 2, 12)
    emb = torch.randn(N, D, generator=g, dtype=F64) * torch.exp(torch.randn(N, 1, generator=g, dtype=F64) * 1.5)
    for i in range(1, N if dup_p > 0 else 0):
        if bool(torch.rand(1, generator=g) < dup_p):
            emb[i] = emb[_int(g, 0, i - 1)] * float(torch.rand(1, generator=g) * 3 + 0.1)
    id_map = torch.randperm(50, generator=g)[: max(ids) + 1] - 10
    perm = torch.randperm(N, generator=g)
    return emb[perm], torch.tensor(correct)[perm], id_map[torch.tensor(ids)][perm]


@generator("tar.fps_candidates")
def fps_candidates(g, case, ctx, inputs) -> dict:
    """options: k, dup_p (scaled copies in odd cases), no_ids_every (every n-th case passes prompt_ids=None)."""
    opt = inputs.get("options") or {}
    emb, correct, ids = fps_case(g, dup_p=float(opt.get("dup_p", 0.0)) if case % 2 else 0.0)
    every = int(opt.get("no_ids_every", 0))
    no_ids = bool(every) and case % every == every - 1
    return {"embeddings": emb, "correct": correct, "prompt_ids": None if no_ids else ids, "k": int(opt.get("k", 3)),
            "__dims__": {"N": emb.shape[0], "D": emb.shape[1]}}


def _wide_ids(g: torch.Generator):
    """3-6 prompts, each with a correct candidate, ids far apart (span > 4 N + 4096: the torch.unique branch)."""
    prompts = _int(g, 3, 6)
    sizes = [_int(g, 2, 6) for _ in range(prompts)]
    rank = torch.repeat_interleave(torch.arange(prompts), torch.tensor(sizes))
    n = int(rank.numel())
    correct = torch.rand(n, generator=g) < 0.6
    correct[torch.cumsum(torch.tensor([0] + sizes[:-1]), 0)] = True
    spread = torch.randperm(2_000_001, generator=g)[:prompts] - 1_000_000
    dims = _int(g, 2, 12)
    emb = torch.randn(n, dims, generator=g, dtype=F64) * torch.exp(torch.randn(n, 1, generator=g, dtype=F64))
    perm = torch.randperm(n, generator=g)
    return emb[perm], correct[perm], spread[rank][perm]


def _many_rows(g: torch.Generator, dims: int):
    """Enough correct candidates that the float64 work takes more than one block of rows."""
    rows_per_block = BLOCK_BYTES // (8 * dims)
    prompts = _int(g, 12, 20)
    n = rows_per_block + _int(g, rows_per_block // 4, rows_per_block // 2)
    ids = torch.randint(0, prompts, (n,), generator=g) * 7 - 30
    emb = torch.randn(n, dims, generator=g, dtype=F64) * torch.exp(torch.randn(n, 1, generator=g, dtype=F64))
    return emb, torch.rand(n, generator=g) < 0.95, ids


@generator("tar.fps_branches")
def fps_branches(g, case, ctx, inputs) -> dict:
    """Case % 4: wide-range prompt ids, several float64 blocks, one prompt without ids (scaled copies), k = 9
    above every prompt's correct count. options: k, dims (of the multi-block case)."""
    opt = inputs.get("options") or {}
    k = int(opt.get("k", 3))
    branch = case % 4
    if branch == 0:
        emb, correct, ids = _wide_ids(g)
    elif branch == 1:
        emb, correct, ids = _many_rows(g, int(opt.get("dims", 64)))
    elif branch == 2:
        emb, correct, _ = fps_case(g, dup_p=0.3)
        ids = None
    else:
        (emb, correct, ids), k = fps_case(g), 9
    return {"embeddings": emb, "correct": correct, "prompt_ids": ids, "k": k,
            "__dims__": {"N": emb.shape[0], "D": emb.shape[1]}}


@generator("tar.encoder_batch")
def encoder_batch(g, case, ctx, inputs) -> dict:
    """A seeded frozen base (the mechanism run's tiny GRU) and candidates for trajectory_embeddings: options
    candidates (default 4), prompt_len (default 3), response_len (default 5); responses of every length from empty
    to full, PAD after them, the mask True at response tokens."""
    from methods.common.policy import TinyGRUPolicy
    from methods.common.tasks import PAD

    opt = inputs.get("options") or {}
    device = ctx.device if ctx is not None else torch.device("cpu")
    seed = ctx.seed if ctx is not None else 0
    base = TinyGRUPolicy.seeded(seed, device).requires_grad_(False).eval()
    N, P, T = int(opt.get("candidates", 4)), int(opt.get("prompt_len", 3)), int(opt.get("response_len", 5))
    prompts = torch.randint(2, 16, (N, P), generator=g)
    lengths = torch.randint(0, T + 1, (N,), generator=g)
    lengths[0], lengths[-1] = 0, T  # an empty response and a full one
    mask = torch.arange(T)[None, :] < lengths[:, None]
    responses = torch.where(mask, torch.randint(2, 16, (N, T), generator=g), torch.full((N, T), PAD))
    return {"base": base, "prompts": prompts.to(device), "responses": responses.to(device), "mask": mask.to(device)}
