"""The conformance matrix: every policy loss a framework ships, against the paper spec it claims, from fresh
receipts (`contracts conformance`, the TUI's Conformance screen, docs/conformance.md).

The rows come from a data table (docs/conformance.yaml: frameworks, their variants, the specs each variant claims,
the reason a variant has none, what blocks a framework, and a framework-neutral description per defect; how a
spec's arguments reach a framework is methods/common/zoo.yaml, which the receipts bind). Each (variant, spec) cell
is read from the newest fresh receipt of `contracts check SPEC --impl TARGET` in the store, preferring a full run (every contract) over a narrowed one. A cell is

    held            every contract passed
    failed          some contract failed or raised
    partial         nothing failed, but some contract could only be measured in part or not at all (a policy loss
                    has no advantage estimator, say)
    not applicable  no contract could be measured on the target

or, with no receipt to read: no receipt, stale (only receipts of another tree), no spec (the variant's paper has
none here: the zoo table says why), blocked (the framework cannot be imported here: the zoo table says what stops
it). Nothing is measured here, and receipts count only when fresh. This module never imports torch.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HELD, FAILED, PARTIAL, NOT_APPLICABLE = "held", "failed", "partial", "not applicable"
NO_RECEIPT, STALE, NO_SPEC, BLOCKED, NO_SPEC_FILE = "no receipt", "stale", "no spec", "blocked", "no spec file"
SEVERITIES = ("high", "medium", "low")


@dataclass(frozen=True)
class ContractCell:
    """One contract of a cell: its status in the receipt and, where it failed, the first failing case."""

    id: str
    status: str  # held | failed | partial | not applicable | error
    case: str = ""  # `seed 42 case 0 (logp [5, 8], ...) metric value ...`
    repro: str = ""  # the command that reruns that case alone
    message: str = ""


@dataclass
class Cell:
    framework: str
    version: str
    variant: str
    target: str
    spec: str | None
    status: str
    paper: str = ""
    note: str = ""
    why: str = ""  # no spec / blocked / no receipt: what to do about it
    receipt: str | None = None  # <method>/<file> in the store
    created_at: str | None = None
    commit: str | None = None
    seeds: tuple = ()
    subset: tuple = ()  # the contracts of a narrowed (--only) run
    contracts: list[ContractCell] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        out = {HELD: 0, FAILED: 0, PARTIAL: 0, NOT_APPLICABLE: 0}
        for c in self.contracts:
            out[FAILED if c.status == "error" else c.status] += 1
        return out

    @property
    def failing(self) -> list[ContractCell]:
        return [c for c in self.contracts if c.status in (FAILED, "error")]

    @property
    def label(self) -> str:
        return f"{self.framework} {self.version} {self.variant}"


@dataclass(frozen=True)
class Defect:
    key: str  # `contract` or `spec/contract`
    title: str
    severity: str
    text: str
    seen_in: tuple  # (cell label, spec, contract) per occurrence


@dataclass
class Matrix:
    frameworks: dict  # name -> {version, install, where, blocked, repro}
    specs: list  # the spec keys claimed, in column order
    cells: list[Cell]
    defects: list[Defect]
    zoo: str  # the table's file, as shown
    store: str  # the receipt store, as shown

    def as_dict(self) -> dict:
        return {"zoo": self.zoo, "store": self.store, "frameworks": self.frameworks, "specs": self.specs,
                "cells": [{**{k: v for k, v in c.__dict__.items() if k != "contracts"},
                           "seeds": list(c.seeds), "subset": list(c.subset), "counts": c.counts,
                           "contracts": [x.__dict__ for x in c.contracts]} for c in self.cells],
                "defects": [{**d.__dict__, "seen_in": [list(s) for s in d.seen_in]} for d in self.defects]}


def load_zoo(path: Path) -> dict:
    """The zoo table as plain data; a file that cannot be read or parsed is a UsageError naming it."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    from engine.errors import UsageError

    try:
        data = YAML(typ="safe", pure=True).load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, YAMLError) as err:
        raise UsageError(f"{path}: cannot read the framework zoo table: {type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''} (fix: give --zoo FILE of a readable "
                         "table, as docs/conformance.yaml)") from None
    if not isinstance(data, dict) or not isinstance(data.get("frameworks"), dict):
        raise UsageError(f"{path}: not a framework zoo table (it needs a `frameworks:` mapping; see "
                         "docs/conformance.yaml)")
    return data


def default_zoo() -> Path:
    """docs/conformance.yaml of the project: the matrix's rows, beside the document they make."""
    from engine.paths import project_root

    return project_root() / "docs" / "conformance.yaml"


