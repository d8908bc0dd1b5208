"""Typed records of what the store holds: a receipt (its statement, results, mutants, mechanism runs, execution,
signature status) and a gate verdict (its requirements and fixes).

They are made in one place each, from what has already been validated: `Receipt.from_statement` from a Statement
that passed the receipt schema (engine/store/verify.py calls it once per file), `Verdict.from_result` from
engine.gate.verdict.evaluate's result. Everything that reads a receipt or a verdict (the gate, list, show, the
TUI) reads these by attribute, so a field renamed in the store breaks here, once, loudly, and nowhere else.
The files on disk keep their format (receipt v1, GATE_SCHEMA v2): these are views of it, never written.

This module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

DEFAULT_UNIT = "default"
IMPL_UNIT_PREFIX = "impl:"


def _str(v: Any) -> Optional[str]:
    return v if isinstance(v, str) else None


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _strs(v: Any) -> tuple[str, ...]:
    return tuple(x for x in v if isinstance(x, str)) if isinstance(v, list) else ()


@dataclass(frozen=True)
class Result:
    """One contract x seed x dtype cell of a run."""

    contract: str
    seed: Optional[int]
    dtype: str
    status: str  # passed | failed | error | partial | not_applicable | interrupted
    kind: Optional[str] = None
    message: str = ""


@dataclass(frozen=True)
class MutantVerdict:
    """A spec mutant run against the contracts that must kill it."""

    id: str
    killed: bool


@dataclass(frozen=True)
class Comparison:
    """A method-vs-control comparison recorded by a mechanism run (formal ones count for the gate)."""

    name: str
    metric: str
    method: Any
    control: Any
    formal: bool
    higher_is_better: bool
    method_values: tuple
    control_values: tuple


@dataclass(frozen=True)
class MechanismRun:
    contract: str
    seed: Optional[int]
    dtype: str
    comparisons: tuple[Comparison, ...]


@dataclass(frozen=True)
class Mutation:
    """The score of a `contracts mutate` run (source-edit mutants on the registered implementation)."""

    score: Optional[float]
    complete: bool
    killed: Any = None
    survived: Any = None
    timeout: Any = None
    equivalent: Any = None
    mutants: Any = None
    survivors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Git:
    commit: Optional[str]
    dirty: Optional[bool]
    untracked: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()


@dataclass(frozen=True)
class Implementation:
    """What a receipt measured: the spec's registered implementation (unit 'default') or an --impl candidate
    (unit 'impl:<digest of its files>', engine/run/impl_loader.py)."""

    unit: str
    name: Optional[str]
    target: Optional[str]
    files: tuple[str, ...]
    files_named: bool  # the receipt names its implementation's files as a list (refusal() asks)

    @property
    def is_candidate(self) -> bool:
        return self.unit != DEFAULT_UNIT

    @property
    def label(self) -> str:
        """'default', or '--impl my_tapo.py (0123456789ab)': how every view names the unit."""
        if not self.is_candidate:
            return DEFAULT_UNIT
        return f"--impl {self.target} ({self.unit[len(IMPL_UNIT_PREFIX):][:12]})"


def unit_of(predicate: Any) -> str:
    """'default' or 'impl:<digest>' (the same rule as engine.run.impl_loader.unit_of, without importing it)."""
    impl = predicate.get("implementation") if isinstance(predicate, dict) else None
    if not isinstance(impl, dict) or impl.get("kind") != "external":
        return DEFAULT_UNIT
    return f"{IMPL_UNIT_PREFIX}{impl.get('digest')}"


def policy_of(pred: dict) -> tuple[Optional[str], tuple[str, ...]]:
    """(kind, used_by) of the receipt's `policy` (None, () for the methods' tiny policies)."""
    pol = pred.get("policy")
    if not isinstance(pol, dict):
        return None, ()
    return _str(pol.get("kind")), _strs(pol.get("used_by"))


@dataclass(frozen=True)
class Receipt:
    """One schema-valid receipt, as every reader sees it. `predicate` keeps the parsed predicate for what shows a
    receipt whole (the TUI's receipt screen, coverage's facts); verdicts read the typed fields."""

    receipt_id: str
    method: str
    created_at: str
    status: str
    device: str
    device_name: Optional[str]
    spec_name: Optional[str]
    spec_state: Optional[str]
    spec_implementation: Optional[str]
    seeds: tuple[int, ...]  # requested
    budget_seeds: tuple[int, ...]
    git: Optional[Git]
    implementation: Implementation
    results: tuple[Result, ...]
    mutants: tuple[MutantVerdict, ...]
    contracts_proven: Mapping[str, tuple[str, ...]]
    mechanism: tuple[MechanismRun, ...]
    errors: tuple[str, ...]
    mutation: Optional[Mutation]
    subject: tuple[tuple[str, str], ...]  # (name, sha256) of every bound file
    signed_by: tuple[str, ...] = ()
    seed_source: Optional[str] = None  # budget | given | fresh (drawn at run time); None before it was recorded
    # the `--policy` the mechanism runs trained ("hf" for a checkpoint; None: the tiny policies) and the contracts
    # that used it: the gate's policy requirement reads them
    policy_kind: Optional[str] = None
    policy_used_by: tuple[str, ...] = ()
    predicate: Mapping = field(default_factory=dict, repr=False, compare=False)
    # subject as a mapping, shared by every record of a sealed index that binds the same files
    # (engine/store/summary.py): the gate asks it once per receipt, and a subject list is hundreds of files
    bound_map: Optional[Mapping] = field(default=None, repr=False, compare=False)

    @property
    def unit(self) -> str:
        return self.implementation.unit

    @property
    def bound(self) -> Mapping[str, str]:
        return self.bound_map if self.bound_map is not None else dict(self.subject)

    @classmethod
    def from_statement(cls, data: dict, signed_by: tuple[str, ...] = ()) -> "Receipt":
        """From a Statement that passed the receipt schema; raises ValueError (KeyError, TypeError) otherwise."""
        pred = data["predicate"]
        env = pred["environment"]["device"]
        spec = pred.get("spec") if isinstance(pred.get("spec"), dict) else {}
        git = pred.get("git")
        impl = pred.get("implementation") if isinstance(pred.get("implementation"), dict) else {}
        files = impl.get("files")
        mutation = pred.get("mutation")
        req = pred.get("request") if isinstance(pred.get("request"), dict) else {}
        budget = pred.get("budget") if isinstance(pred.get("budget"), dict) else {}
        return cls(
            receipt_id=pred["receipt_id"], method=pred["method"], created_at=pred["created_at"],
            status=pred["status"], device=env["kind"], device_name=_str(env.get("name")),
            spec_name=_str(spec.get("name")), spec_state=_str(spec.get("promotion_state")),
            spec_implementation=_str(spec.get("implementation")),
            seeds=tuple(s for s in req.get("seeds") or [] if _int(s) is not None),
            budget_seeds=tuple(s for s in budget.get("seeds") or [] if _int(s) is not None),
            git=Git(_str(git.get("commit")), git.get("dirty") if isinstance(git.get("dirty"), bool) else None,
                    _strs(git.get("untracked")), _strs(git.get("modified"))) if isinstance(git, dict) else None,
            implementation=Implementation(
                unit=unit_of(pred), name=_str(impl.get("name")), target=_str(impl.get("target")),
                files=_strs(files), files_named=isinstance(files, list) and bool(files)),
            results=tuple(Result(r["contract"], _int(r.get("seed")), r["dtype"], r["status"], _str(r.get("kind")),
                                 r.get("message") or "") for r in pred["results"]),
            mutants=tuple(MutantVerdict(m["id"], m["killed"] is True) for m in pred["mutants"]),
            contracts_proven=MappingProxyType({c: _strs(ms) for c, ms in pred["contracts_proven"].items()}),
            mechanism=tuple(MechanismRun(rec["contract"], _int(rec.get("seed")), rec["dtype"], tuple(
                Comparison(c["name"], c["metric"], c.get("method"), c.get("control"), c.get("formal") is True,
                           c.get("higher_is_better", True) is not False, tuple(c["method_values"]),
                           tuple(c["control_values"])) for c in rec["comparisons"])) for rec in pred["mechanism"]),
            errors=tuple(str(e) for e in pred["errors"]),
            mutation=None if not isinstance(mutation, dict) else Mutation(
                score=float(mutation["score"]) if _int(mutation.get("score")) is not None or isinstance(
                    mutation.get("score"), float) else None,
                complete=mutation.get("complete") is True, killed=mutation.get("killed"),
                survived=mutation.get("survived"), timeout=mutation.get("timeout"),
                equivalent=mutation.get("equivalent"), mutants=mutation.get("mutants"),
                survivors=tuple(str(x.get("id")) for x in mutation.get("survivors") or [] if isinstance(x, dict))),
            subject=tuple((s["name"], s["digest"]["sha256"]) for s in data["subject"]),
            signed_by=tuple(signed_by),
            seed_source=_str(req.get("seed_source")),
            policy_kind=policy_of(pred)[0], policy_used_by=policy_of(pred)[1],
            predicate=pred,
        )

    def coverage(self, spec: Any = None):
        """`full` or `partial ran/total` with why (engine.store.coverage)."""
        from engine.store.coverage import coverage

        return coverage(dict(self.predicate), spec)

    def describe(self, spec: Any = None) -> "Described":
        """How every view names this receipt's outcome: a `contracts mutate` run by its score, any other by its
        status and coverage."""
        return describe(self.status, self.mutation, self.coverage(spec))


@dataclass(frozen=True)
class Described:
    """A receipt's outcome in words, the same in list, show, verify and the TUI."""

    status: str  # 'passed', or 'mutate 1.000' for a mutation run
    label: str  # 'full', 'partial 3/12'
    why: str  # '' or what made it partial

    def text(self) -> str:
        """'passed (partial 3/12: --only a)', 'mutate 1.000 (full)'."""
        return f"{self.status} ({self.label}{': ' + self.why if self.why else ''})"

    def short(self) -> str:
        return f"{self.status} ({self.label})"


