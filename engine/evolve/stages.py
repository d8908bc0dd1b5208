"""Which contract cells (contract, seed, dtype) each OpenEvolve cascade stage needs before it can pass.

Each stage needs everything the stages before it needed, so a stage's verdict
never rests on a stage that did not run:

  1  the value and gradient contracts of the math tier, on the first seed (cheap, catches most broken candidates);
  2  every contract except the training runs (mechanism and learning), the scale tier included, on every seed;
  3  every contract, training runs included, on every seed: the whole check, and the spec's score.

The seeds are the evaluator's: by default drawn fresh from the operating system for every candidate and stage
(engine/evolve/evaluator.py), so a stage's cells name that stage's seeds.

A candidate is never held to a contract marked `applies_to: registered` (engine/spec/applies.py): no stage needs it.

`evaluate()` (OpenEvolve without a cascade) needs what stage 3 needs.
"""

from __future__ import annotations

# A contract's kind (engine/kinds) or, for a bespoke check, its legacy label: the value and gradient ones.
STAGE1_KINDS = ("value", "gradient", "reference_agreement", "gradient_structure", "closed_form", "ratio_overflow")
MECHANISM = "mechanism"
TRAINING = (MECHANISM, "learning")  # kinds that train policies: the costliest cells, judged last
STAGES = (1, 2, 3)
FULL = 3

Cell = tuple  # (contract id, seed, dtype)


def _in_stage(contract: dict, stage: int) -> bool:
    from engine.spec.applies import REGISTERED, applies_to

    if applies_to(contract) == REGISTERED:  # tests how the registered implementation is built: never a candidate's
        return False
    if stage == 1:  # the scale tier's cases are large: stage 2 runs them, once stage 1 holds
        return contract["kind"] in STAGE1_KINDS and contract.get("tier", "math") != "scale"
    if stage == 2:
        return contract["kind"] not in TRAINING
    return True


def cost_rank(contract: dict) -> int:
    """Cheap contracts first: stage 1's value and gradient checks, then the rest of the math tier, then the large
    cases of the scale tier, the mechanism runs (trained policies) last. Sorting by it is stable: the spec's order
    decides within a rank."""
    if contract["kind"] in TRAINING:
        return 3
    if contract.get("tier", "math") == "scale":
        return 2
    return 0 if contract["kind"] in STAGE1_KINDS else 1


def seeds_for(spec_data: dict, stage: int, seeds: list[int] | None = None) -> list[int]:
    """The seeds a stage runs: `seeds` (default the budget's), only the first for stage 1."""
    seeds = list(seeds or spec_data["budget"]["seeds"])
    return seeds[:1] if stage == 1 else seeds


def cells(spec_data: dict, stage: int, seeds: list[int] | None = None) -> list[Cell]:
    """Every cell stage `stage` needs, in the spec's contract order."""
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r}: OpenEvolve's cascade has stages {', '.join(map(str, STAGES))}")
    out: list[Cell] = []
    for c in spec_data["contracts"]:
        if _in_stage(c, stage):
            out += [(c["id"], s, d) for s in seeds_for(spec_data, stage, seeds) for d in c["dtypes"]]
    return out


def describe(spec_data: dict, stage: int, seeds: list[int] | None = None) -> str:
    """`value and gradient contracts (4) on seed 42`: what a stage runs, for messages and artifacts."""
    ids = contract_ids(spec_data, stage, seeds)
    what = {1: "value and gradient contracts", 2: "every contract but the mechanism runs", 3: "every contract"}[stage]
    seeds = seeds_for(spec_data, stage, seeds)
    return f"{what} ({len(ids)}) on seed{'s' if len(seeds) > 1 else ''} {','.join(map(str, seeds))}"


def contract_ids(spec_data: dict, stage: int, seeds: list[int] | None = None) -> list[str]:
    return list(dict.fromkeys(cid for cid, _s, _d in cells(spec_data, stage, seeds)))
