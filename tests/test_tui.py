"""`contracts tui` and the receipt index: Pilot tests on a small genuine store, index tests, CLI tests."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.spec.registry as registry
from benchmarks.synthetic_store import add_receipt, write_demo_project
from benchmarks.synthetic_store import predicate, stamp, subject_for
from engine.gate import review
from engine.gate import verdict as engine_gate
from engine.store.index import INDEX_NAME, Freshness, ReceiptIndex, freshness_of
from engine.store.receipts import statement, write_receipt
from engine.spec.loader import load_spec
from engine.store.verify import assess_receipts
from tui.app import binding_ids, create_app, parse_keys
from tui.data import build_model, gate_flags
from tui.diff import diff_predicates
from tui.screens.diff import DiffScreen
from tui.screens.main import MainScreen
from tui.screens.receipt import ReceiptScreen, ResultScreen
from tui.widgets import VimTable

from tui_support import SIZE, demo_names, make_app, rows, running, settle, started, store  # noqa: F401 - fixtures


def run(coro):
    return asyncio.run(coro)


def table(app, selector) -> VimTable:
    return app.screen.query_one(selector, VimTable)


# --- the index ------------------------------------------------------------------


def test_index_parses_only_new_files_and_survives_a_restart(store):
    idx = ReceiptIndex(store["receipts"])
    first = idx.refresh()
    assert first.parsed == 6 and first.cached == 0
    assert (store["receipts"] / INDEX_NAME).is_file()
    again = ReceiptIndex(store["receipts"]).refresh()  # a new process: everything from the cache
    assert again.parsed == 0 and again.cached == 6
    spec = load_spec(store["specs"] / "demo-method.yaml", store["root"]).data
    add_receipt(store["receipts"], store["root"], spec, 9)
    third = ReceiptIndex(store["receipts"]).refresh()
    assert third.parsed == 1 and third.cached == 6 and len(third.added) == 1


def test_index_states_agree_with_contracts_verify(store):
    """Every state and message the index gives is the one engine.store.verify gives, odd files included."""
    rd = store["receipts"]
    spec = load_spec(store["specs"] / "demo-method.yaml", store["root"]).data
    (rd / "demo-method" / "notes.txt").write_text("not a receipt")
    (rd / "stray.json").write_text("{}")
    (rd / "other-method").mkdir()
    (rd / "other-method" / "moved.json").write_bytes(store["passed"].read_bytes())  # filed under another method
    pred = predicate(spec, stamp(30))
    del pred["environment"]  # intact (the id covers the edit) but not the receipt schema's shape
    write_receipt(rd, statement(subject_for(store["root"], "demo-method"), pred))
    same = json.loads(store["cuda"].read_text())  # the same receipt, only re-indented
    (rd / "demo-method" / "20260105T110000000000Z_demo-method_reindented.json").write_text(json.dumps(same, indent=2))
    idx = ReceiptIndex(rd)
    idx.refresh()
    fresh = Freshness(store["root"], store["specs"])
    ours = {e["file"]: (freshness_of(e, idx, fresh)[0], e["message"]) for e in idx.entries()}
    theirs, _ = assess_receipts(rd, store["root"], store["specs"])
    assert len(ours) == len(theirs) == 11
    for a in theirs:
        state, message = ours[a.file]
        assert state == a.state, a.file
        if a.state != "stale":
            assert message == a.message, a.file
    assert sorted(s for s, _ in ours.values()) == ["fresh", "fresh", "fresh", "invalid", "invalid", "invalid",
                                                   "invalid", "invalid", "stale", "tampered", "tampered"]
    assert any(m == "file bytes differ from the form it was written in" for _, m in ours.values())


def test_a_promote_does_not_make_receipts_stale(store):
    """As in check_receipt: a spec that differs only in promotion.state is the same spec."""
    from engine.gate.promote import with_state

    path = store["specs"] / "demo-method.yaml"
    path.write_text(with_state(path.read_text(), "promoted"))
    idx = ReceiptIndex(store["receipts"])
    idx.refresh()
    fresh = Freshness(store["root"], store["specs"])
    states = sorted(freshness_of(e, idx, fresh)[0] for e in idx.entries())
    assert states.count("fresh") == 3
    path.write_text(path.read_text().replace("Demo method", "Demo method, edited"))
    fresh.forget()
    assert "fresh" not in [freshness_of(e, idx, Freshness(store["root"], store["specs"]))[0] for e in idx.entries()]


def test_index_reparses_a_file_whose_size_or_mtime_changed(store):
    ReceiptIndex(store["receipts"]).refresh()
    target = store["passed"]
    data = target.read_bytes()
    target.write_bytes(data.replace(b'"status": "passed"', b'"status": "failed"', 1))  # a tampering edit
    idx = ReceiptIndex(store["receipts"])
    r = idx.refresh()
    assert r.parsed == 1
    entry = next(e for e in idx.entries() if e["file"].endswith(target.name))
    assert entry["state"] == "tampered"


def test_index_cut_lines_and_foreign_versions_are_rebuilt_not_trusted(store):
    ReceiptIndex(store["receipts"]).refresh()
    path = store["receipts"] / INDEX_NAME
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # a crash cut the last line
    r = ReceiptIndex(store["receipts"]).refresh()
    assert r.parsed == 1 and r.cached == 5
    path.write_text('{"k": "h", "v": 999}\n')
    assert ReceiptIndex(store["receipts"]).refresh().parsed == 6


def test_index_forgets_deleted_receipts(store):
    ReceiptIndex(store["receipts"]).refresh()
    store["cuda"].unlink()
    idx = ReceiptIndex(store["receipts"])
    r = idx.refresh()
    assert len(r.removed) == 1 and len(idx) == 5
    assert ReceiptIndex(store["receipts"]).refresh().cached == 5


def test_heavy_parts_are_read_only_when_asked_and_rebuilt_when_lost(store):
    from engine.store.index import DETAIL_NAME

    ReceiptIndex(store["receipts"]).refresh()
    idx = ReceiptIndex(store["receipts"])
    idx.refresh()
    assert idx._heavy == {}  # a start reads the light summaries only
    rel = f"demo-method/{store['failed'].name}"
    assert idx.heavy(rel)["c"]["loss-gradient"][0] == "failed"
    assert not idx._detail_loaded and list(idx._heavy) == [rel]  # found by its offset, nothing else read
    (store["receipts"] / DETAIL_NAME).unlink()  # lost: the receipt itself is read again, once
    idx = ReceiptIndex(store["receipts"])
    idx.refresh()
    assert idx.heavy(rel)["c"]["loss-gradient"][0] == "failed"
    assert rel in (store["receipts"] / DETAIL_NAME).read_text()


def test_index_on_a_read_only_store_still_works(store):
    idx = ReceiptIndex(store["receipts"], persist=False)
    r = idx.refresh()
    assert len(idx) == 6 and not r.persisted
    assert not (store["receipts"] / INDEX_NAME).exists() and not (store["receipts"] / ".index-detail.jsonl").exists()


def test_no_torch_on_the_tui_import_path():
    code = ("import sys, engine.cli, engine.store.index, tui.app, tui.data, tui.screens.main, tui.screens.receipt, "
            "tui.screens.diff, tui.screens.forms, tui.screens.help, tui.commands, tui.checkrun, tui.plots; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr


def test_spec_cache_revalidates_exactly_when_an_input_changes(store, monkeypatch):
    import engine.spec.loader
    import tui.specs as specs_mod

    calls = []
    real = engine.spec.loader.validate_file
    monkeypatch.setattr(engine.spec.loader, "validate_file",
                        lambda f, root=None, **kw: calls.append(f.name) or real(f, root, **kw))
    (store["specs"] / "broken.yaml").write_text("spec_version: 1\ntitle: [unclosed\n")

    def load():
        return specs_mod.load_specs(store["specs"], store["root"], store["receipts"])

    first = load()
    assert sorted(calls) == ["broken.yaml", "demo-method.yaml", "other-method.yaml"]
    calls.clear()
    second = load()
    assert calls == []  # every spec from the cache
    for key in first:
        a, b = first[key], second[key]
        assert (a[0].data if a[0] else None) == (b[0].data if b[0] else None) and a[1:] == b[1:]
    assert second["broken"][0] is None and "YAML" in second["broken"][2][0]
    assert second["demo-method"][0].sha256 == first["demo-method"][0].sha256
    path = store["specs"] / "other-method.yaml"
    path.write_text(path.read_text().replace("review: IN-REVIEW", "review: DONE"))
    assert load()["other-method"][0].data["promotion"]["review"] == "DONE" and calls == ["other-method.yaml"]
    calls.clear()
    # the registry the references are checked against changed: one more check name registered
    names = registry._STATIC
    monkeypatch.setattr(registry, "_STATIC", registry.StaticNames(
        implementations=names.implementations, checks=names.checks | {"demo.extra_check"}, mutants=names.mutants,
        files=names.files))
    load()
    assert len(calls) == 3


# --- the model ------------------------------------------------------------------------


def _model(store_or_root, specs=None, receipts=None, **kw):
    if isinstance(store_or_root, dict):
        root, specs, receipts = store_or_root["root"], store_or_root["specs"], store_or_root["receipts"]
    else:
        root = store_or_root
    return build_model(specs, receipts, root, ReceiptIndex(receipts), Freshness(root, specs), **kw)


def test_model_rows(store):
    demo = _model(store).method("demo-method")
    rows_by_id = {c.id: c for c in demo.contracts}
    assert rows_by_id["loss-gradient"].overall == "failed"  # the newest cpu run failed it
    assert rows_by_id["loss-gradient"].cells["cuda"] == ("passed", "fresh")
    assert rows_by_id["ratio-forward"].overall == "passed"
    assert demo.gate.verdict == "unknown"  # the first paint does not wait for the gate
    assert demo.summary() == "3/4 contracts passed, 3/3 mutants killed, gate pending"


def test_the_tui_gate_is_contracts_gate(store):
    """The Gate tab's verdict is exactly what engine.gate.verdict gives reading every receipt itself."""
    model = _model(store, gates=True)
    for key in ("demo-method", "other-method"):
        m = model.method(key)
        flags = gate_flags(store["receipts"], store["specs"], store["root"])
        theirs = engine_gate.evaluate(m.spec_obj, store["receipts"], store["root"], store["specs"], flags)
        unmet = [(f"{r['id']}: {r['detail']}", r["fix"]) for r in theirs["requirements"]
                 if r["required"] and not r["met"]]
        met = [f"{r['id']}: {r['detail']}" for r in theirs["requirements"] if r["met"]]
        assert m.gate.source == "engine.gate"
        assert m.gate.verdict == ("open" if theirs["promotable"] else "closed") == "closed"
        assert m.gate.unmet == unmet and m.gate.met == met and m.gate.warnings == theirs["warnings"]
    ids = [w.split(": ")[0] for w, _ in model.method("demo-method").gate.unmet]
    assert ids == ["review", "device:cpu", "device:cuda"]