def contract_status(statuses: set) -> str:
    """A contract's status over its seed x dtype results (as the receipt index digests them)."""
    if "error" in statuses:
        return "error"
    if "failed" in statuses:
        return FAILED
    if statuses == {"passed"}:
        return HELD
    if statuses == {"not_applicable"}:
        return NOT_APPLICABLE
    return PARTIAL


def cell_status(contracts: list[ContractCell]) -> str:
    states = {c.status for c in contracts}
    if states & {FAILED, "error"}:
        return FAILED
    if states == {HELD}:
        return HELD
    if states == {NOT_APPLICABLE}:
        return NOT_APPLICABLE
    return PARTIAL


def case_text(c: dict) -> str:
    """`seed 42 case 3 (logp [2, 7], mask [2, 7]) max_abs_err 0.5 at [1, 4]; junk nan`: the runner's case line."""
    shapes = ", ".join(f"{k} {v}" for k, v in (c.get("shapes") or {}).items())
    text = f"seed {c.get('seed')} case {c.get('case')}" + (f" ({shapes})" if shapes else "")
    value = c.get("value")
    text += f" {c.get('metric')} {value:.3g}" if isinstance(value, float) else f" {c.get('metric')} {value}"
    if c.get("where") is not None:
        text += f" at {c['where']}"
    if c.get("argument"):
        text += f"; {c['argument']}"
    return text


def repro(spec: str, target: str, cid: str, seed: Any, case: Any, device: str = "cpu") -> str:
    argv = ["contracts", "check", spec, "--impl", target, "--only", cid]
    if seed is not None:
        argv += ["--seeds", str(seed)]
    if case is not None:
        argv += ["--case", str(case)]
    if device != "cpu":
        argv += ["--device", device]
    return " ".join(shlex.quote(a) for a in argv)


def contracts_of(pred: dict, spec: str, target: str) -> list[ContractCell]:
    """Each contract of a receipt, in the spec's order, with the first failing case of the failed ones."""
    by: dict[str, list[dict]] = {}
    for r in pred.get("results") or []:
        if isinstance(r, dict) and isinstance(r.get("contract"), str):
            by.setdefault(r["contract"], []).append(r)
    device = (pred.get("request") or {}).get("device") or "cpu"
    out = []
    for cid, results in by.items():
        status = contract_status({r.get("status") for r in results})
        case, command, message = "", "", ""
        if status in (FAILED, "error"):
            bad = [r for r in results if r.get("status") in ("failed", "error")]
            first = next((r["failing_cases"][0] for r in bad if r.get("failing_cases")), None)
            message = str(bad[0].get("message") or "")
            if first is not None:
                case = case_text(first)
                command = repro(spec, target, cid, first.get("seed"), first.get("case"), device)
            else:
                command = repro(spec, target, cid, bad[0].get("seed"), None, device)
        out.append(ContractCell(cid, status, case, command, message))
    return out


def _facts(a) -> dict:
    """The coverage facts of an assessed receipt (engine.store.coverage.facts): what the store's reading path keeps
    of its predicate (read from the receipt index's summary, or made from the predicate read from its bytes)."""
    from engine.store.coverage import facts

    return facts(a.predicate)


def _target(a) -> str | None:
    """The --impl target an assessed receipt measured; None for the spec's registered implementation."""
    rec = a.receipt
    if rec is not None:
        return rec.implementation.target if rec.implementation.is_candidate else None
    impl = (a.predicate or {}).get("implementation") or {}
    return impl.get("target") if impl.get("kind") == "external" else None


def _by_preference(receipts: list) -> list:
    """The receipts a cell may read, in the order it prefers them: full runs (every contract) newest first, then
    narrowed ones newest first."""
    return sorted(receipts, key=lambda a: (not _facts(a).get("only"), a.created_at or ""), reverse=True)


