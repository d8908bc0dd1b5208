"""The supervisor's audit of a training run: every gradient that reaches one of its objects, every number a
candidate reports about itself.

Two things a mechanism run could take from the candidate without noticing:

* **a gradient.** When the candidate scores the supervisor's policy through a handle, what reaches the
  policy's parameters in `backward` is the candidate's vector-Jacobian product (engine/run/boundary.py,
  `_Cross`): the values it returned can be exact while the gradient is anything (negated, reversed, zero on
  later updates). So around each update's backward the run names what its loss was computed from (`Scored`:
  the tensor used, the supervisor's own scoring of the same tokens by the interface's declared convention, the
  valid positions). Hooks keep the gradient each such tensor received in that very backward (the upstream,
  d loss / d used); afterwards the supervisor scores a float64 copy of the policy itself, compares the values
  with the ones used, and compares its own parameter gradient, J^T upstream by its own autograd, with what the
  backward left in the policy's `.grad` (before the optimiser step): cosine and relative error, per update.
  The reference is float64 so that it is far more exact than the tolerance it is held to: what the tolerance
  absorbs is the float32 arithmetic of an honest run, nothing of the reference's.
* **a metric.** A loss's metrics dict is the candidate's report about itself. A run computes every figure it
  judges from the tensors that crossed; `report` keeps the candidate's number beside the supervisor's, for the
  reported_metrics kind to compare. Nothing recorded here is ever read as a measurement.

The audit is on in every run (the runner puts one on every check's context, with the tolerances of the spec's
gradient_audit contracts), so a candidate cannot behave in the run that is audited and not in the one that is
judged: one process of the candidate serves a whole `check`, and could count runs.
"""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

# The benchmark's switch (benchmarks/audit_bench.py measures a check with the audits against one without, in one
# process): no command line, environment variable or file sets it, and the candidate's process cannot reach it.
# Off, the upstream gradients are still captured (the runs' own loss-gradient checks read them) but no update is
# compared and no report kept.
ENABLED = True

# Per dtype of the policy's parameters: the parameter gradient's cosine with the float64 autograd at least
# min_cosine, its relative error (|g - g_ref| / |g_ref|) at most max_rel_err, and every value the loss used within
# max_value_err of the supervisor's scoring (|used - own| / max(1, |own|)). float32: an honest run measures
# relative errors of about 1e-6 and value errors of about 1e-7 (docs/kinds.md, gradient_audit); a negated gradient
# has cosine -1, a temperature-2 scoring value errors of about 0.3.
DEFAULT_TOLERANCES: dict[str, dict[str, float]] = {
    "float64": {"min_cosine": 0.999999, "max_rel_err": 1.0e-6, "max_value_err": 1.0e-9},
    "float32": {"min_cosine": 0.9999, "max_rel_err": 1.0e-3, "max_value_err": 1.0e-4},
    "bfloat16": {"min_cosine": 0.99, "max_rel_err": 5.0e-2, "max_value_err": 5.0e-2},
    "float16": {"min_cosine": 0.999, "max_rel_err": 1.0e-2, "max_value_err": 1.0e-2},
}


