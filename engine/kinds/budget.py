"""budget: peak extra memory, ATen operations and wall time of a call, against the size of the problem."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def meter_of(impl, function: str, max_ops: int | None = None):
    """The meter for a call of `impl.function`: the candidate's process's own (engine/run/boundary.py) where the
    function runs there (it counts every operation; `max_ops` is applied to its reading), else the engine's
    AllocationMeter here, which stops the call past `max_ops`."""
    from engine.kinds.meter import AllocationMeter

    metered = getattr(getattr(impl, function, None), "metered", None)
    return metered() if callable(metered) else AllocationMeter(max_ops)


@kind
class Budget(Kind):
    name = "budget"
    description = ("Peak extra memory of the call (and of its backward, with `grad_wrt`) as a multiple of the "
                   "problem size: the bytes of one tensor shaped like input `unit.input` in `unit.dtype` (e.g. one "
                   "[N, V] float32 logits tensor), or of all tensor inputs without `unit`. Counted at the ATen level "
                   "(tensor storage created and not yet freed) on every device, and by the allocator on CUDA (the "
                   "larger counts). Also the ATen operations dispatched (their growth across the declared cases "
                   "shows a Python loop over rows) and the best wall time per input element.")
    parameters = {**CALL, "grad_wrt": {"type": "array", "items": NAME},
                  "repeats": {"type": "integer", "minimum": 1, "maximum": 100},
                  "max_ops": {"type": "integer", "minimum": 1, "description": "the most ATen operations one call "
                              "may dispatch: a call past it is over the budget (ops_over_limit_cases) and is "
                              "stopped there, its ops read max_ops + 1 (a loop over rows need not run to its end)"},
                  "unit": {"type": "object", "additionalProperties": False, "required": ["input", "dtype"],
                           "properties": {"input": NAME, "dtype": {"enum": sorted(DTYPE_BYTES)}},
                           "description": "the problem size: one tensor of this input's shape in this dtype"}}
    required = CALL_REQUIRED
    metrics = {"peak_memory_ratio": "peak extra bytes / bytes of the unit (or of the inputs)",
               "ops_growth": "most ATen operations of a case / fewest of a case", "ns_per_element":
               "best wall time per input element", "input_bytes": "bytes of the inputs", "cases": "cases",
               "ops_over_limit_cases": "cases whose call dispatched more than max_ops operations (0 without it)",
               "outside_peak_memory_ratio": "--impl only: the candidate process's peak resident memory during the "
               "call as the kernel reports it to the supervisor, less the frames' transport, / the unit; "
               "peak_memory_ratio is never below it",
               "outside_cpu_ns_per_element": "--impl only: the candidate process's CPU time during the call (every "
               "thread, the frames' handling included) as the kernel counts it, per input element, best repeat"}

    def measure(self, impl, ctx, params):
        """Under `contracts check --impl` the function runs in the candidate's process, and its memory, operations
        and time are that process's: the call loop meters the call there (`Remote.metered`) and this reads the
        meter it sent; otherwise the engine's meter here."""
        import time

        import torch

        from engine.kinds import calls
        from engine.kinds.meter import OpLimitReached

        max_ops = params.get("max_ops")
        over = 0
        wrt = list(params.get("grad_wrt") or [])
        cuda = ctx.device.type == "cuda"
        unit = params.get("unit")
        peak_ratio, ns, size, n, outside_ratio, outside_ns = 0.0, 0.0, 0, 0, 0.0, 0.0
        ops: list[int] = []
        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            t = calls.cast_all(ctx, drawn)
            del drawn  # the float64 draws are not the call's memory
            for k in wrt:
                t[k].requires_grad_(True)
            tensors = [v for v in t.values() if isinstance(v, torch.Tensor)]
            nbytes = sum(v.numel() * v.element_size() for v in tensors)
            denom = t[unit["input"]].numel() * DTYPE_BYTES[unit["dtype"]] if unit else nbytes
            elements = sum(v.numel() for v in tensors)
            best, case_peak, case_outside, case_cpu = float("inf"), 0, 0, float("inf")
            for _ in range(int(params.get("repeats", 3))):
                if cuda:
                    torch.cuda.synchronize(ctx.device)
                    torch.cuda.reset_peak_memory_stats(ctx.device)
                    before = torch.cuda.memory_allocated(ctx.device)
                start = time.perf_counter()
                with meter_of(impl, params["function"], max_ops) as meter:
                    try:
                        out = calls.call(impl, params, t)
                        if wrt:
                            calls.grad_of(out, [t[k] for k in wrt])
                        del out
                    except OpLimitReached:
                        pass  # the meter says so (stopped); what ran until then is measured
                if cuda:
                    torch.cuda.synchronize(ctx.device)
                took = time.perf_counter() - start
                elsewhere = getattr(meter, "measured_in", None) == "candidate"
                best = min(best, meter.seconds if elsewhere else took)
                peak = meter.peak_bytes
                cpu = getattr(meter, "outside_cpu_seconds", None)
                if cpu is not None:
                    case_cpu = min(case_cpu, cpu)
                outside = getattr(meter, "outside_peak_bytes", None)  # the supervisor's reading of that process
                if outside is not None:
                    case_outside = max(case_outside, outside)
                    peak = max(peak, outside)
                if cuda and not elsewhere:
                    peak = max(peak, torch.cuda.max_memory_allocated(ctx.device) - before)
                case_peak = max(case_peak, peak)
            case_ops = meter.ops  # the last repeat's: one call, as the memory
            if max_ops is not None and (getattr(meter, "stopped", False) or case_ops > max_ops):
                case_ops, over = max_ops + 1, over + 1  # alike whether it was stopped here or counted elsewhere
            ops.append(case_ops)
            outside_ratio = max(outside_ratio, case_outside / max(denom, 1))
            if case_cpu != float("inf"):
                outside_ns = max(outside_ns, case_cpu * 1e9 / max(elements, 1))
            m = {"peak_memory_ratio": case_peak / max(denom, 1), "ops": case_ops,
                 "ns_per_element": best * 1e9 / max(elements, 1)}
            calls.log_case(ctx, case, t, m)
            peak_ratio, ns, size = max(peak_ratio, m["peak_memory_ratio"]), max(ns, m["ns_per_element"]), \
                max(size, nbytes)
        out = {"peak_memory_ratio": peak_ratio, "ops_growth": max(ops) / max(min(ops), 1) if ops else 0.0,
               "ns_per_element": ns, "input_bytes": size, "cases": n, "ops_over_limit_cases": over}
        if callable(getattr(getattr(impl, params["function"], None), "metered", None)):  # across the boundary
            out["outside_peak_memory_ratio"] = outside_ratio  # the kernel's reading, taken by the supervisor
            out["outside_cpu_ns_per_element"] = outside_ns  # its CPU time (all threads; ticks of 10 ms)
        return out
