"""Each generic kind holds on a correct toy function and fails on a planted bug; inputs are reproducible per case."""

from __future__ import annotations

import math

import pytest
import torch

from engine.kinds import get_kind, kind_names
from engine.kinds import inputs as inputs_mod
from engine.errors import LookupFailure
from engine.run.context import CheckContext
from engine.run.runner import failing_cases
from engine.spec import registry

INPUTS = {"dims": {"B": [1, 4], "L": [2, 9]},
          "tensors": {"x": {"shape": ["B", "L"], "dist": "normal"},
                      "y": {"shape": ["B", "L"], "dist": "normal", "std": 0.3, "around": "x"},
                      "adv": {"shape": ["B"], "dist": "signed", "low": 0.5, "high": 2.0},
                      "mask": {"shape": ["B", "L"], "layout": "response", "prompt_max": 2, "hole_prob": 0.2}}}


def _masked_double(x, y, mask):
    return torch.where(mask, 2 * x, torch.zeros_like(x))


def _ref_double(x, y, mask):
    return torch.where(mask, 2 * x, torch.full_like(x, float("nan")))


if "test_kinds.double" not in registry._REGISTRY.references:
    registry.reference("test_kinds.double")(_ref_double)
    registry.reference("test_kinds.two")(lambda x, y, mask: torch.where(mask, torch.full_like(x, 2.0),
                                                                        torch.full_like(x, float("nan"))))


def _loss(x, y, adv, mask):
    m = mask.to(x.dtype)
    n = int(mask.sum())
    return (torch.where(mask, x * adv[:, None], torch.zeros_like(x))).sum() / n, {"tokens": n}


def ctx(dtype=torch.float64, cases=6, params=None, only=None) -> CheckContext:
    return CheckContext(device=torch.device("cpu"), dtype=dtype, seed=42, cases=cases, params=params or {},
                        only_case=only)


def measure(name, impl_fns, params, **kw):
    impl = registry.Implementation("toy", **impl_fns)
    c = ctx(params=params, **kw)
    return get_kind(name).measure(impl, c, params), c


def test_at_least_ten_kinds_and_lookup_lists_names():
    assert len(kind_names()) >= 10
    with pytest.raises(LookupFailure, match="valid kinds: .*reference_agreement"):
        get_kind("refrence_agreement")


def test_inputs_reproducible_per_case():
    a, da = inputs_mod.draw(INPUTS, 42, 3)
    b, db = inputs_mod.draw(INPUTS, 42, 3)
    c, _ = inputs_mod.draw(INPUTS, 42, 4)
    assert da == db and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(a[k].shape == c[k].shape and torch.equal(a[k], c[k]) for k in a)
    assert a["mask"].any(dim=1).all()  # every row keeps a valid token


CALL = {"function": "f", "args": ["x", "y", "mask"], "inputs": INPUTS}


def test_reference_agreement_good_and_planted_bug():
    good, _ = measure("reference_agreement", {"f": _masked_double}, {**CALL, "reference": "test_kinds.double"})
    assert good["max_abs_err"] == 0.0 and good["cases"] == 6
    bad, c = measure("reference_agreement", {"f": lambda x, y, m: _masked_double(x, y, m) + 1e-3 * m},
                     {**CALL, "reference": "test_kinds.double"})
    assert bad["max_abs_err"] > 1e-4
    cases = failing_cases(c.case_log, [{"metric": "max_abs_err", "op": "le", "threshold": 1e-12}], "float64")
    assert cases and {"seed", "case", "shapes", "where"} <= set(cases[0]) and cases[0]["seed"] == 42


def test_reference_agreement_compares_reported_scalars():
    """A reference dict's `scalars` are compared with the numbers the call reports (its dict output): a call that
    reports a wrong token count fails."""
    if "test_kinds.double_scalars" not in registry._REGISTRY.references:
        registry.reference("test_kinds.double_scalars")(
            lambda x, y, mask: {"value": _ref_double(x, y, mask), "scalars": {"tokens": int(mask.sum())}})
    p = {**CALL, "reference": "test_kinds.double_scalars", "output": 0, "metrics_output": 1}

    def good(x, y, mask):
        return _masked_double(x, y, mask), {"tokens": int(mask.sum())}

    def bad(x, y, mask):  # the planted bug: padding counted
        return _masked_double(x, y, mask), {"tokens": mask.numel()}

    assert measure("reference_agreement", {"f": good}, p)[0]["tokens_abs_err"] == 0
    assert measure("reference_agreement", {"f": bad}, p)[0]["tokens_abs_err"] > 0


def test_only_case_runs_one_case():
    out, c = measure("reference_agreement", {"f": _masked_double}, {**CALL, "reference": "test_kinds.double"}, only=2)
    assert out["cases"] == 1 and [e["case"] for e in c.case_log] == [2]


def test_masked_junk_good_and_planted_bug():
    p = {**CALL, "mask": "mask", "junk_args": ["x", "y"], "grad_wrt": ["x"], "pad_columns": 2}
    good, _ = measure("masked_junk", {"f": _masked_double}, p)
    assert good["value_max_abs_diff"] == 0 and good["grad_max_abs_diff"] == 0 and good["nonfinite"] == 0
    bad, _ = measure("masked_junk", {"f": lambda x, y, m: 2 * x * m}, p)  # NaN * 0 leaks
    assert bad["nonfinite"] > 0 or bad["value_max_abs_diff"] > 0


def test_gradient_structure_good_and_planted_bug():
    p = {**CALL, "wrt": "x", "structure": "diagonal", "mask": "mask", "diagonal_reference": "test_kinds.two"}
    good, _ = measure("gradient_structure", {"f": _masked_double}, p)
    assert good["offdiag_max_abs"] == 0 and good["masked_grad_max_abs"] == 0 and good["diag_max_rel_err"] == 0
    bad, _ = measure("gradient_structure", {"f": lambda x, y, m: torch.where(m, 2 * x.cumsum(-1), 0 * x)}, p)
    assert bad["offdiag_max_abs"] > 0


LOSS = {"function": "loss", "args": ["x", "y", "adv", "mask"], "inputs": INPUTS}


def test_vanishing_good_and_planted_bug():
    p = {**LOSS, "set": {"adv": 0.0}, "grad_wrt": ["x"]}
    good, _ = measure("vanishing", {"loss": _loss}, p)
    assert good["value_max_abs"] == 0 and good["grad_max_abs"] == 0 and good["control_nonzero"] == good["cases"]
    bad, _ = measure("vanishing", {"loss": lambda x, y, a, m: _loss(x, y, a + 1e-3, m)}, p)
    assert bad["grad_max_abs"] > 0


def test_split_merge_good_and_planted_bug():
    p = {**LOSS, "split": "rows", "weight": "tokens", "grad_wrt": ["x"], "permute": True,
         "inputs": {**INPUTS, "dims": {"B": [2, 6], "L": [2, 9]}}}
    good, _ = measure("split_merge", {"loss": _loss}, p)
    assert good["value_rel_diff"] < 1e-12 and good["grad_max_rel_diff"] < 1e-12
    assert good["permuted_grad_max_rel_diff"] < 1e-12
    bad, _ = measure("split_merge", {"loss": lambda x, y, a, m: (_loss(x, y, a, m)[0], {"tokens": 1})}, p)
    assert bad["value_rel_diff"] > 1e-6 or bad["grad_max_rel_diff"] > 1e-6


def test_precision_good_and_planted_bug():
    p = {**CALL, "grad_wrt": ["x"], "result_dtype": {"float32": "same"}}
    impl = registry.Implementation("toy", f=_masked_double)
    good = get_kind("precision").measure(impl, ctx(torch.float32, params=p), p)
    assert good["max_rel_err"] == 0 and good["dtype_mismatches"] == 0
    # the planted bug: below float64 the arithmetic runs in float16
    bad_impl = registry.Implementation("toy", f=lambda x, y, m: _masked_double(
        x if x.dtype == torch.float64 else x.half().to(x.dtype), y, m))
    bad = get_kind("precision").measure(bad_impl, ctx(torch.float32, params=p), p)
    assert bad["max_rel_err"] > 1e-5


