"""What the browser shows, computed from specs and the receipt index; no widgets here, no torch.

`build_model` runs in a worker thread: it validates the specs, refreshes the
receipt index incrementally, works out freshness, and condenses everything
into per-method rows the screens only have to draw.

The gate verdict comes from `gate_for` below, the one place the TUI asks for
it. engine/gate.py is being written on another branch; until it is merged this
adapter evaluates the spec's `promotion.requires` itself (provisionally, from
the index summaries) and says so on the Gate tab.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.index import FRESH, STALE, Freshness, ReceiptIndex, freshness_of
from engine.spec import display_path, spec_files, validate_file

# --- rows -------------------------------------------------------------------


@dataclass
class ReceiptRow:
    """One receipt as listed: its index summary and its freshness against the working tree."""

    file: str  # path inside the store: <method>/<name>.json
    entry: dict
    freshness: str  # fresh | stale | tampered | invalid
    changed: tuple = ()

    @property
    def method(self) -> str:
        return self.entry.get("method") or self.file.split("/", 1)[0]

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
    def problem(self) -> str:
        """Why this receipt does not count, in one line ('' when it is fresh)."""
        if self.freshness == STALE:
            return "changed since the run: " + ", ".join(self.changed[:4]) + (" ..." if len(self.changed) > 4 else "")
        return self.entry.get("message") or ""

    def search_text(self) -> str:
        e = self.entry
        return " ".join(str(x) for x in (self.file, e.get("created_at"), e.get("device"), e.get("device_name"),
                                         e.get("status"), self.freshness, e.get("receipt_id"), e.get("commit"),
                                         " ".join(map(str, e.get("seeds") or [])))).lower()


@dataclass
class ContractRow:
    """One contract of a spec against the latest receipts holding it, per device."""

    id: str
    kind: str
    description: str
    cells: dict  # device -> (status | None, freshness | None)
    worst_margin: float | None
    latest: str  # "cpu: metric value <= threshold" of the newest result
    seeds_passed: str  # "2/3" budget seeds passed in the newest result
    newest_status: str | None
    newest_file: str | None
    cell_files: dict = field(default_factory=dict)  # device -> the receipt behind that cell

    @property
    def open_file(self) -> str | None:
        """The receipt that explains the row: the worst device cell's, else the newest."""
        worst = self.overall
        for dev, (st, _) in self.cells.items():
            if st == worst and st != "passed" and dev in self.cell_files:
                return self.cell_files[dev]
        return self.newest_file

    def search_text(self) -> str:
        return f"{self.id} {self.kind} {self.description} {self.newest_status}".lower()

    @property
    def overall(self) -> str | None:
        """The worst status over each device's latest run (None: never run)."""
        seen = {s for s, _ in self.cells.values() if s is not None}
        for s in ("error", "failed", "interrupted", "passed"):
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


@dataclass
class MethodModel:
    key: str
    spec: dict | None
    spec_file: str
    problems: list  # spec errors as one-line texts
    receipts: list  # ReceiptRow, newest first
    contracts: list
    mutants: list
    gate: GateView
    devices: list
    spec_obj: Any = field(default=None, repr=False)  # engine.spec.Spec, for engine.gate

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
        return (f"{passed}/{len(self.contracts)} contracts passed, {killed}/{len(self.mutants)} mutants killed, "
                f"gate {self.gate.verdict}")


@dataclass
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
        key = file.split("/", 1)[0]
        m = self.method(key)
        return next((r for r in m.receipts if r.file == file), None) if m else None


# --- building ---------------------------------------------------------------


def _contract_rows(spec: dict, receipts: list[ReceiptRow], devices: list[str]) -> list[ContractRow]:
    budget_seeds = list(spec["budget"]["seeds"])
    usable = [r for r in receipts if r.freshness in (FRESH, STALE)]  # tampered/corrupt say nothing
    rows = []
    for c in spec["contracts"]:
        cid = c["id"]
        cells: dict[str, tuple] = {}
        margins = []
        files: dict[str, str] = {}
        for dev in devices:
            hit = next((r for r in usable if r.device == dev and cid in r.entry["contracts"]), None)
            if hit is None:
                cells[dev] = (None, None)
                continue
            d = hit.entry["contracts"][cid]
            cells[dev] = (d[0], hit.freshness)
            files[dev] = hit.file
            if d[4][4] is not None:
                margins.append(d[4][4])
            elif d[0] != "passed":
                margins.append(-math.inf)
        newest = next((r for r in usable if cid in r.entry["contracts"]), None)
        if newest is not None:
            d = newest.entry["contracts"][cid]
            metric, value, op, threshold, _ = d[4]
            from tui.fmt import expectation

            latest = f"{newest.device}: {expectation(metric, value, op, threshold)}"
            passed = [s for s in d[1] if s in budget_seeds]
            seeds = f"{len(passed)}/{len(budget_seeds)}"
            status = d[0]
        else:
            latest, seeds, status = "never run", f"0/{len(budget_seeds)}", None
        rows.append(ContractRow(id=cid, kind=c["kind"], description=c["description"], cells=cells,
                                worst_margin=min(margins) if margins else None, latest=latest, seeds_passed=seeds,
                                newest_status=status, newest_file=newest.file if newest else None,
                                cell_files=files))
    return rows


