"""masked_junk: junk in masked slots (and extra padding columns) changes no output and no gradient, bit for bit."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind

CALLS = {"type": "array", "minItems": 1, "maxItems": 8, "items": {
    "type": "object", "additionalProperties": False, "required": ["function", "args"],
    "properties": {"function": NAME, "args": CALL["args"], "kwargs": CALL["kwargs"], "output": CALL["output"],
                   "key": {"type": "string", "description": "a number of the selected output (a dict of reported "
                           "numbers, e.g. the cap s), compared bit for bit too"},
                   "mask_at": {"type": "integer", "minimum": 0, "description": "masked_outputs_zero: the dim of "
                               "this output where the mask's dims sit ([K, B, T] weights: 1); an output without "
                               "them there counts as a masked value of inf"}}}}


@kind
class MaskedJunk(Kind):
    name = "masked_junk"
    description = ("NaN and +-1e4 (or the declared junk) in the masked slots of named arguments, and extra padding "
                   "columns, change no output value and no gradient bit for bit; gradients at masked slots are 0.")
    parameters = {**CALL,
                  "calls": {**CALLS, "description": "several calls on the same inputs (default: the one call)"},
                  "mask": {**NAME, "description": "the input whose False slots are masked"},
                  "junk_args": {"type": "array", "minItems": 1, "items": NAME},
                  "junk": {"type": "array", "minItems": 1, "items": {"oneOf": [{"type": "number"}, {"enum": ["nan", "inf", "-inf"]}]}},
                  "grad_wrt": {"type": "array", "items": NAME},
                  "pad_columns": {"type": "integer", "minimum": 0, "maximum": 64},
                  "pad_apart": {"type": "boolean", "description": "measure the extra padding columns apart from "
                                "the bit-for-bit junk (pad_value_rel_diff, pad_grad_max_abs_diff): a reduction over "
                                "a wider row may round differently"},
                  "mask_at": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0},
                              "description": "junk argument -> the dim where the mask's first dim sits in it (a "
                              "[B, T] mask in [B, T, V] distributions: 0; in [K, B, T] weights: 1), where the sizes "
                              "alone could place it twice"},
                  "junk_rows": {"type": "array", "items": NAME, "description": "arguments junked where a row of "
                                "the mask has no True slot (per-response values of responses without a token)"},
                  "masked_outputs_zero": {"type": "boolean", "description": "outputs at masked slots (an output "
                                          "whose shape holds the mask's dims) must be exactly 0 with junk in: "
                                          "masked_value_max_abs"}}
    required = ["inputs", "mask", "junk_args"]
    metrics = {"value_max_abs_diff": "largest output change", "grad_max_abs_diff": "largest gradient change",
               "masked_grad_max_abs": "largest gradient at a masked slot", "nonfinite": "non-finite outputs",
               "pad_value_rel_diff": "pad_apart: largest output change / max |output|",
               "pad_grad_max_abs_diff": "pad_apart: largest gradient change, padding columns included",
               "masked_value_max_abs": "masked_outputs_zero: largest |output| at a masked slot, junk in",
               "junk_refused": "cases whose call raised with junk in (it read the junk; the value diff is then inf)",
               "cases": "cases"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls

        junk = [float(j) for j in params.get("junk", ["nan", 1.0e4, -1.0e4])]
        wrt = list(params.get("grad_wrt") or [])
        plan = params.get("calls") or [{k: params[k] for k in ("function", "args", "kwargs", "output") if k in params}]
        from engine.spec import registry

        absent = [c["function"] for c in plan if not registry.provides(impl, c["function"])]
        plan = [c for c in plan if c["function"] not in absent]
        for fn in absent:  # an adapted framework loss has no separate ratio: what it has is still held bit for bit
            ctx.skip_call(fn, "value_max_abs_diff", "nonfinite", *(["grad_max_abs_diff", "masked_grad_max_abs"]
                                                                  if wrt else []))
        mask_name, pad = params["mask"], int(params.get("pad_columns", 0))
        agg = {"value_max_abs_diff": 0.0, "grad_max_abs_diff": 0.0, "masked_grad_max_abs": 0.0, "nonfinite": 0,
               "junk_refused": 0}
        apart = bool(params.get("pad_apart")) and pad > 0
        if apart:
            agg.update(pad_value_rel_diff=0.0, pad_grad_max_abs_diff=0.0)
        if params.get("masked_outputs_zero"):
            agg["masked_value_max_abs"] = 0.0
        n = 0

        def run(t):
            t = dict(t)
            for k in wrt:
                t[k] = t[k].clone().requires_grad_(True)
            outs, grads = [], []
            for c in plan:
                out = calls.call(impl, c, t)
                if c.get("key"):  # a reported number: compared as a 0-d tensor
                    out = torch.as_tensor(out[c["key"]], dtype=torch.float64)
                outs.append(out.detach())
                if wrt and out.requires_grad:
                    grads.append(calls.grad_of(out, [t[k] for k in wrt]))
            return outs, grads

        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            mask = drawn[mask_name]
            pattern = case % (len(junk) + 1)
            g = torch.Generator().manual_seed(ctx.seed * 31 + case)
            if pattern < len(junk):
                fill = torch.full(mask.shape, junk[pattern], dtype=torch.float64)
            else:
                fill = torch.tensor(junk, dtype=torch.float64)[torch.randint(0, len(junk), mask.shape, generator=g)]
            dirty = dict(drawn)
            at, rows = params.get("mask_at") or {}, set(params.get("junk_rows") or [])
            for k in list(params["junk_args"]) + sorted(rows - set(params["junk_args"])):
                x = drawn[k]
                if k not in at and k not in rows and (x.shape == mask.shape or x.shape == mask.shape[:-1]):
                    m = mask if x.shape == mask.shape else mask.any(dim=-1)
                    f = fill if x.shape == mask.shape else fill[..., 0]
                    dirty[k] = torch.where(m, x, f)
                    continue
                # the mask's dims inside the argument's ([B, T, V] distributions, [K, B, T] weights), or its rows'
                # ([K, B] per-response values of responses without a token): junk drawn per element
                if k in rows:
                    m = calls.mask_like(mask.any(dim=-1), x, at.get(k))
                else:
                    m = calls.mask_like(mask, x, at.get(k))
                    m = calls.mask_like(mask.any(dim=-1), x) if m is None and k not in at else m
                if m is None:
                    raise ValueError(f"junk_args {k!r} {list(x.shape)} holds neither the mask's dims "
                                     f"{list(mask.shape)} nor its rows'")
                if pattern < len(junk):
                    f = torch.full(x.shape, junk[pattern], dtype=torch.float64)
                else:
                    f = torch.tensor(junk, dtype=torch.float64)[torch.randint(0, len(junk), x.shape, generator=g)]
                dirty[k] = torch.where(m, x, f)
            unpadded = dirty
            if pad:
                padded = {}
                for k, x in dirty.items():
                    if x.dim() == mask.dim() and x.shape == mask.shape:
                        extra = torch.zeros(*x.shape[:-1], pad, dtype=x.dtype) if x.dtype == torch.bool else \
                            torch.full((*x.shape[:-1], pad), junk[case % len(junk)], dtype=x.dtype)
                        padded[k] = torch.cat([x, extra], dim=-1)
                    else:
                        padded[k] = x
                dirty = padded
            o0, g0 = run(calls.cast_all(ctx, drawn))
            if apart:  # the padded call is measured below, with its own tolerance
                o2, g2 = run(calls.cast_all(ctx, dirty))
                dirty, pad = unpadded, 0
            try:
                o1, g1 = run(calls.cast_all(ctx, dirty))
            except registry.NotProvided:
                raise
            except Exception as e:  # noqa: BLE001 - the junk was read: refusing it breaks the promise, a failure
                m = {"value_max_abs_diff": float("inf"), "grad_max_abs_diff": float("inf") if wrt else 0.0,
                     "masked_grad_max_abs": 0.0, "nonfinite": 0, "junk_refused": 1}
                calls.log_case(ctx, case, drawn, m, {"value_max_abs_diff": None},
                               argument=f"junk {['%g' % j for j in junk][pattern] if pattern < len(junk) else 'mixed'}"
                                        f": the call raised {type(e).__name__}: {str(e)[:160]}")
                for k, v in m.items():
                    agg[k] = agg[k] + v if k in ("nonfinite", "junk_refused") else max(agg.get(k, 0.0), v)
                continue
            L = mask.shape[-1]
            m_dev = calls.on_device(ctx, mask)
            vd = gd = mg = 0.0
            where = {}
            nonfinite = 0
            for a, b in zip(o0, o1):
                if pad and b.dim() and b.shape[-1] == L + pad:
                    b = b[..., :L]
                nonfinite += int((~torch.isfinite(b)).sum())
                # every position, masked ones included: bit for bit
                v, w = calls.worst((b.to(torch.float64) - a.to(torch.float64)).abs())
                if v >= vd:
                    vd, where["value_max_abs_diff"] = v, w
            for ga, gb in zip(g0, g1):
                for name, a, b in zip(wrt, ga, gb):
                    if pad and b.shape[-1] == L + pad:
                        tail, b = b[..., L:], b[..., :L]
                        t, tw = calls.worst(tail.abs())
                        mg = max(mg, t)
                    v, w = calls.worst((b.to(torch.float64) - a.to(torch.float64)).abs())
                    if v >= gd:
                        gd, where["grad_max_abs_diff"] = v, {name: w}
                    nonfinite += int((~torch.isfinite(b)).sum())
                    if b.shape == mask.shape:
                        v, w = calls.worst(torch.where(m_dev, torch.zeros_like(b), b).abs())
                        if v >= mg:
                            mg, where["masked_grad_max_abs"] = v, {name: w}
            m = {"value_max_abs_diff": vd, "grad_max_abs_diff": gd, "masked_grad_max_abs": mg, "nonfinite": nonfinite}
            if params.get("masked_outputs_zero"):
                mv = 0.0
                for c, b in zip(plan, o1):
                    keep = calls.mask_like(mask, b, c.get("mask_at")) if b.dim() else None
                    if keep is None and "mask_at" in c:  # the output is not shaped as declared
                        mv, where["masked_value_max_abs"] = float("inf"), {"shape": list(b.shape)}
                    if keep is not None:
                        v, wv = calls.worst(torch.where(keep, torch.zeros_like(b), b).to(torch.float64).abs())
                        if v >= mv:
                            mv, where["masked_value_max_abs"] = v, wv
                m["masked_value_max_abs"] = mv
            if apart:
                pv = pg = 0.0
                for a, b in zip(o0, o2):
                    b = b[..., :L] if b.dim() and b.shape[-1] == L + int(params["pad_columns"]) else b
                    nonfinite += int((~torch.isfinite(b)).sum())
                    scale = max(float(a.to(torch.float64).abs().max()) if a.numel() else 0.0, 1e-300)
                    pv = max(pv, calls.worst((b.to(torch.float64) - a.to(torch.float64)).abs())[0] / scale)
                for ga, gb in zip(g0, g2):
                    for a, b in zip(ga, gb):
                        nonfinite += int((~torch.isfinite(b)).sum())
                        tail = calls.worst(b[..., L:].to(torch.float64).abs())[0]
                        pg = max(pg, tail, calls.worst((b[..., :L].to(torch.float64) - a.to(torch.float64)).abs())[0])
                m.update(pad_value_rel_diff=pv, pad_grad_max_abs_diff=pg, nonfinite=nonfinite)
                pad = int(params["pad_columns"])
            calls.log_case(ctx, case, drawn, m, where, argument=f"junk {['%g' % j for j in junk][pattern] if pattern < len(junk) else 'mixed'}"
                           + (f", {pad} padding columns" if pad else ""))
            for k, v in m.items():
                agg[k] = agg[k] + v if k in ("nonfinite", "junk_refused") else max(agg[k], v)
        return {**agg, "cases": n}
