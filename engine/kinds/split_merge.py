"""split_merge: the batch split by rows or groups and recombined with a declared weight reproduces the full call."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind


@kind
class SplitMerge(Kind):
    name = "split_merge"
    description = ("Splitting the batch by rows (or whole groups) and recombining each part's output weighted by a "
                   "declared metric (e.g. `tokens`) reproduces the full call's value and gradient; with `permute`, "
                   "a permutation of rows (or groups) gives the same value and the permuted gradient.")
    parameters = {**CALL,
                  "split": {"enum": ["rows", "groups"]},
                  "group_size": {"type": "integer", "minimum": 1},
                  "weight": {"type": "string", "description": "key of the metrics dict (output `metrics_output`) "
                             "that weights each part; without it parts weigh by their row count"},
                  "metrics_output": {"type": "integer", "minimum": 0},
                  "grad_wrt": {"type": "array", "items": NAME},
                  "permute": {"type": "boolean"},
                  "scale_reference": {"type": "string", "description": "float64 reference whose `scale` (or value) "
                                      "value_rel_diff divides by, instead of max(|full|, 1): a loss can cancel"},
                  "batch_args": {"type": "array", "items": NAME, "description": "inputs cut along dim 0 "
                                 "(default: every tensor input)"}}
    required = CALL_REQUIRED + ["split"]
    metrics = {"value_rel_diff": "|merged - full| / max(|full|, 1), or / the scale_reference's scale", "grad_max_rel_diff":
               "largest gradient difference / max |full gradient|", "permuted_value_rel_diff": "permutation",
               "permuted_grad_max_rel_diff": "permutation", "cases": "cases"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.kinds import calls

        wrt = list(params.get("grad_wrt") or [])
        batch_args = params.get("batch_args")
        agg = {"value_rel_diff": 0.0, "grad_max_rel_diff": 0.0}
        if params.get("permute"):
            agg.update(permuted_value_rel_diff=0.0, permuted_grad_max_rel_diff=0.0)
        n = 0

        def run(t):
            t = {k: (v.detach().clone().requires_grad_(True) if k in wrt else v) for k, v in t.items()}
            fn = getattr(impl, params["function"])
            args, kwargs = calls.bind(params, t)
            out = fn(*args, **kwargs)
            value = calls.select(out, params.get("output"))
            weight = 1.0
            if params.get("weight"):
                weight = float(calls.select(out, params.get("metrics_output", 1))[params["weight"]])
            grads = calls.grad_of(value, [t[k] for k in wrt]) if wrt else []
            return value.detach().to(torch.float64), [g.to(torch.float64) for g in grads], weight

        def cut(t, sl):
            return {k: (v[sl] if isinstance(v, torch.Tensor) and v.dim() and (batch_args is None or k in batch_args)
                        else v) for k, v in t.items()}

        for case, drawn, dims in calls.cases(ctx, params):
            n += 1
            t = calls.cast_all(ctx, drawn)
            B = next(v.shape[0] for k, v in t.items() if isinstance(v, torch.Tensor) and v.dim()
                     and (batch_args is None or k in batch_args))
            unit = int(params.get("group_size", 1)) if params["split"] == "groups" else 1
            units = max(B // unit, 1)
            g = torch.Generator().manual_seed(ctx.seed * 7 + case)
            at = int(torch.randint(1, units, (1,), generator=g)) * unit if units > 1 else B
            full, g_full, _ = run(t)
            parts = [run(cut(t, sl)) for sl in (slice(0, at), slice(at, B)) if sl.start < sl.stop]
            total = sum(w for _, _, w in parts)
            merged = sum(v * w for v, _, w in parts) / total
            if params.get("scale_reference"):
                r = calls.reference(params, t, params["scale_reference"], ctx)
                scale = float(r["scale"]) if isinstance(r, dict) else float(calls.as64(r).abs().max())
            else:
                scale = max(float(full.abs().max()), 1.0)
            vdiff = float((merged - full).abs().max()) / max(scale, 1e-300)
            merged_grads = [torch.cat([gs[i] * weight for _, gs, weight in parts]) / total for i in range(len(wrt))]
            gdiff, where = calls.grad_diff(wrt, merged_grads, g_full)
            m = {"value_rel_diff": vdiff if vdiff == vdiff else float("inf"), "grad_max_rel_diff": gdiff}
            arg = f"split at row {at} of {B}"
            if params.get("permute"):
                perm_units = torch.randperm(units, generator=g)
                perm = (perm_units[:, None] * unit + torch.arange(unit)[None, :]).flatten() if units * unit == B \
                    else torch.randperm(B, generator=g)
                pt = {k: (v[perm.to(v.device)] if isinstance(v, torch.Tensor) and v.dim() and
                          (batch_args is None or k in batch_args) else v) for k, v in t.items()}
                pv, pg, _ = run(pt)
                m["permuted_value_rel_diff"] = float((pv - full).abs().max()) / max(scale, 1e-300)
                m["permuted_grad_max_rel_diff"] = calls.grad_diff(wrt, pg, [g[perm] for g in g_full])[0]
                arg += f"; permutation {perm.tolist()}"
            calls.log_case(ctx, case, drawn, m, {"grad_max_rel_diff": where}, argument=arg)
            for k, v in m.items():
                agg[k] = max(agg[k], v)
        return {**agg, "cases": n}
