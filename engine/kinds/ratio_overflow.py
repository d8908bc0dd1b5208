"""ratio_overflow: where the paper's gradient is 0 the gradient is exactly 0, however large the ratio; never NaN.

A ratio-family loss multiplies an importance ratio exp(logp - old_logp) (per token, per prefix or per sequence)
into a clipped surrogate. Where the clip removes a token (the ratio outside its bound on the advantage's side) or
the advantage is 0, the paper's gradient is exactly 0, whatever the ratio. An implementation whose ratio
overflows to inf there and whose autograd still multiplies the removed branch's 0 by it returns 0 * inf = NaN,
and one NaN token turns a whole update into NaN.

The kind plants, on the declared inputs, log-ratios of +-`shift` (800 by default: past exp's range in every
dtype) at the first valid token of each row (or at all of them), and gives each row an advantage sign, cycling
through the six classes (ratio up or down) x (A > 0, A < 0, A = 0) and a seventh row left as drawn: up with
A > 0 and down with A < 0 are clipped, up with A < 0 is an unclipped token whose gradient overflows with the
ratio, A = 0 removes the token; the untouched row's ordinary tokens are compared in the same call.
Odd cases leave out the (up, A < 0) class, so the loss itself stays finite there and its value is compared too.
Value and gradient are then held to a float64 reference that computes the paper's numbers exactly (in log
space where the ratio overflows):

* no NaN, in the value or in any gradient entry;
* exact 0 where the reference says the paper's gradient is 0 (its `zero_grad`; without one, where it gives 0);
* where the paper's gradient is beyond the gradient dtype's range: an infinity (or the largest value) of its sign;
  within 2^24 of the compute dtype's largest value an infinity of its sign is accepted too (the ratio itself
  overflowed before the advantage and the 1/N weight brought the product back into range);
* elsewhere: the element-wise relative error, floored at the dtype's smallest normal number.
"""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind

# (ratio pushed up?, advantage sign) of each row class, in the order rows cycle through them; the last class is a
# row left as drawn (None: nothing planted), so ordinary tokens share the call with the extreme ones.
CLASSES = ((True, 1.0), (True, -1.0), (False, -1.0), (False, 1.0), (True, 0.0), (False, 0.0), (None, None))
# The classes an odd case plants: all but (up, A < 0), whose term is +inf, so the loss is finite and compared.
FINITE_CLASSES = (0, 2, 3, 4, 5, 6)


