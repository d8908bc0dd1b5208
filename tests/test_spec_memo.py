"""engine/spec/memo.py: a spec's validation remembered in this process, keyed by everything the answer depends on.

Each test counts real validations through a wrapper around `engine.spec.loader.validate_file` installed before
the first call (the memo keys on the validating functions themselves, so the wrapper is part of the key for the
whole test), and checks that an answer from memory equals a fresh one and that every part of the key misses.
The spec is the gate tests' toy (tests/gate_support.py), with its names as the registry: small, so quick to parse.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import engine.spec.loader as loader
from engine.cli import app
from engine.spec import memo, registry
from tests import gate_support as G

NAME = "toy.yaml"


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(registry, "_STATIC", G.TOY_NAMES)
    memo.forget()
    yield
    memo.forget()


@pytest.fixture
def validations(monkeypatch) -> list[str]:
    seen: list[str] = []
    real = loader.validate_file

    def counting(path, root=None, **kw):
        seen.append(Path(path).name)
        return real(path, root, **kw)

    monkeypatch.setattr(loader, "validate_file", counting)
    return seen


def _copy(tmp_path: Path, folder: str = "specs") -> Path:
    specs = tmp_path / folder
    specs.mkdir(exist_ok=True)
    path = specs / NAME
    path.write_text(G.SPEC_TEXT, encoding="utf-8")
    return path


def test_the_same_bytes_are_validated_once_and_answer_what_a_fresh_validation_gives(tmp_path, validations):
    path = _copy(tmp_path)
    first, errors = memo.validate_file(path, tmp_path)
    assert errors == [] and validations == [NAME]
    again, errors = memo.validate_file(path, tmp_path)
    assert errors == [] and validations == [NAME]  # from memory
    fresh, _ = loader.validate_file(path, tmp_path)  # the loader itself, not the memo
    assert len(validations) == 2 and again.data == first.data == fresh.data
    assert (again.path, again.display, again.sha256, again.key) == (first.path, first.display, first.sha256, first.key)
    assert again.doc is None and again.locate(["contracts", 1, "expect", 0]) == first.locate(["contracts", 1, "expect", 0])


def test_a_caller_that_changes_its_answer_changes_no_later_answer(tmp_path, validations):
    path = _copy(tmp_path)
    first, _ = memo.validate_file(path, tmp_path)
    first.data["promotion"]["state"] = "promoted"
    first.data["contracts"].clear()
    second, _ = memo.validate_file(path, tmp_path)
    second.data["title"] = "changed"
    third, _ = memo.validate_file(path, tmp_path)
    assert validations == [NAME]
    assert third.data["promotion"]["state"] == "not-promoted" and third.data["contracts"]
    assert third.data["title"] != "changed"


def test_every_part_of_the_key_misses(tmp_path, validations, monkeypatch):
    path = _copy(tmp_path)
    memo.validate_file(path, tmp_path)
    path.write_bytes(path.read_bytes() + b"# one more byte\n")  # the bytes
    memo.validate_file(path, tmp_path)
    assert len(validations) == 2
    memo.validate_file(path, tmp_path / "specs")  # how it is displayed
    assert len(validations) == 3
    names = registry.known_names()  # the names registered in this process
    monkeypatch.setattr(registry, "_STATIC", registry.StaticNames(
        implementations=names.implementations, checks=names.checks | {"toy.extra_check"}, mutants=names.mutants,
        files=names.files))
    memo.validate_file(path, tmp_path)
    assert len(validations) == 4
    real_validator = loader._validator  # the validating code
    monkeypatch.setattr(loader, "_validator", lambda: real_validator())
    memo.validate_file(path, tmp_path)
    assert len(validations) == 5
    memo.validate_file(path, tmp_path)
    assert len(validations) == 5


def test_a_broken_spec_is_validated_afresh_every_time(tmp_path, validations):
    path = _copy(tmp_path)
    path.write_text(G.SPEC_TEXT.replace("level: L1", "level: L7", 1))
    answers = [memo.validate_file(path, tmp_path) for _ in range(3)]
    assert validations == [NAME] * 3
    assert all(spec is None and [e.line() for e in errs] == [e.line() for e in answers[0][1]] for spec, errs in answers)
    assert answers[0][1][0] is not answers[1][1][0]  # each call raises an error object of its own
    with pytest.raises(loader.SpecError):
        memo.load_spec(path, tmp_path)


def test_what_cannot_be_read_goes_to_the_loader_which_says_why(tmp_path, validations):
    spec, errors = memo.validate_file(tmp_path / "missing.yaml", tmp_path)
    assert spec is None and "file not found" in errors[0].line()
    (tmp_path / "folder.yaml").mkdir()
    spec, errors = memo.validate_file(tmp_path / "folder.yaml", tmp_path)
    assert spec is None and "not a regular file" in errors[0].line()
    assert validations == ["missing.yaml", "folder.yaml"]


def test_memory_is_bounded_and_keeps_the_most_recently_used(tmp_path, validations, monkeypatch):
    monkeypatch.setattr(memo, "MAX_ENTRIES", 2)
    paths = [_copy(tmp_path, f"v{i}") for i in range(3)]  # three places: three keys
    for p in paths[:2]:
        memo.validate_file(p, tmp_path)
    memo.validate_file(paths[0], tmp_path)  # used again: now the most recent
    memo.validate_file(paths[2], tmp_path)  # pushes out v1, the least recently used
    assert len(memo._MEMO) == 2 and len(validations) == 3
    memo.validate_file(paths[0], tmp_path)
    assert len(validations) == 3
    memo.validate_file(paths[1], tmp_path)
    assert validations == [NAME] * 4


def test_gate_twice_in_one_process_validates_once_and_says_the_same(tmp_path, validations):
    store = tmp_path / "receipts"
    store.mkdir()
    specs = tmp_path / "specs"
    _copy(tmp_path)
    argv = ["gate", "toy", "--specs", str(specs), "--receipts", str(store)]
    first = CliRunner().invoke(app, argv)
    second = CliRunner().invoke(app, argv)
    assert validations == [NAME]
    assert (first.exit_code, first.stdout, first.stderr) == (second.exit_code, second.stdout, second.stderr)
    assert first.exit_code == 1  # no receipts: the gate is closed
    (specs / NAME).write_text(G.SPEC_TEXT.replace("level: L1", "level: L7", 1))
    third = CliRunner().invoke(app, argv)
    assert third.exit_code == 2 and validations == [NAME] * 2 and "$.level" in third.stderr