def _mutant_rows(spec: dict, receipts: list[ReceiptRow]) -> list[MutantRow]:
    usable = [r for r in receipts if r.freshness in (FRESH, STALE)]
    out = []
    for m in spec["mutants"]:
        hit = next((r for r in usable if m["id"] in r.entry["mutants"]), None)
        out.append(MutantRow(id=m["id"], description=m["description"], killed_by=list(m["killed_by"]),
                             killed=None if hit is None else hit.entry["mutants"][m["id"]]))
    return out


def build_model(specs_dir: Path, receipts_dir: Path, root: Path, index: ReceiptIndex,
                fresh: Freshness, progress=None) -> Model:
    """Validate specs, refresh the index (parsing only new receipts), condense per method."""
    specs_dir, receipts_dir = Path(specs_dir), Path(receipts_dir)
    problems: list[str] = []
    specs: dict[str, tuple[dict | None, str, list[str]]] = {}
    if not specs_dir.is_dir():
        problems.append(f"no specs folder {display_path(specs_dir, root)}/: pass --specs DIR or run from the "
                        "project checkout")
    else:
        files = spec_files(specs_dir)
        if not files:
            problems.append(f"no spec files in {display_path(specs_dir, root)}/: add specs/<method>.yaml "
                            "(see README, 'Adding a method')")
        for f in files:
            try:
                spec, errs = validate_file(f, root)
            except Exception as err:  # a bug of ours must not take the browser down
                spec, errs = None, [err]
            key = spec.key if spec is not None else f.stem
            lines = [e.line() if hasattr(e, "line") else f"{type(e).__name__}: {e}" for e in errs]
            specs[key] = (spec if spec else None, display_path(f, root), lines)
    refresh = index.refresh(progress)
    fresh.forget()
    by_method: dict[str, list[ReceiptRow]] = {}
    for e in index.entries():
        state, changed = freshness_of(e, index, fresh)
        row = ReceiptRow(file=e["file"], entry=e, freshness=state, changed=changed)
        by_method.setdefault(e["file"].split("/", 1)[0], []).append(row)
    for rows in by_method.values():
        rows.reverse()  # newest first
    if not len(index):
        problems.append(f"no receipts yet in {display_path(receipts_dir, root)}/: run "
                        "contracts check METHOD --device cpu")
    methods = []
    for key in sorted(set(specs) | set(by_method)):
        spec_obj, shown, errs = specs.get(key, (None, f"specs/{key}.yaml", [f"specs/{key}.yaml: no spec for the "
                                                                                f"receipts in {key}/"]))
        data = spec_obj.data if spec_obj is not None else None
        receipts = by_method.get(key, [])
        if data is None:
            methods.append(MethodModel(key=key, spec=None, spec_file=shown, problems=errs, receipts=receipts,
                                       contracts=[], mutants=[], devices=sorted({r.device for r in receipts}),
                                       gate=GateView("closed", [(errs[0] if errs else "spec is broken",
                                                                 f"contracts validate {shown}")], "tui")))
            continue
        required = list(data["promotion"]["requires"]["devices"])
        devices = required + sorted({r.device for r in receipts if r.device not in required and r.device != "?"})
        contracts = _contract_rows(data, receipts, devices)
        mutants = _mutant_rows(data, receipts)
        gate = gate_for(key, data, shown, receipts)
        methods.append(MethodModel(key=key, spec=data, spec_file=shown, problems=[], receipts=receipts,
                                   contracts=contracts, mutants=mutants, gate=gate, devices=devices,
                                   spec_obj=spec_obj))
    if not refresh.persisted and refresh.parsed:
        problems.append(f"index not saved ({display_path(receipts_dir, root)}/ is not writable): receipts are "
                        "re-read on every start")
    return Model(methods=methods, problems=problems, receipts_total=len(index), specs_dir=specs_dir,
                 receipts_dir=receipts_dir, parsed=refresh.parsed)


