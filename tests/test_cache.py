"""The validation cache (engine/store/cache.py): a hit gives exactly what a fresh validation gives, every input of
the key invalidates it, a broken or unwritable cache changes nothing, and the read-only commands print the
same bytes with and without it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.cli as cli
import engine.gate.promote
import engine.store.receipts
import engine.spec.loader
import engine.store.verify
from engine.store import cache as C
from engine.spec import memo, registry
from engine.spec.loader import spec_files, validate_file
from engine.store.verify import assess
from tests import gate_support as G
from tests.store_sample import copy_sample

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = spec_files(ROOT / "specs")


def _exact(value) -> str:
    """JSON text that tells 1 from 1.0 from True and keeps key order: equal texts mean identical data."""
    return json.dumps(value, allow_nan=True)


class Calls:
    """Counts fresh validations (engine.spec.loader.validate_file) and receipt schema checks behind the cache."""

    def __init__(self, monkeypatch):
        self.specs: list[str] = []
        self.schemas = 0
        real_validate, real_schema = engine.spec.loader.validate_file, engine.store.receipts.schema_problems

        def validate(path, root=None, **kw):
            self.specs.append(Path(path).name)
            return real_validate(path, root, **kw)

        def schema(data, *a, **kw):
            self.schemas += 1
            return real_schema(data, *a, **kw)

        monkeypatch.setattr(engine.spec.loader, "validate_file", validate)
        monkeypatch.setattr(engine.store.receipts, "schema_problems", schema)
        monkeypatch.setattr(engine.store.verify, "schema_problems", schema)  # its own name for it


@pytest.fixture(autouse=True)
def new_process():
    """Each test starts as a fresh process would: no code stamp taken yet (`C.code_stamp` is per process), no
    spec validation remembered (engine/spec/memo.py)."""
    C.code_stamp.cache_clear()
    memo.forget()
    yield
    C.code_stamp.cache_clear()
    memo.forget()


@pytest.fixture
def calls(monkeypatch):
    return Calls(monkeypatch)


def _copy_specs(tmp_path: Path) -> Path:
    specs = tmp_path / "specs"
    specs.mkdir()
    for f in SHIPPED:
        shutil.copy(f, specs / f.name)
    return specs


# --- a hit is a fresh validation ------------------------------------------------------------


def _store_with(tmp_path: Path, path: Path) -> Path:
    """A cache store that holds the validation of `path` (validated by one process, read by the next)."""
    store = tmp_path / "store"
    store.mkdir(exist_ok=True)
    cache = C.ValidationCache(store)
    cache.validate_file(path, ROOT)
    cache.flush()
    assert (store / C.CACHE_NAME).is_file()
    return store


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_a_hit_returns_exactly_what_a_fresh_validation_gives(path, tmp_path, calls):
    fresh, errors = validate_file(path, ROOT)
    assert errors == []
    store = _store_with(tmp_path, path)
    calls.specs.clear()
    hit, errors = C.ValidationCache(store).validate_file(path, ROOT)
    assert calls.specs == [] and errors == [], "a new process must get this spec from the cache"
    assert _exact(hit.data) == _exact(fresh.data)
    assert (hit.path, hit.display, hit.sha256, hit.key) == (fresh.path, fresh.display, fresh.sha256, fresh.key)
    assert hit.doc is None  # not parsed on a hit ...
    for where in (["contracts", 2, "expect", 0], ["mutants", 1], ["promotion", "state"], ["no-such-key"]):
        assert hit.locate(where) == fresh.locate(where)  # ... until a line number is asked for


def _contract_at(ident: str) -> int:
    """The list index of contract `ident` in the shipped TAPO spec: the spec grows, so the test reads where the
    contract is instead of counting."""
    from ruamel.yaml import YAML

    entries = YAML(typ="safe").load((ROOT / "specs" / "tapo-trajectory.yaml").read_text())["contracts"]
    (i,) = [i for i, e in enumerate(entries) if e.get("id") == ident]
    return i


@pytest.mark.parametrize("edit,where", [
    (lambda t: t.replace("level: L1", "level: L7", 1), "$.level"),
    (lambda t: t.replace("check: tapo.clip_schedule", "check: tapo.clip_schedul", 1),
     "$.contracts[{clip_schedule}].check"),
    (lambda t: t + "extra: [unclosed\n", "YAML"),
    (lambda t: t + "title: again\n", "duplicate key"),
])
def test_a_broken_spec_gives_the_same_errors_from_the_cache(edit, where, tmp_path, calls):
    where = where.format(clip_schedule=_contract_at("clip_schedule"))
    bad = tmp_path / "tapo-trajectory.yaml"
    bad.write_text(edit((ROOT / "specs" / "tapo-trajectory.yaml").read_text()))
    fresh = validate_file(bad, tmp_path)[1]
    store = _store_with(tmp_path, bad)
    calls.specs.clear()
    spec, cached = C.ValidationCache(store).validate_file(bad, tmp_path)
    assert spec is None and calls.specs == []
    assert [e.as_dict() for e in cached] == [e.as_dict() for e in fresh] and fresh
    assert [e.line() for e in cached] == [e.line() for e in fresh] and where in fresh[0].line()
    with pytest.raises(engine.spec.loader.SpecError) as err:
        C.ValidationCache(store).load_spec(bad, tmp_path)
    assert err.value.line() == fresh[0].line()


# --- every part of the key invalidates --------------------------------------------------------


def _revalidated(store: Path, path: Path, calls: Calls) -> bool:
    """Validate as a new command would: a new process, so the code stamp is taken afresh."""
    C.code_stamp.cache_clear()
    memo.forget()
    calls.specs.clear()
    C.ValidationCache(store).validate_file(path, ROOT)
    return calls.specs == [path.name]


def test_a_changed_byte_of_the_spec_is_a_miss(tmp_path, calls):
    specs = _copy_specs(tmp_path)
    path = specs / "mrtpo.yaml"
    store = _store_with(tmp_path, path)
    assert not _revalidated(store, path, calls)
    path.write_text(path.read_text().replace("review: DONE", "review: TODO", 1))
    assert _revalidated(store, path, calls)
    spec, _ = C.ValidationCache(store).validate_file(path, ROOT)
    assert spec.data["promotion"]["review"] == "TODO"


def test_the_same_bytes_under_another_file_name_are_a_miss(tmp_path, calls):
    specs = _copy_specs(tmp_path)
    store = _store_with(tmp_path, specs / "mrtpo.yaml")
    other = specs / "other.yaml"
    shutil.copy(specs / "mrtpo.yaml", other)
    assert _revalidated(store, other, calls)
    spec, errors = C.ValidationCache(store).validate_file(other, ROOT)
    assert spec is None and "differs from the file name" in errors[0].message


def _engine_copies(tmp_path: Path, monkeypatch) -> Path:
    """Copies of the files a spec's validation depends on, which the cache then fingerprints instead."""
    copies = tmp_path / "engine"
    files = []
    for f in C.spec_code_files():
        dest = copies / f.relative_to(C._ENGINE)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dest)
        files.append(dest)
    monkeypatch.setattr(C, "spec_code_files", lambda: files)
    return copies


