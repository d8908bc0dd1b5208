"""Framework adapters built from data: methods/common/zoo.yaml says, per implementation, how a spec's loss call
reaches verl's policy loss (ActorConfig fields) or TRL's `GRPOTrainer._compute_loss` (trainer attributes); this
module applies that table and holds no mapping of its own. (Which variants claim which paper is the conformance
matrix's, docs/conformance.yaml.) A method registers its adapters with one call,
`zoo.register("dapo")`.

The mapping vocabulary (zoo.yaml, `mappings`): a framework setting is `{arg: NAME}` (the spec argument's value),
with `none: X` (its value when the argument is None; `L` is the padded length) or `plus: X` (added to it), or
`{value: X}` (a constant). `fixed` arguments are hard-coded in the framework: any other value is not provided, so
the contract that passed it is recorded not applicable, never passed. `ignored` arguments have no framework
setting: nothing is passed, and the contracts measure what the framework does without them.
"""

from __future__ import annotations

import inspect
import math
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from engine.spec import registry

ZOO_FILE = Path(__file__).with_name("zoo.yaml")
NOT_IN_LOSS = "a framework's policy loss returns only (loss, metrics): it has no {function} of its own"


@lru_cache(maxsize=1)
def table() -> dict:
    """zoo.yaml as plain data."""
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=True).load(ZOO_FILE.read_text(encoding="utf-8"))


def mapping(implementation: str) -> dict:
    return table()["mappings"][implementation]


def _value(rule: dict, bound: dict, length: int) -> Any:
    if "value" in rule:
        return rule["value"]
    x = bound[rule["arg"]]
    if x is None:
        return length if rule.get("none") == "L" else rule.get("none")
    return float(x) + float(rule["plus"]) if "plus" in rule else x


def _settings(rules: dict, bound: dict, length: int) -> dict:
    return {name: _value(rule, bound, length) for name, rule in (rules or {}).items()}


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return not isinstance(a, bool) and isinstance(a, (int, float)) and math.isclose(float(a), float(b), rel_tol=0,
                                                                                    abs_tol=0)


def _check_fixed(function: str, fixed: dict, bound: dict) -> None:
    for name, rule in (fixed or {}).items():
        if not _same(bound[name], rule["value"]):
            raise registry.NotProvided(function, f"{rule['why']}; {name}={bound[name]!r} cannot be set")


def _binder(implementation: str, function: str) -> Callable[..., dict]:
    """(args, kwargs) -> every argument of the method's own `function` by name, its defaults filled in: the adapter
    takes exactly the interface's signature."""
    own = getattr(registry.load().get_implementation(implementation), function)
    sig = inspect.signature(own)

    def bind(args, kwargs) -> dict:
        b = sig.bind(*args, **kwargs)
        b.apply_defaults()
        return dict(b.arguments)

    return bind


def _per_token(advantages, logp):
    return advantages[:, None].expand_as(logp) if advantages.dim() == 1 else advantages


def _metrics(m) -> dict:
    return {"tokens": int(m.sum()), "rows": int(m.any(dim=-1).sum())}


def _absent(entry: dict, implementation: str, function: str) -> dict:
    own = registry.load().get_implementation(implementation).functions
    absent = {f: why for f, why in (entry.get("absent") or {}).items()}
    for f in own:
        if f != function and f not in absent:
            absent[f] = NOT_IN_LOSS.format(function=f)
    return absent


def verl_adapter(implementation: str) -> Callable[[Any], registry.Adapted]:
    """`adapt(fn)` for a verl policy loss `fn`, from zoo.yaml's `mappings.IMPLEMENTATION.verl`."""
    entry = mapping(implementation)
    rules, function = entry["verl"], entry["function"]

    def adapt(fn) -> registry.Adapted:
        import torch

        from engine.run.adapters.verl import actor_config, call_policy_loss

        bind = _binder(implementation, function)

        def loss(*args, **kwargs):
            bound = bind(args, kwargs)
            _check_fixed(function, rules.get("fixed"), bound)
            logp, mask = bound["logp"], bound["mask"]
            m = mask if mask.dtype == torch.bool else mask != 0
            cfg = _settings(rules["config"], bound, logp.shape[-1])
            agg = cfg.pop("loss_agg_mode", "token-mean")
            high = cfg.pop("clip_ratio_high", 0.2)
            config = actor_config(clip_ratio=cfg.pop("clip_ratio", high),
                                  clip_ratio_low=cfg.pop("clip_ratio_low", high), clip_ratio_high=high, rollout_n=1,
                                  loss_agg_mode=agg, loss_scale_factor=cfg.pop("loss_scale_factor", None), **cfg)
            old = bound.get("old_logp")
            return call_policy_loss(fn, old_log_prob=logp.detach() if old is None else old, log_prob=logp,
                                    advantages=_per_token(bound["advantages"], logp), response_mask=m,
                                    loss_agg_mode=agg, config=config)[0], _metrics(m)

        loss.__name__ = function
        return registry.Adapted(functions={function: loss}, own=[function],
                                absent=_absent(entry, implementation, function), notes=[rules["note"]])

    return adapt


