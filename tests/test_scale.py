"""The scale tier's float64 references against the loop (or decimal) references they restate, on the math tier's
own inputs, and the scale inputs at the sizes they claim.

A scale reference computes each element in float64 tensor arithmetic and every compared sum exactly, because the
loops cost seconds a call at training sizes; here, on small inputs, both run, and they must agree to a few
float64 roundings (the loops' sums are fsums too, so only the per-element operations differ).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from engine.kinds.inputs import draw
from engine.spec import registry
from engine.spec.loader import load_spec

ROOT = Path(__file__).resolve().parent.parent
REG = registry.load()
F64 = torch.float64


def contract(method: str, cid: str) -> dict:
    return load_spec(ROOT / "specs" / f"{method}.yaml", ROOT).contract(cid)


def cases(method: str, cid: str, n: int = 6):
    """The math-tier contract's inputs for a few seeds and cases, float64 (bool masks kept)."""
    c = contract(method, cid)
    for seed in (3, 42, 977):
        for case in range(n):
            drawn, _ = draw(c["params"]["inputs"], seed, case)
            yield {k: v.to(F64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                   for k, v in drawn.items()}


def close(a, b, tol: float) -> bool:
    a, b = torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64)
    both_nan = torch.isnan(a) & torch.isnan(b)
    scale = max(1.0, float(torch.nan_to_num(b.abs(), nan=0.0).max()) if b.numel() else 1.0)
    return a.shape == b.shape and bool((((a - b).abs() <= tol * scale) | both_nan).all())


@pytest.mark.parametrize("kwargs", [{}, {"agg": "seq-mean-token-mean"}, {"agg": "seq-mean-token-sum-norm"},
                                    {"dual_clip": 1.5}])
def test_grpo_scale_reference_is_the_loop(kwargs):
    loss, grad, metrics = REG.get_reference("grpo.loss"), REG.get_reference("grpo.loss_grad"), \
        REG.get_reference("grpo.loss_metrics")
    f64, m64 = REG.get_reference("grpo.loss_f64"), REG.get_reference("grpo.loss_metrics_f64")
    for t in cases("grpo", "loss_reference"):
        args = (t["logp"], t["old_logp"], t["adv"], t["mask"])
        kw = dict(clip_low=0.2, clip_high=0.28, **kwargs)
        got = f64(*args, **kw, dtype=F64)
        assert close(got["value"], loss(*args, **kw), 1e-14)
        assert close(got["grad"][0], grad(*args, **kw), 1e-14)
        want, have = metrics(*args, **{k: v for k, v in kw.items() if k != "agg"}), m64(*args, **kw)
        for key, v in want.items():
            assert close(have[key], v, 1e-14) or math.isnan(have[key]), key


def test_grpo_scale_reference_with_the_kl_term_is_the_loop():
    loss, grad = REG.get_reference("grpo.loss"), REG.get_reference("grpo.loss_grad")
    f64 = REG.get_reference("grpo.loss_f64")
    for t in cases("grpo", "kl_reference"):
        args = (t["logp"], t["old_logp"], t["adv"], t["mask"])
        kw = {"ref_logp": t["ref_logp"], "beta": 0.1}
        got = f64(*args, **kw, dtype=F64)
        assert close(got["value"], loss(*args, **kw), 1e-14) and close(got["grad"][0], grad(*args, **kw), 1e-14)


def test_tapo_scale_references_are_the_loops():
    ratio, ratio64 = REG.get_reference("tapo.prefix_ratio"), REG.get_reference("tapo.prefix_ratio_f64")
    loss, loss64 = REG.get_reference("tapo.loss"), REG.get_reference("tapo.loss_f64")
    for t in cases("tapo-trajectory", "loss_forward"):
        assert close(ratio64(t["logp"], t["old_logp"], t["mask"]), ratio(t["logp"], t["old_logp"], t["mask"]), 1e-13)
        for dtype in (F64, torch.float32):
            want = loss(t["logp"], t["old_logp"], t["adv"], t["mask"], 0.1, 0.2, t["horizon"], dtype=dtype)
            got = loss64(t["logp"], t["old_logp"], t["adv"], t["mask"], 0.1, 0.2, t["horizon"], dtype=dtype)
            assert close(got["value"], want["value"], 1e-13) and close(got["grad"][0], want["grad"][0], 1e-13)
            assert got["counts"] == want["counts"] and math.isclose(got["scale"], want["scale"], rel_tol=1e-13)


