"""Resolve `--device`: what was asked is what runs, or the run stops (exit 4). Never a silent fallback."""

from __future__ import annotations

import re

from engine.errors import EnvironmentProblem, UsageError

DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d{1,3}))?$")


def parse_device(text: str) -> tuple[str, int | None]:
    m = DEVICE_RE.match(text or "")
    if not m or (m.group(1) == "cpu" and m.group(2) is not None):
        raise UsageError(f"--device {text!r} is not a device; use cpu, cuda or cuda:N")
    return m.group(1), int(m.group(2)) if m.group(2) is not None else None


def resolve_device(text: str):
    """A torch.device for `text`, or EnvironmentProblem if this machine cannot provide it."""
    kind, index = parse_device(text)
    import torch

    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise EnvironmentProblem(
            f"--device {text} asked for CUDA, but torch {torch.__version__} sees no CUDA device here; "
            "run on a GPU machine or use --device cpu (no silent fallback)"
        )
    count = torch.cuda.device_count()
    index = 0 if index is None else index
    if index >= count:
        raise EnvironmentProblem(f"--device {text}: only {count} CUDA device(s) visible (cuda:0..cuda:{count - 1})")
    return torch.device("cuda", index)


def default_threads(text: str, threads: int | None = None) -> int | None:
    """torch threads for a check process: what was asked, else 1 on the CPU, else torch's default (None).

    The checks' tensors are small: on the CPU a second intra-op thread mostly spins waiting for work, and on a
    busy machine for a core. The serial `check --all` on a 2-core machine: 9 CPU-s with 1 thread against
    12.8 with 2 when idle, and 16-20 s against 145-170 s of wall time under a load of 6.
    """
    if threads is not None:
        return threads
    return 1 if parse_device(text)[0] == "cpu" else None


def describe(device) -> dict:
    """Device facts for a receipt: kind, name, CUDA version (no host or user names)."""
    import torch

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"kind": "cuda", "index": device.index, "name": props.name, "cuda": torch.version.cuda,
                "capability": f"{props.major}.{props.minor}"}
    return {"kind": "cpu", "index": None, "name": "cpu", "cuda": None, "capability": None}
