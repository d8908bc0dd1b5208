"""TAPO loss forward+backward against the GRPO token-level clipped loss, same inputs, same process."""

from __future__ import annotations

from benchmarks.harness import Row, gpu_note, paired, spread

TARGET = 1.15


def make_inputs(batch: int, length: int, device: str, seed: int = 0):
    """Log-probs of `batch` responses padded to `length`; valid lengths drawn from [length/2, length]."""
    import torch

    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=g) * 3.0
    logp = (old + 0.05 * torch.randn(batch, length, generator=g)).clamp(max=0.0)
    lengths = torch.randint(length // 2, length + 1, (batch,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    adv = torch.randn(batch, generator=g)
    return (logp.to(device).requires_grad_(True), old.to(device), adv.to(device), mask.to(device))


def run(device: str = "cpu", repeats: int = 31, batch: int = 8, length: int = 16384) -> Row:
    from methods.common.grpo import grpo_token_loss
    from methods.tapo.objective import tapo_loss

    logp, old, adv, mask = make_inputs(batch, length, device)

    def tapo():
        loss, _ = tapo_loss(logp, old, adv, mask, 0.1, 0.2)
        loss.backward()
        logp.grad = None

    def grpo():
        loss, _ = grpo_token_loss(logp, old, adv, mask, 0.2)
        loss.backward()
        logp.grad = None

    t = paired(tapo, grpo, repeats, device)
    r = t["ratio_median"]
    return Row(
        name="TAPO loss fwd+bwd", shape=f"{batch} x {length} tokens ({int(mask.sum())} valid), float32",
        against="GRPO token-level clipped loss (methods/common)", value=r, unit="x", target=f"<= {TARGET}x",
        ok=r <= TARGET, spread=spread(t["ratio_min"], t["ratio_max"], repeats),
        note=f"{t['a_median_s'] * 1e3:.1f} ms vs {t['b_median_s'] * 1e3:.1f} ms; "
             f"CPU-time ratio {t['cpu_ratio']:.2f}x" + gpu_note(t),
        details={"tapo_median_s": t["a_median_s"], "grpo_median_s": t["b_median_s"], "ratios": t["ratios"],
                 "cpu_ratio": t["cpu_ratio"]},
    )
