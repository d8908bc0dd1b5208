"""What a check receives besides the implementation under test."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


class BudgetExceeded(RuntimeError):
    """Raised by the meter when a check does more than the spec's budget allows."""


class ContractViolation(AssertionError):
    """A check may raise this to say 'the contract failed' with a reason (status: failed, not error)."""


@dataclass
class Meter:
    """Counts the real cost of a check and stops it at the spec's budget."""

    max_updates: int | None = None
    max_tokens: int | None = None
    updates: int = 0
    tokens: int = 0

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.max_updates is not None and self.updates + 1 > self.max_updates:
            raise BudgetExceeded(f"optimizer update {self.updates + 1} is over the budget of {self.max_updates} per seed")
        optimizer.step()
        self.updates += 1

    def add_tokens(self, n: int) -> None:
        self.tokens += int(n)
        if self.max_tokens is not None and self.tokens > self.max_tokens:
            raise BudgetExceeded(f"{self.tokens} sampled tokens is over the budget of {self.max_tokens} per seed")


@dataclass
class CheckContext:
    """Device, dtype, seed, case count and spec params for one check call.

    Mechanism checks also record per-step rows (`record_step`), comparisons
    against a control (`record_comparison`) and go through the meter for every
    optimizer step and sampled token, so the receipt holds the real cost.
    """

    device: torch.device
    dtype: torch.dtype
    seed: int
    cases: int
    params: Mapping[str, Any] = field(default_factory=dict)
    meter: Meter = field(default_factory=Meter)
    steps: list[dict] = field(default_factory=list)
    comparisons: list[dict] = field(default_factory=list)
    # Set by `--policy` (e.g. hf:PATH): mechanism runs build their policy through
    # methods.common.policy.make_policy, which calls this instead of the tiny GRU.
    # Signature: policy_factory(seed=, device=, vocab_size=, hidden_size=) -> nn.Module.
    policy_factory: Callable[..., Any] | None = None
    # metric -> reason, for measurements this implementation cannot be held to (a function it lacks): their
    # expectations are recorded as not applicable and the contract's result as partial, never as passed.
    not_measured: dict[str, str] = field(default_factory=dict)
    # function -> reason, for calls a kind left out (the implementation lacks the function): the contract is then
    # partial even where its metrics were fed by the other calls, and the receipt names the calls.
    skipped_calls: dict[str, str] = field(default_factory=dict)
    # Each case's own measurements, logged by the generic kinds (engine/kinds): the runner names the cases that
    # break an expectation. `only_case` (check --case N) runs that case alone.
    case_log: list[dict] = field(default_factory=list)
    only_case: int | None = None
    # The supervisor's audit of the check's training runs (engine/run/run_audit.py): every gradient that reaches
    # one of its objects and every figure a candidate reports. The runner puts one here with the spec's
    # tolerances; a run reaches it through run_audit.of(ctx).
    audit: Any = None

    def not_applicable(self, reason: str, *metrics: str) -> None:
        """Declare `metrics` not measurable on this implementation, and why (e.g. it has no trajectory_ratio)."""
        for m in metrics:
            self.not_measured[m] = reason

    def skip_call(self, function: str, *metrics: str) -> None:
        """Record that `function` was not called (the implementation has none) and which metrics it would feed."""
        reason = f"no {function} in the implementation"
        self.skipped_calls[function] = reason
        self.not_applicable(reason, *metrics)

    def generator(self, offset: int = 0) -> torch.Generator:
        """A CPU generator seeded from the run seed: the same inputs on every device."""
        g = torch.Generator(device="cpu")
        g.manual_seed(self.seed * 1_000_003 + offset)
        return g

    def randn(self, *shape: int, g: torch.Generator, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Standard normal drawn on the CPU, then moved: identical across devices."""
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(self.device, dtype or self.dtype)

    def record_step(self, **fields: Any) -> None:
        self.steps.append({k: _plain(v) for k, v in fields.items()})

    def record_comparison(
        self,
        name: str,
        method: str,
        control: str,
        method_values: list[float],
        control_values: list[float],
        metric: str,
        formal: bool = False,
        note: str = "",
    ) -> None:
        """Record method vs control. `formal=False` marks it diagnostic: the gate never counts it."""
        self.comparisons.append(
            {
                "name": name,
                "metric": metric,
                "method": method,
                "control": control,
                "method_values": [float(v) for v in method_values],
                "control_values": [float(v) for v in control_values],
                "formal": bool(formal),
                "note": note,
            }
        )


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu()
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return v
    return v
