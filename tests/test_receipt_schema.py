"""The receipt schema check: the compiled fast path gives jsonschema's verdicts, and the same words.

`engine.store.receipts.schema_problems` asks fastjsonschema (draft 7, compiled once)
first and returns [] when it accepts; anything else goes to jsonschema (Draft
2020-12), which decides and words the problems. So the fast path must never
accept what jsonschema rejects. These tests hold it to exact agreement on every
committed receipt, on synthetic receipts, and on a few hundred mutations of
real ones (hypothesis; derandomized in CI, see tests/conftest.py), and show that
the dialect guard (`dialect_problems`) stops a schema that would break that.

`old_validator()` is the jsonschema path as it was before the fast path: the
same schema with `oneOf` for the four alternatives that are now `anyOf`, null
branches first. Its problem lines must equal `schema_problems`' exactly.
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from pathlib import Path

import fastjsonschema
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from engine.store import receipts as R
from tests.fuzz_support import profile

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted((ROOT / "receipts").glob("*/*.json"))



def _as_before(node):
    """The schema as published before the fast path: `oneOf` where it now says `anyOf`, null branches first."""
    if isinstance(node, dict):
        out = {("oneOf" if k == "anyOf" else k): _as_before(v) for k, v in node.items()}
        if "oneOf" in out:
            out["oneOf"] = sorted(out["oneOf"], key=lambda b: b.get("type") != "null")
        return out
    if isinstance(node, list):
        return [_as_before(v) for v in node]
    return node


JS = Draft202012Validator(R.receipt_schema())
OLD = Draft202012Validator(_as_before(R.receipt_schema()))


def fast_accepts(data) -> bool:
    fast = R._fast_validator()
    assert fast is not None, "the fast path is off: see dialect_problems(receipt_schema())"
    try:
        fast(data)
    except Exception:
        return False
    return True


def assert_same(data) -> bool:
    """Fast and jsonschema verdicts agree, and `schema_problems` words it as the old path did; returns valid."""
    valid = JS.is_valid(data)
    assert fast_accepts(data) == valid, f"fastjsonschema says {'in' * valid}valid, jsonschema {'in' * (not valid)}valid"
    got = R.schema_problems(data)
    # problem_lines walks every error before it sorts them, so it is empty exactly when the old validator
    # accepts: these two lines also say that the old validator's verdict is jsonschema's (no is_valid pass)
    assert got == R.problem_lines(OLD, data)
    assert (got == []) == valid
    return valid


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _trimmed(data: dict) -> dict:
    """A real receipt cut to a few entries of each list: every shape kept, cheap enough to mutate hundreds of times."""
    d = copy.deepcopy(data)
    p = d["predicate"]
    p["results"] = p["results"][:3] + [r for r in p["results"] if r.get("message") is not None][:1]
    p["mutants"] = p["mutants"][:2]
    for m in p["mutants"]:
        if isinstance(m.get("results"), list):
            m["results"] = m["results"][:1]
    p["mechanism"] = p["mechanism"][:1]
    for m in p["mechanism"]:
        m["steps"] = m["steps"][:2]
    d["subject"] = d["subject"][:3] + d["subject"][-1:]
    return d


def _bases() -> list[dict]:
    by_method = {}
    for path in COMMITTED:  # the first receipt of each method
        by_method.setdefault(path.parent.name, _trimmed(_load(path)))
    return [by_method[k] for k in sorted(by_method)]


BASES = _bases()


# --- the shipped schema is inside what the guard vouches for ------------------------------------------


def test_the_shipped_schema_passes_the_dialect_guard_and_the_fast_path_is_on():
    assert R.dialect_problems(R.receipt_schema()) == []
    assert R._fast_validator() is not None


def test_anyof_branches_are_disjoint_so_anyof_means_oneof():
    """No JSON value has two JSON types, so branches that accept disjoint sets of types never both match."""
    schema = R.receipt_schema()
    assert Draft202012Validator.TYPE_CHECKER.is_type(True, "number") is False  # jsonschema: a bool is no number

    def types(branch: dict) -> set[str]:
        if "$ref" in branch:
            return types(schema["$defs"][branch["$ref"].rsplit("/", 1)[1]])
        if "type" in branch:
            ts = branch["type"] if isinstance(branch["type"], list) else [branch["type"]]
            return {"number" if t == "integer" else t for t in ts}
        if "enum" in branch or "const" in branch:
            vals = branch.get("enum", [branch.get("const")])
            kind = {str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
            return {kind.get(type(v), "?") for v in vals}
        if "anyOf" in branch or "oneOf" in branch:
            return set().union(*(types(b) for b in branch.get("anyOf", branch.get("oneOf"))))
        pytest.fail(f"cannot tell which types {branch} accepts")

    found = []

    def walk(node):
        if isinstance(node, dict):
            for key in ("anyOf", "oneOf"):
                if key in node:
                    sets = [types(b) for b in node[key]]
                    found.append(sets)
                    for i, a in enumerate(sets):
                        for b in sets[i + 1:]:
                            assert not a & b, f"{node[key]}: two branches accept {a & b}"
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    assert len(found) == 5 and {"number", "boolean", "string"} in [set().union(*s) for s in found]


# --- the guard: a schema whose meaning would differ in draft 7 turns the fast path off ----------------


def _with(schema: dict, at: list, **kw) -> dict:
    node = schema
    for k in at:
        node = node[k]
    node.update(kw)
    return schema


def _pred_props(s):
    return s["properties"]["predicate"]["properties"]


BROKEN = {
    # 2020-12 applies a $ref's siblings, draft 7 ignores them.
    "$ref with a sibling": (lambda s: _with(s, ["properties", "predicate", "properties", "receipt_id"], maxLength=10),
                            "$ref with sibling"),
    # 2020-12 only: draft 7 ignores it.
    "dependentRequired": (lambda s: _with(s, ["properties", "predicate"], dependentRequired={"status": ["nowhere"]}),
                          "'dependentRequired'"),
    "unevaluatedProperties": (lambda s: _with(s, ["properties", "predicate"], unevaluatedProperties=False),
                              "'unevaluatedProperties'"),
    "prefixItems": (lambda s: _with(s, ["properties", "subject"], prefixItems=[{"type": "string"}]), "'prefixItems'"),
    # An annotation in 2020-12 (jsonschema does not check it), an assertion in fastjsonschema.
    "format": (lambda s: _with(s, ["$defs", "key"], format="ipv4"), "'format'"),
    "items as an array": (lambda s: _with(s, ["properties", "subject"], items=[{"type": "object"}]), "not an object"),
    "a numeric enum": (lambda s: _with(s, ["$defs", "dtype"], enum=["float32", 1]), "values other than strings"),
    "a $ in a character class": (lambda s: _with(s, ["$defs", "key"], pattern="^[a-z$]+$"), "character class"),
    "inline flags": (lambda s: _with(s, ["$defs", "key"], pattern="(?m)^[a-z]+$"), "inline flags"),
    "$defs below the root": (lambda s: _with(s, ["$defs", "key"], **{"$defs": {}}), "below the root"),
    "a remote $ref": (lambda s: _with(s, ["properties", "predicate", "properties", "method"],
                                      **{"$ref": "https://example.org/key.json"}), "is not '#/$defs/<name>'"),
    "draft-7 definitions": (lambda s: dict(s, definitions={}), "'definitions'"),
    "a default": (lambda s: _with(s, ["$defs", "key"], default="x"), "'default'"),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_the_guard_refuses_a_schema_draft_7_would_read_differently(name):
    breaker, expect = BROKEN[name]
    broken = breaker(R.receipt_schema())
    problems = R.dialect_problems(broken)
    assert any(expect in p for p in problems), problems
    assert R.compile_fast(broken) is None


@pytest.mark.parametrize("name, instance_edit", [
    ("$ref with a sibling", lambda d: None),  # every receipt id is longer than 10 characters
    ("dependentRequired", lambda d: None),
    ("unevaluatedProperties", lambda d: d["predicate"].update(extra=1)),
])
def test_without_the_guard_fastjsonschema_would_pass_what_jsonschema_rejects(name, instance_edit):
    """Why the guard exists: on these schemas draft 7 says valid where 2020-12 says invalid."""
    broken = BROKEN[name][0](R.receipt_schema())
    data = copy.deepcopy(BASES[0])
    instance_edit(data)
    assert not Draft202012Validator(broken).is_valid(data)
    fastjsonschema.compile(R.draft7_copy(broken), use_default=False)(data)  # raises nothing: "valid"


def test_dollar_means_what_python_means_by_it():
    """fastjsonschema turns `$` into `\\Z`; in the path pattern's look-ahead that would let 'a/..<newline>' through."""
    pattern = R.receipt_schema()["$defs"]["relpath"]["pattern"]
    plain = {"type": "string", "pattern": pattern, "$schema": "http://json-schema.org/draft-07/schema#"}
    naive = fastjsonschema.compile(plain)
    naive("a/..\n")  # accepted as it comes
    assert not Draft202012Validator({"type": "string", "pattern": pattern}).is_valid("a/..\n")
    rewritten = fastjsonschema.compile(R.draft7_copy(plain))
    with pytest.raises(fastjsonschema.JsonSchemaException):
        rewritten("a/..\n")
    for ok in ("ok\n", "a/b", "a/..b"):  # `$` also matches before a final newline: valid to both
        rewritten(ok)
        assert Draft202012Validator({"type": "string", "pattern": pattern}).is_valid(ok)