def test_conservation_and_identity_good_and_planted_bug():
    pos = {**INPUTS, "tensors": {**INPUTS["tensors"], "x": {"shape": ["B", "L"], "dist": "uniform", "low": 0.5,
                                                             "high": 2.0}}}

    def weights(x, y, mask):
        m = mask.to(x.dtype)
        return x * m / ((x * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1))

    p = {"function": "w", "args": ["x", "y", "mask"], "inputs": pos, "reduce": "mean", "mask": "mask", "equals": 1.0}
    assert measure("conservation", {"w": weights}, p)[0]["max_abs_err"] < 1e-12
    assert measure("conservation", {"w": lambda x, y, m: x}, p)[0]["max_abs_err"] > 1e-3
    q = {"function": "r", "args": ["x", "y", "mask"], "inputs": INPUTS, "tie": {"y": "x"}, "equals_value": 1.0,
         "mask": "mask"}
    assert measure("identity", {"r": lambda x, y, m: torch.exp(x - y)}, q)[0]["value_max_abs_diff"] == 0
    assert measure("identity", {"r": lambda x, y, m: torch.exp(x - 0.9 * y)}, q)[0]["value_max_abs_diff"] > 0


def _checked(x, y, mask):
    if not torch.isfinite(x[mask]).all():
        raise ValueError("x must be finite at valid slots")
    return x


def test_refusal_good_and_planted_bug():
    p = {**CALL, "mask": "mask", "refuse": [{"arg": "x", "fill": "nan", "at": "first_valid", "match": "finite"}],
         "accept": [{"arg": "x", "fill": 1.0e30}]}
    good, _ = measure("refusal", {"f": _checked}, p)
    assert good == {"refused": 1, "not_refused": 0, "accepted": 1, "wrongly_refused": 0, "accepted_differs": 0,
                    "cases": 2}
    bad, c = measure("refusal", {"f": lambda x, y, m: x}, p)
    assert bad["not_refused"] == 1 and "refuse" in c.case_log[0]["argument"]


def test_a_refusal_that_failed_names_what_was_raised_or_returned_instead():
    """Not a bare count: each failing row says what it got: returned, another exception type, or the declared
    one without the declared word, with the message."""
    p = {**CALL, "mask": "mask", "refuse": [{"arg": "x", "fill": "nan", "at": "first_valid", "match": "finite"}]}

    def wrong_type(x, y, m):
        raise TypeError("x is bad")

    def wrong_words(x, y, m):
        raise ValueError("x is bad")

    for fn, says in ((lambda x, y, m: x, "(accepted: returned without raising)"),
                     (wrong_type, "(raised TypeError, not ValueError: 'x is bad')"),
                     (wrong_words, "(raised ValueError without 'finite': 'x is bad')")):
        out, c = measure("refusal", {"f": fn}, p)
        assert out["not_refused"] == 1 and c.case_log[0]["argument"].endswith(says), c.case_log[0]["argument"]


def test_a_refusal_rows_word_counts_wherever_in_its_mutations_it_is_written():
    """`[{cast}, {fill, match}]`: the match on the second mutation is read, not dropped."""
    p = {**CALL, "mask": "mask", "refuse": [[{"arg": "x", "cast": "float"},
                                             {"arg": "x", "fill": "nan", "at": "first_valid", "match": "mask"}]]}
    out, c = measure("refusal", {"f": _checked}, p)  # says "finite", not "mask"
    assert out["not_refused"] == 1 and "without 'mask'" in c.case_log[0]["argument"]


def test_a_refusal_row_the_implementation_cannot_take_is_unmeasured_not_missed():
    """A framework loss that cannot take a row (an argument it has no knob for raises NotProvided) leaves that
    table unmeasured (the contract partial or not applicable), never counted as a missed refusal."""
    p = {**CALL, "mask": "mask", "refuse": [{"arg": "x", "fill": "nan", "at": "first_valid", "match": "finite"}],
         "accept": [{"arg": "x", "fill": 1.0e30}]}

    def no_knob(x, y, m):
        if not torch.isfinite(x).all():
            raise registry.NotProvided("f", "no such knob here")
        return x

    out, c = measure("refusal", {"f": no_knob}, p)
    assert "not_refused" not in out and "refused" not in out and out["wrongly_refused"] == 0
    assert c.not_measured["not_refused"] == "the implementation provides no f: no such knob here"


def test_a_refusal_row_of_a_missing_function_leaves_the_total_unmeasured_and_the_misses_measured():
    """An adapter without one of the table's functions (TAPO's verl loss has no separate clip schedule): its rows
    are skipped, the total `refused` is no longer judged (a short count says nothing), and a miss among the other
    rows is still measured (in part), so a planted bug there still fails the contract."""
    p = {**TABLE, "refuse": [{"arg": "k", "value": 0}, {"call": "half", "arg": "x", "cast": "long",
                                                        "raises": "TypeError"}]}
    no_g = registry.Implementation("toy", f=_guarded)
    c = ctx(params=p, cases=1)
    out = get_kind("refusal").measure(no_g, c, p)
    assert "refused" not in out and out["not_refused"] == 0 and "provides no g" in c.not_measured["not_refused"]
    unchecked = registry.Implementation("toy", f=lambda x, y, mask, k=2: (x, {}))
    c = ctx(params=p, cases=1)
    assert get_kind("refusal").measure(unchecked, c, p)["not_refused"] == 1


def test_a_call_the_implementation_lacks_is_recorded_as_skipped():
    """masked_junk over two calls on an implementation with one: the metric it still measures is fed by one call
    only, so the kind says which call it skipped (the runner then makes the contract partial)."""
    p = {"calls": [{"function": "f", "args": ["x", "y", "mask"]}, {"function": "g", "args": ["x", "y", "mask"]}],
         "inputs": INPUTS, "mask": "mask", "junk_args": ["x", "y"]}
    out, c = measure("masked_junk", {"f": _masked_double}, p)
    assert out["value_max_abs_diff"] == 0 and c.skipped_calls == {"g": "no g in the implementation"}
    assert c.not_measured["value_max_abs_diff"] == "no g in the implementation"


def test_refusal_same_accepts_a_float_mask_only_with_the_same_result():
    p = {**CALL, "accept": [{"arg": "mask", "cast": "float", "same": True}]}
    good, _ = measure("refusal", {"f": lambda x, y, m: _masked_double(x, y, m.bool())}, p)
    assert good["accepted"] == 1 and good["accepted_differs"] == 0
    def upside_down(x, y, m):  # a bool mask read right, a 0/1 float mask upside down
        return _masked_double(x, y, m if m.dtype == torch.bool else m == 0)

    bad, c = measure("refusal", {"f": upside_down}, p)
    assert bad["accepted_differs"] == 1 and "accepted with another result" in c.case_log[0]["argument"]


# --- refusal: the parameters that state the input checks of TAPO, MRTPO and TAR ---------------------------------

FIXED = {"tensors": {"x": {"values": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]},
                     "y": {"values": [[0.5, 0.5, 0.5], [2.0, 2.0, 2.0]]},
                     "mask": {"values": [[1, 1, 0], [0, 1, 1]], "dtype": "bool"},
                     "wide": {"shape": [2, 4], "dist": "normal"}}}


def _guarded(x, y, mask, k=2):
    """A toy with the guards the refusal rows probe: shapes, dtype class, k an int >= 1, no grad."""
    if not x.is_floating_point():
        raise TypeError("f: x must be floating point")
    if x.shape != mask.shape or x.dim() != 2:
        raise ValueError(f"f: x {tuple(x.shape)} and mask {tuple(mask.shape)} differ")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"f: k must be an integer >= 1, got {k!r}")
    if x.requires_grad and torch.is_grad_enabled():
        raise ValueError("f: x requires grad")
    return torch.where(mask.bool(), k * x, torch.zeros_like(x)), {"tokens": int(mask.bool().sum())}


