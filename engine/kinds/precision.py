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
                  "mask": {**NAME, "description": "only positions where this input is True are compared"},
                  "scale_floor": {"type": "number", "minimum": 0, "description": "max_rel_err divides by "
                                  "max(scale_floor, max |f64|): absolute for O(1) outputs, relative for large ones"},
                  "also": {"type": "array", "maxItems": 8, "description": "more calls compared the same way on the "
                           "same inputs (value only; metrics PREFIX + max_abs_err / max_rel_err)",
                           "items": {"type": "object", "additionalProperties": False,
                                     "required": ["function", "args", "prefix"],
                                     "properties": {"function": NAME, "args": CALL["args"], "kwargs": CALL["kwargs"],
                                                    "output": CALL["output"],
                                                    "prefix": {"type": "string", "pattern": "^[a-z][a-z0-9]*_$"}}}}}
    required = CALL_REQUIRED
    metrics = {"max_rel_err": "largest |low - f64| / max(scale_floor, max |f64|)", "max_abs_err":
               "largest |low - f64|", "grad_max_rel_err": "same for the gradient",
               "grad_max_abs_err": "largest |low - f64| of the gradient",
               "dtype_mismatches": "outputs of another dtype than declared", "cases": "cases"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls

        wrt = list(params.get("grad_wrt") or [])
        names = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "float64": torch.float64}
        agg = {"max_rel_err": 0.0, "max_abs_err": 0.0, "dtype_mismatches": 0}
        floor = float(params.get("scale_floor", 1e-300))

        def compare(o_low, o_high, drawn, m, w, pre=""):
            a, b = calls.as64(o_low), calls.as64(o_high)
            if params.get("mask"):
                keep = calls.mask_like(drawn[params["mask"]], a)
                if keep is not None:
                    a, b = torch.where(keep, a, torch.zeros_like(a)), torch.where(keep, b, torch.zeros_like(b))
            # NaN counts as infinitely wrong, never as a scale (max() would drop a NaN error when aggregating)
            scale = max(float(torch.nan_to_num(b.abs(), nan=0.0, posinf=0.0).max()) if b.numel() else 0.0, floor)
            m[pre + "max_abs_err"], w[pre + "max_abs_err"] = calls.worst((a - b).abs())
            m[pre + "max_rel_err"], w[pre + "max_rel_err"] = m[pre + "max_abs_err"] / scale, w[pre + "max_abs_err"]

        if wrt:
            agg["grad_max_rel_err"] = agg["grad_max_abs_err"] = 0.0
        n = 0

        def run(t):
            t = {k: (v.detach().clone().requires_grad_(True) if k in wrt else v) for k, v in t.items()}
            out = calls.call(impl, params, t)  # grad mode as a caller has it: nothing recorded without grad_wrt
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
            m, w = {"dtype_mismatches": mismatch}, {}
            compare(o_low, o_high, drawn, m, w)
            for sub in params.get("also") or []:
                compare(calls.call(impl, sub, low), calls.call(impl, sub, high), drawn, m, w, sub["prefix"])
            if wrt:
                m["grad_max_rel_err"], w["grad_max_rel_err"] = calls.grad_diff(wrt, g_low, g_high)
                m["grad_max_abs_err"], w["grad_max_abs_err"] = calls.grad_diff(wrt, g_low, g_high, relative=False)
            calls.log_case(ctx, case, drawn, m, w)
            for k, v in m.items():
                agg[k] = agg[k] + v if k == "dtype_mismatches" else max(agg.get(k, 0.0), v)
        return {**agg, "cases": n}
