"""reference_agreement: value (and gradient) of an interface function against a float64 reference."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind


@kind
class ReferenceAgreement(Kind):
    name = "reference_agreement"
    description = ("The declared output, and optionally its gradient w.r.t. named arguments, agree with a float64 "
                   "reference on the declared inputs; NaN in the reference marks a position it does not define.")
    parameters = {**CALL,
                  "reference": {**NAME, "pattern": "^[a-z][a-z0-9_.-]{0,63}$",
                                "description": "registered float64 reference, same arguments as the call"},
                  "grad_wrt": {"type": "array", "items": NAME, "maxItems": 8,
                               "description": "arguments whose gradient of sum(output) is compared"},
                  "grad_reference": {"type": "string", "description": "reference returning those gradients"}}
    required = CALL_REQUIRED + ["reference"]
    metrics = {"max_abs_err": "largest |got - want|", "max_rel_err": "largest |got - want| / |want|",
               "max_scaled_err": "largest |got - want| / max |want|", "grad_max_rel_err":
               "largest gradient error / max |want gradient|", "undefined_nonfinite":
               "non-finite outputs where the reference is undefined", "compared": "entries compared", "cases": "cases"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls

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
                out = calls.call(impl, params, t)
            want = calls.as64(calls.select(calls.reference(params, t), params.get("output")))
            got = calls.as64(out)
            got, want = torch.broadcast_tensors(got, want)
            defined = ~torch.isnan(want)
            err = torch.where(defined, (got - want).abs(), torch.zeros_like(got))
            err = torch.where(defined & torch.isnan(got), torch.full_like(got, float("inf")), err)
            abs_err, where = calls.worst(err)
            rel_err, _ = calls.worst(err / torch.where(defined, want.abs(), torch.ones_like(want)).clamp_min(1e-300))
            scale = float(want[defined].abs().max()) if bool(defined.any()) else 1.0
            m = {"max_abs_err": abs_err, "max_rel_err": rel_err, "max_scaled_err": abs_err / max(scale, 1e-300),
                 "undefined_nonfinite": int((~defined & ~torch.isfinite(got)).sum()), "compared": int(defined.sum())}
            w = {"max_abs_err": where}
            if wrt:
                grads = calls.grad_of(out, [t[k] for k in wrt])
                wg = calls.reference(params, t, params["grad_reference"])
                wg = list(wg) if isinstance(wg, (tuple, list)) else [wg]
                g_err = 0.0
                for gname, g, ref_g in zip(wrt, grads, wg):
                    ref_g = calls.as64(ref_g)
                    ok = ~torch.isnan(ref_g)
                    gscale = float(ref_g[ok].abs().max()) if bool(ok.any()) else 1.0
                    d = torch.where(ok, (calls.as64(g) - ref_g).abs(), torch.zeros_like(ref_g)) / (gscale or 1.0)
                    v, gw = calls.worst(d)
                    if v >= g_err:
                        g_err, w["grad_max_rel_err"] = v, {gname: gw}
                m["grad_max_rel_err"] = g_err
            calls.log_case(ctx, case, drawn, m, w)
            for k, v in m.items():
                agg[k] = agg[k] + v if k in ("undefined_nonfinite", "compared") else max(agg[k], v)
        return {**agg, "cases": n}
