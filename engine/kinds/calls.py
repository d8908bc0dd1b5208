"""What every kind does the same way: draw a case, cast it, call the implementation, compare, log the case."""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch

from engine.kinds import inputs as inputs_mod


def case_indices(ctx: Any) -> list[int]:
    """The cases this call runs: all of them, or the one `--case N` asked for."""
    only = getattr(ctx, "only_case", None)
    if only is not None:
        return [only] if 0 <= only < ctx.cases else []
    return list(range(ctx.cases))


def cases(ctx: Any, params: dict) -> Iterator[tuple[int, dict[str, torch.Tensor], dict[str, int]]]:
    """(case index, float64/bool CPU inputs, dims) for each case this call runs."""
    for case in case_indices(ctx):
        drawn, dims = inputs_mod.draw(params["inputs"], ctx.seed, case, ctx)
        yield case, drawn, dims


def on_device(ctx: Any, x: Any, dtype: torch.dtype | None = None) -> Any:
    """A fresh leaf on the device in the dtype under test (bool and integer tensors keep their dtype); the tensors in
    a list (one context's logits per reward, None for an empty block) each so."""
    if isinstance(x, list) and any(isinstance(v, torch.Tensor) for v in x):
        return [on_device(ctx, v, dtype) for v in x]
    if not isinstance(x, torch.Tensor):
        return x
    # One copy (copy=True), not a cast, a move and a clone: page-scale budget inputs are 10^7 elements.
    keep = x.dtype == torch.bool or not x.is_floating_point()
    to = x.dtype if keep else (dtype or ctx.dtype)
    if 0 in x.stride():  # a constant input (one element, expanded): a dense leaf with the usual strides
        return torch.empty(x.shape, dtype=to, device=ctx.device).copy_(x.detach())
    return x.detach().to(device=ctx.device, dtype=to, copy=True)


def cast_all(ctx: Any, drawn: dict[str, Any], dtype: torch.dtype | None = None) -> dict[str, Any]:
    return {k: on_device(ctx, v, dtype) for k, v in drawn.items()}


def _arg(a: Any, tensors: dict[str, Any]) -> Any:
    if isinstance(a, dict):
        return a["value"]
    return tensors[a]