@pytest.mark.parametrize("pattern, anchors", [
    ("^a$", [2]), (r"^a\$$", [4]), (r"[\]$]", None), ("[$]", None), ("[]$]", None), ("[^]$]", None),
    (r"^[^\\]+$", [7]), (r"(/|$)", [3]), (r"\\$", [2]),
])
def test_dollar_anchors_are_told_from_literals(pattern, anchors):
    assert R._pattern_dollars(pattern) == anchors


# --- exact agreement on real, synthetic and mutated receipts -----------------------------------------


def test_every_committed_receipt_gets_the_same_verdict():
    assert COMMITTED
    for path in COMMITTED:
        assert assert_same(_load(path)), path


def test_synthetic_store_receipts_get_the_same_verdict(tmp_path, monkeypatch):
    from benchmarks.synthetic_store import build_fixture_store, demo_static_names, subject_for, write_many
    from engine.spec import registry
    from engine.spec.loader import load_spec

    monkeypatch.setattr(registry, "_STATIC", demo_static_names())
    root = tmp_path / "proj"
    store = build_fixture_store(root)
    spec = load_spec(store["specs"] / "demo-method.yaml", root).data
    write_many(store["receipts"], [spec], 30, {"demo-method": [subject_for(root, "demo-method")]}, seed=7)
    checked = 0
    for path in sorted(store["receipts"].rglob("*.json")):
        try:
            data = R.load_receipt(path)
        except ValueError:
            continue  # the fixture's truncated receipt
        assert assert_same(data), path  # the tampered one too: edited, but still the receipt's shape
        checked += 1
    assert checked >= 35


