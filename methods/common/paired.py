"""How a mechanism run pairs its method arm with its GRPO control, and the record the paired_control kind reads.

Every mechanism run builds each arm's policy with `arm_policy`, takes each arm's sampling stream from `stream`
and runs each arm inside `arm(ctx, name)`. Inside an arm the shared sampler (methods/common/rollout.sample) logs
every draw from the arm's stream: a hash of the uniforms it consumed and of the tokens it sampled, and, at the
arm's first draw, a hash of the sampling policy's weights and the optimiser steps taken before it. Optimiser
steps are counted by a post-step hook for the arm's duration. The record is what happened, taken in one place,
so a run cannot pair its arms wrongly without the record showing it.

`Pairing` holds the run's pairing decisions. The method's code never changes them; a mutant plants a defect
through them (`plant`), so the engine's mutant machinery can show that the paired_control kind kills it.
"""

from __future__ import annotations

import contextvars
import hashlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from engine.kinds.paired_control import StopRun

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("paired_arm", default=None)


@dataclass(frozen=True)
class Pairing:
    """The pairing decisions of a mechanism run; the defaults are the correct ones."""

    control_fresh: bool = True  # the control builds its policy from the seed, as the method arm did
    control_stream_shift: int = 0  # added to the control's stream offset (0: the method arm's stream)
    seeded_stream: bool = True  # the stream is seeded from the run seed (False: one stream for every seed)
    # The control's own configuration, as the project's control code reads it (methods/common/grpo.py and the runs
    # that train a control inline); a planted slip changes one of these, never the method's code.
    control_clip_eps: float | None = None  # None: the clip the run's params give
    control_adv_whole_batch: bool = False  # True: the control's advantages over the whole batch, not per group
    control_zero_grad: bool = False  # True: the control's gradients zeroed after its backward (it never moves)
    # What reaches an arm's optimiser step ("negated": the gradient's sign flipped; "frozen": no gradient, so the
    # step moves nothing): planted after the gradient audit, so only what the arm learns can show it.
    method_grad: str = "as computed"
    control_grad: str = "as computed"
    arms_swapped: bool = False  # True: a learning run trains each arm with the other arm's loss


def pairing(impl: Any) -> Pairing:
    return getattr(impl, "pairing", None) or Pairing()


def plant(impl: Any, name: str, **defect: Any) -> Any:
    """A copy of `impl` named `name` whose mechanism runs pair their arms with `defect` (a mutant)."""
    mutated = impl.replace(name)
    object.__setattr__(mutated, "pairing", Pairing(**defect))
    return mutated


def digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:32]


def weights_digest(policy: torch.nn.Module) -> str:
    named = sorted([*policy.named_parameters(), *policy.named_buffers()], key=lambda kv: kv[0])
    h = hashlib.sha256()
    for name, t in named:
        h.update(name.encode())
        h.update(digest(t).encode())
    return h.hexdigest()[:32]


@dataclass
class ArmRecord:
    """One arm of one run: what its first draw sampled from, every draw from its stream, its optimiser steps."""

    control: bool
    stream: torch.Generator | None = None
    policy: torch.nn.Module | None = None  # the last policy that drew from the stream
    initial_weights: str | None = None
    updates_before_first_draw: int | None = None
    draws: list = field(default_factory=list)  # (uniforms digest, tokens digest)
    updates: int = 0
    interface_calls: int = 0  # calls of the checked implementation's functions made inside this arm
    pairing: Pairing | None = None  # the run's pairing decisions, as `stream` saw them for this arm
    # The arm audit's record (engine/kinds/arm_audit.py): per optimiser step, the L2 change of the parameters it
    # stepped and its optimiser's name and learning rate; per update, what its loss was computed from
    # (`record_update`); per draw, the sampling policy's weights (kept only when the record asks for them).
    changes: list = field(default_factory=list)
    optimisers: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    states: dict = field(default_factory=dict)  # tokens digest -> the sampling policy's state at that draw
    first_state: dict | None = None

    def rescore(self, c: "Claim") -> torch.Tensor | None:
        """The claim's declared scoring by a float64 copy of this arm's policy in its sampling-time state."""
        return rescore(self, c)

    def plain(self) -> dict:
        return {"initial_weights": self.initial_weights, "updates_before_first_draw": self.updates_before_first_draw,
                "draws": [list(d) for d in self.draws], "updates": self.updates,
                "interface_calls": self.interface_calls}


@dataclass
class RunRecord:
    arms: dict = field(default_factory=dict)
    stop_after_draws: int | None = None  # a probe: StopRun once an arm has drawn this often
    keep_states: bool = False  # keep each draw's sampling weights (the arm audit rescores from them)
    keep_first: bool = False  # keep each arm's first sampling weights (the learning kind measures from them)
    active: ArmRecord | None = None  # the arm running now (the paired_control kind counts interface calls into it)

    def plain(self) -> dict:
        return {name: a.plain() for name, a in self.arms.items()}


