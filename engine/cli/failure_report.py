"""The failures of a `contracts check` run, grouped: one block per contract that did not hold.

Each block says how many seed x dtype cells failed out of how many, the range
of the measured values against the limit, where the contract and its formulas
are in the spec, and a command that reruns just that contract. What follows
from those failures (mutants that could not be killed by a failing contract,
contracts left unproven) is one sentence, not a line per mutant.

Prose is wrapped to the reader's width (`report_width`: COLUMNS, else the
terminal's; nothing when piped, where logs are read whole), continuing with an
indent; ids, paths and the repro command are never split, so a `repro:` line
stays one line to copy.
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import sys
import textwrap
from collections import Counter
from typing import Any, Optional

from engine.cli.colour import bad
from engine.run.expect import describe
from engine.tiers import tier_of

_BROKEN = {"le": ">", "lt": ">=", "ge": "<", "gt": "<="}


def report_width() -> int | None:
    """Columns to wrap the report to: COLUMNS when set, else the terminal's when stderr is one; None when piped."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    try:
        return shutil.get_terminal_size().columns if sys.stderr.isatty() else None
    except (OSError, ValueError):
        return None


def failure_report(pred: dict, spec: Any = None, flags: str = "", width: int | None = None) -> list[str]:
    """Lines for stderr; empty when every contract held and every mutant was killed. With `width`, prose lines are
    wrapped to it (continuations indented); a word longer than the width, a path say, stays whole."""
    lines: list[tuple[str, str, str]] = []  # (failure word, text, continuation indent)
    failing: dict[str, list[dict]] = {}
    stubs: dict[str, dict] = {}  # a candidate's function not written yet: said once, not once per contract
    for r in pred["results"]:
        for d in r.get("not_implemented") or []:
            entry = stubs.setdefault(str(d.get("function")), {"at": str(d.get("at")), "contracts": []})
            if r["contract"] not in entry["contracts"]:
                entry["contracts"].append(r["contract"])
        if r.get("not_implemented"):
            continue
        if r["status"] not in ("passed", "partial", "not_applicable"):  # the coverage lines say what was not measured
            failing.setdefault(r["contract"], []).append(r)
    for fn, entry in stubs.items():
        cids = entry["contracts"]
        lines.append(("NOT IMPLEMENTED", f"{fn} ({entry['at']}): raised NotImplementedError; "
                      f"{_count(len(cids), 'contract')} could not measure it: {', '.join(cids)}", "    "))
    for cid, bad_cells in failing.items():
        lines += _contract_block(pred, cid, bad_cells, spec, flags)
    if stubs:
        lines.append(("", f"Fill in {', '.join(stubs)} and check again: until then the contracts that call "
                      f"{'it' if len(stubs) == 1 else 'them'} measure nothing and no mutant can be killed there.", "  "))
    else:
        lines += _consequences(pred, set(failing))
    return [out for word, text, indent in lines for out in _wrap(word, text, indent, width)]


def _wrap(word: str, text: str, indent: str | None, width: int | None) -> list[str]:
    """`word text` wrapped to `width` (None: one line), the failure word coloured after wrapping so the escape
    codes take no columns; `indent` None never wraps (a command to copy)."""
    plain = f"{word} {text}" if word else text
    out = [plain]
    if width and indent is not None and len(plain) > width:
        lead = plain[: len(plain) - len(plain.lstrip(" "))]  # textwrap keeps it on the first line; continuations add it
        out = textwrap.wrap(plain, width=width, subsequent_indent=lead + indent, break_long_words=False,
                            break_on_hyphens=False) or [plain]
    if word:
        out[0] = bad(word) + out[0][len(word):]
    return out


def _contract_block(pred: dict, cid: str, cells: list[dict], spec: Any, flags: str) -> list[str]:
    total = pred["summary"]["contracts"].get(cid, {}).get("requested") or len(cells)
    errors = sum(r["status"] == "error" for r in cells)
    word = "ERROR" if errors == len(cells) else "FAILED"
    what = (f"{len(cells)} of {total} seed x dtype cells failed" if not errors
            else f"{len(cells)} of {total} seed x dtype cells did not pass ({errors} raised)")
    # the tier first: a reader (and the gate) tells a broken equation from a memory or time limit at a glance
    tier = tier_of(pred["summary"]["contracts"].get(cid) or {})
    lines = [(word, f"{tier} {cid}{_where(pred, cid, spec)}: did not hold, {what}", "    ")]
    lines += [("", text, "    ") for text in _measured(cells)]
    seeds = sorted({r["seed"] for r in cells})
    dtypes = sorted({r["dtype"] for r in cells})
    lines.append(("", f"  seeds {', '.join(map(str, seeds))}; dtypes {', '.join(dtypes)}", "    "))
    first = next((r["failing_cases"][0] for r in cells if r.get("failing_cases")), None)
    if first is not None:  # the case a kind named: shapes, argument, where; rerun alone with --case
        from engine.run.runner import describe_case

        lines.append(("", f"  failing case: {describe_case(first)}", "    "))
        lines.append(("", f"  repro: {repro_command(pred, cid, first['seed'], flags, case=first['case'])}", None))
    else:
        lines.append(("", f"  repro: {repro_command(pred, cid, seeds[0], flags)}", None))  # one line, to copy
    return lines


