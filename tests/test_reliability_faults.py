"""Implementations that misbehave: every fault is recorded in the receipt, and the run goes on.

A test-only method (`reliab_faulty`) is written to a temporary package and
registered at runtime; its spec is validated like any other (the validator
accepts names registered in the current process, engine.spec.registry.known_names).
Each contract hands the check one misbehaving function: NaN, inf, a raise,
the wrong shape, the wrong dtype, a sleep past the per-contract limit (also
one that swallows the alarm), sys.exit(); further checks return broken
measurements. The run must record each as `failed` or `error` with its
message, keep going to the last contract (which passes) and exit 3 (an error)
or 1 (failures only). NaN or inf never pass an expectation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from engine.cli import app
from engine.run.expect import evaluate
from engine.store.receipts import check_receipt
from engine.paths import project_root
from tests.toy_spec import registered_package, toy_spec

TIMEOUT_S = 0.3  # budget.per_contract_timeout_seconds of the test specs

FAULTY_PACKAGE = '''\
"""Test-only implementations that misbehave, each in one way (registered at runtime, never shipped)."""

import sys
import time

import torch

from engine.spec import registry


def good(x):
    return 2 * x


def nan(x):
    return torch.full_like(x, float("nan"))


def inf(x):
    return torch.full_like(x, float("inf"))


def raises(x):
    raise RuntimeError("implementation exploded on purpose")


def wrong_shape(x):
    return (2 * x)[:-1]


def wrong_dtype(x):
    return (2 * x).to(torch.float16)


def slow(x):
    time.sleep(30)
    return 2 * x


def swallows(x):
    try:
        time.sleep(30)
    except BaseException:  # catches the alarm itself and carries on past the limit
        pass
    return 2 * x


def retries(x):
    for _ in range(200):  # a retry loop: `except Exception` must not be able to eat the time limit
        try:
            time.sleep(0.05)
        except Exception:
            continue
    return 2 * x


def exits(x):
    sys.exit(7)


IMPL = registry.implementation("reliab_faulty", good=good, nan=nan, inf=inf, raises=raises,
                               wrong_shape=wrong_shape, wrong_dtype=wrong_dtype, slow=slow,
                               swallows=swallows, retries=retries, exits=exits)


def _value_check(fn_name):
    def check(impl, ctx):
        x = ctx.randn(8, g=ctx.generator())
        out = getattr(impl, fn_name)(x)
        return {"max_abs_err": (out.double() - 2 * x.double()).abs().max()}
    return check


for _name in IMPL.functions:
    registry.check(f"reliab_faulty.{_name}")(_value_check(_name))


@registry.check("reliab_faulty.nonscalar")
def nonscalar(impl, ctx):
    return {"max_abs_err": torch.zeros(3)}


@registry.check("reliab_faulty.notdict")
def notdict(impl, ctx):
    return [0.0]


@registry.check("reliab_faulty.text")
def text(impl, ctx):
    return {"max_abs_err": "small"}


@registry.check("reliab_faulty.inf_norm")
def inf_norm(impl, ctx):
    return {"grad_norm": float("inf")}  # passes `ge: 1` by IEEE rules; must not pass here


@registry.check("reliab_faulty.nan_count")
def nan_count(impl, ctx):
    return {"bad_tokens": float("nan")}


@registry.mutant("reliab_faulty.tripled", base="reliab_faulty")
def tripled():
    return IMPL.replace("reliab_faulty.tripled", good=lambda x: 3 * x)
'''

# contract id -> (check, expect, expected status, words the message must hold)
CONTRACTS = {
    "returns_nan": ("nan", "{metric: max_abs_err, le: 1.0e-12}", "failed", "nan"),
    "returns_inf": ("inf", "{metric: max_abs_err, le: 1.0e-12}", "failed", "inf"),
    "raises": ("raises", "{metric: max_abs_err, le: 1.0e-12}", "error", "RuntimeError: implementation exploded"),
    "wrong_shape": ("wrong_shape", "{metric: max_abs_err, le: 1.0e-12}", "error", "RuntimeError"),
    "wrong_dtype": ("wrong_dtype", "{metric: max_abs_err, le: 1.0e-12}", "failed", "max_abs_err"),
    "too_slow": ("slow", "{metric: max_abs_err, le: 1.0e-12}", "failed", "CheckTimeout"),
    "swallows_alarm": ("swallows", "{metric: max_abs_err, le: 1.0e-12}", "failed", "CheckTimeout"),
    "retry_loop": ("retries", "{metric: max_abs_err, le: 1.0e-12}", "failed", "CheckTimeout"),
    "calls_exit": ("exits", "{metric: max_abs_err, le: 1.0e-12}", "error", "SystemExit: 7"),
    "tensor_measurement": ("nonscalar", "{metric: max_abs_err, le: 1.0e-12}", "error", "not a scalar"),
    "not_a_dict": ("notdict", "{metric: max_abs_err, le: 1.0e-12}", "error", "not a dict"),
    "text_measurement": ("text", "{metric: max_abs_err, le: 1.0e-12}", "error", "not a number"),
    "infinite_norm": ("inf_norm", "{metric: grad_norm, ge: 1}", "failed", "inf"),
    "nan_count": ("nan_count", "{metric: bad_tokens, eq: 0}", "failed", "bad_tokens"),
    "still_runs_last": ("good", "{metric: max_abs_err, le: 1.0e-12}", "passed", ""),
}
FAILING_ONLY = ["returns_nan", "returns_inf", "wrong_dtype", "too_slow", "infinite_norm", "still_runs_last"]


def spec_text(key: str, contract_ids: list[str]) -> str:
    contracts = "".join(f"""\
  - id: {cid}
    description: "a misbehaving implementation or check: {cid}"
    formulas: [f1]
    kind: value
    tier: math
    check: reliab_faulty.{CONTRACTS[cid][0]}
    dtypes: [float64]
    cases: 1
    expect:
      - {CONTRACTS[cid][1]}