def test_the_tui_gate_is_contracts_gate_for_formal_comparisons(tmp_path, demo_names):
    root = tmp_path / "p"
    specs = write_demo_project(root, review="DONE", formal=True)
    spec = load_spec(specs / "demo-method.yaml", root).data
    rd = root / "receipts"
    for i, (device, ahead) in enumerate((("cpu", 0.2), ("cuda", 0.2), ("cuda", -0.2), ("cpu", None))):
        add_receipt(rd, root, spec, i, device=device, formal=ahead, rng=random.Random(i))
    m = _model(root, specs, rd, gates=True).method("demo-method")
    theirs = engine_gate.evaluate(m.spec_obj, rd, root, specs, gate_flags(rd, specs, root))
    formal = next(r for r in theirs["requirements"] if r["id"] == "formal_comparison")
    assert formal["required"] and len(formal["comparisons"]) == 3 and formal["diagnostic_only"] > 0
    assert sorted(c["ahead"] for c in formal["comparisons"]) == [False, True, True]
    assert [u for u, _ in m.gate.unmet] == [f"{r['id']}: {r['detail']}" for r in theirs["requirements"]
                                            if r["required"] and not r["met"]]
    assert m.gate.warnings == theirs["warnings"]


def test_gate_opens_only_with_everything(tmp_path, demo_names):
    root = tmp_path / "p"
    specs = write_demo_project(root, review="DONE")
    spec = load_spec(specs / "demo-method.yaml", root).data
    rd = root / "receipts"
    add_receipt(rd, root, spec, 0, device="cpu")

    def gate():
        return _model(root, specs, rd, gates=True).method("demo-method").gate

    assert gate().verdict == "closed"  # no cuda receipt yet
    add_receipt(rd, root, spec, 1, device="cuda")
    assert gate().verdict == "closed"  # no review of the spec in the ledger yet
    review.record(load_spec(specs / "demo-method.yaml", root), rd, "R. Viewer", "read it")
    assert gate().verdict == "open", gate().unmet
    (root / "engine" / "demo_engine.py").write_text("# edited\n")  # every receipt goes stale
    g = gate()
    assert g.verdict == "closed" and any("stale" in w for w in g.warnings)


