"""Render a benchmark JSON as the Markdown table the README quotes: python -m benchmarks.report FILE."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def markdown(data: dict) -> str:
    m = data["machine"]
    lines = [
        f"Measured on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['platform']}; Python {m['python']}, "
        f"torch {m['torch']} ({m['torch_threads']} threads); device {m['device']}"
        + (f" ({m['gpu']})" if m.get("gpu") else "")
        + f"; commit {m.get('commit')}; load average {m['load_before'][0]:.2f} before, {m['load_after'][0]:.2f} after; "
        f"{m['wall_s']:.0f} s in all.",
        "",
        "| row | shape | against | median | spread | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in data["rows"]:
        val = "n/a" if r["value"] is None else f"{r['value']:.3g} {r['unit']}"
        met = "n/a" if r["ok"] is None else ("yes" if r["ok"] else "**no**")
        lines.append(f"| {r['name']} | {r['shape']} | {r['against']} | {val} | {r['spread']} | {r['target']} | {met} |")
    notes = [f"{i}. {r['name']}: {r['note']}" for i, r in enumerate(data["rows"], 1) if r["note"]]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        sys.stdout.write(markdown(json.loads(Path(arg).read_text())))