def test_gspo_scale_references_are_the_loops():
    r, rg, r64 = (REG.get_reference(n) for n in ("gspo.sequence_ratio", "gspo.sequence_ratio_grad",
                                                 "gspo.sequence_ratio_f64"))
    loss, grad, l64 = (REG.get_reference(n) for n in ("gspo.loss", "gspo.loss_grad", "gspo.loss_f64"))
    for t in cases("gspo", "loss_reference"):
        got = r64(t["logp"], t["old_logp"], t["mask"], dtype=F64)
        assert close(got["value"], r(t["logp"], t["old_logp"], t["mask"]), 1e-14)
        assert close(got["grad"][0], rg(t["logp"], t["old_logp"], t["mask"]), 1e-14)
        args = (t["logp"], t["old_logp"], t["adv"], t["mask"])
        got = l64(*args, dtype=F64)
        assert close(got["value"], loss(*args), 1e-14) and close(got["grad"][0], grad(*args), 1e-14)


@pytest.mark.parametrize("method, impl, cid, kwargs", [
    ("dapo", "dapo", "loss_reference", {}),
    ("dapo", "dapo", "loss_reference", {"clip_low": 0.1, "clip_high": 0.4, "log_ratio_clamp": 0.5}),
    ("dapo", "dapo", "ratio_overflow_guard", {}),
    ("dr-grpo", "dr_grpo", "loss_reference", {}),
    ("dr-grpo", "dr_grpo", "loss_reference", {"norm_length": 77, "clip_high": 0.28}),
    ("dr-grpo", "dr_grpo", "empty_rows", {}),
    ("cispo", "cispo", "loss_reference", {}),
    ("cispo", "cispo", "loss_reference", {"clip_low": 0.3, "clip_high": 0.1}),
    ("gmpo", "gmpo", "loss_reference", {}),
    ("gmpo", "gmpo", "empty_rows", {"clip_low": 0.1, "clip_high": 0.2}),
    ("gmpo", "gmpo", "ratio_overflow_guard", {}),
    ("gpg", "gpg", "loss_reference", {}),
])
def test_zoo_scale_references_are_the_loops(method, impl, cid, kwargs):
    """The framework-zoo losses' scale references (DAPO, Dr. GRPO, CISPO, GMPO, GPG) against their loops."""
    loss, grad, l64 = (REG.get_reference(f"{impl}.{n}") for n in ("loss", "loss_grad", "loss_f64"))
    for t in cases(method, cid):
        args = (t["logp"], t["adv"], t["mask"]) if impl == "gpg" else (t["logp"], t["old_logp"], t["adv"], t["mask"])
        got = l64(*args, **kwargs, dtype=F64)
        want = loss(*args, **kwargs)
        want = want["value"] if isinstance(want, dict) else want
        assert close(got["value"], want, 1e-14)
        assert close(got["grad"][0], grad(*args, **kwargs), 1e-14)


