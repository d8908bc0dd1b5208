"""learning: on a budget where the toy task is clearly learnable, every arm of a paired run learns it.

The page-matched mechanism run is too small for anyone to learn anything (a few updates on a handful of prompts),
so it cannot tell an arm whose gradient is negated or frozen from an honest one. This kind runs the same paired
harness on a declared learnable budget and measures, itself, what each arm learned: the validation accuracy of the
arm's initial weights (kept by the shared sampler at its first draw) and of its final weights, on validation
prompts and a sampling stream drawn from the run seed, the same for both arms and both ends of the run. Every
figure is the supervisor's: it samples from the policy it holds and scores with the task's programmatic verifier;
nothing the run or the candidate reports is read.

Paired statistics within a seed: per validation prompt the gain is (final - initial) accuracy and the lag is
(control - method) final accuracy; the kind reports their means and the bounds of a two-sided 95% paired t
interval over the prompts. Across seeds the runner judges every budget seed.
"""

from __future__ import annotations

from typing import Any, Callable

from engine.errors import LookupFailure
from engine.kinds.base import Kind, kind
from engine.kinds.gradient_audit import RUN

_TASKS: dict[str, Callable[[Any], Any]] = {}

# ctx.generator offsets of the validation prompts and of the validation sampling stream (no run uses these)
PROMPTS_OFFSET = 9_001
STREAM_OFFSET = 9_002


