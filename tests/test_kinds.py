"""Each generic kind holds on a correct toy function and fails on a planted bug; inputs are reproducible per case."""

from __future__ import annotations

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
    assert good == {"refused": 1, "not_refused": 0, "accepted": 1, "wrongly_refused": 0, "cases": 2}
    bad, c = measure("refusal", {"f": lambda x, y, m: x}, p)
    assert bad["not_refused"] == 1 and "refuse" in c.case_log[0]["argument"]


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
