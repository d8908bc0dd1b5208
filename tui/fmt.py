"""Marks, words and colours for statuses: every colour comes with a mark and a word (NO_COLOR stays readable)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group
from rich.text import Text

from engine.text import term_safe

# partial / not_applicable: an implementation that cannot be held to every contract (an adapted verl loss)
STATUS_MARK = {"passed": "✓", "failed": "✗", "error": "!", "interrupted": "◌", "partial": "◐",
               "not_applicable": "–", None: "·"}
STATUS_STYLE = {"passed": "green", "failed": "bold red", "error": "bold magenta", "interrupted": "yellow",
                "partial": "yellow", "not_applicable": "dim", None: "dim"}
STATE_STYLE = {"fresh": "green", "stale": "yellow", "tampered": "bold red reverse", "invalid": "bold red reverse"}
STATE_WORD = {"fresh": "fresh", "stale": "stale", "tampered": "TAMPERED", "invalid": "CORRUPT"}
GATE_MARK = {"open": "✓", "closed": "✗", "unknown": "…"}
GATE_STYLE = {"open": "bold green", "closed": "bold red", "unknown": "dim"}
OPS = {"le": "≤", "lt": "<", "ge": "≥", "gt": ">", "eq": "="}


# --- text from specs, receipts and file names: data, never markup, never control sequences ---------


def plain(value: Any, style: str = "") -> Text:
    """`value` as literal text: no markup is parsed (`[@click=...]` stays those characters) and control
    characters show escaped (engine/text.py), so nothing a spec or receipt holds can act on the app or the
    terminal."""
    return Text(term_safe(value if isinstance(value, str) else str(value)), style=style)


def _clean_text(t: Text) -> Text:
    """A Text with its control characters escaped, styles kept."""
    if term_safe(t.plain, keep_newlines=True) == t.plain:
        return t
    out = Text(style=t.style, justify=t.justify, overflow=t.overflow, no_wrap=t.no_wrap, end=t.end)
    for line_no, line in enumerate(t.split("\n", allow_blank=True)):
        if line_no:
            out.append("\n")
        pos = 0
        text = line.plain
        for i, ch in enumerate(text):
            safe = term_safe(ch)
            if safe != ch:
                out.append_text(line[pos:i])
                out.append(safe, style="reverse")
                pos = i + 1
        out.append_text(line[pos:])
    return out


def clean(value: Any) -> Any:
    """What a widget may be given: a str becomes `plain` Text; a Text (or the Texts of a Group) has its control
    characters escaped; any other renderable is returned as it is."""
    if isinstance(value, str):
        return Text(term_safe(value, keep_newlines=True))
    if isinstance(value, Text):
        return _clean_text(value)
    if isinstance(value, Group):
        return Group(*(clean(r) for r in value.renderables), fit=value.fit)
    return value


def cell(value: Any) -> Any:
    """A DataTable cell or label: a str as DataTable would show it (no line end), but never as markup; text
    wider than its column ends in `…` instead of wrapping out of sight."""
    if isinstance(value, str):
        return Text(term_safe(value), end="", no_wrap=True, overflow="ellipsis")
    value = clean(value)
    if isinstance(value, Text):
        value.no_wrap, value.overflow = True, "ellipsis"
    return value


def status(value: str | None, extra: str = "") -> Text:
    """'✓ passed' in green, '✗ failed' in red, '· none' dim."""
    word = value or "none"
    return Text(f"{STATUS_MARK.get(value, '?')} {word}{extra}", style=STATUS_STYLE.get(value, "bold"))


def state(value: str) -> Text:
    return Text(STATE_WORD.get(value, value), style=STATE_STYLE.get(value, ""))


def coverage(c: Any) -> Text:
    """'full' plain, 'partial 1/10' in yellow (a partial pass must never read like a full one); '–' unknown."""
    if c is None:
        return Text("–", style="dim")
    return Text(c.label(), style="" if c.full else "bold yellow")


def gate(verdict: str) -> Text:
    word = "pending" if verdict == "unknown" else verdict
    return Text(f"{GATE_MARK.get(verdict, '?')} gate {word}", style=GATE_STYLE.get(verdict, ""))


def gate_unmet(out: Text, unmet: Any) -> None:
    """Append each unmet gate requirement, with the command or step that would meet it."""
    for what, how in unmet:
        out.append("✗ ", style="bold red")
        out.append(what + "\n")
        if how:
            out.append(f"    {'$ ' if how.startswith('contracts ') else '-> '}{how}\n", style="cyan")


def gate_warnings(out: Text, warnings: Any) -> None:
    for w in warnings:
        out.append("⚠ ", style="yellow")
        out.append(w + "\n")


def num(x: Any) -> str:
    """Short, exact enough: 3 significant digits for floats, ints as they are."""
    if isinstance(x, bool) or x is None:
        return str(x).lower() if isinstance(x, bool) else "–"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if math.isnan(x):
            return "NaN"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return f"{x:.3g}"
    return str(x)


def expectation(metric: Any, value: Any, op: Any, threshold: Any) -> str:
    """'max_abs_err 3.1e-16 ≤ 1e-12'."""
    if metric is None:
        return "–"
    return f"{metric} {num(value)} {OPS.get(op, op or '?')} {num(threshold)}"


def when(created_at: str | None, short: bool = False) -> str:
    """'2026-05-01 12:03:04' from an RFC 3339 UTC stamp (UTC, to the second); short: '05-01 12:03'."""
    if not created_at:
        return "?"
    return created_at[5:16].replace("T", " ") if short else created_at[:19].replace("T", " ")


def commit(c: Any, dirty: Any) -> str:
    if not isinstance(c, str) or not c:
        return "–"
    return c[:8] + ("+dirty" if dirty else "")
