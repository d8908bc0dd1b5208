"""aggregation_weights, the kind the framework-zoo specs share: it holds on each declared weighting and fails on a
planted one (a per-response mean where the paper weighs tokens, a token mean over padding, empty rows counted, a
detached ratio), naming the weighting the code has through length_exponent. closed_form's long_args too."""

from __future__ import annotations

import math

import torch

from engine.kinds import get_kind
from engine.run.context import CheckContext
from engine.spec import registry

INPUTS = {"dims": {"B": [3, 6], "L": [4, 20]},
          "tensors": {"logp": {"shape": ["B", "L"], "dist": "uniform", "low": -3.0, "high": -0.01},
                      "old_logp": {"shape": ["B", "L"], "dist": "normal", "std": 0.4, "around": "logp"},
                      "adv": {"shape": ["B"], "dist": "normal"},
                      "mask": {"shape": ["B", "L"], "layout": "response", "prompt_max": 3, "hole_prob": 0.3}}}


def _terms(logp, old, adv, mask):
    m = mask.to(torch.bool)
    r = torch.where(m, logp - old.detach(), torch.zeros_like(logp)).exp()
    return torch.where(m, -r * adv[:, None], torch.zeros_like(logp)), m


def token_mean(logp, old, adv, mask):
    f, m = _terms(logp, old, adv, mask)
    return f.sum() / m.sum()


def sequence_mean(logp, old, adv, mask):
    f, m = _terms(logp, old, adv, mask)
    n = m.sum(-1)
    has = n > 0
    return (f.sum(-1)[has] / n[has]).sum() / has.sum()


def constant(logp, old, adv, mask, norm_length=None):
    f, m = _terms(logp, old, adv, mask)
    c = m.shape[-1] if norm_length is None else norm_length
    return f.sum() / ((m.sum(-1) > 0).sum() * c)


def run(fn, scheme, inputs=INPUTS, **extra):
    params = {"function": "f", "args": ["logp", "old_logp", "adv", "mask"], "scheme": scheme, "mask": "mask",
              "set": {"adv": 1.0}, "tie": {"old_logp": "logp"}, "inputs": inputs, **extra}
    c = CheckContext(device=torch.device("cpu"), dtype=torch.float64, seed=42, cases=6, params=params)
    return get_kind("aggregation_weights").measure(registry.Implementation("toy", f=fn), c, params)


def test_each_declared_weighting_holds_on_its_loss():
    for fn, scheme in ((token_mean, "token_mean"), (sequence_mean, "sequence_mean")):
        got = run(fn, scheme)
        assert got["weight_max_rel_err"] < 1e-12 and got["masked_weight_max_abs"] == 0.0
        assert got["length_exponent_err"] < 1e-9 and got["nonfinite"] == 0 and got["cases"] == 6
    inputs = {**INPUTS, "tensors": {"norm_length": {"cycle": [{"from_dim": "L", "plus": 5}, {"none": True}]},
                                    **INPUTS["tensors"]}}
    got = run(constant, "constant", inputs, kwargs={"norm_length": "norm_length"}, norm_length="norm_length")
    assert got["weight_max_rel_err"] < 1e-12


def test_a_planted_weighting_fails_and_its_exponent_names_it():
    bad = run(sequence_mean, "token_mean")  # GRPO's per-response mean where DAPO weighs tokens
    assert bad["weight_max_rel_err"] > 0.1
    assert math.isclose(bad["length_exponent"], -1.0, abs_tol=1e-9)
    assert run(token_mean, "sequence_mean")["weight_max_rel_err"] > 0.1
    padded = run(lambda lp, o, a, m: _terms(lp, o, a, m)[0].mean(), "token_mean")  # mean over B x L slots
    assert padded["weight_max_rel_err"] > 0.1
    detached = run(lambda lp, o, a, m: token_mean(lp.detach(), o, a, m), "token_mean")
    assert detached["weight_max_rel_err"] == 1.0 and detached["length_exponent_err"] == math.inf


def test_empty_rows_count_in_g_only_when_declared():
    inputs = {**INPUTS, "tensors": {**INPUTS["tensors"], "mask": {**INPUTS["tensors"]["mask"], "empty_rows": 1}}}
    assert run(sequence_mean, "sequence_mean", inputs)["weight_max_rel_err"] < 1e-12
    assert run(sequence_mean, "sequence_mean", inputs, rows="all")["weight_max_rel_err"] > 0.1


def test_masked_slots_that_move_the_loss_are_counted():
    def leaks(lp, o, a, m):
        return token_mean(lp, o, a, m) + 1e-3 * torch.where(m.to(torch.bool), 0.0, lp).sum()

    assert run(leaks, "token_mean")["masked_weight_max_abs"] > 0


def test_closed_form_passes_long_args_as_integer_tensors():
    from methods.dapo.loss import overlong_penalty

    params = {"function": "overlong_penalty", "examples": [
        {"args": [[0, 48, 56, 64, 65], 64, 16], "long_args": [0], "expected": [0.0, 0.0, -0.5, -1.0, -1.0]}]}
    c = CheckContext(device=torch.device("cpu"), dtype=torch.float64, seed=42, cases=1, params=params)
    impl = registry.Implementation("toy", overlong_penalty=overlong_penalty)
    assert get_kind("closed_form").measure(impl, c, params)["max_abs_err"] == 0.0
