"""Interface coverage (`contracts validate --coverage`, engine/spec/coverage.py): every promise a spec's interface
declares is exercised by some contract case, for all five specs; taking a case away opens the gap it closed, per
kind of promise; the report reads at 80 columns and as JSON; `exercises:` names only what the interface declares."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app
from engine.spec.coverage import CATEGORIES, float_dtypes, mask_forms, report, shape_forms
from engine.spec.loader import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = ("grpo", "gspo", "mrtpo", "tapo-trajectory", "tar-adaptive-replay", "dapo", "dr-grpo", "cispo", "gmpo", "gpg")
runner = CliRunner()


def _data(method: str) -> dict:
    return copy.deepcopy(load_spec(ROOT / "specs" / f"{method}.yaml", ROOT).data)


def _gaps(data: dict) -> set[str]:
    return {p.id for p in report(data).gaps}


def _contract(data: dict, cid: str) -> dict:
    return next(c for c in data["contracts"] if c["id"] == cid)


def _drop(data: dict, *cids: str) -> dict:
    data["contracts"] = [c for c in data["contracts"] if c["id"] not in cids]
    return data


# --- the suite holds every spec at 100% ---------------------------------------------------------------------------


def test_every_spec_exercises_every_declared_promise():
    r = runner.invoke(app, ["validate", "--coverage", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert sorted(c["method"] for c in doc["coverage"]) == sorted(SPECS)
    for c in doc["coverage"]:
        assert c["interface"] and c["promises"] > 15, c["method"]
        assert c["gaps"] == [] and c["percent"] == 100.0, (c["method"], [g["id"] for g in c["gaps"]])
        # every kind of promise is derived from some spec (none silently empty)
    seen = {cat for c in doc["coverage"] for cat in c["by_category"]}
    assert seen == set(CATEGORIES)


# --- each kind of promise: taking away the case that exercised it opens the gap ----------------------------------


def test_a_function_no_contract_calls_is_a_gap():
    data = _drop(_data("grpo"), "control_advantages_reference")
    assert "control_advantages" in _gaps(data)


def test_a_knob_only_passed_at_its_default_is_a_gap():
    data = _data("grpo")
    del _contract(data, "sampler_mask")["params"]["also"]
    assert _gaps(data) == {"response_mask(eos_id!=1)"}


def test_a_knob_judged_only_by_an_unjudged_accept_row_is_a_gap():
    data = _data("grpo")
    rows = _contract(data, "input_refusal")["params"]["accept"]
    for row in rows:
        if isinstance(row, dict) and row.get("arg") == "log_ratio_clamp":
            row.pop("reference", None), row.pop("tol", None)
    assert "grpo_loss(log_ratio_clamp!=20.0)" in _gaps(data)


def test_a_declared_default_no_judged_case_leaves_out_is_a_gap():
    data = _data("tapo-trajectory")
    data = _drop(data, "clip_closed_form")
    assert {"length_aware_clip(dtype=torch.float64)", "length_aware_clip(device=None)"} <= _gaps(data)


def test_a_declared_value_no_case_uses_is_a_gap():
    # scale_seq_mean runs the per-response mean at training sizes: it too uses the value
    data = _drop(_data("grpo"), "seq_mean_reference", "masked_junk", "kl_reference", "scale_seq_mean")
    assert "grpo_loss(agg='seq-mean-token-mean')" in _gaps(data)
    data = _drop(_data("gspo"), "token_form_reference", "masked_junk", "forms_agree")
    assert "gspo_loss(form='token')" in _gaps(data)


def test_a_shape_form_no_case_passes_is_a_gap():
    data = _data("grpo")
    cycle = _contract(data, "advantages_masked_junk")["params"]["inputs"]["tensors"]["mask"]["cycle"]
    cycle.pop()  # the [B] row flags
    data = _drop(data, "scale_advantages")  # the other case that passes [B] row flags, at training sizes
    assert "group_advantages(mask:[B])" in _gaps(data)


def test_a_dtype_no_contract_runs_in_is_a_gap():
    data = _data("grpo")
    _contract(data, "behaviour_logprobs_temperature")["dtypes"] = ["float64", "float32"]
    assert {"behaviour_logprobs[bfloat16]", "behaviour_logprobs[float16]"} <= _gaps(data)


def test_junk_no_case_plants_is_a_gap_per_shape_form():
    """The survivors: group_advantages refusing a NaN reward of a fully masked row, GSPO's sequence form refusing
    the NaN advantage of an empty response; each was a promise no case tried."""
    assert "group_advantages(rewards junk)" in _gaps(_drop(_data("grpo"), "advantages_masked_junk"))
    assert "gspo_loss(advantages:[B] junk)" in _gaps(_drop(_data("gspo"), "masked_junk_sequence"))
    data = _data("grpo")  # [B, L] junk is not [B] junk: the cycle with [B] advantages closed that one
    _contract(data, "masked_junk")["params"]["inputs"]["tensors"]["adv"] = {"shape": ["B", "L"], "dist": "normal"}
    assert _gaps(data) == {"grpo_loss(advantages:[B] junk)"}


def test_a_01_mask_convention_no_accept_row_tries_is_a_gap():
    data = _data("grpo")
    p = _contract(data, "advantages_refusal")["params"]
    p["accept"] = [r for r in p["accept"] if not (isinstance(r, dict) and r.get("arg") == "mask")]
    assert {"group_advantages(mask 0/1 float)", "group_advantages(mask 0/1 integer)"} <= _gaps(data)


def test_an_integer_only_01_argument_promises_the_integer_form_alone():
    data = _data("dapo")
    assert "dynamic_sampling_mask(correct 0/1 float)" not in {p.id for p in report(data).promises}
    _contract(data, "dynamic_sampling_reference")["params"]["inputs"]["tensors"]["correct"].pop("dtype")
    assert _gaps(data) == {"dynamic_sampling_mask(correct 0/1 integer)"}


def test_a_refusal_rule_no_row_tries_is_a_gap():
    data = _drop(_data("gspo"), "ratio_refusal")
    assert "sequence_ratio raises #1" in _gaps(data)
    data = _data("grpo")  # a row that refuses a mask without the declared word does not count for its rule
    rows = _contract(data, "input_refusal")["params"]["refuse"]
    for row in rows:
        for m in row if isinstance(row, list) else [row]:
            if m.get("match") == "mask":
                m.pop("match")
    assert "grpo_loss raises #1" in _gaps(data)


def test_a_metric_key_no_contract_reads_is_a_gap():
    data = _data("tar-adaptive-replay")
    also = _contract(data, "replay_loss_and_gradient")["params"]["also"]
    _contract(data, "replay_loss_and_gradient")["params"]["also"] = [a for a in also if a.get("key") != "weight_sum"]
    assert _gaps(data) == {"adaptive_replay_loss.weight_sum"}


def test_a_registered_check_counts_only_what_it_declares():
    data = _data("tar-adaptive-replay")
    _contract(data, "mechanism_run").pop("exercises")
    assert _gaps(data) == {"replay_rows"}  # only the mechanism run calls it, and says so


# --- the text it is derived from ----------------------------------------------------------------------------------


def test_dtype_and_shape_text_is_read_mechanically():
    assert float_dtypes("float16, bfloat16, float32 or float64") == {"float16", "bfloat16", "float32", "float64"}
    assert float_dtypes("floating (any)") == {"float16", "bfloat16", "float32", "float64"}
    assert float_dtypes("same as logp", {"logp": {"float32"}}) == {"float32"}
    assert float_dtypes("bool (or 0/1 of any real dtype)") == set()
    assert mask_forms({"dtype": "bool (or 0/1 of any real dtype)"}) == ("float", "integer")
    assert mask_forms({"dtype": "bool or integer 0/1"}) == ("integer",)  # a floating 0/1 tensor is refused there
    assert mask_forms({"dtype": "bool"}) == ()
    assert shape_forms("[B] or [B, L]") == ["[B]", "[B, L]"]
    assert shape_forms("[K] or [K, B] (or [K, 1])") == ["[K]", "[K, B]"]
    assert shape_forms("[B, L]") == []


def test_a_spec_without_an_interface_has_nothing_to_cover():
    data = _data("grpo")
    del data["interface"]
    r = report(data)
    assert not r.declared and r.promises == [] and r.percent == 100.0


# --- the command ----------------------------------------------------------------------------------------------------


def _folder_with(tmp_path: Path, edit) -> Path:
    d = tmp_path / "specs"
    d.mkdir()
    text = (ROOT / "specs" / "grpo.yaml").read_text()
    (d / "grpo.yaml").write_text(edit(text))
    return d


EOS3_CASE = ("    also:\n    - {function: response_mask, args: [responses], kwargs: {eos_id: {value: 3}}, reference: grpo.response_mask, "
             "prefix: eos3_}\n")
EOS3_EXPECT = "  - {metric: eos3_max_abs_err, le: 0.0, note: \"eos_id 3: the mask ends at the first 3\"}\n"


def test_gaps_exit_1_readable_at_80_columns_and_as_json(tmp_path):
    # the eos_id 3 case taken away: one gap
    def edit(text: str) -> str:
        assert EOS3_CASE in text and EOS3_EXPECT in text
        return text.replace(EOS3_CASE, "").replace(EOS3_EXPECT, "")

    d = _folder_with(tmp_path, edit)
    r = runner.invoke(app, ["validate", "--coverage", "--specs", str(d)])
    assert r.exit_code == 1, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("grpo: ") and "1 gap(s)" in lines[0]
    assert any("gap knob" in ln and "response_mask(eos_id!=1)" in ln for ln in lines)
    assert all(len(ln) <= 80 for ln in lines), max(lines, key=len)
    j = runner.invoke(app, ["validate", "--coverage", "--json", "--specs", str(d)])
    assert j.exit_code == 1
    (cov,) = json.loads(j.stdout)["coverage"]
    assert [g["id"] for g in cov["gaps"]] == ["response_mask(eos_id!=1)"]
    assert cov["gaps"][0]["category"] == "knob" and cov["gaps"][0]["by"] == []
    # validate without --coverage is unchanged: the spec is valid
    assert runner.invoke(app, ["validate", "--specs", str(d)]).exit_code == 0


def test_full_coverage_exits_0(tmp_path):
    d = _folder_with(tmp_path, lambda t: t)
    r = runner.invoke(app, ["validate", "--coverage", "--specs", str(d)])
    assert r.exit_code == 0, r.output
    assert "grpo: 100% of" in r.stdout


def test_exercises_names_only_interface_functions_keys_and_knobs(tmp_path):
    d = tmp_path / "specs"
    d.mkdir()
    shutil.copy(ROOT / "specs" / "grpo.yaml", d)
    text = (ROOT / "specs" / "tapo-trajectory.yaml").read_text()
    text = text.replace("exercises: [length_aware_clip, ", "exercises: [length_aware_clip, tapo_loss.no_such_key, "
                        "\"tapo_loss(eps_max)\", no_such_function, ")
    (d / "tapo-trajectory.yaml").write_text(text)
    r = runner.invoke(app, ["validate", str(d / "tapo-trajectory.yaml")])
    assert r.exit_code == 2
    err = r.output
    assert "tapo_loss returns no key 'no_such_key'" in err
    assert "tapo_loss has no argument 'eps_max' with a default" in err
    assert "exercises names no interface function 'no_such_function'" in err
    assert "tapo-trajectory.yaml:" in err and "$.contracts[" in err and ".exercises[" in err


@pytest.mark.parametrize("method", SPECS)
def test_each_spec_at_100_percent(method):
    r = report(_data(method))
    assert r.declared and not r.gaps, [g.id for g in r.gaps]
