"""Contract of the three harness steps on synthetic inputs (the mechanism run checks them on its own tensors).

The mechanism run only meets what its rollouts happen to contain: responses of one or more
valid tokens, distributions of one small GRU. Here each step is driven directly, on inputs that
take every case, against float64 loops that share no code with it:

* `trajectory_embeddings`: every length from an empty response (its embedding is the zero
  vector, never 0/0) to one without padding; junk tokens in the padding slots, which a pooling
  over valid tokens never sees (the GRU is causal);
* `bank_logprobs`: a live policy that differs from the frozen base, so scoring by the wrong one
  shows; the live log-probs carry a gradient, the base's do not;
* `kl_to_base`: the value and the gradient with respect to the policy's log-distribution, which holds zero
  probabilities (-inf log-probs: 0 log 0 = 0, gradient 0)
  against float64 KL(pi_theta || pi_base), token mean over valid positions, with other
  distributions in the padding slots.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from methods.common.policy import TinyGRUPolicy, snapshot
from methods.common.tasks import FIRST_CONTENT
from methods.tar.checks import F64

# Check code, not a mutation target of `contracts mutate` (like checks.py): it only calls the method.
__mutate__ = False


def _maxabs(t: torch.Tensor) -> float:
    """max |t|, NaN counted as inf (never silently dropped); 0 for an empty tensor."""
    if t.numel() == 0:
        return 0.0
    return float(torch.nan_to_num(t.abs(), nan=math.inf).max())


def _batch(g: torch.Generator, vocab: int):
    """[N, P] prompts, [N, T] responses with junk in padding, [N, T] masks of every length 0..T."""
    T, P = 6, 3
    lengths = torch.tensor([0, 1, T, 2, 3, 4, 5, T, 1, 3])
    N = lengths.numel()
    prompts = torch.randint(FIRST_CONTENT, vocab, (N, P), generator=g)
    responses = torch.randint(FIRST_CONTENT, vocab, (N, T), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return prompts, responses, mask


def _pooled_reference(hidden: list, mask: list) -> list:
    """Mean of the hidden states at the valid positions, by a float64 loop; zeros for an empty row."""
    out = []
    for h_rows, m_row in zip(hidden, mask):
        valid = [h for h, v in zip(h_rows, m_row) if v]
        out.append([math.fsum(col) / len(valid) for col in zip(*valid)] if valid else [0.0] * len(h_rows[0]))
    return out


def _kl_reference(lt: list, lq: list, mask: list) -> tuple[float, list]:
    """Token mean over valid positions of sum_v p (l - q), and its gradient with respect to l."""
    n = sum(bool(v) for row in mask for v in row)
    total, grad = [], []
    for b, row in enumerate(mask):
        g_row = []
        for t, valid in enumerate(row):
            l, q = lt[b][t], lq[b][t]
            if valid:  # a zero probability (l = -inf) adds 0 log 0 = 0 and has gradient 0
                total.append(math.fsum(math.exp(a) * (a - c) for a, c in zip(l, q) if a != -math.inf))
                g_row.append([math.exp(a) * (a - c + 1.0) / n if a != -math.inf else 0.0 for a, c in zip(l, q)])
            else:
                g_row.append([0.0] * len(l))
        grad.append(g_row)
    return (math.fsum(total) / n if n else 0.0), grad


@registry.check("tar.harness_reference")
def harness_reference(impl, ctx) -> dict:
    """The encoder, the bank scoring and the KL term on synthetic inputs against float64 loops."""
    g = ctx.generator(160)
    vocab, hidden_size = 16, 8
    dt = ctx.dtype
    base = snapshot(TinyGRUPolicy.seeded(ctx.seed + 1000, vocab_size=vocab, hidden_size=hidden_size)).to(ctx.device, dt)
    policy = TinyGRUPolicy.seeded(ctx.seed + 2000, vocab_size=vocab, hidden_size=hidden_size).to(ctx.device, dt)
    prompts, responses, mask = (x.to(ctx.device) for x in _batch(g, vocab))
    N, T = responses.shape

    # Encoder: against the float64 loop on the base's own hidden states.
    emb = impl.trajectory_embeddings(base, prompts, responses, mask)
    with torch.no_grad():
        _, hidden, _ = base(torch.cat([prompts, responses], dim=1))
    want = torch.tensor(_pooled_reference(hidden[:, prompts.shape[1]:].double().cpu().tolist(), mask.cpu().tolist()),
                        dtype=F64)
    got = emb.detach().double().cpu()
    shape_ok = tuple(emb.shape) == (N, hidden_size) and emb.dtype == F64
    enc_err = _maxabs(got - want) if shape_ok else math.inf
    junk = torch.where(mask, responses, torch.randint(FIRST_CONTENT, vocab, responses.shape, generator=g).to(ctx.device))
    junk_diff = _maxabs(impl.trajectory_embeddings(base, prompts, junk, mask).detach().double().cpu() - got)
    empty = got[0]

    # Bank scoring: the live policy's log-probs with grad, the frozen base's without.
    ref_theta = _scored(policy, prompts, responses)
    ref_base = _scored(base, prompts, responses)
    lt, lb = impl.bank_logprobs(policy, base, prompts, responses)
    theta_err = _maxabs(lt.detach().double().cpu() - ref_theta)
    base_err = _maxabs(lb.detach().double().cpu() - ref_base)
    policy_gap = _maxabs(ref_theta - ref_base)

    # KL term: value and gradient, other distributions in padding.
    V = vocab
    raw = torch.randn(N, T, V, generator=g, dtype=F64) * 2
    l_base = torch.log_softmax(torch.randn(N, T, V, generator=g, dtype=F64) * 2, -1)
    # zero probabilities in the policy's distribution (log-prob -inf): 0 log 0 = 0, gradient 0, never NaN
    drop = torch.rand(N, T, V, generator=g) < 0.2
    drop[..., 0] = False
    l_theta = torch.log_softmax(torch.where(drop, -math.inf, raw), -1)
    l_full = torch.log_softmax(raw, -1)  # for the direction check: KL(base || theta) is +inf where theta is 0
    x = l_theta.to(ctx.device, dt).requires_grad_(True)
    kl = impl.kl_to_base(x, l_base.to(ctx.device, dt), mask)
    gx = torch.autograd.grad(kl, x, allow_unused=True)[0] if kl.requires_grad else None
    gx = torch.zeros_like(x) if gx is None else gx  # a cut gradient is measured as 0, not raised
    lt_r, lb_r = l_theta.to(dt).double(), l_base.to(dt).double()
    want_kl, want_grad = _kl_reference(lt_r.tolist(), lb_r.tolist(), mask.cpu().tolist())
    full_kl, _ = _kl_reference(l_full.to(dt).double().tolist(), lb_r.tolist(), mask.cpu().tolist())
    rev_kl, _ = _kl_reference(lb_r.tolist(), l_full.to(dt).double().tolist(), mask.cpu().tolist())
    swapped = torch.where(mask[..., None].cpu(), l_theta, l_base.roll(1, 0))
    kl_pad = impl.kl_to_base(swapped.to(ctx.device, dt), torch.where(mask[..., None].cpu(), l_base, l_theta).to(ctx.device, dt), mask)
    # The token mean's edges: one valid token (the mean is that token's KL) and none (0, not 0/0).
    edge_err = 0.0
    one = torch.zeros_like(mask)
    one[N - 1, 0] = True
    for edge in (torch.zeros_like(mask), one):
        got_e = float(impl.kl_to_base(l_theta.to(ctx.device, dt), l_base.to(ctx.device, dt), edge).detach())
        want_e, _ = _kl_reference(lt_r.tolist(), lb_r.tolist(), edge.cpu().tolist())
        err = abs(got_e - want_e)
        edge_err = max(edge_err, err if err == err else math.inf)
    return {
        "encoder_shape_dtype_ok": shape_ok,
        "encoder_max_abs_err": enc_err,
        "encoder_padding_junk_max_abs_diff": junk_diff,
        "empty_response_embedding_max_abs": _maxabs(empty),
        "empty_responses": int((mask.sum(1) == 0).sum()),
        "bank_theta_logp_max_abs_err": theta_err,
        "bank_base_logp_max_abs_err": base_err,
        "bank_theta_has_grad": bool(lt.requires_grad),
        "bank_base_has_grad": bool(lb.requires_grad),
        "policy_base_logp_gap": policy_gap,
        "kl_abs_err": _maxabs(torch.tensor(float(kl.detach()) - want_kl)),
        "kl_grad_max_abs_err": _maxabs(gx.detach().double().cpu() - torch.tensor(want_grad, dtype=F64)),
        "kl_direction_gap": abs(full_kl - rev_kl),
        "kl_padding_abs_diff": abs(float(kl_pad.detach()) - float(kl.detach())),
        "kl_edge_abs_err": edge_err,
    }


@torch.no_grad()
def _scored(model, prompts, responses) -> torch.Tensor:
    """Log-probs of the responses under `model`, by a float64 loop over positions (the logits at
    position i predict token i + 1)."""
    ctxt = torch.cat([prompts, responses[:, :-1]], dim=1)
    logits, _, _ = model(ctxt)
    logits = logits[:, prompts.shape[1] - 1:].double().cpu()
    N, T = responses.shape
    out = torch.empty(N, T, dtype=F64)
    for b in range(N):
        for t in range(T):
            row = logits[b, t].tolist()
            top = max(row)
            lse = top + math.log(math.fsum(math.exp(v - top) for v in row))
            out[b, t] = row[int(responses[b, t])] - lse
    return out