def record_of(ctx: Any) -> RunRecord:
    """The run's arm record, kept on its context (the paired_control kind reads it after the run)."""
    rec = ctx.__dict__.get("paired_record")
    if rec is None:
        rec = RunRecord(stop_after_draws=ctx.__dict__.get("paired_stop_after_draws"),
                        keep_states=bool(ctx.__dict__.get("paired_keep_states")),
                        keep_first=bool(ctx.__dict__.get("paired_keep_first")))
        ctx.__dict__["paired_record"] = rec
    return rec


@contextmanager
def arm(ctx: Any, name: str, control: bool = False):
    """Run one arm under the record: its draws from its stream and its optimiser steps are logged."""
    rec = record_of(ctx)
    entry = ArmRecord(control=control)
    rec.arms[name] = entry

    before: dict = {}

    def stepping(opt, _args, _kwargs):
        planted = entry.pairing or Pairing()
        defect = planted.control_grad if control else planted.method_grad
        for g in opt.param_groups:
            for p in g["params"]:
                if p.grad is not None and defect == "negated":
                    p.grad.neg_()
                elif defect == "frozen":
                    p.grad = None
        before.clear()
        before.update({id(p): p.detach().clone() for g in opt.param_groups for p in g["params"]})

    def stepped(opt, _args, _kwargs):
        entry.updates += 1
        sq = 0.0
        for g in opt.param_groups:
            for p in g["params"]:
                b = before.get(id(p))
                if b is not None:
                    sq += float((p.detach().double() - b.double()).pow(2).sum())
        entry.changes.append(sq ** 0.5)
        entry.optimisers.append((type(opt).__name__, float(opt.param_groups[0].get("lr", float("nan")))))

    handles = [register_optimizer_step_pre_hook(stepping), register_optimizer_step_post_hook(stepped)]
    token = _ACTIVE.set((rec, entry))
    rec.active = entry
    try:
        yield entry
    finally:
        rec.active = None
        _ACTIVE.reset(token)
        for h in handles:
            h.remove()


def arms(ctx: Any, names: tuple[str, ...], method: str):
    """`for name in arms(ctx, ("tapo", "grpo-control"), method="tapo")`: each loop body runs inside its arm."""
    for name in names:
        with arm(ctx, name, control=name != method):
            yield name


def _active() -> tuple[RunRecord, ArmRecord] | tuple[None, None]:
    return _ACTIVE.get() or (None, None)