def test_diff_predicates_names_moved_measurements_and_changed_statuses(store):
    a = json.loads(store["passed"].read_text())["predicate"]
    b = json.loads(store["failed"].read_text())["predicate"]
    rows_, same = diff_predicates(a, b)
    status = [r for r in rows_ if r.kind == "status"]
    assert {r.where.split()[0] for r in status} == {"loss-gradient"}
    assert all(r.change == "passed -> failed" for r in status)
    assert any(r.kind == "measurement" and r.name == "max_abs_err" for r in rows_)
    assert diff_predicates(a, a) == ([], same + len([r for r in rows_ if r.kind == "measurement"]))


# --- the app: navigation, filters, diff, copy, reload, robustness ---------------------------------


def test_navigate_method_contract_receipt_result(store):
    async def go():
        async with started(store) as (app, pilot):
            assert isinstance(app.screen, MainScreen)
            tree = app.screen.query_one("#methods")
            labels = [str(tree.get_node_at_line(i).label) for i in range(tree.last_line + 1)]
            assert labels[0].startswith("✗ demo-method IN-REVIEW not-promoted")
            assert labels[2] == "✗ loss-gradient"
            await pilot.press("j", "j", "enter")  # tree: method -> second contract -> its receipt, at once
            await settle(app, pilot)
            assert isinstance(app.screen, ReceiptScreen)
            assert app.screen.row.file.endswith(store["failed"].name)
            t = table(app, "#results-table")
            res = rows(t)
            assert len(res) == 15 and app.screen.filter_text == ""  # nothing hidden: the cursor is at the contract
            assert res[t.cursor_row][0] == "loss-gradient" and res[t.cursor_row][4] == "✗ failed"
            assert "opened at loss-gradient" in str(app.screen.query_one("#results-note").render())
            await pilot.press("escape")
            await settle(app, pilot)
            await pilot.press("1", "enter")  # the Contracts table, its cursor on the tree's contract: the same receipt
            await settle(app, pilot)
            assert isinstance(app.screen, ReceiptScreen) and app.screen.contract == "loss-gradient"
            await pilot.press("enter")  # one result in full
            await settle(app, pilot)
            assert isinstance(app.screen, ResultScreen)
            await pilot.press("escape", "escape")
            await settle(app, pilot)
            assert isinstance(app.screen, MainScreen)

    run(go())


