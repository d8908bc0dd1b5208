"""The TUI's actions: coverage and comparing marked receipts, the Plots tab, running a check from the TUI
(`c`, a child process, `x` to stop it), promoting and demoting from the Gate tab (`p`)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import textwrap
import time
from pathlib import Path

import pytest

from benchmarks.synthetic_store import add_receipt, predicate, stamp
from benchmarks.synthetic_store import subject_for, write_demo_project
from engine.gate import review
from engine.spec.loader import load_spec
from engine.store.receipts import statement, write_receipt
from tui import checkrun, plots
from tui.app import create_app
from tui.screens.diff import DiffScreen
from tui.screens.forms import CheckForm, ConfirmScreen, MessageScreen, ReasonForm
from tui.screens.main import MainScreen
from tui.screens.receipt import ReceiptScreen
from tui.widgets import VimTable

REPO = Path(__file__).resolve().parent.parent
from tui_support import demo_names, make_app, rows, running, settle, started, store, text_of  # noqa: F401


def partial_receipts(store) -> dict[str, Path]:
    """Three partial cpu runs of demo-method, newer than the fixture's: --only, --no-mutants, interrupted."""
    spec = load_spec(store["specs"] / "demo-method.yaml", store["root"]).data
    out = {}
    p = predicate(spec, stamp(10), rng=random.Random(10))
    p["results"] = [r for r in p["results"] if r["contract"] == "ratio-forward"]
    p["request"].update(only=["ratio-forward"], contracts=["ratio-forward"], mutants=["no-prefix-mean"])
    p["summary"]["contracts"] = {"ratio-forward": p["summary"]["contracts"]["ratio-forward"]}
    p["mechanism"], p["mutants"] = [], p["mutants"][:1]
    p["actual"].update(results=len(p["results"]), mutants_run=1)
    out["only"] = write_receipt(store["receipts"], statement(subject_for(store["root"], "demo-method"), p))
    p = predicate(spec, stamp(11), rng=random.Random(11))
    p["request"]["mutants"], p["mutants"], p["actual"]["mutants_run"] = [], [], 0
    out["no_mutants"] = write_receipt(store["receipts"], statement(subject_for(store["root"], "demo-method"), p))
    p = predicate(spec, stamp(12), rng=random.Random(12))
    p["results"] = [r for r in p["results"] if r["contract"] != "mechanism-run"]
    p["summary"]["contracts"]["mechanism-run"].update(passed=0, failed=0)
    p["status"], p["errors"] = "interrupted", ["interrupted: the run was stopped; results finished so far are kept"]
    out["interrupted"] = write_receipt(store["receipts"], statement(subject_for(store["root"], "demo-method"), p))
    return out


# --- coverage ------------------------------------------------------------------------------------


def test_every_receipt_row_and_header_says_full_or_partial(store):
    partial = partial_receipts(store)

    async def go():
        async with started(store, settled=False) as (app, pilot):
            await pilot.press("2")
            await settle(app, pilot)
            cov = {r[1]: r[4] for r in rows(app.screen.query_one("#receipts-table", VimTable))}
            assert cov["2026-01-05 09:10:00"] == "partial 1/4"  # --only ratio-forward
            assert cov["2026-01-05 09:11:00"] == "partial 4/4"  # every contract, but no mutants
            assert cov["2026-01-05 09:12:00"] == "partial 3/4"  # interrupted before mechanism-run
            assert cov["2026-01-05 09:00:00"] == "full" and cov["2026-01-05 09:02:00"] == "partial 4/4"  # 1 seed
            assert cov["2026-01-05 09:05:00"] == "–"  # a corrupt file covers nothing we can tell
            app.open_receipt(f"demo-method/{partial['only'].name}")
            await settle(app, pilot)
            head = text_of(app.screen.query_one("#receipt-header"))
            assert "coverage partial 1/4: --only ratio-forward" in head
            app.open_receipt(f"demo-method/{partial['no_mutants'].name}")
            await settle(app, pilot)
            assert ": --no-mutants" in text_of(app.screen.query_one("#receipt-header"))
            await pilot.press("2")
            assert "no mutants ran (--no-mutants)" in text_of(app.screen.query_one("#mutants-note"))
            from tui.data import model_as_dict

            newest = model_as_dict(app.model)["methods"][0]["newest_receipt"]  # `contracts tui --json`
            assert newest["file"].endswith(partial["interrupted"].name)
            assert newest["coverage"]["label"] == "partial 3/4" and "interrupted" in newest["coverage"]["why"][0]

    asyncio.run(go())


