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
                  "result_dtype": {"type": "object", "additionalProperties": {"enum": [
                      "float16", "bfloat16", "float32", "float64", "same"]},
                      "description": "dtype under test -> dtype the output must have (dtype_mismatches)"},
                  "bounds": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "number"},
                             "description": "[low, high]: outputs outside are counted (out_of_bounds)"},
                  "metrics_output": {"type": "integer", "minimum": 0,
                                     "description": "index of the call's dict of reported numbers (for scalars)"},
                  "also": {"type": "array", "maxItems": 8, "description": "more calls on the same inputs, each "
                           "against its reference; their metrics are named prefix + metric (value only)",
                           "items": {"type": "object", "additionalProperties": False,
                                     "required": ["function", "args", "reference", "prefix"],
                                     "properties": {"function": NAME, "args": CALL["args"], "kwargs": CALL["kwargs"],
                                                    "output": CALL["output"], "reference": {"type": "string"},
                                                    "key": {"type": "string", "description": "a key of the "
                                                            "selected output (a metrics dict) to compare"},
                                                    "prefix": {"type": "string", "pattern": "^[a-z][a-z0-9]*_$"}}}},
                  "keys_agree": {"type": "object", "additionalProperties": False,
                                 "required": ["output", "reference", "keys"],
                                 "description": "a dict the call also returns (e.g. its metrics) against a "
                                 "reference dict on the same arguments, key by key; NaN in the reference marks a "
                                 "key it does not define for that case (a count at a tie with a bound)",
                                 "properties": {"output": {"type": "integer", "minimum": 0},
                                                "reference": {"type": "string"},
                                                "keys": {"type": "array", "items": {"type": "string"},
                                                         "minItems": 1, "maxItems": 32},
                                                "optional": {"type": "array", "items": {"type": "string"},
                                                             "maxItems": 32, "description": "keys the interface "
                                                             "makes optional: compared when the dict holds them"},
                                                "per_key": {"type": "array", "items": {"type": "string"},
                                                            "maxItems": 32, "description": "keys also measured "
                                                            "on their own, as KEY_abs_err (a tighter tolerance "
                                                            "than the shared one; an optional key not reported "
                                                            "measures 0)"}}}}
    required = CALL_REQUIRED + ["reference"]
    metrics = {"max_abs_err": "largest |got - want|", "max_rel_err": "largest |got - want| / |want|",
               "max_scaled_err": "largest |got - want| / max |want|", "grad_max_rel_err":
               "largest gradient error / max |want gradient|", "grad_max_abs_err": "largest gradient error",
               "shape_mismatches": "outputs whose shape is not the reference's (an error of inf)",
               "dtype_mismatches": "outputs of another dtype than result_dtype declares",
               "out_of_bounds": "outputs outside `bounds`", "undefined_nonfinite":
               "non-finite outputs where the reference is undefined", "compared": "entries compared", "cases": "cases",
               "keys_max_abs_err": "keys_agree: largest |got - want| over the keys", "KEY_abs_err":
               "keys_agree per_key: |got - want| of that key alone", "keys_max_rel_err":
               "keys_agree: largest |got - want| / max(|want|, 1)", "keys_missing":
               "keys_agree: keys absent from the returned dict or not numbers"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls
        from engine.spec import registry

        wrt = list(params.get("grad_wrt") or [])
        agg = {"max_abs_err": 0.0, "max_rel_err": 0.0, "max_scaled_err": 0.0, "undefined_nonfinite": 0,
               "compared": 0, "shape_mismatches": 0}
        if wrt:
            agg["grad_max_rel_err"] = agg["grad_max_abs_err"] = 0.0
        names = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                 "float64": torch.float64}
        summed = {"undefined_nonfinite", "compared", "shape_mismatches", "dtype_mismatches", "out_of_bounds", "keys_missing"}
        n = 0
        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            t = calls.cast_all(ctx, drawn)
            for name in wrt:
                t[name].requires_grad_(True)
            with torch.set_grad_enabled(bool(wrt)):
                whole = calls.call(impl, params, t, output=None, whole=True)
            out = calls.select(whole, params.get("output"))
            full = whole
            ref_out = calls.reference(params, t, ctx=ctx)
            extra = ref_out if isinstance(ref_out, dict) else {}
            want = calls.as64(extra["value"] if extra else calls.select(ref_out, params.get("output")))
            got = calls.as64(out)
            mismatch = 0
            try:  # the same rank with other sizes (another number of picked indices) is a mismatch, not a broadcast
                if got.dim() == want.dim() and got.shape != want.shape:
                    raise RuntimeError("shape mismatch")
                got, want = torch.broadcast_tensors(got, want)
            except RuntimeError:  # nothing to compare element-wise
                mismatch, got, want = 1, torch.full((1,), float("inf"), dtype=torch.float64), torch.zeros(1)
            defined = ~torch.isnan(want)
            err = torch.where(defined, (got - want).abs(), torch.zeros_like(got))
            err = torch.where(defined & torch.isnan(got), torch.full_like(got, float("inf")), err)
            abs_err, where = calls.worst(err)
            rel_err, _ = calls.worst(err / torch.where(defined, want.abs(), torch.ones_like(want)).clamp_min(1e-300))
            scale = float(extra["scale"]) if "scale" in extra else \
                float(want[defined].abs().max()) if bool(defined.any()) else 1.0
            m = {"max_abs_err": abs_err, "max_rel_err": rel_err, "max_scaled_err": abs_err / max(scale, 1e-300),
                 "undefined_nonfinite": int((~defined & ~torch.isfinite(got)).sum()), "compared": int(defined.sum()),
                 "shape_mismatches": mismatch}
            w = {"max_abs_err": where}
            declared = (params.get("result_dtype") or {}).get(str(ctx.dtype).replace("torch.", ""))
            if declared:
                m["dtype_mismatches"] = int(out.dtype != (ctx.dtype if declared == "same" else names[declared]))
            if params.get("bounds"):
                lo, hi = params["bounds"]
                m["out_of_bounds"] = int(((got < lo) | (got > hi) | torch.isnan(got)).sum())
            if wrt:
                grads = calls.grad_of(out, [t[k] for k in wrt])
                wg = extra["grad"] if "grad" in extra else calls.reference(params, t, params["grad_reference"], ctx)
                wg = list(wg) if isinstance(wg, (tuple, list)) else [wg]
                m["grad_max_rel_err"], w["grad_max_rel_err"] = calls.grad_diff(wrt, grads, wg)
                m["grad_max_abs_err"], w["grad_max_abs_err"] = calls.grad_diff(wrt, grads, wg, relative=False)
            # `also` entries that differ only in the output or key they compare (three keys of one metrics dict)
            # share one call and one reference call per case: the same function on the same tensors.
            shared: dict[tuple, object] = {}
            for sub in params.get("also") or []:
                if not registry.provides(impl, sub["function"]):  # an adapted framework loss: no separate ratio
                    ctx.skip_call(sub["function"], sub["prefix"] + "max_abs_err", sub["prefix"] + "max_rel_err")
                    continue
                same = (repr(sub["args"]), repr(sub.get("kwargs")))
                if ("call", sub["function"], *same) not in shared:
                    with torch.no_grad():
                        shared["call", sub["function"], *same] = calls.call(impl, sub, t, whole=True)
                if ("ref", sub["reference"], *same) not in shared:
                    shared["ref", sub["reference"], *same] = calls.reference(sub, t)
                got2 = calls.select(shared["call", sub["function"], *same], sub.get("output"))
                want2 = calls.select(shared["ref", sub["reference"], *same], sub.get("output"))
                if sub.get("key"):
                    got2, want2 = got2[sub["key"]], want2[sub["key"]]
                got2, want2 = calls.as64(got2), calls.as64(want2)
                ok2 = ~torch.isnan(want2)
                e2 = torch.where(ok2, (got2 - want2).abs(), torch.zeros_like(want2))
                e2 = torch.where(ok2 & torch.isnan(got2), torch.full_like(e2, float("inf")), e2)
                pre = sub["prefix"]
                m[pre + "max_abs_err"], w[pre + "max_abs_err"] = calls.worst(e2)
                m[pre + "max_rel_err"], w[pre + "max_rel_err"] = calls.worst(
                    e2 / torch.where(ok2, want2.abs(), torch.ones_like(want2)).clamp_min(1e-300))
            if params.get("keys_agree"):
                _keys_agree(ctx, params, t, whole, m, w)
            for k, v in (extra.get("counts") or {}).items():
                m[k] = int(v)
            if extra.get("scalars"):
                reported = full[params["metrics_output"]]
                for k, v in extra["scalars"].items():
                    got_k = float(reported[k]) if k in reported else float("nan")
                    m[k + "_abs_err"] = abs(got_k - float(v)) if got_k == got_k else float("inf")
            calls.log_case(ctx, case, drawn, m, w)
            for k, v in m.items():
                if k in summed or k in (extra.get("counts") or {}):
                    agg[k] = agg.get(k, 0) + v
                else:
                    agg[k] = max(agg.get(k, 0.0), v)
        return {**agg, "cases": n}


