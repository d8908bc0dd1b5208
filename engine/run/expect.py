"""Compare a check's measurements with a contract's `expect:` entries.

A non-finite measurement never passes: NaN compares false by IEEE rules and an
infinity fails whatever the comparison; a missing or non-numeric measurement
fails with a message rather than passing by default.
"""

from __future__ import annotations

import math
from typing import Any

# torch.testing.assert_close defaults (rtol, atol) per dtype.
DTYPE_DEFAULTS: dict[str, tuple[float, float]] = {
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
    "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7),
}

_OPS = {
    "le": lambda v, t: v <= t,
    "lt": lambda v, t: v < t,
    "ge": lambda v, t: v >= t,
    "gt": lambda v, t: v > t,
}


def applies(expectation: dict, dtype: str) -> bool:
    return expectation.get("dtype") in (None, dtype)


def evaluate(expectation: dict, measurements: dict[str, Any], dtype: str) -> dict:
    """One expectation against the measurements: the record that goes into a receipt.

    `margin` is the distance to the threshold on the safe side (negative when
    failed), so drift toward flakiness shows across receipts. `headroom` is the
    same as a ratio (see `headroom`), which stays readable across the decades
    that separate a 1e-12 limit from a 1e-16 error.
    """
    metric = expectation["metric"]
    if "default" in expectation:
        rtol, atol = DTYPE_DEFAULTS[dtype]
        op, threshold = "le", rtol if expectation["default"] == "rtol" else atol
        source = f"dtype-default:{expectation['default']}:{dtype}"
    else:
        op = next(k for k in ("le", "lt", "ge", "gt", "eq") if k in expectation)
        threshold, source = expectation[op], "spec"
    record = {"metric": metric, "op": op, "threshold": threshold, "tolerance_source": source,
              "value": None, "margin": None, "headroom": None, "passed": False}
    if metric not in measurements:
        record["message"] = f"the check reported no measurement {metric!r}"
        return record
    value = measurements[metric]
    record["value"] = value
    if op == "eq":
        if isinstance(threshold, bool) or isinstance(value, bool):
            record["passed"] = isinstance(value, bool) and value is threshold
            record["margin"] = 0.0 if record["passed"] else -1.0
        else:
            ok = _is_number(value) and value == threshold
            record["passed"] = bool(ok)
            record["margin"] = (0.0 - abs(value - threshold)) + 0.0 if _is_number(value) and math.isfinite(value) else None
        return record
    if not _is_number(value):
        record["message"] = f"measurement {metric!r} is {type(value).__name__}, not a number"
        return record
    value = float(value)
    if math.isfinite(value):
        record["passed"] = bool(_OPS[op](value, threshold))
        record["margin"] = (threshold - value) if op in ("le", "lt") else (value - threshold)
        record["headroom"] = headroom(op, value, threshold)
    else:
        # NaN compares false anyway; an infinite measurement is a broken one too, even where
        # `ge`/`gt` (or `le` against -inf) would let it through.
        record["message"] = f"measurement {metric!r} is {value}, not a finite number"
    return record


def headroom(op: Any, value: Any, threshold: Any) -> float | None:
    """How many times over the measurement could grow (`le`/`lt`) or shrink (`ge`/`gt`) and still hold.

    limit / measured for an upper bound, measured / limit for a lower one: 1e3 means three decades to
    spare, below 1 means failed by that factor; infinity for an exact 0 under a positive limit. None
    where a ratio means nothing: equality (held or not held), a limit of 0 or below (`gt: 0`, `le: 0`
    are sanity checks with no scale), a missing, boolean or non-finite measurement.
    """
    if op not in _OPS or not _is_number(value) or not _is_number(threshold):
        return None
    value, threshold = float(value), float(threshold)
    if not (math.isfinite(value) and math.isfinite(threshold)) or threshold <= 0:
        return None
    if op in ("le", "lt"):
        if value < 0:
            return None  # a negative error against a positive limit: no scale to compare on
        return math.inf if value == 0 else threshold / value
    return value / threshold if value > 0 else 0.0