def test_diff_defaults_to_the_previous_full_receipt_on_the_same_device(store):
    partial = partial_receipts(store)
    spec = load_spec(store["specs"] / "demo-method.yaml", store["root"]).data
    newest = add_receipt(store["receipts"], store["root"], spec, 13, rng=random.Random(13))  # full, cpu

    async def go():
        async with started(store, receipt=f"demo-method/{newest.name}") as (app, pilot):
            await pilot.press("d")
            await settle(app, pilot)
            assert isinstance(app.screen, DiffScreen)
            # not the three partial runs in between, not the newer-looking cuda one: the failed full cpu run
            assert app.screen.old.file.endswith(store["failed"].name)
            assert "previous full receipt on cpu" in text_of(app.screen.query_one("#diff-header"))
            d = rows(app.screen.query_one("#diff-table", VimTable))
            assert not any(r[0] == "added" for r in d)  # a partial baseline shows 100+ of these
            await pilot.press("escape", "escape")
            app.open_receipt(f"demo-method/{store['cuda'].name}")  # the only cuda receipt: nothing to compare
            await settle(app, pilot)
            await pilot.press("d")
            await settle(app, pilot)
            assert isinstance(app.screen, ReceiptScreen)
            assert "no earlier full receipt of demo-method on cuda" in list(app._notifications)[-1].message
        assert partial  # the partial receipts were there all along

    asyncio.run(go())


def test_mark_any_two_receipts_and_compare_them(store):
    async def go():
        async with started(store, settled=False) as (app, pilot):
            await pilot.press("2")
            await settle(app, pilot)
            t = app.screen.query_one("#receipts-table", VimTable)
            files = app.screen._receipt_files
            cuda = files.index(f"demo-method/{store['cuda'].name}")
            stale = files.index(f"demo-method/{store['stale'].name}")
            t.move_cursor(row=cuda)
            await pilot.press("m")
            t.move_cursor(row=stale)
            await pilot.press("m")
            await settle(app, pilot)
            marks = [r[0] for r in rows(t)]
            assert marks[cuda] == "●1" and marks[stale] == "●2" and marks.count("") == len(marks) - 2
            await pilot.press("d")  # two marked: those two, older first, whichever row the cursor is on
            await settle(app, pilot)
            assert isinstance(app.screen, DiffScreen)
            assert app.screen.old.file.endswith(store["stale"].name)
            assert app.screen.new.file.endswith(store["cuda"].name)
            assert "the two marked receipts" in text_of(app.screen.query_one("#diff-header"))
            await pilot.press("escape")
            t.move_cursor(row=cuda)
            await pilot.press("m")  # unmark one: d is back to the previous full receipt
            await settle(app, pilot)
            assert app.marked == [f"demo-method/{store['stale'].name}"]
            app.toggle_mark(f"demo-method/{store['passed'].name}")
            app.toggle_mark(f"demo-method/{store['failed'].name}")  # a third mark drops the oldest
            assert app.marked == [f"demo-method/{store['passed'].name}", f"demo-method/{store['failed'].name}"]

    asyncio.run(go())


# --- the Plots tab ---------------------------------------------------------------------------------


def test_sparklines_scale_each_row_and_mark_flat_and_bad_points():
    assert plots.sparkline([0.0, 0.5, 1.0], 0.0, 1.0).plain == "▁▅█"
    assert plots.sparkline([3.0, 3.0], 3.0, 3.0).plain == "──"
    assert plots.sparkline([1.0, float("nan"), 2.0], 1.0, 2.0).plain == "▁×█"
    assert len(plots.sparkline([float(i) for i in range(500)], 0, 499).plain) == plots.MAX_POINTS


