"""TRL's GRPO trainer as an `--impl` target: `trl:GRPOTrainer` (its loss, `GRPOTrainer._compute_loss`), or one of
its loss types pinned, `trl:LOSS_TYPE` (`trl:dapo`, `trl:cispo`, ...: the trainer with that `loss_type` and no other).

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
# GRPOConfig.loss_type values of the pinned release (trl/trainer/grpo_config.py): `trl:NAME` pins one of them
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


def parse(raw: str, rest: str) -> dict:
    """`rest` (what follows `trl:`) as {name, path, module}; nothing is imported."""
    if rest not in OBJECTS + LOSS_TYPES:
        raise UsageError(f"--impl {raw}: give trl:GRPOTrainer (TRL's GRPO and GSPO losses live in "
                         f"GRPOTrainer._compute_loss) or trl:LOSS_TYPE, one of {', '.join(LOSS_TYPES)}")
    return {"name": rest, "path": None, "module": None}


def core_file() -> tuple[Path, Path]:
    """(import root, trl/trainer/grpo_trainer.py), found without importing trl."""
    return package.core_file("trl", CORE, INSTALL, f"the project pins trl {PINNED}")


def version() -> str | None:
    return package.version(DISTRIBUTION)


class Pinned:
    """`trl:LOSS_TYPE`: the trainer class with one loss type fixed; an adapter must compute that loss type or say
    that the contract's arguments need another (not provided)."""

    def __init__(self, trainer: type, loss_type: str):
        self.trainer, self.loss_type = trainer, loss_type


def unpin(obj: Any) -> tuple[type, str | None]:
    """(trainer class, pinned loss type or None) of a resolved `trl:` object."""
    return (obj.trainer, obj.loss_type) if isinstance(obj, Pinned) else (obj, None)


def resolve(name: str) -> tuple[Any, dict]:
    """The trainer class (or, for a loss type, the class pinned to it) and what identifies it. Worker only."""
    import inspect

    found = version()
    if found != PINNED:
        raise LookupError(f"trl {found} is installed; the adapter sets GRPOTrainer's private state as trl {PINNED} "
                          f"reads it: {INSTALL}")
    from trl.trainer.grpo_trainer import GRPOTrainer

    src = Path(inspect.getsourcefile(GRPOTrainer) or "").resolve()
    if name in LOSS_TYPES:
        return Pinned(GRPOTrainer, name), {"name": name, "qualname": f"{GRPOTrainer.__qualname__}._compute_loss "
                                           f"(loss_type={name!r})", "source": str(src), "trl": found}
    return GRPOTrainer, {"name": name, "qualname": GRPOTrainer.__qualname__, "source": str(src), "trl": found}


def preload() -> None:
    """Import the parts of TRL the loss runs with (before the worker caps its address space)."""
    import trl.trainer.grpo_trainer  # noqa: F401


