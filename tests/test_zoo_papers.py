"""The float64 references of the framework-zoo specs (DAPO, Dr. GRPO, CISPO, GMPO, GPG), held against implementations
written here from the papers alone: vectorised float64 torch with autograd, sharing nothing with methods/ (neither
its code nor its loops), so a reference that misread a paper disagrees with a second reading of it. Each paper also
gets a planted bug in the second reading, which the same comparison must catch: the comparison can fail."""

from __future__ import annotations

import math

import pytest
import torch

from engine.spec import registry

F64 = torch.float64
TOL = 1e-12


# --- the papers, read again ----------------------------------------------------------------------------------------


def _ratio(logp, old, clamp=None):
    x = logp - old
    return (x.clamp(-clamp, clamp) if clamp else x).exp()


def dapo_paper(logp, old, adv, mask, eps_low=0.2, eps_high=0.28, bug=None):
    """DAPO Eq. 8: token-level sum of min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) over sum_i |o_i|, negated."""
    m = mask.to(F64)
    r = _ratio(logp, old, 20.0)
    hi = 1 + (eps_low if bug == "symmetric" else eps_high)
    obj = torch.minimum(r * adv, r.clamp(1 - eps_low, hi) * adv)
    return -(obj * m).sum() / m.sum()


def overlong_paper(lengths, l_max, l_cache, bug=None):
    """DAPO Eq. 13."""
    y = lengths.to(F64)
    start = l_max - l_cache + (-1 if bug == "early" else 0)
    ramp = (start - y) / l_cache
    return torch.where(y <= start, 0.0, torch.where(y <= l_max, ramp, -1.0))


def dr_grpo_paper(logp, old, adv, mask, norm_length, bug=None):
    """Dr. GRPO: the PPO surrogate summed over tokens, over G times a constant length (no 1/|o_i|)."""
    m = mask.to(F64)
    r = _ratio(logp, old, 20.0)
    obj = torch.minimum(r * adv, r.clamp(0.8, 1.2) * adv) * m
    g = (m.sum(-1) > 0).sum()
    if bug == "length_norm":
        return -(obj.sum(-1) / m.sum(-1)).sum() / g
    return -obj.sum() / (g * norm_length)


def dr_grpo_advantages_paper(rewards, group_size, bug=None):
    g = rewards.reshape(-1, group_size)
    a = g - g.mean(-1, keepdim=True)
    if bug == "std":
        a = a / (g.std(-1, unbiased=False, keepdim=True) + 1e-6)
    return a.reshape(-1)


def cispo_paper(logp, old, adv, mask, eps_high=0.28, bug=None):
    """MiniMax-M1 Eq. 4: sg(clip(r, 0, 1 + eps_high)) A log pi, token-level, negated (no lower bound)."""
    m = mask.to(F64)
    w = (logp - old).exp().clamp(max=1 + eps_high)
    if bug != "no_sg":
        w = w.detach()
    return -(w * adv * logp * m).sum() / m.sum()


def gmpo_paper(logp, old, adv, mask, eps=0.4, bug=None):
    """GMPO: prod_t min(rho^sgn, clip(rho^sgn, e^-eps, e^eps))^(sgn / |o|) A, averaged over responses, negated."""
    m = mask.to(F64)
    sgn = torch.sign(adv)[:, None]
    rho_s = ((logp - old).clamp(-20, 20) * sgn).exp()  # rho^sgn(A)
    lo, hi = (1 - eps, 1 + eps) if bug == "ratio_space" else (math.exp(-eps), math.exp(eps))
    kept = torch.minimum(rho_s, rho_s.clamp(lo, hi))
    log_s = (kept.log() * m).sum(-1) * sgn[:, 0] / m.sum(-1)
    return -(adv * log_s.exp()).mean()


def gpg_paper(logp, adv, mask, bug=None):
    m = mask.to(F64)
    sign = 1.0 if bug == "sign" else -1.0
    return sign * (adv * logp * m).sum() / m.sum()


def gpg_advantages_paper(rewards, group_size, bug=None):
    g = rewards.reshape(-1, group_size)
    flat = (g == g[:, :1]).all(-1)
    b, m_rows = rewards.numel(), int(flat.sum()) * group_size
    alpha = 1.0 if bug == "no_alpha" or m_rows == b else b / (b - m_rows)
    return (alpha * (g - g.mean(-1, keepdim=True)) * (~flat)[:, None]).reshape(-1)