def test_mrtpo_scale_references_are_the_decimal_references():
    js, js64 = REG.get_reference("mrtpo.js_distance"), REG.get_reference("mrtpo.js_distance_f64")
    for t in cases("mrtpo", "js_reference", n=12):  # every regime: close, peaked, zeros, disjoint, -1e4, one-hot
        assert close(js64(t["logp_a"], t["logp_b"]), js(t["logp_a"], t["logp_b"]), 1e-9)
    w, w64 = REG.get_reference("mrtpo.credit_weights"), REG.get_reference("mrtpo.credit_weights_f64")
    wl64 = REG.get_reference("mrtpo.credit_weights_from_logits_f64")
    for t in cases("mrtpo", "weights_reference", n=8):
        want = w(t["logp_all"], t["logp_loo"], t["mask"], t["beta"], t["empty"])
        assert close(w64(t["logp_all"], t["logp_loo"], t["mask"], t["beta"], t["empty"]), want, 1e-9)
        # log-probabilities are logits of the same distributions
        assert close(wl64(t["logp_all"], t["logp_loo"], t["mask"], t["beta"], t["empty"]), want, 1e-9)
    a, a64 = REG.get_reference("mrtpo.advantages"), REG.get_reference("mrtpo.advantages_f64")
    for t in cases("mrtpo", "advantages_reference", n=8):
        want, got = a(t["radv"], t["weights"], t["mask"], 1e-6), a64(t["radv"], t["weights"], t["mask"], 1e-6)
        assert close(got["value"], want["value"], 1e-12) and math.isclose(got["scalars"]["s"], want["scalars"]["s"],
                                                                          rel_tol=1e-12)
        assert got["counts"] == want["counts"]


def test_tar_scale_references_are_the_loops():
    rep, rep64 = REG.get_reference("tar.replay"), REG.get_reference("tar.replay_f64")
    met, met64 = REG.get_reference("tar.replay_metrics"), REG.get_reference("tar.replay_metrics_f64")
    for t in cases("tar-adaptive-replay", "replay_loss_and_gradient", n=8):
        args = (t["logp_theta"], t["logp_base"], t["mask"])
        want, got = rep(*args), rep64(*args)
        assert close(got["value"], want["value"], 1e-14) and close(got["grad"][0], want["grad"][0], 1e-14)
        assert got["counts"] == want["counts"]
        (_, a), (_, b) = met(*args), met64(*args)
        assert close(b["gates"], a["gates"], 1e-15) and close(b["token_weights"], a["token_weights"], 1e-15)
    fps, fps64 = REG.get_reference("tar.fps"), REG.get_reference("tar.fps_f64")
    for t in cases("tar-adaptive-replay", "fps_max_min_reference", n=16):  # ragged prompts, scaled copies (ties)
        want = fps(t["embeddings"], t["correct"], t["k"], t["prompt_ids"])
        got = fps64(t["embeddings"], t["correct"], t["k"], t["prompt_ids"])
        assert torch.equal(got["value"], want["value"]) and got["counts"] == want["counts"]


def test_scale_inputs_reach_the_sizes_the_specs_claim():
    """Rows past 32,767 valid tokens, calls past 2^16, 65k+ responses, the page's vocabulary across the blocks."""
    for method, cid, mask in (("grpo", "scale_token_mean", "mask"), ("tapo-trajectory", "scale_prefix_ratio", "mask"),
                              ("gspo", "scale_loss", "mask"), ("tar-adaptive-replay", "scale_replay_loss", "mask"),
                              ("dapo", "scale_token_mean", "mask"), ("dr-grpo", "scale_sum_norm", "mask"),
                              ("cispo", "scale_token_mean", "mask"), ("gmpo", "scale_loss", "mask"),
                              ("gpg", "scale_token_mean", "mask")):
        drawn, dims = draw(contract(method, cid)["params"]["inputs"], 42, 0)
        per_row = drawn[mask].sum(-1)
        assert int(per_row.max()) > 2**15 and int(per_row.sum()) > 2**16 and dims.get("L", dims.get("T")) > 36000
    drawn, _ = draw(contract("grpo", "scale_advantages")["params"]["inputs"], 42, 0)
    assert drawn["rewards"].numel() > 2**16 and drawn["rewards"].numel() % 16 == 0
    drawn, dims = draw(contract("mrtpo", "scale_from_logits")["params"]["inputs"], 42, 0)
    assert int(drawn["mask"].sum()) > (1 << 22) // dims["V"] and dims["V"] >= 150001  # more rows than one block
    drawn, dims = draw(contract("tar-adaptive-replay", "scale_fps_bank")["params"]["inputs"], 42, 0)
    assert dims["N"] > 2**16 and int(drawn["prompt_ids"].max()) > 2**16
