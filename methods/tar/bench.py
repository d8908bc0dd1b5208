"""Benchmark: vectorised FPS against the per-prompt Python loop (`python -m methods.tar.bench`).

512 prompts x 32 candidates x 64 dims, about half of them correct, with the
prompts interleaved (shuffled) and grouped (contiguous, which skips a sort). Reports the best-of-N wall time of each (the
minimum is the least noisy estimate on a shared machine), the speed-up, and
whether the picks are identical.
"""

from __future__ import annotations

# Not a mutation target of `contracts mutate`: a benchmark of fps.py against the reference loop;
# no contract runs it.
__mutate__ = False

import argparse
import json
import time

import torch

from methods.tar.fps import farthest_point_prototypes
from methods.tar.reference import fps_per_prompt_loop


def make_inputs(prompts: int = 512, candidates: int = 32, dims: int = 64, seed: int = 0, device: str = "cpu", shuffle: bool = True):
    """Candidates of each prompt contiguous (shuffle=False, as a sampler emits them) or interleaved."""
    g = torch.Generator().manual_seed(seed)
    n = prompts * candidates
    emb = torch.randn(n, dims, generator=g)
    correct = torch.rand(n, generator=g) < 0.5
    ids = torch.arange(prompts).repeat_interleave(candidates)
    perm = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
    return emb[perm].to(device), correct[perm].to(device), ids[perm].to(device)


def best_time(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run(prompts=512, candidates=32, dims=64, k=3, repeats=20, device="cpu", shuffle=True) -> dict:
    emb, correct, ids = make_inputs(prompts, candidates, dims, device=device, shuffle=shuffle)
    fast = farthest_point_prototypes(emb, correct, k, ids)
    slow = fps_per_prompt_loop(emb, correct, k, ids)
    sync = torch.cuda.synchronize if emb.is_cuda else (lambda: None)

    def timed(fn):
        def call():
            fn(emb, correct, k, ids)
            sync()
        return call

    t_fast = best_time(timed(farthest_point_prototypes), repeats)
    t_slow = best_time(timed(fps_per_prompt_loop), max(3, repeats // 4))
    return {
        "shape": [prompts, candidates, dims],
        "layout": "interleaved" if shuffle else "grouped",
        "k": k,
        "vectorised_ms": t_fast * 1e3,
        "per_prompt_loop_ms": t_slow * 1e3,
        "speedup": t_slow / t_fast,
        "identical_picks": bool(torch.equal(fast.cpu(), slow.cpu())),
        "picks": int(fast.numel()),
        "device": str(emb.device),
        "torch_threads": torch.get_num_threads(),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    print(json.dumps([run(repeats=a.repeats, device=a.device, shuffle=s) for s in (True, False)], indent=2))
