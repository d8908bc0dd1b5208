"""Every rule a candidate implementation is held to, generated from the spec's contracts (torch-free).

`contracts interface METHOD` prints these beside the functions, so what an implementer reads is exactly what the
checks hold them to: per contract that applies to a candidate, the call it makes, its dtypes and cases, each
expectation (metric, comparison, threshold, dtype, the kind's meaning of the metric and the spec's note; an
equality is exact, bit for bit), and its parameters (the inputs it draws, the keys it compares, the refusals it
expects, the memory unit and operation limits of a budget); the limits every check runs under (seeds, the
per-call deadline, the run's wall time, a candidate's memory, the training budget); and the contracts a candidate
is not held to (`applies_to: registered`), with why.
"""

from __future__ import annotations

import math
from typing import Any

from engine.spec.applies import REGISTERED, applies_to, for_candidates

SYMBOLS = {"le": "<=", "lt": "<", "ge": ">=", "gt": ">", "eq": "="}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def number(v: Any) -> str:
    """A threshold as written in the spec: 1e-12, 0.5, 4, true."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else str(v)
    return str(v)


def expectation_text(e: dict) -> str:
    """`max_rel_err <= 1e-12 for float64`: one expectation as the rule it states."""
    op = next((k for k in SYMBOLS if k in e), None)
    if op is None:
        text = f"{e['metric']} <= the dtype's default {e.get('default')}"
    else:
        text = f"{e['metric']} {SYMBOLS[op]} {number(e[op])}"
    return text + (f" for {e['dtype']}" if e.get("dtype") else "")


def _meanings(kind: str) -> dict[str, str]:
    from engine.kinds.base import all_kinds

    k = all_kinds().get(kind)
    return dict(k.metrics) if k is not None else {}


def _meaning(metric: str, meanings: dict[str, str]) -> str:
    if metric in meanings:
        return meanings[metric]
    for pattern, text in meanings.items():  # PREFIX_max_abs_err, KEY_abs_err
        if pattern.isupper() or "_" not in pattern:
            continue
        if pattern.startswith(("KEY_", "PREFIX")) and metric.endswith(pattern.split("_", 1)[1]):
            return text
    for base, text in meanings.items():
        if metric.endswith("_" + base):  # an `also:` call's metric: ratio_max_abs_err
            return f"{text} (the {metric[: -len(base) - 1]} call)"
    return ""


def _exact(e: dict) -> str:
    """What an equality demands: 0 of an error or a difference is exact agreement, bit for bit."""
    if "eq" not in e:
        return ""
    m = e["metric"]
    if e["eq"] == 0 and any(w in m for w in ("diff", "err", "_abs", "nan", "nonfinite", "violation", "mismatch")):
        return "exactly: bit for bit" if any(w in m for w in ("diff", "err", "_abs")) else "exactly: none"
    return "exactly"


def call_text(params: dict) -> str:
    """`tapo_loss(logp, old_logp, adv, mask, 0.1, 0.2)`: the call a contract makes, with its literals."""
    if "function" not in params or "args" not in params:
        return ""

    def arg(a: Any) -> str:
        return repr(a["value"]) if isinstance(a, dict) and "value" in a else str(a)

    args = [arg(a) for a in params.get("args") or []]
    args += [f"{k}={arg(v)}" for k, v in (params.get("kwargs") or {}).items()]
    return f"{params['function']}({', '.join(args)})"


def _unit_bytes(params: dict) -> str | None:
    """A budget's unit in bytes where the spec fixes its shape: `[N, V] = [128, 150000] float32: 76800000 bytes`."""
    unit = params.get("unit")
    inputs = params.get("inputs") or {}
    if not isinstance(unit, dict):
        return None
    spec = (inputs.get("tensors") or {}).get(unit.get("input"))
    dims = inputs.get("dims") or {}
    if not isinstance(spec, dict) or "shape" not in spec:
        return f"one tensor shaped like input {unit.get('input')} in {unit.get('dtype')}"
    shape = spec["shape"]
    sizes = [d if isinstance(d, int) else dims.get(d) for d in shape]
    named = "[" + ", ".join(str(d) for d in shape) + "]"
    if all(isinstance(x, int) for x in sizes):
        n = math.prod(sizes) * DTYPE_BYTES.get(unit.get("dtype"), 0)
        return (f"one {named} = [{', '.join(map(str, sizes))}] {unit.get('dtype')} tensor (input {unit.get('input')}): "
                f"{n} bytes")
    return f"one {named} {unit.get('dtype')} tensor (input {unit.get('input')}), dims as drawn per case"


