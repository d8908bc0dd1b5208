"""Cosine farthest-point sampling of bank prototypes, batched over prompts.

The bank keeps, per prompt, at most k of the base policy's verified-correct
samples, chosen by greedy farthest-point sampling under the cosine distance
d(i, j) = 1 - <e_i, e_j> / (|e_i| |e_j|):

* first point: the correct candidate with the lowest index in the prompt;
* next points: the correct, not yet chosen candidate whose smallest distance
  to the chosen ones is largest; ties go to the lowest index, where a tie is a
  distance within TIE_TOL (1e-12) of the largest: exact duplicates (scaled copies
  included) then tie whatever the last bit of float64 rounding says, so the rule
  picks, not the rounding of 1 - cos;
* min(k, number of correct candidates) points per prompt, none for a prompt
  without a correct candidate. Exact duplicates are not merged.

Everything is computed in float64 whatever the input dtype (the inputs are
small: candidates x dims), so the picks depend only on the values given.
The embeddings of correct candidates are validated: a non-finite entry, a zero
norm or a norm that overflows float64 is rejected with ValueError, never
sorted. Incorrect candidates are never read (like padding: junk is allowed).

Vectorised over prompts without padding or sorting: the correct candidates
stay in index order with their prompt's rank, each pick takes a segment max
(scatter_reduce) and each new point costs one gathered row-wise dot product;
a Python loop runs over the k picks only (never over prompts).
"""

from __future__ import annotations

import torch

from methods.common.errors import DtypeError
from methods.common.masking import as_bool_mask

# Float64 bytes of one block of rows. The float64 work is done a block at a time, so no
# [candidates, dims] float64 tensor ever exists: with one (4 MB at 512 x 32 x 64) glibc handed
# the freed heap top back to the OS after each call in about half of the benchmark processes,
# and faulting those pages back in on the next call cost more than all the arithmetic here
# (1.5 MB blocks already did the same).
_BLOCK_BYTES = 1 << 20

# Two max-min distances this close are a tie (lowest index wins). Cosine distances of exact
# duplicates, or of scaled copies, differ by float64 rounding (about 1e-16), not by 0, and without
# a tolerance that rounding, not the declared rule, chose between them.
TIE_TOL = 1e-12


def _as_bool_vector(correct: torch.Tensor, n: int, device) -> torch.Tensor:
    correct = torch.as_tensor(correct, device=device)
    if correct.shape != (n,):
        raise ValueError(f"correct must have shape ({n},), got {tuple(correct.shape)}")
    return as_bool_mask(correct, "correct")


def _reject_bad_rows(embeddings: torch.Tensor, candidates: torch.Tensor, norms: torch.Tensor, group: torch.Tensor) -> None:
    """Raise ValueError naming a candidate (the first in prompt order) whose embedding cannot be placed.

    candidates ascend; group holds their dense prompt ranks, so the first bad row in
    prompt order is the lowest group rank among the bad ones, then the lowest index.
    """
    lo, hi = torch.aminmax(norms)  # one pass; a NaN norm makes both NaN and fails both tests
    if float(lo) > 0 and float(hi) < float("inf"):
        return
    bad = (~(torch.isfinite(norms) & (norms > 0))).nonzero().flatten()
    i = int(candidates[bad[torch.argmin(group[bad])]])  # argmin keeps the first (lowest index) of equal ranks
    row = embeddings[i].detach()
    if not bool(torch.isfinite(row).all()):
        raise ValueError(f"embedding of candidate {i} is not finite; a NaN/inf vector cannot be placed by cosine distance")
    if not bool(torch.isfinite(torch.linalg.vector_norm(row.double()))):
        raise ValueError(f"embedding of candidate {i} has a norm that overflows float64; rescale the embeddings")
    raise ValueError(
        f"embedding of candidate {i} has norm 0 in float64 (a zero vector, or one that underflows); "
        "its cosine distance is undefined"
    )


def _dense_prompt_ranks(pid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rank of each id among the distinct ids in ascending order, count per rank), without sorting.

    Ids within a small range are counted with bincount (a torch.sort of 8k ids costs
    about as much as the whole FPS on a CPU); a wide range falls back to torch.unique.
    """
    pid = pid.long()  # narrow ids would overflow when shifted
    lo, hi = (int(v) for v in torch.aminmax(pid))
    span = hi - lo + 1
    if span > 4 * pid.numel() + 4096:
        _, rank, counts = torch.unique(pid, return_inverse=True, return_counts=True)
        return rank, counts
    shifted = pid - lo
    per_id = torch.bincount(shifted, minlength=span)
    present = per_id > 0
    rank = torch.cumsum(present, 0).sub_(1).index_select(0, shifted)
    return rank, per_id[present]


def farthest_point_prototypes(
    embeddings: torch.Tensor,
    correct: torch.Tensor,
    k: int = 3,
    prompt_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Indices (into the N candidates) of at most k cosine-FPS prototypes per prompt.

    embeddings: [N, D] floating point; correct: [N] bool (the verifier's
    marks); prompt_ids: [N] integer ids (None: one prompt). Returns a 1-D
    LongTensor on the embeddings' device, grouped by ascending prompt id and,
    within a prompt, in pick order.
    """
    return _segment_fps(embeddings, correct, k, prompt_ids, TIE_TOL)


