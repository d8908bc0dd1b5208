"""TAPO's bespoke contracts: each check calls the method only through `impl` and returns measurements.

The contracts a generic kind states (reference agreement, gradient structure, masked junk, split/merge, precision,
refusal of zero advantages) are measured by engine/kinds from the spec; what stays here has a `why:` in the spec.

Inputs are drawn in float64 on the CPU from `ctx.generator`, cast to the dtype
under test and moved to the device; references are computed in float64 by the
plain loops of `reference.py` from the *cast* inputs, so an error figure measures
the implementation's arithmetic, not the rounding of its inputs.
"""

from __future__ import annotations

import math

import torch

from engine.spec import registry
from engine.kinds.inputs import response_mask
from methods.tapo import reference as ref

# The message text these checks read, per check and function: each is declared in the spec's interface
# (raises: message_contains), and tests/test_interface.py holds every spec to that.
MESSAGE_READS = {"tapo.input_validation": {"tapo_loss": ["mask"]}}

# --- inputs ---------------------------------------------------------------


def _draw(g: torch.Generator, B: int, L: int, delta_scale: float = 0.3, **layout):
    """float64 CPU logp, old_logp (old = logp + noise) and a mask; masked slots hold random finite values."""
    logp = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3.0 - 0.01
    old = logp + delta_scale * torch.randn(B, L, generator=g, dtype=torch.float64)
    mask = response_mask(g, B, L, **layout)
    return logp, old, mask


def _dims(g: torch.Generator, max_len: int, max_batch: int) -> tuple[int, int]:
    B = int(torch.randint(1, max_batch + 1, (1,), generator=g))
    L = int(torch.randint(2, max_len + 1, (1,), generator=g))
    return B, L


