"""`contracts conformance` and the TUI's Conformance screen: the matrix is read from fresh receipts only, a failing
cell names its first failing case and a command that reruns it, the document is generated whole (never edited by
hand) and keeps data as data, and the read path never imports torch.

The receipts here come from a framework-free candidate (a DAPO loss that zeroes masked slots by multiplying, the
OpenRLHF PR #1240 bug) named in a zoo table of the test's own, so the matrix's failing path runs without verl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app
from engine.store import conformance as C

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

CANDIDATE = '''
import torch


def dapo_loss(logp, old_logp, advantages, mask, *, clip_low=0.2, clip_high=0.28, log_ratio_clamp=20.0):
    m = mask.to(torch.float32 if logp.dtype != torch.float64 else torch.float64)
    a = advantages[:, None] if advantages.dim() == 1 else advantages
    r = ((logp - old_logp.detach()) * m).clamp(-log_ratio_clamp, log_ratio_clamp).exp()
    f = torch.maximum(-r * a, -r.clamp(1 - clip_low, 1 + clip_high) * a) * m  # NaN * 0 = NaN
    n = int(mask.sum())
    return f.sum() / n, {"tokens": n, "rows": int((mask != 0).any(-1).sum())}


def overlong_penalty(lengths, max_length, cache_length):
    raise NotImplementedError


def dynamic_sampling_mask(correct, group_size):
    raise NotImplementedError
'''

ZOO = """
frameworks:
  toy:
    version: "1.0"
    where: "a file candidate"
    variants:
      - {name: by_multiply, target: "TARGET", claims: [dapo], paper: "DAPO, arXiv 2503.14476"}
      - {name: unchecked, target: "toy:none", claims: [dapo], paper: "DAPO"}
      - {name: other, target: "toy:other", claims: [], paper: "a paper | with a pipe", why: "no spec `here` | yet"}
  blockedfw:
    version: "0.1"
    blocked: "ModuleNotFoundError: No module named 'flash_attn'"
    repro: "python -c 'import blockedfw'"
    variants:
      - {name: PolicyLoss, target: "blockedfw:PolicyLoss", claims: [grpo], paper: "PPO"}
defects:
  masked_junk:
    title: "NaN in a masked slot reaches the loss"
    severity: high
    text: "Masked slots are zeroed by multiplying with the mask; select with a where instead."
"""


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """A store with one receipt: the NaN-leaking candidate under DAPO's masked_junk and token_weights contracts."""
    tmp = tmp_path_factory.mktemp("conf")
    cand = tmp / "dapo_by_multiply.py"
    cand.write_text(CANDIDATE)
    receipts = tmp / "receipts"
    r = runner.invoke(app, ["check", "dapo", "--impl", str(cand), "--only", "masked_junk", "--seeds", "42",
                            "--no-mutants", "--receipts", str(receipts)])
    assert r.exit_code == 1, r.output  # the contract fails: that is what the matrix must show
    target = json.loads(next(receipts.glob("dapo/*.json")).read_text())["predicate"]["implementation"]["target"]
    zoo = tmp / "zoo.yaml"
    zoo.write_text(ZOO.replace("TARGET", target))
    return {"zoo": zoo, "receipts": receipts, "target": target, "tmp": tmp}


def test_a_failing_cell_names_its_first_case_and_repro(checked):
    m = C.build(checked["zoo"], ROOT / "specs", checked["receipts"], ROOT)
    cell = next(c for c in m.cells if c.variant == "by_multiply")
    assert cell.status == C.FAILED and cell.subset == ("masked_junk",) and cell.seeds == (42,)
    (x,) = cell.contracts
    assert x.id == "masked_junk" and x.status == C.FAILED and x.case.startswith("seed 42 case ")
    assert x.repro.startswith(f"contracts check dapo --impl {checked['target']} --only masked_junk --seeds 42 --case ")
    assert [c.status for c in m.cells if c.variant != "by_multiply"] == [C.NO_RECEIPT, C.NO_SPEC, C.BLOCKED]
    (d,) = m.defects
    assert d.severity == "high" and d.seen_in == (("toy 1.0 by_multiply", "dapo", "masked_junk"),)


def test_only_fresh_receipts_count(checked, tmp_path):
    """A receipt of other specs than the checkout's is stale: the cell says so and how to rerun, never its
    verdict."""
    import shutil

    specs = tmp_path / "specs"
    shutil.copytree(ROOT / "specs", specs)
    (specs / "dapo.yaml").write_text((specs / "dapo.yaml").read_text() + "\n# edited\n")
    m = C.build(checked["zoo"], specs, checked["receipts"], ROOT)
    cell = next(c for c in m.cells if c.variant == "by_multiply")
    assert cell.status == C.STALE and not cell.contracts and "rerun: contracts check dapo" in cell.why