def _half(x):
    if not x.is_floating_point():
        raise TypeError("g: x must be floating point")
    return x / 2


TABLE = {"function": "f", "args": ["x", "y", "mask"], "inputs": FIXED, "mask": "mask", "output": 0,
         "message_prefix": "f: ", "calls": {"half": {"function": "g", "args": ["x"], "message_prefix": "g: "}}}


def test_refusal_rows_transform_arguments_and_call_other_functions():
    """index, cast, requires_grad, a keyword literal, another declared call: each row its own named case."""
    p = {**TABLE,
         "refuse": [{"arg": "x", "index": ":, :-1", "note": "x one column short"},
                    {"arg": "x", "cast": "long", "raises": "TypeError"},
                    {"arg": "x", "requires_grad": True},
                    {"arg": "k", "value": True},
                    {"arg": "x", "from": "wide"},
                    {"call": "half", "arg": "x", "cast": "int32", "raises": "TypeError"}],
         "accept": [{"arg": "x", "requires_grad": True, "no_grad": True}, {"arg": "k", "value": 1}]}
    good, _ = measure("refusal", {"f": _guarded, "g": _half}, p, cases=1)
    assert good["refused"] == 6 and good["not_refused"] == 0 and good["accepted"] == 2

    def unguarded(x, y, mask, k=2):  # planted bug: no shape or k check
        return torch.where(mask.bool()[..., : x.shape[-1]], k * x.float(), x.float() * 0), {"tokens": 0}

    bad, c = measure("refusal", {"f": unguarded, "g": lambda x: x / 2}, p, cases=1)
    failed = [e["argument"] for e in c.case_log if e["metrics"].get("not_refused")]
    assert bad["not_refused"] == 6, failed
    assert failed[0] == "refuse: f: x one column short (accepted: returned without raising)"
    assert failed[-1].startswith("refuse: g: arg=x, cast=int32") and "returned without raising" in failed[-1]


def test_refusal_positional_argument_and_message_prefix():
    """arg: "1" mutates a positional literal; a refusal without the call's one-line prefix is not the declared one."""
    def clip(t, lo):
        if lo < 0:
            raise ValueError(f"clip: lo must be >= 0, got {lo}")
        return t

    p = {"function": "clip", "args": ["x", {"value": 0.1}], "inputs": FIXED, "message_prefix": "clip: ",
         "refuse": [{"arg": "1", "value": -0.5}], "accept": [{"arg": "1", "value": 0.0}]}
    assert measure("refusal", {"clip": clip}, p, cases=1)[0]["refused"] == 1

    def unprefixed(t, lo):
        if lo < 0:
            raise ValueError(f"lo must be >= 0, got {lo}")
        return t

    bad, c = measure("refusal", {"clip": unprefixed}, p, cases=1)
    assert bad["not_refused"] == 1 and "without the one-line prefix 'clip: '" in c.case_log[0]["argument"]


def test_refusal_accepted_answers_are_judged_against_a_reference_another_call_and_declared_returns():
    """reference + tol, same_as, returns (path, equals, where, same at an index, shape), omit."""
    if "test_kinds.k_times" not in registry._REGISTRY.references:
        registry.reference("test_kinds.k_times")(
            lambda x, y, mask, k=2: torch.where(mask, k * x, torch.full_like(x, float("nan"))))
    p = {**TABLE, "message_prefix": None, "calls": {},
         "accept": [{"arg": "x", "fill": 1.0, "reference": "test_kinds.k_times", "tol": 1e-12},
                    {"arg": "y", "scale": 3.0, "same_as": [{"arg": "y", "scale": 1.0}]},
                    {"arg": "k", "value": 1, "returns": [{"path": [0], "equals_input": "x", "where": "mask"},
                                                        {"path": [1, "tokens"], "equals": 4},
                                                        {"path": [0], "shape": [2, 3]}]},
                    [{"arg": "x", "index": ":1", "returns": [{"path": [0], "same": ":1"}],
                      "note": "the first row alone"}, {"arg": "mask", "index": ":1"}],
                    [{"arg": "k", "omit": True, "same": True}]],
         "kwargs": {"k": {"value": 2}}}
    good, c = measure("refusal", {"f": _guarded}, {**p, "mask": "mask"}, cases=1)
    assert good["accepted"] == 5 and good["accepted_differs"] == 0, c.case_log

    def off(x, y, mask, k=3):  # planted bugs: reads y, a default k of 3, a token count off by one, per batch row
        v = torch.where(mask.bool(), k * x * y.mean() * 2 / x.shape[0], torch.zeros_like(x))
        return v, {"tokens": int(mask.sum()) + 1}

    bad, c = measure("refusal", {"f": off}, {**p, "mask": "mask"}, cases=1)
    why = [e["argument"] for e in c.case_log if e["metrics"].get("accepted_differs")]
    assert bad["accepted_differs"] == 5, why
    assert "from the reference test_kinds.k_times" in why[0] and "the call it must equal" in why[1]
    assert "result[0] is" in why[2] and "result[0] differs from the unmutated call's[:1]" in why[3]


def test_refusal_never_read_junk_and_fills_at_positions():
    """A row of junk (NaN, inf) where the mask says nothing is read must change nothing (`same`); `at: {index}`
    writes single positions, `fill: max` the dtype's largest value, a number argument becomes the fill."""
    p = {"function": "f", "args": ["x", "y", "mask"], "output": 0, "inputs": FIXED, "mask": "mask",
         "accept": [[{"arg": "x", "fill": "nan", "at": {"index": [[0, 2]]}, "same": True},
                     {"arg": "x", "fill": "inf", "at": {"index": [[1, 0]]}}],
                    {"arg": "x", "fill": "max", "masked_fill": "-max", "scale": 0.5,
                     "returns": [{"path": [0], "finite": True}]}],
         "refuse": [{"arg": "k", "fill": "nan"}]}
    good, c = measure("refusal", {"f": _guarded}, p, cases=1)
    assert good["accepted"] == 2 and good["accepted_differs"] == 0 and good["refused"] == 1, c.case_log

    def reads_junk(x, y, mask, k=2):  # planted bug: a row sum over junk slots, so NaN * 0 = NaN, inf * 0 = NaN
        if k != k:
            raise ValueError("k is NaN")
        return torch.where(mask, k * x, torch.zeros_like(x)) + 0 * x.abs().sum(-1, keepdim=True), {}

    bad, c = measure("refusal", {"f": reads_junk}, p, cases=1)
    assert bad["accepted_differs"] == 2
    why = [e["argument"] for e in c.case_log if e["metrics"].get("accepted_differs")]
    assert "another result than the unmutated call's" in why[0] and "result[0] is not finite" in why[1]


def test_refusal_items_and_match_words():
    """items builds a list argument from (indexed) inputs; every word of a `match` list must be in the message."""
    def total(parts):
        shapes = {tuple(p.shape) for p in parts}
        if len(shapes) != 1:
            raise ValueError(f"parts differ in shape: {sorted(shapes)}")
        return sum(parts)

    p = {"function": "h", "args": ["x"], "inputs": FIXED,
         "refuse": [{"arg": "x", "items": ["x", "wide[:, :3]", "y[:1]"], "match": ["parts", "shape"]}],
         "accept": [{"arg": "x", "items": ["x", "y"], "returns": [{"shape": [2, 3]}]}]}
    assert measure("refusal", {"h": total}, p, cases=1)[0]["refused"] == 1

    def vague(parts):
        if len({tuple(p.shape) for p in parts}) != 1:
            raise ValueError("bad parts")
        return sum(parts)

    bad, c = measure("refusal", {"h": vague}, p, cases=1)
    assert bad["not_refused"] == 1 and "without 'shape'" in c.case_log[0]["argument"]


