"""MRTPO input checks: every documented refusal is made, with the documented exception, and every input at the
edge of what is allowed is accepted and answered correctly.

Each case is a call; a refusal case passes when the call raises exactly the expected exception type, an
acceptance case when it returns and its answer holds. The measurements count the cases that did not.
"""

from __future__ import annotations

import torch

from engine.spec import registry
from methods.mrtpo.cases import credit_batch, response_mask
from methods.mrtpo.measure import maxabs
from methods.mrtpo.reference import gdpo_uniform_ref, js_distance_ref

# Check code: calls the method with bad and edge inputs and judges the answers; implements nothing.
__mutate__ = False  # `contracts mutate` does not plant bugs here

# The message text these checks read, per check and function: each is declared in the spec's interface
# (raises: message_prefix), and tests/test_interface.py holds every spec to that.
MESSAGE_READS = {"mrtpo.input_checks": {
    "js_distance": ["js_distance: "], "beta_schedule": ["beta_schedule: "], "credit_weights": ["credit_weights: "],
    "credit_weights_from_logits": ["credit_weights_from_logits: "], "mrtpo_advantages": ["mrtpo_advantages: "]}}


def _refused(call, expected: type, names: tuple) -> tuple[bool, str]:
    """(the call raised `expected` with the function's own one-line message ("name: ..."), not an error of
    something it went on to do; what happened instead when it did not)."""
    try:
        call()
    except expected as exc:
        ok = str(exc).startswith(tuple(f"{n}: " for n in names)) and "\n" not in str(exc)
        return ok, "" if ok else f"raised {expected.__name__} without the prefix {names[0]!r}: {_short(exc)}"
    except Exception as exc:  # noqa: BLE001 - the wrong exception is a miss, recorded in its case with its message
        return False, f"raised {type(exc).__name__}, not {expected.__name__}: {_short(exc)}"
    return False, "returned without raising"


def _accepted(call, judge) -> tuple[bool, str]:
    try:
        out = call()
    except Exception as exc:  # noqa: BLE001 - a refusal of a valid input is a miss, recorded in its case
        return False, f"raised {type(exc).__name__}: {_short(exc)}"
    return (True, "") if bool(judge(out)) else (False, "returned a wrong answer")


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return repr(text if len(text) <= 120 else text[:117] + "...")


def _logp(g, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64).log_softmax(-1)


def _js_cases(impl, g, dev, dt):
    a, b = _logp(g, 3, 5).to(dev, dt), _logp(g, 3, 5).to(dev, dt)
    ref = torch.tensor([js_distance_ref(x, y) for x, y in zip(a.double().tolist(), b.double().tolist())],
                       dtype=torch.float64)
    js = impl.js_distance
    refusals = [
        (lambda: js(a, b[:, :4]), ValueError),  # shapes differ
        (lambda: js(a[0, 0], b[0, 0]), ValueError),  # no vocabulary axis
        (lambda: js(a[:, :0], b[:, :0]), ValueError),  # an empty vocabulary
        (lambda: js(a.long(), b.long()), TypeError),  # not floating point
        (lambda: js(a, b.long()), TypeError),  # one of them not floating point
        (lambda: js(a.clone().requires_grad_(True), b), ValueError),  # the replay is frozen
        (lambda: js(a, b.clone().requires_grad_(True)), ValueError),
        (lambda: js(a, b, chunk_elems=0), ValueError),  # a block of no elements
    ]
    if dev.type == "cuda":
        refusals.append((lambda: js(a, b.cpu()), ValueError))

    def js_no_grad():
        with torch.no_grad():
            return js(a.clone().requires_grad_(True), b)

    near = lambda out, want: maxabs(out.double().cpu() - want) <= 1e-6  # noqa: E731
    acceptances = [
        (lambda: js(a[0], b[0]), lambda q: tuple(q.shape) == () and near(q, ref[0])),  # one row, 1-D
        (lambda: js(a[:, :1].log_softmax(-1), b[:, :1].log_softmax(-1)),  # V = 1: one certain token
         lambda q: tuple(q.shape) == (3,) and maxabs(q) == 0),
        (lambda: js(a[:0], b[:0]), lambda q: tuple(q.shape) == (0,)),  # no rows
        (lambda: js(a[None, :0], b[None, :0]), lambda q: tuple(q.shape) == (1, 0)),
        (js_no_grad, lambda q: near(q, ref)),  # under no_grad a grad-requiring input is only data
        (lambda: js(a, b, chunk_elems=1), lambda q: near(q, ref)),  # one element a block
        (lambda: js(a.double(), b.float()), lambda q: q.dtype == torch.float64 and near(q, ref)),  # promoted
        # mixed half/float32: each input upcast on its own, the same numbers as both in float32
        (lambda: js(a.bfloat16(), b.float()),
         lambda q: maxabs(q.double() - js(a.bfloat16().float(), b.float()).double()) == 0),
        (lambda: js(a.float(), b.bfloat16()),
         lambda q: maxabs(q.double() - js(a.float(), b.bfloat16().float()).double()) == 0),
    ]
    return refusals, acceptances


