"""The plain-torch TAPO candidate of tests/fixtures/my_tapo.py and its one-edit variants, shared by the `--impl`
tests and the evolve-evaluator tests."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "my_tapo.py"
METHOD = "tapo-trajectory"
RATIO_BODY = "    m = _bool(mask, logp)\n    wd = _work_dtype(logp.dtype)\n    zero = torch.zeros((), dtype=wd, device=logp.device)\n    diff"
RATIO_RETURN = "    return prefix * torch.exp(here - here.detach())"

# Ways for a candidate to misbehave once it runs (code put at the top of trajectory_ratio, under RATIO_BODY), each
# with what the error it becomes says.
MISBEHAVING = {
    "hang": ("import time\n    while True:\n        time.sleep(0.5)\n", "past its deadline"),
    "sys_exit": ("import sys\n    sys.exit(0)\n", "SystemExit"),
    "os_exit": ("import os\n    os._exit(7)\n", "exited with code 7"),
    "segfault": ("import ctypes\n    ctypes.string_at(0)\n", "killed by SIGSEGV"),
}


def variant(folder: Path, name: str, old: str | None = None, new: str | None = None) -> Path:
    """The fixture with one edit (`old`, found exactly once, replaced by `new`), written as folder/name."""
    text = FIXTURE.read_text()
    if old is not None:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = folder / name
    path.write_text(text)
    return path
