"""The expectations recommended for specs/tapo-trajectory.yaml, as data the tests evaluate.

(check, metric, op, threshold, dtypes): dtypes None means every dtype the check runs in.
The spec owns the thresholds; this table is the proposal handed to the lead, and
tests/test_tapo.py checks that the real implementation meets it and every mutant breaks it.
"""

import math
import operator

F64, F32, BF16, F16 = "float64", "float32", "bfloat16", "float16"
ALL = (F64, F32, BF16, F16)

# Tolerances per dtype for figures that the implementation computes in float32-or-wider
# (fp16/bf16 inputs are upcast) and for gradients, which come back in the input dtype.
VALUE_TOL = {F64: 1e-12, F32: 1e-5, BF16: 1e-5, F16: 1e-5}
GRAD_TOL = {F64: 1e-12, F32: 1e-5, BF16: 3e-2, F16: 4e-3}
CLIP_TOL = {F64: 1e-12, F32: 1e-6, BF16: 1e-3, F16: 1e-4}


def _per_dtype(check, metric, op, table):
    return [(check, metric, op, table[d], (d,)) for d in table]


EXPECT = [
    *_per_dtype("tapo.prefix_ratio_forward", "max_rel_err", "le", VALUE_TOL),
    ("tapo.prefix_ratio_forward", "masked_nonfinite", "eq", 0, None),
    *_per_dtype("tapo.eq15_local_gradient", "diag_max_rel_err", "le", GRAD_TOL),
    ("tapo.eq15_local_gradient", "offdiag_max_abs", "eq", 0, None),
    ("tapo.eq15_local_gradient", "masked_grad_max_abs", "eq", 0, None),
    ("tapo.eq15_local_gradient", "nonfinite", "eq", 0, None),
    ("tapo.masked_junk_invariance", "ratio_max_abs_diff", "eq", 0, None),
    ("tapo.masked_junk_invariance", "loss_abs_diff", "eq", 0, None),
    ("tapo.masked_junk_invariance", "grad_max_abs_diff", "eq", 0, None),
    ("tapo.masked_junk_invariance", "masked_grad_max_abs", "eq", 0, None),
    ("tapo.masked_junk_invariance", "nonfinite", "eq", 0, None),
    *_per_dtype("tapo.clip_schedule", "max_abs_err", "le", CLIP_TOL),
    *_per_dtype("tapo.clip_schedule", "first_err", "le", CLIP_TOL),
    *_per_dtype("tapo.clip_schedule", "last_err", "le", CLIP_TOL),
    *_per_dtype("tapo.clip_schedule", "t1_err", "le", CLIP_TOL),
    ("tapo.clip_schedule", "monotone_violations", "eq", 0, None),
    ("tapo.clip_schedule", "out_of_range", "eq", 0, None),
    ("tapo.clip_schedule", "length_mismatches", "eq", 0, None),
    *_per_dtype("tapo.loss_forward", "loss_max_scaled_err", "le", VALUE_TOL),
    *_per_dtype("tapo.loss_forward", "grad_max_rel_err", "le", GRAD_TOL),
    ("tapo.loss_forward", "clipped_tokens", "ge", 1, None),
    ("tapo.on_policy_identity", "ratio_max_abs_dev", "eq", 0, None),
    *_per_dtype("tapo.on_policy_identity", "loss_max_scaled_err", "le", VALUE_TOL),
    *_per_dtype("tapo.on_policy_identity", "grad_max_rel_err", "le", GRAD_TOL),
    *_per_dtype("tapo.on_policy_identity", "grpo_grad_max_rel_diff", "le", GRAD_TOL),
    *[
        ("tapo.zero_advantage_rejection", m, "eq", True, None)
        for m in (
            "rejected_all_zero",
            "rejected_masked_junk",
            "rejected_one_group_zero",
            "rejected_masked_row",
            "accepted_nonzero",
            "message_names_advantage",
        )
    ],
    *_per_dtype("tapo.split_invariance", "loss_scaled_diff", "le", VALUE_TOL),
    *_per_dtype("tapo.split_invariance", "grad_max_rel_diff", "le", GRAD_TOL),
    *_per_dtype("tapo.precision_agreement", "ratio_max_rel_err", "le", VALUE_TOL),
    *_per_dtype("tapo.precision_agreement", "loss_scaled_err", "le", VALUE_TOL),
    *_per_dtype("tapo.precision_agreement", "grad_max_rel_err", "le", GRAD_TOL),
    ("tapo.mechanism", "updates_made", "ge", 1, None),
    ("tapo.mechanism", "control_updates", "ge", 1, None),
    ("tapo.mechanism", "min_grad_norm", "gt", 0, None),
    ("tapo.mechanism", "min_param_l2_change", "gt", 0, None),
    ("tapo.mechanism", "control_min_grad_norm", "gt", 0, None),
    ("tapo.mechanism", "control_min_param_l2_change", "gt", 0, None),
    ("tapo.mechanism", "nonfinite_steps", "eq", 0, None),
    ("tapo.mechanism", "zero_adv_not_rejected", "eq", 0, None),
    ("tapo.mechanism", "first_update_ratio_max_dev", "le", 1e-4, None),
]