def test_refusal_row_max_grad_wrt_and_returns_of_generators_and_dtypes():
    """row_max: top rescales rows near the dtype's top (a planted float32 square overflows); grad_wrt makes
    `same` compare gradients; returns len runs a generator out; returns dtype reads the result's dtype."""
    p = {"function": "f", "args": ["x", "y", "mask"], "inputs": FIXED,
         "accept": [{"arg": "x", "row_max": "top", "returns": [{"finite": True}, {"dtype": "float64"}]}]}
    norms = lambda x, y, mask: x.double().norm(dim=-1)  # noqa: E731
    squared = lambda x, y, mask: (x * x).sum(-1).sqrt().double()  # noqa: E731 - planted: squares in float32
    assert measure("refusal", {"f": norms}, p, cases=1, dtype=torch.float32)[0]["accepted_differs"] == 0
    assert measure("refusal", {"f": squared}, p, cases=1, dtype=torch.float32)[0]["accepted_differs"] == 1
    assert measure("refusal", {"f": lambda x, y, m: x.norm(dim=-1)}, p, cases=1,
                   dtype=torch.float32)[0]["accepted_differs"] == 1  # finite, but float32, not the declared float64
    g = {"function": "f", "args": ["x", "y", "mask"], "output": 0, "grad_wrt": ["x"], "inputs": FIXED,
         "accept": [{"arg": "mask", "cast": "float", "same": True}]}

    def good(x, y, m):
        return (torch.where(m.bool(), x, torch.zeros_like(x)) ** 2).sum(), {}

    def detached_for_float_masks(x, y, m):  # planted bug: the same value, no gradient, for a 0/1 float mask
        v, _ = good(x, y, m)
        return (v if m.dtype == torch.bool else v.detach() + 0 * x.sum()), {}

    assert measure("refusal", {"f": good}, g, cases=1)[0]["accepted_differs"] == 0
    bad, c = measure("refusal", {"f": detached_for_float_masks}, g, cases=1)
    assert bad["accepted_differs"] == 1 and "another gradient" in c.case_log[0]["argument"]

    def steps(x, y, mask, n=2):
        for i in range(n):
            yield i, x

    r = {"function": "f", "args": ["x", "y", "mask"], "inputs": FIXED, "kwargs": {"n": {"value": 2}},
         "accept": [{"arg": "n", "value": 1, "returns": [{"len": 1}, {"path": [0, 1], "equals_input": "x"}]}]}
    assert measure("refusal", {"f": steps}, r, cases=1)[0]["accepted_differs"] == 0
    assert measure("refusal", {"f": lambda x, y, mask, n=2: steps(x, y, mask, n + 1)}, r,
                   cases=1)[0]["accepted_differs"] == 1


def test_inputs_log_softmax_and_a_generator_beside_tensors():
    if "test_kinds.pair" not in inputs_mod._GENERATORS:
        inputs_mod.generator("test_kinds.pair")(lambda g, case, ctx, inputs: {"n": 3, "__dims__": {"V": 5}})
    drawn, dims = inputs_mod.draw({"generator": "test_kinds.pair",
                                   "tensors": {"lp": {"shape": [2, "V"], "dist": "normal", "log_softmax": True}}}, 42, 0)
    assert drawn["n"] == 3 and dims["V"] == 5 and tuple(drawn["lp"].shape) == (2, 5)
    assert torch.allclose(drawn["lp"].exp().sum(-1), torch.ones(2, dtype=torch.float64))


def test_closed_form_good_and_planted_bug():
    p = {"function": "f", "examples": [{"args": [[1.0, 2.0], [0.0, 0.0], [True, False]], "bool_args": [2],
                                        "expected": [2.0, 0.0]}]}
    assert measure("closed_form", {"f": _masked_double}, p)[0]["max_abs_err"] == 0
    assert measure("closed_form", {"f": lambda x, y, m: 2 * x}, p)[0]["max_abs_err"] == 4.0


def test_budget_measures_memory_against_the_unit_and_fails_on_a_planted_bug():
    """Peak extra memory is counted on the CPU too, against one tensor of the declared input's shape; a call that
    keeps more [B, L] temporaries (planted copies) is over the budget, a Python loop over
    rows shows as operations that grow with the rows."""
    inputs = {"tensors": {"x": {"cycle": [{"shape": [2, 64]}, {"shape": [64, 64]}]},
                          "y": {"cycle": [{"shape": [2, 64]}, {"shape": [64, 64]}]},
                          "mask": {"cycle": [{"shape": [2, 64], "layout": "full"}, {"shape": [64, 64], "layout": "full"}]}}}
    p = {"function": "f", "args": ["x", "y", "mask"], "inputs": inputs, "repeats": 1,
         "unit": {"input": "x", "dtype": "float64"}}

    def copies(x, y, mask):  # the planted bug: whole temporaries kept alive together
        a, b, c = x * 2, y * 3, x * y
        return torch.where(mask, a + b + c, torch.zeros_like(x))

    def rows(x, y, mask):  # the planted bug: one row at a time
        return torch.stack([torch.where(mask[i], 2 * x[i], 0.0) for i in range(x.shape[0])])

    good, c = measure("budget", {"f": _masked_double}, p, cases=2)
    assert good["ns_per_element"] > 0 and "peak_memory_ratio" not in c.not_measured
    assert 0 < good["peak_memory_ratio"] <= 3.0 and good["ops_growth"] == 1.0
    assert measure("budget", {"f": copies}, p, cases=2)[0]["peak_memory_ratio"] > 3.0
    assert measure("budget", {"f": rows}, p, cases=2)[0]["ops_growth"] > 10


def test_budget_max_ops_stops_a_loop_and_judges_a_reading_from_elsewhere_alike(monkeypatch):
    """With max_ops, a call past it is stopped at that operation (a loop over rows need not run to its end) and
    counted over the limit; a meter that counted the whole call elsewhere (the candidate's process) is read the
    same way, so the verdict does not depend on where the call ran."""
    from engine.kinds import budget as budget_mod
    from engine.kinds.meter import AllocationMeter

    inputs = {"tensors": {"x": {"cycle": [{"shape": [2, 8]}, {"shape": [512, 8]}]},
                          "mask": {"cycle": [{"shape": [2, 8], "layout": "full"}, {"shape": [512, 8], "layout": "full"}]}}}
    p = {"function": "f", "args": ["x", "mask"], "inputs": inputs, "repeats": 1, "max_ops": 50}
    calls_made = []

    def rows(x, mask):  # one row at a time: about 3 operations a row
        calls_made.append(x.shape[0])
        return torch.stack([torch.where(mask[i], 2 * x[i], 0.0) for i in range(x.shape[0])])

    good, c = measure("budget", {"f": lambda x, mask: torch.where(mask, 2 * x, 0.0)}, p, cases=2)
    assert good["ops_over_limit_cases"] == 0 and good["ops_growth"] == 1.0
    bad, c = measure("budget", {"f": rows}, p, cases=2)
    assert bad["ops_over_limit_cases"] == 1 and bad["ops_growth"] == 51 / c.case_log[0]["metrics"]["ops"]
    assert c.case_log[1]["metrics"]["ops"] == 51

    class Elsewhere(AllocationMeter):  # counts everything, as the call loop's meter does
        measured_in = "candidate"

        def __init__(self, max_ops=None):
            super().__init__()
            self.seconds = 0.0

    monkeypatch.setattr(budget_mod, "meter_of", lambda impl, fn, max_ops=None: Elsewhere())
    counted, c2 = measure("budget", {"f": rows}, p, cases=2)
    assert {k: counted[k] for k in ("ops_growth", "ops_over_limit_cases")} == \
        {k: bad[k] for k in ("ops_growth", "ops_over_limit_cases")}


