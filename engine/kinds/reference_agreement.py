"""reference_agreement: value (and gradient) of an interface function against a float64 reference."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind


@kind
class ReferenceAgreement(Kind):
    name = "reference_agreement"
    description = ("The declared output, and optionally its gradient w.r.t. named arguments, agree with a float64 "
                   "reference on the declared inputs; NaN in the reference marks a position it does not define. A "
                   "reference may return a dict: value, scale (what max_scaled_err divides by, e.g. mean |term| "
                   "of a loss that can cancel), grad (one tensor per grad_wrt), counts (named counts, summed), "
                   "scalars ({key: want}: the number the call reports under that key of its dict output "
                   "`metrics_output`, compared as KEY_abs_err).")
    parameters = {**CALL,
                  "reference": {**NAME, "pattern": "^[a-z][a-z0-9_.-]{0,63}$",
                                "description": "registered float64 reference, same arguments as the call"},
                  "grad_wrt": {"type": "array", "items": NAME, "maxItems": 8,
                               "description": "arguments whose gradient of sum(output) is compared"},
                  "grad_reference": {"type": "string", "description": "reference returning those gradients"},
                  "reference_gets_dtype": {"type": "boolean", "description": "pass dtype= (under test) to it"},
                  "metrics_output": {"type": "integer", "minimum": 0,
                                     "description": "index of the call's dict of reported numbers (for scalars)"},
                  "also": {"type": "array", "maxItems": 8, "description": "more calls on the same inputs, each "
                           "against its reference; their metrics are named prefix + metric (value only)",
                           "items": {"type": "object", "additionalProperties": False,
                                     "required": ["function", "args", "reference", "prefix"],
                                     "properties": {"function": NAME, "args": CALL["args"], "kwargs": CALL["kwargs"],
                                                    "output": CALL["output"], "reference": {"type": "string"},
                                                    "prefix": {"type": "string", "pattern": "^[a-z][a-z0-9]*_$"}}}}}
    required = CALL_REQUIRED + ["reference"]
    metrics = {"max_abs_err": "largest |got - want|", "max_rel_err": "largest |got - want| / |want|",
               "max_scaled_err": "largest |got - want| / max |want|", "grad_max_rel_err":
               "largest gradient error / max |want gradient|", "undefined_nonfinite":
               "non-finite outputs where the reference is undefined", "compared": "entries compared", "cases": "cases"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls
        from engine.spec import registry

        wrt = list(params.get("grad_wrt") or [])
        agg = {"max_abs_err": 0.0, "max_rel_err": 0.0, "max_scaled_err": 0.0, "undefined_nonfinite": 0,
               "compared": 0}
        if wrt:
            agg["grad_max_rel_err"] = 0.0
        n = 0
        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            t = calls.cast_all(ctx, drawn)
            for name in wrt:
                t[name].requires_grad_(True)
            with torch.set_grad_enabled(bool(wrt)):
                full = calls.call(impl, params, t, output="__raw__")
            out = calls.select(full, params.get("output"))
            ref_out = calls.reference(params, t, ctx=ctx)
            extra = ref_out if isinstance(ref_out, dict) else {}
            want = calls.as64(extra["value"] if extra else calls.select(ref_out, params.get("output")))
            got = calls.as64(out)
            got, want = torch.broadcast_tensors(got, want)
            defined = ~torch.isnan(want)
            err = torch.where(defined, (got - want).abs(), torch.zeros_like(got))
            err = torch.where(defined & torch.isnan(got), torch.full_like(got, float("inf")), err)
            abs_err, where = calls.worst(err)
            rel_err, _ = calls.worst(err / torch.where(defined, want.abs(), torch.ones_like(want)).clamp_min(1e-300))
            scale = float(extra["scale"]) if "scale" in extra else \
                float(want[defined].abs().max()) if bool(defined.any()) else 1.0
            m = {"max_abs_err": abs_err, "max_rel_err": rel_err, "max_scaled_err": abs_err / max(scale, 1e-300),
                 "undefined_nonfinite": int((~defined & ~torch.isfinite(got)).sum()), "compared": int(defined.sum())}
            w = {"max_abs_err": where}
            if wrt:
                grads = calls.grad_of(out, [t[k] for k in wrt])
                wg = extra["grad"] if "grad" in extra else calls.reference(params, t, params["grad_reference"], ctx)
                wg = list(wg) if isinstance(wg, (tuple, list)) else [wg]
                m["grad_max_rel_err"], w["grad_max_rel_err"] = calls.grad_diff(wrt, grads, wg)
            for sub in params.get("also") or []:
                if not registry.provides(impl, sub["function"]):  # an adapted framework loss: no separate ratio
                    ctx.not_applicable(f"no {sub['function']} in the implementation", sub["prefix"] + "max_abs_err",
                                       sub["prefix"] + "max_rel_err")
                    continue
                with torch.no_grad():
                    got2 = calls.as64(calls.call(impl, sub, t))
                want2 = calls.as64(calls.select(calls.reference(sub, t), sub.get("output")))
                ok2 = ~torch.isnan(want2)
                e2 = torch.where(ok2, (got2 - want2).abs(), torch.zeros_like(want2))
                e2 = torch.where(ok2 & torch.isnan(got2), torch.full_like(e2, float("inf")), e2)
                pre = sub["prefix"]
                m[pre + "max_abs_err"], w[pre + "max_abs_err"] = calls.worst(e2)
                m[pre + "max_rel_err"], w[pre + "max_rel_err"] = calls.worst(
                    e2 / torch.where(ok2, want2.abs(), torch.ones_like(want2)).clamp_min(1e-300))
            for k, v in (extra.get("counts") or {}).items():
                m[k] = int(v)
            if extra.get("scalars"):
                reported = full[params["metrics_output"]]
                for k, v in extra["scalars"].items():
                    got_k = float(reported[k]) if k in reported else float("nan")
                    m[k + "_abs_err"] = abs(got_k - float(v)) if got_k == got_k else float("inf")
            calls.log_case(ctx, case, drawn, m, w)
            for k, v in m.items():
                if k in ("undefined_nonfinite", "compared") or k in (extra.get("counts") or {}):
                    agg[k] = agg.get(k, 0) + v
                else:
                    agg[k] = max(agg.get(k, 0.0), v)
        return {**agg, "cases": n}
