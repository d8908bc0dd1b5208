"""gradient_structure: where the Jacobian of an output w.r.t. an argument must be zero, diagonal, or block-per-row."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind


@kind
class GradientStructure(Kind):
    name = "gradient_structure"
    description = ("The Jacobian of the output w.r.t. one argument has the declared structure: `diagonal` (each "
                   "output depends on its own position only) or `row_block` (on its own row only); every entry at "
                   "a masked position is exactly 0; the diagonal equals a float64 reference where one is named.")
    parameters = {**CALL,
                  "wrt": NAME,
                  "structure": {"enum": ["diagonal", "row_block", "masked_only"]},
                  "mask": NAME,
                  "diagonal_reference": {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{0,63}$"},
                  "support_reference": {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{0,63}$",
                                        "description": "float64 reference (same arguments) returning a bool tensor "
                                        "of `wrt`'s shape, True where the gradient must be non-zero and False where "
                                        "it must be exactly 0 (or a dict {support, counts})"}}
    required = CALL_REQUIRED + ["wrt", "structure"]
    metrics = {"offdiag_max_abs": "largest entry outside the allowed structure",
               "masked_grad_max_abs": "largest entry in a masked column", "diag_max_rel_err":
               "largest |diag - reference| / |reference|", "nonfinite": "non-finite entries",
               "outside_support_max_abs": "largest entry where support_reference says 0",
               "support_nonzero_fraction": "share of the support's entries that are non-zero", "cases": "cases"}

    def measure(self, impl, ctx, params):
        import math

        import torch

        from engine.kinds import calls

        wrt = params["wrt"]
        agg = {"offdiag_max_abs": 0.0, "masked_grad_max_abs": 0.0, "nonfinite": 0}
        if params.get("diagonal_reference"):
            agg["diag_max_rel_err"] = 0.0
        if params.get("support_reference"):
            agg.update(outside_support_max_abs=0.0, support_nonzero_fraction=1.0)
        n = 0
        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            t = calls.cast_all(ctx, drawn)
            x0 = t[wrt]

            def f(x):
                return calls.call(impl, params, {**t, wrt: x})

            jac = torch.autograd.functional.jacobian(f, x0)
            out_shape, in_shape = f(x0).shape, x0.shape
            J = jac.detach().to("cpu", torch.float64).reshape(math.prod(out_shape), math.prod(in_shape))
            nonfinite = int((~torch.isfinite(J)).sum())
            J = torch.nan_to_num(J, nan=math.inf)
            allowed = torch.zeros_like(J, dtype=torch.bool)
            if params["structure"] == "diagonal" and J.shape[0] == J.shape[1]:
                allowed = torch.eye(J.shape[0], dtype=torch.bool)
            elif params["structure"] == "row_block":
                rows_out = torch.arange(J.shape[0]) // max(math.prod(out_shape[1:]), 1)
                rows_in = torch.arange(J.shape[1]) // max(math.prod(in_shape[1:]), 1)
                allowed = rows_out[:, None] == rows_in[None, :]
            elif params["structure"] == "masked_only":
                allowed = torch.ones_like(J, dtype=torch.bool)
            masked_cols = torch.zeros(J.shape[1], dtype=torch.bool)
            if params.get("mask"):
                masked_cols = ~drawn[params["mask"]].to(torch.bool).reshape(-1)
            off, w_off = calls.worst(torch.where(allowed, torch.zeros_like(J), J.abs()))
            mg, w_m = calls.worst(torch.where(masked_cols[None, :], J.abs(), torch.zeros_like(J)))
            m = {"offdiag_max_abs": off, "masked_grad_max_abs": mg, "nonfinite": nonfinite}
            w = {"offdiag_max_abs": w_off, "masked_grad_max_abs": w_m}
            if params.get("diagonal_reference"):
                want = calls.as64(calls.reference(params, t, params["diagonal_reference"])).reshape(-1)
                diag = J.diagonal()
                ok = ~torch.isnan(want)
                err = torch.where(ok, (diag - want).abs() / want.abs().clamp_min(1e-300), torch.zeros_like(diag))
                m["diag_max_rel_err"], w["diag_max_rel_err"] = calls.worst(err)
            if params.get("support_reference"):
                sup = calls.reference(params, t, params["support_reference"])
                counts = sup.get("counts") or {} if isinstance(sup, dict) else {}
                sup = (sup["support"] if isinstance(sup, dict) else sup).to(torch.bool).reshape(-1)
                m["outside_support_max_abs"], w["outside_support_max_abs"] = calls.worst(
                    torch.where(sup[None, :], torch.zeros_like(J), J.abs()))
                hit = (J[:, sup] != 0).any(dim=0)
                m["support_nonzero_fraction"] = float(hit.double().mean()) if hit.numel() else 1.0
                for k, v in counts.items():
                    m[k] = int(v)
            calls.log_case(ctx, case, drawn, m, w)
            for k, v in m.items():
                if k == "support_nonzero_fraction":
                    agg[k] = min(agg[k], v)
                elif k == "nonfinite" or k not in self.metrics:
                    agg[k] = agg.get(k, 0) + v
                else:
                    agg[k] = max(agg[k], v)
        return {**agg, "cases": n}
