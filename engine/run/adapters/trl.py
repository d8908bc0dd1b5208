"""TRL's GRPO trainer as an `--impl` target: `trl:GRPOTrainer` (its loss, `GRPOTrainer._compute_loss`).

TRL has no standalone policy loss: the GRPO and GSPO losses are inline in `GRPOTrainer._compute_loss(model,
inputs)`. The target names the trainer class; a method's adapter (methods/grpo/trl_adapter.py) makes a trainer
without a model, as TRL's own tests make one (`object.__new__`), supplies the per-token log-probs and calls
`_compute_loss`. The receipt binds `impl:trl/trainer/grpo_trainer.py`; TRL's version is recorded with the packages.
The attributes the adapter sets are TRL's private state, so the project pins the release it was written against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import UsageError
from engine.run.adapters import package

FRAMEWORK = "trl"
DISTRIBUTION = "trl"
PINNED = "1.16.0"
CORE = ("trainer", "grpo_trainer.py")
INSTALL = "pip install -e '.[trl]'"
OBJECTS = ("GRPOTrainer",)


def parse(raw: str, rest: str) -> dict:
    """`rest` (what follows `trl:`) as {name, path, module}; nothing is imported."""
    if rest not in OBJECTS:
        raise UsageError(f"--impl {raw}: give trl:GRPOTrainer (TRL's GRPO and GSPO losses live in "
                         "GRPOTrainer._compute_loss)")
    return {"name": rest, "path": None, "module": None}


def core_file() -> tuple[Path, Path]:
    """(import root, trl/trainer/grpo_trainer.py), found without importing trl."""
    return package.core_file("trl", CORE, INSTALL, f"the project pins trl {PINNED}")


def version() -> str | None:
    return package.version(DISTRIBUTION)


def resolve(name: str) -> tuple[Any, dict]:
    """The trainer class and what identifies it. Worker only."""
    import inspect

    found = version()
    if found != PINNED:
        raise LookupError(f"trl {found} is installed; the adapter sets GRPOTrainer's private state as trl {PINNED} "
                          f"reads it: {INSTALL}")
    from trl.trainer.grpo_trainer import GRPOTrainer

    src = Path(inspect.getsourcefile(GRPOTrainer) or "").resolve()
    return GRPOTrainer, {"name": name, "qualname": GRPOTrainer.__qualname__, "source": str(src), "trl": found}


def preload() -> None:
    """Import the parts of TRL the loss runs with (before the worker caps its address space)."""
    import trl.trainer.grpo_trainer  # noqa: F401


