"""MRTPO: token-level credit for several rewards from a frozen replay (arXiv 2610.21439 v1).

q_k,t   = sqrt( JS(p_all,t || p_loo_k,t) / ln 2 )            (full vocabulary)
w_k,t   = (1 - beta) + beta * q_k,t / qbar_k                  (qbar_k: mean over valid t)
S_t     = sum_k A_k w_k,t
U       = sum_k A_k,  D_t = S_t - U
s       = min(1, sqrt( sum_j T_j U_j^2 / sum_{j,t} D_j,t^2 ))  (Appendix D, over the batch)
A_t     = (U + s D_t) / (std over the batch's valid tokens + eps)

Everything here is vectorised: no Python loop runs over tokens or vocabulary
entries. `js_distance` loops over blocks of rows (and of columns when one
row alone is larger than a block) so the temporaries it makes have a fixed
size, whatever K, B, T or V are. Masks select with `torch.where`, never
multiply, so NaN or +/-1e4 junk in masked slots changes nothing.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from methods.common.masking import as_bool_mask

LN2 = math.log(2.0)

# Elements per block of js_distance's scratch (four compute-dtype buffers and
# two bool masks of this size: about 18 MiB in float32 at the default).
DEFAULT_CHUNK_ELEMS = 1 << 20
# Elements per context in one block of credit_weights_from_logits (16 MiB of float32): big enough
# that each operation's fixed cost is small against its work, small enough that the four held at once stay
# far below one [B*T, V] tensor at real shapes.
LOGITS_BLOCK_ELEMS = 1 << 22
# Inputs are cut into at least _MIN_BLOCKS blocks, so the scratch (about 4.5
# block-sized float32 buffers) stays below one [N, V] float32 buffer, unless
# a block would fall under _MIN_BLOCK elements: inputs under 1M elements are
# done in blocks of 64k elements (about 1.2 MB of scratch) or in one piece.
_MIN_BLOCKS = 16
_MIN_BLOCK = 1 << 16
# Past |x| = 40, exp(-2x) < 2e-35 and h(x) equals 2 ln 2 in float32 and float64;
# clamping keeps x * exp(-2x) finite when one probability is exactly zero.
_X_CLAMP = 40.0


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16/bfloat16 are computed (and returned) in float32; float32/float64 as they are."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _row_views(x: torch.Tensor) -> list[torch.Tensor]:
    """2-D views [rows, V] covering all leading positions in order, without copying."""
    V = x.shape[-1]
    try:
        return [x.view(-1, V)]
    except RuntimeError:  # not viewable as one block of rows: split on the first axis
        out: list[torch.Tensor] = []
        for i in range(x.shape[0]):
            out.extend(_row_views(x[i]))
        return out


class _Workspace:
    """Block-sized scratch buffers, allocated once per js_distance call and reused.

    Reusing them keeps the peak fixed (four compute-dtype buffers and two bool
    masks of one block, plus two upcast copies for float16/bfloat16 inputs)
    and avoids paying for a fresh allocation per block.
    """

    def __init__(self, block: int, cdt: torch.dtype, device, upcast: bool):
        def buf(dtype=cdt):
            return torch.empty(block, dtype=dtype, device=device)

        self.x, self.t, self.e, self.m = buf(), buf(), buf(), buf()
        self.same, self.small = buf(torch.bool), buf(torch.bool)
        self.la = buf() if upcast else None
        self.lb = buf() if upcast else None

    def view(self, name: str, rows: int, cols: int) -> torch.Tensor:
        return getattr(self, name)[: rows * cols].view(rows, cols)


def _block_terms(la: torch.Tensor, lb: torch.Tensor, ws: _Workspace) -> torch.Tensor:
    """Per-element 0.5 * (p ln(2p/(p+q)) + q ln(2q/(p+q))) from log-probabilities, every term >= 0.

    With m = (p + q)/2 and x = (ln p - ln q)/2 the element is m * h(x) / 2 where
    h(x) = 2x tanh x + log1p(-tanh^2 x) = 2x tanh x - 2 ln cosh x >= 0, an even function.
    It is evaluated in two branches, each free of cancellation where it is used:
      |x| <  1: 2x tanh x + log1p(-tanh^2 x)          (both O(x^2), ratio 2 : -1)
      |x| >= 1: 2 ln 2 - 2 log1p(e^-2x) - 4x sigmoid(-2x)
    h(+-inf) = 2 ln 2 (one probability zero); both zero gives 0.
    Returns a view of a workspace buffer, valid until the next block.
    """
    r, c = la.shape
    x, t, e, m = (ws.view(k, r, c) for k in ("x", "t", "e", "m"))
    same, small = ws.view("same", r, c), ws.view("small", r, c)
    torch.eq(la, lb, out=same)  # also catches -inf == -inf, whose difference would be NaN
    torch.sub(la, lb, out=x)
    x.masked_fill_(same, 0.0)
    x.abs_().mul_(0.5).clamp_(max=_X_CLAMP)
    torch.lt(x, 1.0, out=small)
    # small branch into t
    torch.tanh(x, out=t)
    torch.mul(t, t, out=e)
    e.neg_().log1p_()
    t.mul_(x).mul_(2.0).add_(e)
    # large branch into e (m is scratch for log1p(e^-2x))
    torch.mul(x, -2.0, out=m)
    m.exp_().log1p_()
    torch.mul(x, -2.0, out=e)
    e.sigmoid_().mul_(x).mul_(-4.0).sub_(m, alpha=2.0).add_(2.0 * LN2)
    torch.where(small, t, e, out=x)  # h
    # m = (p + q) / 2 = exp(logaddexp(la, lb) - ln 2); 0 where both are zero
    torch.logaddexp(la, lb, out=m)
    m.sub_(LN2).exp_()
    return m.mul_(x).mul_(0.5)


def js_block_shape(n: int, V: int, chunk_elems: int = DEFAULT_CHUNK_ELEMS) -> tuple[int, int]:
    """(rows, columns) of js_distance's blocks for n rows of V entries.

    columns < V means each row is cut into column blocks (few rows, large
    vocabulary); columns == V means whole rows, rows of them per block.
    chunk_elems >= 1 (js_distance refuses less).
    """
    block = min(int(chunk_elems), max(_MIN_BLOCK, -(-n * V // _MIN_BLOCKS)))
    return max(1, block // V), min(V, block)


def _js_blocks(logp_a: torch.Tensor, logp_b: torch.Tensor, rows_per_block: int, cols_per_block: int,
               cdt: torch.dtype):
    """js_distance's blocks in order, each as (first row, end row, la, lb, scratch): rows over the
    flattened leading positions, la/lb the blocks in `cdt` (copied into the one reused scratch only where an
    input is in another dtype), for _block_terms(la, lb, scratch)."""
    V = logp_a.shape[-1]
    upcast_a, upcast_b = logp_a.dtype != cdt, logp_b.dtype != cdt
    ws = _Workspace(rows_per_block * cols_per_block, cdt, logp_a.device, upcast_a or upcast_b)
    row0 = 0
    for va, vb in zip(_row_views(logp_a), _row_views(logp_b)):
        for r in range(0, va.shape[0], rows_per_block):
            r1 = min(r + rows_per_block, va.shape[0])
            for c in range(0, V, cols_per_block):
                c1 = min(c + cols_per_block, V)
                la, lb = va[r:r1, c:c1], vb[r:r1, c:c1]
                if upcast_a:
                    la = ws.view("la", r1 - r, c1 - c).copy_(la)
                if upcast_b:
                    lb = ws.view("lb", r1 - r, c1 - c).copy_(lb)
                yield row0 + r, row0 + r1, la, lb, ws
        row0 += va.shape[0]


def js_distance(
    logp_a: torch.Tensor,
    logp_b: torch.Tensor,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
) -> torch.Tensor:
    """sqrt(JS(p_a || p_b) / ln 2) over the last axis (the whole vocabulary), in [0, 1].

    logp_a, logp_b: log-probabilities of the same shape [..., V]; -inf (a zero
    probability) is allowed. Returns [...] in float64 for float64 inputs, else
    float32. Symmetric; exactly 0 for identical inputs; never negative under the
    square root (every summed term is >= 0; the ratio is clamped to [0, 1]
    against rounding); NaN only where an input row holds NaN. Not
    differentiable: inputs that require grad are refused (the replay is frozen).

    Memory: the work is done one block at a time (rows, or columns of one row
    when V alone exceeds the block) in reused scratch buffers of at most
    `chunk_elems` elements; inputs are cut into at least 16 blocks of at least
    65536 elements, so the scratch stays below one [N, V] float32 buffer once
    N * V >= 2^20, and under about 1.2 MB below that.
    Sums per row are accumulated in float64.
    """
    if logp_a.shape != logp_b.shape:
        raise ValueError(f"js_distance: shapes differ: {tuple(logp_a.shape)} vs {tuple(logp_b.shape)}")
    if logp_a.dim() < 1 or logp_a.shape[-1] < 1:
        raise ValueError("js_distance: inputs need a non-empty last (vocabulary) axis")
    if not (logp_a.is_floating_point() and logp_b.is_floating_point()):
        raise TypeError("js_distance: inputs must be floating-point log-probabilities")
    if torch.is_grad_enabled() and (logp_a.requires_grad or logp_b.requires_grad):
        # the replay is frozen: q carries no gradient. Refuse rather than silently drop one.
        raise ValueError(
            "js_distance: inputs require grad, but q is a no-grad quantity of the frozen replay; "
            "pass detached log-probs or call it under torch.no_grad()"
        )
    if logp_a.device != logp_b.device:
        raise ValueError(f"js_distance: inputs on different devices: {logp_a.device} vs {logp_b.device}")
    if int(chunk_elems) < 1:
        raise ValueError(f"js_distance: chunk_elems must be at least 1, got {chunk_elems}")
    cdt = _compute_dtype(torch.promote_types(logp_a.dtype, logp_b.dtype))
    lead = logp_a.shape[:-1]
    V = logp_a.shape[-1]
    n = math.prod(lead)
    acc = torch.zeros(n, dtype=torch.float64, device=logp_a.device)
    if n == 0:
        return acc.to(cdt).reshape(lead)
    rows_per_block, cols_per_block = js_block_shape(n, V, chunk_elems)
    for r0, r1, la, lb, ws in _js_blocks(logp_a, logp_b, rows_per_block, cols_per_block, cdt):
        acc[r0:r1] += _block_terms(la, lb, ws).sum(dim=-1)
    q = acc.div_(LN2).clamp_(0.0, 1.0).sqrt_()
    return q.to(cdt).reshape(lead)


def smoothstep(x: float) -> float:
    """3x^2 - 2x^3 on [0, 1], clamped outside."""
    x = min(1.0, max(0.0, float(x)))
    return x * x * (3.0 - 2.0 * x)


def beta_schedule(step: float, warmup_steps: float, beta_max: float) -> float:
    """beta_n = beta_max * smoothstep(clamp(n / warmup_steps, 0, 1)).

    0 at step 0 (and before), beta_max from step = warmup_steps on, zero slope at
    both ends. warmup_steps <= 0 means no warm-up: beta_max for every step >= 0.
    """
    if not 0.0 <= float(beta_max) <= 1.0:
        raise ValueError(f"beta_schedule: beta_max must be in [0, 1], got {beta_max}")
    step = float(step)
    if step < 0:
        return 0.0
    if warmup_steps <= 0:
        return float(beta_max)
    return float(beta_max) * smoothstep(step / float(warmup_steps))


def _as_loo_list(logp_loo) -> list[torch.Tensor | None]:
    if isinstance(logp_loo, torch.Tensor):
        return [logp_loo[k] for k in range(logp_loo.shape[0])]
    return list(logp_loo)


def _empty_flags(empty_block, K: int, B: int, device) -> torch.Tensor:
    if empty_block is None:
        return torch.zeros(K, B, dtype=torch.bool, device=device)
    e = torch.as_tensor(empty_block, dtype=torch.bool, device=device)
    if e.dim() == 1:
        if e.shape[0] != K:
            raise ValueError(f"credit_weights: empty_block has {e.shape[0]} entries for K={K} rewards")
        e = e[:, None]
    if e.dim() != 2 or e.shape[0] != K or e.shape[1] not in (1, B):
        raise ValueError(f"credit_weights: empty_block must be [K] or [K, B]; got {tuple(e.shape)} for K={K}, B={B}")
    return e.expand(K, B)


def _checked_inputs(fn: str, beta, full: torch.Tensor, full_name: str, loo_in, loo_name: str, mask: torch.Tensor):
    """The arguments both credit_weights entry points share, checked alike: (beta as float, the leave-one-out
    list, mask as bool). Every error is a ValueError that starts with `fn`."""
    beta = float(beta)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"{fn}: beta must be in [0, 1], got {beta}")
    if full.dim() != 3:
        raise ValueError(f"{fn}: {full_name} must be [B, T, V], got {tuple(full.shape)}")
    B, T, V = full.shape
    if tuple(mask.shape) != (B, T):
        raise ValueError(f"{fn}: mask must be [B, T] = {(B, T)}, got {tuple(mask.shape)}")
    loo = _as_loo_list(loo_in)
    if not loo:
        raise ValueError(f"{fn}: need at least one reward (K >= 1)")
    for k, lk in enumerate(loo):
        if lk is not None and tuple(lk.shape) != (B, T, V):
            raise ValueError(f"{fn}: {loo_name}[{k}] must be [B, T, V] = {(B, T, V)}, got {tuple(lk.shape)}")
    return beta, loo, as_bool_mask(mask, prefix=f"{fn}: ")


def credit_weights(
    logp_all: torch.Tensor,
    logp_loo: torch.Tensor | Sequence[torch.Tensor | None],
    mask: torch.Tensor,
    beta: float,
    empty_block=None,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
) -> torch.Tensor:
    """Per-reward token weights w [K, B, T].

    logp_all: [B, T, V] frozen replay log-distribution under the full context.
    logp_loo: [K, B, T, V] or K tensors [B, T, V] under each leave-one-out
              context; an entry may be None where reward k's block is empty.
    mask:     [B, T] bool, True on valid response tokens.
    beta:     in [0, 1].
    empty_block: None, [K] or [K, B] bool: reward k's information block is
              empty (for that response), so removing it changes nothing.

    Valid tokens: w = (1 - beta) + beta * q / qbar, qbar the mean of q over the
    response's valid tokens; w = 1 where the block is empty or qbar is 0.
    Masked tokens: w = 0. So each response's weights sum to its valid length.
    Returned in float64 for float64 inputs, float32 otherwise.
    """
    beta, loo, m = _checked_inputs("credit_weights", beta, logp_all, "logp_all", logp_loo, "logp_loo", mask)
    B, T, V = logp_all.shape
    K = len(loo)
    cdt = _compute_dtype(logp_all.dtype)
    empty = _empty_flags(empty_block, K, B, logp_all.device)
    count = m.sum(dim=1).to(cdt)  # [B]
    ws = []
    for k, lk in enumerate(loo):  # a loop over rewards, not tokens
        if lk is None:
            q = torch.zeros(B, T, dtype=cdt, device=logp_all.device)
            empty_k = torch.ones(B, dtype=torch.bool, device=logp_all.device)
        else:
            q = torch.where(m, js_distance(logp_all, lk, chunk_elems=chunk_elems).to(cdt), 0.0)
            empty_k = empty[k]
        ws.append(_weights_from_q(q, m, count, empty_k, beta))
    return torch.stack(ws, dim=0)


def _weights_from_q(q: torch.Tensor, m: torch.Tensor, count: torch.Tensor, empty_k: torch.Tensor,
                    beta: float) -> torch.Tensor:
    """w [B, T] for one reward from q (0 at masked tokens): (1 - beta) + beta q / qbar, 1 if uniform, 0 masked."""
    qbar = q.sum(dim=1) / count.clamp_min(1.0)  # [B]
    # uniform where the block is empty or every q is 0 (identical distributions);
    # a NaN qbar (NaN in a valid slot) is not hidden: it stays NaN
    uniform = empty_k | (qbar == 0)
    ratio = q / torch.where(uniform, torch.ones_like(qbar), qbar)[:, None]
    w = (1.0 - beta) + beta * ratio
    w = torch.where(uniform[:, None], torch.ones_like(w), w)
    return torch.where(m, w, torch.zeros_like(w))


def credit_weights_from_logits(
    logits_all: torch.Tensor,
    logits_loo: torch.Tensor | Sequence[torch.Tensor | None],
    mask: torch.Tensor,
    beta: float,
    empty_block=None,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
    block_elems: int = LOGITS_BLOCK_ELEMS,
) -> torch.Tensor:
    """credit_weights from the frozen replay's logits [B, T, V], a block of valid rows at a time.

    The same weights as credit_weights(log_softmax(logits_all), [log_softmax(l) for l in
    logits_loo], ...) within float32 rounding, without holding any [B, T, V] log-softmax:
    each block of about `block_elems` elements per context is normalised, compared (by
    js_distance, in its own `chunk_elems` scratch) and dropped, so the tensor storage it adds
    stays at four blocks (the last block's two log-softmaxes, held while the next one's rows
    are gathered and normalised) plus that scratch, whatever K, B or T (benchmarks/mrtpo_credit.py
    measured about 115 MB of resident memory in float32 for K = 2 at the default; a naive
    version holds K + 1 whole log-softmaxes and [B*T, V] temporaries: 3.0 GB at 512 x 152,064).
    Masked tokens are never normalised (their q is 0 in any case), so junk there, NaN
    included, is never read.
    """
    beta, loo, m = _checked_inputs("credit_weights_from_logits", beta, logits_all, "logits_all", logits_loo,
                                   "logits_loo", mask)
    B, T, V = logits_all.shape
    K = len(loo)
    cdt = _compute_dtype(logits_all.dtype)
    device = logits_all.device
    empty = _empty_flags(empty_block, K, B, device)
    count = m.sum(dim=1).to(cdt)
    valid = m.reshape(-1).nonzero().flatten()  # rows that are ever read
    q = torch.zeros(K, B * T, dtype=cdt, device=device)
    live = [k for k, lk in enumerate(loo) if lk is not None]
    step = max(1, int(block_elems) // V)
    with torch.no_grad():  # the replay is frozen: q carries no gradient
        for start in range(0, valid.numel(), step):
            rows = valid[start : start + step]
            la = torch.log_softmax(logits_all.reshape(-1, V).index_select(0, rows).to(cdt), dim=-1)
            for k in live:
                lb = torch.log_softmax(loo[k].reshape(-1, V).index_select(0, rows).to(cdt), dim=-1)
                q[k].index_copy_(0, rows, js_distance(la, lb, chunk_elems=chunk_elems).to(cdt))
    ws = []
    for k in range(K):
        empty_k = torch.ones(B, dtype=torch.bool, device=device) if loo[k] is None else empty[k]
        ws.append(_weights_from_q(q[k].view(B, T), m, count, empty_k, beta))
    return torch.stack(ws, dim=0)


@torch.no_grad()  # advantages are constants of the policy-gradient loss: no graph is built through them
def mrtpo_advantages(
    reward_advantages: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    eps: float = 1e-6,
):
    """Token advantages A [B, T] from per-reward response advantages [K, B] and weights [K, B, T].

    S_t = sum_k A_k w_k,t; U = sum_k A_k; D_t = S_t - U;
    s = min(1, sqrt(sum_j T_j U_j^2 / sum_{j,t} D_j,t^2)) (s = 1 when every D is 0);
    S~_t = U + s D_t; A_t = S~_t / (std + eps), std the population standard
    deviation of S~ over the batch's valid tokens. Masked tokens get 0.
    The arithmetic runs in float64 whatever the input dtype (these are [K, B, T]
    tensors, tiny beside the [B, T, V] replay): a batch whose S~ barely varies
    has a std near 0, where rounding in float32 would be magnified by 1/eps.
    A is returned in float64 for float64 inputs, float32 otherwise, and carries no gradient.

    Returns (A, metrics) with metrics: s, std, tokens, second_moment_U
    (sum T U^2), second_moment_D (sum D^2, before the cap), capped (s < 1).
    """
    if reward_advantages.dim() != 2:
        raise ValueError(f"mrtpo_advantages: reward_advantages must be [K, B], got {tuple(reward_advantages.shape)}")
    K, B = reward_advantages.shape
    if weights.dim() != 3 or tuple(weights.shape[:2]) != (K, B):
        raise ValueError(f"mrtpo_advantages: weights must be [K, B, T] with K={K}, B={B}; got {tuple(weights.shape)}")
    T = weights.shape[2]
    if tuple(mask.shape) != (B, T):
        raise ValueError(f"mrtpo_advantages: mask must be [B, T] = {(B, T)}, got {tuple(mask.shape)}")
    out_dtype = _compute_dtype(torch.promote_types(reward_advantages.dtype, weights.dtype))
    cdt = torch.float64
    m = as_bool_mask(mask, prefix="mrtpo_advantages: ")
    a = reward_advantages.to(cdt)
    w = torch.where(m[None], weights.to(cdt), 0.0)
    count = m.sum(dim=1).to(cdt)
    has_tokens = count > 0
    # a response with no valid token carries no credit: junk in its advantages changes nothing
    a = torch.where(has_tokens[None], a, 0.0)
    S = (a[:, :, None] * w).sum(dim=0)  # [B, T]
    U = a.sum(dim=0)  # [B]
    D = torch.where(m, S - U[:, None], 0.0)
    mom_u = (count * U * U).sum()
    mom_d = (D * D).sum()
    if bool(mom_d > 0):
        s = torch.clamp(torch.sqrt(mom_u / mom_d), max=1.0)
    else:
        s = torch.ones((), dtype=cdt, device=S.device)
    St = torch.where(m, U[:, None] + s * D, 0.0)
    n = count.sum()
    if bool(n > 0):
        mean = St.sum() / n
        dev = torch.where(m, St - mean, 0.0)
        std = torch.sqrt((dev * dev).sum() / n)
    else:
        std = torch.zeros((), dtype=cdt, device=S.device)
    A = torch.where(m, St / (std + eps), 0.0).to(out_dtype)
    metrics = {
        "s": float(s),
        "std": float(std),
        "tokens": int(n),
        "second_moment_U": float(mom_u),
        "second_moment_D": float(mom_d),
        "capped": bool(s < 1.0),
    }
    return A, metrics