# --- the gate: the one place the TUI asks for a verdict --------------------------


def gate_for(key: str, spec: dict, spec_file: str, receipts: list[ReceiptRow]) -> GateView:
    """The first verdict drawn, from the index alone (instant at any store size).

    `engine_gate_view` then replaces it with engine.gate's own verdict in a
    worker, where engine.gate exists, so the TUI and `contracts gate` agree.
    """
    return provisional_gate(key, spec, spec_file, receipts)


def engine_gate_view(spec_obj: Any, receipts_dir: Path, root: Path, specs_dir: Path) -> GateView | None:
    """engine.gate's verdict as a GateView; None while engine.gate is not merged (ImportError)."""
    try:
        from engine import gate as engine_gate
    except ImportError:
        return None
    result = engine_gate.evaluate(spec_obj, Path(receipts_dir), Path(root), Path(specs_dir))
    reqs = [r for r in result.get("requirements") or [] if isinstance(r, dict)]
    unmet = [(f"{r.get('id')}: {r.get('detail')}", r.get("fix") or "") for r in reqs
             if r.get("required", True) and not r.get("met")]
    met = [f"{r.get('id')}: {r.get('detail')}" for r in reqs if r.get("met")]
    return GateView("open" if result.get("promotable") else "closed", unmet, "engine.gate", met,
                    list(result.get("warnings") or []))


# Two-sided 95% Student t quantiles, df 1..30 (beyond: normal 1.96).
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]


def paired_ci(method: list, control: list) -> tuple[float, float, float] | None:
    """(mean difference, low, high): paired t 95% interval of method - control; None if it cannot be formed."""
    if not method or len(method) != len(control) or len(method) < 2:
        return None
    diffs = [float(a) - float(b) for a, b in zip(method, control)]
    if not all(math.isfinite(d) for d in diffs):
        return None
    mean = statistics.fmean(diffs)
    half = (_T95[len(diffs) - 2] if len(diffs) - 1 <= 30 else 1.96) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half


def provisional_gate(key: str, spec: dict, spec_file: str, receipts: list[ReceiptRow]) -> GateView:
    """DESIGN.md's gate rules over fresh, untampered receipts (stand-in until engine.gate lands)."""
    req = spec["promotion"]["requires"]
    seeds = list(spec["budget"]["seeds"])
    seeds_arg = ",".join(map(str, seeds))
    fresh = [r for r in receipts if r.counts_for_gate]
    unmet, met = [], []
    review = spec["promotion"]["review"]
    if review != req["review"]:
        unmet.append((f"review is {review}, not {req['review']}",
                      f"a reviewer sets promotion.review: {req['review']} in {spec_file}"))
    else:
        met.append(f"review {review}")
    stale = [r for r in receipts if r.freshness == STALE]
    if stale:
        changed = sorted({c for r in stale for c in r.changed})
        unmet.append((f"{len(stale)} stale receipt(s) do not count (changed: {', '.join(changed[:3])}"
                      f"{' ...' if len(changed) > 3 else ''})", f"contracts check {key} --device cpu"))
    bad = [r for r in receipts if r.freshness not in (FRESH, STALE)]
    if bad:
        unmet.append((f"{len(bad)} tampered or corrupt receipt(s) ignored", f"contracts verify {key}"))
    for dev in req["devices"]:
        on_dev = [r for r in fresh if r.device == dev]
        if not on_dev:
            unmet.append((f"no fresh {dev} receipt", f"contracts check {key} --device {dev} --seeds {seeds_arg}"))
            continue
        missing = []
        for c in spec["contracts"]:
            decided: dict = {}  # seed -> passed, as the newest fresh receipt running that seed says
            for r in on_dev:
                d = r.entry["contracts"].get(c["id"])
                if d is not None:
                    for s in r.entry.get("seeds") or []:
                        decided.setdefault(s, s in d[1])
            passed = {s for s, ok in decided.items() if ok}
            ok = set(seeds) <= passed if req["all_budget_seeds"] else bool(passed)
            if not ok:
                lacking = sorted(set(seeds) - passed) if req["all_budget_seeds"] else seeds[:1]
                missing.append(f"{c['id']} (seeds {','.join(map(str, lacking))})")
        if missing:
            unmet.append((f"not passed on {dev} in a fresh receipt: {', '.join(missing[:3])}"
                          f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}",
                          f"contracts check {key} --device {dev} --seeds {seeds_arg}"))
        else:
            met.append(f"every contract passed on {dev} for seeds {seeds_arg}")
    if req["mutants_killed"]:
        killed = {mid for r in fresh for mid, k in r.entry["mutants"].items() if k}
        alive = [m["id"] for m in spec["mutants"] if m["id"] not in killed]
        if alive:
            unmet.append((f"mutant(s) not killed in a fresh receipt: {', '.join(alive[:3])}"
                          f"{f' and {len(alive) - 3} more' if len(alive) > 3 else ''}",
                          f"contracts check {key} --device {req['devices'][0]}"))
        else:
            met.append(f"all {len(spec['mutants'])} mutants killed")
    if req["formal_comparison"]:
        best = None
        for r in fresh:
            for comp in r.entry.get("formal") or []:
                ci = paired_ci(comp.get("method_values") or [], comp.get("control_values") or [])
                if ci is not None and ci[1] > 0:
                    best = (r, comp, ci)
                    break
            if best:
                break
        if best is None:
            unmet.append(("no fresh formal comparison showing the method ahead of its control (95% paired t "
                          "interval of method - control above zero)",
                          f"contracts check {key} --device {req['devices'][-1]} --seeds {seeds_arg}"))
        else:
            _, comp, (mean, lo, hi) = best
            met.append(f"formal comparison {comp.get('name')}: {mean:+.3g} [{lo:+.3g}, {hi:+.3g}]")
    return GateView("closed" if unmet else "open", unmet, "provisional (tui/data.py; engine.gate not merged yet)",
                    met)


