"""A researcher's own implementation on a checkpoint: `check --impl FILE --only mechanism --policy hf:DIR` against
the built-in `check --only mechanism --policy hf:DIR` on the same checkpoint, same seeds, alternating.

Each side is its own `contracts check` process (as a user runs it), so the figures include the checkpoint's load;
the --impl side also starts the sandboxed candidate and crosses the boundary on every call back to the policy (the
model stays with the supervisor). Peak memory is each check process's own high-water mark (`wait4`'s ru_maxrss:
the supervisor, which holds the model; the candidate's process is measured apart by the kernel and not counted).

The checkpoint is the tiny Qwen2 tests/hf_support.py builds (transformers, peft and tokenizers: the [hf] extra),
or `$BENCH_HF_CHECKPOINT` (a local folder, e.g. Qwen2.5-0.5B on --device cuda).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, Candidates, Row, spread

METHODS = {"tapo-trajectory": ("my_tapo.py", "mechanism"), "mrtpo": ("my_mrtpo.py", "mechanism"),
           "tar-adaptive-replay": ("my_tar.py", "mechanism_run")}


def _timed(argv: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in MiB) of one `contracts ...` process; it must exit 0."""
    env = {k: v for k, v in os.environ.items() if k not in ("CONTRACTS_SPECS", "CONTRACTS_RECEIPTS")}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"contracts {' '.join(argv[:3])} exited {proc.returncode}: {err[-600:]}")
    return wall, usage.ru_maxrss // 1024


def run(device: str = "cpu", repeats: int = 3, lora_rank: int = 4) -> list[Row]:
    from engine.run import sandbox

    boxed = [] if not sandbox.unavailable() else ["--no-sandbox"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-hf-") as tmp:
        tmp = Path(tmp)
        ckpt = os.environ.get("BENCH_HF_CHECKPOINT")
        if not ckpt:
            from tests.hf_support import build_tiny_qwen2

            ckpt = str(build_tiny_qwen2(tmp / "tiny-qwen2"))
        name = Path(ckpt).name
        for method, (fixture, contract) in METHODS.items():
            fresh = Candidates(tmp / method, ROOT / "tests" / "fixtures" / fixture)
            (tmp / method).mkdir()
            common = ["--only", contract, "--policy", f"hf:{ckpt}", "--lora-rank", str(lora_rank), "--device",
                      device, "--no-mutants"]
            builtin = ["check", method, *common, "--receipts", str(tmp / "r-builtin")]

            def impl() -> list[str]:
                return ["check", method, "--impl", str(fresh()), *common, *boxed, "--receipts", str(tmp / "r-impl")]

            _timed(builtin), _timed(impl())  # warm the page cache and the sandbox's first start
            t_impl, t_builtin, m_impl, m_builtin = [], [], [], []
            for i in range(repeats):  # alternating, each order half the time
                for side in (("impl", "builtin") if i % 2 == 0 else ("builtin", "impl")):
                    wall, rss = _timed(impl()) if side == "impl" else _timed(builtin)
                    (t_impl if side == "impl" else t_builtin).append(wall)
                    (m_impl if side == "impl" else m_builtin).append(rss)
            ratios = [a / b for a, b in zip(t_impl, t_builtin)]
            med = statistics.median(t_impl) / statistics.median(t_builtin)
            rows.append(Row(
                name=f"check --impl {contract} on hf:{name}", against="the built-in mechanism, same checkpoint",
                shape=f"{method}, 3 budget seeds, LoRA rank {lora_rank}, sandboxed" if not boxed else
                f"{method}, 3 budget seeds, LoRA rank {lora_rank}, unsandboxed",
                value=med, unit="x", target="(shown)", ok=None,
                spread=spread(min(ratios), max(ratios), len(ratios)) + f"; peak RSS {max(m_impl)} vs "
                                                                     f"{max(m_builtin)} MiB",
                note=(f"{method}: --impl {statistics.median(t_impl):.1f} s against built-in "
                      f"{statistics.median(t_builtin):.1f} s (medians of {repeats}); the supervisor's peak RSS "
                      f"{max(m_impl)} MiB against {max(m_builtin)} MiB"),
                details={"impl_s": t_impl, "builtin_s": t_builtin, "impl_rss_mib": m_impl,
                         "builtin_rss_mib": m_builtin, "checkpoint": name}))
    return rows
