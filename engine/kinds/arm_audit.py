"""arm_audit: every arm of a mechanism run, the control's included, is audited against its own declared
configuration and reference, update by update, from the run's arm record (methods/common/paired.py)."""

from __future__ import annotations

import math

from engine.kinds.base import Kind, kind
from engine.kinds.gradient_audit import RUN

ARM_NAME = {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,63}$"}
REFERENCE = {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{0,63}$"}
INPUT = {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,63}$"}
ARM = {
    "type": "object", "additionalProperties": False,
    "required": ["arm", "spec", "loss", "optimiser", "updates"],
    "properties": {
        "arm": ARM_NAME,
        "spec": {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{0,63}$",
                 "description": "the spec whose reference the arm's loss is held to (grpo for the control)"},
        "loss": {"type": "object", "additionalProperties": False, "required": ["reference", "inputs"],
                 "properties": {
                     "reference": REFERENCE | {"description": "registered float64 reference of the arm's loss"},
                     "inputs": {"type": "array", "minItems": 1, "maxItems": 16, "items": INPUT,
                                "description": "the recorded tensors it takes, in order"},
                     "args": {"type": "object", "description": "the arm's configuration the reference takes "
                              "(clip bounds, aggregation, coefficients)"}}},
        "advantages": {"type": "object", "additionalProperties": False, "required": ["reference"],
                       "properties": {
                           "reference": REFERENCE | {"description": "registered float64 reference: advantages "
                                                     "from the recorded rewards"},
                           "args": {"type": "object", "description": "its normalisation (group_size, eps)"}}},
        "optimiser": {"type": "object", "additionalProperties": False, "required": ["name", "lr"],
                      "properties": {"name": {"type": "string", "pattern": "^[A-Za-z][A-Za-z0-9_]{0,63}$"},
                                     "lr": {"type": "number", "exclusiveMinimum": 0}}},
        "updates": {"type": "integer", "minimum": 1, "description": "optimiser updates the arm takes per seed"},
    },
}


def _f64(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64) if x.is_floating_point() else x.detach().cpu()
    return x


def _value(out) -> tuple[float, float]:
    """A reference's loss and the size its error is relative to (a dict's `scale`, else 1)."""
    if isinstance(out, dict):
        return float(out["value"]), max(1.0, float(out.get("scale", 1.0)))
    if isinstance(out, (tuple, list)):
        out = out[0]
    return float(out), 1.0


def _masked_err(used, own, mask) -> float:
    import torch

    used, own = _f64(used), _f64(own)
    if tuple(used.shape) != tuple(own.shape):
        return math.inf
    m = mask.to("cpu", torch.bool)
    while m.dim() < own.dim():
        m = m[..., None]
    m = m.expand(own.shape)
    diff = (used - own).abs() / own.abs().clamp_min(1.0)
    diff = torch.where(m, torch.nan_to_num(diff, nan=math.inf), torch.zeros_like(diff))
    return float(diff.max()) if diff.numel() else 0.0


@kind
class ArmAudit(Kind):
    name = "arm_audit"
    description = ("Every arm of a mechanism run, the GRPO control's included, against the configuration the spec "
                   "declares for it: each optimiser update recorded what its loss was computed from and the loss "
                   "(methods/common/paired.py, record_update); the supervisor recomputes the loss with the arm's "
                   "own float64 reference and configuration (the grpo spec's for the control), the advantages "
                   "from the recorded rewards with the declared normalisation, and every log-probability the run "
                   "computed about its policy (the behaviour log-probs, a replay snapshot's scoring, a bank's base "
                   "scoring) from the arm's weights as they were when it sampled, kept by the shared sampler, "
                   "never from the run's own copy. Each update must move the arm's parameters, with the declared "
                   "optimiser and learning rate, and each arm takes its declared number of updates.")
    parameters = {
        "run": RUN,
        "run_params": {"type": "object", "description": "the params the run reads (its settings)"},
        "arms": {"type": "array", "minItems": 1, "maxItems": 8, "items": ARM,
                 "description": "each arm's declared configuration"},
    }
    required = ["run", "arms"]
    metrics = {"arms_missing": "declared arms without a recorded update",
               "unrecorded_updates": "optimiser steps with no loss record",
               "loss_max_scaled_err": "largest |loss - reference| / max(1, scale) (each a case naming seed, arm "
                                      "and update)",
               "advantages_max_err": "largest |advantages used - reference from the rewards| / max(1, |ref|)",
               "behaviour_max_err": "largest error of the behaviour log-probs against the sampling-time weights",
               "claims_max_err": "largest error of another recorded scoring against the sampling-time weights",
               "claims_unmatched": "recorded scorings whose sampling-time weights the record did not keep",
               "frozen_updates": "updates that left the arm's parameters unchanged",
               "min_param_change": "smallest parameter L2 change of an update",
               "optimiser_mismatches": "updates with another optimiser or learning rate than declared",
               "updates_differ": "sum over arms of |updates - declared|",
               "audited_updates": "updates recomputed", "cases": "1 (the run)"}

    def measure(self, impl, ctx, params):
        from engine.kinds import calls
        from engine.kinds.paired_control import _fresh, get_run
        from engine.spec import registry

        reg = registry.load()
        run_ctx = _fresh(ctx, params=dict(params.get("run_params") or {}))
        run_ctx.__dict__["paired_keep_states"] = True
        get_run(params["run"])(impl, run_ctx)
        if getattr(ctx, "audit", None) is not None and getattr(run_ctx, "audit", None) is not ctx.audit:
            ctx.audit.delegated += len(getattr(run_ctx.audit, "entries", ()) or ())
        record = run_ctx.__dict__.get("paired_record")
        arms = record.arms if record is not None else {}
        m = {"arms_missing": 0, "unrecorded_updates": 0, "loss_max_scaled_err": 0.0, "advantages_max_err": 0.0,
             "behaviour_max_err": 0.0, "claims_max_err": 0.0, "claims_unmatched": 0, "frozen_updates": 0,
             "min_param_change": math.inf, "optimiser_mismatches": 0, "updates_differ": 0, "audited_updates": 0}
        for decl in params["arms"]:
            name = decl["arm"]
            entry = arms.get(name)
            if entry is None or not entry.losses:
                m["arms_missing"] += 1
                continue
            m["updates_differ"] += abs(entry.updates - int(decl["updates"]))
            m["unrecorded_updates"] += max(0, entry.updates - len(entry.losses))
            ref = reg.get_reference(decl["loss"]["reference"])
            adv_ref = reg.get_reference(decl["advantages"]["reference"]) if "advantages" in decl else None
            opt = decl["optimiser"]
            for i, rec in enumerate(entry.losses):
                at = f"arm {name}, update {i + 1}"
                got = {}
                inputs = rec["inputs"]
                missing = [k for k in decl["loss"]["inputs"] if k not in inputs]
                if missing:
                    got["loss_max_scaled_err"] = math.inf
                    why = f"{at}: the record has no {', '.join(missing)}"
                else:
                    want, scale = _value(ref(*[_f64(inputs[k]) for k in decl["loss"]["inputs"]],
                                             **dict(decl["loss"].get("args") or {})))
                    err = abs(rec["loss"] - want) / scale
                    got["loss_max_scaled_err"] = math.inf if math.isnan(err) else err
                    why = f"{at}: loss {rec['loss']:.9g}, {decl['spec']}'s reference {want:.9g}"
                wheres = {"loss_max_scaled_err": why}
                if adv_ref is not None:
                    if "rewards" in inputs and "advantages" in inputs:
                        own = adv_ref(_f64(inputs["rewards"]), **dict(decl["advantages"].get("args") or {}))
                        used = _f64(inputs["advantages"])
                        got["advantages_max_err"] = (math.inf if used.shape != own.shape else
                                                     float(((used - own).abs() / own.abs().clamp_min(1.0)).max()))
                    else:
                        got["advantages_max_err"] = math.inf
                    wheres["advantages_max_err"] = at
                for c in rec["claims"]:
                    own = entry.rescore(c)
                    if own is None:
                        m["claims_unmatched"] += 1
                        continue
                    key = "behaviour_max_err" if c.name == "old_logp" else "claims_max_err"
                    err = _masked_err(c.used, own, c.mask)
                    if err >= got.get(key, 0.0):
                        got[key] = err
                        wheres[key] = f"{at}: {c.name}"
                step = rec["step"]
                if step < len(entry.changes):
                    change = entry.changes[step]
                    got["frozen_updates"] = int(not change > 0.0)
                    wheres["frozen_updates"] = at
                    m["min_param_change"] = min(m["min_param_change"], change)
                    oname, lr = entry.optimisers[step]
                    bad = oname != opt["name"] or not math.isclose(lr, float(opt["lr"]), rel_tol=1e-12)
                    got["optimiser_mismatches"] = int(bad)
                    wheres["optimiser_mismatches"] = f"{at}: {oname} lr {lr:g}"
                for key, v in got.items():
                    if key in ("frozen_updates", "optimiser_mismatches"):
                        m[key] += v
                    else:
                        m[key] = max(m[key], v)
                m["audited_updates"] += 1
                calls.log_case(ctx, 0, {}, got, wheres)
        if m["min_param_change"] == math.inf:
            m["min_param_change"] = 0.0
        return {**m, "cases": 1}