# The dtypes each check is declared for (the mechanism's policy is float32 whatever is asked).
DTYPES = {
    "tapo.prefix_ratio_forward": ALL,
    "tapo.eq15_local_gradient": ALL,
    "tapo.masked_junk_invariance": ALL,
    "tapo.clip_schedule": ALL,
    "tapo.loss_forward": ALL,
    "tapo.on_policy_identity": ALL,
    "tapo.zero_advantage_rejection": (F64, F32),
    "tapo.split_invariance": ALL,
    "tapo.precision_agreement": ALL,
    "tapo.mechanism": (F32,),
}

# mutant -> the contracts that kill it (each one, on its own, in every declared dtype).
KILLED_BY = {
    "tapo.prefix_grad_leak": ("tapo.eq15_local_gradient", "tapo.on_policy_identity", "tapo.loss_forward"),
    "tapo.prefix_count_padding": ("tapo.prefix_ratio_forward", "tapo.loss_forward"),
    "tapo.grad_one_over_t": ("tapo.eq15_local_gradient", "tapo.on_policy_identity", "tapo.loss_forward"),
    "tapo.mask_by_multiply": ("tapo.masked_junk_invariance",),
    "tapo.lowp_cumsum": ("tapo.prefix_ratio_forward", "tapo.precision_agreement"),
    "tapo.ratio_detached": ("tapo.eq15_local_gradient", "tapo.mechanism"),
    "tapo.clip_reversed": ("tapo.clip_schedule", "tapo.loss_forward"),
    "tapo.clip_T_batch_max": ("tapo.split_invariance", "tapo.loss_forward"),
    "tapo.zero_adv_accepted": ("tapo.zero_advantage_rejection",),
    "tapo.zero_adv_counts_masked": ("tapo.zero_advantage_rejection",),
    "tapo.surrogate_optimistic": ("tapo.loss_forward",),
}

_OPS = {"le": operator.le, "lt": operator.lt, "ge": operator.ge, "gt": operator.gt, "eq": operator.eq}


def violations(check: str, dtype: str, measurements: dict) -> list[str]:
    """Every expectation of `check` in `dtype` that `measurements` break (NaN breaks any)."""
    bad = []
    for name, metric, op, threshold, dtypes in EXPECT:
        if name != check or (dtypes is not None and dtype not in dtypes):
            continue
        if metric not in measurements:
            bad.append(f"{metric} missing")
            continue
        value = measurements[metric]
        if isinstance(value, float) and math.isnan(value) or not _OPS[op](value, threshold):
            bad.append(f"{metric}={value!r} not {op} {threshold!r}")
    return bad
