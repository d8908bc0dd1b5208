"""identity: at a declared point (logp == old_logp) an output equals a closed form or another function's output."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind


@kind
class Identity(Kind):
    name = "identity"
    description = ("With inputs tied at a declared point (`tie`: input -> the input it is set equal to), the output "
                   "equals a constant (`equals_value`, at the True slots of `mask`) or another call's output "
                   "(`equals_call`), value and gradient.")
    parameters = {**CALL,
                  "tie": {"type": "object", "additionalProperties": NAME},
                  "alias": {"type": "boolean", "description": "tie by passing the very same tensor (grad and all)"},
                  "equals_value": {"type": "number"},
                  "equals_call": {"type": "object", "required": ["function", "args"], "properties": {
                      "function": NAME, "args": CALL["args"], "kwargs": CALL["kwargs"], "output": CALL["output"]}},
                  "mask": NAME,
                  "grad_wrt": {"type": "array", "items": NAME}}
    required = CALL_REQUIRED
    metrics = {"value_max_abs_diff": "largest |output - expected|", "grad_max_rel_diff":
               "largest gradient difference / max |expected gradient|", "cases": "cases"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls

        wrt = list(params.get("grad_wrt") or [])
        agg = {"value_max_abs_diff": 0.0}
        if wrt and params.get("equals_call"):
            agg["grad_max_rel_diff"] = 0.0
        n = 0
        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            tied = dict(drawn)
            for k, src in (params.get("tie") or {}).items():
                tied[k] = drawn[src].clone()
            t = calls.cast_all(ctx, tied)
            for k in wrt:
                t[k].requires_grad_(True)
            if params.get("alias"):
                for k, src in (params.get("tie") or {}).items():
                    t[k] = t[src]
            out = calls.call(impl, params, t)
            m, w = {}, {}
            if "equals_value" in params:
                d = (calls.as64(out) - float(params["equals_value"])).abs()
                if params.get("mask") and d.shape == drawn[params["mask"]].shape:
                    d = torch.where(drawn[params["mask"]].to(torch.bool), d, torch.zeros_like(d))
                m["value_max_abs_diff"], w["value_max_abs_diff"] = calls.worst(d)
            if params.get("equals_call"):
                t2 = calls.cast_all(ctx, tied)
                for k in wrt:
                    t2[k].requires_grad_(True)
                other = calls.call(impl, params["equals_call"], t2)
                v, ww = calls.worst((calls.as64(out) - calls.as64(other)).abs())
                if v >= m.get("value_max_abs_diff", 0.0):
                    m["value_max_abs_diff"], w["value_max_abs_diff"] = v, ww
                if wrt:
                    ga = calls.grad_of(out, [t[k] for k in wrt])
                    gb = calls.grad_of(other, [t2[k] for k in wrt])
                    m["grad_max_rel_diff"], w["grad_max_rel_diff"] = calls.grad_diff(wrt, ga, gb)
            calls.log_case(ctx, case, drawn, m, w, argument="tie " + ", ".join(
                f"{k}={v}" for k, v in (params.get("tie") or {}).items()))
            for k, v in m.items():
                agg[k] = max(agg.get(k, 0.0), v)
        return {**agg, "cases": n}
