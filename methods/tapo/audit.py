"""Audit of every TAPO proximal update of the mechanism run, on the run's own tensors.

Per update it checks what the formula-level contracts check on synthetic inputs, but on
the rollouts the run really trained on: the behaviour log-probs the update is measured
against are the behaviour policy's (re-scored from a copy kept at sampling time); the
ratio R~_t, the clip bounds eps_t and the loss with its gradient equal the float64 loops
of `reference.py`. It also records whether the mechanism acted: whether any later update
was off-policy (R~_t != 1) and on how many tokens the clip bound (zeroed the gradient).
"""

from __future__ import annotations

import math

import torch

from methods.common.rollout import sequence_logprobs
from methods.tapo import reference as ref
from methods.tapo.checks import lacks

# Check code, not a mutation target: it measures the mechanism run's updates against reference.py and
# decides nothing the run does (which log-probs an update uses is proximal.py's, in IMPL).
__mutate__ = False

# Relative distance to a clip bound inside which float32 may put a token on either side;
# such tokens are left out of the gradient comparison (as in the loss_forward contract).
_MARGIN = 1e-4


def _rows(x: torch.Tensor) -> list:
    return x.detach().to("cpu", torch.float64).tolist() if x.dtype != torch.bool else x.cpu().tolist()


def _bad(x: float) -> float:
    return math.inf if math.isnan(x) else x


