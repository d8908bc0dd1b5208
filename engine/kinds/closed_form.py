"""closed_form: literal inputs written in the spec with their expected outputs."""

from __future__ import annotations

from engine.kinds.base import NAME, Kind, kind


@kind
class ClosedForm(Kind):
    name = "closed_form"
    description = ("Literal inputs written in the spec, each with the output a closed form gives; the function's "
                   "output must equal it within the expectation (max_abs_err).")
    parameters = {
        "function": NAME,
        "output": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]},
        "examples": {"type": "array", "minItems": 1, "maxItems": 256, "items": {
            "type": "object", "additionalProperties": False, "required": ["args", "expected"],
            "properties": {"args": {"type": "array"}, "kwargs": {"type": "object"}, "expected": {},
                           "note": {"type": "string"}, "bool_args": {"type": "array", "items": {"type": "integer"}},
                           "tensor_args": {"type": "array", "items": {"type": "integer"}},
                           "long_args": {"type": "array", "items": {"type": "integer"},
                                         "description": "positions of list arguments passed as int64 tensors "
                                                        "(token counts, ids)"},
                           "bool_kwargs": {"type": "array", "items": {"type": "string"}},
                           "device_kwargs": {"type": "boolean"}}}},
    }
    required = ["function", "examples"]
    metrics = {"max_abs_err": "largest |got - expected|", "shape_mismatches": "outputs of the wrong shape",
               "cases": "examples"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls

        worst = 0.0
        mismatched = 0
        examples = params["examples"]
        only = getattr(ctx, "only_case", None)
        n = 0
        for i, ex in enumerate(examples):
            if only is not None and i != only:
                continue
            n += 1
            bools, tensors = set(ex.get("bool_args", [])), set(ex.get("tensor_args", []))
            longs = set(ex.get("long_args", []))
            args = []
            for j, a in enumerate(ex["args"]):
                if j in bools:
                    args.append(torch.tensor(a, dtype=torch.bool, device=ctx.device))
                elif j in longs:
                    args.append(torch.tensor(a, dtype=torch.int64, device=ctx.device))
                elif j in tensors or isinstance(a, list):
                    args.append(torch.tensor(a, dtype=ctx.dtype, device=ctx.device))
                else:
                    args.append(a)
            kwargs = dict(ex.get("kwargs") or {})
            for name in ex.get("bool_kwargs", []):  # keyword tensors given as lists (a mask)
                kwargs[name] = torch.tensor(kwargs[name], dtype=torch.bool, device=ctx.device)
            if ex.get("device_kwargs"):
                kwargs.update(dtype=ctx.dtype, device=ctx.device)
            got = calls.as64(calls.select(getattr(impl, params["function"])(*args, **kwargs), params.get("output")))
            want = torch.tensor(ex["expected"], dtype=torch.float64)
            if got.shape != want.shape:
                mismatched += 1
                err, where = float("inf"), None
            else:
                err, where = calls.worst((got - want).abs())
            worst = max(worst, err)
            log = getattr(ctx, "case_log", None)
            if log is not None:
                log.append({"seed": ctx.seed, "case": i, "shapes": {"expected": list(want.shape)},
                            "metrics": {"max_abs_err": err, "shape_mismatches": int(got.shape != want.shape)},
                            "where": {"max_abs_err": where}, "argument": ex.get("note") or f"example {i}"})
        return {"max_abs_err": worst, "shape_mismatches": mismatched, "cases": n}
