"""The fast spec reader (engine/spec/fastyaml.py) against the reference reader (`loader.read_document`).

Its one promise: an answer other than None is exactly the data the reference
reader gives, types included (1 is not 1.0 is not True); everything it is not
sure of is None, and then validation words and locates the problem as it always
did. Checked on the shipped specs, on each construct it must decline, and on
the fuzz suite's mutated texts and data.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from engine.spec import fastyaml, loader
from engine.errors import SpecError
from tests.fuzz_support import profile
from tests.test_fuzz_specs import BASE_TEXT, data_mutation, emit, text_mutation

ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((ROOT / "specs").glob("*.yaml"))

pytestmark = pytest.mark.skipif(not fastyaml.available(), reason="PyYAML has no libyaml here: every spec reads slow")


def same(a, b) -> bool:
    """Equal values of the same types all the way down (== alone takes True for 1 and 1 for 1.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def reference(text: str, doc: bool = False):
    try:
        got = loader.read_document(Path("x.yaml"), "x.yaml", raw=text.encode("utf-8"))
    except SpecError:
        return None
    return got[:2] if doc else got[0]


def same_positions(fast, ref, path=()) -> None:
    """Every position `loader.locate` can read (a collection's own, each key's and value's, each item's) is
    ruamel's, all the way down."""
    if isinstance(ref, dict):
        assert (fast.lc.line, fast.lc.col) == (ref.lc.line, ref.lc.col), path
        assert list(fast) == list(ref), path
        for k in ref:
            assert (fast.lc.key(k), fast.lc.value(k)) == (tuple(ref.lc.key(k)), tuple(ref.lc.value(k))), path + (k,)
            same_positions(fast[k], ref[k], path + (k,))
    elif isinstance(ref, list):
        assert (fast.lc.line, fast.lc.col) == (ref.lc.line, ref.lc.col) and len(fast) == len(ref), path
        for i, item in enumerate(ref):
            assert fast.lc.item(i) == tuple(ref.lc.item(i)), path + (i,)
            same_positions(fast[i], item, path + (i,))
    else:
        assert fast is None, path


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.name)
def test_the_shipped_specs_read_fast_to_the_reference_data(path):
    text = path.read_text(encoding="utf-8")
    fast = fastyaml.plain_data(text, loader.MAX_DEPTH)
    assert fast is not None, "a shipped spec must take the fast way"
    assert same(fast, reference(text))
    data, positions = fastyaml.located(text, loader.MAX_DEPTH)
    ref_data, ref_doc = reference(text, doc=True)
    assert same(data, ref_data)
    same_positions(positions, ref_doc)