def test_the_document_is_generated_whole_and_keeps_data_as_data(checked, tmp_path):
    out = tmp_path / "conformance.md"
    r = runner.invoke(app, ["conformance", "--zoo", str(checked["zoo"]), "--receipts", str(checked["receipts"]),
                            "--write", str(out)])
    assert r.exit_code == 0, r.output
    doc = out.read_text()
    assert doc.startswith("# Conformance") and "do not edit it by hand" in doc
    for section in ("## The matrix", "## Cells", "## Failures, cell by cell", "## Defects", "## Variants without"):
        assert section in doc
    assert "**failed**" in doc and "repro: `contracts check dapo --impl" in doc
    assert "NaN in a masked slot reaches the loss (high)" in doc
    assert "a paper \\| with a pipe" in doc and "no spec 'here' \\| yet" in doc  # a pipe cannot open a column
    assert "blocked: ModuleNotFoundError" in doc and "`python -c 'import blockedfw'`" in doc
    again = tmp_path / "again.md"
    runner.invoke(app, ["conformance", "--zoo", str(checked["zoo"]), "--receipts", str(checked["receipts"]),
                        "--write", str(again)])
    assert again.read_text().replace(str(again), "X") == doc.replace(str(out), "X")  # the same receipts, the same text


def test_json_and_terminal_rows(checked):
    r = runner.invoke(app, ["conformance", "--zoo", str(checked["zoo"]), "--receipts", str(checked["receipts"]),
                            "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    cell = next(c for c in data["cells"] if c["variant"] == "by_multiply")
    assert cell["status"] == "failed" and cell["counts"]["failed"] == 1
    r = runner.invoke(app, ["conformance", "--zoo", str(checked["zoo"]), "--receipts", str(checked["receipts"])])
    assert "first failing: masked_junk" in r.stdout and "blocked" in r.stdout


def test_a_broken_zoo_table_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "zoo.yaml"
    bad.write_text("frameworks: [1, 2\n")
    r = runner.invoke(app, ["conformance", "--zoo", str(bad), "--receipts", str(tmp_path)])
    assert r.exit_code == 2 and "cannot read the framework zoo table" in r.output
    assert "Traceback" not in r.output


def test_the_shipped_table_covers_every_row_it_claims(tmp_path):
    """The real zoo table on an empty store: every cell is a row, verl's twelve losses and OpenRLHF among them."""
    m = C.build(C.default_zoo(), ROOT / "specs", tmp_path, ROOT)
    verl = {c.variant for c in m.cells if c.framework == "verl"}
    assert {"vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo", "sapo", "dro", "dppo_kl", "dppo_tv",
            "bypass_mode"} == verl
    assert {c.status for c in m.cells if c.framework == "openrlhf"} == {C.BLOCKED}
    assert {"dapo", "dr-grpo", "cispo", "gmpo", "gpg", "grpo", "gspo"} <= set(m.specs)


def test_the_read_path_imports_no_torch(checked):
    code = ("import sys; from engine.cli.main import main; sys.argv = ['contracts', 'conformance', '--zoo', "
            f"{str(checked['zoo'])!r}, '--receipts', {str(checked['receipts'])!r}, '--json']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert '"status": "failed"' in proc.stdout


def test_the_tui_shows_the_matrix_on_its_own_screen(checked):
    import asyncio

    from tui.app import create_app
    from tui.screens.conformance import ConformanceScreen
    from tui.widgets import VimTable

    async def drive():
        a = create_app(ROOT / "specs", checked["receipts"], ROOT, poll_seconds=None, persist_index=False)
        a.zoo = checked["zoo"]
        async with a.run_test(size=(140, 40)) as pilot:
            await a.wait_loaded()
            await pilot.press("C")
            await a.workers.wait_for_complete()
            await pilot.pause()
            screen = a.screen
            assert isinstance(screen, ConformanceScreen)
            cells = screen.query_one("#conf-cells", VimTable)
            rows = [[str(x) for x in cells.get_row_at(i)] for i in range(cells.row_count)]
            assert rows[0][:4] == ["toy 1.0", "by_multiply", "dapo", "failed"] and rows[0][-1] == "masked_junk"
            contracts = screen.query_one("#conf-contracts", VimTable)
            first = [str(x) for x in contracts.get_row_at(0)]
            assert first[:2] == ["masked_junk", "failed"] and first[3].startswith("contracts check dapo")
            await pilot.press("j")  # the next row: no receipt, and what to run
            await pilot.pause()
            assert "run: contracts check dapo --impl toy:none" in str(contracts.get_row_at(0)[2])
            footer_ids = {b.id for b in a.BINDINGS}
            assert "conformance" in footer_ids
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(a.screen, ConformanceScreen)

    asyncio.run(drive())