def rules(data: dict) -> tuple[dict, ...]:
    """One rule per contract a candidate is held to, in spec order."""
    seeds = list((data.get("budget") or {}).get("seeds") or [])
    out = []
    for c in for_candidates(data.get("contracts") or []):
        meanings = _meanings(c["kind"])
        params = dict(c.get("params") or {})
        expect = []
        for e in c["expect"]:
            expect.append({"rule": expectation_text(e), "metric": e["metric"],
                           **{k: e[k] for k in ("le", "lt", "ge", "gt", "eq", "default", "dtype") if k in e},
                           "meaning": _meaning(e["metric"], meanings), "exact": _exact(e),
                           "note": e.get("note", "")})
        rule = {"contract": c["id"], "kind": c["kind"], "tier": c.get("tier", "math"),
                "description": c["description"], "call": call_text(params), "dtypes": list(c["dtypes"]),
                "cases": c["cases"], "seeds": seeds, "expect": expect, "params": params}
        if c["kind"] == "budget" and any(e["metric"] == "peak_memory_ratio" for e in c["expect"]):
            rule["unit"] = _unit_bytes(params) or "the bytes of all tensor inputs"
        if c["kind"] == "budget" and "max_ops" in params:
            rule["max_ops"] = params["max_ops"]
        if c.get("why"):
            rule["why"] = c["why"]
        out.append(rule)
    return tuple(out)


def registered_only(data: dict) -> tuple[dict, ...]:
    """The contracts a candidate is not held to, with why (their `why:`, else their description)."""
    return tuple({"contract": c["id"], "why": c.get("why") or c["description"]}
                 for c in data.get("contracts") or [] if applies_to(c) == REGISTERED)


def limits(data: dict) -> dict:
    """What every check of a candidate runs under: the budget's seeds and limits, the engine's candidate limits."""
    from engine.run.candidate_limits import DEFAULT_MEMORY_MB

    b = data.get("budget") or {}
    return {"seeds": list(b.get("seeds") or []), "max_seeds": b.get("max_seeds"),
            "per_contract_timeout_seconds": b.get("per_contract_timeout_seconds") or 60,
            "max_wall_seconds": b.get("max_wall_seconds"),
            "max_updates_per_seed": b.get("max_updates_per_seed"), "max_tokens_per_seed": b.get("max_tokens_per_seed"),
            "candidate_memory_mib": DEFAULT_MEMORY_MB}


def limit_lines(lim: dict) -> list[str]:
    """The limits as sentences."""
    seeds = ", ".join(map(str, lim["seeds"]))
    out = [f"seeds: {seeds} (the budget's; check --seeds may name up to {lim['max_seeds']}); every contract runs "
           "each dtype it lists on every seed, its cases drawn fresh from the seed",
           f"deadline: one check call (a contract on one seed and one dtype) within "
           f"{number(lim['per_contract_timeout_seconds'])} s (per_contract_timeout_seconds; --impl-timeout sets "
           "it for a candidate): past it the candidate's process is killed and the call is an error",
           f"wall time: the whole run within {number(lim['max_wall_seconds'])} s (max_wall_seconds)",
           f"memory: a candidate's process may map {lim['candidate_memory_mib']} MiB beyond its imports on the CPU "
           "(--impl-memory-mb); a budget contract below states the peak extra memory of a call against its unit",
           f"training: at most {lim['max_updates_per_seed']} optimizer updates and {lim['max_tokens_per_seed']} "
           "sampled tokens per seed (mechanism runs)"]
    return out


def rule_lines(rule: dict, indent: str = "    ") -> list[str]:
    """One contract's rule as text lines: header, statement, each expectation, its parameters as YAML."""
    from engine.yamltext import lines as yaml_lines

    head = f"contract {rule['contract']} ({rule['kind']}, {rule['tier']})"
    if rule["call"]:
        head += f": {rule['call']}"
    out = [head, f"{indent}{rule['description']}",
           f"{indent}dtypes {', '.join(rule['dtypes'])}; {rule['cases']} case(s) a seed and dtype"]
    if rule.get("why"):
        out.append(f"{indent}a registered check (no generic kind states it): {rule['why']}")
    for e in rule["expect"]:
        extra = "; ".join(x for x in (e["exact"], e["meaning"], e["note"]) if x)
        out.append(f"{indent}holds {e['rule']}" + (f" ({extra})" if extra else ""))
    if rule.get("unit"):
        out.append(f"{indent}memory unit: {rule['unit']}")
    if rule.get("max_ops"):
        out.append(f"{indent}operation limit: {rule['max_ops']} ATen operations a call (past it the call is stopped "
                   "and counted in ops_over_limit_cases)")
    if rule["params"]:
        out.append(f"{indent}parameters:")
        out += yaml_lines(rule["params"], width=100, indent=indent + "    ")
    return out
