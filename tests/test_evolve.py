"""`contracts evolve-evaluator`: the OpenEvolve evaluator it writes, its cascade stages, its verdicts (read back from
receipts), and how candidates run (forked from a warm server, isolated).

The candidates are tests/fixtures/my_tapo.py (a correct plain-torch TAPO) and variants of it broken one way each.
OpenEvolve itself drives the evaluator in tests/test_evolve_openevolve.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app
from tests.impl_support import FIXTURE, METHOD, MISBEHAVING, RATIO_BODY, RATIO_RETURN, ROOT, variant

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def load_evaluator(path: Path):
    """The evaluator file as OpenEvolve loads it (importlib from its path)."""
    spec = importlib.util.spec_from_file_location(f"evaluation_module_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cell_counts() -> tuple[int, int, int]:
    """Seed x dtype cells stages 1, 2 and 3 need, counted from the spec as `contracts show` prints it: stage 1 is the
    eight value/gradient contracts on one seed (kinds reference_agreement, gradient_structure, ratio_overflow,
    closed_form, a bespoke value check), stage 2 every contract but the training runs (mechanism, learning), stage 3
    all of them; none of them a contract about how the registered implementation is built (applies_to: registered),
    which a candidate never runs."""
    spec = json.loads(invoke("show", METHOD, "--json").stdout)["spec"]
    seeds = len(spec["budget"]["seeds"])
    dtypes = {c["id"]: len(c["dtypes"]) for c in spec["contracts"] if c["applies_to"] == "any"}
    one = sum(dtypes[c] for c in STAGE_ONE)
    two = seeds * sum(n for c, n in dtypes.items() if c not in ("mechanism", "learning"))
    return one, two, seeds * sum(dtypes.values())


STAGE_ONE = ("prefix_ratio_forward", "eq15_local_gradient", "clip_closed_form", "clip_schedule", "loss_forward",
             "loss_edges", "overflow_gradient", "precision_agreement")


def receipts_in(store: Path) -> dict[str, dict]:
    """receipt id -> Statement, for every receipt in the store."""
    out = {}
    for f in (store / METHOD).glob("*.json"):
        stmt = json.loads(f.read_text())
        out[stmt["predicate"]["receipt_id"]] = stmt
    return out


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    folder = tmp_path_factory.mktemp("evolve")
    out = folder / "evaluator.py"
    r = invoke("evolve-evaluator", METHOD, "--out", str(out))
    assert r.exit_code == 0, r.output
    return load_evaluator(out), folder / "evolve-receipts", folder


# --- the done-when: a correct candidate above 0, the scaled one at 0 -------------------------------------------


def test_the_written_evaluator_scores_a_correct_candidate_above_zero_and_the_scaled_one_at_zero(evaluator, tmp_path):
    ev, store, _ = evaluator
    good = variant(tmp_path, "good.py")
    result = ev.evaluate(str(good))
    m, a = result.metrics, result.artifacts
    assert 0.9 <= m["combined_score"] <= 1.0 and m["stage3_passed"] == 1.0, a["verdict"]
    assert m["cells_passed"] == m["cells_total"] == cell_counts()[2]  # every contract, every dtype, seeds 42-44
    assert 0.0 <= m["score"] <= 1.0 and m["combined_score"] == pytest.approx(0.9 + 0.1 * m["score"])
    stmt = receipts_in(store)[a["receipt_id"]]
    assert {"name": "impl:good.py", "digest": {"sha256": hashlib.sha256(good.read_bytes()).hexdigest()}} in \
        stmt["subject"]
    assert stmt["predicate"]["status"] == "passed" and stmt["predicate"]["request"]["mutants"] == []
    assert str(tmp_path) not in json.dumps(stmt)

    scaled = variant(tmp_path, "scaled.py", RATIO_RETURN, RATIO_RETURN.replace("return prefix", "return 1.01 * prefix"))
    result = ev.evaluate(str(scaled))
    m, a = result.metrics, result.artifacts
    assert m["combined_score"] == 0.0 and m["stage3_passed"] == 0.0 and "score" not in m
    assert "prefix_ratio_forward" in a["verdict"]
    block = a["failures"].split("\n")
    assert block[0].startswith("prefix_ratio_forward (tapo-trajectory.yaml:")
    assert any("max_rel_err 0.01 > limit 1e-12" in line for line in block), a["failures"]
    records = json.loads(a["failures_json"])
    ratio = [r for r in records if r["contract"] == "prefix_ratio_forward" and r["dtype"] == "float64"]
    assert ratio and ratio[0]["metric"] == "max_rel_err" and ratio[0]["limit"] == 1e-12
    assert ratio[0]["measured"] == pytest.approx(0.01, rel=1e-6) and ratio[0]["receipt_id"] == a["receipt_id"]
    assert receipts_in(store)[a["receipt_id"]]["predicate"]["status"] == "failed"


# --- the cascade --------------------------------------------------------------------------------------------------


def test_each_stage_needs_the_stages_before_it_and_stage_three_reuses_their_receipts(tmp_path):
    """With the budget's seeds (seeds="budget") every stage runs on the same seeds, and stage 3 runs only what the
    stages before it did not."""
    from engine.evolve.evaluator import Evaluator

    store = tmp_path / "store"
    ev = Evaluator(METHOD, receipts=store, seeds="budget")
    good = variant(tmp_path, "staged.py")
    one, two, three = (ev.stage(k, str(good)) for k in (1, 2, 3))
    assert [r.metrics["combined_score"] for r in (one, two, three)][:2] == [0.5, 0.75]
    assert three.metrics["combined_score"] >= 0.9
    assert (one.metrics["cells_total"], two.metrics["cells_total"], three.metrics["cells_total"]) == cell_counts()
    by_id = receipts_in(store)
    ran = [sorted({r["contract"] for r in by_id[x.artifacts["receipt_id"]]["predicate"]["results"]})
           for x in (one, two, three)]
    assert ran[0] == sorted(STAGE_ONE)
    # stage 2: every contract a candidate is held to but the mechanism run (paired_control, arm_audit, gradient_audit
    # and reported_metrics_agree are kinds of their own); never fused_matches_composed (applies_to: registered)
    shown = json.loads(invoke("show", METHOD, "--json").stdout)["spec"]["contracts"]
    # nor the learning run (a trained policy, like the mechanism: stage 3)
    assert "mechanism" not in ran[1] and "learning" not in ran[1] and "fused_matches_composed" not in ran[1]
    assert ran[1] == sorted(c["id"] for c in shown
                            if c["applies_to"] == "any" and c["id"] not in ("mechanism", "learning"))
    assert ran[2] == ["learning", "mechanism"]  # stage 3 ran only what stages 1 and 2 had not: their receipts count
    assert set(three.artifacts["receipts"].split(", ")) == {x.artifacts["receipt_id"] for x in (one, two, three)}
    assert by_id[one.artifacts["receipt_id"]]["predicate"]["request"]["seeds"] == [42]


def test_by_default_every_candidate_and_stage_draws_fresh_seeds_and_keeps_the_earlier_stages_cells(evaluator,
                                                                                                     tmp_path):
    """Nobody knows a stage's seeds before it runs: each stage of each candidate draws its own from the operating
    system, records them in its receipt, and a later stage still needs the cells of the stages before it on their
    seeds (read back from their receipts, not run again)."""
    ev, store, _ = evaluator
    good = variant(tmp_path, "fresh.py")
    one, two = ev.evaluate_stage1(str(good)), ev.evaluate_stage2(str(good))
    assert [x.metrics["combined_score"] for x in (one, two)] == [0.5, 0.75], two.artifacts
    by_id = receipts_in(store)
    first, second = (by_id[x.artifacts["receipt_id"]]["predicate"]["request"] for x in (one, two))
    assert first["seed_source"] == second["seed_source"] == "fresh"
    assert len(first["seeds"]) == 1 and len(second["seeds"]) == 3 and first["seeds"][0] not in second["seeds"]
    assert set(first["seeds"] + second["seeds"]).isdisjoint({42, 43, 44}) and "drawn fresh" in two.artifacts["verdict"]
    # stage 2 needed stage 1's cells on stage 1's seed too, and read them from stage 1's receipt
    assert two.metrics["cells_total"] == one.metrics["cells_total"] + cell_counts()[1]
    assert one.artifacts["receipt_id"] in two.artifacts["receipts"].split(", ")
    other = ev.evaluate_stage1(str(variant(tmp_path, "other.py", "import torch\n", "import torch\n\n")))
    assert by_id.get(other.artifacts["receipt_id"]) is None  # a new candidate: a new receipt ...
    again = receipts_in(store)[other.artifacts["receipt_id"]]["predicate"]["request"]["seeds"]
    assert again != first["seeds"]  # ... on seeds of its own


def test_a_broken_stage_one_is_not_rescued_by_later_stages(evaluator, tmp_path):
    ev, _, _ = evaluator
    bad = variant(tmp_path, "optimistic.py", "surrogate = torch.minimum(", "surrogate = torch.maximum(")
    one = ev.evaluate_stage1(str(bad))
    assert one.metrics["combined_score"] == 0.0 and "loss_forward" in one.artifacts["failures"]
    # OpenEvolve with cascade thresholds of 0 would call stage 3 anyway: it still sees stage 1's broken cells
    three = ev.evaluate_stage3(str(bad))
    assert three.metrics["combined_score"] == 0.0 and "loss_forward" in three.artifacts["failures"]
    assert three.artifacts["receipt_id"] == one.artifacts["receipt_id"]  # nothing more was run for it


def test_a_broken_candidate_stops_at_its_first_broken_contract_cheapest_first(evaluator, tmp_path):
    """OpenEvolve without a cascade asks for every contract at once: a candidate that breaks a cheap one costs that
    one, not the mechanism runs, and its receipt requests only what ran and says why the rest did not."""
    ev, store, _ = evaluator
    bad = variant(tmp_path, "optimistic_all.py", "surrogate = torch.minimum(", "surrogate = torch.maximum(")
    res = ev.evaluate(str(bad))
    assert res.metrics["combined_score"] == 0.0 and "loss_forward" in res.artifacts["failures"]
    pred = receipts_in(store)[res.artifacts["receipt_id"]]["predicate"]
    ran = list(dict.fromkeys(r["contract"] for r in pred["results"]))
    spec = json.loads(invoke("show", METHOD, "--json").stdout)["spec"]
    held = [c for c in spec["contracts"] if c["applies_to"] == "any"]
    stop = pred["isolation"]["stopped_early"]
    assert stop["broken"] == "loss_forward" == ran[-1] and "mechanism" in stop["not_run"]
    assert sorted(ran + stop["not_run"]) == sorted(c["id"] for c in held)
    # the receipt never reads as a run that left contracts out
    assert sorted(pred["request"]["only"]) == sorted(pred["request"]["contracts"]) == sorted(ran)
    kinds = {c["id"]: c["kind"] for c in held}
    assert all(kinds[c] != "mechanism" for c in ran)


# --- verdicts come from the receipt files -------------------------------------------------------------------------


def test_an_edited_receipt_never_counts(evaluator, tmp_path):
    ev, store, _ = evaluator
    good = variant(tmp_path, "edited.py")
    first = ev.evaluate_stage1(str(good))
    assert first.metrics["combined_score"] == 0.5
    path = next(f for f in (store / METHOD).glob("*.json") if first.artifacts["receipt_id"][:12] in f.name)
    path.write_text(path.read_text().replace('"status": "passed"', '"status": "passed" '))
    second = ev.evaluate_stage1(str(good))
    assert "tampered" in second.artifacts["evidence_refused"], second.artifacts
    assert second.metrics["combined_score"] == 0.5 and second.artifacts["receipt_id"] != first.artifacts["receipt_id"]


def test_under_a_trust_policy_only_signed_receipts_count(tmp_path):
    from engine.evolve.evaluator import Evaluator

    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("runner", "other"):
        assert invoke("keys", "generate", str(keys / name)).exit_code == 0
    policy = keys / "trust.yaml"
    policy.write_text("keys:\n  - public_key: runner.pub\n    devices: [cpu]\n")
    good = variant(tmp_path, "signed.py")
    store = tmp_path / "store"
    trusted = Evaluator(METHOD, receipts=store, sign_key=keys / "runner", trust=policy).stage(1, str(good))
    assert trusted.metrics["combined_score"] == 0.5, trusted.artifacts
    raw = json.loads(next((store / METHOD).glob("*.json")).read_text())
    assert raw["payloadType"] and raw["signatures"]  # a DSSE envelope
    other = Evaluator(METHOD, receipts=tmp_path / "store2", sign_key=keys / "other", trust=policy).stage(1, str(good))
    assert other.metrics["combined_score"] == 0.0 and "untrusted key" in other.artifacts["evidence_refused"]
    assert "no usable receipt" in other.artifacts["not_checked"]


# --- candidates run isolated, in workers forked from the warm server ------------------------------------------------


@pytest.mark.parametrize("kind", sorted(MISBEHAVING))
def test_a_misbehaving_candidate_scores_zero_and_the_next_one_runs_in_a_fresh_worker(tmp_path, kind):
    from engine.evolve.evaluator import Evaluator

    code, says = MISBEHAVING[kind]
    # not strict: the screen would refuse these imports before they run (tests/test_sandbox.py); here, how they run
    ev = Evaluator(METHOD, receipts=tmp_path / "store", timeout_s=4, strict=False)
    bad = variant(tmp_path, f"{kind}.py", RATIO_BODY, "    " + code + RATIO_BODY)
    r = ev.stage(1, str(bad))
    assert r.metrics["combined_score"] == 0.0
    assert says in r.artifacts["failures"], r.artifacts["failures"]
    # the first cell that loses the candidate's process costs one deadline: the unit's other cells are not run, and
    # the candidate's run stops at that contract, the cheapest first (isolation.stopped_early)
    assert "not run: an earlier call of this unit lost its candidate process" in r.artifacts["failures"] or kind in (
        "sys_exit",)  # sys.exit inside a check is caught there: the worker lives on
    pred = receipts_in(tmp_path / "store")[r.artifacts["receipt_id"]]["predicate"]
    ran = list(dict.fromkeys(x["contract"] for x in pred["results"]))
    assert ran == ["prefix_ratio_forward"] and pred["isolation"]["stopped_early"]["broken"] == "prefix_ratio_forward"
    assert "not run: an earlier call of this candidate lost its worker" not in r.artifacts["failures"]
    good = ev.stage(1, str(variant(tmp_path, "after.py")))
    assert good.metrics["combined_score"] == 0.5, good.artifacts


def test_a_candidate_that_changes_global_state_leaves_the_next_one_untouched(tmp_path):
    from engine.evolve.evaluator import Evaluator

    ev = Evaluator(METHOD, receipts=tmp_path / "store")
    meddling = variant(tmp_path, "meddling.py", "import torch\n",
                       "import torch\n\ntorch.set_default_dtype(torch.float16)\ntorch.cumsum = lambda *a, **k: 0\n")
    assert ev.stage(1, str(meddling)).metrics["combined_score"] == 0.0
    good = ev.stage(1, str(variant(tmp_path, "clean.py")))
    assert good.metrics["combined_score"] == 0.5, good.artifacts


def test_a_candidate_without_a_function_scores_zero_and_says_which(evaluator, tmp_path):
    ev, _, _ = evaluator
    text = FIXTURE.read_text()
    cand = tmp_path / "missing.py"
    cand.write_text(text[:text.index("def length_aware_clip")] + text[text.index("def tapo_loss"):])
    r = ev.evaluate_stage1(str(cand))
    assert r.metrics["combined_score"] == 0.0
    assert "has no function length_aware_clip" in r.artifacts["not_checked"]


def test_warm_and_cold_workers_measure_the_same(evaluator, tmp_path, monkeypatch):
    from engine.run import isolation, warm

    ev, store, _ = evaluator
    good = variant(tmp_path, "same.py")
    warm_id = ev.evaluate_stage1(str(good)).artifacts["receipt_id"]
    (seed,) = receipts_in(store)[warm_id]["predicate"]["request"]["seeds"]  # drawn fresh: rerun from the receipt
    # `check --impl` forks its workers from a warm server too; a fresh `python` each is what it falls back to
    monkeypatch.setattr(warm, "warm_or_cold", isolation._Worker)
    cold = tmp_path / "cold"
    ran = receipts_in(store)[warm_id]["predicate"]["request"]["contracts"]  # stage 1's: the value/gradient ones
    assert sorted(ran) == sorted(STAGE_ONE)
    only = [x for c in ran for x in ("--only", c)]
    r = invoke("check", METHOD, "--impl", str(good), "--seeds", str(seed), "--no-mutants", "--receipts", str(cold),
               "--json", "--no-sandbox", *only)
    assert r.exit_code == 0, r.output
    measured = lambda stmt: {(x["contract"], x["dtype"]): x["measurements"]  # noqa: E731
                             for x in stmt["predicate"]["results"]}
    (cold_stmt,) = receipts_in(cold).values()
    assert measured(receipts_in(store)[warm_id]) == measured(cold_stmt)


# --- the verb ------------------------------------------------------------------------------------------------------


def test_the_verb_writes_an_evaluator_once_and_refuses_bad_options(tmp_path):
    out = tmp_path / "ev.py"
    r = invoke("evolve-evaluator", METHOD, "--out", str(out), "--seeds", "42", "--impl-timeout", "5", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["stages"]["evaluate_stage2"].endswith("on seed 42") and data["options"]["timeout_s"] == 5.0
    module = load_evaluator(out)
    assert {"evaluate", "evaluate_stage1", "evaluate_stage2", "evaluate_stage3"} <= set(dir(module))
    assert module.EVALUATOR.seeds == [42] and module.EVALUATOR.timeout_s == 5.0
    assert module.EVALUATOR.receipts_dir == tmp_path / "evolve-receipts"
    again = invoke("evolve-evaluator", METHOD, "--out", str(out))
    assert again.exit_code == 2 and "--force" in again.stderr
    assert invoke("evolve-evaluator", METHOD, "--out", str(out), "--force").exit_code == 0
    for args, says in ((["--out", str(tmp_path / "x.txt")], ".py"), (["--out", str(out), "--seeds", "x"], "--seeds"),
                       (["--out", str(tmp_path / "y.py"), "--impl-timeout", "0"], "--impl-timeout"),
                       (["--out", str(tmp_path / "y.py"), "--trust", str(tmp_path / "none.yaml")], "none.yaml")):
        bad = invoke("evolve-evaluator", METHOD, *args)
        lines = [ln for ln in bad.stderr.splitlines() if ln.strip()]
        assert bad.exit_code == 2 and len(lines) == 1 and says in lines[0], (args, bad.output)
    assert invoke("evolve-evaluator", "no-such-method", "--out", str(tmp_path / "z.py")).exit_code == 2


def test_the_verb_does_not_import_torch(tmp_path):
    code = ("import sys; from engine.cli import app; from typer.testing import CliRunner; "
            f"r = CliRunner().invoke(app, ['evolve-evaluator', 'tapo-trajectory', '--out', {str(tmp_path / 'e.py')!r}]); "
            "assert r.exit_code == 0, r.output; assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_spec_score_must_name_a_contract_and_an_increasing_range(tmp_path):
    specs = tmp_path / "specs"
    specs.mkdir()
    text = (ROOT / "specs" / f"{METHOD}.yaml").read_text()
    for old, new, path in (("    contract: mechanism\n    metric: tapo_val_acc", "    contract: mechanismm\n    metric: "
                            "tapo_val_acc", "$.evolve.score.contract"),
                           ("    range: [0.0, 1.0]", "    range: [1.0, 0.0]", "$.evolve.score.range")):
        assert text.count(old) == 1
        (specs / f"{METHOD}.yaml").write_text(text.replace(old, new))
        r = invoke("validate", "--specs", str(specs))
        assert r.exit_code == 2 and path in r.output, r.output


# --- the score, as a function of the evidence -----------------------------------------------------------------------


def test_combined_score_orders_broken_below_partial_below_complete():
    from engine.evolve import score as SC

    spec = {"contracts": [{"id": "v", "kind": "value", "dtypes": ["float64"]},
                          {"id": "mech", "kind": "mechanism", "dtypes": ["float32"]}],
            "budget": {"seeds": [1, 2]},
            "evolve": {"score": {"contract": "mech", "metric": "acc", "range": [0.0, 0.5], "higher_is_better": True}}}

    def ev(rows):
        return [SC.Evidence("f", "rid", {"results": [
            {"contract": c, "seed": s, "dtype": d, "status": st, "measurements": {"acc": acc}}
            for c, s, d, st, acc in rows]})]

    ok = [("v", 1, "float64", "passed", 0), ("v", 2, "float64", "passed", 0),
          ("mech", 1, "float32", "passed", 0.1), ("mech", 2, "float32", "passed", 0.9)]
    full = SC.judge(spec, 3, ev(ok))
    raw, unit, problem = SC.spec_score(spec, ev(ok))
    assert full.holds and raw == pytest.approx(0.5) and unit == 1.0 and problem is None  # clamped at the top
    assert SC.combined(3, full, unit, declared=True) == 1.0
    assert SC.combined(1, SC.judge(spec, 1, ev(ok[:1])), None) == 0.5
    broken = SC.judge(spec, 3, ev(ok[:3] + [("mech", 2, "float32", "failed", 0.9)]))
    assert not broken.holds and SC.combined(3, broken, unit, declared=True) == 0.0
    partial = SC.judge(spec, 3, ev(ok[:3]))
    assert partial.missing == [("mech", 2, "float32")] and SC.combined(3, partial, None, declared=True) == 0.0
    spec["evolve"]["score"]["higher_is_better"] = False
    assert SC.spec_score(spec, ev(ok))[1] == 0.0
    assert SC.spec_score(spec, ev(ok[:3]))[2].startswith("evolve.score: contract mech reported no finite 'acc'")


def test_the_warm_workers_environment_holds_no_secrets(tmp_path, monkeypatch):
    from engine.evolve.evaluator import Evaluator
    from engine.run import warm

    warm.shutdown()  # a server starts with the environment of its start: make it start among secrets to scrub
    for name, value in (("CONTRACTS_SIGNING_KEY", str(tmp_path / "no-key")), ("HF_TOKEN", "hf_secret_token_value"),
                        ("OPENAI_API_KEY", "sk-secret-value")):
        monkeypatch.setenv(name, value)
    warm.start()
    monkeypatch.delenv("CONTRACTS_SIGNING_KEY")  # what signs receipts is not the question here
    peek = ("import os\n    seen = [k for k in os.environ if 'KEY' in k or 'TOKEN' in k]\n"
            "    raw = open('/proc/self/environ', 'rb').read()\n"
            "    if seen or b'secret' in raw:\n        raise RuntimeError(f'saw secrets: {seen}')\n")
    cand = variant(tmp_path, "peek.py", "    if isinstance(T, bool)", "    " + peek + "    if isinstance(T, bool)")
    r = Evaluator(METHOD, receipts=tmp_path / "store", strict=False).stage(1, str(cand))  # the screen refuses os
    assert r.metrics["combined_score"] == 0.5, r.artifacts
    leaky = variant(tmp_path, "leaky.py", "    if isinstance(T, bool)", "    " + peek.replace("'KEY' in k or ", "")
                    .replace("b'secret' in raw", "'PATH' in os.environ") + "    if isinstance(T, bool)")
    r = Evaluator(METHOD, receipts=tmp_path / "store", strict=False).stage(1, str(leaky))
    assert r.metrics["combined_score"] == 0.0 and "saw secrets" in r.artifacts["failures"]  # the peek can see