@torch.no_grad()
def _segment_fps(embeddings, correct, k, prompt_ids, tie_tol: float) -> torch.Tensor:
    """farthest_point_prototypes with the tie tolerance as a parameter (a mutant sets it to 0)."""
    if not torch.is_floating_point(embeddings):
        raise DtypeError(f"embeddings must be floating point, got {embeddings.dtype}")
    if embeddings.dim() != 2:
        raise ValueError(f"embeddings must be a floating [candidates, dims] tensor, got {embeddings.dtype} {tuple(embeddings.shape)}")
    if isinstance(k, bool) or int(k) != k or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    k = int(k)
    device = embeddings.device
    N = embeddings.shape[0]
    correct = _as_bool_vector(correct, N, device)
    if prompt_ids is not None:
        prompt_ids = torch.as_tensor(prompt_ids, device=device)
        if prompt_ids.is_floating_point() or prompt_ids.is_complex() or prompt_ids.dtype == torch.bool:
            raise DtypeError(f"prompt_ids must be integer ids, got {prompt_ids.dtype}")
        if prompt_ids.shape != (N,):
            raise ValueError(f"prompt_ids must be an integer tensor of shape ({N},), got {prompt_ids.dtype} {tuple(prompt_ids.shape)}")
    cand = correct.nonzero().flatten()  # correct candidates, ascending index
    Nc = cand.numel()
    if Nc == 0 or k == 0:
        return torch.empty(0, dtype=torch.long, device=device)

    # group: each correct candidate's prompt rank (ascending id); candidates stay in index order.
    if prompt_ids is None:
        group = torch.zeros(Nc, dtype=torch.long, device=device)
        counts = torch.full((1,), Nc, dtype=torch.long, device=device)
    else:
        group, counts = _dense_prompt_ranks(prompt_ids.index_select(0, cand))
    G = counts.numel()
    steps = min(k, int(counts.max()))

    # Only the correct rows, kept in the input dtype. Every product and sum below is float64:
    # the blocks are cast as they are read (float32 and narrower values convert exactly).
    rows = embeddings.detach().index_select(0, cand)
    size = -(-Nc // -(-Nc * 8 * max(1, rows.shape[1]) // _BLOCK_BYTES))  # equal blocks, no sliver at the end
    spans = [(lo, lo + size) for lo in range(0, Nc, size)]
    norm = torch.empty(Nc, dtype=torch.float64, device=device)
    for lo, hi in spans:
        torch.linalg.vector_norm(rows[lo:hi], dim=1, dtype=torch.float64, out=norm[lo:hi])
    _reject_bad_rows(embeddings, cand, norm, group)

    # Segment form: per pick, the [G, D] picked unit rows are gathered to the candidates of their
    # prompt and dotted row by row: k-1 passes over [Nc, D] instead of a [G, M, M] Gram, and no
    # padding. Per-prompt argmax: segment max, then the lowest position within TIE_TOL of it (ties go
    # to the lowest index, as in the loop reference).
    inf = float("inf")
    pos = torch.arange(Nc, device=device)
    pick = torch.empty(G, dtype=torch.long, device=device).scatter_reduce_(0, group, pos, "amin", include_self=False)
    picks = []
    score = None  # smallest cosine distance to the chosen set; -inf once chosen
    for step in range(steps):
        if step:
            best = torch.empty(G, dtype=torch.float64, device=device).scatter_reduce_(0, group, score, "amax", include_self=False)
            at_best = torch.where(score >= best.sub_(tie_tol).index_select(0, group), pos, Nc)
            pick = torch.empty(G, dtype=torch.long, device=device).scatter_reduce_(0, group, at_best, "amin", include_self=False)
        picks.append(pick)
        if step + 1 == steps:
            break
        # minus the unit pick rows: the dots come out negated (exactly), so 1 - cos is one add
        unit = rows.index_select(0, pick).to(torch.float64).div_(norm.index_select(0, pick).neg_()[:, None])
        dist = torch.empty(Nc, dtype=torch.float64, device=device)
        for lo, hi in spans:
            torch.sum(unit.index_select(0, group[lo:hi]).mul_(rows[lo:hi]), 1, out=dist[lo:hi])
        dist.div_(norm).add_(1.0)  # 1 - cos, rounded as the loop rounds it
        score = dist if score is None else torch.minimum(score, dist, out=score)
        score.index_fill_(0, pick, -inf)  # a prompt with every candidate chosen re-picks one: filtered below
    live = torch.arange(steps, device=device) < counts[:, None]
    return cand.index_select(0, torch.stack(picks, 1)[live])
