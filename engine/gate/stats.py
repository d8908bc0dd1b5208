"""A paired-t confidence interval, without scipy (not a dependency).

Student's t quantile by bisection on its CDF, which is a regularized
incomplete beta function evaluated by Lentz's continued fraction
(Numerical Recipes, 6.4). Accurate to about 1e-10 for df >= 1.
"""

from __future__ import annotations

import math
from statistics import fmean, stdev


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom (0.5 < p < 1)."""
    if not 0.5 < p < 1.0 or df <= 0:
        raise ValueError("t_quantile needs 0.5 < p < 1 and df > 0")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def paired_t_interval(diffs: list[float], level: float = 0.95) -> dict:
    """Two-sided `level` interval of the mean paired difference: mean ± t_{(1+level)/2, n-1} · s/√n."""
    n = len(diffs)
    if n < 2:
        raise ValueError("a confidence interval needs at least 2 paired differences")
    mean = fmean(diffs)
    sd = stdev(diffs)
    t = t_quantile(0.5 + level / 2.0, n - 1)
    half = t * sd / math.sqrt(n)
    return {"n": n, "mean_diff": mean, "sd_diff": sd, "df": n - 1, "t_crit": t, "low": mean - half,
            "high": mean + half, "level": level}
