"""paired_control: a mechanism run's control arm is paired with its method arm (same start, stream and budget)."""

from __future__ import annotations

from typing import Any, Callable

from engine.errors import LookupFailure
from engine.kinds.base import NAME, Kind, kind

# Runs that execute a method's arms under the arm record (methods/common/paired.py), by name.
_RUNS: dict[str, Callable[[Any, Any], Any]] = {}


class StopRun(Exception):
    """Raised inside a run once a probe has the draws it asked for: the rest of the run is not needed."""


def paired_run(name: str) -> Callable[[Callable[[Any, Any], Any]], Callable[[Any, Any], Any]]:
    """Register `run(impl, ctx)`: one seed of a mechanism run, each arm inside methods.common.paired.arm."""

    def deco(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        if name in _RUNS:
            raise ValueError(f"paired run {name!r} is registered twice")
        _RUNS[name] = fn
        return fn

    return deco


def get_run(name: str) -> Callable[[Any, Any], Any]:
    try:
        return _RUNS[name]
    except KeyError:
        raise LookupFailure(f"no paired run named {name!r}; valid: {', '.join(sorted(_RUNS)) or '(none)'}") from None


def _fresh(ctx: Any, **changes: Any) -> Any:
    import dataclasses

    run = dataclasses.replace(ctx, steps=[], comparisons=[], case_log=[], **changes)
    run.__dict__.pop("paired_record", None)
    return run


def _counting(impl: Any, run_ctx: Any) -> Any:
    """`impl` with each of its interface functions counted into the arm running when it is called: the method
    arm must call the implementation under check and the control arm must not (an arm swap, where the control
    runs the method and the method arm the control, pairs perfectly on every other count)."""
    def wrap(fn: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            entry = getattr(run_ctx.__dict__.get("paired_record"), "active", None)
            if entry is not None:
                entry.interface_calls += 1
            return fn(*args, **kwargs)
        return call

    # a stand-in for a function the implementation lacks stays as it is: the run asks it `provides(...)`
    names = [n for n in getattr(impl, "functions", ()) if callable(getattr(impl, n, None))
             and getattr(getattr(impl, n), "not_provided", None) is None]
    counted = impl.replace(impl.name, **{n: wrap(getattr(impl, n)) for n in names})
    for key, value in vars(impl).items():  # what the run reads besides the functions (a planted pairing defect)
        if key not in names and not key.startswith("_"):
            object.__setattr__(counted, key, value)
    return counted


@kind
class PairedControl(Kind):
    name = "paired_control"
    description = ("A mechanism run's control arm against its method arm, from the run's own record: the first "
                   "draw of each arm samples from bit-identical weights with no update before it; each draw "
                   "consumes the same uniforms from the same stream, draw by draw; both arms take the same number "
                   "of optimiser updates; another seed draws other uniforms.")
    parameters = {
        "run": {"type": "string", "pattern": "^[a-z][a-z0-9_.-]{0,63}$",
                "description": "registered paired run (engine.kinds.paired_control.paired_run)"},
        "method_arm": NAME | {"pattern": "^[a-z][a-z0-9_-]{0,63}$"},
        "control_arm": {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,63}$"},
        "run_params": {"type": "object", "description": "the params the run reads (its settings)"},
        "other_seed": {"type": "integer", "minimum": 1, "description": "offset of the seed probed for "
                       "another stream (default 1); the probe stops after its first draw"},
    }
    required = ["run", "method_arm", "control_arm"]
    metrics = {"arms": "arms of the two named that drew at least once",
               "initial_weights_differ": "1 when the arms' first draws sampled from different weights",
               "updates_before_first_draw": "optimiser steps an arm took before its first draw (largest)",
               "first_draw_tokens_differ": "1 when the arms' first draws sampled different tokens",
               "stream_draws_differ": "draws (of those both arms made) whose uniforms differ",
               "draws_compared": "draws both arms made", "updates_differ": "|method updates - control updates|",
               "method_updates": "the method arm's optimiser updates",
               "other_seed_same_stream": "1 when another seed's first draw consumed the same uniforms",
               "method_arm_interface_calls": "calls of the checked implementation's functions in the method arm",
               "control_arm_interface_calls": "calls of the checked implementation's functions in the control arm "
               "(the control is the project's GRPO: 0)"}

    def measure(self, impl, ctx, params):
        from engine.kinds import calls

        run = get_run(params["run"])
        m_name, c_name = params["method_arm"], params["control_arm"]
        main = _fresh(ctx, params=dict(params.get("run_params") or {}))
        run(_counting(impl, main), main)
        arms = main.__dict__["paired_record"].plain() if "paired_record" in main.__dict__ else {}
        empty = {"initial_weights": None, "updates_before_first_draw": None, "draws": [], "updates": 0,
                 "interface_calls": 0}
        a, b = arms.get(m_name, empty), arms.get(c_name, empty)
        n = min(len(a["draws"]), len(b["draws"]))
        differ = [i for i in range(n) if a["draws"][i][0] != b["draws"][i][0]]

        probe = _fresh(ctx, params=dict(params.get("run_params") or {}),
                       seed=ctx.seed + int(params.get("other_seed", 1)))
        probe.__dict__["paired_stop_after_draws"] = 1
        try:
            run(impl, probe)
        except StopRun:
            pass
        other = probe.__dict__["paired_record"].plain() if "paired_record" in probe.__dict__ else {}
        other_first = (other.get(m_name, empty)["draws"] or [[None]])[0][0]

        m = {"arms": sum(bool(x["draws"]) for x in (a, b)),
             "initial_weights_differ": int(a["initial_weights"] is None or a["initial_weights"] != b["initial_weights"]),
             "updates_before_first_draw": max(x["updates_before_first_draw"] or 0 for x in (a, b)),
             "first_draw_tokens_differ": int(n == 0 or a["draws"][0][1] != b["draws"][0][1]),
             "stream_draws_differ": len(differ), "draws_compared": n,
             "updates_differ": abs(a["updates"] - b["updates"]), "method_updates": a["updates"],
             "other_seed_same_stream": int(other_first is None or (n > 0 and other_first == a["draws"][0][0])),
             "method_arm_interface_calls": a.get("interface_calls", 0),
             "control_arm_interface_calls": b.get("interface_calls", 0)}
        where = {"stream_draws_differ": f"draw {differ[0]}" if differ else None,
                 "other_seed_same_stream": f"seed {probe.seed}"}
        calls.log_case(ctx, 0, {}, m, where)
        return {**m, "cases": 1}
