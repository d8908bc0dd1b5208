"""reported_metrics: what a candidate's functions report about themselves (a loss's metrics dict) against the
supervisor's own figure for the same quantity, measured in a training run from the tensors that crossed."""

from __future__ import annotations

from engine.kinds.base import Kind, kind
from engine.kinds.gradient_audit import RUN


@kind
class ReportedMetrics(Kind):
    name = "reported_metrics"
    description = ("A run's supervisor computes every quantity it judges (ratio extremes, clip counts, gates, "
                   "the cap s) from the tensors that crossed, never from a metrics dict a candidate's function "
                   "returns; the run keeps each reported figure beside its own, per update and arm, and this "
                   "kind compares them: |reported - supervisor's| beyond an honest slack (a token within "
                   "rounding of a clip bound), over max(1, |supervisor's|). A report that disagrees fails here, "
                   "naming seed, arm, update, function and key; it never changes a measurement.")
    parameters = {
        "run": RUN,
        "run_params": {"type": "object", "description": "the params the run reads (its settings)"},
        "required": {"type": "array", "maxItems": 32, "uniqueItems": True,
                     "items": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}([.][A-Za-z_][A-Za-z0-9_]{0,63})?$"},
                     "description": "keys the interface requires in the report (`function.key` or `key`): a "
                     "report without one counts in required_missing"},
    }
    required = ["run"]
    metrics = {"reported_max_scaled_err": "largest disagreement (each a case naming seed, arm, update and key)",
               "reported_compared": "reported figures compared", "reported_keys": "distinct keys compared",
               "reported_missing": "declared keys a report left out (optional ones included)",
               "required_missing": "reports without a key of `required`", "cases": "1 (the run)"}

    def measure(self, impl, ctx, params):
        from engine.kinds import calls
        from engine.kinds.paired_control import _fresh, get_run
        from engine.run.run_audit import RunAudit

        audit = RunAudit(seed=ctx.seed)
        run_ctx = _fresh(ctx, params=dict(params.get("run_params") or {}), audit=audit)
        get_run(params["run"])(impl, run_ctx)
        if getattr(ctx, "audit", None) is not None:  # the runner sees that this contract's run was audited
            ctx.audit.delegated += len(audit.entries)
        required = set(params.get("required") or [])
        worst, compared, missing, required_missing, keys = 0.0, 0, 0, 0, set()
        for r in audit.reported:
            at = (f"arm {r['arm']}, update {r['update']}" + (f" ({r['where']})" if r["where"] else "")
                  + f": {r['function']} metrics[{r['key']!r}]")
            if r["missing"]:
                missing += 1
                required_missing += int(r["key"] in required or f"{r['function']}.{r['key']}" in required)
                continue
            compared += 1
            keys.add((r["function"], r["key"]))
            worst = max(worst, r["error"])
            calls.log_case(ctx, 0, {}, {"reported_max_scaled_err": r["error"]}, {"reported_max_scaled_err": at})
        return {"reported_max_scaled_err": worst, "reported_compared": compared, "reported_keys": len(keys),
                "reported_missing": missing, "required_missing": required_missing, "cases": 1}
