"""The boundary between the checks and a candidate's functions (engine/run/boundary.py, engine/run/call_loop.py).

The candidate's functions run in a process of their own that holds the candidate, torch and the call loop;
the checks run in the supervisor and call it across: tensors in and out, gradients by a vector-Jacobian call
there, exceptions as their builtin type with the candidate's line. A candidate that looks for its judge, or
patches it, finds nothing: the engine is not in its process.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from tests.test_impl import FIXTURE, METHOD, RATIO_BODY, check, receipts_of, variant

PROBE = '''
import sys
import torch


def engine_modules(x):
    """How many modules of the engine or the methods this process holds (the judge, if it were here)."""
    return torch.tensor(float(len([m for m in sys.modules if m.split(".")[0] in ("engine", "methods")])))


def patch_the_judge(x):
    """Re-point the runner's call and the expectation check, wherever they can be found from here."""
    patched = 0
    for name, mod in list(sys.modules.items()):
        for attr in ("call", "evaluate", "_plain_measurements"):
            if hasattr(mod, attr):
                patched += 1
    try:
        import engine.run.runner as runner  # a copy of its own, if it can import one at all
        runner.Runner.call = lambda *a, **k: {"status": "passed"}
        patched += 1000
    except Exception:
        pass
    return torch.tensor(float(patched))


def square(x, scale=1.0):
    return (x * x * scale, {"sum": (x * x).sum(), "n": x.numel()})


def refuse(x):
    if x.sum() < 0:
        raise ValueError("x must be non-negative, got a negative sum")
    return x


class Custom(KeyError):
    pass


def custom(x):
    raise Custom("a subclass crosses as its builtin base")


def leaves():
    sys.exit(3)


def stub(x):
    raise NotImplementedError("stub")


def text(x):
    return "not a tensor"


def an_object(x):
    return object()


def generator(x, n):
    for k in range(n):
        yield k, x * (k + 1)
