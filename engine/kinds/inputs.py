"""The declared-input generator: realises a spec's `inputs:` block, seeded per (seed, case).

Everything is drawn in float64 on the CPU from a generator seeded by the run
seed, the contract's `stream` and the case index alone, so case 5 of seed 43 is
the same tensors on every device and when rerun by itself (`--case 5`).

    inputs:
      dims: {B: [1, 4], L: [2, 48]}             # an int, or [low, high] drawn per case (inclusive), or
                                                 # [low, high, step]: low + step * k <= high
      tensors:                                   # drawn in this order
        logp: {shape: [B, L], dist: uniform, low: -3.01, high: -0.01}
        old_logp: {shape: [B, L], dist: normal, std: 0.3, around: logp}
        adv: {cycle: [{shape: [B], dist: normal}, {shape: [B, L], dist: normal}]}
        mask: {shape: [B, L], layout: response, prompt_max: 4, hole_prob: 0.1}
      generator: tapo.rollout                    # optional: a method's named Python generator

Distributions: normal (mean, std), uniform (low, high), signed (|x| uniform in
[low, high], random sign), constant (value), integers (low, high). `around: X`
adds input X (`around: [X, Y]` adds both). `{values: [[...]]}` is a literal tensor (float64, or
`dtype: bool` / `long`). `signed` with `log: true` draws |x| log-uniformly in [low, high].
`log_softmax: true` normalises the last dim into log-probabilities.
A `generator` may stand beside `tensors`: the declared tensors are drawn after the generator's inputs.
`{from_dim: L, plus: 3}` is a Python int (L + 3), `{none: true}` is None (useful in a `cycle`),
`{omit: true}` leaves a keyword argument out (the function's default applies), `{scalar: 0.5}`
is a Python float. `zero_prob: p` makes each element exactly 0 with probability p. Mask layouts: response (a masked prompt of 0..prompt_max tokens,
a response with holes of probability hole_prob, its first token kept, masked
padding; `empty_rows: k` masks k whole rows; `full_rows: k` gives the last k rows a response that runs to
the end of the row, so long rows reach long valid counts), full (every slot valid).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from engine.errors import LookupFailure
from engine.kinds.schema import INPUTS

SCHEMA = INPUTS

_GENERATORS: dict[str, Callable[..., dict[str, torch.Tensor]]] = {}


def generator(name: str) -> Callable[[Callable[..., dict]], Callable[..., dict]]:
    """Register a method's named Python generator `fn(g, case, ctx, params) -> {name: tensor}`, for inputs the
    YAML cannot say (a rollout of a policy, say)."""

    def deco(fn: Callable[..., dict]) -> Callable[..., dict]:
        if name in _GENERATORS:
            raise ValueError(f"input generator {name!r} is registered twice")
        _GENERATORS[name] = fn
        return fn

    return deco


def case_generator(seed: int, case: int, stream: int = 0) -> torch.Generator:
    """The CPU generator for one case: depends on (seed, stream, case) only, so a case reruns alone."""
    g = torch.Generator(device="cpu")
    g.manual_seed((seed * 1_000_003 + stream * 7_919 + case * 104_729) % (2**63 - 1))
    return g


def _dim(spec: Any, g: torch.Generator) -> int:
    if isinstance(spec, int):
        return spec
    lo, hi, step = (*spec, 1) if len(spec) == 2 else spec
    return lo + step * int(torch.randint(0, (hi - lo) // step + 1, (1,), generator=g))


def response_mask(g: torch.Generator, B: int, L: int, prompt_max: int = 4, hole_prob: float = 0.1,
                  full_rows: int = 0) -> torch.Tensor:
    """Bool mask [B, L]: per row a masked prompt of 0..prompt_max tokens, a response with holes (its first token
    kept, so every row has a valid token), masked padding; the last `full_rows` rows have no padding."""
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b in range(B):
        p = int(torch.randint(0, min(prompt_max, L - 1) + 1, (1,), generator=g))
        r = int(torch.randint(1, L - p + 1, (1,), generator=g))
        if b >= B - full_rows:  # drawn as the others are (one stream), then run to the row's end
            r = L - p
        mask[b, p: p + r] = True
        holes = torch.rand(r, generator=g) < hole_prob
        holes[0] = False
        mask[b, p: p + r] &= ~holes
    return mask


def _layout(g: torch.Generator, B: int, L: int, spec: dict) -> torch.Tensor:
    if spec.get("layout") == "full" or L == 0:
        mask = torch.ones(B, L, dtype=torch.bool)
    else:
        mask = response_mask(g, B, L, int(spec.get("prompt_max", 4)), float(spec.get("hole_prob", 0.1)),
                             int(spec.get("full_rows", 0)))
    for b in range(min(int(spec.get("empty_rows", 0)), B)):
        mask[b] = False
    return mask


class _Omit:
    """An argument left out of the call (its default applies): `{omit: true}`."""

    def __repr__(self) -> str:
        return "OMIT"


OMIT = _Omit()


def _tensor(spec: dict, shape: list[int], g: torch.Generator, drawn: dict[str, Any], dims: dict[str, int]) -> Any:
    if spec.get("none"):
        return None
    if spec.get("omit"):
        return OMIT
    if "scalar" in spec:
        return float(spec["scalar"])
    if "values" in spec:
        dt = {"bool": torch.bool, "long": torch.int64}.get(spec.get("dtype", ""), torch.float64)
        x = torch.tensor(spec["values"], dtype=dt)
        return x if dt != torch.float64 or "around" not in spec else _around(x, spec, drawn)
    if "from_dim" in spec:
        return int(dims[spec["from_dim"]]) + int(spec.get("plus", 0))
    if "layout" in spec or spec.get("dtype") == "bool":
        return _layout(g, shape[0], shape[1] if len(shape) > 1 else 1, spec).reshape(shape)
    dist = spec.get("dist", "normal")
    f64 = torch.float64
    if dist == "normal":
        x = spec.get("mean", 0.0) + spec.get("std", 1.0) * torch.randn(tuple(shape), generator=g, dtype=f64)
    elif dist == "uniform":
        lo, hi = spec.get("low", 0.0), spec.get("high", 1.0)
        x = lo + (hi - lo) * torch.rand(tuple(shape), generator=g, dtype=f64)
    elif dist == "signed":
        sign = torch.where(torch.rand(tuple(shape), generator=g) < 0.5, -1.0, 1.0).to(f64)
        lo, hi = spec.get("low", 0.0), spec.get("high", 1.0)
        u = torch.rand(tuple(shape), generator=g, dtype=f64)
        if spec.get("log"):  # magnitudes spread over decades
            lo_t, hi_t = torch.tensor(float(lo), dtype=f64).log(), torch.tensor(float(hi), dtype=f64).log()
            x = sign * torch.exp(lo_t + (hi_t - lo_t) * u)
        else:
            x = sign * (lo + (hi - lo) * u)
    elif dist == "integers":
        x = torch.randint(int(spec.get("low", 0)), int(spec.get("high", 2)) + 1, tuple(shape), generator=g)
        return x
    else:
        # One element seen at every position, not a float64 fill: page-scale budget inputs are 10^7-10^8
        # elements, and calls.on_device writes the case's dense copy in the tested dtype from it.
        x = torch.tensor(float(spec.get("value", 0.0)), dtype=f64).expand(tuple(shape))
    x = _around(x, spec, drawn)
    x = x.log_softmax(-1) if spec.get("log_softmax") else x
    if spec.get("zero_prob"):  # exact zeros (an advantage of 0 removes its token): drawn after the values
        x = torch.where(torch.rand(tuple(shape), generator=g) < float(spec["zero_prob"]), torch.zeros((), dtype=f64), x)
    return x


def _around(x: torch.Tensor, spec: dict, drawn: dict[str, Any]) -> torch.Tensor:
    around = spec.get("around")
    for name in ([around] if isinstance(around, str) else around or []):
        x = drawn[name].to(torch.float64) + x
    return x


def draw(inputs: dict[str, Any], seed: int, case: int, ctx: Any = None) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """The inputs of one case ({name: float64/bool CPU tensor}) and the dims drawn for it."""
    g = case_generator(seed, case, int(inputs.get("stream", 0)))
    if "generator" in inputs:
        try:
            fn = _GENERATORS[inputs["generator"]]
        except KeyError:
            raise LookupFailure(f"no input generator named {inputs['generator']!r}; "
                                f"valid: {', '.join(sorted(_GENERATORS)) or '(none registered)'}") from None
        out = fn(g, case, ctx, inputs)
        gen_dims = {k: int(v) for k, v in out.pop("__dims__", {}).items()}
        if "tensors" not in inputs:
            return out, gen_dims
    else:
        out, gen_dims = {}, {}
    # declared tensors beside a generator's inputs: drawn after them, from the same stream
    dims = {**gen_dims, **{name: _dim(s, g) for name, s in (inputs.get("dims") or {}).items()}}
    drawn: dict[str, torch.Tensor] = dict(out)
    for name, spec in inputs["tensors"].items():
        if "cycle" in spec:
            spec = spec["cycle"][case % len(spec["cycle"])]
        shape = [d if isinstance(d, int) else dims[d] for d in spec.get("shape", [])]
        drawn[name] = _tensor(spec, shape, g, drawn, dims)
    return drawn, dims


def shapes(drawn: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in drawn.items() if isinstance(v, torch.Tensor)}