def test_receipts_tab_lists_every_state_and_filter_narrows(store):
    async def go():
        async with started(store, settled=False) as (app, pilot):
            await pilot.press("2")
            await settle(app, pilot)
            t = table(app, "#receipts-table")
            evidence = sorted(r[5] for r in rows(t))
            assert evidence == ["CORRUPT", "TAMPERED", "fresh", "fresh", "fresh", "stale"]
            await pilot.press("slash", *"cuda")
            await settle(app, pilot)
            assert [r[2] for r in rows(t)] == ["cuda"]
            await pilot.press("q")  # typed into the filter, not a quit
            await settle(app, pilot)
            assert app.is_running and rows(t) == []
            await pilot.press("escape")
            await settle(app, pilot)
            assert len(rows(t)) == 6 and app.screen.filter_text == ""

    run(go())


def test_failures_only(store):
    async def go():
        async with started(store, settled=False) as (app, pilot):
            await pilot.press("1", "f")
            await settle(app, pilot)
            assert [r[0] for r in rows(table(app, "#contracts-table"))] == ["loss-gradient"]
            await pilot.press("2")
            await settle(app, pilot)
            statuses = {(r[3], r[5]) for r in rows(table(app, "#receipts-table"))}
            assert statuses == {("✗ failed", "fresh"), ("? unknown", "CORRUPT"), ("✓ passed", "TAMPERED")}
            await pilot.press("f")
            await settle(app, pilot)
            assert len(rows(table(app, "#receipts-table"))) == 6

    run(go())


def test_receipt_screen_failures_filter_and_diff(store):
    async def go():
        async with started(store, receipt=f"demo-method/{store['failed'].name}") as (app, pilot):
            assert len(rows(table(app, "#results-table"))) == 15
            await pilot.press("f")
            await settle(app, pilot)
            assert {r[0] for r in rows(table(app, "#results-table"))} == {"loss-gradient"}
            await pilot.press("d")
            await settle(app, pilot)
            assert isinstance(app.screen, DiffScreen)
            assert app.screen.old.file.endswith(store["passed"].name)
            d = rows(table(app, "#diff-table"))
            assert [r[5] for r in d if r[0] == "status"] == ["passed -> failed"] * 3
            assert any(r[0] == "measurement" and r[2] == "max_abs_err" for r in d)
            await pilot.press("f")
            await settle(app, pilot)
            assert {r[0] for r in rows(table(app, "#diff-table"))} <= {"status", "mutant", "run"}

    run(go())


def _copying_into(copied: list, store, monkeypatch):
    """An app on `store` whose clipboard is `copied` (each copy appended)."""
    app = make_app(store)
    monkeypatch.setattr(app, "copy_to_clipboard", copied.append)
    return app


def test_copy_value_and_receipt_path(store, monkeypatch):
    copied = []

    async def go():
        app = _copying_into(copied, store, monkeypatch)
        async with running(app, settled=False) as pilot:
            await pilot.press("2")
            await settle(app, pilot)
            await pilot.press("y")  # the newest receipt row: its path
            assert copied[-1].startswith("receipts/demo-method/") and copied[-1].endswith(".json")
            app.open_receipt(f"demo-method/{store['passed'].name}")
            await settle(app, pilot)
            await pilot.press("right", "right", "right", "right", "right", "y")  # the worst-expectation value
            pred = json.loads(store["passed"].read_text())["predicate"]
            first = pred["results"][0]
            assert copied[-1] == json.dumps(first["expectations"][0]["value"])  # full precision, not 3 digits

    run(go())


def test_reload_and_poll_pick_up_a_new_receipt(store):
    spec = load_spec(store["specs"] / "demo-method.yaml", store["root"]).data

    async def go():
        async with started(store, settled=False) as (app, pilot):
            add_receipt(store["receipts"], store["root"], spec, 20, rng=random.Random(7))
            await pilot.press("r")
            await app.wait_loaded(2)
            await settle(app, pilot)
            assert app.model.receipts_total == 7
        async with started(store, poll_seconds=0.1, settled=False) as (app, pilot):
            add_receipt(store["receipts"], store["root"], spec, 21, rng=random.Random(8))
            for _ in range(100):  # by itself, within a few poll periods
                await pilot.pause(0.05)
                if app.model.receipts_total == 8:
                    break
            assert app.model.receipts_total == 8

    run(go())