@kind
class RatioOverflow(Kind):
    name = "ratio_overflow"
    description = ("Log-ratios of +-shift planted at each row's first valid token (or all of them), the rows "
                   "cycling through (ratio up, down) x (A > 0, A < 0, A = 0) and a row left as drawn: no NaN in the value or the gradient, "
                   "exactly 0 gradient where the paper's is 0 (the clip or a zero advantage removes the token), "
                   "an infinity of the right sign where the paper's gradient is beyond the dtype's range, and the "
                   "reference's gradient elsewhere (element-wise relative error).")
    parameters = {**CALL,
                  "reference": {**NAME, "pattern": "^[a-z][a-z0-9_.-]{0,63}$",
                                "description": "registered float64 reference: a dict with value, scale and grad "
                                               "(one tensor per grad_wrt), and optionally zero_grad (bool tensors: "
                                               "where the paper's gradient is exactly 0)"},
                  "grad_reference": {"type": "string", "description": "reference returning the gradients, for a "
                                                                      "value-only reference"},
                  "reference_gets_dtype": {"type": "boolean", "description": "pass dtype= (under test) to it"},
                  "grad_wrt": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 8},
                  "plant": {"type": "object", "additionalProperties": False,
                            "required": ["behaviour", "mask", "advantages"],
                            "description": "where the extreme log-ratios go",
                            "properties": {
                                "behaviour": {**NAME, "description": "the behaviour log-probs (old_logp): lowered "
                                              "by shift to push a ratio up, raised to push it down"},
                                "mask": {**NAME, "description": "the response mask: valid slots"},
                                "advantages": {**NAME, "description": "the advantages ([B] or like the mask): "
                                               "their sign is set per row, 0 for the A = 0 classes"},
                                "shift": {"type": "number", "exclusiveMinimum": 0, "maximum": 10000,
                                          "description": "|log-ratio| planted (default 800)"},
                                "at": {"enum": ["first", "all"], "description": "each row's first valid token "
                                       "(default: a prefix or per-token ratio overflows) or every valid token "
                                       "(a sequence ratio: its mean log-ratio is then +-shift)"}}}}
    required = CALL_REQUIRED + ["reference", "grad_wrt", "plant"]
    metrics = {"value_nan": "NaN outputs where the reference is defined",
               "value_max_scaled_err": "largest |got - want| / the reference's scale (without one: max(|want|, 1)) "
                                       "where the reference value is finite; inf where an infinite one is not matched",
               "grad_nan": "NaN gradient entries",
               "grad_zero_violations": "gradient entries not exactly 0 where the paper's gradient is 0",
               "grad_overflow_mismatches": "entries whose reference gradient is beyond the gradient dtype's range "
                                           "(inf included) that are not an infinity (or the largest value) of its sign",
               "grad_max_rel_err": "largest element-wise |got - want| / max(|want|, the dtype's smallest normal) "
                                   "over the other entries",
               "overflow_zero_grad_tokens": "planted up-tokens whose paper gradient is 0 (clipped, A = 0)",
               "overflow_nonzero_grad_tokens": "planted up-tokens whose paper gradient is not 0",
               "planted_classes": "row classes (ratio up/down x A > 0, < 0, = 0, and untouched) met over the cases",
               "cases": "cases"}

    def measure(self, impl, ctx, params):
        import math

        import torch

        from engine.kinds import calls

        wrt = list(params["grad_wrt"])
        agg = {"value_nan": 0, "value_max_scaled_err": 0.0, "grad_nan": 0, "grad_zero_violations": 0,
               "grad_overflow_mismatches": 0, "grad_max_rel_err": 0.0, "overflow_zero_grad_tokens": 0,
               "overflow_nonzero_grad_tokens": 0}
        seen: set[int] = set()
        n = 0
        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            drawn, up, classes = plant(drawn, params["plant"], case)
            seen |= classes
            t = calls.cast_all(ctx, drawn)
            for name in wrt:
                t[name].requires_grad_(True)
            out = calls.call(impl, params, t)
            grads = calls.grad_of(out, [t[k] for k in wrt])
            ref = calls.reference(params, t, ctx=ctx)
            extra = ref if isinstance(ref, dict) else {}
            want = calls.as64(extra["value"] if extra else ref)
            wg = extra["grad"] if "grad" in extra else calls.reference(params, t, params["grad_reference"], ctx)
            wg = list(wg) if isinstance(wg, (tuple, list)) else [wg]
            zero = list(extra.get("zero_grad") or [None] * len(wg))
            got = calls.as64(out)
            m, w = {}, {}
            defined = ~torch.isnan(want)
            m["value_nan"] = int((defined & torch.isnan(got)).sum())
            finite = defined & torch.isfinite(want)
            scale = float(extra.get("scale", 0.0)) if extra else 0.0
            if not (math.isfinite(scale) and scale > 0):  # no scale of its terms: |value|, at least 1 (a loss can
                scale = max(float(want[finite].abs().max()) if bool(finite.any()) else 0.0, 1.0)  # cancel to ~0)
            err = torch.where(finite, (got - want).abs() / max(scale, 1e-300), torch.zeros_like(got))
            err = torch.where(defined & ~finite & (got != want), torch.full_like(got, math.inf), err)
            m["value_max_scaled_err"], w["value_max_scaled_err"] = calls.worst(torch.nan_to_num(err, nan=math.inf))
            g_nan = zv = ov = 0
            rel, rel_where, z_where = 0.0, None, None
            for name, g, want_g, z in zip(wrt, grads, wg, zero):
                gdt = g.dtype if g.is_floating_point() else torch.float64
                g, want_g = calls.as64(g), calls.as64(want_g)
                z = (want_g == 0) if z is None else calls.as64(z).to(torch.bool)
                fi = torch.finfo(gdt)
                g_nan += int(torch.isnan(g).sum())
                bad_zero = z & (g != 0)
                zv += int(bad_zero.sum())
                if bool(bad_zero.any()) and z_where is None:
                    z_where = {name: calls.unravel(int(bad_zero.flatten().nonzero()[0]), tuple(g.shape))}
                ok = ~torch.isnan(want_g) & ~z
                same_sign = torch.sign(g) == torch.sign(want_g)
                huge = ok & (want_g.abs() > fi.max)  # beyond the gradient dtype: it can only be its infinity
                ov += int((huge & ~(same_sign & (g.abs() >= fi.max / 2))).sum())
                # Within 2^24 of the compute dtype's largest value a ratio may have overflowed before the advantage
                # and the 1/N weight brought the product back into range: an infinity of the right sign is the
                # dtype's limit there, not an error.
                band = ok & ~huge & (want_g.abs() > torch.finfo(torch.promote_types(gdt, torch.float32)).max / 2**24)
                rest = ok & ~huge & ~(band & same_sign & torch.isinf(g))
                e = torch.where(rest, (g - want_g).abs() / want_g.abs().clamp_min(fi.tiny), torch.zeros_like(g))
                v, where = calls.worst(torch.where(rest & torch.isnan(g), torch.full_like(e, math.inf), e))
                if v >= rel:
                    rel, rel_where = v, {name: where}
                if name == wrt[0]:
                    pos = up & ~torch.isnan(want_g)
                    m["overflow_zero_grad_tokens"] = int((pos & z).sum())
                    m["overflow_nonzero_grad_tokens"] = int((pos & ~z).sum())
            m.update(grad_nan=g_nan, grad_zero_violations=zv, grad_overflow_mismatches=ov, grad_max_rel_err=rel)
            w.update(grad_max_rel_err=rel_where, grad_zero_violations=z_where)
            calls.log_case(ctx, case, drawn, m, w, argument=f"log-ratios +-{float(params['plant'].get('shift', 800))} "
                           f"planted, row classes {sorted(classes)}")
            for k, v in m.items():
                agg[k] = max(agg[k], v) if k in ("value_max_scaled_err", "grad_max_rel_err") else agg[k] + v
        return {**agg, "planted_classes": len(seen), "cases": n}


