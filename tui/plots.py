"""The receipt screen's Plots tab: each mechanism run's step records as sparklines, one column per seed.

A mechanism record is `{contract, seed, dtype, steps: [{...}, ...]}`; what a step
holds is the method's own (loss, grad_norm, ratio_min/max, clip_fraction, beta,
replay_active, gates, ...), so nothing here knows a method by name. Steps are
split by their first text-valued field (TAPO's `arm`, TAR's `phase`), every
number becomes a series, a boolean 0/1, a list of floats its mean (`mean(gates)`);
lists of integers are indices, not measurements, and are left out. Each row is
scaled over all its seeds, so the seeds' lines compare. Every string shown comes
from a receipt and is made literal text here (tui.fmt.plain), never markup.
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from tui import fmt

BARS = "▁▂▃▄▅▆▇█"
FLAT = "─"  # a series that never moves (distinct from one that sits at its minimum)
BAD = "×"  # NaN or infinite
INDEX_KEYS = {"step", "update", "group", "seed", "attempts"}  # counters, not measurements
MAX_POINTS = 40  # a longer run is drawn from evenly spaced steps


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return None


def _value(key: str, v: Any) -> tuple[str, float | None] | None:
    """(series name, value) of one step field, or None when it is not a measurement."""
    if key in INDEX_KEYS:
        return None
    x = _number(v)
    if x is not None:
        return key, x
    if isinstance(v, list) and v and all(isinstance(e, float) for e in v):
        finite = [e for e in v if math.isfinite(e)]
        return f"mean({key})", (sum(finite) / len(finite) if len(finite) == len(v) else math.nan)
    return None


def _split_key(steps: list[dict]) -> str | None:
    """The first field whose values are text in every step (TAPO's `arm`, TAR's `phase`): steps are drawn apart
    by it."""
    for k in steps[0] if steps else ():
        if all(isinstance(s.get(k), str) for s in steps):
            return k
    return None


def series(records: list[dict]) -> dict[tuple, dict[str, dict[Any, list[float]]]]:
    """(contract, dtype, part) -> series name -> seed -> values in step order; part is 'arm tapo' or ''."""
    out: dict[tuple, dict[str, dict[Any, list[float]]]] = {}
    for rec in records:
        steps = [s for s in rec.get("steps") or [] if isinstance(s, dict)] if isinstance(rec.get("steps"), list) \
            else []
        split = _split_key(steps)
        for st in steps:
            part = f"{split} {st[split]}" if split else ""
            group = out.setdefault((str(rec.get("contract")), str(rec.get("dtype")), part), {})
            for k, v in st.items():
                got = _value(str(k), v)
                if got is not None:
                    group.setdefault(got[0], {}).setdefault(rec.get("seed"), []).append(got[1])
    return out


def sparkline(values: list[float], lo: float, hi: float) -> Text:
    """One character per step (evenly spaced steps past MAX_POINTS), scaled to [lo, hi]."""
    if len(values) > MAX_POINTS:
        step = len(values) / MAX_POINTS
        values = [values[int(i * step)] for i in range(MAX_POINTS)]
    out = Text(no_wrap=True)
    for v in values:
        if not math.isfinite(v):
            out.append(BAD, style="bold red")
        elif hi <= lo:
            out.append(FLAT, style="cyan")
        else:
            out.append(BARS[min(7, max(0, round((v - lo) / (hi - lo) * 7)))], style="cyan")
    return out


def _range(lo: float, hi: float) -> str:
    """'0.106..0.171'; '1' for a constant; '1 (spread 4e-09)' when the ends print alike but differ."""
    if lo == hi:
        return fmt.num(lo)
    if fmt.num(lo) == fmt.num(hi):
        return f"{fmt.num(lo)} (spread {fmt.num(hi - lo)})"
    return f"{fmt.num(lo)}..{fmt.num(hi)}"


def render(pred: dict, width: int = 120) -> Any:
    """A table per (contract, dtype, part): a row per series, its range over every seed, a sparkline (and the
    last value, where it fits) per seed."""
    records = [m for m in pred.get("mechanism") or [] if isinstance(m, dict)] if isinstance(
        pred.get("mechanism"), list) else []
    groups = series(records)
    if not groups:
        return Text("no mechanism step records in this receipt" if not records else
                    "the mechanism records hold no numeric step fields", style="italic")
    parts: list[Any] = [Text("each row is scaled to its own range over every seed; ─ never moved, × NaN or inf",
                             style="dim")]
    for (contract, dtype, part), by_name in groups.items():
        seeds = []
        for per_seed in by_name.values():
            seeds += [s for s in per_seed if s not in seeds]
        longest = max(len(v) for per_seed in by_name.values() for v in per_seed.values())
        name_w = max(len(n) for n in by_name)
        with_last = name_w + 18 + len(seeds) * (min(longest, MAX_POINTS) + 10) <= width
        title = Text(f"{contract} {dtype}" + (f" ({part})" if part else "") + f": {longest} step(s)", style="bold")
        t = Table(title=fmt.plain(title.plain, "bold"), title_justify="left", show_edge=False, pad_edge=False,
                  expand=False, box=None, padding=(0, 1))
        t.add_column(fmt.plain("record"), no_wrap=True)
        t.add_column(fmt.plain("range"), no_wrap=True)
        for s in seeds:
            t.add_column(fmt.plain(f"seed {s}"), no_wrap=True)
        for name, per_seed in by_name.items():
            finite = [v for vals in per_seed.values() for v in vals if math.isfinite(v)]
            lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
            cells: list[Text] = [fmt.plain(name), fmt.plain(_range(lo, hi), "dim")]
            for s in seeds:
                vals = per_seed.get(s)
                if not vals:
                    cells.append(Text("–", style="dim"))
                    continue
                cell = sparkline(vals, lo, hi)
                if with_last:
                    cell.append(f" {fmt.num(vals[-1])}")
                cells.append(cell)
            t.add_row(*cells)
        parts.append(Text(""))
        parts.append(t)
    return Group(*parts)