class ProximalAudit:
    """Accumulates the worst errors and the mechanism's activity over a run's TAPO updates.

    Every figure it keeps is computed here from the tensors the update used (the log-probs, the behaviour
    log-probs, the advantages and the mask that crossed) and the float64 loops: the ratio extremes and clip
    counts of an update (what `update` returns) are the supervisor's, and the loss's metrics dict is only
    compared with them (the reported_metrics contract), never read as one of them. The loss's gradient is
    compared after the update's backward, on the gradient that backward really sent into the log-probs
    (`gradient`), not on a second vector-Jacobian call that a candidate could answer differently.
    """

    def __init__(self) -> None:
        self.updates = 0
        self.behaviour_err = 0.0
        self.ratio_err = 0.0
        self.loss_err = 0.0
        self.grad_err = 0.0
        self.eps_err = 0.0
        self.later_ratio_dev = 0.0
        self.later_updates = 0
        self.clipped_tokens = 0
        self.later_clipped_tokens = 0
        self.max_response_tokens = 0
        self.unmeasured: dict[str, str] = {}  # metric -> why (the implementation lacks the function it needs)
        self._pending = None

    def update(self, impl, behaviour, ro, k, logp, old_logp, adv, loss, eps_min, eps_max) -> dict:
        """The update's values against the float64 loops; returns the supervisor's figures of the update
        (ratio extremes, clip fractions, tokens, eps ends, and how many tokens sit within rounding of a bound)."""
        mask = ro.mask
        rows_m = _rows(mask)
        with torch.no_grad():
            behaviour_logp, _ = sequence_logprobs(behaviour, ro.prompts, ro.responses)
        self.behaviour_err = max(self.behaviour_err, _bad(float(torch.where(
            mask, (old_logp.double() - behaviour_logp.double()).abs(), torch.zeros((), dtype=torch.float64,
                                                                                 device=mask.device)).max())))
        rows_l, rows_o = _rows(logp), _rows(old_logp)
        arow = _rows(adv)
        adv_rows = [[a] * len(rows_m[0]) for a in arow]
        want_r = ref.prefix_ratio(rows_l, rows_o, rows_m)
        no_ratio, no_clip = lacks(impl, "trajectory_ratio"), lacks(impl, "length_aware_clip")
        if no_ratio:
            self.unmeasured["run_ratio_max_rel_err"] = no_ratio
        if no_clip:
            self.unmeasured["run_eps_max_abs_err"] = no_clip
        got_r = None if no_ratio else _rows(impl.trajectory_ratio(logp.detach(), old_logp, mask))
        want_l, want_g, near, scale = ref.loss_and_grad(rows_l, rows_o, adv_rows, rows_m, eps_min, eps_max, None, _MARGIN)
        self._pending = (want_g, near)
        self.loss_err = max(self.loss_err, _bad(abs(float(loss.detach()) - want_l)) / max(scale, 1e-300))
        ratios, outside, active, ambiguous, firsts, lasts = [], 0, 0, 0, [], []
        for b, mrow in enumerate(rows_m):
            T = sum(mrow)
            self.max_response_tokens = max(self.max_response_tokens, T)
            eps = ref.clip_eps(T, eps_min, eps_max) if T else []
            if T:
                firsts.append(eps[0])
                lasts.append(eps[-1])
            if T and not no_clip:
                got_eps = impl.length_aware_clip(T, eps_min, eps_max, dtype=logp.dtype, device=logp.device)
                got_eps = got_eps.detach().to("cpu", torch.float64).tolist()
                if len(got_eps) != T:
                    self.eps_err = math.inf
                else:
                    self.eps_err = max(self.eps_err, max(_bad(abs(x - y)) for x, y in zip(got_eps, eps)))
            t = 0
            for i, valid in enumerate(mrow):
                if not valid:
                    continue
                r = want_r[b][i]
                ratios.append(r)
                if got_r is not None:
                    self.ratio_err = max(self.ratio_err, _bad(abs(got_r[b][i] - r)) / r)
                e = eps[t]
                t += 1
                binds = (arow[b] > 0 and r > 1.0 + e) or (arow[b] < 0 and r < 1.0 - e)
                outside += int(r > 1.0 + e or r < 1.0 - e)
                active += int(binds)
                ambiguous += int(near[b][i])
                self.clipped_tokens += int(binds)
                if k > 0:
                    self.later_ratio_dev = max(self.later_ratio_dev, abs(r - 1.0))
                    self.later_clipped_tokens += int(binds)
        self.updates += 1
        self.later_updates += int(k > 0)
        n = len(ratios)
        return {"ratio_min": min(ratios, default=math.nan), "ratio_max": max(ratios, default=math.nan),
                "clip_fraction": outside / max(n, 1), "clip_active_fraction": active / max(n, 1), "tokens": n,
                "eps_lo": min(lasts, default=math.nan), "eps_hi": max(firsts, default=math.nan),
                "ambiguous_fraction": ambiguous / max(n, 1)}

    def gradient(self, upstream) -> None:
        """d loss / d logp as the update's backward sent it (None: none reached the log-probs), against the
        float64 loop's gradient; tokens within rounding of a clip bound are left out (their active set is
        ambiguous in float32, as in the loss_forward contract)."""
        want_g, near = self._pending
        self._pending = None
        got_g = _rows(upstream) if upstream is not None else [[0.0] * len(row) for row in want_g]
        gscale = max(abs(x) for row in want_g for x in row) or 1.0
        for b, row in enumerate(want_g):
            for i, w in enumerate(row):
                if not near[b][i]:
                    self.grad_err = max(self.grad_err, _bad(abs(got_g[b][i] - w)) / gscale)

    def measurements(self) -> dict:
        """The audit's figures; those in `unmeasured` are left out (the check declares them not applicable)."""
        return {k: v for k, v in self._all().items() if k not in self.unmeasured}

    def _all(self) -> dict:
        return {
            "audited_updates": self.updates,
            "later_updates": self.later_updates,
            "behaviour_logp_max_abs_err": self.behaviour_err,
            "run_ratio_max_rel_err": self.ratio_err,
            "run_loss_max_scaled_err": self.loss_err,
            "run_grad_max_rel_err": self.grad_err,
            "run_eps_max_abs_err": self.eps_err,
            "later_update_ratio_max_dev": self.later_ratio_dev,
            "clipped_tokens": self.clipped_tokens,
            "later_update_clipped_tokens": self.later_clipped_tokens,
            "max_response_tokens": self.max_response_tokens,
        }