def arm_policy(impl: Any, build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """The policy the current arm starts from: `build()` (seeded from the run), for the control too."""
    rec, entry = _active()
    if entry is not None and entry.control and not pairing(impl).control_fresh:
        trained = [a.policy for a in rec.arms.values() if not a.control and a.policy is not None]
        if trained:
            return trained[-1]
    return build()


def stream(ctx: Any, impl: Any, offset: int) -> torch.Generator:
    """The current arm's sampling stream: `ctx.generator(offset)`, the same for both arms of a run."""
    p = pairing(impl)
    _, entry = _active()
    if entry is not None and entry.control:
        offset += p.control_stream_shift
    g = ctx.generator(offset) if p.seeded_stream else torch.Generator(device="cpu").manual_seed(offset)
    if entry is not None:
        entry.stream = g
        entry.pairing = p
    return g


def drawing(generator: torch.Generator) -> ArmRecord | None:
    """The arm record to log a draw from `generator` into: the active arm's, when it is that arm's stream."""
    _, entry = _active()
    return entry if entry is not None and entry.stream is generator else None


def log_draw(entry: ArmRecord, policy: torch.nn.Module, uniforms: list[torch.Tensor], responses: torch.Tensor,
             mask: torch.Tensor) -> None:
    rec, _ = _active()
    tokens = digest(responses, mask)
    if entry.initial_weights is None:
        entry.initial_weights = weights_digest(policy)
        entry.updates_before_first_draw = entry.updates
    if rec is not None and rec.keep_states:
        entry.states[tokens] = _state(policy)
        if entry.first_state is None:
            entry.first_state = entry.states[tokens]
    elif rec is not None and rec.keep_first and entry.first_state is None:
        entry.first_state = _state(policy)
    entry.policy = policy
    entry.draws.append((digest(torch.cat(uniforms, 1)) if uniforms else "", tokens))
    if rec is not None and rec.stop_after_draws is not None and len(entry.draws) >= rec.stop_after_draws:
        raise StopRun


def _state(policy: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def planted() -> Pairing:
    """The pairing decisions of the arm running now (the defaults outside a run): the control code reads its
    configuration's planted slips here."""
    _, entry = _active()
    return (entry.pairing if entry is not None else None) or Pairing()


@dataclass
class Claim:
    """Something a run computed about the policy and uses: `used` is the declared scoring (log-probs of
    `responses` after `context`; `full`: the whole log-distributions) by the policy as it was when it sampled
    the draw `drawn` (a tokens digest; None: the arm's first draw, i.e. its initial weights). The arm audit
    rescores it from the sampling-time weights the record kept, never from the run's own copy."""

    name: str
    used: torch.Tensor
    context: torch.Tensor
    responses: torch.Tensor
    mask: torch.Tensor
    full: bool = False
    drawn: str | None = None


def claim(name: str, used: torch.Tensor, context: torch.Tensor, responses: torch.Tensor, mask: torch.Tensor, *,
          full: bool = False, sampled: tuple[torch.Tensor, torch.Tensor] | None = None) -> Claim:
    """A Claim; `sampled` = (responses, mask) of the draw whose policy the claim is about (None: the initial)."""
    return Claim(name, used.detach(), context.detach(), responses.detach(), mask.detach(), full,
                 None if sampled is None else digest(*sampled))


def record_update(loss: torch.Tensor, inputs: dict, claims: list | None = None) -> None:
    """The active arm's next optimiser update: the tensors its loss was computed from (by the names its arm's
    reference takes) and the loss, for the arm audit to recompute; `claims`: what the run computed about the
    policy for this update (the behaviour log-probs of its rollout are one, added here when `inputs` hold
    old_logp, prompts, responses and mask)."""
    rec, entry = _active()
    if entry is None:
        return
    plain = {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    out = list(claims or [])
    if all(k in plain for k in ("old_logp", "prompts", "responses", "mask")):
        out.insert(0, claim("old_logp", plain["old_logp"], plain["prompts"], plain["responses"], plain["mask"],
                            sampled=(plain["responses"], plain["mask"])))
    entry.losses.append({"loss": float(loss.detach()), "inputs": plain, "claims": out,
                         "step": entry.updates})


def rescore(entry: ArmRecord, c: Claim) -> torch.Tensor | None:
    """The claim's declared scoring by a float64 copy of the arm's policy in its sampling-time state (None: the
    record kept no state for that draw)."""
    from engine.run.run_audit import _hookless_copy
    from methods.common.audited import declared_logprobs

    state = entry.first_state if c.drawn is None else entry.states.get(c.drawn)
    if state is None or entry.policy is None:
        return None
    module = _hookless_copy(entry.policy, torch.float64)
    module.load_state_dict(state)
    with torch.no_grad():
        return declared_logprobs(module, c.context.to(state_device(state)), c.responses.to(state_device(state)),
                                 full=c.full)


def state_device(state: dict) -> torch.device:
    return next(iter(state.values())).device


DEFECTS = {
    "control_trained_weights": ({"control_fresh": False},
                                "The control arm starts from the method arm's trained weights, not the seeded ones."),
    "control_other_stream": ({"control_stream_shift": 1},
                             "The control arm samples from another random stream than the method arm."),
    "same_stream_every_seed": ({"seeded_stream": False},
                               "Every seed draws the same sampling stream (the stream ignores the run seed)."),
    "control_clip_narrow": ({"control_clip_eps": 0.1},
                            "The control's ratio clipped at 0.1 instead of its declared 0.2."),
    "control_adv_whole_batch": ({"control_adv_whole_batch": True},
                                "The control's advantages normalised over the whole batch instead of per group."),
    "control_never_moves": ({"control_zero_grad": True},
                            "The control's gradients zeroed after its backward: it takes its updates and never moves."),
    "method_grad_negated": ({"method_grad": "negated"},
                            "The method arm's gradient reaches its optimiser with the sign flipped: it unlearns."),
    "method_grad_frozen": ({"method_grad": "frozen"},
                           "The method arm's gradient never reaches its optimiser: it takes its steps and stays."),
    "control_grad_negated": ({"control_grad": "negated"},
                             "The control's gradient reaches its optimiser with the sign flipped: it unlearns."),
    "arms_swapped": ({"arms_swapped": True},
                     "Each arm of the learning run is trained with the other arm's loss: both learn, the comparison "
                     "is upside down."),
}


def defect(impl: Any, name: str) -> Callable[[], Any]:
    """The mutant factory of `name` = METHOD.DEFECT (one of DEFECTS), planted through `Pairing` in `impl`'s runs;
    register it with a literal name (`registry.mutant("tapo.control_other_stream", base="tapo")(defect(...))`)
    so `contracts validate` finds it without importing anything."""
    fields, doc = DEFECTS[name.rsplit(".", 1)[1]]

    def factory():
        return plant(impl, name, **fields)

    factory.__doc__ = doc
    return factory
