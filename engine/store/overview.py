"""The read model: one view of the specs and the receipt store that `list`, `show`, `gate`, `verify` and the TUI
all read, so the same fact reads the same everywhere.

`Overview` answers two questions:
  * every method, one row per implementation unit (the spec's registered implementation, then each `--impl`
    candidate that has receipts), with its newest receipt, freshness and gate verdict: `rows()`;
  * one method in full (spec, receipts newest first, verdict): `method(key)`.
Receipts are assessed from their files (engine/store/verify.py: integrity, signature under a policy, schema,
freshness) once per method and turned into typed records (engine/store/records.py) there; verdicts are
engine.gate.verdict.evaluate over those. A candidate's receipts belong to the candidate's row and never to the
registered implementation's, in the counts, the newest receipt and the verdict alike.

`sealed` (engine.store.sealed.Sealed) lets a receipt judged intact and schema-valid from these exact bytes before be
read from its sealed summary; every other fact (the bytes, freshness, signatures) is decided on every call. `cache`
(engine.store.cache.ValidationCache, the store's unsealed file) is for display only: no reading verb passes it.

This module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from engine import errors as E
from engine.store.records import DEFAULT_UNIT, Described, Verdict, describe
from engine.store.verify import Assessed, StoreReport, assess_receipts


@dataclass(frozen=True)
class SpecSummary:
    """What a row says of a valid spec."""

    key: str
    file: str
    title: str
    level: str
    review: str
    state: str
    implementation: str
    contracts: tuple[str, ...]
    mutants: tuple[str, ...]
    devices: tuple[str, ...]  # required by promotion.requires
    budget_seeds: tuple[int, ...]
    spec: Any = field(repr=False, compare=False, default=None)  # engine.spec.loader.Spec

    @classmethod
    def of(cls, spec) -> "SpecSummary":
        d = spec.data
        return cls(key=spec.key, file=spec.display, title=d["title"], level=d["level"],
                   review=d["promotion"]["review"], state=d["promotion"]["state"], implementation=d["implementation"],
                   contracts=tuple(c["id"] for c in d["contracts"]), mutants=tuple(m["id"] for m in d["mutants"]),
                   devices=tuple(d["promotion"]["requires"]["devices"]),
                   budget_seeds=tuple(d["budget"]["seeds"]), spec=spec)


@dataclass(frozen=True)
class ReceiptView:
    """One receipt file as a row shows it."""

    file: str  # <method>/<name> inside the store
    state: str  # fresh | stale | tampered | invalid
    status: Optional[str]
    created_at: Optional[str]
    receipt_id: Optional[str]
    device: Optional[str]
    changed: tuple[str, ...]
    message: str
    described: Optional[Described]  # None for a file that is not a readable receipt
    coverage: Any = field(repr=False, compare=False, default=None)  # engine.store.coverage.Coverage
    mutation: Any = field(repr=False, compare=False, default=None)  # records.Mutation

    @classmethod
    def of(cls, a: Assessed, spec=None) -> "ReceiptView":
        rec = a.receipt
        cov = rec.coverage(spec) if rec is not None else None
        return cls(file=a.file, state=a.state, status=a.status, created_at=a.created_at, receipt_id=a.receipt_id,
                   device=a.device, changed=tuple(a.changed), message=a.message,
                   described=describe(rec.status, rec.mutation, cov) if rec is not None else None,
                   coverage=cov, mutation=rec.mutation if rec is not None else None)


@dataclass
class UnitRow:
    """One (method, implementation) unit: the registered implementation ('default') or an --impl candidate."""

    spec: SpecSummary
    unit: str
    label: str  # 'default' or '--impl TARGET (digest)'
    receipts: list[Assessed]  # this unit's, oldest first (tampered and invalid files of the folder with 'default')
    verdict: Verdict

    @property
    def method(self) -> str:
        return self.spec.key

    @property
    def is_candidate(self) -> bool:
        return self.unit != DEFAULT_UNIT

    @property
    def latest(self) -> Optional[Assessed]:
        dated = [a for a in self.receipts if a.created_at]
        return max(dated, key=lambda a: a.created_at) if dated else (self.receipts[-1] if self.receipts else None)

    def latest_view(self) -> Optional[ReceiptView]:
        last = self.latest
        return None if last is None else ReceiptView.of(last, self.spec.spec)


class Overview:
    """Specs and receipts of one store, read once per method and shared by every question asked of them."""

    def __init__(self, specs_dir: Path, receipts_dir: Path, root: Path, policy=None, cache=None, flags: str = "",
                 shown: Optional[Callable[[str], str]] = None, store: Optional[str] = None, sealed=None):
        self.specs_dir, self.receipts_dir, self.root = Path(specs_dir), Path(receipts_dir), Path(root)
        self.policy, self.cache, self.flags, self.sealed = policy, cache, flags, sealed
        if cache is None and sealed is not None:
            from engine.store.sealed import process_cache

            # this process's memory only (nothing read from or written to a store's file): the working tree's
            # digests, which many receipts share, are hashed once per command
            self.cache = process_cache(sealed)
        self.shown, self.store = shown, store
        self._assessed: dict[str, list[Assessed]] = {}
        self._rows: dict[str, list[UnitRow]] = {}

    # -- the store ---------------------------------------------------------------------------

    def require_store(self, shown_path: Callable[[Path], str] = str) -> None:
        """A store that is not there is a usage error (exit 2) for every reading verb: "0 receipts, gate closed"
        would judge a typo or a lost mount."""
        if not self.receipts_dir.is_dir():
            raise E.UsageError(f"no receipt store at {shown_path(self.receipts_dir)}: not a folder (give --receipts "
                               "DIR of an existing store; contracts check creates one)")

    def assessed(self, key: str) -> list[Assessed]:
        """Every file in the method's folder, assessed from its bytes (with `cache`: display only), oldest first."""
        if key not in self._assessed:
            self._assessed[key], _ = assess_receipts(self.receipts_dir, self.root, self.specs_dir, key,
                                                     cache=self.cache, policy=self.policy, sealed=self.sealed)
        return self._assessed[key]

    def store_report(self, method: Optional[str] = None, spec_states: Optional[dict] = None) -> StoreReport:
        """`contracts verify`'s report: every receipt (of one method, or all) and the ledger, from the files."""
        from engine.store.verify import assess_store

        return assess_store(self.receipts_dir, self.root, self.specs_dir, method, spec_states or {}, cache=self.cache,
                            policy=self.policy, sealed=self.sealed)

    # -- verdicts and rows -------------------------------------------------------------------

    def verdict(self, spec, unit: str = DEFAULT_UNIT, flags: Optional[str] = None) -> Verdict:
        """The gate verdict of one unit (engine.gate.verdict.evaluate over this store's assessed receipts)."""
        from engine.gate.verdict import evaluate

        result = evaluate(spec, self.receipts_dir, self.root, self.specs_dir, self.flags if flags is None else flags,
                          assessed=self.assessed(spec.key), implementation=unit, policy=self.policy,
                          store=self.store, shown=self.shown, assessed_of=self.assessed, validate=self._validate)
        return Verdict.from_result(result)

    def _validate(self, path: Path, root: Optional[Path] = None):
        """A spec's validation as the reading verbs validate the specs they show: from the user's sealed cache
        when this read model has one (engine.store.sealed.validate_spec), else engine.spec.memo's."""
        if self.sealed is not None:
            from engine.store.sealed import validate_spec

            return validate_spec(path, root, self.sealed)
        from engine.spec.memo import validate_file

        return validate_file(path, root)

    def units(self, spec) -> list[UnitRow]:
        """The registered implementation's row first (always), then one per --impl candidate with receipts."""
        if spec.key in self._rows:
            return self._rows[spec.key]
        summary = SpecSummary.of(spec)
        by_unit: dict[str, list[Assessed]] = {DEFAULT_UNIT: []}
        labels = {DEFAULT_UNIT: DEFAULT_UNIT}
        for a in self.assessed(spec.key):
            unit = a.receipt.unit if a.receipt is not None else DEFAULT_UNIT
            by_unit.setdefault(unit, []).append(a)
            if unit != DEFAULT_UNIT:
                labels[unit] = a.receipt.implementation.label
        rows = []
        for unit, receipts in by_unit.items():
            flags = self.flags
            if unit != DEFAULT_UNIT:
                import shlex

                target = next((a.receipt.implementation.target for a in receipts if a.receipt is not None), None)
                flags += f" --impl {shlex.quote(target)}" if target else ""
            rows.append(UnitRow(summary, unit, labels[unit], receipts, self.verdict(spec, unit, flags)))
        self._rows[spec.key] = rows
        return rows

    def rows(self, specs: list) -> list[UnitRow]:
        """Every valid spec's units, in the order given."""
        return [row for spec in specs for row in self.units(spec)]

    def method(self, spec, unit: str = DEFAULT_UNIT) -> Optional[UnitRow]:
        """One method (one unit of it) in full: its spec, its receipts and its verdict."""
        return next((r for r in self.units(spec) if r.unit == unit), None)


def count_label(rows: list[UnitRow], invalid: int = 0) -> str:
    """'3 method(s)', '3 method(s), 1 --impl candidate(s)': methods are methods, candidates are counted apart."""
    methods = len({r.method for r in rows})
    candidates = sum(r.is_candidate for r in rows)
    out = f"{methods} method(s)"
    if candidates:
        out += f", {candidates} --impl candidate(s)"
    if invalid:
        out += f", {invalid} invalid spec(s)"
    return out