def _at(doc, path):
    for k in path:
        doc = doc[k]
    return doc


def _set(doc, path, value):
    _at(doc, path[:-1])[path[-1]] = value


def _del(doc, path):
    del _at(doc, path[:-1])[path[-1]]


HEX = "0123456789abcdef" * 4
TARGETED = [
    # (what, edit, valid to jsonschema)
    ("no _type", lambda d: _del(d, ["_type"]), False),
    ("wrong _type const", lambda d: _set(d, ["_type"], "https://in-toto.io/Statement/v0.1"), False),
    ("wrong predicateType", lambda d: _set(d, ["predicateType"], 1), False),
    ("wrong predicate.schema", lambda d: _set(d, ["predicate", "schema"], "paper-contracts/receipt/v2"), False),
    ("no receipt_id", lambda d: _del(d, ["predicate", "receipt_id"]), False),
    ("no status", lambda d: _del(d, ["predicate", "status"]), False),
    ("no subject digest", lambda d: _del(d, ["subject", 0, "digest", "sha256"]), False),
    ("no measurements", lambda d: _del(d, ["predicate", "results", 0, "measurements"]), False),
    ("unknown key at the root", lambda d: _set(d, ["extra"], 1), False),
    ("unknown key in a subject", lambda d: _set(d, ["subject", 0, "size"], 1), False),
    ("unknown key in a digest", lambda d: _set(d, ["subject", 0, "digest", "sha1"], "0" * 40), False),
    ("unknown key in the predicate", lambda d: _set(d, ["predicate", "extra"], 1), True),
    ("no subject", lambda d: _set(d, ["subject"], []), False),
    ("commit in capitals", lambda d: _set(d, ["predicate", "git", "commit"], HEX[:40].upper()), False),
    ("commit of 39", lambda d: _set(d, ["predicate", "git", "commit"], HEX[:39]), False),
    ("commit of 64", lambda d: _set(d, ["predicate", "git", "commit"], HEX), True),
    ("commit + newline", lambda d: _set(d, ["predicate", "git", "commit"], HEX[:40] + "\n"), True),
    ("commit + 2 newlines", lambda d: _set(d, ["predicate", "git", "commit"], HEX[:40] + "\n\n"), False),
    ("git null", lambda d: _set(d, ["predicate", "git"], None), True),
    ("no git", lambda d: _del(d, ["predicate", "git"]), True),
    ("git dirty 1", lambda d: _set(d, ["predicate", "git", "dirty"], 1), False),
    ("git a list", lambda d: _set(d, ["predicate", "git"], []), False),
    ("receipt id of 63", lambda d: _set(d, ["predicate", "receipt_id"], HEX[:63]), False),
    ("receipt id not hex", lambda d: _set(d, ["predicate", "receipt_id"], "g" * 64), False),
    ("receipt id + newline", lambda d: _set(d, ["predicate", "receipt_id"], HEX + "\n"), True),
    ("receipt id + x", lambda d: _set(d, ["predicate", "receipt_id"], HEX + "x"), False),
    ("absolute subject", lambda d: _set(d, ["subject", 0, "name"], "/etc/passwd"), False),
    ("drive subject", lambda d: _set(d, ["subject", 0, "name"], "C:/x.py"), False),
    ("climbing subject", lambda d: _set(d, ["subject", 0, "name"], "a/../../b"), False),
    ("climbing subject + newline", lambda d: _set(d, ["subject", 0, "name"], "a/..\n"), False),
    ("subject + newline", lambda d: _set(d, ["subject", 0, "name"], "engine/x.py\n"), True),
    ("backslash subject", lambda d: _set(d, ["subject", 0, "name"], "engine\\x.py"), False),
    ("empty subject", lambda d: _set(d, ["subject", 0, "name"], ""), False),
    ("dots in a name", lambda d: _set(d, ["subject", 0, "name"], "a/..b/c"), True),
    ("measurement true", lambda d: _set(d, ["predicate", "results", 0, "measurements", "m"], True), True),
    ("measurement 0", lambda d: _set(d, ["predicate", "results", 0, "measurements", "m"], 0), True),
    ("measurement NaN text", lambda d: _set(d, ["predicate", "results", 0, "measurements", "m"], "NaN"), True),
    ("measurement -Infinity", lambda d: _set(d, ["predicate", "results", 0, "measurements", "m"], "-Infinity"), True),
    ("measurement nan text", lambda d: _set(d, ["predicate", "results", 0, "measurements", "m"], "nan"), False),
    ("measurement NaN + newline",
     lambda d: _set(d, ["predicate", "results", 0, "measurements", "m"], "NaN\n"), False),
    ("measurement null", lambda d: _set(d, ["predicate", "results", 0, "measurements", "m"], None), False),
    ("measurement float nan", lambda d: _set(d, ["predicate", "results", 0, "measurements", "m"], float("nan")), True),
    ("measurement list", lambda d: _set(d, ["predicate", "results", 0, "measurements", "m"], [1]), False),
    ("margin null", lambda d: _set(d, ["predicate", "results", 0, "expectations", 0, "margin"], None), True),
    ("margin Infinity", lambda d: _set(d, ["predicate", "results", 0, "expectations", 0, "margin"], "Infinity"), True),
    ("margin false", lambda d: _set(d, ["predicate", "results", 0, "expectations", 0, "margin"], False), True),
    ("margin text", lambda d: _set(d, ["predicate", "results", 0, "expectations", 0, "margin"], "0.1"), False),
    ("headroom null", lambda d: _set(d, ["predicate", "results", 0, "expectations", 0, "headroom"], None), True),
    ("headroom Infinity",
     lambda d: _set(d, ["predicate", "results", 0, "expectations", 0, "headroom"], "Infinity"), True),
    ("headroom negative", lambda d: _set(d, ["predicate", "results", 0, "expectations", 0, "headroom"], -1.0), False),
    ("headroom NaN", lambda d: _set(d, ["predicate", "results", 0, "expectations", 0, "headroom"], "NaN"), False),
    ("passed as 1", lambda d: _set(d, ["predicate", "results", 0, "expectations", 0, "passed"], 1), False),
    ("seed 1.0", lambda d: _set(d, ["predicate", "results", 0, "seed"], 1.0), True),
    ("seed 1.5", lambda d: _set(d, ["predicate", "results", 0, "seed"], 1.5), False),
    ("seed -1", lambda d: _set(d, ["predicate", "results", 0, "seed"], -1), False),
    ("seed true", lambda d: _set(d, ["predicate", "results", 0, "seed"], True), False),
    ("seed huge", lambda d: _set(d, ["predicate", "request", "seeds"], [2 ** 80]), True),
    ("request seed text", lambda d: _set(d, ["predicate", "request", "seeds"], ["42"]), False),
    ("only a list", lambda d: _set(d, ["predicate", "request", "only"], ["c"]), True),
    ("only a text", lambda d: _set(d, ["predicate", "request", "only"], "c"), False),
    ("dtype float8", lambda d: _set(d, ["predicate", "results", 0, "dtype"], "float8"), False),
    ("result status skipped", lambda d: _set(d, ["predicate", "results", 0, "status"], "skipped"), False),
    ("message 3", lambda d: _set(d, ["predicate", "results", 0, "message"], 3), False),
    ("message null", lambda d: _set(d, ["predicate", "results", 0, "message"], None), True),
    ("created_at with a space", lambda d: _set(d, ["predicate", "created_at"], "2026-01-01 00:00:00Z"), False),
    ("created_at no fraction", lambda d: _set(d, ["predicate", "created_at"], "2026-01-01T00:00:00Z"), True),
    ("spec name in capitals", lambda d: _set(d, ["predicate", "spec", "name"], "specs/X.yaml"), False),
    ("review WIP", lambda d: _set(d, ["predicate", "spec", "review"], "WIP"), False),
    ("device tpu", lambda d: _set(d, ["predicate", "environment", "device", "kind"], "tpu"), False),
    ("results an object", lambda d: _set(d, ["predicate", "results"], {}), False),
    ("proven ids numbers", lambda d: _set(d, ["predicate", "contracts_proven"], {"c": [1]}), False),
    ("mutant killed 0", lambda d: _set(d, ["predicate", "mutants", 0, "killed"], 0), False),
    ("comparison values text",
     lambda d: _set(d, ["predicate", "mechanism", 0, "comparisons", 0, "method_values"], ["x"]), False),
    ("summary anything", lambda d: _set(d, ["predicate", "summary"], {"x": [None, {"y": "z"}]}), True),
    ("summary a list", lambda d: _set(d, ["predicate", "summary"], []), False),
    ("method key in capitals", lambda d: _set(d, ["predicate", "method"], "TAPO"), False),
]


