"""budget: peak extra memory and wall time of a call, as a multiple of the size of its inputs."""

from __future__ import annotations

from engine.kinds.base import CALL, CALL_REQUIRED, NAME, Kind, kind


@kind
class Budget(Kind):
    name = "budget"
    description = ("Peak extra device memory of the call (and of its backward, with `grad_wrt`) as a multiple of "
                   "the bytes of its tensor inputs (CUDA only: elsewhere recorded as not applicable), and its wall "
                   "time per input element.")
    parameters = {**CALL, "grad_wrt": {"type": "array", "items": NAME},
                  "repeats": {"type": "integer", "minimum": 1, "maximum": 100}}
    required = CALL_REQUIRED
    metrics = {"peak_memory_ratio": "peak extra bytes / input bytes (cuda)", "ns_per_element":
               "best wall time per input element", "input_bytes": "bytes of the inputs", "cases": "cases"}

    def measure(self, impl, ctx, params):
        import time

        import torch

        from engine.kinds import calls

        wrt = list(params.get("grad_wrt") or [])
        cuda = ctx.device.type == "cuda"
        peak_ratio, ns, size, n = 0.0, 0.0, 0, 0
        for case, drawn, _ in calls.cases(ctx, params):
            n += 1
            t = calls.cast_all(ctx, drawn)
            for k in wrt:
                t[k].requires_grad_(True)
            nbytes = sum(v.numel() * v.element_size() for v in t.values() if isinstance(v, torch.Tensor))
            elements = sum(v.numel() for v in t.values() if isinstance(v, torch.Tensor))
            best = float("inf")
            for _ in range(int(params.get("repeats", 3))):
                if cuda:
                    torch.cuda.synchronize(ctx.device)
                    torch.cuda.reset_peak_memory_stats(ctx.device)
                    before = torch.cuda.memory_allocated(ctx.device)
                start = time.perf_counter()
                out = calls.call(impl, params, t)
                if wrt:
                    calls.grad_of(out, [t[k] for k in wrt])
                if cuda:
                    torch.cuda.synchronize(ctx.device)
                    peak_ratio = max(peak_ratio, (torch.cuda.max_memory_allocated(ctx.device) - before) / nbytes)
                best = min(best, time.perf_counter() - start)
                del out
            m = {"ns_per_element": best * 1e9 / max(elements, 1)}
            if cuda:
                m["peak_memory_ratio"] = peak_ratio
            calls.log_case(ctx, case, drawn, m)
            ns, size = max(ns, m["ns_per_element"]), max(size, nbytes)
        if not cuda:
            ctx.not_applicable("peak memory is measured on CUDA devices only", "peak_memory_ratio")
        out = {"ns_per_element": ns, "input_bytes": size, "cases": n}
        if cuda:
            out["peak_memory_ratio"] = peak_ratio
        return out