def _schedule_cases(impl):
    bs = impl.beta_schedule
    refusals = [(lambda: bs(1, 2, -0.1), ValueError), (lambda: bs(1, 2, 1.1), ValueError)]
    acceptances = [(lambda: bs(2, 2, 0.0), lambda v: v == 0.0), (lambda: bs(2, 2, 1.0), lambda v: v == 1.0)]
    return refusals, acceptances


def _weights_cases(impl, g, dev, dt, fn_name: str):
    """Refusals and acceptances shared by credit_weights (log-probs) and credit_weights_from_logits (logits)."""
    K, B, T, V = 2, 3, 4, 6
    la, ll = credit_batch(g, K, B, T, V)
    mask = response_mask(g, B, T, allow_empty=False)
    a, l, m = la.to(dev, dt), ll.to(dev, dt), mask.to(dev)
    fn = getattr(impl, fn_name)
    base = fn(a, l, m, 0.5)
    refusals = [
        (lambda: fn(a, l, m, -0.1), ValueError),
        (lambda: fn(a, l, m, 1.1), ValueError),
        (lambda: fn(a[0], l, m, 0.5), ValueError),  # [T, V], not [B, T, V]
        (lambda: fn(a, l, m[:, :-1], 0.5), ValueError),
        (lambda: fn(a, [], m, 0.5), ValueError),  # no reward
        (lambda: fn(a, [l[0], l[1][:, :-1]], m, 0.5), ValueError),
        (lambda: fn(a, l, m, 0.5, empty_block=torch.zeros(K + 1, dtype=torch.bool, device=dev)), ValueError),
        (lambda: fn(a, l, m, 0.5, empty_block=torch.zeros(K, B + 1, dtype=torch.bool, device=dev)), ValueError),
        (lambda: fn(a, l, m, 0.5, empty_block=torch.zeros(K + 1, B, dtype=torch.bool, device=dev)), ValueError),
        (lambda: fn(a, l, m, 0.5, empty_block=torch.zeros(K, B, 1, dtype=torch.bool, device=dev)), ValueError),
    ]
    same = lambda w: maxabs(w.double() - base.double()) == 0  # noqa: E731
    ones = lambda w: maxabs((w.double() - 1.0)[:, m]) == 0  # noqa: E731
    acceptances = [
        (lambda: fn(a, l, m, 0.0), ones),  # the ends of [0, 1]
        (lambda: fn(a, l, m, 1.0), lambda w: tuple(w.shape) == (K, B, T) and bool(torch.isfinite(w).all())),
        (lambda: fn(a, l[:1], m, 0.5), lambda w: maxabs(w.double() - base[:1].double()) == 0),  # K = 1
        (lambda: fn(a, l, m, 0.5, empty_block=torch.zeros(K, dtype=torch.bool, device=dev)), same),
        (lambda: fn(a, l, m, 0.5, empty_block=torch.zeros(K, 1, dtype=torch.bool, device=dev)), same),
        (lambda: fn(a, l, m, 0.5, empty_block=torch.ones(K, B, dtype=torch.bool, device=dev)), ones),
    ]
    return refusals, acceptances