@pytest.mark.parametrize("what, edit, valid", TARGETED, ids=[t[0] for t in TARGETED])
def test_targeted_mutations(what, edit, valid):
    applied = 0
    for base in BASES:
        data = copy.deepcopy(base)
        try:
            edit(data)
        except (KeyError, IndexError):
            continue  # this method's receipts have no such entry (only TAPO's mechanism has comparisons)
        assert JS.is_valid(data) == valid, what  # the case tests what it says
        assert assert_same(data) == valid
        applied += 1
    assert applied


def test_the_agreement_check_catches_a_fast_path_that_passes_too_much(monkeypatch):
    """If the fast path accepted a receipt jsonschema rejects, these tests would say so."""
    monkeypatch.setattr(R, "_FAST_VALIDATOR", lambda data: data)  # accepts anything
    data = copy.deepcopy(BASES[0])
    _set(data, ["predicate", "receipt_id"], "g" * 64)
    with pytest.raises(AssertionError):
        assert_same(data)
    assert R.schema_problems(data) == []  # what such a fast path would hide


# A value of every JSON type, and strings near the schema's patterns and enums.
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2 ** 70), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "nan", "inf", "", "passed", "failed", "cpu", "cuda",
                     "float32", "TODO", "DONE", "promoted", "le", "https://in-toto.io/Statement/v1",
                     "paper-contracts/receipt/v1", HEX, HEX[:40], HEX + "\n", "specs/a.yaml", "a-b",
                     "2026-01-01T00:00:00Z", "2026-01-01T00:00:00.5Z\n", "engine/a.py", "../a", "/a"]),
    st.text(max_size=6), st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                  st.integers(), max_size=2),
)


