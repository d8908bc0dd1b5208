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
    failed), so drift toward flakiness shows across receipts.
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
              "value": None, "margin": None, "passed": False}
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
    else:
        # NaN compares false anyway; an infinite measurement is a broken one too, even where
        # `ge`/`gt` (or `le` against -inf) would let it through.
        record["message"] = f"measurement {metric!r} is {value}, not a finite number"
    return record


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