def test_step_records_become_series_per_seed_split_by_arm():
    records = [{"contract": "mechanism", "seed": s, "dtype": "float32", "steps": [
        {"arm": arm, "update": i, "loss": float(i + s), "clip_fraction": 0.1 * i, "replay_active": i > 0,
         "gates": [0.5, 1.0], "prompts": [0, 1], "note": None}
        for arm in ("tapo", "grpo-control") for i in range(3)]} for s in (42, 43)]
    got = plots.series(records)
    assert set(got) == {("mechanism", "float32", "arm tapo"), ("mechanism", "float32", "arm grpo-control")}
    tapo = got[("mechanism", "float32", "arm tapo")]
    assert set(tapo) == {"loss", "clip_fraction", "replay_active", "mean(gates)"}  # no indices, no int lists
    assert tapo["loss"] == {42: [42.0, 43.0, 44.0], 43: [43.0, 44.0, 45.0]}
    assert tapo["replay_active"][42] == [0.0, 1.0, 1.0] and tapo["mean(gates)"][43] == [0.75] * 3


def test_plots_tab_draws_the_real_receipts_step_records():
    """The three methods' own receipts: TAPO's ratio/clip statistics per arm, TAR's replay gate, MRTPO's beta."""
    from engine.store.receipts import load_receipt

    wanted = {"tapo-trajectory": ("ratio_max", "clip_fraction", "grad_norm", "(arm grpo-control)"),
              "tar-adaptive-replay": ("replay_active", "mean(gates)", "total_grad_norm", "(phase update)"),
              "mrtpo": ("beta", "grad_norm", "loss", "mean(reward_mean)")}
    for method, names in wanted.items():
        # the newest check receipt: a `contracts mutate` receipt (which may be newer) records no mechanism runs
        files = sorted((REPO / "receipts" / method).glob("*.json"), reverse=True)  # newest first
        preds = (load_receipt(p)["predicate"] for p in files)
        pred = next(p for p in preds if "mutation" not in p)
        from rich.console import Console

        console = Console(width=160, record=True, color_system=None)
        console.print(plots.render(pred, 160))
        out = console.export_text()
        for name in names:
            assert name in out, (method, name)
        assert "seed 42" in out and "seed 44" in out


def test_receipt_screen_number_keys_and_the_plots_tab(store):
    async def go():
        async with started(store, receipt=f"demo-method/{store['passed'].name}") as (app, pilot):
            tabs = app.screen.query_one("#receipt-tabs")
            for key, tab in (("2", "mutants"), ("3", "mechanism"), ("5", "raw"), ("4", "plots"), ("1", "results")):
                await pilot.press(key)
                await settle(app, pilot)
                assert tabs.active == tab
            await pilot.press("4")
            await settle(app, pilot)
            view = text_of(app.screen.query_one("#plots-view"))
            assert "mechanism-run float32: 4 step(s)" in view
            for name in ("loss", "grad_norm", "clip_fraction", "seed 42", "seed 43", "seed 44"):
                assert name in view

    asyncio.run(go())


# --- `c`: a check in a child process -----------------------------------------------------------------

FAKE_CHECK = textwrap.dedent('''
    # Stands in for `contracts check` in the Pilot tests: the same progress frames, SIGINT -> exit 130.
    import json, signal, sys, time
    stopped = []
    signal.signal(signal.SIGINT, lambda *a: stopped.append(1))
    total = int(sys.argv[1])
    for i in range(total + 1):
        if stopped:
            print(json.dumps({"runs": [{"receipt_id": "f" * 64, "status": "interrupted"}]}))
            sys.stderr.write("\\r\\x1b[2K\\ninterrupted: the run was stopped\\n")
            sys.exit(130)
        sys.stderr.write(f"\\r\\x1b[2Kdemo-method: ratio-forward seed {i} float32 passed \\u2501\\u2501\\u257a "
                         f"{i}/{total} 0:00:0{min(i, 9)}")
        sys.stderr.flush()
        time.sleep(float(sys.argv[2]))
    print(json.dumps({"runs": [{"receipt_id": "e" * 64, "status": "passed"}]}))
''')


