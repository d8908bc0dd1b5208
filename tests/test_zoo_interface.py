"""The framework-zoo specs declare their implementations' whole interface (tests/test_interface.py's checks, for
dapo, dr-grpo, cispo, gmpo and gpg): every registered function with its real signature, the scaffold's stubs, the
returned metrics' keys, and the mask convention in the shipped code; and none of them needs a bespoke check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests import test_interface as T

ROOT = Path(__file__).resolve().parent.parent
METHODS = {"dapo": "dapo", "dr-grpo": "dr_grpo", "cispo": "cispo", "gmpo": "gmpo", "gpg": "gpg"}


@pytest.fixture(autouse=True)
def _zoo_methods(monkeypatch):
    monkeypatch.setattr(T, "METHODS", METHODS)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_interface_is_declared_whole(method):
    T.test_the_interface_is_declared_whole_and_is_the_registered_signatures(method)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_scaffold_has_real_signatures(method, tmp_path):
    T.test_the_scaffold_has_real_signatures_and_docstrings(method, tmp_path)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_written_in_kinds_alone(method):
    """No bespoke check: every contract names a generic kind, and the package registers no check."""
    from engine.spec.loader import load_spec

    spec = load_spec(ROOT / "specs" / f"{method}.yaml", ROOT).data
    # the loader names a kind's contract `kind:<name>`; a bespoke check would name a registered check instead
    assert all(c.get("check", "kind:").startswith("kind:") and c["kind"] not in ("mechanism", "bespoke")
               for c in spec["contracts"])
    pkg = ROOT / "methods" / METHODS[method]
    assert not any(re.search(r"@registry\.check\(", p.read_text()) for p in pkg.glob("*.py"))


def test_declared_result_keys_are_the_returned_ones():
    from methods.cispo.loss import cispo_loss
    from methods.dapo.loss import dapo_loss
    from methods.dr_grpo.loss import dr_grpo_loss
    from methods.gmpo.loss import gmpo_loss
    from methods.gpg.loss import gpg_loss

    lt = -torch.rand(2, 3, dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    for method, fn, args in (("dapo", dapo_loss, (lt, lt - 0.1, adv, mask)),
                             ("dr-grpo", dr_grpo_loss, (lt, lt - 0.1, adv, mask)),
                             ("cispo", cispo_loss, (lt, lt - 0.1, adv, mask)),
                             ("gmpo", gmpo_loss, (lt, lt - 0.1, adv, mask)), ("gpg", gpg_loss, (lt, adv, mask))):
        _, met = fn(*args)
        assert set(met) == T._keys(method, fn.__name__, "metrics"), method


def test_a_0_1_mask_of_any_real_dtype_reads_as_the_bool_mask():
    from methods.cispo.loss import cispo_loss
    from methods.dapo.loss import dapo_loss
    from methods.dr_grpo.loss import dr_grpo_loss, group_advantages
    from methods.gmpo.loss import geometric_ratio, gmpo_loss
    from methods.gpg.loss import gpg_loss

    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[True, True, False, True], [True, False, False, False]])
    lt = -torch.rand(2, 4, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    calls = [lambda m: float(dapo_loss(lt, lt - 0.1, adv, m)[0]), lambda m: float(dr_grpo_loss(lt, lt - 0.1, adv, m)[0]),
             lambda m: group_advantages(torch.tensor([1.0, 2.0], dtype=torch.float64), 2, mask=m).tolist(),
             lambda m: float(cispo_loss(lt, lt - 0.1, adv, m)[0]), lambda m: float(gmpo_loss(lt, lt - 0.1, adv, m)[0]),
             lambda m: geometric_ratio(lt, lt - 0.1, adv, m).tolist(), lambda m: float(gpg_loss(lt, adv, m)[0])]
    for call in calls:
        want = call(mask)
        for form in T._mask_forms(mask)[1:]:
            assert call(form) == want, form.dtype
        for bad in (mask.long() * 2, mask.double() * 0.5, torch.where(mask, torch.nan, 0.0)):
            with pytest.raises(ValueError):
                call(bad)