""" for cid in contract_ids)
    return toy_spec(
        key, "reliab_faulty", title="Test-only: implementations that misbehave", arxiv="2601.00002",
        budget={"max_seeds": 2, "max_wall_seconds": 120, "per_contract_timeout_seconds": TIMEOUT_S},
        formulas='  - {id: f1, latex: "y = 2x", implements: good}', contracts=contracts,
        mutants=f"""\
  - id: tripled
    description: "3x instead of 2x"
    mutant: reliab_faulty.tripled
    killed_by: [{", ".join(contract_ids)}]""")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    """The misbehaving method registered in this process for this module only; its specs in a folder."""
    base = tmp_path_factory.mktemp("faulty")
    specs = base / "specs"
    specs.mkdir()
    (specs / "reliab-faults.yaml").write_text(spec_text("reliab-faults", list(CONTRACTS)))
    (specs / "reliab-failing.yaml").write_text(spec_text("reliab-failing", FAILING_ONLY))
    with registered_package(base / "pkg", "reliab_faulty_pkg", FAULTY_PACKAGE):
        yield specs


def _check(specs: Path, key: str, receipts: Path):
    res = CliRunner().invoke(app, ["check", key, "--no-mutants", "--specs", str(specs), "--receipts", str(receipts),
                                   "--json"])
    (path,) = (receipts / key).glob("*.json")
    return res, json.loads(path.read_text()), path


def test_every_fault_is_recorded_with_its_message_and_the_run_goes_on(faulty, tmp_path):
    res, stmt, path = _check(faulty, "reliab-faults", tmp_path)
    assert res.exit_code == 3, res.output  # an `error` result outranks the failures
    assert "Traceback" not in res.output
    pred = stmt["predicate"]
    got = {r["contract"]: r for r in pred["results"]}
    assert list(got) == list(CONTRACTS), "every contract ran, in order, to the last one"
    for cid, (_, _, status, words) in CONTRACTS.items():
        r = got[cid]
        assert r["status"] == status, (cid, r["status"], r["message"])
        if status != "passed":
            assert r["message"] and words in r["message"], (cid, r["message"])
    assert pred["status"] == "error"
    assert pred["summary"]["results"] == {"passed": 1, "failed": 8, "error": 6}
    # a slow check is stopped at the limit, not when it chooses to return
    for cid in ("too_slow", "swallows_alarm", "retry_loop"):
        assert got[cid]["wall_s"] < TIMEOUT_S + 1.0, (cid, got[cid]["wall_s"])
    # NaN and inf stay visible in the receipt (as strings; strict JSON has none) and never count as a pass
    assert got["returns_nan"]["measurements"]["max_abs_err"] == "NaN"
    assert got["infinite_norm"]["expectations"][0]["passed"] is False
    assert check_receipt(path, project_root(), faulty).state in ("fresh", "stale")
    out = json.loads(res.stdout)["runs"][0]
    assert out["status"] == "error" and out["receipt_id"] == pred["receipt_id"]


def test_failures_without_errors_exit_1(faulty, tmp_path):
    res, stmt, _ = _check(faulty, "reliab-failing", tmp_path)
    assert res.exit_code == 1, res.output
    statuses = [r["status"] for r in stmt["predicate"]["results"]]
    assert statuses == ["failed"] * 5 + ["passed"]
    assert stmt["predicate"]["status"] == "failed"


# --- NaN and inf never pass -------------------------------------------------------------------

OPS = ("le", "lt", "ge", "gt", "eq")


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(op=st.sampled_from(OPS), threshold=st.floats(-1e300, 1e300),
       value=st.sampled_from([math.nan, math.inf, -math.inf, -math.nan]), dtype=st.sampled_from(["float32", "float64"]))
def test_a_non_finite_measurement_never_passes(op, threshold, value, dtype):
    record = evaluate({"metric": "m", op: threshold}, {"m": value}, dtype)
    assert record["passed"] is False
    assert record["margin"] is None or math.isfinite(record["margin"])


@settings(max_examples=200, derandomize=True, database=None, deadline=None)
@given(default=st.sampled_from(["rtol", "atol"]), value=st.sampled_from([math.nan, math.inf, -math.inf]),
       dtype=st.sampled_from(["float16", "bfloat16", "float32", "float64"]))
def test_a_non_finite_measurement_never_passes_a_dtype_default(default, value, dtype):
    assert evaluate({"metric": "m", "default": default}, {"m": value}, dtype)["passed"] is False