# --- details, on demand -------------------------------------------------------------


@dataclass
class Detail:
    """A whole receipt, read when opened: parsed data (None if unreadable) and its text."""

    file: str
    data: dict | None
    text: str
    error: str = ""


MAX_RAW_CHARS = 400_000


def load_detail(receipts_dir: Path, file: str) -> Detail:
    """Read one receipt in full; never raises (a broken file comes back with `error`)."""
    from engine.receipts import load_receipt

    path = Path(receipts_dir) / file
    try:
        raw = path.read_bytes()
    except OSError as err:
        return Detail(file, None, "", f"cannot read: {err.strerror}")
    text = raw.decode("utf-8", errors="replace")
    if len(text) > MAX_RAW_CHARS:
        text = text[:MAX_RAW_CHARS] + f"\n... ({len(raw)} bytes; the rest is not shown)"
    try:
        data = load_receipt(path)
    except ValueError as err:
        return Detail(file, None, text, str(err))
    return Detail(file, data, text)


def previous_receipt(model: Model, file: str) -> ReceiptRow | None:
    """The receipt of the same method written just before this one (parseable ones only)."""
    row = model.receipt(file)
    if row is None:
        return None
    rows = model.method(row.file.split("/", 1)[0]).receipts  # newest first
    i = next(i for i, r in enumerate(rows) if r.file == file)
    return next((r for r in rows[i + 1:] if r.freshness in (FRESH, STALE)), None)


def method_of(file: str) -> str:
    return file.split("/", 1)[0]


def as_text(value: Any) -> str:
    """A value as the clipboard should get it."""
    if hasattr(value, "plain"):
        return value.plain
    return str(value)


def model_as_dict(model: Model) -> dict:
    """What the first screen shows, as data (`contracts tui --json`)."""
    return {
        "methods": [{
            "method": m.key, "spec": m.spec_file, "review": m.review, "promotion": m.promotion,
            "gate": {"verdict": m.gate.verdict, "source": m.gate.source,
                     "unmet": [{"what": w, "how": h} for w, h in m.gate.unmet]},
            "summary": m.summary(), "problems": list(m.problems), "receipts": len(m.receipts),
            "contracts": [{"id": c.id, "kind": c.kind, "status": c.overall,
                           "devices": {d: {"status": s, "evidence": f} for d, (s, f) in c.cells.items()},
                           "worst_margin": c.worst_margin, "latest": c.latest, "seeds_passed": c.seeds_passed}
                          for c in m.contracts],
        } for m in model.methods],
        "problems": list(model.problems),
        "receipts": model.receipts_total,
    }