'''
NAMES = ["engine_modules", "patch_the_judge", "square", "refuse", "custom", "leaves", "stub", "text", "an_object",
         "generator"]


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    from engine.run import boundary

    path = tmp_path_factory.mktemp("probe") / "probe.py"
    path.write_text(PROBE)
    conn = boundary.plain()
    msg = conn.load({"target": {"form": "file", "path": str(path)}, "names": NAMES, "device": "cpu", "threads": 1,
                     "memory_mb": 2048, "cwd": str(path.parent)}, 180)
    assert msg["op"] == "loaded" and not msg["missing"], msg
    conn.deadline_s = 60.0
    yield boundary.implementation(conn, "probe", NAMES), conn
    conn.close()


@pytest.fixture
def impl(remote):
    impl, conn = remote
    conn.deadline = time.monotonic() + 60
    conn.refused = conn.not_crossable = None
    yield impl
    conn.deadline = None
    conn.reset()


def test_the_candidates_process_holds_nothing_of_the_engine_to_find_or_patch(impl):
    assert impl.engine_modules(torch.zeros(1)).item() == 0
    # nothing of the judge to re-point; a copy it imports for itself (if it can) is its own, not the checks'
    impl.patch_the_judge(torch.zeros(1))
    from engine.run.runner import Runner

    assert Runner.call.__module__ == "engine.run.runner" and Runner.call.__name__ == "call"


def test_tensors_numbers_and_dicts_cross_both_ways(impl):
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    y, extra = impl.square(x, scale=2.0)
    assert torch.equal(y, x * x * 2.0) and y.dtype == torch.float64
    assert extra["n"] == 6 and torch.equal(extra["sum"], (x * x).sum())


def test_a_gradient_is_the_candidates_vector_jacobian_product(impl):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    g = torch.randn(3, 4, dtype=torch.float64)
    y, extra = impl.square(x, scale=3.0)
    assert y.requires_grad
    (gx,) = torch.autograd.grad([y, extra["sum"]], [x], [g, torch.tensor(2.0, dtype=torch.float64)])
    torch.testing.assert_close(gx, 6.0 * x.detach() * g + 2.0 * 2.0 * x.detach(), rtol=0, atol=1e-12)
    # a non-leaf input: the chain rule runs on through this process's own graph
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y, _ = impl.square(w * 2.0)
    y.sum().backward()
    torch.testing.assert_close(w.grad, 8.0 * w.detach(), rtol=0, atol=1e-12)


def test_a_refusal_crosses_as_its_type_with_the_candidates_line(impl):
    with pytest.raises(ValueError, match="non-negative") as got:
        impl.refuse(-torch.ones(2))
    line = PROBE.splitlines().index('        raise ValueError("x must be non-negative, got a negative sum")') + 1
    assert got.value.candidate_where == f"probe.py:{line}"
    with pytest.raises(KeyError):
        impl.custom(torch.ones(1))
    # SystemExit never arrives as itself: it would stop the supervisor
    with pytest.raises(RuntimeError) as left:
        impl.leaves()
    assert type(left.value).__name__ == "SystemExit" and not isinstance(left.value, SystemExit)


def test_a_stubs_not_implemented_is_noted_at_its_line(impl):
    from engine.run import unimplemented

    unimplemented.take()
    with pytest.raises(NotImplementedError):
        impl.stub(torch.ones(1))
    line = PROBE.splitlines().index('    raise NotImplementedError("stub")') + 1
    assert unimplemented.take() == [{"function": "stub", "at": f"probe.py:{line}"}]


def test_a_return_value_that_is_not_tensors_or_numbers_is_refused(remote, impl):
    from engine.run.boundary import ReturnRefused

    _impl, conn = remote
    for fn, what in (("text", "is a str"), ("an_object", "is a object")):
        conn.refused = None
        with pytest.raises(ReturnRefused, match=what):
            getattr(impl, fn)(torch.ones(1))
        assert fn in conn.refused and "only tensors, numbers" in conn.refused


def test_an_argument_that_cannot_cross_is_said_and_not_sent(remote, impl):
    from engine.run.boundary import NotCrossable

    _impl, conn = remote
    with pytest.raises(NotCrossable):
        impl.square(torch.nn.Linear(2, 2))
    assert conn.not_crossable == "square: a Linear argument does not cross to the candidate's process"


def test_a_generator_is_advanced_in_the_candidates_process(impl):
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    got = list(impl.generator(x, 3))
    assert [k for k, _ in got] == [0, 1, 2] and all(torch.equal(v, x.detach() * (k + 1)) for k, v in got)
    sum(v.sum() for _, v in got).backward()
    assert torch.equal(x.grad, torch.full((2,), 6.0, dtype=torch.float64))


# --- through `check --impl` ------------------------------------------------------------------------

# A wrong TAPO (the ratio scaled by 1.01) that is right whenever the engine's runner is in its process when it is
# loaded, and that re-points the runner's call to say "passed": issue 25's first two attacks, together.
CHEAT = ("\nimport sys as _s\n"
         "_JUDGED = 'engine.run.runner' in _s.modules\n"
         "try:\n"
         "    import engine.run.runner as _r\n"
         "    _r.Runner.call = lambda *a, **k: {'status': 'passed'}\n"
         "except Exception:\n"
         "    pass\n")


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandbox", "no-sandbox"])
def test_a_candidate_that_looks_for_or_patches_its_judge_fails_because_the_judge_is_elsewhere(tmp_path, sandboxed):
    from engine.run import sandbox

    if sandboxed and sandbox.unavailable():
        pytest.skip(sandbox.unavailable())
    cand = variant(tmp_path, "cheat.py", "    return prefix * torch.exp(here - here.detach())",
                   "    return prefix * torch.exp(here - here.detach()) * (1.0 if _JUDGED else 1.01)")
    cand.write_text(cand.read_text() + CHEAT)
    store = tmp_path / "r"
    r = check(cand, store, "--only", "prefix_ratio_forward", "--no-mutants", *([] if sandboxed else ["--no-sandbox"]))
    assert r.exit_code == 1, r.output
    (run,) = json.loads(r.stdout)["runs"]
    assert {x["status"] for x in run["results"]} == {"failed"}
    (stmt,) = receipts_of(store)
    iso = stmt["predicate"]["isolation"]
    assert iso["checks_in"] == "supervisor" and iso["sandbox"] == ("bubblewrap" if sandboxed else "none")


def test_contracts_that_cannot_cross_run_beside_the_candidate_and_the_receipt_says_which(tmp_path):
    store = tmp_path / "r"
    r = check(FIXTURE, store, "--only", "clip_schedule", "--only", "input_validation", "--no-mutants",
              "--no-sandbox")
    assert r.exit_code == 0, r.output
    (stmt,) = receipts_of(store)
    iso = stmt["predicate"]["isolation"]
    assert iso["checks_in"] == "mixed"
    assert [c["contract"] for c in iso["checks_in_candidate"]] == ["input_validation"]
    assert "TinyGRUPolicy argument does not cross" in iso["checks_in_candidate"][0]["why"]


def test_a_non_tensor_return_is_an_error_result_that_says_so(tmp_path):
    cand = variant(tmp_path, "text.py", RATIO_BODY, "    return 'ratio'\n" + RATIO_BODY)
    r = check(cand, tmp_path / "r", "--only", "prefix_ratio_forward", "--no-mutants", "--no-sandbox")
    assert r.exit_code == 3, r.output
    (run,) = json.loads(r.stdout)["runs"]
    for x in run["results"]:
        assert x["status"] == "error" and "refused at the boundary: trajectory_ratio: the return value is a str" \
            in x["message"], x["message"]


def test_the_call_loop_imports_only_the_standard_library_and_torch():
    import ast

    loop = Path(__file__).resolve().parents[1] / "engine" / "run" / "call_loop.py"
    tops = set()
    for node in ast.walk(ast.parse(loop.read_text())):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            tops.add(node.module.split(".")[0])
    assert "engine" not in tops and "methods" not in tops and tops - {"torch", "__future__"} <= set(
        __import__("sys").stdlib_module_names)


def test_the_wire_format_round_trips_what_crosses_and_refuses_anything_else():
    from engine.run.call_loop import Malformed, Refused, pack, unpack

    x = {"a": (torch.randn(2, 3).to(torch.bfloat16), torch.tensor(True), torch.empty(0, 4),
               torch.arange(6).reshape(2, 3).t()),
         "n": [1, 2.5, float("nan"), None, "s", torch.float16, torch.device("cpu"), 1 + 2j], 3: False}
    out, tensors = unpack(pack(x))
    assert len(tensors) == 4 and list(out) == ["a", "n", 3] and out[3] is False
    for got, want in zip(out["a"], x["a"]):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    assert out["n"][:2] == [1, 2.5] and type(out["n"][0]) is int and out["n"][2] != out["n"][2]
    assert out["n"][3:] == [None, "s", torch.float16, torch.device("cpu"), 1 + 2j]
    good = pack([torch.ones(2)])
    head, raw = good.split(b"\n", 1)
    for bad in (b"", b"{}\n", head + b"\n" + raw[:-1], head + b"\n" + raw + b"x",
                head.replace(b'"float32"', b'"object"') + b"\n" + raw,
                head.replace(b'"cpu"', b'"/etc/passwd"') + b"\n" + raw,
                head.replace(b'{"t": 0}', b'{"t": 1}') + b"\n" + raw,
                head.replace(b'{"t": 0}', b'{"__reduce__": 0}') + b"\n" + raw):
        with pytest.raises(Malformed):
            unpack(bad)
    with pytest.raises(Refused):
        pack(object())