def test_a_valid_spec_is_validated_without_the_reference_reader(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("read_document ran for a valid spec")

    monkeypatch.setattr(loader, "read_document", refuse)
    spec, errors = loader.validate_file(SPECS[0], ROOT)
    assert errors == [] and spec.doc is None


BASE = "spec_version: 1\nmethod: m\nlist:\n  - a\n  - 2\nmap: {x: 1.5, y: null}\n"
DECLINED = {
    "directive": "%YAML 1.1\n---\n" + BASE,
    "anchor_alias": BASE + "a: &A 1\nb: *A\n",
    "core_tag": BASE + "a: !!str 12\n",
    "local_tag": BASE + "a: !x 12\n",
    "merge_key": BASE + "base: {a: 1}\nm: {<<: {a: 2}}\n",
    "duplicate_key": BASE + "method: n\n",
    "int_key": BASE + "1: a\n",
    "null_key": BASE + "null: a\n",
    "bool_key": BASE + "true: a\n",
    "complex_key": BASE + "? [a, b]\n: 1\n",
    "too_deep": BASE + "deep: " + "[" * 33 + "]" * 33 + "\n",
    "two_documents": BASE + "---\na: 1\n",
    "top_level_list": "- 1\n- 2\n",
    "empty": "",
    "timestamp": BASE + "when: 2026-10-09\n",
    "hex": BASE + "n: 0x1F\n",
    "octal": BASE + "n: 0o17\n",
    "leading_zero": BASE + "n: 017\n",
    "underscore": BASE + "n: 1_000\n",
    "inf": BASE + "n: .inf\n",
    "nan": BASE + "n: .nan\n",
    "float_overflow": BASE + "n: 1e400\n",
    "huge_int": BASE + "n: " + "9" * 302 + "\n",
    "int_just_past_the_bound": BASE + "n: 1" + "0" * 299 + "1\n",  # 10**300 + 1: the reference reader refuses it
    "int_just_below_the_bound": BASE + "n: " + "9" * 300 + "\n",  # taken, and checked below
    "yes_is_a_string_only_in_1_2": BASE + "flag: yes\n",  # plain str here: taken, and checked below
    "syntax_error": BASE + "a: [1, 2\n",
    "control_character": BASE + "a: b\x07c\n",
    "tab_in_a_plain_scalar": BASE + "a: x\ty\n",  # libyaml takes it, ruamel refuses it
    "tab_as_a_separator": BASE + "a:\t1\n",
    "next_line": BASE + "a: x\x85y\n",
    "line_separator": BASE + "a: x\u2028y\n",
    "carriage_return": BASE.replace("\n", "\r\n"),
    "byte_order_mark": "\ufeff" + BASE,
}
TAKEN = {"yes_is_a_string_only_in_1_2", "int_just_below_the_bound"}


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_what_it_is_not_sure_of_is_declined_and_validation_says_the_same(tmp_path, monkeypatch, name):
    text = DECLINED[name]
    fast = fastyaml.plain_data(text, loader.MAX_DEPTH)
    if name in TAKEN:
        assert same(fast, reference(text))
    else:
        assert fast is None
    path = tmp_path / "m.yaml"
    path.write_text(text, encoding="utf-8")
    with_fast = loader.validate_file(path, tmp_path)
    monkeypatch.setitem(fastyaml._STATE, "parts", None)
    without = loader.validate_file(path, tmp_path)
    assert [e.line() for e in with_fast[1]] == [e.line() for e in without[1]]


def _check(text: str) -> None:
    fast = fastyaml.plain_data(text, loader.MAX_DEPTH)
    note(f"fast: {'declined' if fast is None else 'taken'}")
    got = fastyaml.located(text, loader.MAX_DEPTH)
    assert (got is None) == (fast is None), "located and plain_data must take and decline the same texts"
    if fast is not None:
        ref = reference(text, doc=True)
        assert ref is not None, "taken by the fast reader, refused by the reference reader"
        assert same(fast, ref[0]) and same(got[0], ref[0])
        same_positions(got[1], ref[1])


@profile(120)
@given(text_mutation())
def test_a_mutated_text_is_declined_or_read_to_the_reference_data(mutation):
    _, raw, _ = mutation
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return  # refused before either reader runs
    _check(text)


@profile(80)
@given(data_mutation(), st.sampled_from(["", "\n# a comment\n", "\r\n"]))
def test_mutated_data_is_declined_or_read_to_the_reference_data(mutation, extra):
    _, data, _ = mutation
    text = emit(data).text
    _check(text.replace("\n", "\r\n") if extra == "\r\n" else text + extra)


@profile(60)
@given(data_mutation())
def test_an_invalid_spec_read_fast_gets_the_reference_readers_error_lines(tmp_path_factory, mutation):
    """A spec in the plain subset with a schema or reference error is located from libyaml's positions, never
    read again by ruamel: every error line (file, line, column, path, message, fix) is the reference reader's."""
    _, data, _ = mutation
    folder = tmp_path_factory.mktemp("m")
    path = folder / "mini.yaml"
    path.write_text(emit(data).text, encoding="utf-8")
    fast = loader.validate_file(path, folder)
    original = fastyaml._STATE.get("parts")
    fastyaml._STATE["parts"] = None  # no libyaml: the reference reader reads and locates it all
    try:
        slow = loader.validate_file(path, folder)
    finally:
        fastyaml._STATE["parts"] = original
    assert [e.line() for e in fast[1]] == [e.line() for e in slow[1]]
    assert (fast[0] is None) == (slow[0] is None)


def test_an_error_in_a_spec_read_fast_is_located_without_the_reference_reader(tmp_path, monkeypatch):
    text = BASE_TEXT.replace("spec_version: 1", "spec_version: 7", 1)
    assert text != BASE_TEXT and fastyaml.plain_data(text, loader.MAX_DEPTH) is not None
    path = tmp_path / "mini.yaml"
    path.write_text(text, encoding="utf-8")

    def refuse(*a, **k):
        raise AssertionError("read_document ran for a spec in the plain subset")

    monkeypatch.setattr(loader, "read_document", refuse)
    _, errors = loader.validate_file(path, tmp_path)
    (line, col) = next((i + 1, ln.index("7") + 1) for i, ln in enumerate(text.splitlines())
                       if ln.startswith("spec_version"))
    assert [(e.lineno, e.col, e.path) for e in errors] == [(line, col, "$.spec_version")], errors


# What YAML treats specially, and what YAML 1.1 (libyaml) and 1.2 (ruamel) tell apart.
SNIPPETS = ["\t", " ", "  ", "\n", "\r\n", "\r", "#", ":", ": ", "- ", "-", "'", '"', "\\", "[", "]", "{", "}",
            ",", "|", ">", "|-", ">+", "?", "? ", "!", "&a ", "*a", "%", "@", "`", "\x85", "\u2028", "\u2029",
            "\ufeff", "\u00a0", "\u00e9", "0x1", "0o7", "07", ".5", "e5", "1_0", "~", "null", "yes", "on", "1e3",
            "-.inf", ".NaN", "2026-01-01", "<<: ", "---\n", "...\n", "%YAML 1.1\n"]


@profile(300)
@given(st.lists(st.tuples(st.integers(0, len(BASE_TEXT)), st.sampled_from(SNIPPETS)), min_size=1, max_size=3))
def test_special_characters_anywhere_are_declined_or_read_to_the_reference_data(edits):
    text = BASE_TEXT
    for at, snippet in sorted(edits, reverse=True):
        text = text[:at] + snippet + text[at:]
    _check(text)