def is_sanity(e: dict) -> bool:
    """An expectation with no scale: held or not held, never a "worst" headroom. That is equality, a limit of 0,
    and an integer limit, which bounds a count or a range (`ge: 1` case, `le: 3` picks, `le: 1` for a
    probability): a count at its bound is exactly right, where a "1x" would read as about to fail."""
    t = e.get("threshold")
    if isinstance(t, int) and not isinstance(t, bool):
        return True
    return e.get("op") == "eq" or headroom(e.get("op"), 1.0, t) is None


def format_headroom(h: Any) -> str:
    """`40x`, `10^3.2x`, `10^-11.6x` (decades once the ratio leaves 1/100..100); `exact` for an error of 0."""
    h = _as_float(h)
    if h is None or math.isnan(h):
        return "-"
    if math.isinf(h):
        return "exact" if h > 0 else "-"
    if h <= 0:
        return "10^-infx"
    if 0.01 <= h < 100:
        return f"{h:.3g}x"
    return f"10^{math.log10(h):.1f}x"


def worst_expectation(records: list[dict]) -> dict | None:
    """The expectation nearest to failing, by headroom; equality and zero-limit sanity checks are left out
    unless they failed or nothing else is there. A failed or unmeasurable scaled one comes first."""
    best, best_key = None, None
    for e in records:
        if not isinstance(e, dict):
            continue
        sanity = is_sanity(e)
        h = _as_float(e.get("headroom") if "headroom" in e else headroom(e.get("op"), e.get("value"),
                                                                          e.get("threshold")))
        passed = e.get("passed") is True
        if not passed:
            key = (0, h if h is not None and not math.isnan(h) else -math.inf)  # failures first, deepest first
        elif sanity:
            key = (2, 0.0)
        else:
            key = (1, h if h is not None and not math.isnan(h) else math.inf)
        if best_key is None or key < best_key:
            best, best_key = e, key
    return best


def describe(e: dict) -> str:
    """One expectation as a statement that is true as printed: `max_rel_err 0.356 > limit 1e-12`,
    `max_abs_err 3e-16 <= 1e-12 (10^3.5x headroom)`, `updates 3 = 3 (held)`."""
    metric, value, op, threshold = e.get("metric"), e.get("value"), e.get("op"), e.get("threshold")
    v, t = _num(value), _num(threshold)
    if e.get("message") and value is None:
        return f"{metric}: {e['message']}"
    if op == "eq":
        return f"{metric} {v} = {t} (held)" if e.get("passed") else f"{metric} {v} != {t} (not held)"
    sym = {"le": "<=", "lt": "<", "ge": ">=", "gt": ">"}.get(op, str(op))
    if e.get("passed"):
        h = e.get("headroom") if "headroom" in e else headroom(op, value, threshold)
        shown = format_headroom(h)
        return f"{metric} {v} {sym} {t}" + ("" if h is None else " (exact)" if shown == "exact"
                                            else f" ({shown} headroom)")
    negated = {"le": ">", "lt": ">=", "ge": "<", "gt": "<="}.get(op, f"not {sym}")
    if not _is_number(value) or (isinstance(value, float) and math.isnan(value)):
        return f"{metric} {v}, not {sym} limit {t}"
    return f"{metric} {v} {negated} limit {t}"


def _as_float(v: Any) -> float | None:
    """A number, or a non-finite one as a receipt writes it ("Infinity", "NaN"); else None."""
    if _is_number(v):
        return float(v)
    if v in ("Infinity", "-Infinity", "NaN"):
        return float(v.replace("Infinity", "inf"))
    return None


def _num(v: Any) -> str:
    if isinstance(v, float):
        return repr(v) if not math.isfinite(v) else f"{v:.3g}"
    return str(v)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