def describe(status: Optional[str], mutation: Optional[Mutation], coverage) -> Described:
    """One wording for a receipt's outcome. A mutation run plants edits in the registered implementation and runs
    its baseline on one seed by design: it is judged by its score, and is full when it judged every mutant (the
    budget's other seeds are not what it claims)."""
    if mutation is not None:
        score = "n/a" if mutation.score is None else f"{mutation.score:.3f}"
        return Described(f"mutate {score}", "full" if mutation.complete else "partial",
                         "" if mutation.complete else "mutate on a selection (--max-mutants, --only-file or "
                                                      "--operators)")
    if coverage is None:
        return Described(status or "-", "–", "")
    return Described(status or "-", coverage.label(), "; ".join(coverage.why) if not coverage.full else "")


# --- verdicts --------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One gate requirement: met or not, what is missing, and the command (argv) or note that would meet it."""

    id: str
    required: bool
    met: bool
    detail: str
    fix: str  # argv as one line, or the note
    argv: Optional[tuple[str, ...]]
    note: str

    def line(self) -> str:
        return f"{self.id}: {self.detail}"


@dataclass(frozen=True)
class Verdict:
    """A gate verdict for one (method, implementation) unit, as every view shows it. `result` is evaluate's
    dict, which `gate --json` publishes (GATE_SCHEMA)."""

    method: str
    implementation: str
    promotable: bool
    requirements: tuple[Requirement, ...]
    warnings: tuple[str, ...]
    warnings_total: int
    state: str
    review: str
    result: Mapping = field(default_factory=dict, repr=False, compare=False)

    @property
    def unmet(self) -> tuple[Requirement, ...]:
        return tuple(r for r in self.requirements if r.required and not r.met)

    @property
    def met(self) -> tuple[Requirement, ...]:
        return tuple(r for r in self.requirements if r.met)

    @property
    def word(self) -> str:
        return "open" if self.promotable else "closed"

    @classmethod
    def from_result(cls, result: dict) -> "Verdict":
        reqs = tuple(Requirement(r["id"], bool(r.get("required", True)), bool(r["met"]), str(r.get("detail") or ""),
                                 str(r.get("fix") or ""), tuple(r["argv"]) if r.get("argv") else None,
                                 str(r.get("note") or "")) for r in result["requirements"])
        return cls(result["method"], result.get("implementation", DEFAULT_UNIT), bool(result["promotable"]), reqs,
                   tuple(result.get("warnings") or ()), int(result.get("warnings_total", 0)), result["state"],
                   result["review"], result)
