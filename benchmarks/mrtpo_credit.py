"""MRTPO credit weights at a real vocabulary against a naive unchunked version.

Both start from what the frozen replay model emits: K + 1 logit tensors
[B, T, V] (the full context and K leave-one-out contexts). The naive version
materialises all K + 1 log-softmaxes and runs the JS arithmetic on whole
[B*T, V] tensors (the registered `mrtpo.js_unchunked` mutant, which is the
method's arithmetic without the blocking). Time is measured side by side in
this process; peak extra memory (above the inputs) in a fresh subprocess per
variant: peak resident size on the CPU, torch.cuda.max_memory_allocated on a GPU.

    python -m benchmarks.mrtpo_credit --child method --rows 512   # one variant, JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.harness import Row, paired, proc_status_kib, reset_peak_rss, run_json_subprocess, spread

K, V, BETA = 2, 152_064, 0.6
TIME_TARGET, MEMORY_TARGET = 1.0, 0.25


def make_inputs(rows: int, device: str, seed: int = 0, length: int = 256):
    """K + 1 logit tensors [B, T, V] (T = length, B = rows / T) and a mask with padding, float32."""
    import torch

    B = max(1, rows // length)
    T = rows // B
    g = torch.Generator(device="cpu").manual_seed(seed)
    base = torch.randn(B, T, V, generator=g) * 2.0
    contexts = [base]
    for _ in range(K):  # a leave-one-out context moves the distribution a little, not everywhere
        shift = torch.randn(B, T, V, generator=g).mul_(0.3)
        contexts.append(base + shift)
        del shift
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return [c.to(device) for c in contexts], mask.to(device)


def naive(contexts, mask):
    """All K + 1 log-softmaxes materialised, then the unchunked JS on whole tensors."""
    import torch

    from engine.spec import registry

    impl = registry.load().get_mutant("mrtpo.js_unchunked").factory()
    logps = [torch.log_softmax(c, dim=-1) for c in contexts]
    return impl.credit_weights(logps[0], logps[1:], mask, BETA)


def method(contexts, mask):
    """The method's path from logits to weights: blocks of rows, never a whole log-softmax."""
    from methods.mrtpo.credit import credit_weights_from_logits

    return credit_weights_from_logits(contexts[0], contexts[1:], mask, BETA)


VARIANTS = {"naive": naive, "method": method}


def child(variant: str, rows: int, device: str) -> dict:
    """Peak extra memory of one variant in this (fresh) process, above its inputs."""
    import gc

    import torch

    from engine.spec import registry

    registry.load()
    contexts, mask = make_inputs(rows, device)
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        w = VARIANTS[variant](contexts, mask)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        extra = torch.cuda.max_memory_allocated() - base
        how = "torch.cuda.max_memory_allocated"
    elif reset_peak_rss():
        base = proc_status_kib("VmRSS") * 1024
        t0 = time.perf_counter()
        w = VARIANTS[variant](contexts, mask)
        seconds = time.perf_counter() - t0
        extra = proc_status_kib("VmHWM") * 1024 - base
        how = "peak resident size (VmHWM) after a reset"
    else:  # no /proc/self/clear_refs: the growth of the process's peak, which the inputs already set
        import resource

        scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
        t0 = time.perf_counter()
        w = VARIANTS[variant](contexts, mask)
        seconds = time.perf_counter() - t0
        extra = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale - base
        how = "growth of the peak resident size (ru_maxrss; no reset available)"
    inputs = sum(c.numel() * c.element_size() for c in contexts)
    return {"variant": variant, "extra_bytes": extra, "input_bytes": inputs, "seconds": seconds, "how": how,
            "weights_sum": float(w.double().sum())}


def run(device: str = "cpu", repeats: int = 3, rows: int | None = None) -> Row:
    import torch

    # Enough rows that the naive version's extra memory is in gigabytes: 1.5 GB at 256 rows, 24 GB at 4096.
    rows = rows or (4096 if device.startswith("cuda") else 256)
    contexts, mask = make_inputs(rows, device)
    w_method, w_naive = method(contexts, mask), naive(contexts, mask)
    max_diff = float((w_method.double() - w_naive.double()).abs().max())
    t = paired(lambda: method(contexts, mask), lambda: naive(contexts, mask), repeats, device, warmup=0)
    del contexts, w_method, w_naive
    mem = {v: run_json_subprocess(["-m", "benchmarks.mrtpo_credit", "--child", v, "--rows", str(rows), "--device",
                                   device]) for v in ("method", "naive")}
    mem_ratio = mem["method"]["extra_bytes"] / mem["naive"]["extra_bytes"]
    r = t["ratio_median"]
    ok = r <= TIME_TARGET and mem_ratio <= MEMORY_TARGET
    B = max(1, rows // 256)
    return Row(
        name="MRTPO credit weights", shape=f"K={K}, V={V:,}, {B} x {rows // B} rows ({int(mask.sum())} valid), float32",
        against="naive unchunked (K+1 log-softmaxes materialised)", value=r, unit="x",
        target=f"time <= {TIME_TARGET}x; memory <= {MEMORY_TARGET}x", ok=ok,
        spread=spread(t["ratio_min"], t["ratio_max"], repeats) + f"; memory {mem_ratio:.3f}x",
        note=f"{t['a_median_s']:.2f} s vs {t['b_median_s']:.2f} s, CPU-time ratio {t['cpu_ratio']:.2f}x; "
             f"peak extra memory {mem['method']['extra_bytes'] / 2**20:.0f} MiB vs "
             f"{mem['naive']['extra_bytes'] / 2**20:.0f} MiB ({mem['method']['how']}); max |w - w_naive| {max_diff:.2e}",
        details={"memory_ratio": mem_ratio, "memory": mem, "method_median_s": t["a_median_s"],
                 "naive_median_s": t["b_median_s"], "ratios": t["ratios"], "cpu_ratio": t["cpu_ratio"],
                 "max_abs_diff": max_diff,
                 "torch_threads": torch.get_num_threads()},
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", choices=sorted(VARIANTS), required=True)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    print(json.dumps(child(a.child, a.rows, a.device)))