def bind(params: dict, tensors: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """Positional and keyword arguments of the declared call, from the case's tensors and literals."""
    args = [_arg(a, tensors) for a in params.get("args", [])]
    kwargs = {k: _arg(a, tensors) for k, a in (params.get("kwargs") or {}).items()}
    return args, {k: v for k, v in kwargs.items() if v is not inputs_mod.OMIT}


def select(out: Any, index: Any) -> Any:
    if isinstance(out, (tuple, list)):
        return out[0 if index is None else index]
    return out


def call(impl: Any, params: dict, tensors: dict[str, Any], function: str | None = None,
         output: Any = "__params__", whole: bool = False) -> Any:
    """Call the declared interface function on `tensors`; return the declared output (`whole` or
    `output="__raw__"`: the whole result)."""
    fn = getattr(impl, function or params["function"])
    tensors = chain(impl, params, tensors)
    args, kwargs = bind(params, tensors)
    out = fn(*args, **kwargs)
    if whole or output == "__raw__":
        return out
    return select(out, params.get("output") if output == "__params__" else output)


def chain(impl: Any, params: dict, tensors: dict[str, Any]) -> dict[str, Any]:
    """`tensors` plus the outputs of the declared `before` calls, each bound under its `as` name (a name already
    bound is kept: the chain runs once per set of tensors), so one function's output feeds the next (the weights
    into the advantages), in the dtype under test."""
    steps = params.get("before") or []
    if not steps or all(s["as"] in tensors for s in steps):
        return tensors
    out = dict(tensors)
    for step in steps:
        if step["as"] not in out:
            out[step["as"]] = call(impl, step, out)
    return out


def reference(params: dict, tensors: dict[str, Any], name: str | None = None, ctx: Any = None) -> Any:
    """The float64 reference named in params, called on float64 CPU copies of what the implementation received.
    With `reference_gets_dtype: true` it also gets `dtype=` (the dtype under test), e.g. to size a margin."""
    from engine.spec import registry

    ref = registry.load().get_reference(name or params["reference"])
    f64 = {k: (v.detach().to("cpu", torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point()
               else v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in tensors.items()}
    args, kwargs = bind(params, f64)
    if params.get("reference_gets_dtype") and ctx is not None:
        kwargs["dtype"] = ctx.dtype
    return ref(*args, **kwargs)


def mask_like(mask: torch.Tensor, x: torch.Tensor, at: int | None = None) -> torch.Tensor | None:
    """`mask` (bool) expanded to the shape of `x`, its dims found inside x's (leading, trailing or in between: a
    [B, T] mask of [K, B, T] weights or of [B, T, V] distributions; the trailing place first, or dim `at` of x
    where sizes could match in two places); None when they are not there."""
    mask = mask.to(torch.bool).cpu()
    n, d = mask.dim(), x.dim()
    for o in ([at] if at is not None else range(d - n, -1, -1)):
        if tuple(x.shape[o:o + n]) == tuple(mask.shape):
            return mask.reshape((1,) * o + tuple(mask.shape) + (1,) * (d - o - n)).expand(x.shape).to(x.device)
    return None


def as64(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64)
    return torch.as_tensor(x, dtype=torch.float64)


def worst(diff: torch.Tensor) -> tuple[float, list[int] | None]:
    """The largest entry of a non-negative difference tensor (NaN counts as infinity) and its position."""
    if diff.numel() == 0:
        return 0.0, None
    d = torch.nan_to_num(diff.detach().to("cpu", torch.float64), nan=math.inf)
    flat = int(torch.argmax(d))
    value = float(d.flatten()[flat])
    return value, unravel(flat, tuple(d.shape))


def unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    """The position of a row-major flat index. Plain arithmetic: torch.unravel_index's argument check imports
    torch.fx's symbolic shapes and sympy, seconds of a contract's first call."""
    where = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        where.append(i)
    return where[::-1]


def log_case(ctx: Any, case: int, drawn: dict[str, Any], metrics: dict[str, Any], where: dict | None = None,
             argument: str | None = None) -> None:
    """Remember one case's own measurements; the runner names the cases that break an expectation."""
    log = getattr(ctx, "case_log", None)
    if log is None:
        return
    entry = {"seed": ctx.seed, "case": case, "shapes": inputs_mod.shapes(drawn),
             "metrics": {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                         for k, v in metrics.items()}}
    if where:
        entry["where"] = {k: v for k, v in where.items() if v is not None}
    if argument:
        entry["argument"] = argument
    log.append(entry)


def grad_of(value: torch.Tensor, wrt: list[torch.Tensor]) -> list[torch.Tensor]:
    """d sum(value) / d each of `wrt` (zeros where it does not depend on one, or on none of them)."""
    if not value.requires_grad:
        return [torch.zeros_like(w) for w in wrt]
    gs = torch.autograd.grad(value.sum(), wrt, allow_unused=True)
    return [torch.zeros_like(w) if g is None else g for g, w in zip(gs, wrt)]


def grad_diff(names: list[str], got: list[Any], want: list[Any], relative: bool = True) -> tuple[float, dict | None]:
    """The worst |got - want| over several gradients, divided by max |want| when `relative` (NaN in `want` marks
    a slot left out), and where it is: ({argument: position})."""
    best, where = 0.0, None
    for name, a, b in zip(names, got, want):
        b = as64(b)
        ok = ~torch.isnan(b)
        scale = (float(b[ok].abs().max()) if bool(ok.any()) else 1.0) if relative else 1.0
        d = torch.where(ok, (as64(a) - b).abs(), torch.zeros_like(b)) / max(scale, 1e-300)
        v, w = worst(d)
        if v >= best:
            best, where = v, {name: w}
    return best, where
