"""The benchmark harness runs end to end (tiny shapes) and compares receipts the way the check row does."""

from __future__ import annotations

import json

from benchmarks.__main__ import main
from benchmarks.check_all import comparable, differences


def test_quick_run_prints_a_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = main(["--quick", "--only", "tapo", "--only", "mrtpo", "--only", "tar", "--out", str(out)])
    data = json.loads(out.read_text())
    assert code in (0, 1)  # targets are not judged at quick shapes
    names = [r["name"] for r in data["rows"]]
    assert names == ["TAPO loss fwd+bwd", "MRTPO credit weights", "TAR FPS bank"]
    for r in data["rows"]:
        assert isinstance(r["value"], float) and r["value"] > 0, r
        assert r["ok"] in (True, False) and r["target"] and r["spread"], r
    mrtpo = data["rows"][1]["details"]
    assert mrtpo["memory"]["naive"]["extra_bytes"] > mrtpo["memory"]["method"]["extra_bytes"] > 0
    assert mrtpo["max_abs_diff"] < 1e-5
    assert data["rows"][2]["details"]["identical_picks"] is True
    assert data["machine"]["cores"] and data["machine"]["torch"] and data["machine"]["quick"] is True
    assert "TAPO loss fwd+bwd" in capsys.readouterr().out


def test_receipt_comparison_ignores_times_and_finds_a_changed_measurement():
    a = {"created_at": "t1", "cost": {"wall_s": 1.0, "optimizer_updates": 3},
         "results": [{"measurements": {"err": 1e-13, "seconds": 0.2}, "wall_s": 0.1}], "execution": {"jobs": 2}}
    b = {"created_at": "t2", "cost": {"wall_s": 9.0, "optimizer_updates": 3},
         "results": [{"measurements": {"err": 1e-13, "seconds": 0.7}, "wall_s": 0.3}]}
    assert differences(comparable(a), comparable(b)) == []
    b["results"][0]["measurements"]["err"] = 2e-13
    assert differences(comparable(a), comparable(b)) == ["$.results[0].measurements.err"]