# --- inputs and the comparison --------------------------------------------------------------------------------------


def _batch(seed, B=6, L=24, drift=0.6, per_token=False):
    g = torch.Generator().manual_seed(seed)
    logp = -3.0 * torch.rand(B, L, generator=g, dtype=F64) - 0.01
    old = logp + drift * torch.randn(B, L, generator=g, dtype=F64)
    adv = torch.randn(B, L, generator=g, dtype=F64) if per_token else torch.randn(B, generator=g, dtype=F64)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    mask = torch.arange(L)[None, :] < lengths[:, None]
    return logp, old, adv, mask


def _ref(name, *args, **kwargs):
    return registry.load().get_reference(name)(*args, **kwargs)


def _value(x):
    return float(x["value"] if isinstance(x, dict) else x)


def _paper_grad(fn, logp, *args, **kw):
    x = logp.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fn(x, *args, **kw), x)
    return g


def _gap(ref_value, ref_grad, paper_value, paper_grad, mask):
    """Largest disagreement between the spec's reference and the paper reading: the value relative to its size, the
    gradient at valid tokens relative to the largest; NaN in the reference (an ambiguous clip branch) is skipped."""
    value = abs(ref_value - paper_value) / max(abs(paper_value), 1e-300)
    ok = mask & ~torch.isnan(ref_grad)
    scale = float(paper_grad[ok].abs().max())
    grad = float((ref_grad - paper_grad)[ok].abs().max()) / scale
    return max(value, grad)


SEEDS = range(6)


@pytest.mark.parametrize("seed", SEEDS)
def test_dapo_reference_is_the_paper(seed):
    logp, old, adv, mask = _batch(seed, per_token=seed % 2 == 1)
    kw = dict(clip_low=0.2, clip_high=0.28)
    gap = _gap(_value(_ref("dapo.loss", logp, old, adv, mask, **kw)), _ref("dapo.loss_grad", logp, old, adv, mask, **kw),
               float(dapo_paper(logp, old, adv if adv.dim() == 2 else adv[:, None], mask)),
               _paper_grad(dapo_paper, logp, old, adv if adv.dim() == 2 else adv[:, None], mask), mask)
    assert gap < TOL
    lengths = torch.arange(0, 90)
    assert torch.equal(_ref("dapo.overlong_penalty", lengths, 64, 16), overlong_paper(lengths, 64, 16))


def test_dapo_planted_bugs_fail_the_comparison():
    logp, old, adv, mask = _batch(0, drift=0.8)
    kw = dict(clip_low=0.2, clip_high=0.28)
    a = adv[:, None]
    gap = _gap(_value(_ref("dapo.loss", logp, old, adv, mask, **kw)), _ref("dapo.loss_grad", logp, old, adv, mask, **kw),
               float(dapo_paper(logp, old, a, mask, bug="symmetric")),
               _paper_grad(dapo_paper, logp, old, a, mask, bug="symmetric"), mask)
    assert gap > 1e-3
    lengths = torch.arange(0, 90)
    assert not torch.equal(_ref("dapo.overlong_penalty", lengths, 64, 16), overlong_paper(lengths, 64, 16, bug="early"))


@pytest.mark.parametrize("seed", SEEDS)
def test_dr_grpo_reference_is_the_paper(seed):
    logp, old, adv, mask = _batch(seed, per_token=seed % 2 == 1)
    c = logp.shape[-1] + 7
    a = adv if adv.dim() == 2 else adv[:, None]
    gap = _gap(_value(_ref("dr_grpo.loss", logp, old, adv, mask, norm_length=c)),
               _ref("dr_grpo.loss_grad", logp, old, adv, mask, norm_length=c),
               float(dr_grpo_paper(logp, old, a, mask, c)), _paper_grad(dr_grpo_paper, logp, old, a, mask, c), mask)
    assert gap < TOL
    rewards = torch.randn(12, generator=torch.Generator().manual_seed(seed), dtype=F64)
    got = _ref("dr_grpo.group_advantages", rewards, 4)
    assert float((got - dr_grpo_advantages_paper(rewards, 4)).abs().max()) < TOL


