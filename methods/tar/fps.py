"""Cosine farthest-point sampling of bank prototypes, batched over prompts.

The bank keeps, per prompt, at most k of the base policy's verified-correct
samples, chosen by greedy farthest-point sampling under the cosine distance
d(i, j) = 1 - <e_i, e_j> / (|e_i| |e_j|):

* first point: the correct candidate with the lowest index in the prompt;
* next points: the correct, not yet chosen candidate whose smallest distance
  to the chosen ones is largest; ties go to the lowest index;
* min(k, number of correct candidates) points per prompt, none for a prompt
  without a correct candidate. Exact duplicates are not merged.

Everything is computed in float64 whatever the input dtype (the inputs are
small: candidates x dims), so the picks depend only on the values given.
The embeddings of correct candidates are validated: a non-finite entry, a zero
norm or a norm that overflows float64 is rejected with ValueError, never
sorted. Incorrect candidates are never read (like padding: junk is allowed).

Vectorised over prompts: one padded [prompts, slots, dims] tensor, one batched
Gram matrix, and a Python loop over the k picks only (never over prompts).
"""

from __future__ import annotations

import torch


def _as_bool_vector(correct: torch.Tensor, n: int, device) -> torch.Tensor:
    correct = torch.as_tensor(correct, device=device)
    if correct.shape != (n,):
        raise ValueError(f"correct must have shape ({n},), got {tuple(correct.shape)}")
    if correct.dtype != torch.bool:
        if correct.is_floating_point() or correct.is_complex():
            raise ValueError(f"correct must be bool or integer 0/1, got {correct.dtype}")
        if bool(((correct != 0) & (correct != 1)).any()):
            raise ValueError("correct must hold only 0 and 1")
        correct = correct.bool()
    return correct


def _reject_bad_rows(embeddings: torch.Tensor, candidates: torch.Tensor, norms: torch.Tensor) -> None:
    """Raise ValueError naming a candidate (the first in prompt order) whose embedding cannot be placed."""
    ok = torch.isfinite(norms) & (norms > 0)
    if bool(ok.all()):
        return
    i = int(candidates[(~ok).nonzero()[0, 0]])
    row = embeddings[i].detach()
    if not bool(torch.isfinite(row).all()):
        raise ValueError(f"embedding of candidate {i} is not finite; a NaN/inf vector cannot be placed by cosine distance")
    if not bool(torch.isfinite(torch.linalg.vector_norm(row.double()))):
        raise ValueError(f"embedding of candidate {i} has a norm that overflows float64; rescale the embeddings")
    raise ValueError(
        f"embedding of candidate {i} has norm 0 in float64 (a zero vector, or one that underflows); "
        "its cosine distance is undefined"
    )


@torch.no_grad()
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
    if embeddings.dim() != 2 or not torch.is_floating_point(embeddings):
        raise ValueError(f"embeddings must be a floating [candidates, dims] tensor, got {embeddings.dtype} {tuple(embeddings.shape)}")
    if isinstance(k, bool) or int(k) != k or k < 0:
        raise ValueError(f"k must be a non-negative integer, got {k!r}")
    k = int(k)
    device = embeddings.device
    N = embeddings.shape[0]
    correct = _as_bool_vector(correct, N, device)
    if prompt_ids is not None:
        prompt_ids = torch.as_tensor(prompt_ids, device=device)
        if prompt_ids.shape != (N,) or prompt_ids.is_floating_point() or prompt_ids.is_complex() or prompt_ids.dtype == torch.bool:
            raise ValueError(f"prompt_ids must be an integer tensor of shape ({N},), got {prompt_ids.dtype} {tuple(prompt_ids.shape)}")
    cand = correct.nonzero().flatten()  # correct candidates, ascending index
    Nc = cand.numel()
    if Nc == 0 or k == 0:
        return torch.empty(0, dtype=torch.long, device=device)

    # Group the correct candidates by prompt; a stable sort keeps index order inside a prompt.
    if prompt_ids is None:
        group = torch.zeros(Nc, dtype=torch.long, device=device)
    else:
        pid = prompt_ids[cand]
        if Nc > 1 and not bool((pid[1:] >= pid[:-1]).all()):
            pid, order = torch.sort(pid, stable=True)
            cand = cand[order]
        new = torch.ones(Nc, dtype=torch.bool, device=device)
        new[1:] = pid[1:] != pid[:-1]
        group = torch.cumsum(new, 0) - 1
    G = int(group[-1]) + 1
    counts = torch.bincount(group, minlength=G)
    slot = torch.arange(Nc, device=device) - (torch.cumsum(counts, 0) - counts)[group]
    M = int(counts.max())

    # Padded [prompts, slots, dims] in float64 (padding rows are zero and never choosable);
    # one batched Gram matrix serves every pick, and its diagonal gives the squared norms.
    D = embeddings.shape[1]
    flat = group * M + slot
    X = embeddings.new_zeros((G * M, D))
    X.index_copy_(0, flat, embeddings.detach().index_select(0, cand))
    X = X.view(G, M, D).to(torch.float64)
    gram = torch.bmm(X, X.transpose(1, 2))
    norm = torch.diagonal(gram, dim1=1, dim2=2).sqrt()
    _reject_bad_rows(embeddings, cand, norm.reshape(-1)[flat])
    norm = torch.where(norm == 0, torch.ones_like(norm), norm)  # padding only: real rows were checked above
    position = torch.full((G, M), -1, dtype=torch.long, device=device)
    position[group, slot] = cand

    inf = float("inf")
    # score: smallest cosine distance to the chosen set (inf before the first pick); -inf: not choosable.
    score = torch.full((G, M), -inf, dtype=torch.float64, device=device)
    score[group, slot] = inf
    g_rows = torch.arange(G, device=device)
    picks = []
    for step in range(min(k, M)):
        # argmax returns the first maximum: the lowest slot, i.e. the lowest candidate index.
        pick = torch.argmax(score, dim=1)
        live = counts > step
        picks.append(torch.where(live, position[g_rows, pick], torch.full_like(pick, -1)))
        cos = gram[g_rows, :, pick] / (norm * norm[g_rows, pick][:, None])
        score = torch.minimum(score, 1.0 - cos)
        score[g_rows, pick] = -inf
    out = torch.stack(picks, dim=1).reshape(-1)
    return out[out >= 0]