def test_corrupt_and_tampered_receipts_open_without_crashing(store):
    async def go():
        async with started(store, receipt=f"demo-method/{store['truncated'].name}") as (app, pilot):
            head = app.screen.query_one("#receipt-header").render()
            assert "CORRUPT: not JSON" in str(head)
            assert app.screen.query_one("#receipt-tabs").active == "raw"
            assert app.screen.query_one("#raw-text").lines[0].startswith("{")
            await pilot.press("escape")
            app.open_receipt(f"demo-method/{store['tampered'].name}")
            await settle(app, pilot)
            assert "TAMPERED: receipt id does not match" in str(app.screen.query_one("#receipt-header").render())

    run(go())


def test_a_receipt_of_any_shape_opens_and_diffs_without_crashing(store):
    data = json.loads(store["passed"].read_text())
    p = data["predicate"]
    p["results"] = [1, "x", {"contract": 5, "expectations": "no", "seed": [1]}, {"contract": "c", "expectations": [3]}]
    p["mutants"] = [{"id": "m", "killed_by": 7}, "y"]
    p["mechanism"] = [{"steps": "zzz", "comparisons": [5]}, 3]
    p["environment"] = "nowhere"
    odd = store["receipts"] / "demo-method" / "20260105T100000000000Z_demo-method_odd.json"
    odd.write_text(json.dumps(data, indent=1) + "\n")

    async def go():
        async with started(store) as (app, pilot):
            row = app.model.receipt("demo-method/" + odd.name)
            assert row.freshness == "tampered"
            app.open_receipt(row.file)
            await settle(app, pilot)
            assert isinstance(app.screen, ReceiptScreen) and app.is_running
            await pilot.press("f", "slash", "x", "enter", "y")
            await settle(app, pilot)
            app.pop_screen()
            await settle(app, pilot)
            app.open_diff(row.file)  # no environment, so no device: nothing of its kind to compare with
            await settle(app, pilot)
            assert not isinstance(app.screen, DiffScreen) and app.is_running
            app.toggle_mark(row.file)
            app.toggle_mark(f"demo-method/{store['passed'].name}")
            app.open_diff(row.file)  # two marked: those two
            await settle(app, pilot)
            assert isinstance(app.screen, DiffScreen) and app.is_running

    run(go())


def test_closing_a_receipt_before_it_is_read_then_opening_another(store, monkeypatch):
    import threading

    import tui.screens.receipt as receipt_mod

    gates = {store["passed"].name: threading.Event(), store["failed"].name: threading.Event()}
    real = receipt_mod.load_detail
    monkeypatch.setattr(receipt_mod, "load_detail", lambda d, f: gates[f.split("/")[-1]].wait(5) and real(d, f))

    async def go():
        async with started(store, settled=False) as (app, pilot):
            app.open_receipt(f"demo-method/{store['passed'].name}")
            await pilot.pause()
            await pilot.press("escape")  # gone before its worker delivers
            await pilot.pause()
            app.open_receipt(f"demo-method/{store['failed'].name}")  # the same screen, refilled
            await pilot.pause()
            gates[store["failed"].name].set()
            await pilot.pause(0.2)
            gates[store["passed"].name].set()  # the first read reports last
            await settle(app, pilot)
            assert isinstance(app.screen, ReceiptScreen) and app.is_running
            assert app.screen.detail.file.endswith(store["failed"].name)  # the late first read was dropped
            assert "loss-gradient" in {r[0] for r in rows(table(app, "#results-table")) if r[4] == "✗ failed"}
            await pilot.press("escape")
            await settle(app, pilot)
            assert isinstance(app.screen, MainScreen)

    run(go())


def test_empty_store_and_broken_spec_say_what_to_do(tmp_path, demo_names):
    root = tmp_path / "p"
    specs = write_demo_project(root)
    (specs / "broken.yaml").write_text("spec_version: 1\nmethod: broken\ntitle: [unclosed\n")

    async def go():
        app = create_app(specs, root / "receipts", root, poll_seconds=None)
        async with running(app) as pilot:
            tree = app.screen.query_one("#methods")
            labels = [str(tree.get_node_at_line(i).label) for i in range(tree.last_line + 1)]
            assert any(lbl.startswith("✗ broken BROKEN SPEC") for lbl in labels)
            assert any("specs/broken.yaml:" in lbl and "YAML" in lbl for lbl in labels)
            assert any("no receipts yet" in lbl and "contracts check METHOD --device cpu" in lbl for lbl in labels)
            app.select_method("broken")
            await settle(app, pilot)
            assert "specs/broken.yaml:" in str(app.screen.query_one("#status").render())

    run(go())


