"""The framework zoo: the matrix's table (docs/conformance.yaml) and the adapters built from the mapping table
(methods/common/zoo.yaml).

The table must name every policy loss the pinned verl registers and every loss type the pinned TRL computes, and
each claimed spec must exist; the adapters must put a spec's arguments where the framework reads them, which the
float64 references show on clean inputs (where the frameworks keep the paper's math): verl's vanilla as DAPO and as
Dr. GRPO, cispo, geo_mean and gpg; TRL's dapo, dr_grpo and cispo loss types. Skips without the [verl] or [trl]
extra, except in CI."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from engine.spec import registry
from methods.common import zoo

ROOT = Path(__file__).resolve().parent.parent


def _need(module: str, extra: str):
    try:
        return __import__(module, fromlist=["_"])
    except Exception as exc:  # noqa: BLE001 - any failure to import is "not usable here"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the {extra} tests: {module} does not import ({type(exc).__name__}: {exc})")
        pytest.skip(f"{module} is not importable ({type(exc).__name__}); install it with pip install -e '.[{extra}]'")


def _matrix_table():
    from engine.store.conformance import default_zoo, load_zoo

    return load_zoo(default_zoo())


def test_the_table_claims_only_specs_that_exist_and_says_why_otherwise():
    specs = {p.stem for p in (ROOT / "specs").glob("*.yaml")}
    t = {**_matrix_table(), "mappings": zoo.table()["mappings"]}
    for name, fw in t["frameworks"].items():
        for v in fw["variants"]:
            assert set(v["claims"]) <= specs, (name, v["name"])
            if not v["claims"]:
                assert v.get("why"), f"{name}:{v['name']} claims no spec and does not say why"
            assert v.get("paper"), (name, v["name"])
    for impl, entry in t["mappings"].items():
        assert impl in registry.static_names().implementations, impl
        assert entry["function"] in registry.static_names().implementations[impl]
    keys = {c["id"] for p in (ROOT / "specs").glob("*.yaml") for c in _contracts(p)}
    for key in t.get("defects") or {}:
        assert key.rsplit("/", 1)[-1] in keys, f"defect {key} names no contract of any spec"
        assert t["defects"][key]["severity"] in ("high", "medium", "low") and t["defects"][key]["text"]


def _contracts(path):
    from engine.spec.loader import read_data

    return read_data(path, path.name)[0]["contracts"]


def test_every_verl_policy_loss_is_a_row():
    core = _need("verl.trainer.ppo.core_algos", "verl")
    rows = {v["name"] for v in _matrix_table()["frameworks"]["verl"]["variants"]}
    assert set(core.POLICY_LOSS_REGISTRY) == rows


def test_every_trl_loss_type_is_a_row():
    trainer = _need("trl.trainer.grpo_trainer", "trl")
    import inspect

    source = inspect.getsource(trainer.GRPOTrainer._compute_loss)
    computed = set(re.findall(r'"([a-z_]+)"', " ".join(re.findall(r"self\.loss_type (?:==|in) [^:]+:", source))))
    rows = {v["name"] for v in _matrix_table()["frameworks"]["trl"]["variants"]}
    assert computed and computed <= rows, computed - rows
    from engine.run.adapters.trl import LOSS_TYPES

    assert computed == set(LOSS_TYPES)


# --- the adapters on clean inputs -------------------------------------------------------------------------------


def _batch(seed, B=5, L=16, drift=0.4):
    g = torch.Generator().manual_seed(seed)
    logp = -3.0 * torch.rand(B, L, generator=g, dtype=torch.float64) - 0.01
    old = logp + drift * torch.randn(B, L, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    mask = torch.arange(L)[None, :] < lengths[:, None]
    return logp, old, adv, mask


def _close(impl_fn, ref_value, ref_grad, *args, **kwargs):
    x = args[0].clone().requires_grad_(True)
    loss, metrics = impl_fn(x, *args[1:], **kwargs)
    (g,) = torch.autograd.grad(loss, x)
    want = ref_value(*args, **kwargs)
    want = float(want["value"] if isinstance(want, dict) else want)
    wg = ref_grad(*args, **kwargs)
    ok = ~torch.isnan(wg)
    assert abs(float(loss.detach()) - want) <= 1e-10 * max(abs(want), 1.0)
    assert float((g - wg)[ok].abs().max()) <= 1e-10 * float(wg[ok].abs().max())
    assert metrics["tokens"] == int(args[-1].sum())


def _verl(method, name):
    core = _need("verl.trainer.ppo.core_algos", "verl")
    return registry.load().get_adapter("verl", method)(core.POLICY_LOSS_REGISTRY[name]).implementation(f"verl:{name}")


def _trl(method, loss_type):
    trainer = _need("trl.trainer.grpo_trainer", "trl")
    from engine.run.adapters.trl import Pinned

    obj = Pinned(trainer.GRPOTrainer, loss_type)
    return registry.load().get_adapter("trl", method)(obj).implementation(f"trl:{loss_type}")


def _refs(prefix):
    reg = registry.load()
    return reg.get_reference(f"{prefix}.loss"), reg.get_reference(f"{prefix}.loss_grad")


@pytest.mark.parametrize("framework", ["verl", "trl"])
def test_dapo_adapters_compute_dapo(framework):
    impl = _verl("dapo", "vanilla") if framework == "verl" else _trl("dapo", "dapo")
    _close(impl.dapo_loss, *_refs("dapo"), *_batch(0), clip_low=0.2, clip_high=0.28)


@pytest.mark.parametrize("framework", ["verl", "trl"])
def test_dr_grpo_adapters_compute_dr_grpo(framework):
    impl = _verl("dr_grpo", "vanilla") if framework == "verl" else _trl("dr_grpo", "dr_grpo")
    _close(impl.dr_grpo_loss, *_refs("dr_grpo"), *_batch(1), norm_length=40)


@pytest.mark.parametrize("framework", ["verl", "trl"])
def test_cispo_adapters_compute_cispo(framework):
    impl = _verl("cispo", "cispo") if framework == "verl" else _trl("cispo", "cispo")
    _close(impl.cispo_loss, *_refs("cispo"), *_batch(2, drift=0.8), clip_high=0.28)


def test_gmpo_and_gpg_adapters_compute_their_papers():
    _close(_verl("gmpo", "geo_mean").gmpo_loss, *_refs("gmpo"), *_batch(3, drift=0.6))
    logp, _, adv, mask = _batch(4)
    _close(_verl("gpg", "gpg").gpg_loss, *_refs("gpg"), logp, adv, mask)


def test_what_a_framework_cannot_set_is_not_provided_never_a_silent_default():
    with pytest.raises(registry.NotProvided, match="clamps the log-ratio"):
        _verl("dapo", "vanilla").dapo_loss(*_batch(5), log_ratio_clamp=10.0)
    with pytest.raises(registry.NotProvided, match="no lower bound"):
        _trl("cispo", "cispo").cispo_loss(*_batch(5), clip_low=0.2)
    with pytest.raises(registry.NotProvided, match="loss_type 'bnpo'"):
        _trl("dapo", "bnpo").dapo_loss(*_batch(5))
    # a pinned TRL loss type holds the GRPO adapter to its own aggregation
    with pytest.raises(registry.NotProvided, match="trl:grpo aggregates"):
        _trl("grpo", "grpo").grpo_loss(*_batch(5), agg="token-mean")
    absent = _verl("dapo", "vanilla")
    with pytest.raises(registry.NotProvided, match="reward"):
        absent.overlong_penalty(torch.tensor([3]), 8, 2)
