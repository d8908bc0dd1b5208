"""precision: the dtype under test agrees with the same call in float64, and results come back in declared dtypes."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind


@kind
class Precision(Kind):
    name = "precision"
    description = ("The call in the dtype under test (float32, bfloat16, float16) agrees with the same call on the "
                   "same (cast) inputs in float64, value and gradient; the output's dtype is the declared one.")
    parameters = {**CALL,
                  "grad_wrt": {"type": "array", "items": NAME},
                  "result_dtype": {"type": "object", "additionalProperties": {"enum": [
                      "float16", "bfloat16", "float32", "float64", "same"]},
                      "description": "dtype under test -> dtype the output must have"},
                  "mask": {**NAME, "description": "only positions where this input is True are compared"}}
    required = CALL_REQUIRED
    metrics = {"max_rel_err": "largest |low - f64| / max |f64|", "grad_max_rel_err": "same for the gradient",
               "grad_max_abs_err": "largest |low - f64| of the gradient",
               "dtype_mismatches": "outputs of another dtype than declared", "cases": "cases"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls

        wrt = list(params.get("grad_wrt") or [])
        names = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "float64": torch.float64}
        agg = {"max_rel_err": 0.0, "dtype_mismatches": 0}
        if wrt:
            agg["grad_max_rel_err"] = agg["grad_max_abs_err"] = 0.0
        n = 0

        def run(t):
            t = {k: (v.detach().clone().requires_grad_(True) if k in wrt else v) for k, v in t.items()}
            with torch.set_grad_enabled(bool(wrt)):
                out = calls.call(impl, params, t)
            grads = calls.grad_of(out, [t[k] for k in wrt]) if wrt else []
            return out, grads

        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            low = calls.cast_all(ctx, drawn)
            # float64 on exactly the values the low-precision call received
            high = {k: (v.detach().to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                    for k, v in low.items()}
            o_low, g_low = run(low)
            o_high, g_high = run(high)
            declared = (params.get("result_dtype") or {}).get(str(ctx.dtype).replace("torch.", ""))
            mismatch = 0
            if declared:
                want = ctx.dtype if declared == "same" else names[declared]
                mismatch = int(o_low.dtype != want)
            a, b = calls.as64(o_low), calls.as64(o_high)
            keep = None
            if params.get("mask") and a.shape == drawn[params["mask"]].shape:
                keep = drawn[params["mask"]].to(torch.bool)
                a, b = torch.where(keep, a, torch.zeros_like(a)), torch.where(keep, b, torch.zeros_like(b))
            scale = max(float(b.abs().max()) if b.numel() else 0.0, 1e-300)
            err, where = calls.worst((a - b).abs() / scale)
            m = {"max_rel_err": err, "dtype_mismatches": mismatch}
            w = {"max_rel_err": where}
            if wrt:
                m["grad_max_rel_err"], w["grad_max_rel_err"] = calls.grad_diff(wrt, g_low, g_high)
                m["grad_max_abs_err"], w["grad_max_abs_err"] = calls.grad_diff(wrt, g_low, g_high, relative=False)
            calls.log_case(ctx, case, drawn, m, w)
            for k, v in m.items():
                agg[k] = agg[k] + v if k == "dtype_mismatches" else max(agg[k], v)
        return {**agg, "cases": n}
