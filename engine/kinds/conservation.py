"""conservation: a declared reduction of an output equals a declared quantity."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind


@kind
class Conservation(Kind):
    name = "conservation"
    description = ("A reduction (`sum` or `mean` over the last dims `dims`, over the True slots of `mask` only) of "
                   "the output (times a reported number, `times`) equals `equals` (a number or an input) or "
                   "`equals_reference`, e.g. credit weights average 1 per response. Rows with no True slot are left "
                   "out.")
    parameters = {**CALL,
                  "reduce": {"enum": ["sum", "mean"]},
                  "dims": {"type": "integer", "minimum": 1, "maximum": 4},
                  "mask": NAME,
                  "equals": {"oneOf": [{"type": "number"}, NAME]},
                  "equals_reference": {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{0,63}$", "description":
                                       "instead of equals: a registered float64 function of the call's arguments "
                                       "giving the conserved quantity per reduced row"},
                  "times": {"type": "object", "additionalProperties": False, "required": ["output", "key"],
                            "description": "multiply the output by a number the call reports (key of the dict at "
                            "`output`) plus `plus`, e.g. advantages times (std + eps) give back the credit",
                            "properties": {"output": {"type": "integer", "minimum": 0}, "key": {"type": "string"},
                                           "plus": {"type": "number"}}}}
    required = CALL_REQUIRED + ["reduce"]
    metrics = {"max_abs_err": "largest |reduction - quantity|", "rows": "reductions compared", "cases": "cases"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls

        agg, rows, n = 0.0, 0, 0
        dims = int(params.get("dims", 1))
        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            t = calls.cast_all(ctx, drawn)
            # called as a caller would, grad mode on (no input requires grad, so nothing is recorded): a function
            # that refuses in grad mode is caught here
            t = calls.chain(impl, params, t)
            whole = calls.call(impl, params, t, whole=True)
            out = calls.as64(calls.select(whole, params.get("output")))
            if params.get("times"):
                by = params["times"]
                out = out * (float(whole[by["output"]][by["key"]]) + float(by.get("plus", 0.0)))
            keep = torch.ones_like(out, dtype=torch.bool)
            if params.get("mask"):
                keep = calls.mask_like(drawn[params["mask"]], out)
                keep = torch.ones_like(out, dtype=torch.bool) if keep is None else keep
            red = tuple(range(out.dim() - dims, out.dim()))
            total = torch.where(keep, out, torch.zeros_like(out)).sum(dim=red)
            count = keep.sum(dim=red)
            value = total / count.clamp_min(1) if params["reduce"] == "mean" else total
            eq = params.get("equals")
            if params.get("equals_reference"):
                want = calls.as64(calls.reference(params, t, params["equals_reference"], ctx))
            else:
                want = torch.full_like(value, float(eq)) if not isinstance(eq, str) else calls.as64(t[eq])
            err = torch.where(count > 0, (value - want).abs(), torch.zeros_like(value))
            v, w = calls.worst(err)
            calls.log_case(ctx, case, drawn, {"max_abs_err": v}, {"max_abs_err": w})
            agg, rows = max(agg, v), rows + int((count > 0).sum())
        return {"max_abs_err": agg, "rows": rows, "cases": n}