def test_no_specs_folder_at_all(tmp_path):
    async def go():
        app = create_app(tmp_path / "nowhere", tmp_path / "receipts", tmp_path, poll_seconds=None)
        async with running(app) as pilot:
            assert "no specs folder" in str(app.screen.query_one("#status").render())

    run(go())


def test_palette_selects_a_method(store):
    async def go():
        async with started(store, settled=False) as (app, pilot):
            await pilot.press("ctrl+p", *"method: other")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await settle(app, pilot)
            assert app.screen.method == "other-method"

    run(go())


def test_palette_opens_a_receipt_copies_a_command_and_filters(store, monkeypatch):
    copied = []

    async def go():
        app = _copying_into(copied, store, monkeypatch)
        async with running(app, settled=False) as pilot:
            rid = app.model.receipt(f"demo-method/{store['cuda'].name}").receipt_id
            await pilot.press("ctrl+p", *f"receipt: {rid[:8]}")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await settle(app, pilot)
            assert isinstance(app.screen, ReceiptScreen) and app.screen.row.receipt_id == rid
            await pilot.press("escape")
            await pilot.press("ctrl+p", *"copy: contracts check other-method --device cuda")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await settle(app, pilot)
            assert copied[-1].startswith("contracts check other-method --device cuda --specs ")
            await pilot.press("ctrl+p", *"filter: failures only")
            await pilot.pause(0.3)
            await pilot.press("enter")
            await settle(app, pilot)
            assert app.screen.failures_only is True
            await pilot.press("question_mark")
            await settle(app, pilot)
            assert type(app.screen).__name__ == "HelpScreen"
            await pilot.press("escape")
            await settle(app, pilot)
            assert isinstance(app.screen, MainScreen)

    run(go())


def test_keys_can_be_remapped_by_binding_id(store):
    async def go():
        async with started(store, keymap={"failures": "x"}, settled=False) as (app, pilot):
            await pilot.press("f")
            assert app.screen.failures_only is False
            await pilot.press("x")
            assert app.screen.failures_only is True

    run(go())
    assert {"filter", "failures", "open", "back", "diff", "copy", "reload", "help", "quit", "table.down",
            "table.up", "table.top", "table.bottom"} <= binding_ids()
    assert parse_keys(" copy=c , failures=x ") == {"copy": "c", "failures": "x"}
    with pytest.raises(ValueError):
        parse_keys("copy")