def plant(drawn: dict, spec: dict, case: int):
    """(inputs with the extreme log-ratios and advantage signs planted, bool [B, L] of the planted tokens pushed up,
    the set of row classes planted). Row b with a valid token takes class CLASSES[i % k], i its rank among such
    rows; odd cases cycle through FINITE_CLASSES only."""
    import torch

    out = dict(drawn)
    mask = out[spec["mask"]].to(torch.bool)
    old = out[spec["behaviour"]].to(torch.float64).clone()
    adv = out[spec["advantages"]].to(torch.float64).clone()
    shift = float(spec.get("shift", 800.0))
    every = spec.get("at", "first") == "all"
    cycle = FINITE_CLASSES if case % 2 else tuple(range(len(CLASSES)))
    up = torch.zeros(mask.shape, dtype=torch.bool)
    classes: set[int] = set()
    rows = [b for b in range(mask.shape[0]) if bool(mask[b].any())]
    for i, b in enumerate(rows):
        cls = cycle[i % len(cycle)]
        classes.add(cls)
        go_up, sign = CLASSES[cls]
        if go_up is None:
            continue
        valid = mask[b].nonzero().flatten()
        at = valid if every else valid[:1]
        old[b, at] += -shift if go_up else shift
        up[b, at] = go_up
        size = adv[b].abs().clamp_min(0.5)  # no advantage near 0 by chance: the classes decide which are 0
        if sign == 0.0 and adv.dim() == 2:
            adv[b] = size  # per-token advantages: only the planted tokens get A = 0
            adv[b, at] = 0.0
        else:
            adv[b] = sign * size
    out[spec["behaviour"]] = old
    out[spec["advantages"]] = adv
    return out, up, classes