def test_constant_inputs_reach_the_call_dense_and_equal_to_a_fill():
    """A constant input is drawn as one element expanded (no float64 fill of a page-scale tensor); the call gets a
    dense leaf with the usual strides, bit for bit the old fill's cast, in every dtype."""
    from engine.kinds import calls

    drawn, _ = inputs_mod.draw({"tensors": {"a": {"shape": [3, 5], "dist": "constant", "value": -11.918},
                                            "e": {"shape": [0, 4], "dist": "constant", "value": 1.0}}}, 42, 0)
    for dt in (torch.float64, torch.float32, torch.bfloat16, torch.float16):
        c = ctx(dtype=dt)
        a, e = calls.on_device(c, drawn["a"]), calls.on_device(c, drawn["e"])
        assert a.stride() == (5, 1) and a.dtype == dt and e.stride() == (4, 1) and e.shape == (0, 4)
        assert torch.equal(a, torch.full((3, 5), -11.918, dtype=torch.float64).to(dt))
        a.add_(1.0)  # its own storage: writable, and the draw is untouched
    assert float(drawn["a"][2, 4]) == -11.918


def test_validate_names_bad_kind_params(tmp_path):
    from pathlib import Path

    from engine.spec.loader import validate_file

    src = Path("specs/tapo-trajectory.yaml").read_text()
    bad = src.replace("      reference: tapo.prefix_ratio\n", "      referense: tapo.prefix_ratio\n", 1)
    p = tmp_path / "tapo-trajectory.yaml"
    p.write_text(bad)
    _, errors = validate_file(p, tmp_path)
    text = " ".join(e.line() for e in errors)
    assert "referense" in text and "reference" in text and "tapo-trajectory.yaml:" in text


def test_kinds_json_lists_schemas_and_users():
    import json

    from typer.testing import CliRunner

    from engine.cli import app

    r = CliRunner().invoke(app, ["kinds", "--json"])
    assert r.exit_code == 0, r.output
    kinds = {k["name"]: k for k in json.loads(r.stdout)["kinds"]}
    assert len(kinds) >= 10 and all({"name", "description", "parameters", "used_by"} <= set(k) for k in kinds.values())
    assert kinds["reference_agreement"]["parameters"]["properties"]["reference"]
    assert "tapo-trajectory/prefix_ratio_forward" in kinds["reference_agreement"]["used_by"]


# --- what the TAR port added: literal and log-spread inputs, dict outputs, supports, padding apart ------------


def test_literal_summed_scalar_and_omitted_inputs():
    spec = {"tensors": {"base": {"values": [[1.0, 2.0], [3.0, 4.0]]},
                        "off": {"shape": [2, 1], "dist": "constant", "value": 10.0},
                        "x": {"shape": [2, 2], "dist": "constant", "value": 0.5, "around": ["base", "off"]},
                        "m": {"values": [[1, 0], [0, 1]], "dtype": "bool"},
                        "z": {"shape": [400], "dist": "signed", "log": True, "low": 1e-8, "high": 1e4},
                        "lam": {"cycle": [{"omit": True}, {"scalar": 2.5}]}}}
    a, _ = inputs_mod.draw(spec, 42, 0)
    assert a["x"].tolist() == [[11.5, 12.5], [13.5, 14.5]] and a["m"].dtype == torch.bool
    mags = a["z"].abs()
    assert mags.min() >= 1e-8 and mags.max() <= 1e4 and (mags < 1e-4).any() and (mags > 1.0).any()
    assert (a["z"] < 0).any() and (a["z"] > 0).any()
    from engine.kinds import calls

    params = {"args": ["x"], "kwargs": {"lam": "lam"}}
    assert calls.bind(params, a)[1] == {}  # omitted: the function's default applies
    b, _ = inputs_mod.draw(spec, 42, 1)
    assert calls.bind(params, b)[1] == {"lam": 2.5} and isinstance(b["lam"], float)


def _picks(x, y, mask):
    return torch.nonzero(mask.any(-1)).flatten()


if "test_kinds.picks" not in registry._REGISTRY.references:
    registry.reference("test_kinds.picks")(lambda x, y, mask: {"value": _picks(x, y, mask).double(),
                                                                 "counts": {"rows": int(mask.shape[0])}})
    registry.reference("test_kinds.pair")(lambda x, y, mask: (None, {"double": _ref_double(x, y, mask)}))
    registry.reference("test_kinds.support")(lambda x, y, mask: {"support": mask & (x > 0),
                                                                   "counts": {"outside": int((mask & (x <= 0)).sum())}})


def test_reference_agreement_shapes_dtypes_bounds_and_dict_keys():
    p = {**CALL, "reference": "test_kinds.picks"}
    good, _ = measure("reference_agreement", {"f": _picks}, p)
    assert good["shape_mismatches"] == 0 and good["max_abs_err"] == 0 and good["rows"] > 0
    # one pick too many: reported as a shape mismatch (an error of inf), not a crash
    bad, _ = measure("reference_agreement", {"f": lambda x, y, m: torch.cat([_picks(x, y, m), torch.zeros(1, dtype=torch.long)])}, p)
    assert bad["shape_mismatches"] == bad["cases"] and bad["max_abs_err"] > 1e300
    q = {**CALL, "reference": "test_kinds.double", "result_dtype": {"float64": "same"}, "bounds": [-100, 100],
         "also": [{"function": "g", "args": ["x", "y", "mask"], "output": 1, "key": "double",
                   "reference": "test_kinds.pair", "prefix": "pair_"}]}
    ok = {"f": _masked_double, "g": lambda x, y, m: (None, {"double": _masked_double(x, y, m)})}
    good, _ = measure("reference_agreement", ok, q)
    assert good["dtype_mismatches"] == 0 and good["out_of_bounds"] == 0 and good["pair_max_abs_err"] == 0
    planted = {"f": lambda x, y, m: (_masked_double(x, y, m) * 1e3).float(),
               "g": lambda x, y, m: (None, {"double": _masked_double(x, y, m) + 1e-3 * m})}
    bad, _ = measure("reference_agreement", planted, q)
    assert bad["dtype_mismatches"] > 0 and bad["out_of_bounds"] > 0 and bad["pair_max_abs_err"] > 1e-4


def test_gradient_structure_support_reference_good_and_planted_bug():
    p = {**CALL, "wrt": "x", "structure": "masked_only", "mask": "mask", "support_reference": "test_kinds.support"}

    def good_fn(x, y, mask):
        return torch.where(mask & (x.detach() > 0), x, torch.zeros_like(x)).sum()

    good, _ = measure("gradient_structure", {"f": good_fn}, p)
    assert good["outside_support_max_abs"] == 0 and good["support_nonzero_fraction"] == 1 and good["outside"] > 0
    leak, _ = measure("gradient_structure", {"f": lambda x, y, m: torch.where(m, x, torch.zeros_like(x)).sum()}, p)
    assert leak["outside_support_max_abs"] > 0  # the gradient reaches masked-in slots with x <= 0
    dead, _ = measure("gradient_structure", {"f": lambda x, y, m: good_fn(x, y, m) * 0}, p)
    assert dead["support_nonzero_fraction"] < 1


def test_masked_junk_padding_apart_good_and_planted_bug():
    p = {**CALL, "output": None, "mask": "mask", "junk_args": ["x"], "grad_wrt": ["x"], "pad_columns": 3,
         "pad_apart": True, "function": "s"}

    def total(x, y, mask):
        return torch.where(mask, x, torch.zeros_like(x)).sum()

    good, _ = measure("masked_junk", {"s": total}, p)
    assert good["pad_value_rel_diff"] < 1e-14 and good["pad_grad_max_abs_diff"] == 0 and good["value_max_abs_diff"] == 0
    # planted: the sum runs over the declared width of the row, padding columns included
    bad, _ = measure("masked_junk", {"s": lambda x, y, m: total(x, y, m) + 1e-3 * x.shape[-1]}, p)
    assert bad["pad_value_rel_diff"] > 1e-6 and bad["value_max_abs_diff"] == 0