def test_no_color_keeps_marks_and_words(store, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")

    async def go():
        app = make_app(store)
        assert app.no_color
        async with running(app) as pilot:
            tree = app.screen.query_one("#methods")
            assert str(tree.get_node_at_line(0).label).startswith("✗ demo-method IN-REVIEW")

    run(go())


def test_gate_tab_and_tree_show_the_engine_gate_verdict(store):
    async def go():
        async with started(store) as (app, pilot):
            assert app.model.method("demo-method").gate.source == "engine.gate"
            await pilot.press("5")
            await settle(app, pilot)
            text = str(app.screen.query_one("#gate-view").render())
            assert "✗ gate closed" in text and "verdict from engine.gate" in text
            assert "device:cuda:" in text and "$ contracts check demo-method --device cuda --specs" in text
            tree = app.screen.query_one("#methods")
            assert str(tree.get_node_at_line(0).label).startswith("✗ demo-method")

    run(go())


def _forbid_here(monkeypatch, module, name: str, done: str) -> None:
    """`module.name` fails the test if the UI process calls it: what it does must happen in another process."""

    def not_here(*a, **k):
        raise AssertionError(f"{done} in the UI process")

    monkeypatch.setattr(module, name, not_here)


def test_big_stores_evaluate_the_gate_in_another_process(store, monkeypatch):
    import tui.app as app_mod

    monkeypatch.setattr(app_mod, "GATE_PROCESS_THRESHOLD", 0)
    _forbid_here(monkeypatch, app_mod, "gate_for", "evaluated")
    expected = _model(store, gates=True).method("demo-method").gate

    async def go():
        async with started(store) as (app, pilot):
            got = app.model.method("demo-method").gate
            assert got.source == "engine.gate" and got.unmet == expected.unmet and got.warnings == expected.warnings

    run(go())


def test_a_first_start_indexes_in_worker_processes_from_inside_the_app(store, monkeypatch):
    """Textual replaces sys.stderr; the pool must still start (it once silently could not)."""
    import engine.store.index as index_mod

    monkeypatch.setattr(index_mod, "POOL_THRESHOLD", 1)
    _forbid_here(monkeypatch, index_mod, "index_file", "parsed")

    async def go():
        app = make_app(store)
        async with app.run_test(size=SIZE) as pilot:
            await app.wait_loaded(timeout=20)
            await settle(app, pilot)
            assert app.model.receipts_total == 6 and app.model.parsed == 6
            states = sorted(r.freshness for r in app.model.method("demo-method").receipts)
            assert states == ["fresh", "fresh", "fresh", "invalid", "stale", "tampered"]

    run(go())


# --- the CLI ----------------------------------------------------------------------------------


def test_cli_tui_json_and_errors(store):
    from engine.cli import app as cli

    runner = CliRunner()
    res = runner.invoke(cli, ["tui", "--json", "--specs", str(store["specs"]), "--receipts", str(store["receipts"])])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [m["method"] for m in data["methods"]] == ["demo-method", "other-method"]
    assert data["methods"][0]["gate"]["verdict"] == "closed" and data["receipts"] == 6
    newest = data["methods"][0]["newest_receipt"]  # the truncated one: no coverage to tell
    assert newest["evidence"] == "invalid" and newest["coverage"] is None
    assert data["methods"][1]["newest_receipt"] is None
    res = runner.invoke(cli, ["tui", "--keys", "nope=x"])
    assert res.exit_code == 2 and "no binding with id nope" in res.stderr
    res = runner.invoke(cli, ["tui", "--specs", str(store["specs"]), "--receipts", str(store["receipts"])])
    assert res.exit_code == 4 and "needs an interactive terminal" in res.stderr


# --- layout, focus, keys, palette, empty states ------------------------------------------------------


def _visible_width(t: VimTable, upto: int) -> tuple[int, int]:
    """(cells the first `upto` columns take, cells the table shows across)."""
    cols = list(t.columns.values())[:upto]
    return sum(c.get_render_width(t) for c in cols), t.scrollable_content_region.width


def test_at_80x24_every_device_status_column_shows(store):
    async def go():
        async with started(store, size=(80, 24)) as (app, pilot):
            assert app.screen.has_class("-narrow")
            t = table(app, "#contracts-table")
            labels = [c.label.plain for c in t.columns.values()]
            assert labels[:5] == ["contract", "cpu", "cuda", "tier", "headroom"]
            used, shown = _visible_width(t, 5)  # contract, cpu, cuda, tier, headroom
            assert used <= shown, (used, shown)
            assert [c.get_render_width(t) - 2 for c in list(t.columns.values())[1:3]] >= [8, 8]  # "✓ passed"
            tree = app.screen.query_one("#methods")
            assert str(tree.get_node_at_line(0).label) == "✗ demo-method"  # the status line has the rest
            await pilot.press("2")
            await settle(app, pilot)
            t = table(app, "#receipts-table")
            used, shown = _visible_width(t, 5)  # mark, time, device, status, coverage
            assert used <= shown and rows(t)[1][1] == "01-05 09:04"

    run(go())


def test_at_80x24_the_real_specs_status_columns_show(tmp_path):
    """The shipped specs and receipts (long contract ids such as replay_reference_f64): the contract column
    gives way so every device's status and the headroom stay on screen."""
    import shutil

    repo = Path(__file__).resolve().parent.parent
    shutil.copytree(repo / "receipts", tmp_path / "receipts")

    async def go():
        app = create_app(repo / "specs", tmp_path / "receipts", repo, poll_seconds=None, persist_index=False)
        async with running(app, size=(80, 24)) as pilot:
            gave_way = []
            for m in app.model.methods:
                app.select_method(m.key)
                await settle(app, pilot)
                t = table(app, "#contracts-table")
                labels = [c.label.plain for c in t.columns.values()]
                assert labels[:len(m.devices) + 3] == ["contract", *m.devices, "tier", "headroom"]
                used, shown = _visible_width(t, len(m.devices) + 3)
                # the tier beside the statuses: whether a failure is the maths or a budget, from the spec
                tiers = {r[0]: r[len(m.devices) + 1] for r in rows(t)}
                assert tiers == {c["id"]: c["tier"] for c in m.spec["contracts"]}, m.key
                assert used <= shown, (m.key, used, shown)
                natural = max(len(c.id) for c in m.contracts)
                gave_way.append(list(t.columns.values())[0].get_render_width(t) - 2 < natural)
            assert any(gave_way)  # at least one method's ids are too long for 80 columns as they are

    run(go())


def test_at_160x48_the_tree_takes_what_its_labels_need(tmp_path, demo_names):
    root = tmp_path / "p"
    specs = write_demo_project(root, keys=("demo-method", "a-rather-long-method-key-for-layout"))

    async def go():
        app = create_app(specs, root / "receipts", root, poll_seconds=None)
        async with running(app, size=(160, 48)) as pilot:
            tree = app.screen.query_one("#methods")
            left = app.screen.query_one("#left")
            labels = [str(tree.get_node_at_line(i).label) for i in range(tree.last_line + 1)
                      if tree.get_node_at_line(i).data[0] == "method"]
            assert labels[0] == "✗ a-rather-long-method-key-for-layout IN-REVIEW not-promoted"
            assert left.size.width > 40  # not a fixed 40 or 42
            assert tree.scrollable_content_region.width >= max(len(x) for x in labels) + 2  # nothing cut
            before, tree_width = app.screen.query_one("#right").size.width, left.outer_size.width
            await pilot.press("t")  # the tree folds away; the tables get the width
            await settle(app, pilot)
            assert not left.display and app.screen.query_one("#right").size.width == before + tree_width
            await pilot.press("t")
            await settle(app, pilot)
            assert left.display

    run(go())


def test_focus_shows_after_tab(store):
    async def go():
        async with started(store) as (app, pilot):
            left, right = app.screen.query_one("#left"), app.screen.query_one("#right")
            assert app.focused is app.screen.query_one("#methods")
            assert left.styles.border_top[0] == "heavy" and right.styles.border_top[0] == "round"
            await pilot.press("tab")
            await settle(app, pilot)
            assert app.focused is not None and right in app.focused.ancestors
            assert right.styles.border_top[0] == "heavy" and left.styles.border_top[0] == "round"

    run(go())


def test_the_palette_lists_the_apps_commands_before_textuals(store):
    from textual.command import CommandList

    async def go():
        async with started(store) as (app, pilot):
            system = {c.title for c in app.get_system_commands(app.screen)}
            await pilot.press("ctrl+p")
            await pilot.pause(0.5)
            options = app.screen.query_one(CommandList)
            prompts = [str(options.get_option_at_index(i).prompt).split("\n")[0] for i in range(options.option_count)]
            ours = [i for i, p in enumerate(prompts) if not any(p.startswith(s) for s in system)]
            theirs = [i for i, p in enumerate(prompts) if any(p.startswith(s) for s in system)]
            assert prompts[0].startswith("method: demo-method") and theirs and max(ours) < min(theirs), prompts
            assert any(p.startswith("check: demo-method") for p in prompts)
            assert any(p.startswith("promote: demo-method") for p in prompts)
            await pilot.press(*"quit")  # typed: Textual's own still reachable, below any app match
            await pilot.pause(0.5)
            first = str(options.get_option_at_index(0).prompt)
            assert "Quit" in first, first

    run(go())


def test_every_binding_has_an_id_shows_in_the_footer_and_in_help():
    from textual.binding import Binding

    from tui.app import binding_classes
    from tui.screens.help import key_rows

    for cls in binding_classes():
        for b in cls.BINDINGS:
            assert isinstance(b, Binding) and b.id, (cls.__name__, b)
            assert b.show, (cls.__name__, b.id)  # the footer shows it where it applies
    assert {bid for bid, _, _ in key_rows(binding_classes())} == binding_ids()
    assert {"mark", "check", "check.stop", "promote", "demote", "tree", "tab.results", "tab.plots"} <= binding_ids()


def test_the_footer_shows_what_applies_where_you_are(store):
    async def go():
        async with started(store, size=(80, 24)) as (app, pilot):
            bar = app.screen.query_one("KeyBar")
            entries = {desc for _keys, desc, _on in bar.entries()}
            assert {"Filter", "Check", "Tree", "Tabs", "Move", "Quit"} <= entries
            assert not {"Diff", "Mark", "Promote", "Demote", "Stop check"} & entries
            assert ("1-5", "Tabs", True) in bar.entries() and ("j/k/g/G", "Move", True) in bar.entries()
            assert len(bar.render_keys().plain.split("\n")) == 2  # 80 columns: wrapped, not cut
            await pilot.press("2")
            await settle(app, pilot)
            assert {"Diff", "Mark"} <= {desc for _k, desc, _on in bar.entries()}
            await pilot.press("5")
            await settle(app, pilot)
            assert "Promote" in {desc for _k, desc, _on in bar.entries()}

    run(go())


def test_empty_states_say_so(store):
    async def go():
        async with started(store) as (app, pilot):
            app.select_method("other-method")
            await pilot.press("f")
            await settle(app, pilot)
            tree = app.screen.query_one("#methods")
            other = next(n for n in tree.root.children if n.data == ("method", "other-method"))
            assert [str(n.label) for n in other.children] == ["no failing contracts (f shows all)"]
            note = app.screen.query_one("#contracts-note")
            assert note.display and "no failures: none of the 4 contracts failed in its newest receipt (4 never run)" \
                in str(note.render())
            assert table(app, "#contracts-table").row_count == 0
            await pilot.press("2")
            await settle(app, pilot)
            assert "no receipts for other-method yet: press c" in str(app.screen.query_one("#receipts-note").render())
            await pilot.press("f")
            app.open_receipt(f"demo-method/{store['passed'].name}")
            await settle(app, pilot)
            await pilot.press("f")
            await settle(app, pilot)
            assert "no failures: all 15 result(s) passed" in str(app.screen.query_one("#results-note").render())
            await pilot.press("2")
            assert "no survivors: all 3 mutant(s) were killed" in str(app.screen.query_one("#mutants-note").render())
            row = app.model.receipt(f"demo-method/{store['passed'].name}")
            app.push_screen(DiffScreen(row, row, "a receipt with itself"))
            await settle(app, pilot)
            assert "no differences" in str(app.screen.query_one("#diff-header").render())

    run(go())
