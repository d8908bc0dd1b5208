"""The read model as the browser (`contracts tui`) gets it: one call, `build_model`, gives every row the screens
draw; no widgets here, no torch.

`build_model` runs in the TUI's worker thread: it validates the specs, refreshes the receipt index incrementally
(engine/store/index.py: thousands of receipts, read once), works out freshness, and condenses everything into
rows per (method, implementation unit): the registered implementation's row, and a row of its own for each
`--impl` candidate with receipts, whose receipts never enter the registered one's counts. Outcomes are worded by
engine.store.records.describe, as in `list` and `show`.

The gate verdict comes from `gate_for` below: engine.store.overview.Overview.verdict over the spec file and every
receipt file, exactly as `contracts gate` derives it. The index and the validation cache live in the store, which
whoever writes receipts can edit, so they only speed up what the browser lists; the Gate tab never reads them
(tests/test_tui.py poisons both).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.run.expect import describe, format_headroom, is_sanity, worst_expectation
from engine.spec.loader import Spec, display_path, spec_files
from engine.store.cache import ValidationCache
from engine.store.coverage import Coverage, coverage, previous_full
from engine.store.index import FRESH, STALE, Freshness, ReceiptIndex, freshness_of
from engine.store.records import DEFAULT_UNIT, Described, Mutation
from engine.store.records import describe as describe_outcome
from engine.tiers import tier_of


def load_specs(specs_dir: Path, root: Path, cache_dir: Path | None) -> dict[str, tuple[Spec | None, str, list[str]]]:
    """key -> (Spec or None, display path, error lines) for every spec file, from the validation cache where it
    holds (engine/store/cache.py: each result under the spec's sha256 and a fingerprint of what validates)."""
    # A new cache object per load: the app runs for hours, and the sources it fingerprints may change meanwhile.
    cache = ValidationCache(cache_dir)
    out: dict[str, tuple[Spec | None, str, list[str]]] = {}
    for f in spec_files(specs_dir):
        shown = display_path(f, root)
        try:
            spec, errs = cache.validate_file(f, root)
        except Exception as err:  # a bug of ours must not take the browser down
            spec, errs = None, [err]
        errors = [e.line() if hasattr(e, "line") else f"{shown}: {type(e).__name__}: {e}" for e in errs]
        out[spec.key if spec is not None else f.stem] = (spec, shown, errors)
    cache.flush()
    return out

# --- rows -------------------------------------------------------------------


@dataclass
class ReceiptRow:
    """One receipt as listed: its index summary and its freshness against the working tree."""

    file: str  # path inside the store: <method>/<name>.json
    entry: dict
    freshness: str  # fresh | stale | tampered | invalid
    changed: tuple = ()
    contracts: list = field(default_factory=list)  # contract ids it holds results for
    spec_data: Any = field(default=None, repr=False, compare=False)  # its method's spec, for coverage's total

    @property
    def coverage(self) -> Coverage | None:
        """`full` or `partial 1/10` with why (engine.store.coverage, from the facts the index keeps); None for a
        file that is not a readable receipt. Worked out when first asked: a start lists thousands of rows."""
        if "_coverage" not in self.__dict__:
            facts = self.entry.get("coverage")
            self.__dict__["_coverage"] = coverage(facts, self.spec_data) if isinstance(facts, dict) else None
        return self.__dict__["_coverage"]

    @property
    def coverage_label(self) -> str:
        c = self.coverage
        return c.label() if c is not None else "–"

    @property
    def folder(self) -> str:
        """The method folder it is filed under ('' for a file at the top of the store)."""
        return self.file.rsplit("/", 1)[0] if "/" in self.file else ""

    @property
    def method(self) -> str:
        return self.entry.get("method") or self.folder

    @property
    def receipt_id(self) -> str | None:
        return self.entry.get("receipt_id")

    @property
    def short_id(self) -> str:
        return (self.receipt_id or "?")[:12]

    @property
    def created_at(self) -> str | None:
        return self.entry.get("created_at")

    @property
    def device(self) -> str:
        return self.entry.get("device") or "?"

    @property
    def status(self) -> str | None:
        return self.entry.get("status")

    @property
    def counts_for_gate(self) -> bool:
        return self.freshness == FRESH

    @property
    def unit(self) -> str:
        """'default' (the spec's registered implementation) or 'impl:<digest>' (an --impl candidate)."""
        return self.entry.get("unit") or DEFAULT_UNIT

    @property
    def impl_label(self) -> str:
        return self.entry.get("impl_label") or DEFAULT_UNIT

    @property
    def mutation(self) -> Mutation | None:
        m = self.entry.get("mutation")
        return Mutation(score=m.get("score"), complete=m.get("complete") is True) if isinstance(m, dict) else None

    @property
    def described(self) -> Described:
        """The outcome in the words `list` and `show` use: 'passed (partial 3/12)', 'mutate 1.000 (full)'."""
        return describe_outcome(self.status, self.mutation, self.coverage)

    @property
    def problem(self) -> str:
        """Why this receipt does not count, in one line ('' when it is fresh)."""
        if self.freshness == STALE:
            return "changed since the run: " + ", ".join(self.changed[:4]) + (" ..." if len(self.changed) > 4 else "")
        return self.entry.get("message") or ""

    def search_text(self) -> str:
        e = self.entry
        return " ".join(str(x) for x in (self.file, e.get("created_at"), e.get("device"), e.get("device_name"),
                                         e.get("status"), self.freshness, e.get("receipt_id"), e.get("commit"),
                                         " ".join(map(str, e.get("seeds") or [])), self.coverage_label,
                                         self.described.status)).lower()


@dataclass
class ContractRow:
    """One contract of a spec against the latest receipts holding it, per device."""

    id: str
    kind: str
    description: str
    cells: dict  # device -> (status | None, freshness | None)
    worst_headroom: str  # "10^3.2x", "held", "not held" (equality-only contracts), "–"
    worst_margin: float | None  # the worst-headroom expectation's margin (kept for `tui --json` readers)
    latest: str  # "cpu: metric value <= threshold" of the newest result
    seeds_passed: str  # "2/3" budget seeds passed in the newest result
    newest_status: str | None
    newest_file: str | None
    cell_files: dict = field(default_factory=dict)  # device -> the receipt behind that cell
    tier: str = "math"  # math | budget | scale (engine/tiers.py)

    @property
    def open_file(self) -> str | None:
        """The receipt that explains the row: the worst device cell's, else the newest."""
        worst = self.overall
        for dev, (st, _) in self.cells.items():
            if st == worst and st != "passed" and dev in self.cell_files:
                return self.cell_files[dev]
        return self.newest_file

    def search_text(self) -> str:
        return f"{self.id} {self.kind} {self.tier} {self.description} {self.newest_status}".lower()

    @property
    def overall(self) -> str | None:
        """The worst status over each device's latest run (None: never run)."""
        seen = {s for s, _ in self.cells.values() if s is not None}
        for s in ("error", "failed", "interrupted", "partial", "not_applicable", "passed"):
            if s in seen:
                return s
        return self.newest_status

    @property
    def failing(self) -> bool:
        return self.overall in ("failed", "error", "interrupted")


@dataclass
class MutantRow:
    id: str
    description: str
    killed_by: list
    killed: bool | None  # None: no receipt ran it


@dataclass
class GateView:
    """The verdict and every unmet requirement with the command that would meet it."""

    verdict: str  # open | closed | unknown
    unmet: list  # [(what is missing, command that would meet it)]
    source: str  # which evaluator produced it
    met: list = field(default_factory=list)
    warnings: list = field(default_factory=list)


@dataclass(repr=False)
class MethodModel:
    """One row of the method tree: a method's registered implementation, or one --impl candidate of it."""

    key: str  # the row's name: the method key, or 'KEY --impl TARGET (digest)' for a candidate
    spec: dict | None
    spec_file: str
    problems: list  # spec errors as one-line texts
    receipts: list  # ReceiptRow, newest first (this unit's only)
    contracts: list
    mutants: list
    gate: GateView
    devices: list
    spec_obj: Any = field(default=None, repr=False)  # engine.spec.loader.Spec, for engine.gate.verdict
    method_key: str = ""  # the spec's key ('' = key)
    unit: str = DEFAULT_UNIT  # 'default' or 'impl:<digest>'

    def __post_init__(self) -> None:
        self.method_key = self.method_key or self.key

    @property
    def candidate(self) -> bool:
        """An --impl candidate's row: checked and gated with --impl, never promoted from here."""
        return self.unit != DEFAULT_UNIT

    @property
    def review(self) -> str:
        return (self.spec or {}).get("promotion", {}).get("review", "?")

    @property
    def promotion(self) -> str:
        return (self.spec or {}).get("promotion", {}).get("state", "?")

    def summary(self) -> str:
        """'11/12 contracts passed, 6/6 mutants killed, gate closed'."""
        if self.spec is None:
            return "spec missing or broken, gate closed"
        passed = sum(c.overall == "passed" for c in self.contracts)
        killed = sum(m.killed is True for m in self.mutants)
        verdict = "pending" if self.gate.verdict == "unknown" else self.gate.verdict
        return (f"{passed}/{len(self.contracts)} contracts passed, {killed}/{len(self.mutants)} mutants killed, "
                f"gate {verdict}")


@dataclass(repr=False)  # a repr would list every receipt
class Model:
    methods: list
    problems: list  # store-wide problems and hints, one line each
    receipts_total: int
    specs_dir: Path
    receipts_dir: Path
    parsed: int = 0  # receipt files read on this refresh (the rest came from the index)

    def method(self, key: str) -> MethodModel | None:
        return next((m for m in self.methods if m.key == key), None)

    def receipt(self, file: str) -> ReceiptRow | None:
        for m in self.methods:
            for r in m.receipts:
                if r.file == file:
                    return r
        return None


# --- building ---------------------------------------------------------------


def _contract_rows(spec: dict, receipts: list[ReceiptRow], devices: list[str],
                   index: ReceiptIndex) -> list[ContractRow]:
    budget_seeds = list(spec["budget"]["seeds"])
    usable = [r for r in receipts if r.freshness in (FRESH, STALE)]  # tampered/corrupt say nothing
    rows = []
    for c in spec["contracts"]:
        cid = c["id"]
        cells: dict[str, tuple] = {}
        files: dict[str, str] = {}
        worst: list = []  # per device cell, the digest's worst expectation
        for dev in devices:
            hit = next((r for r in usable if r.device == dev and cid in r.contracts), None)
            d = (index.heavy(hit.file) or {}).get("c", {}).get(cid) if hit else None
            if d is None:
                cells[dev] = (None, None)
                continue
            cells[dev] = (d[0], hit.freshness)
            files[dev] = hit.file
            if d[4][0] is not None:
                worst.append(_expectation_record(d[4]))
        newest = next((r for r in usable if cid in r.contracts), None)
        d = (index.heavy(newest.file) or {}).get("c", {}).get(cid) if newest else None
        if d is not None:
            # The error against the reference (the worst-headroom expectation), not a sanity count.
            latest = f"{newest.device}: " + (describe(_expectation_record(d[4])) if d[4][0] is not None else "–")
            passed = _seeds_passed(cid, usable, newest, spec, index)
            seeds = f"{len(passed)}/{len(budget_seeds)}"
            status = d[0]
        else:
            latest, seeds, status = "never run", f"0/{len(budget_seeds)}", None
        w = worst_expectation(worst)
        rows.append(ContractRow(id=cid, kind=c["kind"], tier=tier_of(c), description=c["description"], cells=cells,
                                worst_headroom=_worst_cell(w, cells), worst_margin=w.get("margin") if w else None,
                                latest=latest, seeds_passed=seeds,
                                newest_status=status, newest_file=newest.file if d is not None else None,
                                cell_files=files))
    return rows


def _seeds_passed(cid: str, usable: list, newest, spec: dict, index: ReceiptIndex) -> list:
    """Budget seeds the contract passed as the gate counts them: on every required device, in any fresh receipt of
    that device (a one-seed mutate run beside a full check does not make it 1/3); with no fresh receipt holding the
    contract, the newest receipt's."""
    budget_seeds = list(spec["budget"]["seeds"])
    required = list(spec["promotion"]["requires"]["devices"])

    def seeds_in(rows) -> set:
        out: set = set()
        for r in rows:
            d = (index.heavy(r.file) or {}).get("c", {}).get(cid)
            out.update(d[1] if d else ())
        return out

    fresh = [r for r in usable if r.freshness == FRESH and cid in r.contracts]
    if not fresh:
        got = seeds_in([newest])
    else:
        got = set(budget_seeds)
        for dev in required or sorted({r.device for r in fresh}):
            got &= seeds_in([r for r in fresh if r.device == dev])
    return [s for s in budget_seeds if s in got]


def _expectation_record(w: list) -> dict:
    """The index digest's worst expectation back as a receipt-like record (older digests lack the tail)."""
    w = list(w) + [None] * (7 - len(w))
    return {"metric": w[0], "value": w[1], "op": w[2], "threshold": w[3], "headroom": w[4], "passed": w[5],
            "margin": w[6]}


def _worst_cell(w: dict | None, cells: dict) -> str:
    """The worst headroom as shown: a ratio, `held`/`not held` for sanity checks, `–` when nothing ran."""
    if w is None:
        return "not held" if any(st not in (None, "passed") for st, _ in cells.values()) else "–"
    if is_sanity(w) or w.get("headroom") is None:
        return "held" if w.get("passed") else "not held"
    return format_headroom(w["headroom"])


def _mutant_rows(spec: dict, receipts: list[ReceiptRow], index: ReceiptIndex) -> list[MutantRow]:
    usable = [r for r in receipts if r.freshness in (FRESH, STALE)]
    out = []
    for m in spec["mutants"]:
        killed = None
        for r in usable:  # newest first: stop at the first receipt that ran this mutant
            verdicts = (index.heavy(r.file) or {}).get("m", {})
            if m["id"] in verdicts:
                killed = verdicts[m["id"]]
                break
        out.append(MutantRow(id=m["id"], description=m["description"], killed_by=list(m["killed_by"]), killed=killed))
    return out


PENDING = GateView("unknown", [], "engine.gate (evaluating ...)")


def build_model(specs_dir: Path, receipts_dir: Path, root: Path, index: ReceiptIndex,
                fresh: Freshness, progress=None, gates: bool = False, trust: Path | None = None) -> Model:
    """Validate specs, refresh the index (parsing only new receipts), condense per method.

    With `gates`, evaluate every gate now (from the files, under the trust policy
    file `trust`); otherwise verdicts are PENDING until the app evaluates them in a
    worker after the first paint.
    """
    specs_dir, receipts_dir = Path(specs_dir), Path(receipts_dir)
    problems: list[str] = []
    specs: dict[str, tuple[Any, str, list[str]]] = {}
    if not specs_dir.is_dir():
        problems.append(f"no specs folder {display_path(specs_dir, root)}/: pass --specs DIR or run from the "
                        "project checkout")
    else:
        specs = load_specs(specs_dir, root, receipts_dir)
        if not specs:
            problems.append(f"no spec files in {display_path(specs_dir, root)}/: add specs/<method>.yaml "
                            "(see docs/adding-a-method.md)")
    refresh = index.refresh(progress)
    fresh.forget()
    by_method: dict[str, list[ReceiptRow]] = {}
    candidates: dict[str, dict[str, list[ReceiptRow]]] = {}  # method -> unit -> its receipts
    for e in index.entries():
        state, changed = freshness_of(e, index, fresh)
        row = ReceiptRow(file=e["file"], entry=e, freshness=state, changed=changed, contracts=index.contracts_of(e))
        if row.unit == DEFAULT_UNIT:
            by_method.setdefault(row.folder, []).append(row)
        else:  # [impl] a candidate's receipts are its own row, never in the registered implementation's counts
            candidates.setdefault(row.folder, {}).setdefault(row.unit, []).append(row)
    for rows in [*by_method.values(), *(r for units in candidates.values() for r in units.values())]:
        rows.reverse()  # newest first
    if not len(index):
        problems.append(f"no receipts yet in {display_path(receipts_dir, root)}/: run "
                        "contracts check METHOD --device cpu")
    methods = []
    for key in sorted(set(specs) | set(by_method)):
        missing = [f"specs/{key}.yaml: no spec for the receipts in {key}/"] if key else [
            "receipts outside any method folder (see contracts verify)"]
        spec_obj, shown, errs = specs.get(key, (None, f"specs/{key}.yaml", missing))
        receipts = by_method.get(key, [])
        for r in receipts:
            r.spec_data = spec_obj.data if spec_obj is not None else None
        if spec_obj is None:
            methods.append(MethodModel(key=key or "(no folder)", spec=None, spec_file=shown, problems=errs,
                                       receipts=receipts, contracts=[], mutants=[],
                                       devices=sorted({r.device for r in receipts}),
                                       gate=GateView("closed", [(errs[0] if errs else "spec is broken",
                                                                 f"contracts validate {shown}")], "tui")))
            continue
        data = spec_obj.data
        required = list(data["promotion"]["requires"]["devices"])
        for unit, rows in [(DEFAULT_UNIT, receipts), *sorted(candidates.get(key, {}).items())]:
            for r in rows:
                r.spec_data = data
            devices = required + sorted({r.device for r in rows if r.device not in required and r.device != "?"})
            methods.append(MethodModel(key=key if unit == DEFAULT_UNIT else f"{key} {rows[0].impl_label}",
                                       spec=data, spec_file=shown, problems=[], receipts=rows,
                                       contracts=_contract_rows(data, rows, devices, index),
                                       mutants=_mutant_rows(data, rows, index), gate=PENDING, devices=devices,
                                       spec_obj=spec_obj, method_key=key, unit=unit))
    if not refresh.persisted and refresh.parsed:
        problems.append(f"index not saved ({display_path(receipts_dir, root)}/ is not writable): receipts are "
                        "re-read on every start")
    model = Model(methods=methods, problems=problems, receipts_total=len(index), specs_dir=specs_dir,
                  receipts_dir=receipts_dir, parsed=refresh.parsed)
    if gates:
        for m in model.methods:
            if m.spec_obj is not None:
                m.gate = gate_for(m.method_key, receipts_dir, root, specs_dir, trust, unit=m.unit)
    return model


# --- the gate: the one place the TUI asks for a verdict --------------------------


def gate_flags(receipts_dir: Path, specs_dir: Path, root: Path) -> str:
    """--specs/--receipts for suggested commands when the folders are not the defaults."""
    import shlex

    from engine.paths import default_receipts_dir, default_specs_dir

    out = ""
    if Path(specs_dir).resolve() != default_specs_dir().resolve():
        out += f" --specs {shlex.quote(display_path(specs_dir, root))}"
    if Path(receipts_dir).resolve() != default_receipts_dir().resolve():
        out += f" --receipts {shlex.quote(display_path(receipts_dir, root))}"
    return out


def gate_views(keys: list, specs_dir: Path, receipts_dir: Path, root: Path, names: dict | None = None,
               trust: Path | None = None) -> dict[str, GateView]:
    """`gate_for` of every row (run in another process for big stores): each key is a method key or a
    (row key, method key, unit) triple, and the result is keyed by the row key.

    `names` (engine.store.cache.names_doc) are the registered names to validate specs against: the calling
    process's own scan, so both processes agree on which specs are valid.
    """
    if names is not None:
        from engine.spec import registry
        from engine.store.cache import names_from

        registry._STATIC = names_from(names)
    triples = [k if isinstance(k, (tuple, list)) else (k, k, DEFAULT_UNIT) for k in keys]
    return {row: gate_for(key, receipts_dir, root, specs_dir, trust, unit=unit) for row, key, unit in triples}


def gate_views_elsewhere(keys: list, specs_dir: Path, receipts_dir: Path, root: Path,
                         trust: Path | None = None) -> dict[str, GateView]:
    """`gate_views` in another process (a big store: the browser's own process keeps the GIL for drawing). The
    other process checks specs against this process's registered names, so both agree on validity."""
    from engine.spec.registry import known_names
    from engine.store.cache import names_doc
    from engine.store.index import spawn_pool

    with spawn_pool(1) as pool:
        return pool.submit(gate_views, keys, specs_dir, receipts_dir, root, names_doc(known_names()),
                           trust).result()


def gate_for(key: str, receipts_dir: Path, root: Path, specs_dir: Path, trust: Path | None = None,
             unit: str = DEFAULT_UNIT) -> GateView:
    """`contracts gate KEY [--impl TARGET] [--trust TRUST]`'s verdict, derived the same way (the read model's
    Overview.verdict): the spec file and the trust policy file are read afresh, and every receipt is what the
    user's sealed index says of it while its file is unchanged (engine/store/sealed_index.py; from its bytes under
    a trust policy or CONTRACTS_NO_CACHE=1), exactly as `contracts gate` reads them; the store's own index and
    validation cache are not consulted."""
    from engine.errors import ContractsError
    from engine.paths import spec_path
    from engine.spec.memo import load_spec
    from engine.store.overview import Overview
    from engine.store.sealed import Sealed
    from engine.store.trust import load_policy

    flags = gate_flags(receipts_dir, specs_dir, root)
    try:
        policy = load_policy(Path(trust), Path(receipts_dir)) if trust is not None else None
        spec = load_spec(spec_path(Path(specs_dir), key), Path(root))
    except ContractsError as err:
        return GateView("closed", [(err.line(), f"contracts gate {key}{flags}")], "engine.gate")
    overview = Overview(Path(specs_dir), Path(receipts_dir), Path(root), policy=policy, flags=flags,
                        sealed=Sealed.for_user(use=policy is None))
    if unit != DEFAULT_UNIT:
        row = overview.method(spec, unit)  # its verdict carries the --impl TARGET its fixes need
        if row is not None:
            return gate_view(dict(row.verdict.result))
    return gate_view(dict(overview.verdict(spec, unit).result))


def gate_view(result: dict, source: str = "engine.gate") -> GateView:
    """engine.gate.verdict.evaluate's result (or the `gate` of `contracts promote --json`) as the Gate tab shows
    it: every unmet requirement with what would meet it."""
    reqs = [r for r in result.get("requirements") or [] if isinstance(r, dict)]
    unmet = [(f"{r.get('id')}: {r.get('detail')}", fix_text(r.get("fix"), r.get("note"))) for r in reqs
             if r.get("required", True) and not r.get("met")]
    met = [f"{r.get('id')}: {r.get('detail')}" for r in reqs if r.get("met")]
    return GateView("open" if result.get("promotable") else "closed", unmet, source, met,
                    list(result.get("warnings") or []))


def fix_text(fix: Any, note: Any = None) -> str:
    """A requirement's fix as one line: a command (`{"argv": [...]}` or a string) or, with no command, its note."""
    import shlex

    if isinstance(fix, dict) and isinstance(fix.get("argv"), list):
        return shlex.join(str(a) for a in fix["argv"])
    if isinstance(fix, str) and fix:
        return fix
    return str(note) if note else ""


# --- details, on demand -------------------------------------------------------------


@dataclass
class Detail:
    """A whole receipt, read when opened: parsed data (None if unreadable) and its text."""

    file: str
    data: dict | None
    text: str
    error: str = ""

    @property
    def predicate(self) -> dict:
        """The run as the file states it, for showing the receipt whole ({} when unreadable). A broken file is shown
        too, so this is the parsed text, not a typed record: screens read it defensively."""
        pred = self.data.get("predicate") if isinstance(self.data, dict) else None
        return pred if isinstance(pred, dict) else {}


MAX_RAW_CHARS = 400_000


def load_detail(receipts_dir: Path, file: str) -> Detail:
    """Read one receipt in full; never raises (a broken file comes back with `error`)."""
    from engine.store.receipts import load_receipt

    from engine.store import bounded

    path = Path(receipts_dir) / file
    try:
        if path.parent.is_symlink():
            raise ValueError("its method folder is a symbolic link; receipts live in real folders of the store")
        raw = bounded.read_regular(path, bounded.MAX_RECEIPT_BYTES)
    except OSError as err:
        return Detail(file, None, "", f"cannot read: {err.strerror}")
    except ValueError as err:  # a symbolic link, not a regular file, over the size limit
        return Detail(file, None, "", str(err))

    def shown(b: bytes) -> str:
        text = b.decode("utf-8", errors="replace")
        if len(text) > MAX_RAW_CHARS:
            text = text[:MAX_RAW_CHARS] + f"\n... ({len(b)} bytes; the rest is not shown)"
        return text

    try:
        data, statement = load_receipt(path, with_bytes=True)
    except ValueError as err:
        return Detail(file, None, shown(raw), str(err))
    return Detail(file, data, shown(statement))  # a signed receipt shows its Statement, not base64


def previous_full_receipt(model: Model, file: str) -> ReceiptRow | None:
    """What `d` compares a receipt with: the newest older receipt of the same method on the same device whose
    coverage is full (engine.store.coverage.previous_full); tampered and corrupt files never count."""
    row = model.receipt(file)
    if row is None:
        return None
    rows = next(m.receipts for m in model.methods if row in m.receipts)
    usable = [r for r in rows if r.freshness in (FRESH, STALE) and isinstance(r.entry.get("coverage"), dict)]
    return previous_full(row, usable, row.spec_data, summary=lambda r: r.entry)


def model_as_dict(model: Model) -> dict:
    """What the first screen shows, as data (`contracts tui --json`)."""
    return {
        "methods": [{
            "method": m.key, "implementation": m.unit, "spec": m.spec_file, "review": m.review,
            "promotion": m.promotion,
            "gate": {"verdict": m.gate.verdict, "source": m.gate.source,
                     "unmet": [{"what": w, "how": h} for w, h in m.gate.unmet]},
            "summary": m.summary(), "problems": list(m.problems), "receipts": len(m.receipts),
            "newest_receipt": None if not m.receipts else {
                "file": m.receipts[0].file, "status": m.receipts[0].status, "evidence": m.receipts[0].freshness,
                "outcome": m.receipts[0].described.short(),
                "coverage": m.receipts[0].coverage.as_dict() if m.receipts[0].coverage is not None else None},
            "contracts": [{"id": c.id, "kind": c.kind, "tier": c.tier, "status": c.overall,
                           "devices": {d: {"status": s, "evidence": f} for d, (s, f) in c.cells.items()},
                           "worst_headroom": c.worst_headroom, "worst_margin": c.worst_margin, "latest": c.latest, "seeds_passed": c.seeds_passed}
                          for c in m.contracts],
        } for m in model.methods],
        "problems": list(model.problems),
        "receipts": model.receipts_total,
    }
