"""identity: at a declared point (logp == old_logp) an output equals a closed form or another function's output."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind

REF_NAME = {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{0,63}$"}


@kind
class Identity(Kind):
    name = "identity"
    description = ("With inputs tied at a declared point (`tie`: input -> the input it is set equal to), the output "
                   "equals a constant (`equals_value`, at the True slots of `mask`), another call's output "
                   "(`equals_call`, of this implementation or of another registered one such as the GRPO control) "
                   "or a float64 closed form (`equals_reference`), value and gradient; `alias_too` measures it again "
                   "with each tied input passed as the very same tensor (metrics alias_*), `also` holds more calls "
                   "at the same point to constants (metrics PREFIX_*), `points` measures it all at several declared "
                   "points (metrics PREFIX_*) and `bounds` counts outputs outside [low, high].")
    parameters = {**CALL,
                  "tie": {"type": "object", "additionalProperties": NAME},
                  "alias": {"type": "boolean", "description": "tie by passing the very same tensor (grad and all)"},
                  "alias_too": {"type": "boolean", "description": "measure both ways: separate tensors, then the very "
                                "same tensor (its metrics named alias_*)"},
                  "equals_value": {"type": "number"},
                  "equals_call": {"type": "object", "additionalProperties": False, "required": ["function", "args"],
                                  "properties": {
                                      "function": NAME, "args": CALL["args"], "kwargs": CALL["kwargs"],
                                      "output": CALL["output"],
                                      "implementation": {**REF_NAME, "description":
                                                         "call this registered implementation's function (the "
                                                         "project's own, never the one under test)"},
                                      "scale_inputs": {"type": "object", "additionalProperties": {"type": "number"},
                                                       "description": "input -> factor it is multiplied by for this "
                                                       "call (an odd function: A(-a) = -A(a))"},
                                      "times": {"type": "number", "description": "factor on this call's output"}}},
                  "equals_reference": {**REF_NAME, "description": "registered float64 closed form on the tied "
                                       "inputs: a tensor, or {value, scale (what ref_max_scaled_err divides by), "
                                       "grad (one tensor per grad_wrt)}"},
                  "also": {"type": "array", "maxItems": 8, "description": "more calls at the same point, each equal "
                           "to a constant at the True slots of its mask (metric PREFIX + value_max_abs_diff)",
                           "items": {"type": "object", "additionalProperties": False,
                                     "required": ["function", "args", "equals_value", "prefix"],
                                     "properties": {"function": NAME, "args": CALL["args"], "kwargs": CALL["kwargs"],
                                                    "output": CALL["output"], "equals_value": {"type": "number"},
                                                    "mask": NAME, "key": {"type": "string", "description":
                                                                          "a number of a dict output (the cap s)"},
                                                    "prefix": {"type": "string", "pattern": "^[a-z][a-z0-9]*_$"}}}},
                  "points": {"type": "array", "minItems": 1, "maxItems": 8, "description": "instead of one point: "
                             "the same identities at several declared points, metrics named PREFIX + metric",
                             "items": {"type": "object", "additionalProperties": False, "required": ["prefix"],
                                       "properties": {"prefix": {"type": "string", "pattern": "^([a-z][a-z0-9]*_)?$"},
                                                      "tie": {"type": "object", "additionalProperties": NAME},
                                                      "set": {"type": "object", "additionalProperties":
                                                              {"type": "number"}, "description": "input -> the value "
                                                              "it is filled with (a bool input: True for non-zero)"},
                                                      "alias": {"type": "boolean"},
                                                      "equals_value": {"type": "number", "description":
                                                                       "the constant at this point"}}}},
                  "bounds": {"type": "array", "minItems": 2, "maxItems": 2, "items": {"type": "number"},
                             "description": "[low, high]: outputs outside (or NaN) are counted at every point "
                             "(out_of_bounds)"},
                  "mask": NAME,
                  "grad_wrt": {"type": "array", "items": NAME}}
    required = CALL_REQUIRED
    metrics = {"value_max_abs_diff": "largest |output - expected|", "grad_max_rel_diff":
               "largest gradient difference / max |expected gradient|", "ref_max_scaled_err":
               "equals_reference: largest |output - closed form| / its scale", "ref_grad_max_rel_err":
               "equals_reference: largest gradient error / max |closed-form gradient|", "out_of_bounds":
               "bounds: outputs outside [low, high] or NaN, summed", "cases": "cases"}

    def measure(self, impl, ctx, params):
        from engine.kinds import calls
        from engine.spec import registry

        wrt = list(params.get("grad_wrt") or [])
        other_impl = impl
        if (params.get("equals_call") or {}).get("implementation"):
            other_impl = registry.load().get_implementation(params["equals_call"]["implementation"])
        points = params.get("points") or ([{"prefix": "", "alias": bool(params.get("alias"))}]
                                          + ([{"prefix": "alias_", "alias": True}] if params.get("alias_too") else []))
        also = []
        for sub in params.get("also") or []:
            if registry.provides(impl, sub["function"]):
                also.append(sub)
            else:  # an adapted framework loss has no separate ratio: what it has is still held
                ctx.skip_call(sub["function"], *(p.get("prefix", "") + sub["prefix"] + "value_max_abs_diff"
                                                 for p in points))
        agg: dict = {}
        n = 0
        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            m, w = {}, {}
            for point in points:
                pre = point.get("prefix", "")
                tied = self._tied(drawn, {**(params.get("tie") or {}), **(point.get("tie") or {})},
                                  point.get("set") or {})
                at = {**params, **{k: point[k] for k in ("equals_value",) if k in point}}
                t = self._at_point(impl, other_impl, ctx, at, tied, wrt, bool(point.get("alias")), pre, m, w)
                for sub in also:
                    self._constant(impl, ctx, sub, t, drawn, pre + sub["prefix"], m, w)
            ties = {**(params.get("tie") or {})}
            calls.log_case(ctx, case, drawn, m, w, argument="tie " + ", ".join(f"{k}={v}" for k, v in ties.items())
                           if ties else "points " + ", ".join(p.get("prefix", "") or "base" for p in points))
            for k, v in m.items():
                agg[k] = agg.get(k, 0) + v if k == "out_of_bounds" else max(agg.get(k, 0.0), v)
        return {**agg, "cases": n}

    @staticmethod
    def _tied(drawn, tie, fill):
        """The case's inputs at the point: each tied input a copy of its source (broadcast to its own shape), each
        `set` input filled with its value."""
        import torch

        tied = dict(drawn)
        for k, src in tie.items():
            x = drawn[src]
            if isinstance(x, torch.Tensor):
                x = x.clone()
                if isinstance(drawn.get(k), torch.Tensor) and drawn[k].shape != x.shape:
                    x = x.expand(drawn[k].shape).clone()
            tied[k] = x
        for k, v in fill.items():
            tied[k] = torch.full_like(drawn[k], bool(v) if drawn[k].dtype == torch.bool else float(v))
        return tied

    @staticmethod
    def _constant(impl, ctx, params, t, drawn, pre, m, w, out=None) -> None:
        """|output - equals_value| at the True slots of the call's mask."""
        import torch

        from engine.kinds import calls

        if out is None:
            with torch.no_grad():
                out = calls.call(impl, params, t)
            if params.get("key"):  # a number the call reports in a dict (the cap s)
                out = out[params["key"]]
        d = (calls.as64(out) - float(params["equals_value"])).abs()
        if params.get("mask"):
            keep = calls.mask_like(drawn[params["mask"]], d)
            if keep is not None:
                d = torch.where(keep, d, torch.zeros_like(d))
        v, ww = calls.worst(d)
        if v >= m.get(pre + "value_max_abs_diff", 0.0):
            m[pre + "value_max_abs_diff"], w[pre + "value_max_abs_diff"] = v, ww

    def _at_point(self, impl, other_impl, ctx, params, tied, wrt, alias, pre, m, w):
        import torch

        from engine.kinds import calls

        t = calls.cast_all(ctx, tied)
        for k in wrt:
            t[k].requires_grad_(True)
        if alias:
            for k, src in (params.get("tie") or {}).items():
                t[k] = t[src]
        t = calls.chain(impl, params, t)
        out = calls.call(impl, params, t)
        grads = calls.grad_of(out, [t[k] for k in wrt]) if wrt else []
        if params.get("bounds"):
            lo, hi = params["bounds"]
            o = calls.as64(out)
            m["out_of_bounds"] = m.get("out_of_bounds", 0) + int(((o < lo) | (o > hi) | torch.isnan(o)).sum())
        if "equals_value" in params:
            self._constant(impl, ctx, params, t, tied, pre, m, w, out=out)
        if params.get("equals_call"):
            ec = params["equals_call"]
            t2 = calls.cast_all(ctx, {k: (v * ec["scale_inputs"][k] if k in (ec.get("scale_inputs") or {}) else v)
                                      for k, v in tied.items()})
            for k in wrt:
                t2[k].requires_grad_(True)
            other = calls.call(other_impl, ec, t2)
            if "times" in ec:
                other = other * float(ec["times"])
            v, ww = calls.worst((calls.as64(out) - calls.as64(other)).abs())
            if v >= m.get(pre + "value_max_abs_diff", 0.0):
                m[pre + "value_max_abs_diff"], w[pre + "value_max_abs_diff"] = v, ww
            if wrt:
                gb = calls.grad_of(other, [t2[k] for k in wrt])
                m[pre + "grad_max_rel_diff"], w[pre + "grad_max_rel_diff"] = calls.grad_diff(wrt, grads, gb)
        if params.get("equals_reference"):
            ref = calls.reference(params, t, params["equals_reference"], ctx)
            extra = ref if isinstance(ref, dict) else {"value": ref}
            want = calls.as64(extra["value"])
            d = (calls.as64(out) - want).abs()
            scale = float(extra["scale"]) if "scale" in extra else (float(want.abs().max()) if want.numel() else 1.0)
            v, ww = calls.worst(d)
            m[pre + "ref_max_scaled_err"], w[pre + "ref_max_scaled_err"] = v / max(scale, 1e-300), ww
            if wrt:
                wg = extra["grad"]
                wg = list(wg) if isinstance(wg, (tuple, list)) else [wg]
                m[pre + "ref_grad_max_rel_err"], w[pre + "ref_grad_max_rel_err"] = calls.grad_diff(wrt, grads, wg)
        return t