def _paths(doc, prefix=()):
    """Every (container path, key) in a document, the root's keys included."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def _string_edits(s: str) -> list[str]:
    return [s + "\n", s + "\n\n", s + "x", s[:-1], s.upper(), "/" + s, s + "/..", "../" + s, "C:" + s,
            s.replace("/", "\\"), " " + s, s + "0"]


def _flip(v):
    """The same value as another type: bool <-> number, number -> text, integer -> float."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return [bool(v), float(v), str(v), -v - 1]
    if isinstance(v, float):
        return [str(v), v != 0.0, None]
    return [None, 0, True, [v]]


@profile(400)
@given(st.data())
def test_mutated_receipts_get_the_same_verdict_and_words(data):
    doc = copy.deepcopy(data.draw(st.sampled_from(BASES)))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(list(_paths(doc))))
        parent, key = _at(doc, path[:-1]), path[-1]
        op = data.draw(st.sampled_from(["delete", "replace", "add key", "edit text", "flip type"]))
        note(f"{op} at {path}")
        value = parent[key]
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = data.draw(VALUES)
        elif op == "add key":
            target = value if isinstance(value, dict) else doc
            target[data.draw(st.sampled_from(["extra", "x-unknown", "sha1", "", "id"]))] = data.draw(VALUES)
        elif op == "edit text" and isinstance(value, str):
            parent[key] = data.draw(st.sampled_from(_string_edits(value)))
        elif op == "flip type":
            flipped = _flip(value)
            parent[key] = data.draw(st.sampled_from(flipped)) if isinstance(flipped, list) else flipped
    doc = json.loads(json.dumps(doc))  # exactly what a receipt file parses to (NaN included)
    note(f"jsonschema: {R.problem_lines(JS, doc)}")
    event("valid" if assert_same(doc) else "invalid")