@pytest.mark.parametrize("name", ["spec/loader.py", "spec/registry.py", "errors.py", "store/cache.py", "schemas/spec.schema.json"])
def test_a_changed_engine_file_or_schema_is_a_miss(name, tmp_path, calls, monkeypatch):
    assert C._ENGINE / name in C.spec_code_files()
    copies = _engine_copies(tmp_path, monkeypatch)
    path = ROOT / "specs" / "tapo-trajectory.yaml"
    store = _store_with(tmp_path, path)
    assert not _revalidated(store, path, calls)
    target = copies / name
    target.write_bytes(target.read_bytes() + b"\n")
    assert _revalidated(store, path, calls)


def test_a_long_running_process_keeps_the_stamp_of_the_code_it_loaded(tmp_path, monkeypatch):
    """A TUI left running while the schema is edited validates with the schema it loaded: its later verdicts
    must go under that code's key, never the new one's, or a later `contracts gate` would take an old
    verdict for a fresh one (a new process, with the new schema, must miss)."""
    copies = _engine_copies(tmp_path, monkeypatch)
    store = tmp_path / "store"
    store.mkdir()
    before = C.ValidationCache(store).spec_fingerprint()
    schema = copies / "schemas" / "spec.schema.json"
    schema.write_text(schema.read_text() + "\n")
    assert C.ValidationCache(store).spec_fingerprint() == before, "same process: the code it loaded"
    C.code_stamp.cache_clear()  # a new process
    assert C.ValidationCache(store).spec_fingerprint() != before