def test_precision_reports_the_gradients_absolute_error():
    p = {**CALL, "grad_wrt": ["x"]}
    bad_impl = registry.Implementation("toy", f=lambda x, y, m: _masked_double(
        x if x.dtype == torch.float64 else x.half().to(x.dtype), y, m))
    out = get_kind("precision").measure(bad_impl, ctx(torch.float32, params=p), p)
    assert "grad_max_abs_err" in out and out["max_rel_err"] > 1e-5


@pytest.mark.parametrize("columns", ["200", "80", "60"])
def test_kinds_text_fits_80_columns_whatever_the_terminal(columns, monkeypatch):
    """Each kind's description, params, metrics and users wrap at 80 columns (fewer on a narrower terminal),
    continuing indented; every kind is still listed."""
    from typer.testing import CliRunner

    from engine.cli import app
    from engine.kinds.base import all_kinds

    monkeypatch.setenv("COLUMNS", columns)
    r = CliRunner().invoke(app, ["kinds"])
    assert r.exit_code == 0, r.output
    limit = min(80, int(columns))
    lines = (r.stdout + r.stderr).splitlines()
    assert all(len(line) <= limit for line in lines), [line for line in lines if len(line) > limit]
    names = [line for line in r.stdout.splitlines() if line and not line.startswith(" ")]
    assert names == list(all_kinds())
    assert any(line.startswith("    ") for line in r.stdout.splitlines())  # a continuation, not a cut


def test_reference_agreement_keys_agree_fails_on_a_wrong_metric():
    if "test_kinds.loss_metrics" not in registry._REGISTRY.references:
        registry.reference("test_kinds.loss_metrics")(lambda x, y, adv, mask: {"tokens": float(mask.sum()),
                                                                               "undefined": float("nan")})
    if "test_kinds.loss" not in registry._REGISTRY.references:
        registry.reference("test_kinds.loss")(lambda x, y, adv, mask: _loss(x, y, adv, mask)[0])
    params = {"function": "f", "args": ["x", "y", "adv", "mask"], "inputs": INPUTS, "output": 0,
              "reference": "test_kinds.loss",
              "keys_agree": {"output": 1, "reference": "test_kinds.loss_metrics", "keys": ["tokens", "undefined"]}}
    good, _ = measure("reference_agreement", {"f": _loss}, params)
    assert good["keys_max_abs_err"] == 0.0 and good["keys_missing"] == 0

    def off_by_one(x, y, adv, mask):
        loss, met = _loss(x, y, adv, mask)
        return loss, {"tokens": met["tokens"] + 1}

    bad, c = measure("reference_agreement", {"f": off_by_one}, params)
    assert bad["keys_max_abs_err"] == 1.0 and "tokens" in c.case_log[0]["where"]["keys_max_rel_err"]
    gone, c = measure("reference_agreement", {"f": lambda *a: (_loss(*a)[0], {})}, params)
    # unmeasured, not a count: the contract is partial, never passed, and never fails for a framework's own names
    assert "keys_missing" not in gone and "keys_missing" in c.not_measured


PAIRED = {"run": "test_kinds.paired", "method_arm": "method", "control_arm": "control"}


def _paired_impl(name="ok", **defect):
    from methods.common import paired

    impl = registry.Implementation("toy", f=lambda x: x)
    return paired.plant(impl, name, **defect) if defect else impl


def _paired_run(impl, c):
    """Two arms of a tiny run: two draws and one update each, through the shared sampler and the arm record."""
    from methods.common import TinyGRUPolicy, paired, sample

    for arm in paired.arms(c, ("method", "control"), method="method"):
        policy = paired.arm_policy(impl, lambda: TinyGRUPolicy.seeded(c.seed))
        opt = torch.optim.SGD(policy.parameters(), lr=0.5)
        g = paired.stream(c, impl, 5)
        for _ in range(2):
            ro = sample(policy, torch.full((3, 2), 4), 4, g)
            logits, _, _ = policy(ro.responses)
            opt.zero_grad()
            logits.logsumexp(-1).sum().backward()
            opt.step()


@pytest.mark.parametrize("defect, metric", [(None, None),
                                            ({"control_fresh": False}, "initial_weights_differ"),
                                            ({"control_stream_shift": 1}, "stream_draws_differ"),
                                            ({"seeded_stream": False}, "other_seed_same_stream")])
def test_paired_control_good_and_each_planted_defect(defect, metric):
    from engine.kinds.paired_control import _RUNS, paired_run

    if "test_kinds.paired" not in _RUNS:
        paired_run("test_kinds.paired")(_paired_run)
    if defect is None:
        out = get_kind("paired_control").measure(_paired_impl(), ctx(params=PAIRED), PAIRED)
        assert out["arms"] == 2 and out["draws_compared"] == 2 and out["method_updates"] == 2
        assert all(out[k] == 0 for k in ("initial_weights_differ", "updates_before_first_draw", "stream_draws_differ",
                                         "first_draw_tokens_differ", "updates_differ", "other_seed_same_stream"))
        return
    out = get_kind("paired_control").measure(_paired_impl("bad", **defect), ctx(params=PAIRED), PAIRED)
    assert out[metric] >= 1


def test_worst_names_the_position_as_torch_would():
    """calls.worst unravels the flat index itself (torch.unravel_index imports sympy on first use); NaN is worst."""
    import torch

    from engine.kinds import calls

    for shape in [(5,), (2, 3), (4, 1, 5), (2, 3, 2, 2)]:
        n = 1
        for s in shape:
            n *= s
        for flat in range(n):
            assert calls.unravel(flat, shape) == [int(i) for i in torch.unravel_index(torch.tensor(flat), shape)]
    d = torch.zeros(3, 4)
    d[2, 1], d[1, 3] = 5.0, float("nan")
    assert calls.worst(d) == (float("inf"), [1, 3])
    assert calls.worst(torch.tensor(2.5)) == (2.5, [])


# --- generic parameters the ported MRTPO and TAPO contracts need: each fails on a planted bug ---------------------


def _mean_loss(x, y, adv, mask):
    """-mean(adv) at x = y: an on-policy loss of ratio exp(x - y) (its gradient -adv / N at valid slots)."""
    r = torch.exp(x - y.detach())
    n = int(mask.sum())
    return -(torch.where(mask, r * adv[:, None], torch.zeros_like(x))).sum() / n


def _ref_on_policy(x, y, adv, mask):
    m = mask.to(torch.bool)
    n = int(m.sum())
    a = adv[:, None].expand(m.shape)
    return {"value": -a[m].sum() / n, "scale": float(a[m].abs().mean()),
            "grad": [torch.where(m, -a / n, torch.zeros_like(a))]}


if "test_kinds.on_policy" not in registry._REGISTRY.references:
    registry.reference("test_kinds.on_policy")(_ref_on_policy)
    registry.reference("test_kinds.row_sum")(lambda x, w, mask: x.sum(0))
if "test_kinds_other" not in registry._REGISTRY.implementations:
    registry.implementation("test_kinds_other", loss=_mean_loss)


