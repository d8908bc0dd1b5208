"""What the browser shows: the engine's read model (engine/store/browse.py), built by one call, `build_model`.

The screens draw these rows and ask the engine nothing else; the gate verdicts come from `gate_for` / `gate_views`
(engine.store.overview, from the files, as `contracts gate` derives them).
"""

from __future__ import annotations

from typing import Any

from engine.store.browse import (  # noqa: F401  (the rows and builders the screens use)
    PENDING,
    ContractRow,
    Detail,
    GateView,
    MethodModel,
    Model,
    MutantRow,
    ReceiptRow,
    _expectation_record,
    _worst_cell,
    build_model,
    describe,
    fix_text,
    gate_flags,
    gate_for,
    gate_view,
    gate_views,
    gate_views_elsewhere,
    load_detail,
    model_as_dict,
    previous_full_receipt,
)


def as_text(value: Any) -> str:
    """What the clipboard should get."""
    if hasattr(value, "plain"):
        return value.plain
    return str(value)