def test_dr_grpo_planted_bugs_fail_the_comparison():
    logp, old, adv, mask = _batch(1)
    c = logp.shape[-1]
    a = adv[:, None]
    gap = _gap(_value(_ref("dr_grpo.loss", logp, old, adv, mask)), _ref("dr_grpo.loss_grad", logp, old, adv, mask),
               float(dr_grpo_paper(logp, old, a, mask, c, bug="length_norm")),
               _paper_grad(dr_grpo_paper, logp, old, a, mask, c, bug="length_norm"), mask)
    assert gap > 1e-3
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64)
    assert float((_ref("dr_grpo.group_advantages", rewards, 4)
                  - dr_grpo_advantages_paper(rewards, 4, bug="std")).abs().max()) > 0.1


@pytest.mark.parametrize("seed", SEEDS)
def test_cispo_reference_is_the_paper(seed):
    logp, old, adv, mask = _batch(seed, drift=0.8, per_token=seed % 2 == 1)
    a = adv if adv.dim() == 2 else adv[:, None]
    gap = _gap(_value(_ref("cispo.loss", logp, old, adv, mask, clip_high=0.28)),
               _ref("cispo.loss_grad", logp, old, adv, mask, clip_high=0.28),
               float(cispo_paper(logp, old, a, mask)), _paper_grad(cispo_paper, logp, old, a, mask), mask)
    assert gap < TOL


def test_cispo_planted_bug_fails_the_comparison():
    logp, old, adv, mask = _batch(2, drift=0.8)
    a = adv[:, None]
    gap = _gap(_value(_ref("cispo.loss", logp, old, adv, mask, clip_high=0.28)),
               _ref("cispo.loss_grad", logp, old, adv, mask, clip_high=0.28),
               float(cispo_paper(logp, old, a, mask, bug="no_sg")),
               _paper_grad(cispo_paper, logp, old, a, mask, bug="no_sg"), mask)
    assert gap > 1e-3


@pytest.mark.parametrize("seed", SEEDS)
def test_gmpo_reference_is_the_paper(seed):
    logp, old, adv, mask = _batch(seed, drift=0.6)
    gap = _gap(_value(_ref("gmpo.loss", logp, old, adv, mask)), _ref("gmpo.loss_grad", logp, old, adv, mask),
               float(gmpo_paper(logp, old, adv, mask)), _paper_grad(gmpo_paper, logp, old, adv, mask), mask)
    assert gap < TOL


def test_gmpo_planted_bug_fails_the_comparison():
    logp, old, adv, mask = _batch(3, drift=0.6)
    gap = _gap(_value(_ref("gmpo.loss", logp, old, adv, mask)), _ref("gmpo.loss_grad", logp, old, adv, mask),
               float(gmpo_paper(logp, old, adv, mask, bug="ratio_space")),
               _paper_grad(gmpo_paper, logp, old, adv, mask, bug="ratio_space"), mask)
    assert gap > 1e-3


@pytest.mark.parametrize("seed", SEEDS)
def test_gpg_reference_is_the_paper(seed):
    logp, _, adv, mask = _batch(seed, per_token=seed % 2 == 1)
    a = adv if adv.dim() == 2 else adv[:, None]
    gap = _gap(_value(_ref("gpg.loss", logp, adv, mask)), _ref("gpg.loss_grad", logp, adv, mask),
               float(gpg_paper(logp, a, mask)), _paper_grad(gpg_paper, logp, a, mask), mask)
    assert gap < TOL
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (16,), generator=g).to(F64)
    got = _ref("gpg.advantages", rewards, 2)
    assert float((got - gpg_advantages_paper(rewards, 2)).abs().max()) < TOL


def test_gpg_planted_bugs_fail_the_comparison():
    logp, _, adv, mask = _batch(4)
    a = adv[:, None]
    gap = _gap(_value(_ref("gpg.loss", logp, adv, mask)), _ref("gpg.loss_grad", logp, adv, mask),
               float(gpg_paper(logp, a, mask, bug="sign")), _paper_grad(gpg_paper, logp, a, mask, bug="sign"), mask)
    assert gap > 1e-3
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0], dtype=F64)
    assert float((_ref("gpg.advantages", rewards, 4) - gpg_advantages_paper(rewards, 4, bug="no_alpha")).abs().max()) \
        > 0.1