def test_parse_progress_reads_richs_live_bar_back():
    frames = ("\x1b[?25l\r\x1b[2Ktapo-trajectory \x1b[90m━━━━━━━━━━\x1b[0m \x1b[32m0/8\x1b[0m \x1b[33m0:00:00\x1b[0m"
              "\r\x1b[2Ktapo-trajectory: mutant clip_reversed / clip_schedule failed \x1b[91m━━━━━━━\x1b[0m\x1b[90m╺━━"
              "\x1b[0m \x1b[32m7/8\x1b[0m \x1b[33m0:00:03\x1b[0m\r\x1b[2Ktapo-trajectory: clip_sch")  # cut mid-frame
    p = checkrun.parse_progress(frames)
    assert (p.done, p.total, p.elapsed) == (7, 8, "0:00:03")
    assert p.label == "tapo-trajectory: mutant clip_reversed / clip_schedule failed"
    assert checkrun.parse_progress("loading ...\n") is None
    assert checkrun.check_form_problems("cuda:1", "42, 43") == []
    assert checkrun.check_form_problems("gpu", "42;43") == ["device 'gpu': give cpu, cuda or cuda:N",
                                                           "seeds '42;43': give comma-separated integers, e.g. "
                                                           "42,43,44, or fresh (drawn at run time, recorded in the "
                                                           "receipt)"]
    assert checkrun.check_form_problems("cpu", "fresh") == checkrun.check_form_problems("cpu", "random:2") == []
    assert checkrun.check_argv("m", "cpu", "fresh", Path("specs"), Path("receipts"))[-2:] == ["--seeds", "fresh"]
    argv = checkrun.check_argv("m", "cpu", "42, 43", Path("specs"), Path("receipts"))
    assert argv[1:7] == ["-m", "engine.cli", "check", "m", "--device", "cpu"] and argv[-2:] == ["--seeds", "42,43"]
    assert "--json" in argv and Path(argv[argv.index("--receipts") + 1]).is_absolute()


def test_c_opens_a_form_runs_the_child_and_x_stops_it_after_asking(store, tmp_path, monkeypatch):
    fake = tmp_path / "fake_check.py"
    fake.write_text(FAKE_CHECK)
    started = []

    async def go():
        app = make_app(store)
        real = app.run_check
        monkeypatch.setattr(app, "run_check", lambda key, device, seeds, argv=None: started.append(
            (key, device, seeds)) or real(key, device, seeds, argv=[sys.executable, str(fake), "400", "0.05"]))
        async with running(app) as pilot:
            await pilot.press("c")
            await settle(app, pilot)
            assert isinstance(app.screen, CheckForm)
            assert app.screen.values() == ("cpu", "42,43,44")  # the budget's seeds
            await pilot.press("ctrl+a", *"gpu", "enter", "enter")
            await settle(app, pilot)
            assert isinstance(app.screen, CheckForm) and started == []
            assert "give cpu, cuda or cuda:N" in text_of(app.screen.query_one("#form-errors"))
            app.screen.query_one("#form-device").value = "cpu"
            app.screen.query_one("#form-seeds").value = "42"
            await pilot.press("ctrl+r")
            await pilot.pause()
            assert isinstance(app.screen, MainScreen) and started == [("demo-method", "cpu", "42")]
            for _ in range(200):
                await pilot.pause(0.02)
                if app.check_run.progress and app.check_run.progress.done >= 3:
                    break
            panel = text_of(app.screen.query_one("#run-panel"))
            assert "running contracts check demo-method --device cpu --seeds 42" in panel
            assert "/400" in panel and "demo-method: ratio-forward seed" in panel and "x stops it" in panel
            assert "Stop check" in text_of(app.screen.query_one("KeyBar"))
            await pilot.press("c")  # one at a time
            assert "a check of demo-method is running" in list(app._notifications)[-1].message
            await pilot.press("x")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n")  # keep running
            await pilot.pause()
            assert app.check_run.running and not app.check_run.stopping
            await pilot.press("x", "y")
            for _ in range(500):
                await pilot.pause(0.02)
                if app.check_run.returncode is not None:
                    break
            await settle(app, pilot)
            cr = app.check_run
            assert cr.returncode == 130 and cr.progress.done < 400
            panel = text_of(app.screen.query_one("#run-panel"))
            assert "ended contracts check demo-method" in panel
            assert "exit 130: stopped; what finished is kept in the receipt" in panel
            assert "Stop check" not in text_of(app.screen.query_one("KeyBar"))

    asyncio.run(go())


