"""Spec loading and validation: every broken spec gives one line with file:line:col and the JSON path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.spec.loader import validate_file

ROOT = Path(__file__).resolve().parent.parent
GOOD = (ROOT / "specs" / "tapo-trajectory.yaml").read_text(encoding="utf-8")


def _at(section: str, ident: str) -> int:
    """The list index of the entry `ident` in the shipped spec's `section` (contracts, mutants): the spec grows,
    so the tests read where an entry is instead of counting."""
    from ruamel.yaml import YAML

    entries = YAML(typ="safe").load(GOOD)[section]
    (i,) = [i for i, e in enumerate(entries) if e.get("id") == ident]
    return i


def _where(text: str, needle: str, offset: int = 0) -> tuple[int, int]:
    """1-based line and column of `needle` (plus offset) in `text`."""
    i = text.index(needle) + offset
    return text.count("\n", 0, i) + 1, i - (text.rfind("\n", 0, i) + 1) + 1


def _broken(tmp_path: Path, text: str | bytes, name: str = "tapo-trajectory.yaml") -> list:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    spec, errors = validate_file(p)
    assert spec is None and errors, "a broken spec must not validate"
    return errors


def test_the_shipped_spec_is_valid():
    spec, errors = validate_file(ROOT / "specs" / "tapo-trajectory.yaml")
    assert errors == [] and spec.key == "tapo-trajectory"


def test_string_tolerance(tmp_path):
    old = "{metric: max_rel_err, dtype: float64, le: 1.0e-12}"
    text = GOOD.replace(old, old.replace("le: 1.0e-12", 'le: "1.0e-12"'), 1)
    (e,) = _broken(tmp_path, text)
    assert (e.lineno, e.col) == _where(text, '"1.0e-12"')
    assert e.path == "$.contracts[0].expect[0].le"
    assert "string, not a number" in e.line() and "without quotes" in e.line()


def test_unknown_check_name_lists_valid_ones(tmp_path):
    text = GOOD.replace("check: tapo.clip_schedule", "check: tapo.clip_schedul", 1)
    (e,) = _broken(tmp_path, text)
    assert (e.lineno, e.col) == _where(text, "tapo.clip_schedul\n")
    assert e.path == f"$.contracts[{_at('contracts', 'clip_schedule')}].check"
    assert "tapo.clip_schedule" in e.fix  # the valid names are listed
    assert e.fix.startswith("use 'tapo.clip_schedule' (the closest name); valid: ")  # the typo's fix first
    # a name like none of them gets the list alone, no guess
    text = GOOD.replace("check: tapo.clip_schedule", "check: zzz", 1)
    (e,) = _broken(tmp_path, text)
    assert e.fix.startswith("use one of: ") and "closest" not in e.fix


def test_killed_by_naming_no_contract(tmp_path):
    # every mutant that names the contract alone misspells it (mask_by_multiply first)
    text = GOOD.replace("killed_by: [masked_junk_invariance]", "killed_by: [masked_junk_invariants]")
    assert text.count("masked_junk_invariance") == GOOD.count("masked_junk_invariance") - 2
    errors = _broken(tmp_path, text)
    bad = [e for e in errors if "killed_by names no contract" in e.message]
    assert len(bad) == 2
    e = bad[0]
    assert (e.lineno, e.col) == _where(text, "masked_junk_invariants]")
    assert e.path == f"$.mutants[{_at('mutants', 'mask_by_multiply')}].killed_by[0]"
    assert e.fix.startswith("use 'masked_junk_invariance' (the closest name)")
    # And the contract they used to name is now killed by no mutant: also reported, at its id.
    at = f"$.contracts[{_at('contracts', 'masked_junk_invariance')}].id"
    assert any("nothing shows it can fail" in e.message and e.path == at for e in errors)


def test_unknown_top_level_key(tmp_path):
    text = GOOD + "extra_field: 1\n"
    (e,) = _broken(tmp_path, text)
    assert (e.lineno, e.col) == _where(text, "extra_field")
    assert e.path == "$.extra_field" and "unknown key" in e.message and "promotion" in e.fix
    text = GOOD.replace("\nformulas:", "\nformulae:", 1)
    errors = _broken(tmp_path, text)
    (e,) = [e for e in errors if e.path == "$.formulae"]
    assert e.fix.startswith("rename it to 'formulas' (the closest key), or remove it; valid: ")


def test_duplicate_key(tmp_path):
    text = GOOD.replace("level: L1\n", "level: L1\nlevel: L2\n", 1)
    (e,) = _broken(tmp_path, text)
    assert e.lineno == _where(text, "level: L2")[0] and "duplicate" in e.line()


@pytest.mark.parametrize("tag", ["!!python/object:os.system", "!!python/name:os.system", "!custom"])
def test_constructing_tags_are_refused(tmp_path, tag):
    text = GOOD.replace('title: "TAPO', f'title: {tag} "TAPO', 1)
    (e,) = _broken(tmp_path, text)
    assert (e.lineno, e.col) == _where(text, tag) and "not allowed" in e.message


def test_an_explicit_str_tag_is_plain_data(tmp_path):
    # `!!str` only says "this is a string": it builds nothing, so it reads as the string.
    p = tmp_path / "tapo-trajectory.yaml"
    p.write_text(GOOD.replace("level: L1\n", "level: !!str L1\n", 1), encoding="utf-8")
    spec, errors = validate_file(p)
    assert errors == [] and spec.data["level"] == "L1"


@pytest.mark.parametrize("before, after, says", [
    ("level: L1\n", "level: !!str [L1]\n", "does not fit a list"),
    ("level: L1\n", "level: !!seq L1\n", "does not fit a scalar"),
    ("level: L1\n", "!!str level: L1\n", "does not fit a mapping key"),
])
def test_a_core_tag_that_does_not_fit_its_node_is_refused(tmp_path, before, after, says):
    text = GOOD.replace(before, after, 1)
    (e,) = _broken(tmp_path, text)
    assert e.lineno == _where(text, after)[0] and says in e.message and "Traceback" not in e.line()


def test_anchors_and_aliases_are_refused(tmp_path):
    text = GOOD.replace("level: L1\n", "level: &lvl L1\n", 1)
    (e,) = _broken(tmp_path, text)
    assert e.lineno == _where(text, "&lvl")[0] and "anchors and aliases" in e.message


def test_missing_required_key_points_at_its_mapping(tmp_path):
    start = GOOD.index("  - id: clip_schedule")
    cut = GOOD.index("    cases: 1\n", start)
    text = GOOD[:cut] + GOOD[cut + len("    cases: 1\n"):]
    (e,) = _broken(tmp_path, text)
    assert e.path == f"$.contracts[{_at('contracts', 'clip_schedule')}]" and "'cases' is a required property" in e.message
    assert (e.lineno, e.col) == _where(text, "id: clip_schedule")


def test_not_utf8(tmp_path):
    raw = GOOD.encode("utf-8").replace(b"Tsinghua", b"Ts\xffinghua", 1)
    (e,) = _broken(tmp_path, raw)
    line = raw[: raw.index(b"\xff")].count(b"\n") + 1
    assert e.lineno == line and "UTF-8" in e.message


@pytest.mark.parametrize("char", ["\x07", "\x1b", "\x7f", "\ufffe"])
def test_a_character_yaml_refuses_is_one_line_at_its_field(tmp_path, char):
    # ruamel's reader refuses these before it parses anything; that was an internal error, exit 3
    text = GOOD.replace("Tsinghua", f"Ts{char}inghua", 1)
    (e,) = _broken(tmp_path, text)
    assert (e.lineno, e.col) == _where(text, char) and e.path == "$.paper.institution"
    assert ascii(char)[1:-1] in e.message and "printable" in e.fix and "\n" not in e.line()


def test_nesting_past_the_limit_is_refused_before_anything_is_built(tmp_path):
    # both readers stop at the first level past the limit: 10,000 levels never reach a recursive composer
    text = GOOD.replace("level: L1\n", "level: " + "[" * 10_000 + "]" * 10_000 + "\n", 1)
    (e,) = _broken(tmp_path, text)
    assert e.lineno == _where(text, "level: [")[0] and "deeper than 32" in e.message


def test_method_key_must_match_file_name(tmp_path):
    (e,) = _broken(tmp_path, GOOD, name="other-name.yaml")
    assert e.path == "$.method" and "other-name" in e.message


def test_unknown_dtype_and_nan_tolerance(tmp_path):
    text = GOOD.replace("dtypes: [float64, float32]", "dtypes: [float64, float8]", 1)
    errors = _broken(tmp_path, text)
    assert any(e.path.endswith(".dtypes[1]") for e in errors)
    text = GOOD.replace("dtypes: [float64, float32]", "dtypes: [float64, flaot32]", 1)
    (e,) = [e for e in _broken(tmp_path, text) if e.path.endswith(".dtypes[1]")]
    assert e.fix.startswith('use "float32" (the closest value); valid: ')
    text = GOOD.replace("{metric: max_rel_err, dtype: float64, le: 1.0e-12}",
                        "{metric: max_rel_err, dtype: float64, le: .nan}", 1)
    errors = _broken(tmp_path, text)
    assert errors[0].path == "$.contracts[0].expect[0].le" and "non-finite" in errors[0].message


def test_two_comparisons_in_one_expectation(tmp_path):
    text = GOOD.replace("{metric: max_rel_err, dtype: float64, le: 1.0e-12}",
                        "{metric: max_rel_err, dtype: float64, le: 1.0e-12, ge: 0}", 1)
    (e,) = _broken(tmp_path, text)
    assert e.path == "$.contracts[0].expect[0]" and "exactly one comparison" in e.message


def test_every_error_is_one_line(tmp_path):
    text = GOOD.replace("level: L1", "level: L9").replace("check: tapo.mechanism", "check: nope")
    for e in _broken(tmp_path, text):
        assert "\n" not in e.line()
        assert e.line().startswith(f"{tmp_path.name}/tapo-trajectory.yaml:") or ":" in e.line().split(" ")[0]


def test_static_and_runtime_registries_agree():
    """Read-only commands trust the ast scan; it must see exactly what the decorators register."""
    from engine.spec import registry

    static = registry.static_names()
    runtime = registry.load()

    def ours(fn) -> bool:  # what methods/ registers; other tests register toys of their own in this process
        return (getattr(fn, "__module__", "") or "").startswith("methods.")

    assert set(static.checks) == {k for k, fn in runtime.checks.items() if ours(fn)}
    assert dict(static.mutants) == {k: v.base for k, v in runtime.mutants.items() if ours(v.factory)}
    assert {k: tuple(v) for k, v in static.implementations.items()} == {
        k: v.functions for k, v in runtime.implementations.items()
        if all(ours(getattr(v, f)) for f in v.functions)}


def test_lookup_failures_list_the_valid_names():
    from engine.spec import registry
    from engine.errors import LookupFailure

    reg = registry.load()
    with pytest.raises(LookupFailure, match="tapo.mechanism"):
        reg.get_check("tapo.mechanisms")
    with pytest.raises(LookupFailure, match="valid mutants: .*tapo.clip_reversed"):
        reg.get_mutant("nope")
    with pytest.raises(LookupFailure, match="tapo"):
        reg.get_implementation("tap")
    with pytest.raises(LookupFailure, match="trajectory_ratio"):
        reg.get_implementation("tapo").replace("x", no_such_function=lambda: None)


def test_validate_never_imports_torch():
    code = ("import sys; from engine.cli import app; from typer.testing import CliRunner; "
            "r = CliRunner().invoke(app, ['validate']); "
            "assert r.exit_code == 0, r.output; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
