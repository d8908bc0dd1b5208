"""The GRPO control loss and GSPO beside verl's own `vanilla` and `gspo` policy losses: forward + backward time,
paired in one process, and peak extra memory of one forward + backward, each variant in a fresh subprocess.

    python -m benchmarks.family_loss --child grpo|vanilla|gspo|verl-gspo --batch 8 --length 16384
"""

from __future__ import annotations

import argparse
import json
import time

from benchmarks.harness import Row, gpu_note, paired, proc_status_kib, reset_peak_rss, run_json_subprocess, spread

TARGET = 1.0  # at or below verl's time and memory
CLIP = {"grpo": (0.2, 0.2), "gspo": (3e-4, 4e-4)}


def make_inputs(batch: int, length: int, device: str, seed: int = 0):
    """The TAPO row's inputs (benchmarks/tapo_loss.py): drift 0.05, valid lengths drawn from [length/2, length]."""
    from benchmarks.tapo_loss import make_inputs as tapo_inputs

    return tapo_inputs(batch, length, device, seed)


def variant(name: str):
    """fn(logp, old, adv, mask) -> loss for one side of a row; verl's config is built once, outside the timing."""
    if name == "grpo":
        from methods.common.grpo import grpo_token_loss

        return lambda logp, old, adv, mask: grpo_token_loss(logp, old, adv, mask, 0.2)[0]
    if name == "gspo":
        from methods.gspo.loss import gspo_loss

        return lambda logp, old, adv, mask: gspo_loss(logp, old, adv, mask)[0]
    from engine.run.adapters.verl import actor_config, call_policy_loss
    from verl.trainer.ppo import core_algos

    loss_name, (lo, hi), agg = {"vanilla": ("vanilla", CLIP["grpo"], "token-mean"),
                                "verl-gspo": ("gspo", CLIP["gspo"], "seq-mean-token-mean")}[name]
    fn = core_algos.POLICY_LOSS_REGISTRY[loss_name]
    cfg = actor_config(clip_ratio=hi, clip_ratio_low=lo, clip_ratio_high=hi, rollout_n=1, loss_agg_mode=agg)
    return lambda logp, old, adv, mask: call_policy_loss(
        fn, old_log_prob=old, log_prob=logp, advantages=adv[:, None].expand_as(logp), response_mask=mask,
        loss_agg_mode=agg, config=cfg)[0]


def child(name: str, batch: int, length: int, device: str) -> dict:
    """Peak extra memory of one forward + backward of `name` in this (fresh) process, above its inputs."""
    import gc

    import torch

    fn = variant(name)
    logp, old, adv, mask = make_inputs(batch, length, device)
    small = [t[:, :64].contiguous() for t in (logp.detach(), old, mask)]  # a warm call: lazy imports and kernels
    x = small[0].requires_grad_(True)
    fn(x, small[1], adv, small[2]).backward()
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn(logp, old, adv, mask).backward()
        torch.cuda.synchronize()
        extra, how = torch.cuda.max_memory_allocated() - base, "torch.cuda.max_memory_allocated"
    elif reset_peak_rss():
        base = proc_status_kib("VmRSS") * 1024
        fn(logp, old, adv, mask).backward()
        extra, how = proc_status_kib("VmHWM") * 1024 - base, "peak resident size (VmHWM) after a reset"
    else:
        raise RuntimeError("no way to reset the peak resident size here (/proc/self/clear_refs)")
    return {"variant": name, "extra_bytes": extra, "how": how,
            "input_bytes": sum(t.numel() * t.element_size() for t in (logp, old, adv, mask))}


def _row(ours: str, theirs: str, title: str, against: str, device: str, repeats: int, batch: int, length: int,
         memory: bool) -> Row:
    import torch

    logp, old, adv, mask = make_inputs(batch, length, device)
    f_ours, f_theirs = variant(ours), variant(theirs)
    with torch.no_grad():
        diff = abs(float(f_ours(logp, old, adv, mask)) - float(f_theirs(logp, old, adv, mask)))

    def run(fn):
        def once():
            fn(logp, old, adv, mask).backward()
            logp.grad = None
        return once

    t = paired(run(f_ours), run(f_theirs), repeats, device)
    r = t["ratio_median"]
    mem_ratio, mem_note, mem = None, "", {}
    if memory:
        args = ["--batch", str(batch), "--length", str(length), "--device", device]
        mem = {v: run_json_subprocess(["-m", "benchmarks.family_loss", "--child", v, *args]) for v in (ours, theirs)}
        mem_ratio = mem[ours]["extra_bytes"] / max(mem[theirs]["extra_bytes"], 1)
        mem_note = (f"; peak extra memory {mem[ours]['extra_bytes'] / 2**20:.0f} MiB vs "
                    f"{mem[theirs]['extra_bytes'] / 2**20:.0f} MiB ({mem[ours]['how']})")
    ok = r <= TARGET and (mem_ratio is None or mem_ratio <= TARGET)
    return Row(
        name=title, shape=f"{batch} x {length} tokens ({int(mask.sum())} valid), float32", against=against,
        value=r, unit="x", target=f"time <= {TARGET}x" + (f"; memory <= {TARGET}x" if memory else ""), ok=ok,
        spread=spread(t["ratio_min"], t["ratio_max"], repeats) + (f"; memory {mem_ratio:.2f}x" if memory else ""),
        note=f"{t['a_median_s'] * 1e3:.1f} ms vs {t['b_median_s'] * 1e3:.1f} ms; CPU-time ratio "
             f"{t['cpu_ratio']:.2f}x; |loss - verl's| {diff:.1e}" + mem_note + gpu_note(t),
        details={"ours_median_s": t["a_median_s"], "verl_median_s": t["b_median_s"], "ratios": t["ratios"],
                 "cpu_ratio": t["cpu_ratio"], "memory_ratio": mem_ratio, "memory": mem, "loss_abs_diff": diff},
    )


def run(device: str = "cpu", repeats: int = 21, batch: int = 8, length: int = 16384, memory: bool = True) -> list[Row]:
    return [
        _row("grpo", "vanilla", "GRPO control loss fwd+bwd", "verl 'vanilla' (token-mean, clip 0.2)", device, repeats,
             batch, length, memory),
        _row("gspo", "verl-gspo", "GSPO loss fwd+bwd", "verl 'gspo' (seq-mean-token-mean, 3e-4/4e-4)", device,
             repeats, batch, length, memory),
    ]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", choices=["grpo", "vanilla", "gspo", "verl-gspo"], required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    print(json.dumps(child(a.child, a.batch, a.length, a.device)))