def _advantage_cases(impl, g, dev, dt, eps):
    K, B, T = 2, 3, 4
    mask = response_mask(g, B, T, allow_empty=False)
    w = torch.ones(K, B, T, dtype=torch.float64).to(dev, dt)
    radv = torch.randn(K, B, generator=g, dtype=torch.float64).to(dev, dt)
    m = mask.to(dev)
    fn = impl.mrtpo_advantages
    refusals = [
        (lambda: fn(radv[0], w, m, eps), ValueError),
        (lambda: fn(radv, w[0], m, eps), ValueError),
        (lambda: fn(radv, torch.cat([w, w[:1]]), m, eps), ValueError),  # K + 1 weights for K rewards
        (lambda: fn(radv, w[:, :-1], m, eps), ValueError),  # B - 1 responses of weights
        (lambda: fn(radv, w, m[:, :-1], eps), ValueError),
    ]
    ref = torch.tensor(gdpo_uniform_ref(radv.double().cpu().tolist(), mask.tolist(), eps), dtype=torch.float64)

    def no_tokens(out):  # nothing to normalise: A = 0, std = 0, s = 1
        A, met = out
        return maxabs(A) == 0 and met["std"] == 0 and met["s"] == 1 and met["tokens"] == 0 and not met["capped"]

    def zero(out):  # every advantage 0: no credit to share, s = 1, A = 0
        A, met = out
        return maxabs(A) == 0 and met["s"] == 1 and met["second_moment_D"] == 0

    acceptances = [
        (lambda: fn(radv, w, torch.zeros_like(m), eps), no_tokens),
        (lambda: fn(torch.zeros_like(radv), w, m, eps), zero),
        # the default eps is the declared 1e-6
        (lambda: fn(radv, w, m), lambda out: maxabs(out[0].double().cpu() - ref) <= 1e-6 * max(1.0, maxabs(ref))),
    ]
    return refusals, acceptances


@registry.check("mrtpo.input_checks")
def input_checks(impl, ctx):
    """Bad inputs are refused with the documented exception (ValueError, TypeError for non-float log-probs) and
    the function's own one-line message;
    inputs at the edge of what is allowed (one row, V = 1, no rows, beta or beta_max at 0 and 1, K = 1, every
    form of empty_block, no valid token, all-zero advantages, the default eps, mixed dtypes) are answered."""
    g = ctx.generator(901)
    dev, dt = ctx.device, ctx.dtype
    eps = float(ctx.params.get("eps", 1e-6))
    refusals, acceptances = [], []
    # the empty_block checks are credit_weights' own, shared by credit_weights_from_logits
    for names, (r, a) in ((("js_distance",), _js_cases(impl, g, dev, dt)),
                          (("beta_schedule",), _schedule_cases(impl)),
                          (("credit_weights",), _weights_cases(impl, g, dev, dt, "credit_weights")),
                          (("credit_weights_from_logits", "credit_weights"),
                           _weights_cases(impl, g, dev, dt, "credit_weights_from_logits")),
                          (("mrtpo_advantages",), _advantage_cases(impl, g, dev, dt, eps))):
        refusals += [(call, exc, names, f"{names[0]} refusal {i}") for i, (call, exc) in enumerate(r)]
        acceptances += [(call, judge, f"{names[0]} edge input {i}") for i, (call, judge) in enumerate(a)]
    # each miss is a case of its own: which function, which of its cases, and what happened instead
    missed_refusals, missed_acceptances = [], []
    for i, (call, exc, names, label) in enumerate(refusals):
        ok, what = _refused(call, exc, names)
        if not ok:
            missed_refusals.append(i)
            ctx.case_log.append({"seed": ctx.seed, "case": i, "metrics": {"refusals_missed": 1},
                                 "argument": f"{label}: {what}"})
    for i, (call, judge, label) in enumerate(acceptances):
        ok, what = _accepted(call, judge)
        if not ok:
            missed_acceptances.append(i)
            ctx.case_log.append({"seed": ctx.seed, "case": i, "metrics": {"acceptances_missed": 1},
                                 "argument": f"{label}: {what}"})
    return {
        "refusals_missed": len(missed_refusals),
        "acceptances_missed": len(missed_acceptances),
        "refusal_cases": len(refusals),
        "acceptance_cases": len(acceptances),
        "first_missed_refusal": missed_refusals[0] if missed_refusals else -1,
        "first_missed_acceptance": missed_acceptances[0] if missed_acceptances else -1,
    }

