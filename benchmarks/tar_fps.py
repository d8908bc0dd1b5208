"""TAR farthest-point sampling, vectorised over prompts, against the per-prompt Python loop.

Reuses the TAR helper's inputs and both implementations (methods/tar/bench.py,
methods/tar/fps.py, methods/tar/reference.py); this module only times them
the way every row here is timed (median of interleaved pairs, spread).
"""

from __future__ import annotations

from benchmarks.harness import Row, gpu_note, paired, spread

TARGET = 20.0


def run(device: str = "cpu", repeats: int = 15, prompts: int = 512, candidates: int = 32, dims: int = 64,
        k: int = 3) -> Row:
    import torch

    from methods.tar.bench import make_inputs
    from methods.tar.fps import farthest_point_prototypes
    from methods.tar.reference import fps_per_prompt_loop

    emb, correct, ids = make_inputs(prompts, candidates, dims, device=device, shuffle=True)
    fast = farthest_point_prototypes(emb, correct, k, ids)
    slow = fps_per_prompt_loop(emb, correct, k, ids)
    identical = bool(torch.equal(fast.cpu(), slow.cpu()))
    t = paired(lambda: fps_per_prompt_loop(emb, correct, k, ids), lambda: farthest_point_prototypes(emb, correct, k, ids),
               repeats, device)
    speedup = t["ratio_median"]  # loop time / vectorised time
    return Row(
        name="TAR FPS bank", shape=f"{prompts} prompts x {candidates} candidates x {dims} dims, k={k}, prompts interleaved",
        against="per-prompt Python loop, same rule", value=speedup, unit="x faster", target=f">= {TARGET:g}x, identical picks",
        ok=speedup >= TARGET and identical, spread=spread(t["ratio_min"], t["ratio_max"], repeats),
        note=f"{'identical' if identical else 'DIFFERENT'} picks ({fast.numel()}); vectorised "
             f"{t['b_median_s'] * 1e3:.1f} ms, loop {t['a_median_s'] * 1e3:.0f} ms; "
             f"CPU-time ratio {t['cpu_ratio']:.1f}x" + gpu_note(t),
        details={"identical_picks": identical, "picks": int(fast.numel()), "vectorised_median_s": t["b_median_s"],
                 "loop_median_s": t["a_median_s"], "ratios": t["ratios"], "cpu_ratio": t["cpu_ratio"]},
    )
