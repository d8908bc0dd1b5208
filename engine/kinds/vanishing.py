"""vanishing: under a declared condition (a gate of 0, all-zero advantages) value and gradient are exactly 0."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind


@kind
class Vanishing(Kind):
    name = "vanishing"
    description = ("With the declared arguments set to the declared values (`set`), the output and its gradient "
                   "w.r.t. `grad_wrt` are exactly 0; the unchanged call is the negative control and must not vanish.")
    parameters = {**CALL,
                  "set": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "number"},
                          "description": "input name -> value it is filled with"},
                  "grad_wrt": {"type": "array", "items": NAME}}
    required = CALL_REQUIRED + ["set"]
    metrics = {"value_max_abs": "largest |output| under the condition", "grad_max_abs":
               "largest |gradient| under the condition", "control_nonzero": "cases whose unchanged call does not "
               "vanish", "cases": "cases"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls

        wrt = list(params.get("grad_wrt") or [])
        agg = {"value_max_abs": 0.0, "grad_max_abs": 0.0, "control_nonzero": 0}
        n = 0

        def run(t):
            t = {k: (v.detach().clone().requires_grad_(True) if k in wrt else v) for k, v in t.items()}
            out = calls.call(impl, params, t)
            grads = calls.grad_of(out, [t[k] for k in wrt]) if wrt and out.requires_grad else \
                [torch.zeros_like(t[k]) for k in wrt]
            return calls.as64(out), [calls.as64(g) for g in grads]

        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            cond = {k: (torch.full_like(v, float(params["set"][k])) if k in params["set"] else v)
                    for k, v in drawn.items()}
            out, grads = run(calls.cast_all(ctx, cond))
            c_out, c_grads = run(calls.cast_all(ctx, drawn))
            v, wv = calls.worst(out.abs())
            gm, wg = calls.grad_diff(wrt, grads, [torch.zeros_like(g) for g in grads], relative=False)
            control = int(float(c_out.abs().max()) > 0 or any(float(g.abs().max()) > 0 for g in c_grads))
            m = {"value_max_abs": v, "grad_max_abs": gm, "control_nonzero": control}
            calls.log_case(ctx, case, drawn, m, {"value_max_abs": wv, "grad_max_abs": wg},
                           argument="set " + ", ".join(f"{k}={x}" for k, x in params["set"].items()))
            agg["value_max_abs"] = max(agg["value_max_abs"], v)
            agg["grad_max_abs"] = max(agg["grad_max_abs"], gm)
            agg["control_nonzero"] += control
        return {**agg, "cases": n}
