"""A verified receipt as the reading verbs need it: a few hundred bytes instead of the receipt's 300 KB.

`list`, `show`, `gate` and the TUI's Gate tab read a receipt through its typed record (engine/store/records.py):
per contract, seed and dtype a status (and a message when it did not pass), which mutants it killed and which
contracts killed some, the comparisons of its mechanism runs (their values, without the step records), the
mutation score of a `contracts mutate` run, its device, seeds, git state, implementation, bound files, and the
few facts coverage needs (engine/store/coverage.py). `of(statement)` keeps exactly that and `receipt(...)` turns it
back into the same `Receipt` that `Receipt.from_statement` makes from the whole Statement
(tests/test_store_index.py checks the two are equal on every committed receipt).

A receipt's own fields are its id, creation time, status and git commit. Everything else is a "part" (what runs
of one method, device, spec and implementation share; the results table; the mutant verdicts; the contracts
proven; the mechanism comparisons; the subject list; the coverage facts), kept once per index however many
receipts share it (most runs of one method share a subject list and, when every cell passed, a results table)
and decoded into one shared, immutable Python object each, which every record that names it holds. So a store of
thousands of receipts is thousands of small records over a few shared tables, and what the gate computes over a
table it can compute once (engine/gate/verdict.py groups by them). Mechanism runs stay JSON text until the gate
reads them.

A summary is only ever made from a Statement judged intact and schema-valid from its bytes just now
(engine/store/verify.py), and kept only in the user's sealed index (engine/store/sealed_index.py).

This module never imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from engine.store import bounded
from engine.store.coverage import facts
from engine.store.records import (Comparison, Git, Implementation, MechanismRun, Mutation, MutantVerdict, Receipt,
                                  Result, _int, _str, _strs, policy_of, unit_of)

PARTS = ("static", "results", "mutants", "proven", "mechanism", "subject", "coverage")


def of(data: dict) -> tuple[list, dict[str, Any]]:
    """(fields, parts) of a schema-valid Statement: `fields` what is the receipt's own ([receipt id, created at,
    status, git commit]), `parts` the shareable rest by name (plain JSON each; "static" is what receipts of one
    method, device, spec and implementation run share). Raises KeyError, TypeError, ValueError or AttributeError on
    a shape `Receipt.from_statement` would refuse too."""
    pred = data["predicate"]
    env = pred["environment"]["device"]
    spec = pred.get("spec") if isinstance(pred.get("spec"), dict) else {}
    git = pred.get("git")
    impl = pred.get("implementation") if isinstance(pred.get("implementation"), dict) else {}
    files = impl.get("files")
    mutation = pred.get("mutation")
    req = pred.get("request") if isinstance(pred.get("request"), dict) else {}
    budget = pred.get("budget") if isinstance(pred.get("budget"), dict) else {}
    fields = [pred["receipt_id"], pred["created_at"], pred["status"],
              _str(git.get("commit")) if isinstance(git, dict) else None]
    static = [
        pred["method"], env["kind"], _str(env.get("name")), _str(spec.get("name")),
        _str(spec.get("promotion_state")), _str(spec.get("implementation")),
        [s for s in req.get("seeds") or [] if _int(s) is not None],
        [s for s in budget.get("seeds") or [] if _int(s) is not None],
        [git.get("dirty") if isinstance(git.get("dirty"), bool) else None, list(_strs(git.get("untracked"))),
         list(_strs(git.get("modified")))] if isinstance(git, dict) else None,
        [unit_of(pred), _str(impl.get("name")), _str(impl.get("target")), list(_strs(files)),
         isinstance(files, list) and bool(files)],
        [str(e) for e in pred["errors"]],
        None if not isinstance(mutation, dict) else [
            float(mutation["score"]) if _int(mutation.get("score")) is not None or isinstance(
                mutation.get("score"), float) else None,
            mutation.get("complete") is True, mutation.get("killed"), mutation.get("survived"),
            mutation.get("timeout"), mutation.get("equivalent"), mutation.get("mutants"),
            [str(x.get("id")) for x in mutation.get("survivors") or [] if isinstance(x, dict)]],
        _str(req.get("seed_source")),  # the gate's fresh_seeds requirement reads it
        [policy_of(pred)[0], list(policy_of(pred)[1])],  # and its policy requirement these
    ]
    parts = {
        "static": static,
        "results": _results(pred["results"]),
        "mutants": [[m["id"], m["killed"] is True] for m in pred["mutants"]],
        "proven": {c: list(_strs(ms)) for c, ms in pred["contracts_proven"].items()},
        # kept as JSON text: its values are read only for the receipts the gate counts, and a string is parsed
        # in one step where a nested list costs an object per value on every load of the index
        "mechanism": json.dumps([
            [rec["contract"], _int(rec.get("seed")), rec["dtype"],
             [[c["name"], c["metric"], c.get("method"), c.get("control"), c.get("formal") is True,
               c.get("higher_is_better", True) is not False, list(c["method_values"]), list(c["control_values"])]
              for c in rec["comparisons"]]] for rec in pred["mechanism"]],
            separators=(",", ":"), allow_nan=True) if pred["mechanism"] else "",
        "subject": [[s["name"], s["digest"]["sha256"]] for s in data["subject"]],
        "coverage": facts(pred),
    }
    if not all(isinstance(x, str) for x in (fields[0], fields[1], fields[2], static[0], static[1])):
        raise TypeError("receipt id, creation time, status, method and device kind must be strings")
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
        if name == "static":
            (method, device, device_name, spec_name, spec_state, spec_impl, seeds, budget_seeds, git, impl, errors,
             mutation, seed_source, (policy_kind, used_by)) = value
            template = {
                "method": method, "device": device, "device_name": device_name, "spec_name": spec_name,
                "spec_state": spec_state, "spec_implementation": spec_impl, "seeds": tuple(seeds),
                "budget_seeds": tuple(budget_seeds), "seed_source": seed_source,
                "policy_kind": policy_kind, "policy_used_by": tuple(used_by),
                "implementation": Implementation(unit=impl[0], name=impl[1], target=impl[2], files=tuple(impl[3]),
                                                 files_named=impl[4] is True),
                "errors": tuple(errors),
                "mutation": None if mutation is None else Mutation(
                    score=mutation[0], complete=mutation[1] is True, killed=mutation[2], survived=mutation[3],
                    timeout=mutation[4], equivalent=mutation[5], mutants=mutation[6], survivors=tuple(mutation[7])),
            }
            git_meta = None if git is None else (git[0], tuple(git[1]), tuple(git[2]))
            return template, git_meta
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
            if not isinstance(value, str):
                raise TypeError("mechanism runs are not JSON text")
            return _Runs(value) if value else ()
        if name == "subject":
            pairs = tuple((n, sha) for n, sha in value)
            return pairs, MappingProxyType(dict(pairs))
        if name == "coverage":
            if not isinstance(value, dict):
                raise TypeError("coverage facts are not an object")
            return value  # a plain dict, as coverage() reads a predicate; shared, and never written to
    except (TypeError, ValueError, AttributeError, IndexError) as err:
        raise ValueError(f"malformed {name} part: {err}") from None
    raise ValueError(f"unknown part {name}")


class _Runs(Sequence):
    """A receipt's mechanism runs, decoded when first read: only the gate reads them, and only for the fresh
    receipts it counts on a required device; a store's other receipts never pay for their comparisons. Equal to
    the tuple `Receipt.from_statement` makes."""

    __slots__ = ("_raw", "_runs")

    def __init__(self, raw: str) -> None:
        self._raw, self._runs = raw, None

    def _decoded(self) -> tuple:
        if self._runs is None:
            try:
                self._runs = tuple(MechanismRun(c, s, d, tuple(
                    Comparison(n, m, me, co, f is True, h is True, tuple(mv), tuple(cv))
                    for n, m, me, co, f, h, mv, cv in comps)) for c, s, d, comps in bounded.loads(self._raw))
            except (TypeError, ValueError):
                self._runs = ()  # never from a sealed summary, which `of` made: a shape it cannot have
            self._raw = None
        return self._runs

    def __getitem__(self, i):
        return self._decoded()[i]

    def __len__(self) -> int:
        return len(self._decoded())

    def __bool__(self) -> bool:
        return True  # made only for a receipt that has mechanism runs (`decode_part`)

    def __iter__(self):
        return iter(self._decoded())

    def __eq__(self, other) -> bool:
        return self._decoded() == (other._decoded() if isinstance(other, _Runs) else other)

    def __hash__(self) -> int:
        return hash(self._decoded())

    def __repr__(self) -> str:
        return repr(self._decoded())


_NEW = object.__new__
_SET = object.__setattr__


def receipt(fields: list, parts: dict[str, Any], signed_by: tuple[str, ...] = ()) -> Receipt:
    """The record of a summary whose parts are already decoded (`decode_part`); ValueError when malformed.

    Made without the dataclass's __init__ (its frozen setattr costs a microsecond a field, and a store has
    thousands of records): the fields are set from the static part's template in one go. `Receipt` has no
    __post_init__, so this is the same object; tests/test_store_index.py checks it equals `from_statement`'s."""
    try:
        rid, created_at, status, commit = fields
        template, git_meta = parts["static"]
        subject, bound = parts["subject"]
        git = None
        if git_meta is not None:
            git = _NEW(Git)
            _SET(git, "__dict__", {"commit": commit, "dirty": git_meta[0], "untracked": git_meta[1],
                                   "modified": git_meta[2]})
        values = dict(template)
        values.update(receipt_id=rid, created_at=created_at, status=status, git=git, results=parts["results"],
                      mutants=parts["mutants"], contracts_proven=parts["proven"], mechanism=parts["mechanism"],
                      subject=subject, signed_by=tuple(signed_by), predicate=parts["coverage"], bound_map=bound)
        rec = _NEW(Receipt)
        _SET(rec, "__dict__", values)
        return rec
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ValueError(f"malformed receipt summary: {type(err).__name__}: {err}") from None