@pytest.fixture
def static_only(monkeypatch):
    """No names registered at runtime (an earlier test may have imported methods/): the static scan decides."""
    monkeypatch.setattr(registry, "_REGISTRY", registry.Registry())


def test_a_changed_registry_is_a_miss_and_the_fresh_answer_wins(tmp_path, calls, monkeypatch, static_only):
    path = ROOT / "specs" / "tapo-trajectory.yaml"
    store = _store_with(tmp_path, path)
    assert not _revalidated(store, path, calls)
    names = registry.static_names()
    monkeypatch.setattr(registry, "_STATIC", registry.StaticNames(
        implementations=names.implementations, checks=names.checks - {"tapo.clip_schedule"},
        mutants=names.mutants, files=names.files))
    assert _revalidated(store, path, calls)
    spec, errors = C.ValidationCache(store).validate_file(path, ROOT)
    assert spec is None and "no check named 'tapo.clip_schedule'" in errors[0].message


def test_a_name_registered_at_runtime_is_a_miss(tmp_path, calls, monkeypatch, static_only):
    path = ROOT / "specs" / "tapo-trajectory.yaml"
    store = _store_with(tmp_path, path)
    registry.check("cache.test_only_check")(lambda impl, ctx: {})
    assert _revalidated(store, path, calls)


