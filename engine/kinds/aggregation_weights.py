"""aggregation_weights: how much each valid token weighs in a policy loss, against the weighting its paper declares.

Policy-gradient losses of the GRPO family differ most in how they aggregate per-token terms: the token mean over
the batch (DAPO, CISPO, GPG), each response's token mean then the mean over responses (GRPO's paper, GMPO's
1/|o_i|), or a token sum over a constant (Dr. GRPO). The kind puts the loss where every token's term is the plain
policy gradient (advantages set to 1, and the behaviour log-probs tied to the current ones: ratio 1, nothing
clipped), so d loss / d logp_t = -w_t, the token's aggregation weight, and holds w to the declared scheme:

    token_mean       w_t = 1 / N                       N valid tokens of the call
    sequence_mean    w_t = 1 / (G |o_i|)               G responses, |o_i| valid tokens of t's response
    constant         w_t = 1 / (G C)                   C = norm_length (None: the padded length L)
    token_sum        w_t = 1

G counts the non-empty responses (`rows: nonempty`, the default) or every row (`rows: all`). Masked slots weigh
exactly 0. `length_exponent` is the least-squares slope of log w over log |o_i| across responses of different
lengths (0 for a token-level weighting, -1 for a per-response mean), so a failure says which weighting the code has.
"""

from __future__ import annotations

from engine.kinds.base import ARG, CALL, CALL_REQUIRED, NAME, Kind, kind

_EXPONENT = {"token_mean": 0.0, "sequence_mean": -1.0, "constant": 0.0, "token_sum": 0.0}


@kind
class AggregationWeights(Kind):
    name = "aggregation_weights"
    description = ("At the plain policy-gradient point (advantages `set` to 1, behaviour log-probs `tie`d to the "
                   "current ones), -d loss / d `wrt` is each valid token's aggregation weight; it must be the "
                   "declared `scheme` (token_mean 1/N, sequence_mean 1/(G |o_i|), constant 1/(G C) with C = "
                   "`norm_length` or the padded length, token_sum 1; G the non-empty responses, or all rows with "
                   "`rows: all`), and exactly 0 at masked slots.")
    parameters = {**CALL,
                  "scheme": {"enum": sorted(_EXPONENT)},
                  "mask": NAME,
                  "wrt": {**NAME, "description": "the log-prob input the weights are read from (default logp)"},
                  "set": {"type": "object", "additionalProperties": {"type": "number"},
                          "description": "input -> value it is filled with (the advantages: 1)"},
                  "tie": {"type": "object", "additionalProperties": NAME,
                          "description": "input -> the input it is set equal to (old_logp: logp, ratio 1)"},
                  "norm_length": {**ARG, "description": "constant scheme: C, an input or {value: C}; None: L"},
                  "rows": {"enum": ["nonempty", "all"]}}
    required = CALL_REQUIRED + ["scheme", "mask"]
    metrics = {"weight_max_rel_err": "largest |w - declared| / declared over valid tokens",
               "masked_weight_max_abs": "largest |w| at a masked slot",
               "length_exponent": "slope of log w over log |o_i| (0: every token equal, -1: per-response mean)",
               "length_exponent_err": "|length_exponent - the declared scheme's|", "nonfinite": "non-finite weights",
               "cases": "cases"}

    def measure(self, impl, ctx, params):
        import math

        import torch

        from engine.kinds import calls

        wrt = params.get("wrt") or "logp"
        agg = {"weight_max_rel_err": 0.0, "masked_weight_max_abs": 0.0, "length_exponent": 0.0,
               "length_exponent_err": 0.0, "nonfinite": 0}
        n = 0
        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            point = dict(drawn)
            for k, v in (params.get("set") or {}).items():
                point[k] = torch.full_like(drawn[k], float(v))
            for k, src in (params.get("tie") or {}).items():
                point[k] = drawn[src].clone()
            t = calls.cast_all(ctx, point)
            t[wrt].requires_grad_(True)
            (g,) = calls.grad_of(calls.call(impl, params, t), [t[wrt]])
            w = -calls.as64(g)
            m = drawn[params["mask"]].to(torch.bool).cpu()
            want = _declared(params, m, point)
            valid_err = torch.where(m, (w - want).abs() / want.clamp_min(1e-300), torch.zeros_like(w))
            valid_err = torch.where(torch.isfinite(w), valid_err, torch.full_like(w, math.inf))
            rel, where = calls.worst(valid_err)
            masked, where_m = calls.worst(torch.where(m, torch.zeros_like(w), w.abs()))
            slope = _length_exponent(w, m, _EXPONENT[params["scheme"]])
            mm = {"weight_max_rel_err": rel, "masked_weight_max_abs": masked,
                  "length_exponent": slope, "length_exponent_err": abs(slope - _EXPONENT[params["scheme"]]),
                  "nonfinite": int((~torch.isfinite(w)).sum())}
            calls.log_case(ctx, case, drawn, mm, {"weight_max_rel_err": where, "masked_weight_max_abs": where_m},
                           argument=f"scheme {params['scheme']}; " + ", ".join(
                               [f"{k}={v}" for k, v in (params.get("set") or {}).items()]
                               + [f"{k}={v}" for k, v in (params.get("tie") or {}).items()]))
            for k, v in mm.items():
                if k == "nonfinite":
                    agg[k] += v
                elif k == "length_exponent":
                    agg[k] = v if abs(v - _EXPONENT[params["scheme"]]) >= agg["length_exponent_err"] else agg[k]
                else:
                    agg[k] = max(agg[k], v)
        return {**agg, "cases": n}


def _declared(params: dict, m, drawn: dict):
    """The declared weight of every slot ([B, L] float64; masked slots are not read)."""
    import torch

    from engine.kinds import calls

    n_row = m.sum(dim=-1).to(torch.float64)
    rows = float((n_row > 0).sum()) if params.get("rows", "nonempty") == "nonempty" else float(m.shape[0])
    scheme = params["scheme"]
    if scheme == "token_mean":
        w = torch.full(m.shape, 1.0 / float(n_row.sum()), dtype=torch.float64)
    elif scheme == "sequence_mean":
        w = (1.0 / (rows * n_row.clamp_min(1.0)))[:, None].expand(m.shape)
    elif scheme == "constant":
        c = calls.bind({"args": [params["norm_length"]] if "norm_length" in params else []}, drawn)[0]
        c = float(m.shape[-1]) if not c or c[0] is None else float(c[0])
        w = torch.full(m.shape, 1.0 / (rows * c), dtype=torch.float64)
    else:
        w = torch.ones(m.shape, dtype=torch.float64)
    return w


def _length_exponent(w, m, declared: float) -> float:
    """Least-squares slope of log(mean weight of a response) over log(its length), across non-empty responses;
    `declared` when fewer than two lengths differ (nothing to fit), inf when a response's weight is not positive."""
    import math

    import torch

    n_row = m.sum(dim=-1)
    keep = n_row > 0
    if int(keep.sum()) < 2:
        return declared
    mean_w = torch.where(m, w, torch.zeros_like(w)).sum(dim=-1)[keep] / n_row[keep].to(torch.float64)
    x = n_row[keep].to(torch.float64).log()
    if not bool((mean_w > 0).all()):
        return math.inf
    if float(x.max() - x.min()) == 0.0:
        return declared
    y = mean_w.log()
    xc = x - x.mean()
    return float((xc * (y - y.mean())).sum() / (xc * xc).sum())
