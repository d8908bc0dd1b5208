"""Family dependencies (`depends_on`): the gate of a dependent method needs fresh, complete, passing receipts of each
dependency on the same tree and says which is missing and the command that makes it; validate reports unknown
dependencies and cycles at their file and line; `check --all` runs dependencies first; show names them.

The three planted GRPO bugs the control arm runs (EOS dropped from the sampler's mask, the clip without its upper
bound, advantages not divided by the std) fail only `contracts check grpo`; TAPO's, MRTPO's and TAR's gates then stay
closed on depends:grpo, with or without a grpo receipt.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType

import pytest
from typer.testing import CliRunner

import engine.cli as cli
from engine.errors import SpecError
from engine.gate.verdict import evaluate
from engine.spec import depends, registry
from engine.spec.loader import load_spec
from engine.store import receipts as R
from tests import gate_support as G

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

NAMES = registry.StaticNames(
    implementations=MappingProxyType({"toy": ("double",), "ctl": ("double",)}),
    checks=frozenset({"toy.double_value", "toy.mechanism"}),
    mutants=MappingProxyType({"toy.off_by_a_bit": "toy", "ctl.off_by_a_bit": "ctl"}),
    files=(),
)
CTL_TEXT = (G.SPEC_TEXT.replace("method: toy", "method: ctl").replace("implementation: toy", "implementation: ctl")
            .replace("mutant: toy.off_by_a_bit", "mutant: ctl.off_by_a_bit")
            .replace("formal_comparison: true", "formal_comparison: false"))
DEPENDS = "implementation: toy\ndepends_on:\n  - {method: ctl, why: the toy's control arm runs ctl's code}\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """toy (depends on ctl) and ctl, both approved; toy has complete passing evidence of its own."""
    monkeypatch.setattr(registry, "_STATIC", NAMES)
    root, specs, receipts = G.make_layout(tmp_path, G.SPEC_TEXT.replace("implementation: toy\n", DEPENDS))
    (specs / "ctl.yaml").write_text(CTL_TEXT)
    monkeypatch.setattr("engine.paths.project_root", lambda: root)
    G.approve(root, specs, receipts)
    G.write(root, receipts, specs / "toy.yaml", comparisons=G.ahead())
    return root, specs, receipts


def _write_ctl(root: Path, receipts: Path, specs: Path, **kw) -> str:
    pred = G.predicate(specs / "ctl.yaml", **kw)
    pred["method"] = "ctl"
    pred["implementation"]["name"] = "ctl"
    pred["spec"]["implementation"] = "ctl"
    for m in pred["mutants"]:
        m["mutant"] = "ctl.off_by_a_bit"
    subject = [{"name": "src/toy.py", "digest": {"sha256": R.sha256_file(root / "src/toy.py")}},
               {"name": "specs/ctl.yaml", "digest": {"sha256": R.sha256_file(specs / "ctl.yaml")}}]
    path = R.write_receipt(receipts, R.statement(subject, pred))
    return json.loads(path.read_bytes())["predicate"]["receipt_id"]


def _gate(root, specs, receipts, flags: str = "") -> dict:
    return evaluate(load_spec(specs / "toy.yaml", root), receipts, root, specs, flags)


def _dep(result: dict) -> dict:
    return next(r for r in result["requirements"] if r["id"] == "depends:ctl")


def test_without_a_dependency_receipt_the_gate_stays_closed_and_says_which(project):
    root, specs, receipts = project
    r = _gate(root, specs, receipts, " --receipts STORE")
    assert not r["promotable"]
    assert [x.split(":")[0] for x in r["reasons"]] == ["depends"]  # everything else of toy's own is met
    dep = _dep(r)
    assert not dep["met"] and dep["dependency"] == "ctl"
    assert dep["detail"].startswith("toy's evidence rests on ctl, which is not shown to hold on this tree: "
                                    "device:cpu no fresh cpu receipt")
    assert dep["argv"] == ["contracts", "check", "ctl", "--device", "cpu", "--receipts", "STORE"]


def test_a_passing_dependency_receipt_on_this_tree_opens_it(project):
    root, specs, receipts = project
    rid = _write_ctl(root, receipts, specs)
    r = _gate(root, specs, receipts)
    assert r["promotable"], r["reasons"]
    dep = _dep(r)
    assert dep["met"] and dep["receipts"] == [rid] and rid in r["justified_by"]
    assert [p["id"] for p in dep["parts"]] == ["device:cpu", "mutants_killed"] and all(p["met"] for p in dep["parts"])


def test_a_failing_or_stale_or_incomplete_dependency_keeps_it_closed(project):
    root, specs, receipts = project
    _write_ctl(root, receipts, specs, fail=[("double-value", 2, "float32")])
    dep = _dep(_gate(root, specs, receipts))
    assert not dep["met"] and "which fails on this tree" in dep["detail"] and "double-value seed 2 float32 failed" \
        in dep["detail"]
    assert dep["argv"] is None and "fix the implementation or the spec" in dep["note"]


def test_a_dependency_receipt_of_another_tree_does_not_count(project):
    root, specs, receipts = project
    _write_ctl(root, receipts, specs)
    (root / "src" / "toy.py").write_text("def double(x):\n    return x + x\n")  # the code both measured changed
    r = _gate(root, specs, receipts)
    assert "stale" in _dep(r)["detail"] and not _dep(r)["met"]


def test_a_dependency_checked_on_some_seeds_only_does_not_count(project):
    root, specs, receipts = project
    _write_ctl(root, receipts, specs, seeds=(1,))
    dep = _dep(_gate(root, specs, receipts))
    assert not dep["met"] and "never passed" in dep["detail"]


def test_the_dependency_is_checked_as_registered_whatever_impl_the_gate_was_given(project):
    root, specs, receipts = project
    r = evaluate(load_spec(specs / "toy.yaml", root), receipts, root, specs, " --impl my_toy.py --receipts S",
                 implementation="impl:abc")
    assert _dep(r)["argv"] == ["contracts", "check", "ctl", "--device", "cpu", "--receipts", "S"]


def test_gate_json_publishes_the_dependency_requirement(project):
    import jsonschema

    root, specs, receipts = project
    out = runner.invoke(cli.app, ["gate", "toy", "--json", "--specs", str(specs), "--receipts", str(receipts)])
    assert out.exit_code == 1, out.output
    doc = json.loads(out.stdout)
    schema = json.loads((ROOT / "engine" / "schemas" / "gate.schema.json").read_text())
    jsonschema.validate(doc, schema)
    dep = next(r for r in doc["requirements"] if r["id"] == "depends:ctl")
    assert dep["fix"] == {"argv": ["contracts", "check", "ctl", "--device", "cpu", "--specs", str(specs),
                                   "--receipts", str(receipts)]}


# --- validate, ordering, show --------------------------------------------------------------------------------------


def _folder(tmp_path: Path, specs: dict[str, list[str]]) -> Path:
    """Specs named by key, each depending on the listed keys (copies of the real grpo spec, renamed)."""
    d = tmp_path / "specs"
    d.mkdir(exist_ok=True)
    base = (ROOT / "specs" / "grpo.yaml").read_text()
    for key, deps in specs.items():
        text = base.replace("method: grpo\n", f"method: {key}\n")
        if deps:
            text = text.replace("implementation: grpo\n", "implementation: grpo\ndepends_on: [" + ", ".join(deps)
                                + "]\n")
        (d / f"{key}.yaml").write_text(text)
    return d


def test_validate_reports_a_cycle_and_an_unknown_dependency_at_their_lines(tmp_path):
    d = _folder(tmp_path, {"aa": ["bb"], "bb": ["cc"], "cc": ["aa"], "dd": ["nowhere"]})
    r = runner.invoke(cli.app, ["validate", "--specs", str(d)])
    assert r.exit_code == 2
    lines = [ln for ln in r.output.splitlines() if "$.depends_on" in ln]
    line_no = next(i for i, t in enumerate((d / "cc.yaml").read_text().splitlines(), 1) if t.startswith("depends_on"))
    assert any(f"cc.yaml:{line_no}:" in ln and "dependency cycle: aa -> bb -> cc -> aa" in ln for ln in lines), lines
    assert any("dd.yaml:" in ln and "depends_on names 'nowhere', which has no spec in this folder" in ln
               for ln in lines), lines
    assert len(lines) == 2


def test_a_spec_cannot_depend_on_itself_or_twice(tmp_path):
    d = _folder(tmp_path, {"aa": ["aa"], "bb": ["grpo", "{method: grpo, why: the control}"], "grpo": []})
    r = runner.invoke(cli.app, ["validate", "--specs", str(d)])
    assert r.exit_code == 2
    assert "aa depends on itself" in r.output and "grpo is listed twice" in r.output


def test_dependencies_run_first(tmp_path):
    d = _folder(tmp_path, {"aa": ["zz"], "mm": [], "zz": ["mm"]})
    order = [p.stem for p in depends.ordered(sorted(d.glob("*.yaml")))]
    assert order == ["mm", "zz", "aa"]
    (d / "mm.yaml").write_text((d / "mm.yaml").read_text().replace("implementation: grpo\n",
                                                                   "implementation: grpo\ndepends_on: [aa]\n"))
    with pytest.raises(SpecError, match="dependency cycle"):
        depends.ordered(sorted(d.glob("*.yaml")))


def test_check_all_refuses_a_cycle_before_running_anything(tmp_path):
    d = _folder(tmp_path, {"aa": ["bb"], "bb": ["aa"]})
    r = runner.invoke(cli.app, ["check", "--all", "--specs", str(d), "--receipts", str(tmp_path / "r")])
    assert r.exit_code == 2 and "dependency cycle" in r.output
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").rglob("*.json"))


def test_the_family_depends_on_the_control():
    for key in ("tapo-trajectory", "mrtpo", "tar-adaptive-replay"):
        assert [x.method for x in depends.declared(load_spec(ROOT / "specs" / f"{key}.yaml", ROOT).data)] == ["grpo"]
    assert depends.dependents("grpo", ROOT / "specs", ROOT) == ["mrtpo", "tapo-trajectory", "tar-adaptive-replay"]
    order = [p.stem for p in depends.ordered(sorted((ROOT / "specs").glob("*.yaml")), ROOT)]
    assert order.index("grpo") < min(order.index(k) for k in ("tapo-trajectory", "mrtpo", "tar-adaptive-replay"))


def test_show_names_dependencies_and_dependents():
    j = json.loads(runner.invoke(cli.app, ["show", "tapo-trajectory", "--json"]).stdout)
    assert [x["method"] for x in j["depends_on"]] == ["grpo"] and "control arm" in j["depends_on"][0]["why"]
    g = json.loads(runner.invoke(cli.app, ["show", "grpo", "--json"]).stdout)
    assert g["depends_on"] == [] and g["dependents"] == ["mrtpo", "tapo-trajectory", "tar-adaptive-replay"]
    text = runner.invoke(cli.app, ["show", "tapo-trajectory"]).stdout
    assert "depends on grpo: the mechanism run trains a GRPO control arm" in text


# --- the planted GRPO bugs the control runs close the dependents' gates -----------------------------------------

CONTROL_BUGS = [("grpo.mask_drops_eos", "sampler_mask"), ("grpo.clip_no_upper", "loss_reference"),
                ("grpo.adv_not_std_normalised", "advantages_reference")]


def _gate_json(method: str, store: Path) -> dict:
    out = runner.invoke(cli.app, ["gate", method, "--json", "--receipts", str(store)])
    assert out.exit_code == 1, out.output
    return json.loads(out.stdout)


def test_without_any_grpo_receipt_the_family_gates_stay_closed_on_grpo(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    for method in ("tapo-trajectory", "mrtpo", "tar-adaptive-replay"):
        dep = next(r for r in _gate_json(method, store)["requirements"] if r["id"] == "depends:grpo")
        assert not dep["met"] and "no fresh cpu receipt" in dep["detail"], dep["detail"]
        assert dep["fix"] == {"argv": ["contracts", "check", "grpo", "--device", "cpu", "--receipts", str(store)]}


@pytest.mark.parametrize("mutant, contract", CONTROL_BUGS, ids=[b[0] for b in CONTROL_BUGS])
def test_a_control_bug_fails_check_grpo_and_keeps_the_family_gates_closed(mutant, contract, tmp_path, monkeypatch):
    reg = registry.load()
    entry = next(m for m in reg.mutants.values() if m.name == mutant)
    monkeypatch.setitem(registry._REGISTRY.implementations, "grpo", entry.factory())
    store = tmp_path / "store"
    out = runner.invoke(cli.app, ["check", "grpo", "--device", "cpu", "--seeds", "42", "--only", contract,
                                  "--no-mutants", "--receipts", str(store), "--json"])
    assert out.exit_code == 1, out.output[-2000:]
    (run,) = json.loads(out.stdout)["runs"]
    assert {r["contract"] for r in run["results"] if r["status"] == "failed"} == {contract}
    (receipt,) = store.rglob("*.json")  # it binds the control arm's wrapper: a change there makes it stale
    assert "methods/common/grpo.py" in {x["name"] for x in json.loads(receipt.read_text())["subject"]}
    dep = next(r for r in _gate_json("tapo-trajectory", store)["requirements"] if r["id"] == "depends:grpo")
    # counted (a committed tree) it fails; refused (uncommitted code, as in a working copy) it never counts
    assert not dep["met"] and dep["detail"].startswith("tapo-trajectory's evidence rests on grpo, which ")