def test_identity_closed_form_other_implementation_alias_and_also():
    """equals_reference (value and gradient), equals_call of another registered implementation, alias_too (the
    tied input the very same tensor) and `also` calls; a loss that lets gradient through y fails only aliased."""
    p = {"function": "loss", "args": ["x", "y", "adv", "mask"], "inputs": INPUTS, "tie": {"y": "x"},
         "alias_too": True, "grad_wrt": ["x"], "equals_reference": "test_kinds.on_policy",
         "equals_call": {"implementation": "test_kinds_other", "function": "loss", "args": ["x", "y", "adv", "mask"]},
         "also": [{"function": "r", "args": ["x", "y", "mask"], "equals_value": 1.0, "mask": "mask",
                   "prefix": "ratio_"}]}
    fns = {"loss": _mean_loss, "r": lambda x, y, m: torch.exp(x - y)}
    good, _ = measure("identity", fns, p)
    assert good["ref_max_scaled_err"] < 1e-15 and good["ref_grad_max_rel_err"] < 1e-15
    assert good["grad_max_rel_diff"] < 1e-15 and good["alias_ref_grad_max_rel_err"] < 1e-15
    assert good["ratio_value_max_abs_diff"] == 0 and good["alias_ratio_value_max_abs_diff"] == 0

    def leaky(x, y, adv, mask):  # old log-probs not detached: on the same tensor the gradient cancels
        r = torch.exp(x - y)
        return -(torch.where(mask, r * adv[:, None], torch.zeros_like(x))).sum() / int(mask.sum())

    bad, _ = measure("identity", {**fns, "loss": leaky}, p)
    assert bad["ref_grad_max_rel_err"] < 1e-15 and bad["alias_ref_grad_max_rel_err"] == pytest.approx(1.0)
    half, _ = measure("identity", {**fns, "loss": lambda *a: 0.5 * _mean_loss(*a)}, p)
    assert half["ref_max_scaled_err"] > 0.4 and half["grad_max_rel_diff"] > 0.4
    lacking, c = measure("identity", {"loss": _mean_loss}, p)
    assert "ratio_value_max_abs_diff" not in lacking and "r" in c.skipped_calls


def test_identity_points_set_tie_broadcast_and_odd_call():
    """`points` (set an input, tie with broadcasting), `key` on a dict output, and an odd function stated with
    scale_inputs / times; planted bugs: no fallback at the set point, an even part."""
    inputs = {"dims": {"K": 2, "B": [1, 3], "L": [2, 6]},
              "tensors": {"x": {"shape": ["B", "L"], "dist": "normal"},
                          "xs": {"shape": ["K", "B", "L"], "dist": "normal"},
                          "flag": {"shape": ["K"], "dist": "constant", "value": 0.0},
                          "mask": {"shape": ["B", "L"], "layout": "response"}}}

    def weights(x, xs, flag, mask):  # 1 where the flag is set or xs equals x, else 1 + |xs - x|
        w = 1 + (xs - x).abs() * (flag[:, None, None] == 0)
        return torch.where(mask, w, torch.zeros_like(w)), {"s": 1.0}

    p = {"function": "w", "args": ["x", "xs", "flag", "mask"], "output": 0, "equals_value": 1.0, "mask": "mask",
         "inputs": inputs, "also": [{"function": "w", "args": ["x", "xs", "flag", "mask"], "output": 1, "key": "s",
                                     "equals_value": 1.0, "prefix": "s_"}],
         "points": [{"prefix": "set_", "set": {"flag": 1}}, {"prefix": "tied_", "tie": {"xs": "x"}}]}
    good, _ = measure("identity", {"w": weights}, p)
    assert good["set_value_max_abs_diff"] == 0 and good["tied_value_max_abs_diff"] == 0
    assert good["set_s_value_max_abs_diff"] == 0
    bad, _ = measure("identity", {"w": lambda x, xs, f, m: weights(x, xs, f * 0, m)}, p)
    assert bad["set_value_max_abs_diff"] > 0 and bad["tied_value_max_abs_diff"] == 0
    odd = {**CALL, "equals_call": {"function": "f", "args": ["x", "y", "mask"], "scale_inputs": {"x": -1.0},
                                   "times": -1.0}}
    assert measure("identity", {"f": _masked_double}, odd)[0]["value_max_abs_diff"] == 0
    assert measure("identity", {"f": lambda x, y, m: _masked_double(x, y, m) + 1}, odd)[0]["value_max_abs_diff"] == 2


def _chain_inputs():
    return {"dims": {"K": [1, 3], "B": [2, 4], "L": [2, 6]},
            "tensors": {"r": {"shape": ["K", "B"], "dist": "normal"},
                        "raw": {"shape": ["K", "B", "L"], "dist": "uniform", "low": 0.5, "high": 2.0},
                        "mask": {"shape": ["B", "L"], "layout": "response"}}}