def test_a_changed_methods_source_changes_the_static_names(tmp_path, calls, monkeypatch, static_only):
    """A new process (no static names in memory) scans methods/ again when a source file changed."""
    methods = tmp_path / "methods"
    shutil.copytree(registry.methods_root(), methods, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(registry, "methods_root", lambda: methods)
    monkeypatch.setattr(registry, "_STATIC", None)
    path = ROOT / "specs" / "tapo-trajectory.yaml"
    store = _store_with(tmp_path, path)
    monkeypatch.setattr(registry, "_STATIC", None)
    scans = []
    real_scan = registry.static_names

    def scan():
        if registry._STATIC is None:  # a real scan, not the memo
            scans.append(1)
        return real_scan()

    monkeypatch.setattr(registry, "static_names", scan)
    assert not _revalidated(store, path, calls) and scans == []  # names and result both from the cache
    assert registry._STATIC is None  # cached names key the cache only; they never become the process's registry
    assert C.ValidationCache(store).registered_names() == real_scan()  # the cached names are the scan's, exactly
    monkeypatch.setattr(registry, "_STATIC", None)
    src = methods / "tapo" / "checks.py"
    src.write_text(src.read_text().replace('@registry.check("tapo.clip_schedule")',
                                           '@registry.check("tapo.clip_schedule_renamed")'))
    assert _revalidated(store, path, calls) and scans
    spec, errors = C.ValidationCache(store).validate_file(path, ROOT)
    assert spec is None and "no check named 'tapo.clip_schedule'" in errors[0].message


def test_another_library_version_is_a_miss(tmp_path, calls, monkeypatch):
    path = ROOT / "specs" / "tapo-trajectory.yaml"
    store = _store_with(tmp_path, path)
    real = C._library
    monkeypatch.setattr(C, "_library", lambda name: real(name) + (":new" if name == "jsonschema" else ""))
    assert _revalidated(store, path, calls)


# --- never evidence: a broken, foreign, unwritable or racing cache -----------------------------------


@pytest.mark.parametrize("content", [b"", b"{not json", b"[]", b'{"v": 1, "sections": []}', b"\xff\xfe",
                                     b'{"v": 999, "sections": {}}'])
def test_a_corrupt_cache_file_is_ignored_and_rebuilt(content, tmp_path, calls):
    path = ROOT / "specs" / "mrtpo.yaml"
    store = tmp_path / "store"
    store.mkdir()
    (store / C.CACHE_NAME).write_bytes(content)
    cache = C.ValidationCache(store)
    spec, errors = cache.validate_file(path, ROOT)
    assert errors == [] and _exact(spec.data) == _exact(validate_file(path, ROOT)[0].data)
    cache.flush()
    assert json.loads((store / C.CACHE_NAME).read_bytes())["v"] == C.CACHE_VERSION
    assert not _revalidated(store, path, calls)


def test_entries_of_the_wrong_shape_are_misses(tmp_path, calls):
    path = ROOT / "specs" / "mrtpo.yaml"
    store = _store_with(tmp_path, path)
    doc = json.loads((store / C.CACHE_NAME).read_bytes())
    (key,) = doc["sections"]["specs"]["entries"]
    for bad in ({"data": [], "errors": []}, {"errors": "x"}, {"data": None, "errors": [{"line": 1}]}, "x", None):
        doc["sections"]["specs"]["entries"][key] = bad
        (store / C.CACHE_NAME).write_text(json.dumps(doc))
        calls.specs.clear()
        memo.forget()  # as a new process would
        spec, errors = C.ValidationCache(store).validate_file(path, ROOT)
        assert calls.specs == ["mrtpo.yaml"] and errors == [] and spec.key == "mrtpo", bad


def test_an_unwritable_store_still_answers_and_writes_nothing(tmp_path, monkeypatch):
    path = ROOT / "specs" / "mrtpo.yaml"
    store = tmp_path / "store"
    store.mkdir()

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(C.os, "replace", refuse)
    cache = C.ValidationCache(store)
    assert cache.validate_file(path, ROOT)[1] == []
    cache.flush()  # no error
    assert list(store.iterdir()) == []  # and no temporary file left behind


def test_only_the_newest_version_of_a_spec_is_kept(tmp_path):
    specs = _copy_specs(tmp_path)
    path = specs / "mrtpo.yaml"
    store = _store_with(tmp_path, specs / "tar-adaptive-replay.yaml")
    for review in ("TODO", "IN-REVIEW", "DONE"):
        path.write_text(path.read_text().replace("review: ", f"review: {review}  # ", 1))
        cache = C.ValidationCache(store)
        cache.validate_file(path, ROOT)
        cache.flush()
    keys = json.loads((store / C.CACHE_NAME).read_bytes())["sections"]["specs"]["entries"]
    assert sorted(k.partition(":")[2] for k in keys) == ["mrtpo.yaml", "tar-adaptive-replay.yaml"]


def test_without_a_registry_to_fingerprint_it_validates_afresh(tmp_path, monkeypatch):
    def nowhere():
        raise registry.LookupFailure("the 'methods' package is not importable")

    monkeypatch.setattr(registry, "_STATIC", None)
    monkeypatch.setattr(registry, "methods_root", nowhere)
    bad = tmp_path / "mrtpo.yaml"
    bad.write_text((ROOT / "specs" / "mrtpo.yaml").read_text().replace("level: L1", "level: L7"))
    spec, errors = C.ValidationCache(tmp_path).validate_file(bad, tmp_path)
    assert spec is None and [e.line() for e in errors] == [e.line() for e in validate_file(bad, tmp_path)[1]]


def test_a_missing_store_is_not_created_for_the_cache(tmp_path):
    cache = C.ValidationCache(tmp_path / "no-store")
    assert cache.validate_file(ROOT / "specs" / "mrtpo.yaml", ROOT)[1] == []
    cache.flush()
    assert not (tmp_path / "no-store").exists()


def test_two_writers_keep_both_entries_and_a_lost_race_is_a_miss(tmp_path, calls):
    store = tmp_path / "store"
    store.mkdir()
    a, b = C.ValidationCache(store), C.ValidationCache(store)
    a.validate_file(ROOT / "specs" / "mrtpo.yaml", ROOT)
    b.validate_file(ROOT / "specs" / "tar-adaptive-replay.yaml", ROOT)
    a.flush()
    b.flush()  # merges into what `a` wrote instead of replacing it
    assert not _revalidated(store, ROOT / "specs" / "mrtpo.yaml", calls)
    assert not _revalidated(store, ROOT / "specs" / "tar-adaptive-replay.yaml", calls)
    (store / C.CACHE_NAME).unlink()  # as if the other writer's rename had replaced ours
    assert _revalidated(store, ROOT / "specs" / "mrtpo.yaml", calls)


def test_concurrent_commands_leave_a_readable_cache(tmp_path):
    store = tmp_path / "store"
    copy_sample(store)
    cmd = [sys.executable, "-m", "engine.cli", "list", "--json", "--receipts", str(store)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert len({json.dumps(json.loads(o), sort_keys=True) for o, _ in outs}) == 1
    # `list` keeps what it learnt in the user's sealed cache (engine/store/sealed.py), never in the store
    sealed = Path(os.environ["CONTRACTS_CACHE_DIR"])
    assert list(sealed.glob("spec-v*/*/*.json")) and list(sealed.glob("index-v*/*/*.json"))
    assert [p for p in sealed.rglob(".tmp-*")] == [] and not (store / C.CACHE_NAME).exists()
    assert [p.name for p in store.iterdir() if p.name.startswith(".tmp-")] == []
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=120)
    assert json.loads(again.stdout) == json.loads(outs[0][0])


# --- receipts: schema results cached by content; integrity and freshness stay live ------------------


@pytest.fixture
def toy(tmp_path, monkeypatch):
    return G.toy_project(tmp_path, monkeypatch)


def _assess(path, root, specs, store):
    C.code_stamp.cache_clear()  # a new command: a new process
    cache = C.ValidationCache(store)
    a = assess(path, root, specs, display=path.name, folder_method="toy", cache=cache)
    cache.flush()
    return a


def test_receipt_schema_results_come_from_the_cache_and_match(toy, calls):
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    fresh = assess(path, root, specs, display=path.name, folder_method="toy")
    assert calls.schemas == 1
    first = _assess(path, root, specs, receipts)
    second = _assess(path, root, specs, receipts)
    assert calls.schemas == 2  # the cached run checked no schema
    assert fresh.as_dict() == first.as_dict() == second.as_dict() and second.state == "fresh"
    assert second.predicate == fresh.predicate


def test_a_tampered_receipt_is_tampered_with_a_warm_cache(toy):
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    assert _assess(path, root, specs, receipts).state == "fresh"
    raw = path.read_bytes()
    path.chmod(0o644)
    i = raw.index(b'"wall_s": ') + len(b'"wall_s": ')
    path.write_bytes(raw[:i] + (b"9" if raw[i:i + 1] != b"9" else b"8") + raw[i + 1:])
    a = _assess(path, root, specs, receipts)
    assert a.state == "tampered" and "receipt id does not match" in a.message
    res = CliRunner().invoke(cli.app, ["verify", "--specs", str(specs), "--receipts", str(receipts)])
    assert res.exit_code == 1 and res.stdout.startswith(f"tampered receipts/toy/{path.name}")


def test_integrity_comes_from_the_cache_only_for_the_same_bytes(toy, monkeypatch):
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    assert _assess(path, root, specs, receipts).state == "fresh"  # cold: decided, then cached
    real, seen = engine.store.receipts.integrity_problem, []
    monkeypatch.setattr(engine.store.receipts, "integrity_problem", lambda d, r: seen.append(r) or real(d, r))
    assert _assess(path, root, specs, receipts).state == "fresh" and seen == []  # warm: from the cache
    # An edit that changes no value (one more space) is other bytes: decided afresh, and caught.
    raw = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(raw.replace(b'": ', b'":  ', 1))
    a = _assess(path, root, specs, receipts)
    assert a.state == "tampered" and "file bytes differ" in a.message and len(seen) == 1
    # The tampered verdict is cached too, and reads the same.
    b = _assess(path, root, specs, receipts)
    assert b.as_dict() == a.as_dict() and len(seen) == 1


def test_a_forged_cache_entry_decides_no_verdict(toy):
    """Whoever writes the store can write the cache: filing an edited receipt's sha256 as intact fools
    neither verify nor gate, with or without --no-cache (kept for scripts)."""
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    raw = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(raw.replace(b'"wall_s": ', b'"wall_s":  ', 1))  # tampered: one more space
    C.code_stamp.cache_clear()
    forged = C.ValidationCache(receipts)
    forged.put("integrity", forged.receipt_fingerprint(), C._sha(path.read_bytes()), None)
    forged.put("receipts", forged.receipt_fingerprint(), C._sha(path.read_bytes()), [])
    forged.flush()
    assert C.ValidationCache(receipts).integrity_problem({}, path.read_bytes()) is None  # the forgery is in place
    args = ["--specs", str(specs), "--receipts", str(receipts)]
    for argv in (["verify", *args], ["verify", "--no-cache", *args], ["verify", "--json", "--no-cache", *args]):
        res = CliRunner().invoke(cli.app, argv)
        assert res.exit_code == 1 and "file bytes differ from the form it was written in" in res.stdout
    for argv in (["gate", "toy", *args], ["gate", "toy", "--no-cache", *args]):
        gate = CliRunner().invoke(cli.app, argv)
        assert gate.exit_code == 1 and f"tampered receipt receipts/toy/{path.name}" in gate.stdout


def test_another_receipt_under_the_same_name_is_a_miss(toy):
    """The schema result is keyed by the file's content: an intact receipt that breaks the schema, written
    where a valid one was, is invalid however warm the cache."""
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml")
    assert _assess(path, root, specs, receipts).state == "fresh"
    pred = G.predicate(specs / "toy.yaml")
    pred["environment"]["device"]["kind"] = "tpu"
    subject = [{"name": "src/toy.py", "digest": {"sha256": engine.store.receipts.sha256_file(root / "src" / "toy.py")}}]
    path.chmod(0o644)
    path.write_bytes(engine.store.receipts.serialize(engine.store.receipts.statement(subject, pred)))
    a = _assess(path, root, specs, receipts)
    assert a.state == "invalid" and "$.predicate.environment.device.kind" in a.message


def test_freshness_is_decided_live_with_a_warm_cache(toy):
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    assert _assess(path, root, specs, receipts).state == "fresh"
    src = root / "src" / "toy.py"
    src.write_text(src.read_text() + "# changed\n")
    a = _assess(path, root, specs, receipts)
    assert a.state == "stale" and a.changed == ["src/toy.py"]


def test_a_promote_since_the_run_is_still_fresh_from_the_cache(toy, monkeypatch):
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    spec = specs / "toy.yaml"
    spec.write_text(spec.read_text().replace('state: "not-promoted"', 'state: "promoted"'))
    assert _assess(path, root, specs, receipts).state == "fresh"
    monkeypatch.setattr(engine.gate.promote, "digest_with_state", lambda *a: pytest.fail("not from the cache"))
    assert _assess(path, root, specs, receipts).state == "fresh"
    spec.write_text(spec.read_text().replace("review: DONE", "review: TODO"))  # any other edit: stale
    monkeypatch.undo()
    monkeypatch.setattr(registry, "_STATIC", G.TOY_NAMES)
    assert _assess(path, root, specs, receipts).state == "stale"


def test_the_promotion_splice_is_cached_per_spec_content_and_state(tmp_path, monkeypatch):
    raws = [(ROOT / "specs" / "mrtpo.yaml").read_bytes(), (ROOT / "specs" / "tapo-trajectory.yaml").read_bytes()]
    cases = [(raw, state) for raw in raws for state in ("promoted", "not-promoted")]
    expected = [engine.gate.promote.digest_with_state(raw, state) for raw, state in cases]
    assert len(set(expected)) == 4
    for raw, state in cases:  # filled one entry at a time, each by its own process
        cache = C.ValidationCache(tmp_path)
        cache.digest_with_state(raw, state)
        cache.flush()
    monkeypatch.setattr(engine.gate.promote, "digest_with_state", lambda *a: pytest.fail("not from the cache"))
    cache = C.ValidationCache(tmp_path)
    assert [cache.digest_with_state(raw, state) for raw, state in cases] == expected
    assert C._ENGINE / "gate/promote.py" in C.restate_code_files()


def test_a_changed_receipt_schema_is_a_miss(toy, calls, monkeypatch):
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml")
    copies = []
    for f in C.receipt_code_files():
        dest = receipts.parent / "copies" / f.name
        dest.parent.mkdir(exist_ok=True)
        shutil.copy(f, dest)
        copies.append(dest)
    assert C._ENGINE / "schemas" / "receipt.schema.json" in C.receipt_code_files()
    monkeypatch.setattr(C, "receipt_code_files", lambda: copies)
    _assess(path, root, specs, receipts)
    _assess(path, root, specs, receipts)
    assert calls.schemas == 1
    schema = receipts.parent / "copies" / "receipt.schema.json"
    schema.write_text(schema.read_text() + "\n")
    _assess(path, root, specs, receipts)
    assert calls.schemas == 2


@pytest.mark.parametrize("library", ["jsonschema", "fastjsonschema"])
def test_another_receipt_validator_install_is_a_miss(library, toy, calls, monkeypatch):
    """Either library decides a receipt's verdict (fastjsonschema says valid, jsonschema the rest)."""
    root, specs, receipts = toy
    path = G.write(root, receipts, specs / "toy.yaml")
    _assess(path, root, specs, receipts)
    _assess(path, root, specs, receipts)
    assert calls.schemas == 1
    real = C._library
    monkeypatch.setattr(C, "_library", lambda name: real(name) + (":new" if name == library else ""))
    _assess(path, root, specs, receipts)
    assert calls.schemas == 2


# --- the commands: the same bytes with and without a cache --------------------------------------------


def _outputs(store: Path, verdicts: bool = True) -> list:
    """What the read-only commands print; with `verdicts` also gate and verify, which never read the cache."""
    out = []
    methods = [f.stem for f in SHIPPED]
    argvs = [["list"], ["list", "--json"]]
    if verdicts:
        argvs += [["verify"], ["verify", "--json"], ["verify", "--strict"]]
    for m in methods:
        argvs += [["show", m], ["show", m, "--json"]]
        if verdicts:
            argvs += [["gate", m], ["gate", m, "--json"], ["verify", m]]
    for argv in argvs:
        res = CliRunner().invoke(cli.app, [*argv, "--receipts", str(store)])
        stdout = res.stdout
        if argv[0] == "gate" and "--json" in argv:
            doc = json.loads(stdout)
            assert doc.pop("evaluated_at")  # the one field that is the time of the call
            stdout = json.dumps(doc)
        # verify says how long it took per receipt (its one line that is a time, not a fact about the store)
        stderr = "".join(ln for ln in res.stderr.splitlines(True) if not ln.startswith("verify: "))
        out.append((argv, res.exit_code, stdout, stderr))
    return out


def test_read_only_commands_print_the_same_bytes_with_and_without_a_cache(tmp_path, monkeypatch):
    store = tmp_path / "store"
    copy_sample(store)
    monkeypatch.setenv("CONTRACTS_NO_CACHE", "1")
    without = _outputs(store)  # from the files alone: no cache read or written
    monkeypatch.delenv("CONTRACTS_NO_CACHE")
    cold = _outputs(store)  # validated afresh, and what was learnt sealed (engine/store/sealed.py)
    assert cold == without
    assert not (store / C.CACHE_NAME).exists()  # nothing kept in the store, which anyone who writes it can edit
    for name in ("validate_file", "read_document"):
        monkeypatch.setattr(engine.spec.loader, name, lambda *a, **k: pytest.fail("validated with a warm cache"))
    for mod in (engine.store.receipts, engine.store.verify):
        monkeypatch.setattr(mod, "schema_problems", lambda *a, **k: pytest.fail("schema with a warm cache"))
    monkeypatch.setattr(engine.gate.promote, "digest_with_state", lambda *a, **k: pytest.fail("splice with a warm cache"))
    monkeypatch.setattr(engine.store.receipts, "integrity_problem", lambda *a, **k: pytest.fail("integrity with a warm cache"))
    memo.forget()
    warm = _outputs(store)  # every verb, verdicts included: the sealed summaries of these very bytes
    assert warm == without
    assert any(code == 0 for _, code, _, _ in without) and any("stale" in out for _, _, out, _ in without)


def test_a_warm_cache_imports_no_validator(tmp_path):
    store = tmp_path / "store"
    copy_sample(store)
    code = f"""
import sys
from typer.testing import CliRunner
from engine.cli import app
for argv in (["list"], ["list", "--json"], ["show", "mrtpo"]):  # gate and verify never read the cache
    res = CliRunner().invoke(app, [*argv, "--receipts", {str(store)!r}])
    assert res.exit_code in (0, 1), (argv, res.output)
loaded = sorted(m for m in sys.modules if m.startswith(("ruamel.yaml", "jsonschema", "fastjsonschema", "torch")))
print(",".join(loaded))
"""
    env = {**os.environ, "NO_COLOR": "1"}
    cold = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert cold.returncode == 0 and "ruamel.yaml" in cold.stdout, cold.stderr  # the first run validates
    assert "fastjsonschema" in cold.stdout.split(",")  # receipts by the fast path
    warm = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert warm.returncode == 0 and warm.stdout.strip() == "", (warm.stdout, warm.stderr)
