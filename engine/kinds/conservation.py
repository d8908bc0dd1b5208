"""conservation: a declared reduction of an output equals a declared quantity."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind


@kind
class Conservation(Kind):
    name = "conservation"
    description = ("A reduction (`sum` or `mean` over the last dims `dims`, over the True slots of `mask` only) of "
                   "the output equals `equals` (a number or an input), e.g. credit weights average 1 per response. "
                   "Rows with no True slot are left out.")
    parameters = {**CALL,
                  "reduce": {"enum": ["sum", "mean"]},
                  "dims": {"type": "integer", "minimum": 1, "maximum": 4},
                  "mask": NAME,
                  "equals": {"oneOf": [{"type": "number"}, NAME]}}
    required = CALL_REQUIRED + ["reduce", "equals"]
    metrics = {"max_abs_err": "largest |reduction - quantity|", "rows": "reductions compared", "cases": "cases"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls

        agg, rows, n = 0.0, 0, 0
        dims = int(params.get("dims", 1))
        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            t = calls.cast_all(ctx, drawn)
            with torch.no_grad():
                out = calls.as64(calls.call(impl, params, t))
            keep = torch.ones_like(out, dtype=torch.bool)
            if params.get("mask"):
                keep = drawn[params["mask"]].to(torch.bool).expand_as(out)
            red = tuple(range(out.dim() - dims, out.dim()))
            total = torch.where(keep, out, torch.zeros_like(out)).sum(dim=red)
            count = keep.sum(dim=red)
            value = total / count.clamp_min(1) if params["reduce"] == "mean" else total
            eq = params["equals"]
            want = torch.full_like(value, float(eq)) if not isinstance(eq, str) else calls.as64(t[eq])
            err = torch.where(count > 0, (value - want).abs(), torch.zeros_like(value))
            v, w = calls.worst(err)
            calls.log_case(ctx, case, drawn, {"max_abs_err": v}, {"max_abs_err": w})
            agg, rows = max(agg, v), rows + int((count > 0).sum())
        return {"max_abs_err": agg, "rows": rows, "cases": n}