def _norm_weights(raw, mask):
    m = mask.to(raw.dtype)
    return raw * m / ((raw * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp_min(1))


def _credit(r, w, mask):
    s = (r[:, :, None] * w).sum(0)
    std = float(s[mask].std()) + 0.0
    return torch.where(mask, s / (std + 1e-6), torch.zeros_like(s)), {"std": std}


def test_conservation_chained_call_times_a_reported_number_and_a_reference():
    """`before` feeds one call's output to the next; `times` multiplies by a reported number; the conserved quantity
    comes from a reference. Planted bug: weights that do not average 1 (the credit is not conserved downstream)."""
    p = {"before": [{"function": "weights", "args": ["raw", "mask"], "as": "w"}], "function": "credit",
         "args": ["r", "w", "mask"], "output": 0, "times": {"output": 1, "key": "std", "plus": 1e-6},
         "reduce": "mean", "mask": "mask", "equals_reference": "test_kinds.row_sum", "inputs": _chain_inputs()}
    good, _ = measure("conservation", {"weights": _norm_weights, "credit": _credit}, p)
    assert good["max_abs_err"] < 1e-12 and good["rows"] > 0
    bad, _ = measure("conservation", {"weights": lambda raw, m: raw * m, "credit": _credit}, p)
    assert bad["max_abs_err"] > 1e-3


def test_precision_chain_also_and_scale_floor():
    """The chain runs in the dtype under test and in float64; `also` compares an intermediate call absolutely.
    Planted bug: weights rounded through float16 below float64."""
    p = {"before": [{"function": "weights", "args": ["raw", "mask"], "as": "w"}], "function": "credit",
         "args": ["r", "w", "mask"], "output": 0, "scale_floor": 1.0, "inputs": _chain_inputs(),
         "also": [{"function": "weights", "args": ["raw", "mask"], "prefix": "weights_"}]}
    impl = registry.Implementation("toy", weights=_norm_weights, credit=_credit)
    good = get_kind("precision").measure(impl, ctx(torch.float32, params=p), p)
    assert good["weights_max_abs_err"] < 1e-6 and good["max_rel_err"] < 1e-5
    lossy = registry.Implementation("toy", credit=_credit, weights=lambda raw, m: _norm_weights(
        raw if raw.dtype == torch.float64 else raw.half().to(raw.dtype), m))
    bad = get_kind("precision").measure(lossy, ctx(torch.float32, params=p), p)
    assert bad["weights_max_abs_err"] > 1e-5


def test_masked_junk_in_arguments_holding_the_mask_dims_and_zero_masked_outputs():
    """Junk in [K, B, L] and [K, B] arguments (the mask's dims inside them, or its rows'); a reported number
    (`key`) compared bit for bit; masked outputs exactly 0. Planted bugs: a sum over padding slots, a masked
    output left at 1."""
    p = {"calls": [{"function": "credit", "args": ["r", "raw", "mask"], "output": 0},
                   {"function": "credit", "args": ["r", "raw", "mask"], "output": 1, "key": "std"}],
         "mask": "mask", "junk_args": ["raw"], "junk_rows": ["r"], "mask_at": {"raw": 1}, "junk": ["nan", 1.0e4, "-inf"],
         "masked_outputs_zero": True,
         "inputs": {**_chain_inputs(), "tensors": {**_chain_inputs()["tensors"],
                                                    "mask": {"shape": ["B", "L"], "layout": "response",
                                                             "empty_rows": 1}}}}

    def credit(r, w, mask):
        r = torch.where(mask.any(-1)[None], r, torch.zeros_like(r))
        w = torch.where(mask[None], w, torch.zeros_like(w))
        return _credit(r, w, mask)

    good, _ = measure("masked_junk", {"credit": credit}, p)
    assert good["value_max_abs_diff"] == 0 and good["masked_value_max_abs"] == 0 and good["nonfinite"] == 0
    # normalised over every slot, padding included: junk there reaches the valid outputs
    bad, _ = measure("masked_junk", {"credit": lambda r, w, m: credit(r, w / w.sum(-1, keepdim=True), m)}, p)
    assert bad["value_max_abs_diff"] > 0
    ones, _ = measure("masked_junk", {"credit": lambda r, w, m: (credit(r, w, m)[0] + ~m, credit(r, w, m)[1])}, p)
    assert ones["masked_value_max_abs"] == 1 and ones["value_max_abs_diff"] == 0
    # an output declared to hold the mask at dim 0 ([B, L]) but shaped otherwise ([L, B]) is caught
    placed = {**p, "calls": [{**p["calls"][0], "mask_at": 0}]}
    assert measure("masked_junk", {"credit": credit}, placed)[0]["masked_value_max_abs"] == 0
    turned, _ = measure("masked_junk", {"credit": lambda r, w, m: (credit(r, w, m)[0].T, {})}, placed)
    assert turned["masked_value_max_abs"] == float("inf")


def test_identity_point_constant_and_bounds():
    """A point's own equals_value (q(a, a) = 0) beside a symmetric relation at the base point, and `bounds`;
    planted bugs: an offset at identical inputs, a value above the bound."""
    def q(x, y, mask):
        return (x - y).abs().tanh()

    p = {"function": "q", "args": ["x", "y", "mask"], "inputs": INPUTS, "bounds": [0, 1],
         "equals_call": {"function": "q", "args": ["y", "x", "mask"]},
         "points": [{"prefix": ""}, {"prefix": "same_", "tie": {"y": "x"}, "equals_value": 0.0}]}
    good, _ = measure("identity", {"q": q}, p)
    assert good["value_max_abs_diff"] == 0 and good["same_value_max_abs_diff"] == 0 and good["out_of_bounds"] == 0
    bad, _ = measure("identity", {"q": lambda x, y, m: q(x, y, m) + 1e-3}, p)
    assert bad["value_max_abs_diff"] == 0 and bad["same_value_max_abs_diff"] == pytest.approx(1e-3)
    over, _ = measure("identity", {"q": lambda x, y, m: 2 * q(x, y, m)}, p)
    assert over["out_of_bounds"] > 0


# --- ratio_overflow: a toy clipped-ratio loss, right and with the 0 * inf autograd form --------------------------


def _ppo(x, y, adv, mask, literal=False):
    """Token-mean -min(r A, clip(r, 0.8, 1.2) A) with r = exp(x - y); where the clip or A = 0 removes a token its
    gradient is exactly 0 (r replaced by 1 there before exp's backward), unless `literal`."""
    a = adv[:, None].expand_as(x) if adv.dim() == 1 else adv
    r = torch.exp((x - y).detach())
    removed = ~mask | (a == 0) | ((a > 0) & (r > 1.2)) | ((a < 0) & (r < 0.8))
    if literal:  # autograd multiplies the clip's 0 by exp(inf) = inf: NaN
        live, kept = torch.exp(x - y), torch.zeros_like(removed)
    else:
        live, kept = torch.exp(torch.where(removed, y, x) - y), removed
    term = -torch.minimum(live * a, live.clamp(0.8, 1.2) * a)
    fixed = -torch.minimum(r * a, r.clamp(0.8, 1.2) * a).detach()
    term = torch.where(kept, torch.where(a == 0, torch.zeros_like(fixed), fixed), term)
    if not literal:
        term = torch.where(a == 0, torch.zeros_like(term), term)
    return torch.where(mask, term, torch.zeros_like(term)).sum() / mask.sum()


def _ppo_reference(x, y, adv, mask):
    """The same loss and its gradient by float64 loops, in log space where exp overflows."""
    a = (adv[:, None].expand_as(x) if adv.dim() == 1 else adv).tolist()
    m, n = mask.tolist(), int(mask.sum())
    grad = [[0.0] * len(row) for row in m]
    zero = [[not v for v in row] for row in m]
    total = 0.0
    for b, row in enumerate(m):
        for t, v in enumerate(row):
            if not v:
                continue
            d = float(x[b, t]) - float(y[b, t])
            r = math.exp(d) if d < 709 else math.inf
            av = a[b][t]
            total += 0.0 if av == 0 else -min(r * av, min(max(r, 0.8), 1.2) * av)
            gone = av == 0 or (av > 0 and r > 1.2) or (av < 0 and r < 0.8)
            zero[b][t] = gone
            grad[b][t] = 0.0 if gone else -av * r / n
    return {"value": torch.tensor(total / n, dtype=torch.float64), "scale": 1.0,
            "grad": [torch.tensor(grad, dtype=torch.float64)], "zero_grad": [torch.tensor(zero)]}


if "test_kinds.ppo" not in registry._REGISTRY.references:
    registry.reference("test_kinds.ppo")(_ppo_reference)

OVERFLOW = {"function": "loss", "args": ["x", "y", "adv", "mask"], "reference": "test_kinds.ppo", "grad_wrt": ["x"],
            "plant": {"behaviour": "y", "mask": "mask", "advantages": "adv"},
            "inputs": {"dims": {"B": [7, 9], "L": [1, 6]},
                       "tensors": {"x": {"shape": ["B", "L"], "dist": "uniform", "low": -3.0, "high": -0.1},
                                   "y": {"shape": ["B", "L"], "dist": "normal", "std": 0.3, "around": "x"},
                                   "adv": {"cycle": [{"shape": ["B"], "dist": "normal"},
                                                     {"shape": ["B", "L"], "dist": "normal"}]},
                                   "mask": {"shape": ["B", "L"], "layout": "response", "prompt_max": 1}}}}


def test_ratio_overflow_good_and_planted_zero_times_inf():
    good, _ = measure("ratio_overflow", {"loss": _ppo}, OVERFLOW)
    assert good["value_nan"] == good["grad_nan"] == good["grad_zero_violations"] == 0, good
    assert good["grad_overflow_mismatches"] == 0 and good["grad_max_rel_err"] < 1e-12, good
    # every class planted: (up, down) x (A > 0, < 0, = 0) and an untouched row; clipped and unclipped overflows
    assert good["planted_classes"] == 7 and good["overflow_zero_grad_tokens"] and good["overflow_nonzero_grad_tokens"]
    bad, c = measure("ratio_overflow", {"loss": lambda *a: _ppo(*a, literal=True)}, OVERFLOW)
    assert bad["grad_nan"] > 0 and bad["grad_zero_violations"] > 0, bad  # 0 * inf at the clipped overflows
    assert bad["value_nan"] > 0  # inf * 0 where A = 0
    cases = failing_cases(c.case_log, [{"metric": "grad_nan", "op": "eq", "threshold": 0}], "float64")
    assert cases and "planted" in cases[0]["argument"]


def test_ratio_overflow_plants_both_directions_at_the_first_valid_token():
    from engine.kinds.ratio_overflow import CLASSES, plant

    drawn, _ = inputs_mod.draw(OVERFLOW["inputs"], 42, 0)
    out, up, classes = plant(drawn, OVERFLOW["plant"], 0)
    assert classes == set(range(len(CLASSES)))
    shift = out["y"] - drawn["y"]
    for b in range(drawn["mask"].shape[0]):
        first = int(drawn["mask"][b].nonzero()[0])
        changed = shift[b].nonzero().flatten().tolist()
        go_up, sign = CLASSES[b % len(CLASSES)]
        assert changed == ([] if go_up is None else [first])
        if go_up is not None:
            assert float(shift[b, first]) == (-800.0 if go_up else 800.0) and bool(up[b, first]) == go_up
            assert float(out["adv"][b]) == 0.0 if sign == 0 else math.copysign(1, float(out["adv"][b])) == sign
    _, _, odd = plant(drawn, OVERFLOW["plant"], 1)
    assert 1 not in odd  # odd cases leave out (up, A < 0): their loss is finite and compared