def _where(pred: dict, cid: str, spec: Any) -> str:
    """` (specs/x.yaml:98, formula length_clip)`: where to read the contract and the math it checks."""
    shown = getattr(spec, "display", None) or (pred.get("spec") or {}).get("name") or ""
    formulas: list[str] = []
    if spec is not None:
        for i, c in enumerate(spec.data["contracts"]):
            if c["id"] == cid:
                line, _ = spec.locate(["contracts", i])
                shown = f"{shown}:{line}" if line else shown
                formulas = list(c.get("formulas") or [])
                break
    parts = [p for p in (shown, (("formula " if len(formulas) == 1 else "formulas ") + ", ".join(formulas))
                         if formulas else "") if p]
    return f" ({', '.join(parts)})" if parts else ""


def _measured(cells: list[dict]) -> list[str]:
    """The failed expectations as ranges against their limits; other failures by message, counted."""
    groups: dict[tuple, list] = {}
    messages: Counter = Counter()
    for r in cells:
        failed = [e for e in r.get("expectations") or [] if not e.get("passed") and "not_applicable" not in e]
        scaled = [e for e in failed if e.get("op") in _BROKEN and e.get("value") is not None]
        for e in scaled:
            groups.setdefault((e["metric"], e["op"], _key(e["threshold"])), []).append((e["value"], r["dtype"]))
        for e in failed:
            if e not in scaled:
                messages[describe(e)] += 1
        if not failed and r.get("message"):
            messages[str(r["message"])] += 1
    lines = []
    for (metric, op, threshold), vals in groups.items():
        nums = [v for v, _ in vals if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)]
        odd = len(vals) - len(nums)
        if nums:
            lo, hi = min(nums), max(nums)
            shown = _num(lo) if lo == hi else f"{_num(lo)} .. {_num(hi)}"
            text = f"{metric} {shown} {_BROKEN[op]} limit {_num(threshold)}"
        else:
            text = f"{metric} not a number, so not {op} limit {_num(threshold)}"
        if odd and nums:
            text += f", and not a number in {odd}"
        dtypes = sorted({d for _, d in vals})
        lines.append(f"  {text} ({_cells(len(vals))}; {', '.join(dtypes)})")
    for msg, n in messages.most_common(3):
        lines.append(f"  {msg} ({_cells(n)})")
    if len(messages) > 3:
        lines.append(f"  ... and {len(messages) - 3} other messages (see the receipt)")
    return lines


def _consequences(pred: dict, failing: set[str]) -> list[tuple[str, str, str]]:
    """One sentence for what the failures imply; separate lines only for problems of their own."""
    lines = []
    interrupted = pred["status"] == "interrupted"
    follow, own = [], []
    for m in pred["mutants"]:
        if m["killed"] or m.get("error"):
            continue
        # A kill counts only where the unmutated baseline passed: a failing contract can kill nothing.
        (own if any(x.get("baseline_passed") for x in m.get("results") or []) else follow).append(m["id"])
    ran = {x["contract"] for m in pred["mutants"] for x in m.get("results") or []}
    unproven = list(pred["unproven_contracts"])
    never_ran = [c for c in unproven if c not in ran] if interrupted else []
    unproven = [c for c in unproven if c not in never_ran]
    follow_c = [c for c in unproven if c in failing]
    own_c = [c for c in unproven if c not in failing]
    if failing and (follow or follow_c):
        parts = []
        if follow:
            parts.append(f"{_count(len(follow), 'mutant')} survived ({', '.join(follow)})")
        if follow_c:
            parts.append(f"{_count(len(follow_c), 'contract')} stayed unproven ({', '.join(follow_c)})")
        lines.append(("", "Because of these failures " + " and ".join(parts) + ": a contract that fails on the "
                      "unmutated implementation cannot count a kill; fix the failures first.", "  "))
    for mid in own:
        m = next(x for x in pred["mutants"] if x["id"] == mid)
        lines.append(("SURVIVED", f"mutant {mid} ({m['description']}): none of "
                      f"{', '.join(m['expected_killers'])} failed on it", "  "))
    for m in pred["mutants"]:
        if m.get("error"):
            lines.append(("ERROR", f"mutant {m['id']}: {m['error']}", "  "))
    if own_c:
        lines.append(("UNPROVEN", f"{', '.join(own_c)}: not shown to fail on any mutant", "  "))
    if never_ran:
        lines.append(("", f"interrupted: the mutants of {_count(len(never_ran), 'contract')} never ran, so nothing "
                      "is said about them", "  "))
    return lines


def repro_command(pred: dict, cid: str, seed: Optional[int], flags: str = "", case: Optional[int] = None) -> str:
    """`contracts check METHOD --only CONTRACT --seeds S [--case N]` with the device and folder options as given."""
    argv = ["contracts", "check", pred["method"], "--only", cid]
    if seed is not None:
        argv += ["--seeds", str(seed)]
    if case is not None:
        argv += ["--case", str(case)]
    device = (pred.get("request") or {}).get("device") or "cpu"
    if device != "cpu":
        argv += ["--device", device]
    return " ".join(shlex.quote(a) for a in argv) + flags


def _key(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)


def _num(v: Any) -> str:
    if isinstance(v, float):
        return repr(v) if not math.isfinite(v) else f"{v:.3g}"
    return str(v)


def _cells(n: int) -> str:
    return f"{n} cell" + ("" if n == 1 else "s")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")
