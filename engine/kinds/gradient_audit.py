"""gradient_audit: the gradient a training run's update leaves in the supervisor's policy is the autograd of the
declared scoring, per update and arm (engine/run/run_audit.py does the comparing)."""

from __future__ import annotations

from engine.kinds.base import Kind, kind

RUN = {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{0,63}$",
       "description": "registered run (engine.kinds.paired_control.paired_run) whose every update is audited"}
TOLERANCE = {"type": "object", "additionalProperties": False,
             "properties": {
                 "min_cosine": {"type": "number", "minimum": -1, "maximum": 1,
                                "description": "cosine of the policy's parameter gradient with the supervisor's"},
                 "max_rel_err": {"type": "number", "minimum": 0,
                                 "description": "|gradient - supervisor's| / |supervisor's| (L2 over every "
                                 "trained parameter)"},
                 "max_value_err": {"type": "number", "minimum": 0,
                                   "description": "largest |used - scored| / max(1, |scored|) at valid positions "
                                   "of a tensor the loss was computed from"}}}


@kind
class GradientAudit(Kind):
    name = "gradient_audit"
    description = ("Every optimiser update of a training run, in every arm (the control's included): the values "
                   "its loss was computed from equal the supervisor's own scoring of the same tokens by the "
                   "interface's declared convention (a float64 copy of the policy), and the gradient the backward "
                   "left in the policy's parameters (before the optimiser step) equals the supervisor's autograd "
                   "of that scoring with the same upstream gradient (J^T d loss/d used): cosine and relative "
                   "error within `tolerances`, per dtype of the policy. Where a candidate scores the policy "
                   "through a handle, that gradient is its own vector-Jacobian product. The same audit, with "
                   "these tolerances, runs in every other contract's runs: an update outside them fails that "
                   "contract too, naming seed, arm and update.")
    parameters = {
        "run": RUN,
        "run_params": {"type": "object", "description": "the params the run reads (its settings)"},
        "arms": {"type": "array", "minItems": 1, "maxItems": 8, "uniqueItems": True,
                 "items": {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,63}$"},
                 "description": "arms that must each have audited updates (default: every arm the run has)"},
        "tolerances": {"type": "object", "minProperties": 1, "additionalProperties": False,
                       "properties": {d: TOLERANCE for d in ("float64", "float32", "bfloat16", "float16")},
                       "description": "per dtype of the policy's parameters; a figure left out takes the "
                       "default (engine/run/run_audit.py)"},
    }
    required = ["run", "tolerances"]
    metrics = {"audit_failures": "updates outside the tolerances (each a failing case naming seed, arm and update)",
               "audited_updates": "updates audited", "unaudited_updates": "optimiser steps of the run's arms that "
               "were not audited", "arms_unaudited": "arms (of `arms`) without an audited update",
               "grad_min_cosine": "smallest cosine over the updates", "grad_max_rel_err": "largest relative error",
               "value_max_err": "largest value error", "cases": "1 (the run)"}

    def measure(self, impl, ctx, params):
        import math

        from engine.kinds import calls
        from engine.kinds.paired_control import _fresh, get_run
        from engine.run.run_audit import RunAudit, tolerances_of

        tol = tolerances_of([{"kind": self.name, "params": params}])
        audit = RunAudit(tolerances=tol, seed=ctx.seed)
        run_ctx = _fresh(ctx, params=dict(params.get("run_params") or {}), audit=audit)
        get_run(params["run"])(impl, run_ctx)
        if getattr(ctx, "audit", None) is not None:  # the runner sees that this contract's run was audited
            ctx.audit.delegated += len(audit.entries)
        record = run_ctx.__dict__.get("paired_record")
        steps = {name: a.updates for name, a in record.arms.items()} if record is not None else {}
        arms = list(params.get("arms") or steps or audit.per_arm)
        unaudited = sum(max(0, n - audit.per_arm.get(a, 0)) for a, n in steps.items())
        for e in audit.entries:
            at = f"arm {e['arm']}, update {e['update']}" + (f" ({e['where']})" if e["where"] else "")
            calls.log_case(ctx, 0, {}, {"audit_failures": int(bool(e["why"])), "grad_cosine": e["grad_cosine"],
                                        "grad_rel_err": e["grad_rel_err"], "value_max_err": e["value_max_err"]},
                           {"audit_failures": at + (": " + "; ".join(e["why"]) if e["why"] else ""),
                            "grad_cosine": at, "grad_rel_err": at, "value_max_err": at})
        ent = audit.entries
        return {"audit_failures": len(audit.failures()), "audited_updates": len(ent),
                "unaudited_updates": unaudited,
                "arms_unaudited": sum(1 for a in arms if audit.per_arm.get(a, 0) == 0),
                "grad_min_cosine": min((e["grad_cosine"] for e in ent), default=math.nan),
                "grad_max_rel_err": max((e["grad_rel_err"] for e in ent), default=math.nan),
                "value_max_err": max((e["value_max_err"] for e in ent), default=math.nan), "cases": 1}