def _dev(ctx, x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fresh leaf on the device (never an alias of `x`, so requires_grad_ cannot leak between inputs)."""
    if x.dtype == torch.bool:
        return x.detach().to(ctx.device).clone()
    return x.detach().to(dtype or ctx.dtype).to(ctx.device).clone()


def _nan_to_inf(x: float) -> float:
    return math.inf if math.isnan(x) else x


def lacks(impl, function: str) -> str | None:
    """Why `impl` has no `function` (an adapted framework loss has no separate ratio or schedule), or None when it
    has it. A check measuring several functions skips, and declares not applicable, what needs a missing one."""
    if registry.provides(impl, function):
        return None
    return f"no {function}: {getattr(getattr(impl, function, None), 'not_provided', None) or 'not in the implementation'}"


# --- contracts ------------------------------------------------------------


CLIP_HORIZONS = (1, 2, 3, 4, 5, 8, 17, 64, 257, 1024, 4096)


@registry.check("tapo.clip_schedule")
def clip_schedule(impl, ctx) -> dict:
    """eps_t against the float64 loop formula for several T: eps_1 = eps_max, eps_T = eps_min,
    non-increasing in t, inside [eps_min, eps_max], length T, and T = 1 gives [eps_max]."""
    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    lo = torch.tensor(eps_min, dtype=ctx.dtype).item()
    hi = torch.tensor(eps_max, dtype=ctx.dtype).item()
    first = last = max_abs = 0.0
    t1_err = math.inf
    violations = out_of_range = length_mismatch = 0
    for T in CLIP_HORIZONS:
        eps = impl.length_aware_clip(T, eps_min, eps_max, dtype=ctx.dtype, device=ctx.device)
        got = eps.detach().to("cpu", torch.float64).flatten().tolist()
        if len(got) != T:
            length_mismatch += 1
            continue
        want = ref.clip_eps(T, eps_min, eps_max)
        max_abs = max(max_abs, max(_nan_to_inf(abs(a - b)) for a, b in zip(got, want)))
        first = max(first, _nan_to_inf(abs(got[0] - eps_max)))
        if T > 1:  # T = 1 has one entry, eps_max (its own measurement, t1_err)
            last = max(last, _nan_to_inf(abs(got[-1] - eps_min)))
        violations += sum(1 for a, b in zip(got, got[1:]) if not b <= a)
        out_of_range += sum(1 for a in got if not lo <= a <= hi)
        if T == 1:
            t1_err = _nan_to_inf(abs(got[0] - eps_max))
    return {
        "max_abs_err": max_abs,
        "first_err": first,
        "last_err": last,
        "t1_err": t1_err,
        "monotone_violations": violations,
        "out_of_range": out_of_range,
        "length_mismatches": length_mismatch,
        "cases": len(CLIP_HORIZONS),
    }


def _refused(fn, *args, **kwargs) -> tuple[bool, str]:
    """(refused with a ValueError, its message); an accepted call or any other exception is not a refusal."""
    try:
        out = fn(*args, **kwargs)
        if hasattr(out, "__next__"):  # a generator refuses when it is first advanced
            next(out)
    except ValueError as e:
        return True, str(e)
    except Exception:  # noqa: BLE001 - a TypeError or an IndexError is not the documented refusal
        return False, ""
    return False, ""


def _accepted(fn, *args, **kwargs) -> bool:
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - any exception on a valid input is a wrong refusal
        return False
    return True


@registry.check("tapo.input_validation")
def input_validation(impl, ctx) -> dict:
    """Each refusal the interface documents (ValueError), and the valid inputs just inside each boundary."""
    from methods.common.policy import TinyGRUPolicy
    from methods.common.rollout import sample

    eps_min = float(ctx.params.get("eps_min", 0.1))
    eps_max = float(ctx.params.get("eps_max", 0.2))
    g = ctx.generator(11)
    B, L = 4, 7
    logp, old, mask = _draw(g, B, L, delta_scale=0.5)
    lp, op, m = _dev(ctx, logp), _dev(ctx, old), _dev(ctx, mask)
    adv = _dev(ctx, torch.randn(B, generator=g, dtype=torch.float64))
    longest = int(mask.sum(dim=1).max())

    def loss(*, logp_=lp, old_=op, adv_=adv, mask_=m, lo=eps_min, hi=eps_max, **kw):
        return impl.tapo_loss(logp_, old_, adv_, mask_, lo, hi, **kw)

    no_clip = lacks(impl, "length_aware_clip")  # an adapted framework loss has no separate schedule
    if no_clip:
        ctx.not_applicable(no_clip, "clip_T_refused")
    # length_aware_clip: T must be an integer >= 1 (a bool is not one)
    clip_T_refused = bool(no_clip) or all(_refused(impl.length_aware_clip, T, eps_min, eps_max)[0]
                                    for T in (0, -1, True, 2.0))
    # 0 <= eps_min <= eps_max; both edges are valid (a fixed clip, or none at the end of a response)
    eps_refused = all(_refused(loss, lo=lo, hi=hi)[0] for lo, hi in ((-0.05, eps_max), (eps_max, eps_min)))
    eps_edges_accepted = (_accepted(loss, lo=0.0, hi=eps_max) and _accepted(loss, lo=eps_max, hi=eps_max)
                          and (bool(no_clip) or (_accepted(impl.length_aware_clip, 5, 0.0, eps_max)
                                           and _accepted(impl.length_aware_clip, 5, eps_max, eps_max))))
    # a 0/1 mask of another dtype is the bool mask: the same loss, gradient and token count
    mask_forms_agree = True
    ref_out = None
    for form in (m, m.to(ctx.dtype), m.to(torch.int64)):
        x = lp.clone().requires_grad_(True)
        try:
            value, met = impl.tapo_loss(x, op, adv, form, eps_min, eps_max)
            (grad,) = torch.autograd.grad(value, x)
        except Exception:  # noqa: BLE001 - the interface accepts a 0/1 mask
            mask_forms_agree = False
            break
        out = (float(value.detach()), grad.detach().to("cpu", torch.float64), int(met["tokens"]))
        if ref_out is None:
            ref_out = out
        elif not (out[0] == ref_out[0] and torch.equal(out[1], ref_out[1]) and out[2] == ref_out[2]):
            mask_forms_agree = False
    # horizon: an integer >= 1 (refused on one-token responses too, which no length check would) and at least
    # the longest response
    one_token = torch.zeros(B, L, dtype=torch.bool)
    one_token[:, 1] = True
    m1 = _dev(ctx, one_token)
    horizon_refused = (all(_refused(loss, horizon=h)[0] for h in (0, -1, longest - 1))
                       and all(_refused(loss, mask_=m1, horizon=h)[0] for h in (True, 2.5, 0)))
    horizon_edges_accepted = _accepted(loss, horizon=longest) and _accepted(loss, mask_=m1, horizon=1)
    # group_size: an integer >= 1 that divides the batch
    groups_refused = all(_refused(loss, group_size=s)[0] for s in (0, -1, 3))
    groups_edges_accepted = _accepted(loss, group_size=1) and _accepted(loss, group_size=B)
    # nothing to optimise: a mask with no response token, or no slot at all; the error names the mask
    empty = []
    for e_lp, e_op, e_m in ((lp, op, torch.zeros_like(m)),
                            (lp[:, :0], op[:, :0], m[:, :0])):
        refused, msg = _refused(loss, logp_=e_lp, old_=e_op, mask_=e_m)
        empty.append(refused and "mask" in msg.lower())
    empty_refused_names_mask = all(empty)
    # a NaN or inf advantage at a response token ([B] or [B, L]) is refused; huge finite ones are not
    first = int(mask[0].nonzero()[0])
    bad = []
    for v in (math.nan, math.inf, -math.inf):
        a_row = adv.clone()
        a_row[0] = v
        a_tok = adv[:, None].expand(B, L).clone()
        a_tok[0, first] = v
        bad += [_refused(loss, adv_=a_row)[0], _refused(loss, adv_=a_tok)[0]]
    nonfinite_adv_refused = all(bad)
    big = torch.finfo(ctx.dtype).max / 2  # finite, and any three of them sum to inf
    huge = torch.full((B, L), big, dtype=ctx.dtype, device=ctx.device)
    large_adv_accepted = _accepted(loss, adv_=torch.where(m, huge, -huge))
    # proximal_logprobs: inner_updates an integer >= 1; one update yields exactly one step
    policy = TinyGRUPolicy.seeded(ctx.seed, ctx.device)
    prompts = torch.randint(2, 16, (2, 3), generator=g).to(ctx.device)
    ro = sample(policy, prompts, 4, ctx.generator(12))
    proximal_refused = all(_refused(impl.proximal_logprobs, policy, ro, n)[0] for n in (0, -1, True, 1.5))
    try:
        steps = list(impl.proximal_logprobs(policy, ro, 1))
        proximal_one_update = (len(steps) == 1 and steps[0][0] == 0
                               and torch.equal(steps[0][2], ro.old_logp))
    except Exception:  # noqa: BLE001 - one update is valid
        proximal_one_update = False
    return {
        **({} if no_clip else {"clip_T_refused": clip_T_refused}),
        "eps_refused": eps_refused,
        "eps_edges_accepted": eps_edges_accepted,
        "mask_forms_agree": mask_forms_agree,
        "horizon_refused": horizon_refused,
        "horizon_edges_accepted": horizon_edges_accepted,
        "groups_refused": groups_refused,
        "groups_edges_accepted": groups_edges_accepted,
        "empty_refused_names_mask": empty_refused_names_mask,
        "nonfinite_adv_refused": nonfinite_adv_refused,
        "large_adv_accepted": large_adv_accepted,
        "proximal_refused": proximal_refused,
        "proximal_one_update": proximal_one_update,
    }
