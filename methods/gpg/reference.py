"""Independent float64 references for GPG (arXiv 2504.02546): plain Python loops over floats.

Written from the paper again: the advantage alpha (R - group mean) / F_norm with alpha = B / (B - M), M the responses
of groups whose rewards are all equal, and the token-level REINFORCE loss -(1/N) sum A logp.
"""

from __future__ import annotations

import math


def gpg_advantages(rewards, group_size, f_norm=1.0):
    B = len(rewards)
    groups = [rewards[s:s + group_size] for s in range(0, B, group_size)]
    flat = [max(g) == min(g) for g in groups]
    m_rows = sum(group_size for f in flat if f)
    alpha = B / (B - m_rows) if m_rows < B else 1.0
    out = []
    for g, f in zip(groups, flat):
        mean = math.fsum(g) / len(g)
        out += [0.0 if f else alpha * (x - mean) / f_norm for x in g]
    return out


def loss_and_grad(logp, adv, mask):
    n = sum(1 for row in mask for v in row if v)
    terms, grad = [], [[0.0] * len(row) for row in mask]
    for b, (lrow, arow, mrow) in enumerate(zip(logp, adv, mask)):
        for t, (l, a, v) in enumerate(zip(lrow, arow, mrow)):
            if v:
                terms.append(-a * l)
                grad[b][t] = -a / n
    return math.fsum(terms) / n, grad


def _register() -> None:
    import torch

    from engine.spec import registry

    def run(logp, advantages, mask):
        m = mask.to(torch.bool)
        a = advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages
        return loss_and_grad(torch.where(m, logp, 0.0).tolist(), torch.where(m, a, 0.0).tolist(), m.tolist())

    @registry.reference("gpg.loss")
    def loss_tensor(logp, advantages, mask):
        return torch.tensor(run(logp, advantages, mask)[0], dtype=torch.float64)

    @registry.reference("gpg.loss_grad")
    def loss_grad_tensor(logp, advantages, mask):
        return torch.tensor(run(logp, advantages, mask)[1], dtype=torch.float64)

    @registry.reference("gpg.advantages_grad")
    def advantages_grad(logp, advantages, mask):
        """d loss / d advantages: 0, they are constants of the loss."""
        return torch.zeros_like(advantages, dtype=torch.float64)

    @registry.reference("gpg.advantages")
    def advantages_tensor(rewards, group_size, *, f_norm=1.0):
        return torch.tensor(gpg_advantages(rewards.tolist(), group_size, f_norm), dtype=torch.float64)

    @registry.reference("family.grpo_on_policy_grad")
    def grpo_on_policy_grad(logp, advantages, mask):
        """The gradient of GRPO's loss (methods/grpo, token mean) at logp == old_logp: the vanilla policy gradient
        -A / N per valid token, which GPG's loss has everywhere."""
        from methods.grpo.loss import grpo_loss

        x = logp.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(grpo_loss(x, logp.detach().clone(), advantages, mask)[0], x)
        return g


    @registry.reference("gpg.loss_f64")
    def loss_f64(logp, advantages, mask, dtype=None):
        """`loss_and_grad` at training sizes: each term in float64 tensor arithmetic, every sum exact (fsum)."""
        from methods.common.exact import fsum

        f64, m = torch.float64, mask.to(torch.bool)
        zero = torch.zeros((), dtype=f64)
        a = advantages.to(f64)
        a = torch.where(m, a[:, None].expand(m.shape) if a.dim() == 1 else a, zero)
        term = torch.where(m, -a * logp.to(f64), zero)
        n = int(m.sum())
        return {"value": torch.tensor(fsum(term) / n, dtype=f64), "scale": fsum(term.abs()) / n,
                "grad": [torch.where(m, -a / n, zero)]}


_register()
