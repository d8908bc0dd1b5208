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

from tests.impl_support import ROOT
from tests.test_impl import FIXTURE, METHOD, RATIO_BODY, check, invoke, receipts_of, variant

MRTPO_FIXTURE = ROOT / "tests" / "fixtures" / "my_mrtpo.py"

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


def through(policy, x, k):
    """A policy's outputs (called back: the weights stay with the checks) made into a loss here, k updates."""
    for i in range(k):
        yield i, (policy(x) * 2.0).sum(-1), policy.in_features


def give_back(policy):
    return policy


def peek(policy):
    return policy.weight


def fields(rec):
    return rec.a * rec.n + rec.b


def widen(x, k):
    return (torch.cat([x] * k) * 2.0).sum()


_KEPT = []


def keep(policy, x):
    _KEPT.append(policy)
    return policy(x)


def use_kept(x):
    return _KEPT[-1](x)


def call_with(policy, tokens):
    return policy(tokens)


def unmetered(x):
    """Drop the call loop's meter reading, so that a budget would read zeros."""
    import __main__

    __main__._meter_class().report = lambda self: None
    return x * 2.0


def snapshot(policy):
    """MRTPO's freeze as the interface says: a deep copy (made by the checks), put in eval mode, no grad."""
    import copy

    return copy.deepcopy(policy).requires_grad_(False).eval()


def snapshot_of_copy(policy):
    import copy

    return copy.deepcopy(copy.deepcopy(policy)).eval()


def copies(policy, n):
    import copy

    return [copy.deepcopy(policy) for _ in range(n)][-1]


def tamper(policy, how):
    """Everything a freeze might try on the live student through its handle."""
    import copy
    import pickle

    if how == "train":
        policy.train()
    elif how == "eval":
        policy.eval()
    elif how == "no_grad":
        policy.requires_grad_(False)
    elif how == "parameters":
        policy.parameters()
    elif how == "state_dict":
        policy.state_dict()
    elif how == "set":
        policy.weight = None
    elif how == "del":
        del policy.weight
    elif how == "shallow":
        copy.copy(policy)
    elif how == "pickle":
        pickle.dumps(policy)
    elif how == "forged_request":
        policy._do("load_state_dict", {})
    elif how == "to":
        policy._do("to", "cuda")
    elif how == "copy_train_with_a_string":
        copy.deepcopy(policy)._do("train", "yes")
    return policy


def forged(policy, index):
    """A handle of its own making, by number."""
    return type(policy)(None, index, "Linear", {})


def kept_copy(policy):
    import copy

    _KEPT.append(copy.deepcopy(policy))
    return _KEPT[-1]


def give_kept():
    return _KEPT[-1]


def in_a_tuple(policy):
    return (policy,)


def not_a_policy(policy):
    return torch.ones(1)


def a_tuple(policy):
    return (1,)


def in_a_generator(policy):
    yield policy
