"""TAR's gated replay: the soft gate, the adaptive replay loss and the total loss.

Page (000_9c1a96943321a9e4.txt), with delta_t = log p_base(y_t|h_t) - log p_theta(y_t|h_t):

    phi(z) = max(1 - e^-z, 0)          computed as -expm1(-max(z, 0))
    g(tau) = phi(mean_t delta_t)       trajectory gate
    w_t    = phi(delta_t)              token weight
    L_rep  = (1/|B_rep|) sum_tau sg[g] * sum_t sg[w_t] (-log p_theta,t) / (1e-8 + sum_t sg[w_t])
    L_total = L_GRPO + lambda_rep * L_rep,   lambda_rep = 1

The mean runs over every bank trajectory, zero-gate ones included. Gate and
weights are detached. fp16/bf16 inputs are computed in fp32 inside, so the
1e-8 (0 in fp16) cannot underflow and all-zero weights give 0, never 0/0.
Masks are applied with torch.where, never by multiplication, so NaN or +-1e4
junk in padding slots changes neither the loss nor its gradient.
"""

from __future__ import annotations

import math

import torch

from methods.common.errors import DtypeError
from methods.common.masking import as_bool_mask

DENOM_EPS = 1e-8
_HALF = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp16/bf16 are computed in fp32; fp32 and fp64 in themselves."""
    return torch.float32 if dtype in _HALF else dtype


def soft_gate(z: torch.Tensor) -> torch.Tensor:
    """phi(z) = max(1 - e^-z, 0) as -expm1(-max(z, 0)), returned in z's dtype.

    In [0, 1] and finite for every finite z (e^-z is only ever taken of a
    non-positive number); phi(z) = 0 for z <= 0; phi(z) ~ z for tiny z > 0.
    Half inputs are evaluated in fp32 and rounded once. NaN stays NaN.
    """
    if not torch.is_floating_point(z):
        raise TypeError(f"soft_gate needs a floating-point tensor, got {z.dtype}")
    zc = z.to(compute_dtype(z.dtype))
    return (-torch.expm1(-zc.clamp_min(0.0))).to(z.dtype)


def _first_bad(where: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(i) for i in where.nonzero()[0].tolist())


def check_replay_inputs(logp_theta: torch.Tensor, logp_base: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Validate shapes and the values at valid positions; return the mask as bool.

    Rejected (one line, by the interface's convention): integer log-probs with a TypeError; with a
    ValueError naming the first offending position:
    a non-finite log-prob at a valid position, a positive log-prob at a valid
    position. Padding slots are never inspected: junk there is allowed.
    """
    if logp_theta.dim() != 2:
        raise ValueError(f"logp_theta must be [trajectories, tokens], got shape {tuple(logp_theta.shape)}")
    if logp_base.shape != logp_theta.shape or mask.shape != logp_theta.shape:
        raise ValueError(
            "logp_theta, logp_base and mask must have the same shape, got "
            f"{tuple(logp_theta.shape)}, {tuple(logp_base.shape)}, {tuple(mask.shape)}"
        )
    if not (torch.is_floating_point(logp_theta) and torch.is_floating_point(logp_base)):
        raise DtypeError(f"log-probs must be floating point, got {logp_theta.dtype} and {logp_base.dtype}")
    m = as_bool_mask(mask).to(device=logp_theta.device)
    for name, x in (("logp_theta", logp_theta), ("logp_base", logp_base)):
        xd = x.detach()
        bad = m & ~torch.isfinite(xd)
        if bool(bad.any()):
            pos = _first_bad(bad)
            raise ValueError(f"{name} is non-finite ({float(xd[pos])}) at valid position {pos}; a sampled token's log-prob must be finite")
        pos_lp = m & (xd > 0)
        if bool(pos_lp.any()):
            pos = _first_bad(pos_lp)
            raise ValueError(
                f"{name} is positive ({float(xd[pos]):.6g}) at valid position {pos}; a log-probability must be <= 0 "
                "(a positive value would turn into a negative replay loss)"
            )
    return m


def replay_gate_and_weights(
    logp_theta: torch.Tensor, logp_base: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Detached (gate [B], token weights [B, T], mean delta [B]) from already-checked, upcast inputs."""
    with torch.no_grad():
        delta = torch.where(mask, logp_base.detach() - logp_theta.detach(), torch.zeros_like(logp_theta))
        n = mask.sum(dim=1)
        mean_delta = delta.sum(dim=1) / n.clamp_min(1).to(delta.dtype)
        gate = soft_gate(mean_delta)
        weights = torch.where(mask, soft_gate(delta), torch.zeros_like(delta))
    return gate, weights, mean_delta


def adaptive_replay_loss(logp_theta: torch.Tensor, logp_base: torch.Tensor, mask: torch.Tensor):
    """TAR's gated, token-weighted replay NLL over a batch of bank trajectories.

    logp_theta: [B, T] current-policy log-probs of the bank tokens (with grad);
    logp_base:  [B, T] frozen base log-probs of the same tokens;
    mask:       [B, T] True at response tokens (prompt and padding excluded).

    Returns (loss, metrics). The loss is a scalar in the compute dtype (fp32
    for fp16/bf16 inputs). An empty bank (B = 0) gives a zero loss. A row
    with no valid token has gate 0 and still counts in |B|.
    metrics: gates [B], mean_delta [B], token_weights [B, T] (0 in padding),
    active_fraction (share of trajectories with gate > 0), weight_sum [B],
    num_trajectories.
    """
    m = check_replay_inputs(logp_theta, logp_base, mask)
    cd = compute_dtype(logp_theta.dtype)
    lt = logp_theta.to(cd)
    lb = logp_base.to(device=lt.device, dtype=cd)
    B = lt.shape[0]
    gate, weights, mean_delta = replay_gate_and_weights(lt, lb, m)
    nll = torch.where(m, -lt, torch.zeros_like(lt))
    weight_sum = weights.sum(dim=1)
    per_traj = gate * (weights * nll).sum(dim=1) / (DENOM_EPS + weight_sum)
    loss = per_traj.sum() / max(B, 1)
    metrics = {
        "gates": gate,
        "mean_delta": mean_delta,
        "token_weights": weights,
        "weight_sum": weight_sum,
        "active_fraction": float((gate > 0).double().mean()) if B else 0.0,
        "num_trajectories": B,
    }
    return loss, metrics


def tar_total_loss(grpo_loss: torch.Tensor, replay_loss: torch.Tensor, lambda_rep: float = 1.0) -> torch.Tensor:
    """L_total = L_GRPO + lambda_rep * L_rep (the page's default lambda_rep = 1)."""
    lam = float(lambda_rep)
    if not math.isfinite(lam) or lam < 0:
        raise ValueError(f"lambda_rep must be a finite number >= 0, got {lambda_rep!r}")
    return grpo_loss + lam * replay_loss
