"""A candidate cannot tell a check from real use: fresh seeds drawn at run time (and recorded, so a run reruns),
shapes that move with the seed, a scale tier at training sizes, and a sandbox that names no checker.

Each planted candidate is the fixture TAPO (tests/fixtures/my_tapo.py) with one edit: right while it believes it
is being checked (small inputs, or an environment that names the checker), wrong otherwise. Each must fail
`check --impl` under fresh seeds and score 0 in the evolve evaluator.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app
from tests.impl_support import METHOD, RATIO_RETURN, ROOT, variant

runner = CliRunner()

# Wrong only above the largest size any fixed-seed run of the math tier draws (2 x 4096 at most).
SIZE_TRIGGER = (RATIO_RETURN, "    if logp.numel() > 8192:\n        prefix = prefix * 1.01\n" + RATIO_RETURN)

# Right only where it sees what the old sandbox showed: a working folder /candidate, HOME=/tmp/home, argv[0] the
# call loop's file, a variable or a module name that names the checker, the checker's package beside it.
RECOGNISES = '''
import importlib.util as _u
import os as _os
import sys as _s


def _judged():
    names = " ".join([_os.getcwd(), _os.environ.get("HOME", ""), " ".join(_s.argv), __name__, " ".join(_os.environ),
                      _os.uname().nodename]).lower()
    here = set(_os.listdir(".")) | {e for p in _s.path if _os.path.isdir(p) for e in _os.listdir(p)}
    return any(w in names for w in ("candidate", "/tmp/home", "call_loop", "contracts", "check")) or \\
        any("contract" in e.lower() for e in here) or _u.find_spec("engine") is not None


_JUDGED = _judged()
'''
ENV_TRIGGER = (RATIO_RETURN, RATIO_RETURN + " * (1.0 if _JUDGED else 1.01)")


def invoke(*args: str):
    return runner.invoke(app, list(args))


def check(*args: str):
    return invoke("check", METHOD, *args)


def receipts_of(store: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted((store / METHOD).glob("*.json"))]


def cells(stmt: dict) -> dict[tuple, dict]:
    """(contract, seed, dtype) -> measurements (wall times are not measurements)."""
    return {(r["contract"], r["seed"], r["dtype"]): r["measurements"] for r in stmt["predicate"]["results"]}


def trimmed_specs(folder: Path, keep: set[str]) -> Path:
    """A specs folder whose TAPO spec holds only the contracts `keep` (and the mutants they kill): the evaluator's
    stages then run in seconds."""
    from ruamel.yaml import YAML

    yaml = YAML()
    data = yaml.load((ROOT / "specs" / f"{METHOD}.yaml").read_text())
    data["contracts"] = [c for c in data["contracts"] if c["id"] in keep]
    mutants = []
    for m in data["mutants"]:
        killers = [k for k in m["killed_by"] if k in keep]
        if killers:
            m["killed_by"] = killers
            mutants.append(m)
    data["mutants"] = mutants
    data.pop("evolve", None)
    folder.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    yaml.dump(data, buf)
    (folder / f"{METHOD}.yaml").write_text(buf.getvalue())
    return folder


# --- fresh seeds --------------------------------------------------------------------------------------------------


def test_fresh_seeds_are_drawn_at_run_time_recorded_and_rerun_to_the_same_measurements(tmp_path):
    store = tmp_path / "r"
    only = ("--only", "prefix_ratio_forward", "--only", "scale_prefix_ratio", "--no-mutants")
    r = check(*only, "--seeds", "fresh:2", "--receipts", str(store), "--json")
    assert r.exit_code == 0, r.output
    (first,) = receipts_of(store)
    req = first["predicate"]["request"]
    seeds = req["seeds"]
    assert req["seed_source"] == "fresh" and len(seeds) == 2 and set(seeds).isdisjoint({42, 43, 44})
    run = json.loads(r.stdout)["runs"][0]
    assert not run["coverage"]["full"] and any(w.startswith("fresh seeds ") for w in run["coverage"]["why"])
    # the rerun, from the seeds the receipt recorded: the same measurements, cell for cell
    r = check(*only, "--seeds", ",".join(map(str, seeds)), "--receipts", str(store), "--json")
    assert r.exit_code == 0, r.output
    second = next(s for s in receipts_of(store) if s["predicate"]["receipt_id"] != first["predicate"]["receipt_id"])
    assert second["predicate"]["request"]["seed_source"] == "given"
    assert cells(second) == cells(first) and len(cells(first)) == 2 * (4 + 2)
    # another fresh run draws other seeds (two draws of 2^32 colliding: about 1e-9)
    r = check(*only, "--seeds", "random", "--receipts", str(store))
    assert r.exit_code == 0, r.output
    assert "rerun with --seeds" in r.output and "seeds: fresh" in r.output
    third = [s for s in receipts_of(store) if s["predicate"]["request"]["seed_source"] == "fresh"]
    drawn = [s["predicate"]["request"]["seeds"] for s in third]
    assert len(drawn) == 2 and len(drawn[1]) == 3 and set(drawn[0]).isdisjoint(drawn[1])


def test_seed_words_are_refused_where_they_mean_nothing():
    r = check("--seeds", "fresh:0")
    assert r.exit_code == 2 and "fresh:3" in r.output
    r = check("--seeds", "sometimes")
    assert r.exit_code == 2 and "'fresh'" in r.output
    r = invoke("mutate", METHOD, "--seeds", "fresh")
    assert r.exit_code == 2 and "comma-separated list" in r.output


def test_fresh_seeds_mean_fresh_shapes_up_to_the_scale_tiers_sizes():
    """Every contract's dims move with the seed where the maths allows; the scale tier's reach training sizes."""
    from engine.kinds.inputs import _dim
    from engine.run.seeds import draw
    from engine.spec.loader import load_spec
    import torch

    sizes = {}
    for path in sorted((ROOT / "specs").glob("*.yaml")):
        data = load_spec(path, ROOT).data
        for c in data["contracts"]:
            dims = ((c.get("params") or {}).get("inputs") or {}).get("dims") or {}
            for name, spec in dims.items():
                if isinstance(spec, int):
                    assert (data["method"], c["id"], name) in FIXED, f"{data['method']} {c['id']}: {name} is fixed"
                    continue
                seen = {_dim(spec, torch.Generator().manual_seed(s)) for s in draw(32)}
                assert len(seen) > 1, f"{c['id']} {name}: {spec} drew {seen} on 32 fresh seeds"
                if c["tier"] == "scale":
                    sizes[data["method"], c["id"], name] = spec
    # every token-level scale contract reaches 36,001-45,000 slots a row
    longest = {k: v[1] for k, v in sizes.items() if k[2] in ("L", "T")}
    assert longest and all(v >= 45000 for v in longest.values()), longest
    assert {m for m, _c, _d in sizes} == {"grpo", "gspo", "tapo-trajectory", "tar-adaptive-replay", "dapo", "dr-grpo",
                                          "cispo", "gmpo", "gpg"}


# Dims that stay fixed, and why: a refusal contract's arguments name positions and values of its inputs; the rest
# is a property of the maths.
FIXED = {
    ("gspo", "ratio_refusal", "B"): "refusal cases name rows and positions",
    ("gspo", "ratio_refusal", "L"): "refusal cases name rows and positions",
    ("mrtpo", "js_chunked_reference", "N"): "not a shape: the chunk sizes 3 and 1 are drawn as N - 1 and N - 3",
    ("grpo", "input_refusal", "B"): "refusal cases name rows",
    ("grpo", "input_refusal", "L"): "refusal cases name positions",
    ("grpo", "advantages_refusal", "B"): "group_size 5 must not divide B",
    ("grpo", "advantages_refusal", "L"): "refusal cases name positions",
    ("grpo", "sampler_refusal", "B"): "refusal",
    ("grpo", "sampler_refusal", "T"): "refusal",
    ("grpo", "temperature_refusal", "B"): "refusal",
    ("grpo", "temperature_refusal", "T"): "refusal",
    ("grpo", "temperature_refusal", "V"): "refusal",
    ("gspo", "input_refusal", "B"): "refusal",
    ("gspo", "input_refusal", "L"): "refusal",
    ("gspo", "one_token_is_grpo", "L"): "one-token responses: the identity holds at L = 1",
    ("gmpo", "one_token_is_grpo", "L"): "one-token responses: the identity holds at L = 1",
    **{(m, c, d): "refusal cases name rows and positions" for m, c in (
        ("dapo", "input_refusal"), ("dr-grpo", "input_refusal"), ("cispo", "input_refusal"), ("gmpo", "input_refusal"),
        ("gmpo", "ratio_refusal"), ("gpg", "input_refusal"), ("dr-grpo", "advantages_refusal")) for d in ("B", "L")},
    ("dapo", "data_rules_refusal", "B"): "group_size 5 must not divide B",
    ("gpg", "advantages_refusal", "B"): "group_size 5 must not divide B",
    ("tapo-trajectory", "zero_advantage_rejection", "B"): "refusal cases name groups",
    ("tapo-trajectory", "zero_advantage_rejection", "L"): "refusal",
    ("tapo-trajectory", "input_validation", "B"): "refusal cases name rows",
    ("tapo-trajectory", "input_validation", "L"): "refusal cases name the longest response (6 of 7)",
    ("mrtpo", "input_checks", "K"): "refusal", ("mrtpo", "input_checks", "B"): "refusal",
    ("mrtpo", "input_checks", "T"): "refusal", ("mrtpo", "input_checks", "V"): "refusal",
    ("mrtpo", "input_checks", "N"): "refusal", ("mrtpo", "input_checks", "W"): "refusal",
    ("mrtpo", "logits_memory", "K"): "the page's scale, stated in the spec's memory assumption",
    ("mrtpo", "logits_memory", "B"): "the page's scale", ("mrtpo", "logits_memory", "T"): "the page's scale",
    ("mrtpo", "logits_memory", "V"): "the page's scale",
    ("mrtpo", "js_memory", "N"): "the page's scale (128 rows)", ("mrtpo", "js_memory", "V"): "the page's scale (150k)",
}


# --- a candidate that is right only where it recognises its check -------------------------------------------------


@pytest.fixture(scope="module")
def short_specs(tmp_path_factory):
    return trimmed_specs(tmp_path_factory.mktemp("specs"), {"prefix_ratio_forward", "loss_forward",
                                                            "scale_prefix_ratio", "scale_loss"})


def _sandboxed() -> None:
    from engine.run import sandbox

    if sandbox.unavailable():
        pytest.skip(sandbox.unavailable())


def test_a_size_triggered_candidate_fails_check_and_scores_zero(tmp_path, short_specs):
    from engine.evolve.evaluator import Evaluator

    cand = variant(tmp_path, "big_only.py", *SIZE_TRIGGER)
    store = tmp_path / "r"
    # the attack is real: every math contract holds on the budget's seeds and on others
    r = check("--impl", str(cand), "--tier", "math", "--only", "prefix_ratio_forward", "--only", "loss_forward",
              "--seeds", "7,1234567", "--no-mutants", "--no-sandbox", "--receipts", str(store), "--json")
    assert r.exit_code == 0, r.output
    r = check("--impl", str(cand), "--only", "prefix_ratio_forward", "--only", "scale_prefix_ratio", "--seeds",
              "fresh:1", "--no-mutants", "--no-sandbox", "--receipts", str(store), "--json")
    assert r.exit_code == 1, r.output
    by = {}
    for x in json.loads(r.stdout)["runs"][0]["results"]:
        by.setdefault(x["contract"], set()).add(x["status"])
    assert by == {"prefix_ratio_forward": {"passed"}, "scale_prefix_ratio": {"failed"}}
    ev = Evaluator(METHOD, specs=short_specs, receipts=tmp_path / "evolve", sandbox=False)
    assert ev.stage(1, str(cand)).metrics["combined_score"] == 0.5  # stage 1 is small by design
    result = ev.stage(2, str(cand))
    assert result.metrics["combined_score"] == 0.0, result.artifacts["verdict"]
    assert "scale_prefix_ratio" in result.artifacts["failures"] and "drawn fresh" in result.artifacts["verdict"]


def test_an_environment_triggered_candidate_fails_check_and_scores_zero(tmp_path, short_specs):
    """Right where it sees the checker (as the old sandbox showed it: /candidate, call_loop.py, the checker's
    packages): --no-sandbox runs the loop as call_loop.py, and there it passes; in the sandbox nothing names the
    checker, it takes its other branch and fails, in check --impl and in the evaluator."""
    from engine.evolve.evaluator import Evaluator

    _sandboxed()
    cand = variant(tmp_path, "env_only.py", *ENV_TRIGGER)
    cand.write_text(cand.read_text().replace("import torch\n", "import torch\n" + RECOGNISES, 1))
    store = tmp_path / "r"
    only = ("--only", "prefix_ratio_forward", "--no-mutants", "--receipts", str(store), "--json")
    r = check("--impl", str(cand), "--seeds", "fresh:1", "--no-sandbox", *only)
    assert r.exit_code == 0, r.output  # it recognises call_loop.py: right there
    r = check("--impl", str(cand), "--seeds", "fresh:1", *only)
    assert r.exit_code == 1, r.output
    assert {x["status"] for x in json.loads(r.stdout)["runs"][0]["results"]} == {"failed"}
    result = Evaluator(METHOD, specs=short_specs, receipts=tmp_path / "evolve", strict=False).stage(1, str(cand))
    assert result.metrics["combined_score"] == 0.0, result.artifacts["verdict"]
    assert "prefix_ratio_forward" in result.artifacts["failures"]


# --- honest bugs of the same shape ----------------------------------------------------------------------------


@pytest.mark.parametrize("method,mutant,contract", [
    ("grpo", "token_count_int16", "scale_token_mean"),
    ("grpo", "token_count_float16", "scale_seq_mean"),
    ("tapo-trajectory", "count_int16", "scale_prefix_ratio"),
    ("dapo", "token_count_int16", "scale_token_mean"),
    ("dr-grpo", "length_int16", "scale_sum_norm"),
    ("cispo", "token_count_float16", "scale_token_mean"),
    ("gmpo", "row_length_int16", "scale_loss"),
    ("gpg", "token_count_int16", "scale_token_mean"),
])
def test_a_count_kept_in_int16_fails_a_scale_contract(tmp_path, method, mutant, contract):
    """A token count kept in int16 (or float16): every math contract holds on it, a scale contract does not."""
    from engine.run.devices import resolve_device
    from engine.run.runner import Runner, plan_run
    from engine.spec import registry
    from engine.spec.loader import load_spec

    spec = load_spec(ROOT / "specs" / f"{method}.yaml", ROOT)
    m = next(x for x in spec.data["mutants"] if x["id"] == mutant)
    assert m["killed_by"] and all(spec.contract(c)["tier"] == "scale" for c in m["killed_by"])
    impl = registry.load().get_mutant(m["mutant"]).factory()
    runner = Runner(plan_run(spec, [42], [contract], mutants=False), resolve_device("cpu"))
    r = runner.call(impl, spec.contract(contract), 42, spec.contract(contract)["dtypes"][0], False)
    assert r["status"] == "failed", r
    good = runner.call(registry.load().get_implementation(spec.data["implementation"]), spec.contract(contract), 42,
                       spec.contract(contract)["dtypes"][0], False)
    assert good["status"] == "passed", good
