"""A verified receipt as the reading verbs need it: a few hundred bytes instead of the receipt's 300 KB.

`list`, `show`, `gate` and the TUI's Gate tab read a receipt through its typed record (engine/store/records.py):
per contract, seed and dtype a status (and a message when it did not pass), which mutants it killed and which
contracts killed some, the comparisons of its mechanism runs (their values, without the step records), the
mutation score of a `contracts mutate` run, its device, seeds, git state, implementation, bound files, and the
few facts coverage needs (engine/store/coverage.py). `of(statement)` keeps exactly that and `receipt(...)` turns it
back into the same `Receipt` that `Receipt.from_statement` makes from the whole Statement
(tests/test_store_index.py checks the two are equal on every committed receipt).

The large, repetitive parts (the results table, the mutant verdicts, the contracts proven, the mechanism
comparisons, the subject list, the coverage facts) are "parts": kept once per index however many receipts share
them (most runs of one method share a subject list and, when every cell passed, a results table), and decoded
into one shared, immutable Python object each, which every record that names it holds. So a store of thousands
of receipts is thousands of small records over a few shared tables, and what the gate computes over a table it
can compute once (engine/gate/verdict.py groups by them).

A summary is only ever made from a Statement judged intact and schema-valid from its bytes just now
(engine/store/verify.py), and read back only from the user's sealed index (engine/store/sealed_index.py).

This module never imports torch.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from engine.store.coverage import facts
from engine.store.records import (Comparison, Git, Implementation, MechanismRun, Mutation, MutantVerdict, Receipt,
                                  Result, _int, _str, _strs, unit_of)

PARTS = ("results", "mutants", "proven", "mechanism", "subject", "coverage")
COMPARISON_KEYS = ("name", "metric", "method", "control", "formal", "higher_is_better", "method_values",
                   "control_values")


def of(data: dict) -> tuple[dict, dict[str, Any]]:
    """(fields, parts) of a schema-valid Statement: `fields` the small per-receipt values, `parts` the shareable
    tables by name (plain JSON each). Raises KeyError, TypeError, ValueError or AttributeError on a shape
    `Receipt.from_statement` would refuse too."""
    pred = data["predicate"]
    env = pred["environment"]["device"]
    spec = pred.get("spec") if isinstance(pred.get("spec"), dict) else {}
    git = pred.get("git")
    impl = pred.get("implementation") if isinstance(pred.get("implementation"), dict) else {}
    files = impl.get("files")
    mutation = pred.get("mutation")
    req = pred.get("request") if isinstance(pred.get("request"), dict) else {}
    budget = pred.get("budget") if isinstance(pred.get("budget"), dict) else {}
    fields = {
        "receipt_id": pred["receipt_id"], "method": pred["method"], "created_at": pred["created_at"],
        "status": pred["status"], "device": env["kind"], "device_name": _str(env.get("name")),
        "spec_name": _str(spec.get("name")), "spec_state": _str(spec.get("promotion_state")),
        "spec_implementation": _str(spec.get("implementation")),
        "seeds": [s for s in req.get("seeds") or [] if _int(s) is not None],
        "budget_seeds": [s for s in budget.get("seeds") or [] if _int(s) is not None],
        "git": [_str(git.get("commit")), git.get("dirty") if isinstance(git.get("dirty"), bool) else None,
                list(_strs(git.get("untracked"))), list(_strs(git.get("modified")))] if isinstance(git, dict) else None,
        "implementation": [unit_of(pred), _str(impl.get("name")), _str(impl.get("target")), list(_strs(files)),
                           isinstance(files, list) and bool(files)],
        "errors": [str(e) for e in pred["errors"]],
        "mutation": None if not isinstance(mutation, dict) else [
            float(mutation["score"]) if _int(mutation.get("score")) is not None or isinstance(
                mutation.get("score"), float) else None,
            mutation.get("complete") is True, mutation.get("killed"), mutation.get("survived"),
            mutation.get("timeout"), mutation.get("equivalent"), mutation.get("mutants"),
            [str(x.get("id")) for x in mutation.get("survivors") or [] if isinstance(x, dict)]],
    }
    parts = {
        "results": _results(pred["results"]),
        "mutants": [[m["id"], m["killed"] is True] for m in pred["mutants"]],
        "proven": {c: list(_strs(ms)) for c, ms in pred["contracts_proven"].items()},
        "mechanism": [[rec["contract"], _int(rec.get("seed")), rec["dtype"],
                       [[c["name"], c["metric"], c.get("method"), c.get("control"), c.get("formal") is True,
                         c.get("higher_is_better", True) is not False, list(c["method_values"]),
                         list(c["control_values"])] for c in rec["comparisons"]]] for rec in pred["mechanism"]],
        "subject": [[s["name"], s["digest"]["sha256"]] for s in data["subject"]],
        "coverage": facts(pred),
    }
    if not isinstance(fields["receipt_id"], str) or not isinstance(fields["device"], str):
        raise TypeError("receipt id and device kind must be strings")
    return fields, parts


def _results(results: list) -> list:
    """[strings, rows]: each result as [contract, seed, dtype, status, kind, message] with every string an index
    into `strings` (kind -1 when absent): a table of hundreds of results in a few kilobytes."""
    strings: dict[str, int] = {}

    def at(text: str) -> int:
        i = strings.get(text)
        if i is None:
            i = strings[text] = len(strings)
        return i

    rows = []
    for r in results:
        kind = _str(r.get("kind"))
        contract, dtype, status = r["contract"], r["dtype"], r["status"]
        if not all(isinstance(x, str) for x in (contract, dtype, status)):
            raise TypeError("contract, dtype and status must be strings")
        rows.append([at(contract), _int(r.get("seed")), at(dtype), at(status), -1 if kind is None else at(kind),
                     at(r.get("message") or "")])
    return [list(strings), rows]


# --- back to records -------------------------------------------------------------------------------------------------


def decode_part(name: str, value: Any) -> Any:
    """One part as the shared, immutable object every record that names it holds (ValueError when malformed)."""
    try:
        if name == "results":
            strings, rows = value
            if not all(isinstance(x, str) for x in strings):
                raise TypeError("not a string table")
            return tuple(Result(strings[c], s, strings[d], strings[st], None if k < 0 else strings[k], strings[m])
                         for c, s, d, st, k, m in rows)
        if name == "mutants":
            return tuple(MutantVerdict(i, k is True) for i, k in value)
        if name == "proven":
            return MappingProxyType({c: tuple(ms) for c, ms in value.items()})
        if name == "mechanism":
            return tuple(MechanismRun(c, s, d, tuple(Comparison(n, m, me, co, f is True, h is True, tuple(mv),
                                                                tuple(cv)) for n, m, me, co, f, h, mv, cv in comps))
                         for c, s, d, comps in value)
        if name == "subject":
            pairs = tuple((n, sha) for n, sha in value)
            return pairs, MappingProxyType(dict(pairs))
        if name == "coverage":
            if not isinstance(value, dict):
                raise TypeError("coverage facts are not an object")
            return value  # a plain dict, as coverage() reads a predicate; shared, and never written to
    except (TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"malformed {name} part: {err}") from None
    raise ValueError(f"unknown part {name}")


def receipt(fields: dict, parts: dict[str, Any], signed_by: tuple[str, ...] = ()) -> Receipt:
    """The record of a summary whose parts are already decoded (`decode_part`); ValueError when malformed."""
    try:
        git, impl, mutation = fields["git"], fields["implementation"], fields["mutation"]
        subject, bound = parts["subject"]
        return Receipt(
            receipt_id=fields["receipt_id"], method=fields["method"], created_at=fields["created_at"],
            status=fields["status"], device=fields["device"], device_name=fields["device_name"],
            spec_name=fields["spec_name"], spec_state=fields["spec_state"],
            spec_implementation=fields["spec_implementation"], seeds=tuple(fields["seeds"]),
            budget_seeds=tuple(fields["budget_seeds"]),
            git=None if git is None else Git(git[0], git[1], tuple(git[2]), tuple(git[3])),
            implementation=Implementation(unit=impl[0], name=impl[1], target=impl[2], files=tuple(impl[3]),
                                          files_named=impl[4] is True),
            results=parts["results"], mutants=parts["mutants"], contracts_proven=parts["proven"],
            mechanism=parts["mechanism"], errors=tuple(fields["errors"]),
            mutation=None if mutation is None else Mutation(
                score=mutation[0], complete=mutation[1] is True, killed=mutation[2], survived=mutation[3],
                timeout=mutation[4], equivalent=mutation[5], mutants=mutation[6], survivors=tuple(mutation[7])),
            subject=subject, signed_by=tuple(signed_by), predicate=parts["coverage"], bound_map=bound)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ValueError(f"malformed receipt summary: {type(err).__name__}: {err}") from None