def learning_task(name: str) -> Callable[[Callable[[Any], Any]], Callable[[Any], Any]]:
    """Register `factory(params) -> task`: `task.prompts(n, generator)` -> [n, P] ids, and
    `task.accuracy(policy, prompts, samples, max_new_tokens, generator)` -> (per-prompt mean reward in [0, 1] over
    `samples` responses sampled from `policy` with `generator`, tokens sampled). The task lives beside the method's
    run (methods/): the engine never imports a method's code, it reaches it through this registry."""

    def deco(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        if name in _TASKS:
            raise ValueError(f"learning task {name!r} is registered twice")
        _TASKS[name] = fn
        return fn

    return deco


def get_task(name: str) -> Callable[[Any], Any]:
    try:
        return _TASKS[name]
    except KeyError:
        raise LookupFailure(f"no learning task named {name!r}; valid: {', '.join(sorted(_TASKS)) or '(none)'}") \
            from None


ARM_NAME = {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,63}$"}


@kind
class Learning(Kind):
    name = "learning"
    description = ("A paired run (method arm and GRPO control from the same seeded weights and stream) on a declared "
                   "budget where the toy task is clearly learnable: the supervisor measures each arm's validation "
                   "accuracy before and after training (its initial weights as the shared sampler kept them, its "
                   "final weights as it holds them; validation prompts and sampling stream drawn from the run seed, "
                   "the same for both arms and both ends) and reports per arm the mean per-prompt gain and its "
                   "paired 95% lower bound, and the method's lag behind the control with its upper bound. An arm "
                   "whose gradient is negated or frozen learns nothing.")
    parameters = {
        "run": RUN,
        "run_params": {"type": "object", "description": "the run's settings at the learnable budget"},
        "task": {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{0,63}$",
                 "description": "registered validation task (engine.kinds.learning.learning_task)"},
        "task_params": {"type": "object", "description": "what the task's factory reads"},
        "method_arm": ARM_NAME,
        "control_arm": ARM_NAME,
        "validation": {"type": "object", "additionalProperties": False,
                       "required": ["prompts", "samples", "max_new_tokens"],
                       "properties": {"prompts": {"type": "integer", "minimum": 8, "maximum": 4096},
                                      "samples": {"type": "integer", "minimum": 1, "maximum": 64},
                                      "max_new_tokens": {"type": "integer", "minimum": 1, "maximum": 512}}},
    }
    required = ["run", "run_params", "task", "method_arm", "control_arm", "validation"]
    metrics = {"arms": "arms of the two named whose initial and final weights were measured",
               "initial_differ": "|method - control| accuracy of the initial weights (the same weights: 0)",
               "method_initial": "the method arm's validation accuracy before training",
               "method_final": "the method arm's validation accuracy after training",
               "method_gain": "mean per-prompt (final - initial) accuracy of the method arm",
               "method_gain_low": "lower bound of the method arm's paired 95% gain interval",
               "control_initial": "the control's validation accuracy before training",
               "control_final": "the control's validation accuracy after training",
               "control_gain": "mean per-prompt (final - initial) accuracy of the control",
               "control_gain_low": "lower bound of the control's paired 95% gain interval",
               "lag": "mean per-prompt (control - method) final accuracy",
               "lag_high": "upper bound of the paired 95% lag interval",
               "method_updates": "the method arm's optimiser updates", "control_updates": "the control's",
               "method_arm_interface_calls": "calls of the checked implementation's functions in the method arm",
               "control_arm_interface_calls": "calls of the checked implementation's functions in the control arm "
               "(the control is the project's GRPO: 0)",
               "cases": "1 (the run)"}

    def measure(self, impl, ctx, params):
        import torch

        from engine.gate.stats import paired_t_interval
        from engine.kinds import calls
        from engine.kinds.paired_control import _counting, _fresh, get_run
        from engine.run.run_audit import _hookless_copy

        run_ctx = _fresh(ctx, params=dict(params["run_params"]))
        run_ctx.__dict__["paired_keep_first"] = True
        # nothing here reads the run's own step records or reports: a run may skip measuring itself (every update's
        # gradient is still audited)
        run_ctx.__dict__["paired_outcome_only"] = True
        # each interface call counted into the arm making it: an arm swap (the control trained by the method's
        # loss, the method arm by the control's) learns as well as the honest run, and shows only here
        get_run(params["run"])(_counting(impl, run_ctx) if hasattr(impl, "replace") else impl, run_ctx)
        if getattr(ctx, "audit", None) is not None and getattr(run_ctx, "audit", None) is not ctx.audit:
            ctx.audit.delegated += len(getattr(run_ctx.audit, "entries", ()) or ())
        record = run_ctx.__dict__.get("paired_record")
        arms = record.arms if record is not None else {}
        task = get_task(params["task"])(dict(params.get("task_params") or {}))
        val = params["validation"]
        prompts = task.prompts(int(val["prompts"]), ctx.generator(PROMPTS_OFFSET))
        samples = int(val["samples"])

        def per_prompt(policy) -> list[float]:
            acc, tokens = task.accuracy(policy, prompts, samples, int(val["max_new_tokens"]),
                                        ctx.generator(STREAM_OFFSET))
            ctx.meter.add_tokens(tokens)
            return [float(a) for a in acc]

        acc: dict[str, tuple[list[float], list[float]]] = {}
        for name in (params["method_arm"], params["control_arm"]):
            entry = arms.get(name)
            if entry is None or entry.policy is None or entry.first_state is None:
                continue
            initial = _hookless_copy(entry.policy, next(entry.policy.parameters()).dtype)
            initial.load_state_dict(entry.first_state)
            with torch.no_grad():
                acc[name] = (per_prompt(initial), per_prompt(entry.policy))

        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs)

        m: dict[str, float] = {"arms": len(acc)}
        where: dict[str, str] = {}
        for role, name in (("method", params["method_arm"]), ("control", params["control_arm"])):
            m[f"{role}_updates"] = arms[name].updates if name in arms else 0
            m[f"{role}_arm_interface_calls"] = arms[name].interface_calls if name in arms else 0
            if name not in acc:
                for key in ("initial", "final", "gain", "gain_low"):
                    m[f"{role}_{key}"] = float("nan")
                continue
            before, after = acc[name]
            gain = paired_t_interval([a - b for a, b in zip(after, before)])
            m.update({f"{role}_initial": mean(before), f"{role}_final": mean(after),
                      f"{role}_gain": gain["mean_diff"], f"{role}_gain_low": gain["low"]})
            where[f"{role}_gain_low"] = (f"arm {name}: accuracy {mean(before):.3f} -> {mean(after):.3f} over "
                                         f"{len(before)} prompts x {samples} samples")
        if len(acc) == 2:
            (mb, ma), (cb, ca) = acc[params["method_arm"]], acc[params["control_arm"]]
            lag = paired_t_interval([c - a for c, a in zip(ca, ma)])
            m.update({"initial_differ": abs(mean(mb) - mean(cb)), "lag": lag["mean_diff"],
                      "lag_high": lag["high"]})
            where["lag_high"] = f"final accuracy: {params['method_arm']} {mean(ma):.3f}, " \
                                f"{params['control_arm']} {mean(ca):.3f}"
        else:
            m.update({"initial_differ": float("nan"), "lag": float("nan"), "lag_high": float("nan")})
        calls.log_case(ctx, 0, {}, m, where)
        return {**m, "cases": 1}