def build(zoo_path: Path, specs_dir: Path, receipts_dir: Path, root: Path, policy=None) -> Matrix:
    """The matrix of the zoo table's variants against the specs they claim, from the store's fresh receipts."""
    from engine.spec.loader import display_path, spec_files
    from engine.store.verify import assess, assess_receipts

    zoo = load_zoo(zoo_path)
    have = {p.stem for p in spec_files(specs_dir)} if Path(specs_dir).is_dir() else set()
    by_spec: dict[str, dict[str, list]] = {}

    def receipts_for(spec: str) -> dict[str, list]:
        if spec not in by_spec:
            found: dict[str, list] = {}
            if Path(receipts_dir).is_dir():
                assessed, _ = assess_receipts(receipts_dir, root, specs_dir, spec, policy=policy)
                for a in assessed:  # read from their summaries: the predicate is its coverage facts
                    target = _target(a) if a.state in ("fresh", "stale") else None
                    if target and _facts(a).get("case") is None:
                        found.setdefault(target, []).append(a)
            by_spec[spec] = found
        return by_spec[spec]

    def predicate_of(spec: str, a) -> dict | None:
        """The whole predicate of the receipt a cell reads (its results' failing cases): the assessed one read
        from the summary keeps only its coverage facts, so the file is assessed again, alone; None when it is no
        longer fresh."""
        from engine.store.coverage import FACTS_KIND

        if isinstance(a.predicate, dict) and a.predicate.get("kind") != FACTS_KIND:
            return a.predicate
        again = assess(Path(receipts_dir) / a.file, root, specs_dir, display=a.file, folder_method=spec,
                       policy=policy)
        if again.state != "fresh" or not isinstance(again.predicate, dict):
            return None
        return again.predicate

    frameworks, cells, specs = {}, [], []
    for name, fw in zoo["frameworks"].items():
        version = str(fw.get("version") or "")
        frameworks[name] = {k: fw.get(k) for k in ("version", "install", "where", "blocked", "repro")}
        for v in fw.get("variants") or []:
            base = dict(framework=name, version=version, variant=str(v["name"]), target=str(v["target"]),
                        paper=str(v.get("paper") or ""), note=str(v.get("note") or ""))
            claims = list(v.get("claims") or [])
            if not claims:
                cells.append(Cell(spec=None, status=NO_SPEC, why=str(v.get("why") or ""), **base))
                continue
            for spec in claims:
                if spec not in specs:
                    specs.append(spec)
                cells.append(_cell(base, spec, fw, have, receipts_for, predicate_of))
    order = [s for s in zoo.get("columns") or [] if s in specs]
    specs = order + [s for s in specs if s not in order]
    return Matrix(frameworks=frameworks, specs=specs, cells=cells, defects=_defects(zoo, cells),
                  zoo=display_path(Path(zoo_path), root), store=display_path(Path(receipts_dir), root))


def _cell(base: dict, spec: str, fw: dict, have: set, receipts_for, predicate_of) -> Cell:
    if fw.get("blocked"):
        return Cell(spec=spec, status=BLOCKED, why=str(fw["blocked"]), **base)
    if spec not in have:
        return Cell(spec=spec, status=NO_SPEC_FILE, why=f"no specs/{spec}.yaml in this checkout", **base)
    receipts = receipts_for(spec).get(base["target"], [])
    fresh = [a for a in receipts if a.state == "fresh"]
    command = f"contracts check {spec} --impl {base['target']}"
    a, pred = None, None
    for a in _by_preference(fresh):
        pred = predicate_of(spec, a)
        if pred is not None:
            break
    if pred is None:
        status = STALE if receipts else NO_RECEIPT
        why = (f"{len(receipts)} receipt(s) of other files only; rerun: {command}" if receipts
               else f"run: {command}")
        return Cell(spec=spec, status=status, why=why, **base)
    contracts = contracts_of(pred, spec, base["target"])
    request = pred.get("request") or {}
    return Cell(spec=spec, status=cell_status(contracts) if contracts else NOT_APPLICABLE, receipt=a.file,
                created_at=a.created_at, commit=((pred.get("git") or {}).get("commit") or "")[:12] or None,
                seeds=tuple(request.get("seeds") or ()), subset=tuple(request.get("only") or ()),
                contracts=contracts, **base)


def _defects(zoo: dict, cells: list[Cell]) -> list[Defect]:
    """Every failing contract of every cell, grouped under its framework-neutral description (the table's `defects`,
    keyed `spec/contract` or `contract`); a failure with none gets the contract's id and a pointer to write one."""
    texts = zoo.get("defects") or {}
    seen: dict[str, list] = {}
    for cell in cells:
        for c in cell.failing:
            key = f"{cell.spec}/{c.id}" if f"{cell.spec}/{c.id}" in texts else c.id
            seen.setdefault(key, []).append((cell.label, cell.spec, c.id))
    out = []
    for key, where in seen.items():
        d = texts.get(key) or {}
        out.append(Defect(key=key, title=str(d.get("title") or key), severity=str(d.get("severity") or "medium"),
                          text=str(d.get("text") or "no framework-neutral description yet: add one under `defects:` "
                                                     "in the zoo table"), seen_in=tuple(where)))
    return sorted(out, key=lambda d: (SEVERITIES.index(d.severity) if d.severity in SEVERITIES else 9, d.key))