def test_a_check_that_cannot_run_says_why_in_the_panel(store):
    async def go():
        async with started(store) as (app, pilot):
            app.run_check("demo-method", "cuda", "", argv=[sys.executable, "-c", "import sys; sys.stderr.write("
                           "'error: --device cuda: CUDA is not available on this machine\\n'); sys.exit(4)"])
            for _ in range(500):
                await pilot.pause(0.02)
                if app.check_run.returncode is not None:
                    break
            await settle(app, pilot)
            panel = text_of(app.screen.query_one("#run-panel"))
            assert "ended contracts check demo-method --device cuda" in panel
            assert "exit 4: this machine cannot do it; no receipt written" in panel
            assert "CUDA is not available on this machine" in panel

    asyncio.run(go())


def test_a_real_check_from_the_tui_writes_a_receipt_that_then_shows(tmp_path):
    """The real `contracts check` as the child (one contract, one seed, to keep it short): its bar is read
    back, the receipt it writes is listed and selected when it finishes. The TUI process imports no torch."""
    receipts = tmp_path / "receipts"

    async def go():
        app = create_app(REPO / "specs", receipts, REPO, poll_seconds=None, persist_index=False)
        async with running(app) as pilot:
            argv = checkrun.check_argv("tapo-trajectory", "cpu", "42", app.specs_dir, app.receipts_dir)
            app.run_check("tapo-trajectory", "cpu", "42", argv=argv + ["--only", "clip_schedule"])
            frames = []
            deadline = time.monotonic() + 240
            while app.check_run.returncode is None and time.monotonic() < deadline:
                await pilot.pause(0.05)
                if app.check_run.progress:
                    frames.append(app.check_run.progress.done)
            await app.wait_loaded(2)
            await settle(app, pilot)
            cr = app.check_run
            assert cr.returncode == 0, cr.stderr_tail
            assert frames and cr.progress.total == cr.progress.done > 0
            (run,) = cr.receipts()
            row = app.model.method("tapo-trajectory").receipts[0]
            assert row.receipt_id == run["receipt_id"] and row.coverage_label.startswith("partial 1/")
            main = app.screen
            assert isinstance(main, MainScreen) and main.method == "tapo-trajectory"
            assert main.query_one("#tabs").active == "receipts" and main.selected_receipt() == row.file

    asyncio.run(go())


# --- `p` on the Gate tab ---------------------------------------------------------------------------


def open_project(tmp_path):
    """demo-method with review DONE, a fresh full cpu and cuda receipt: its gate is open."""
    root = tmp_path / "p"
    specs = write_demo_project(root, review="DONE")
    spec = load_spec(specs / "demo-method.yaml", root).data
    rd = root / "receipts"
    add_receipt(rd, root, spec, 0, device="cpu")
    add_receipt(rd, root, spec, 1, device="cuda")
    review.record(load_spec(specs / "demo-method.yaml", root), rd, "R. Viewer", "read it")
    return {"root": root, "specs": specs, "receipts": rd}