@dataclass
class Scored:
    """One tensor an update's loss was computed from, and how the supervisor scores the same thing itself.

    `used` is the tensor the loss read (the candidate's, returned through a handle, or the supervisor's own);
    `score(module)` is the declared scoring of the same tokens by `module` (a float64 copy of the policy); `mask`
    marks the valid positions (its dims lead `used`'s: [B, T] for [B, T] log-probs or [B, T, V] distributions):
    values are compared there, and only the upstream gradient there enters the supervisor's gradient (the paper's
    gradient sums over response tokens; gradient a loss sends into padding is not the paper's)."""

    name: str
    used: torch.Tensor
    score: Callable[[torch.nn.Module], torch.Tensor]
    mask: torch.Tensor


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _expand(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    m = mask.to(device=like.device, dtype=torch.bool)
    while m.dim() < like.dim():
        m = m[..., None]
    return m.expand(like.shape)


def _hookless_copy(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A deep copy of `module` in `dtype` without the hooks put on it (a run's own watchers: the copy's forward
    must not count as the policy's)."""
    memo: dict[int, Any] = {}
    for m in module.modules():
        for key, value in vars(m).items():
            if "hook" in key and isinstance(value, dict):
                memo[id(value)] = type(value)()
    for p in module.parameters():  # the live gradients are not the copy's
        if p.grad is not None:
            memo[id(p.grad)] = None
    ref = copy.deepcopy(module, memo)
    for p in ref.parameters():
        p.grad = None
    return ref.to(dtype)


class RunAudit:
    """The audit of one check's runs: per update, the gradient comparison; per reported key, the two figures."""

    def __init__(self, tolerances: dict | None = None, seed: int | None = None,
                 reference_dtype: torch.dtype = torch.float64):
        self.tolerances = {**DEFAULT_TOLERANCES, **(tolerances or {})}
        self.seed = seed
        self.reference_dtype = reference_dtype
        self.entries: list[dict] = []  # one per audited update
        self.reported: list[dict] = []  # one per reported key compared
        self.per_arm: dict[str, int] = {}
        self.delegated = 0  # updates a kind audited under an audit of its own run (gradient_audit, reported_metrics)
        self._refs: list[tuple[torch.nn.Module, torch.nn.Module]] = []

    # -- gradients --------------------------------------------------------------------------------

    @contextmanager
    def backward(self, *, arm: str, policy: torch.nn.Module, scored: list[Scored],
                 where: str = "") -> Iterator[dict[str, torch.Tensor]]:
        """`with audit.backward(...) as upstream: loss.backward()`: the hooks keep each scored tensor's gradient
        from that backward (readable in `upstream` afterwards); on leaving, the update is audited."""
        upstream: dict[str, torch.Tensor] = {}
        handles = []
        for s in scored:
            if isinstance(s.used, torch.Tensor) and s.used.requires_grad:
                def keep(g, name=s.name):
                    upstream[name] = g.detach().clone() if name not in upstream else upstream[name] + g.detach()
                handles.append(s.used.register_hook(keep))
        try:
            yield upstream
        finally:
            for h in handles:
                h.remove()
        if ENABLED:
            self._audit(arm, policy, scored, upstream, where)

    def _reference(self, policy: torch.nn.Module) -> torch.nn.Module:
        ref = next((r for p, r in self._refs if p is policy), None)
        if ref is None:
            ref = _hookless_copy(policy, self.reference_dtype)
            self._refs.append((policy, ref))
        with torch.no_grad():
            for a, b in zip(ref.parameters(), policy.parameters()):
                a.copy_(b)
            for a, b in zip(ref.buffers(), policy.buffers()):
                a.copy_(b)
        ref.train(policy.training)
        return ref

    def _audit(self, arm: str, policy: torch.nn.Module, scored: list[Scored], upstream: dict, where: str) -> None:
        self.per_arm[arm] = self.per_arm.get(arm, 0) + 1
        dtype = _dtype_name(next(iter(policy.parameters())).dtype)
        tol = self.tolerances.get(dtype) or self.tolerances["float32"]
        ref = self._reference(policy)
        value_err = 0.0
        total = None
        shapes_ok = True
        with torch.enable_grad():
            for s in scored:
                own = s.score(ref)
                used = s.used.detach()
                if tuple(own.shape) != tuple(used.shape):
                    value_err, shapes_ok = math.inf, False
                    continue
                m = _expand(s.mask, own)
                diff = (used.to(own.dtype) - own.detach()).abs() / own.detach().abs().clamp_min(1.0)
                diff = torch.where(m, torch.nan_to_num(diff, nan=math.inf), torch.zeros_like(diff))
                value_err = max(value_err, float(diff.max()) if diff.numel() else 0.0)
                g = upstream.get(s.name)
                if g is not None and tuple(g.shape) == tuple(own.shape):
                    g = torch.where(m, g.to(own.dtype), torch.zeros_like(own))
                    term = (own * g).sum()
                    total = term if total is None else total + term
            pairs = [(p, r) for p, r in zip(policy.parameters(), ref.parameters()) if p.requires_grad]
            if total is not None and total.requires_grad:
                own_g = torch.autograd.grad(total, [r for _, r in pairs], allow_unused=True)
            else:
                own_g = [None] * len(pairs)
        dot = own_sq = got_sq = diff_sq = 0.0
        finite = True
        for (p, r), o in zip(pairs, own_g):
            o = torch.zeros_like(r) if o is None else o.detach()
            c = torch.zeros_like(r) if p.grad is None else p.grad.detach().to(r.dtype)
            if c.shape != o.shape:
                finite = False
                continue
            finite = finite and bool(torch.isfinite(c).all())
            dot += float((c * o).sum())
            own_sq += float((o * o).sum())
            got_sq += float((c * c).sum())
            diff_sq += float(((c - o) ** 2).sum())
        own_n, got_n = math.sqrt(own_sq), math.sqrt(got_sq)
        if not finite:
            cosine, rel = -math.inf, math.inf
        elif own_n == 0.0 and got_n == 0.0:
            cosine, rel = 1.0, 0.0
        elif own_n == 0.0 or got_n == 0.0:
            cosine, rel = 0.0, math.inf if own_n == 0.0 else 1.0
        else:
            cosine, rel = dot / (own_n * got_n), math.sqrt(diff_sq) / own_n
        broken = []  # (figure, value, text): what is outside its tolerance
        if not shapes_ok:
            broken.append(("value_max_err", value_err, "a tensor the loss used is not of the shape the declared "
                           "scoring gives"))
        elif not value_err <= tol["max_value_err"]:
            broken.append(("value_max_err", value_err, f"values the loss used differ from the declared scoring by "
                           f"{value_err:.3g} (max {tol['max_value_err']:g})"))
        if not cosine >= tol["min_cosine"]:
            broken.append(("grad_cosine", cosine, f"the policy's gradient has cosine {cosine:.4f} with the "
                           f"supervisor's autograd of the declared scoring (min {tol['min_cosine']:g})"))
        if not rel <= tol["max_rel_err"]:
            broken.append(("grad_rel_err", rel, f"relative error {rel:.3g} (max {tol['max_rel_err']:g})"))
        self.entries.append({"seed": self.seed, "arm": arm, "update": self.per_arm[arm], "where": where,
                             "dtype": dtype, "value_max_err": value_err, "grad_cosine": cosine,
                             "grad_rel_err": rel, "grad_norm": got_n, "reference_grad_norm": own_n,
                             "why": [text for _, _, text in broken],
                             "broken": [(figure, value) for figure, value, _ in broken]})

    def failures(self) -> list[dict]:
        return [e for e in self.entries if e["why"]]

    @staticmethod
    def describe(entry: dict) -> str:
        """`seed 43, arm tapo, update 4 (group 1, k 1): ...`: where it was and what broke."""
        at = f" ({entry['where']})" if entry.get("where") else ""
        return (f"seed {entry['seed']}, arm {entry['arm']}, update {entry['update']}{at}: "
                + "; ".join(entry["why"]))

    # -- reported metrics -------------------------------------------------------------------------

    def report(self, *, arm: str, function: str, key: str, reported: Any, measured: Any, slack: float = 0.0,
               where: str = "", update: int | None = None) -> None:
        """Keep the candidate's `reported` figure (None: it reported none) beside the supervisor's `measured`
        one. `slack`: how far an honest report may sit from it (tokens within rounding of a clip bound, which
        float32 may put on either side, as a share of the tokens). The error is the distance beyond the slack,
        over max(1, |measured|); tensors compare element by element, their shapes must match. `update`: the
        arm's update it belongs to (default: the next one to be audited, for a report taken before its backward)."""
        if not ENABLED:
            return
        self.reported.append({"seed": self.seed, "arm": arm,
                              "update": update if update is not None else self.per_arm.get(arm, 0) + 1,
                              "where": where, "function": function, "key": key,
                              "error": _report_error(reported, measured, slack),
                              "missing": reported is None})


def _report_error(reported: Any, measured: Any, slack: float) -> float:
    if reported is None:
        return 0.0
    try:
        got = torch.as_tensor(reported.detach() if isinstance(reported, torch.Tensor) else reported,
                              dtype=torch.float64).cpu()
        want = torch.as_tensor(measured.detach() if isinstance(measured, torch.Tensor) else measured,
                               dtype=torch.float64).cpu()
    except (TypeError, ValueError, RuntimeError):
        return math.inf
    if got.shape != want.shape:
        return math.inf
    if got.numel() == 0:
        return 0.0
    err = ((got - want).abs() - slack).clamp_min(0.0) / want.abs().clamp_min(1.0)
    both_nan = torch.isnan(got) & torch.isnan(want)
    err = torch.where(both_nan, torch.zeros_like(err), torch.nan_to_num(err, nan=math.inf))
    return float(err.max())


def handle_gradients(impl: Any) -> int:
    """How often a candidate's vector-Jacobian product has reached an object of the checks so far (0 for an
    implementation that runs here): counted by each candidate process's connection (engine/run/boundary.py)."""
    conns = {id(c): c for c in (getattr(getattr(impl, n, None), "conn", None) for n in getattr(impl, "functions", ()))
             if c is not None}
    return sum(int(getattr(c, "handle_gradients", 0)) for c in conns.values())


def of(ctx: Any) -> RunAudit:
    """The audit of the check `ctx` belongs to (the runner puts one there); a check called without the runner
    gets one with the default tolerances."""
    audit = getattr(ctx, "audit", None)
    if audit is None:
        audit = RunAudit(seed=getattr(ctx, "seed", None))
        try:
            ctx.audit = audit
        except AttributeError:  # a frozen or slotted context: the audit still runs, for this call only
            pass
    return audit


def tolerances_of(contracts: list[dict]) -> dict:
    """The tolerances the spec's gradient_audit contracts declare (each over the defaults of its dtype); with
    several, the strictest of each figure."""
    out: dict[str, dict[str, float]] = {}
    for c in contracts:
        if c.get("kind") != "gradient_audit":
            continue
        for dtype, tol in ((c.get("params") or {}).get("tolerances") or {}).items():
            full = {**DEFAULT_TOLERANCES.get(dtype, DEFAULT_TOLERANCES["float32"]), **tol}
            have = out.get(dtype)
            out[dtype] = full if have is None else {
                "min_cosine": max(have["min_cosine"], full["min_cosine"]),
                "max_rel_err": min(have["max_rel_err"], full["max_rel_err"]),
                "max_value_err": min(have["max_value_err"], full["max_value_err"])}
    return out