# --- falling back ---------------------------------------------------------------------------------------


def _bad() -> dict:
    data = json.loads(json.dumps(BASES[0]))  # as parsed from a file: no shared dicts (a deepcopy keeps them shared)
    _set(data, ["predicate", "results", 0, "seed"], -1)
    return data


def test_without_fastjsonschema_jsonschema_alone_decides(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastjsonschema", None)  # import fails
    monkeypatch.setattr(R, "_FAST_VALIDATOR", None)
    assert R._fast_validator() is None
    assert R.schema_problems(copy.deepcopy(BASES[0])) == []
    assert R.schema_problems(_bad()) == ["$.predicate.results[0].seed: -1 is less than the minimum of 0"]


def test_any_error_of_the_fast_path_goes_to_jsonschema(monkeypatch):
    def broken(data):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(R, "_FAST_VALIDATOR", broken)
    assert R.schema_problems(copy.deepcopy(BASES[0])) == []  # jsonschema found nothing
    assert R.schema_problems(_bad()) == ["$.predicate.results[0].seed: -1 is less than the minimum of 0"]


def test_the_fast_path_leaves_the_data_alone():
    data = copy.deepcopy(BASES[1])
    before = json.dumps(data, sort_keys=True)
    assert R.schema_problems(data) == [] and json.dumps(data, sort_keys=True) == before


def test_importing_the_engine_does_not_import_fastjsonschema():
    """Read-only commands stay light: it is imported when a receipt is first schema-checked."""
    code = ("import sys, engine.cli, engine.store.receipts, engine.store.verify, engine.store.index, engine.store.cache\n"
            "assert 'fastjsonschema' not in sys.modules\n"
            "from engine.store.receipts import schema_problems\n"
            "schema_problems({})\n"
            "assert 'fastjsonschema' in sys.modules\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_random_receipts_of_the_synthetic_generator_agree_across_seeds(tmp_path, monkeypatch):
    """Predicates straight from benchmarks.synthetic_store.predicate (cuda and cpu, failing and passing)."""
    from benchmarks.synthetic_store import demo_static_names, predicate, stamp, subject_for, write_demo_project
    from engine.spec import registry
    from engine.spec.loader import load_spec

    monkeypatch.setattr(registry, "_STATIC", demo_static_names())
    specs = write_demo_project(tmp_path)
    spec = load_spec(specs / "demo-method.yaml", tmp_path).data
    for i in range(12):
        rng = random.Random(i)
        pred = predicate(spec, stamp(i), device=("cuda" if i % 2 else "cpu"), rng=rng,
                         failing={"loss-gradient"} if i % 3 == 0 else (), formal=0.1 if i % 4 == 0 else None)
        data = json.loads(R.serialize(R.statement(subject_for(tmp_path, "demo-method"), pred)))
        assert assert_same(data)