def _trainer(cls, loss_type: str, attrs: dict, max_completion_length: int):
    """A GRPOTrainer without a model, holding only the state `_compute_loss` reads (trl 1.16.0), as TRL's own
    tests make one (`object.__new__`); eval mode, so no gradient-accumulation normaliser."""
    tr = object.__new__(cls)
    tr.loss_type, tr.importance_sampling_level = loss_type, "token"
    tr.epsilon_low, tr.epsilon_high, tr.beta = 0.2, 0.2, 0.0
    tr.args = SimpleNamespace(delta=None, use_bias_correction_kl=False)
    tr.top_entropy_quantile, tr.off_policy_mask_threshold = 1.0, None
    tr.use_vllm, tr.vllm_importance_sampling_correction = False, False
    tr.model = SimpleNamespace(training=False)
    tr.current_gradient_accumulation_steps = 1
    tr.max_completion_length = max_completion_length
    tr.accelerator = SimpleNamespace(gather=lambda t: t, gather_for_metrics=lambda t: t, num_processes=1,
                                     sync_gradients=True, reduce=lambda t, reduction="sum": t)
    tr._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    tr._entropy_bonus_enabled, tr.aux_loss_enabled = False, False
    for name, value in attrs.items():
        setattr(tr, name, float(value) if name.startswith("epsilon") else value)
    return tr


def trl_adapter(implementation: str) -> Callable[[Any], registry.Adapted]:
    """`adapt(cls)` for TRL's trainer (`trl:GRPOTrainer`, or `trl:LOSS_TYPE` pinned), from zoo.yaml's
    `mappings.IMPLEMENTATION.trl`."""
    entry = mapping(implementation)
    rules, function = entry["trl"], entry["function"]

    def adapt(obj) -> registry.Adapted:
        import torch

        from engine.run.adapters.trl import unpin

        cls, pinned = unpin(obj)
        loss_type = pinned or rules["loss_types"][0]
        bind = _binder(implementation, function)

        def loss(*args, **kwargs):
            if loss_type not in rules["loss_types"]:
                raise registry.NotProvided(function, f"trl:{pinned} computes loss_type {pinned!r}; this spec's loss "
                                                     f"is loss_type {' or '.join(map(repr, rules['loss_types']))}")
            bound = bind(args, kwargs)
            _check_fixed(function, rules.get("fixed"), bound)
            logp, mask = bound["logp"], bound["mask"]
            m = mask if mask.dtype == torch.bool else mask != 0
            attrs = _settings(rules.get("attrs"), bound, logp.shape[-1])
            tr = _trainer(cls, loss_type, attrs, attrs.pop("max_completion_length", logp.shape[-1]))
            tr._get_per_token_logps_and_entropies = lambda *a, **k: (logp, torch.zeros_like(logp), None)
            B, L = logp.shape
            old = bound.get("old_logp")
            inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long),
                      "prompt_mask": torch.ones(B, 1, dtype=torch.long),
                      "completion_ids": torch.zeros(B, L, dtype=torch.long), "completion_mask": m.long(),
                      "advantages": bound["advantages"], "old_per_token_logps": old,
                      # one process, one accumulation step: the "global" batch is this call's valid tokens
                      "num_items_in_batch": m.sum()}
            return tr._compute_loss(None, inputs), _metrics(m)

        loss.__name__ = function
        return registry.Adapted(functions={function: loss}, own=[function],
                                absent=_absent(entry, implementation, function), notes=[rules["note"]])

    return adapt


@registry.reference("zoo.counts")
def counts(*args, **_):
    """The metrics every zoo loss returns: tokens (N) and rows (the non-empty responses) of the mask, the call's
    last positional argument."""
    mask = args[-1]
    return {"tokens": float((mask != 0).sum()), "rows": float((mask != 0).any(dim=-1).sum())}


def register(implementation: str) -> None:
    """Register the adapters zoo.yaml maps for `implementation` (one per framework it names)."""
    entry = mapping(implementation)
    for framework, build in (("verl", verl_adapter), ("trl", trl_adapter)):
        if framework in entry:
            registry.adapter(framework, implementation=implementation)(build(implementation))