def child_with_demo_names(app, root: Path, monkeypatch):
    """`contracts promote|demote` as the app runs it, in a child that knows the demo names and root (as the
    in-process tests patch them)."""
    real = app.promotion_argv
    boot = ("import sys, engine.paths, engine.spec.registry as r; from pathlib import Path; "
            "from benchmarks.synthetic_store import demo_static_names; r._STATIC = demo_static_names(); "
            f"engine.paths.project_root = lambda: Path({str(root)!r}); "
            "from engine.cli import main; sys.argv = ['contracts', *sys.argv[1:]]; main()")

    def argv(key, action, reason):
        cmd = real(key, action, reason)
        assert cmd[1:5] == ["-m", "engine.cli", action, key] and cmd[cmd.index("--reason") + 1] == reason
        return [sys.executable, "-c", boot, *cmd[3:]]

    monkeypatch.setattr(app, "promotion_argv", argv)
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def test_promote_with_a_reason_then_demote_through_the_cli(tmp_path, demo_names, monkeypatch):
    p = open_project(tmp_path)
    spec_file = p["specs"] / "demo-method.yaml"

    async def go():
        app = make_app(p)
        child_with_demo_names(app, p["root"], monkeypatch)
        async with running(app) as pilot:
            await pilot.press("p")  # not on the Contracts tab
            await settle(app, pilot)
            assert isinstance(app.screen, MainScreen)
            await pilot.press("5")
            await settle(app, pilot)
            assert "Promote" in text_of(app.screen.query_one("KeyBar"))
            await pilot.press("p")
            await settle(app, pilot)
            assert isinstance(app.screen, ReasonForm)
            assert "promote demo-method: promotion.state not-promoted -> promoted" in text_of(
                app.screen.query_one("#form-title"))
            await pilot.press("enter")  # no reason: refused, still asking
            assert isinstance(app.screen, ReasonForm) and "say why" in text_of(app.screen.query_one("#form-errors"))
            await pilot.press(*"fresh cpu and cuda", "enter")
            await app.workers.wait_for_complete()
            await app.wait_loaded(2)
            await settle(app, pilot)
            assert "state: not-promoted" not in spec_file.read_text() and "state: promoted" in spec_file.read_text()
            entry = json.loads((p["receipts"] / "ledger.jsonl").read_text().splitlines()[-1])
            assert entry["action"] == "promote" and entry["reason"] == "fresh cpu and cuda"
            assert app.model.method("demo-method").promotion == "promoted"
            assert "Demote" in text_of(app.screen.query_one("KeyBar"))
            await pilot.press("p")
            await settle(app, pilot)
            assert isinstance(app.screen, ReasonForm) and app.screen.action == "demote"
            await pilot.press("escape")  # cancelled: nothing changes
            await settle(app, pilot)
            assert "state: promoted" in spec_file.read_text()
            await pilot.press("p")
            await settle(app, pilot)
            await pilot.press(*"rollback test", "enter")
            await app.workers.wait_for_complete()
            await app.wait_loaded(3)
            await settle(app, pilot)
            assert "state: not-promoted" in spec_file.read_text()
            assert [json.loads(x)["action"] for x in (p["receipts"] / "ledger.jsonl").read_text().splitlines()] == [
                "review", "promote", "demote"]

    asyncio.run(go())


def test_promote_is_refused_with_the_gates_reasons_when_it_is_closed(store, monkeypatch):
    async def go():
        async with started(store, settled=False) as (app, pilot):
            await pilot.press("5", "p")
            await settle(app, pilot)
            assert isinstance(app.screen, MessageScreen)
            text = text_of(app.screen.query_one("#message-text"))
            assert "demo-method cannot be promoted: the gate is closed" in text
            assert "review:" in text and "device:cuda:" in text and "$ contracts check demo-method --device cuda" in text
            await pilot.press("escape")
            assert isinstance(app.screen, MainScreen)
        assert "state: not-promoted" in (store["specs"] / "demo-method.yaml").read_text()

    asyncio.run(go())


def test_the_cli_refuses_even_when_the_tui_was_told_the_gate_is_open(tmp_path, demo_names, monkeypatch):
    """The verdict that counts is the one `contracts promote` reads from the files under its lock: a TUI whose
    gate view says open (here: patched) still gets the refusal, with the reasons, and nothing changes."""
    import tui.app as app_mod
    from tui.data import GateView

    p = open_project(tmp_path)
    (p["root"] / "engine" / "demo_engine.py").write_text("# edited after the runs\n")  # every receipt stale
    monkeypatch.setattr(app_mod, "gate_for", lambda *a, **k: GateView("open", [], "a lie"))

    async def go():
        app = make_app(p)
        child_with_demo_names(app, p["root"], monkeypatch)
        async with running(app, settled=False) as pilot:
            await pilot.press("5", "p")
            await settle(app, pilot)
            assert isinstance(app.screen, ReasonForm)
            await pilot.press(*"looks fine", "enter")
            for _ in range(400):
                await pilot.pause(0.02)
                if isinstance(app.screen, MessageScreen):
                    break
            await settle(app, pilot)
            assert isinstance(app.screen, MessageScreen)
            text = text_of(app.screen.query_one("#message-text"))
            assert "cannot be promoted" in text and "contracts promote" in text and "device:cpu:" in text
        assert "state: not-promoted" in (p["specs"] / "demo-method.yaml").read_text()
        assert [json.loads(x)["action"] for x in (p["receipts"] / "ledger.jsonl").read_text().splitlines()] == [
            "review"]  # open_project's review only: no promotion

    asyncio.run(go())