def _keys_agree(ctx, params, t, whole, m, w) -> None:
    """Compare the dict the call returned at keys_agree.output with the reference dict, key by key. A key the result
    lacks (a framework loss reports its own metrics) makes keys_missing not applicable, never passed: the contract
    is then partial."""
    import math

    from engine.kinds import calls

    spec = params["keys_agree"]
    got = whole[spec["output"]] if isinstance(whole, (tuple, list)) and len(whole) > spec["output"] else None
    want = calls.reference({**params, "reference": spec["reference"]}, t, ctx=ctx)
    optional, per_key = set(spec.get("optional") or ()), list(spec.get("per_key") or ())
    for key in per_key:  # an optional key the call does not report is not held to anything: it measures 0
        m[key + "_abs_err"] = 0.0
    worst_abs, worst_rel, missing, where = 0.0, 0.0, 0, None
    for key in spec["keys"]:
        ref = float(want[key])
        if math.isnan(ref):
            continue
        value = got.get(key) if isinstance(got, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if key in optional and not (isinstance(got, dict) and key in got):
                continue
            missing += 1
            ctx.not_applicable(f"the result has no number under {key!r}", "keys_missing")
            continue
        err = abs(float(value) - ref) if math.isfinite(float(value)) or float(value) != ref else 0.0
        if math.isnan(err):
            err = math.inf
        if key in per_key:
            m[key + "_abs_err"] = err
            if err:
                w[key + "_abs_err"] = f"key {key}: got {float(value)!r}, want {ref!r}"
        rel = err / max(abs(ref), 1.0)
        if err > worst_abs:
            worst_abs = err
        if rel > worst_rel:
            worst_rel, where = rel, f"key {key}: got {float(value)!r}, want {ref!r}"
    m["keys_max_abs_err"], m["keys_max_rel_err"] = worst_abs, worst_rel
    if not missing:  # a missing key leaves keys_missing unmeasured (not applicable): partial, never failed or passed
        m["keys_missing"] = 0
    if where:
        w["keys_max_rel_err"] = where
