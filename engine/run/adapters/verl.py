"""verl policy losses as `--impl` targets, called the way verl's actor calls them.

    verl:NAME                 a loss registered in verl itself (`vanilla`, `gspo`, `geo_mean`, ...)
    verl:path/to/file.py:NAME a file whose `@register_policy_loss(NAME)` registers it (imported first)
    verl:package.module:NAME  the same from a module on the Python path

A verl policy loss is `fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights) -> (loss, metrics)` over [batch, response_length] tensors (verl.trainer.ppo.core_algos).
The receipt binds the file that defines the function (for verl's own losses
`impl:verl/trainer/ppo/core_algos.py`, which also holds the registry and `agg_loss`) and, for a file or module
target, that target's files; verl's version is recorded with the packages. The parent finds and hashes the files
without importing verl; only the worker imports it (engine/run/isolation.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from engine.errors import UsageError
from engine.run.adapters import package

FRAMEWORK = "verl"
DISTRIBUTION = "verl"
CORE = ("trainer", "ppo", "core_algos.py")  # under the verl package: the registry and verl's own losses
INSTALL = "pip install -e '.[verl]'"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse(raw: str, rest: str) -> dict:
    """`rest` (what follows `verl:`) as {name, path, module}; nothing is imported."""
    where, sep, name = rest.rpartition(":")
    if not sep:
        where, name = "", rest
    if not name or not _NAME.match(name):
        raise UsageError(f"--impl {raw}: give verl:NAME, verl:path/to/file.py:NAME or verl:package.module:NAME, "
                         "NAME being the name the loss is registered under (e.g. verl:geo_mean)")
    if not where:
        return {"name": name, "path": None, "module": None}
    if where.endswith(".py") or "/" in where:
        path = Path(where).expanduser()
        if not path.is_file():
            raise UsageError(f"--impl {raw}: no such file {where}")
        return {"name": name, "path": path.resolve(), "module": None}
    if not _DOTTED.match(where):
        raise UsageError(f"--impl {raw}: {where!r} is neither a .py file nor a module name; give "
                         "verl:path/to/file.py:NAME or verl:package.module:NAME")
    return {"name": name, "path": None, "module": where}


def core_file() -> tuple[Path, Path]:
    """(import root, verl/trainer/ppo/core_algos.py), found without importing verl."""
    return package.core_file("verl", CORE, INSTALL, "the project pins the verl it was tested with")


def version() -> str | None:
    return package.version(DISTRIBUTION)


# --- in the worker only -----------------------------------------------------------------------------


def resolve(name: str) -> tuple[Any, dict]:
    """verl's registered policy loss `name` (after the target's own module ran its decorators) and what identifies
    it: {name, qualname, file (import-root relative), verl version}."""
    import inspect

    from verl.trainer.ppo import core_algos

    registry = core_algos.POLICY_LOSS_REGISTRY
    if name not in registry:
        raise LookupError(f"verl has no policy loss registered as {name!r}; registered: {', '.join(sorted(registry))}")
    fn = registry[name]
    src = Path(inspect.getsourcefile(fn) or "").resolve()
    return fn, {"name": name, "qualname": getattr(fn, "__qualname__", repr(fn)), "source": str(src),
                "verl": version()}


def actor_config(*, clip_ratio: float, clip_ratio_low: float, clip_ratio_high: float, rollout_n: int,
                 loss_agg_mode: str = "token-mean", loss_scale_factor: int | None = None, **extra: Any):
    """A real `verl.workers.config.ActorConfig` (verl's own losses assert its type) with the loss's fields set;
    strategy and micro-batch size are placeholders that no policy loss reads. `global_batch_info` is what verl's
    actor fills in for one data-parallel rank and one micro-batch: the loss normalises by its own tokens."""
    from verl.workers.config import ActorConfig

    cfg = ActorConfig(strategy="fsdp", ppo_micro_batch_size_per_gpu=1, rollout_n=int(rollout_n),
                      clip_ratio=float(clip_ratio), clip_ratio_low=float(clip_ratio_low),
                      clip_ratio_high=float(clip_ratio_high), loss_agg_mode=loss_agg_mode,
                      loss_scale_factor=loss_scale_factor, **extra)
    cfg.global_batch_info.update({"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None,
                                  "loss_scale_factor": loss_scale_factor})
    return cfg


def call_policy_loss(fn, *, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode: str, config):
    """`fn` called as verl's actor calls it (verl/workers/utils/losses.py): keywords, a bool response mask, no
    rollout importance weights."""
    return fn(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
              response_mask=response_mask.to(bool), loss_agg_mode=loss_agg_mode, config=config,
              rollout_is_weights=None)


def preload() -> None:
    """Import the parts of verl a policy loss runs with (before the worker caps its address space)."""
    import verl.trainer.ppo.core_algos  # noqa: F401
    import verl.workers.config  # noqa: F401