'''
NAMES = ["engine_modules", "patch_the_judge", "square", "refuse", "custom", "leaves", "stub", "text", "an_object",
         "generator", "through", "give_back", "peek", "fields", "widen", "keep", "use_kept", "call_with",
         "unmetered", "snapshot", "snapshot_of_copy", "copies", "tamper", "forged", "kept_copy", "give_kept",
         "in_a_tuple", "not_a_policy", "a_tuple", "in_a_generator"]
# the functions the probe's interface declares to return a policy (as MRTPO's declares `freeze`)
RETURNS = {"snapshot", "snapshot_of_copy", "copies", "tamper", "forged", "kept_copy", "give_kept", "not_a_policy",
           "a_tuple", "in_a_generator"}


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
    yield boundary.implementation(conn, "probe", NAMES, RETURNS), conn
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


def test_a_jacobian_taken_row_by_row_crosses_once_and_equals_the_row_by_row_products(remote, impl, monkeypatch):
    """torch.autograd.functional.jacobian asks for one basis vector per backward: after the first rows of an output
    the rest come in one request, each the same vector-Jacobian product the candidate gives alone; a cotangent
    that is not a basis vector is asked for as it is."""
    _, conn = remote
    sent = []
    real = conn.request
    monkeypatch.setattr(conn, "request", lambda head, *a, **k: sent.append(head.get("op")) or real(head, *a, **k))
    x = torch.randn(3, 5, dtype=torch.float64)

    def f(v):
        return impl.square(v, scale=3.0)[0]

    jac = torch.autograd.functional.jacobian(f, x)
    want = torch.autograd.functional.jacobian(lambda v: v * v * 3.0, x)
    assert torch.equal(jac, want)  # bit for bit: the same products, fetched together or not
    assert sent.count("call") == 1 and sent.count("vjp") <= 3, sent  # 15 rows: two alone, then all in one
    sent.clear()
    v = x.clone().requires_grad_(True)
    y = f(v)
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, v, g)
    assert torch.allclose(got, 6.0 * x * g) and sent == ["call", "vjp"]


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
        impl.square(frozenset({2}))
    assert conn.not_crossable == "square: a frozenset argument does not cross to the candidate's process"


def test_a_policy_crosses_as_a_handle_called_back_here_and_its_gradient_trains_it_here(remote, impl):
    """TAPO's proximal_logprobs(policy, rollout, k): the candidate scores with the checks' own policy (each call
    runs here, on the tensors that crossed) and what it yields trains that policy through the VJP call."""
    from engine.run.boundary import ReturnRefused

    _impl, conn = remote
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, dtype=torch.float64)
    x = torch.randn(4, 3, dtype=torch.float64)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    before = conn.callbacks
    for k, loss_rows, width in impl.through(lin, x, 2):
        assert width == 3 and loss_rows.requires_grad
        opt.zero_grad()
        loss_rows.sum().backward()
        want_w = 2.0 * x.sum(0).expand(2, 3)
        torch.testing.assert_close(lin.weight.grad, want_w, rtol=0, atol=1e-12)
        torch.testing.assert_close(lin.bias.grad, torch.full((2,), 8.0, dtype=torch.float64), rtol=0, atol=1e-12)
        w0 = lin.weight.detach().clone()
        opt.step()
        assert not torch.equal(w0, lin.weight.detach())  # the checks' policy moved; the candidate never held it
    assert conn.callbacks == before + 2
    with pytest.raises(AttributeError, match="handle here"):
        impl.peek(lin)  # its weights are not there to read or re-point
    conn.refused = None
    with pytest.raises(ReturnRefused, match="handle to the checks' Linear"):  # a policy never comes back
        impl.give_back(lin)
    assert conn.not_crossable is None  # refused, not moved beside: a candidate cannot choose where it is judged


def test_a_budget_is_metered_by_the_call_loop_in_the_candidates_process(remote, impl):
    """Memory and operations exist only where the candidate runs: the call loop meters the call (and its
    vector-Jacobian call, on the same meter) and sends the reading; nothing here is counted."""
    _impl, conn = remote
    x = torch.ones(1000, dtype=torch.float32, requires_grad=True)
    with impl.widen.metered() as meter:
        y = impl.widen(x, 4)
        fwd_peak, fwd_ops = meter.peak_bytes, meter.ops
        y.backward()
    assert meter.measured_in == "candidate" and conn.meter is None
    assert fwd_peak >= 2 * 4 * 4000 and fwd_ops >= 3  # the [4000] cat and its doubled copy, both alive at once
    assert meter.ops > fwd_ops and meter.peak_bytes >= fwd_peak  # the backward ran under the same meter
    assert torch.equal(x.grad, torch.full((1000,), 8.0))
    impl.widen(x, 2)  # outside the meter: no reading asked for or taken
    assert len(meter.reports) == 1


def test_a_handle_kept_past_its_call_reaches_nothing(remote, impl):
    """A handle lasts for the check call it came with: kept and called in a later one, it is gone."""
    _impl, conn = remote
    lin = torch.nn.Linear(2, 2)
    x = torch.ones(1, 2)
    torch.testing.assert_close(impl.keep(lin, x), lin(x).detach())
    conn.reset()  # between check calls
    with pytest.raises(RuntimeError, match="that object of the checks is gone"):
        impl.use_kept(x)
    assert conn.lost is None


def test_a_kept_handle_does_not_reach_the_next_checks_object_at_its_index(remote, impl):
    """Handles are never reused across a reset: a kept one reaches nothing, not whatever comes next."""
    _impl, conn = remote
    x = torch.ones(1, 2)
    impl.keep(torch.nn.Linear(2, 2), x)
    conn.reset()
    impl.call_with(torch.nn.Linear(2, 2), x)  # the next check's object, handed over after the reset
    with pytest.raises(RuntimeError, match="that object of the checks is gone"):
        impl.use_kept(x)
    assert conn.lost is None


def _linear():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2, dtype=torch.float64)
    lin.vocab_size = 7  # a plain attribute: what the candidate may read
    return lin


def test_a_deep_copy_of_a_handle_is_made_here_and_comes_back_as_that_object(remote, impl):
    """MRTPO's freeze(policy) -> Policy: `copy.deepcopy(handle)` asks the checks for a copy of their module; the
    candidate may put that copy (only) in eval mode without grad, and returning its handle gives the check the
    copy itself, while the checks' own module is untouched."""
    _impl, conn = remote
    lin = _linear()
    frozen = impl.snapshot(lin)
    assert isinstance(frozen, torch.nn.Linear) and frozen is not lin
    assert not frozen.training and not any(q.requires_grad for q in frozen.parameters()) and frozen.vocab_size == 7
    assert lin.training and all(q.requires_grad for q in lin.parameters())
    for a, b in zip(frozen.parameters(), lin.parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    with torch.no_grad():
        lin.weight.add_(1.0)  # the student moves on; the snapshot does not
    assert not torch.equal(frozen.weight, lin.weight)
    again = impl.snapshot_of_copy(lin)  # a copy of a copy is the candidate's too
    assert again is not frozen and again is not lin and not again.training
    # what freeze returns is the object the candidate's handle stands for: the live student when it returns that
    assert impl.tamper(lin, "none") is lin
    assert conn.lost is None and conn.refused is None


def test_a_handle_refuses_what_would_reach_or_change_the_checks_own_module(remote, impl):
    """The live student is the checks': its mode, its requires_grad, its weights and its attributes are not the
    candidate's, whatever route it tries (a forged request too); a copy's mode only takes a bool."""
    _impl, conn = remote
    lin = _linear()
    state = {k: v.clone() for k, v in lin.state_dict().items()}
    for how, exc, text in (("train", PermissionError, "applies only to a copy made with copy.deepcopy"),
                           ("eval", PermissionError, "applies only to a copy"),
                           ("no_grad", PermissionError, "applies only to a copy"),
                           ("parameters", AttributeError, "handle here"),
                           ("state_dict", AttributeError, "handle here"),
                           ("set", AttributeError, "read-only"),
                           ("del", AttributeError, "read-only"),
                           ("shallow", TypeError, "shallow copy would share its parameters"),
                           ("pickle", TypeError, "does not pickle"),
                           ("forged_request", TypeError, "does not 'load_state_dict'"),
                           ("to", TypeError, "does not 'to'"),
                           ("copy_train_with_a_string", TypeError, "does not 'train'")):
        with pytest.raises(exc, match=text):
            impl.tamper(lin, how)
    assert lin.training and all(q.requires_grad for q in lin.parameters())
    assert all(torch.equal(v, lin.state_dict()[k]) for k, v in state.items())
    assert conn.lost is None


def test_only_a_function_declared_to_return_a_policy_gives_back_a_handle_and_only_one_issued_in_this_check(
        remote, impl):
    from engine.run.boundary import MAX_COPIES, ReturnRefused

    _impl, conn = remote
    lin = _linear()
    for fn, args, text in (("give_back", (lin,), "handle to the checks' Linear: only a function the interface "
                                                 "declares to return a policy"),
                           ("in_a_tuple", (lin,), "return value\\[0\\] is a handle"),
                           ("not_a_policy", (lin,), "return value is a Tensor: the interface declares a policy"),
                           ("a_tuple", (lin,), "return value is a tuple: the interface declares a policy"),
                           ("in_a_generator", (lin,), "return value is a generator: the interface declares a policy"),
                           ("forged", (lin, 10**6), "did not issue in this check")):
        conn.refused = None
        with pytest.raises(ReturnRefused, match=text):
            getattr(impl, fn)(*args)
    conn.refused = None
    issued = next(i for i, h in enumerate(conn.handles) if h is lin)
    assert impl.forged(lin, issued) is lin  # a number issued in this check: that very object
    assert isinstance(impl.copies(lin, MAX_COPIES), torch.nn.Linear)
    with pytest.raises(ValueError, match=f"more than {MAX_COPIES} copies"):
        impl.copies(lin, MAX_COPIES + 1)
    # a copy kept from an earlier check is gone with that check: returned, or copied again, it reaches nothing
    impl.kept_copy(lin)
    conn.reset()
    conn.refused = None
    with pytest.raises(ReturnRefused, match="did not issue in this check"):
        impl.give_kept()
    assert conn.lost is None


def test_a_call_back_with_token_ids_outside_the_vocabulary_is_refused_before_it_indexes(impl):
    """On a GPU an out-of-range id is a device-side assert that poisons every later check: refused here first."""
    emb = torch.nn.Embedding(5, 2)
    emb.vocab_size = 5
    assert impl.call_with(emb, torch.tensor([0, 4])).shape == (2, 2)
    with pytest.raises(ValueError, match="token id outside"):
        impl.call_with(emb, torch.tensor([0, 10**6]))
    with pytest.raises(ValueError, match="token id outside"):
        impl.call_with(emb, torch.tensor([-1]))


def test_a_metered_call_that_comes_back_without_its_reading_loses_the_candidate(tmp_path):
    """Zeros would pass every budget: a call asked to meter that sends no reading is a lost candidate."""
    from engine.run import boundary

    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    conn = boundary.plain()
    try:
        msg = conn.load({"target": {"form": "file", "path": str(path)}, "names": NAMES, "device": "cpu",
                         "threads": 1, "memory_mb": 2048, "cwd": str(path.parent)}, 180)
        assert msg["op"] == "loaded", msg
        conn.deadline_s = 60.0
        impl = boundary.implementation(conn, "probe", NAMES)
        assert torch.equal(impl.unmetered(torch.ones(2)), torch.full((2,), 2.0))  # unmetered: no reading asked
        with pytest.raises(boundary.CandidateLost, match="sent no reading"):
            with impl.unmetered.metered():
                impl.unmetered(torch.ones(2))
        assert conn.lost is not None
    finally:
        conn.close()


def test_a_record_crosses_as_its_fields(impl):
    import dataclasses

    @dataclasses.dataclass
    class Rec:
        a: torch.Tensor
        b: torch.Tensor
        n: int

    got = impl.fields(Rec(torch.ones(2), torch.arange(2.0), 3))
    assert torch.equal(got, torch.tensor([3.0, 4.0]))


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


# A wrong TAPO (old log-probs re-scored before every proximal update: every ratio 1, the clip never acts) that
# re-points the mechanism run's record in its own process so the run reports the numbers a right TAPO would.
RESCORED = "        yield k, logp, rollout.old_logp\n"
FAKE_RECORD = ("\ntry:\n"
               "    import methods.tapo.record as _rec\n"
               "    _measured = _rec.RunRecord.measurements\n"
               "    def _fake(self):\n"
               "        m = _measured(self)\n"
               "        m.update(later_update_ratio_max_dev=0.15, later_update_clipped_tokens=5.0,\n"
               "                 behaviour_logp_max_abs_err=2.4e-7)\n"
               "        return m\n"
               "    _rec.RunRecord.measurements = _fake\n"
               "except Exception:\n"
               "    pass\n")


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandbox", "no-sandbox"])
def test_a_candidate_that_fakes_its_mechanism_measurements_fails_because_the_run_is_measured_here(
        tmp_path, monkeypatch, sandboxed):
    """The mechanism run trains the checks' policy here and calls the candidate across: its re-pointed record is
    its own copy. The old way (the run beside the candidate, in one process with it) the same file passed."""
    from engine.run import isolation, sandbox

    if sandboxed and sandbox.unavailable():
        pytest.skip(sandbox.unavailable())
    cand = variant(tmp_path, "fake_mechanism.py", RESCORED, "        yield k, logp, logp.detach()\n")
    cand.write_text(cand.read_text() + FAKE_RECORD)
    flag = [] if sandboxed else ["--no-sandbox"]
    r = check(cand, tmp_path / "r", "--only", "mechanism", "--no-mutants", *flag)
    assert r.exit_code == 1, r.output
    (res,) = json.loads(r.stdout)["runs"][0]["results"]
    assert res["status"] == "failed" and res["measurements"]["later_update_ratio_max_dev"] == 0.0, res
    assert "later_update_ratio_max_dev 0 < limit" in res["message"]
    (stmt,) = receipts_of(tmp_path / "r")
    assert stmt["predicate"]["isolation"]["checks_in"] == "supervisor"
    if sandboxed:
        return
    monkeypatch.setattr(isolation, "ALL_BESIDE", True)  # the run beside the candidate: the fake holds there
    r = check(cand, tmp_path / "beside", "--only", "mechanism", "--no-mutants", *flag)
    assert r.exit_code == 0, r.output


def test_a_contract_whose_argument_is_a_policy_runs_here_and_calls_the_candidate_across(tmp_path):
    """input_validation hands proximal_logprobs the checks' policy and a rollout: the policy crosses as a handle
    (called back here), the rollout as its fields, so the check runs in the supervisor like the rest."""
    store = tmp_path / "r"
    r = check(FIXTURE, store, "--only", "clip_schedule", "--only", "input_validation", "--no-mutants",
              "--no-sandbox")
    assert r.exit_code == 0, r.output
    (stmt,) = receipts_of(store)
    iso = stmt["predicate"]["isolation"]
    assert iso["checks_in"] == "supervisor" and "checks_in_candidate" not in iso, iso


def test_budget_contracts_are_checked_here_on_the_call_loops_meter_and_freeze_runs_here_too(tmp_path):
    """MRTPO: a budget contract is checked in the supervisor on the candidate's own memory reading (the receipt
    says measured_in candidate); a contract calling freeze runs here too: the module freeze returns is a handle,
    read as the checks' own object (the copy the candidate asked for)."""
    store = tmp_path / "r"
    r = invoke("check", "mrtpo", "--impl", str(MRTPO_FIXTURE), "--seeds", "42", "--only", "js_vectorised", "--only",
               "protocol", "--no-mutants", "--no-sandbox", "--receipts", str(store))
    assert r.exit_code == 0, r.output
    assert "checks ran in: supervisor; memory/time measured in the candidate's process: js_vectorised" in r.output
    (path,) = (store / "mrtpo").glob("*.json")
    pred = json.loads(path.read_text())["predicate"]
    iso = pred["isolation"]
    assert iso["checks_in"] == "supervisor" and "checks_in_candidate" not in iso, iso
    assert [c["contract"] for c in iso["measured_in_candidate"]] == ["js_vectorised"]
    where = {(x["contract"], x["checked_in"], x.get("measured_in")) for x in pred["results"]}
    assert where == {("js_vectorised", "supervisor", "candidate"), ("protocol", "supervisor", None)}


# An MRTPO whose student sees the first verifier block (alone it fails loo_contexts and mechanism), with issue 36's
# attack: where the checks run in its process (a worker beside it that holds the engine), it re-points
# Runner.call so that every contract measures the registered implementation instead of it.
LEAK = "def student_context(prompts, blocks):\n    return torch.cat([prompts, blocks[0]], 1)\n"
REPOINT = ("\nimport sys as _s\n"
           "_r = _s.modules.get('engine.run.runner')\n"
           "if _r is not None:\n"
           "    _real = _r.Runner.call\n"
           "    def _call(self, impl, *a, **k):\n"
           "        from engine.spec import registry as _reg\n"
           "        return _real(self, _reg.load().get_implementation('mrtpo'), *a, **k)\n"
           "    _r.Runner.call = _call\n")


def _mrtpo_variant(tmp_path, name: str, old: str, new: str, tail: str = "") -> Path:
    src = MRTPO_FIXTURE.read_text()
    assert src.count(old) == 1, old
    path = tmp_path / name
    path.write_text(src.replace(old, new) + tail)
    return path


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandbox", "no-sandbox"])
def test_a_candidate_that_re_points_the_runner_from_a_freeze_contract_fails_because_freeze_runs_here(
        tmp_path, monkeypatch, sandboxed):
    """Issue 36: MRTPO's freeze contracts ran beside the candidate, where re-pointing Runner.call made a candidate
    that leaks a verifier block to its student pass them. They run in the supervisor now: the leak fails the
    contracts that see it, named, and the receipt says checks_in supervisor. Beside it (the old way) the same
    file passes."""
    from engine.run import isolation, sandbox

    if sandboxed and sandbox.unavailable():
        pytest.skip(sandbox.unavailable())
    cand = _mrtpo_variant(tmp_path, "repoint.py", "def student_context(prompts, blocks):\n    return prompts\n", LEAK,
                          REPOINT)
    flag = [] if sandboxed else ["--no-sandbox"]
    store = tmp_path / "r"
    r = invoke("check", "mrtpo", "--impl", str(cand), "--seeds", "42", "--only", "loo_contexts", "--only",
               "mechanism", "--no-mutants", "--json", *flag, "--receipts", str(store))
    assert r.exit_code == 1, r.output
    (run,) = json.loads(r.stdout)["runs"]
    assert {x["contract"]: x["status"] for x in run["results"]} == {"loo_contexts": "failed", "mechanism": "failed"}
    (path,) = (store / "mrtpo").glob("*.json")
    iso = json.loads(path.read_text())["predicate"]["isolation"]
    assert iso["checks_in"] == "supervisor" and "checks_in_candidate" not in iso, iso
    if sandboxed:
        return
    monkeypatch.setattr(isolation, "ALL_BESIDE", True)  # the checks beside the candidate: the re-pointing holds
    r = invoke("check", "mrtpo", "--impl", str(cand), "--seeds", "42", "--only", "loo_contexts", "--only",
               "mechanism", "--no-mutants", "--no-sandbox", "--receipts", str(tmp_path / "beside"))
    assert r.exit_code == 0, r.output


def test_a_freeze_that_returns_the_live_student_fails_the_freeze_contracts(tmp_path):
    """The handle a candidate's freeze returns is read as the object it stands for: the student itself, when it
    made no copy, so the replay moves with every update and the mechanism contract sees it."""
    cand = _mrtpo_variant(tmp_path, "live.py", "    return copy.deepcopy(policy).requires_grad_(False).eval()\n",
                          "    return policy\n")
    r = invoke("check", "mrtpo", "--impl", str(cand), "--seeds", "42", "--only", "mechanism", "--no-mutants",
               "--no-sandbox", "--json", "--receipts", str(tmp_path / "r"))
    assert r.exit_code == 1, r.output
    (path,) = (tmp_path / "r" / "mrtpo").glob("*.json")
    (res,) = json.loads(path.read_text())["predicate"]["results"]
    assert res["status"] == "failed" and res["checked_in"] == "supervisor", res
    assert res["measurements"]["snapshot_max_change"] > 0 and "snapshot_max_change" in res["message"], res


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
