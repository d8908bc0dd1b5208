"""The strict screen (engine/evolve/screen.py) refuses every bypass in its corpus and accepts honest candidates.

The corpus (tests/screen_corpus.py) holds each route the issue found (torch.sys, torch.os, torch.builtins.exec,
hex-encoded code through it, ...) and the ones found since (aliases, modules passed as values, frames, format
fields, string annotations typing evaluates, match patterns, metaclasses, monkey-patching). Each attack that can
run safely is also run without the screen, so a route that stops existing (a torch release without `torch.sys`)
shows here instead of leaving a test that cannot fail; and the same payloads are tried in every syntactic place.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.cli import app
from engine.evolve import allowlist as AL
from engine.evolve import screen as S
from engine.evolve.screen import screen, screen_source
from tests import evolve_support as ES
from tests.screen_corpus import ATTACKS, CONTEXTS, HONEST_LOSS, HONEST_LOSS_RUN, PAYLOAD_PRELUDE, PAYLOADS

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
# framework targets (verl:FILE:NAME) import their framework: the evaluator screens only file candidates
FRAMEWORK_FIXTURES = {"verl_tapo.py"}


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.id for a in ATTACKS])
def test_every_bypass_in_the_corpus_is_refused_naming_its_line_and_construct(attack):
    why = screen_source(attack.src, "cand.py")
    assert why is not None, f"{attack.id}: accepted"
    assert why.startswith(f"cand.py:{attack.line}:") and attack.construct in why, why


# The corpus, unscreened, in a Python of its own: each live attack must reach what it claims.
_RUNNER = r"""
import json, sys, types
out = {}
for i, item in enumerate(json.load(sys.stdin)):
    mod = types.ModuleType(f"candidate_{i}")
    sys.modules[mod.__name__] = mod
    try:
        exec(compile(item["src"], item["id"], "exec"), mod.__dict__)
        out[item["id"]] = "ok" if eval(item["proof"], mod.__dict__) else "the proof does not hold"
    except BaseException as exc:  # noqa: BLE001 - reported, not raised
        out[item["id"]] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def test_the_live_attacks_reach_what_they_claim_and_the_honest_loss_runs_without_the_screen():
    live = [{"id": a.id, "src": a.src, "proof": a.proof} for a in ATTACKS if a.live]
    live.append({"id": "honest loss", "src": HONEST_LOSS + HONEST_LOSS_RUN, "proof": "HONEST_OK"})
    assert len(live) > 100
    r = subprocess.run([sys.executable, "-c", _RUNNER], input=json.dumps(live), capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout.strip().splitlines()[-1])
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, failed


@pytest.mark.parametrize("payload", list(PAYLOADS), ids=list(PAYLOADS))
def test_a_payload_is_refused_in_every_place_python_allows_it(payload):
    expr = PAYLOADS[payload]
    missed = {}
    for where, ctx in CONTEXTS.items():
        src = PAYLOAD_PRELUDE + ctx.format(P=expr)
        with warnings.catch_warnings():  # [torch][[torch]] is valid Python that Python warns about
            warnings.simplefilter("ignore", SyntaxWarning)
            compile(src, where, "exec")  # valid: a refusal here is the screen's, not a syntax error
        why = screen_source(src, "c.py")
        line = next(i for i, ln in enumerate(src.splitlines(), 1) if expr in ln)
        if why is None or "not valid Python" in why or not why.startswith(f"c.py:{line}:"):
            missed[where] = why
    assert not missed, missed


def _scaffolds() -> list[tuple[str, str]]:
    methods = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml"))
    assert len(methods) == 5, methods
    out = []
    for m in methods:
        r = CliRunner().invoke(app, ["scaffold", m])
        assert r.exit_code == 0, r.output
        out.append((f"scaffold {m}", r.stdout))
    return out


def _evolved() -> list[tuple[str, str]]:
    """OpenEvolve's initial TAPO program and each canned edit of it (tests/evolve_support.py)."""
    base = ES.initial_program()
    out = [("evolve initial program", base)]
    for i, reply in enumerate(ES.REPLIES):
        search, replace = reply.split("<<<<<<< SEARCH\n", 1)[1].split(">>>>>>> REPLACE", 1)[0].split("\n=======\n")
        assert base.count(search.rstrip("\n")) == 1, i
        out.append((f"evolve edit {i}", base.replace(search.rstrip("\n"), replace.rstrip("\n"))))
    return out


def _honest() -> list[tuple[str, str]]:
    files = [(p.name, p.read_text()) for p in sorted(FIXTURES.glob("*.py")) if p.name not in FRAMEWORK_FIXTURES]
    assert len(files) >= 6
    return files + _scaffolds() + _evolved() + [("realistic loss", HONEST_LOSS)]


def test_honest_candidates_are_accepted():
    """The fixtures, `contracts scaffold` for every method, the evolve initial program and its edits, and a
    realistic loss (torch.where, cumsum, log_softmax, gather, F.*, dataclasses, enums, match, generators, an
    nn.Module, copy.deepcopy(policy).eval(), format strings, type(x).__name__)."""
    refused = {name: why for name, text in _honest() if (why := screen_source(text, name))}
    assert not refused, refused


def test_the_screen_reads_a_file_by_name_and_refuses_what_it_cannot_read(tmp_path):
    good = tmp_path / "good.py"
    good.write_text(HONEST_LOSS)
    assert screen(good) is None
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = torch.sys\n")
    assert screen(bad) == "bad.py:2:5: torch.sys: is the module sys, outside the allowlist"
    (tmp_path / "latin.py").write_bytes(b"x = '\xff'\n")
    assert screen(tmp_path / "latin.py") == "latin.py: not UTF-8 text"
    (tmp_path / "big.py").write_bytes(b"#" * (S.MAX_BYTES + 1))
    assert screen(tmp_path / "big.py").endswith("over 1048576 bytes")
    assert screen(tmp_path / "none.py").startswith("none.py: cannot read")
    assert screen_source("def f(:\n", "s.py").startswith("s.py:1:")


def test_every_module_an_allowed_module_holds_is_refused_unless_allowed():
    """Ground truth from the modules themselves (inspect.ismodule over vars()), chain by chain through the
    screen: every public name bound to a module outside the allowlist is refused, in any allowed module."""
    import importlib
    import inspect

    checked = 0
    for m in sorted(AL.ALLOWED_MODULES - {"__future__"}):
        mod = importlib.import_module(m)
        for name, v in list(vars(mod).items()):
            if name.startswith("_") or not name.isidentifier() or not inspect.ismodule(v):
                continue
            why = screen_source(f"import {m} as M\nx = M.{name}.__name__\n", "c.py")
            if v.__name__ in AL.ALLOWED_MODULES:
                assert why is None, why
            else:
                # A lazily imported submodule (torch.onnx) that another test loaded after the allowlist was derived
                # in this process is not in it at all: refused as an unknown name rather than as a module.
                assert why is not None and (f"is the module {v.__name__}" in why or
                                            f"{name}: not a public name of {m}" in why), (m, name, why)
            checked += 1
    assert checked > 100


def test_the_issue_names_are_refused_on_any_object_and_everyday_methods_are_not():
    unknown = AL.atlas().unknown
    for name in ("sys", "os", "builtins", "importlib", "ctypes", "inspect", "subprocess", "gc", "types", "gi_frame",
                 "f_back", "f_globals", "tb_frame", "cr_frame", "getattr", "setattr", "exec", "attrgetter",
                 "methodcaller", "get_type_hints", "numpy", "from_file", "frombuffer"):
        assert name in unknown, name
    honest = ("import torch\n"
              "def f(x, d, p, cfg, g):\n"
              "    return (x.cpu(), d.copy(), x.select(0, 0), p.eval(), x.type(torch.float64), cfg.beta, cfg.kl,\n"
              "            cfg.gamma, cfg.normal, x.storage(), x.cuda, g.send(None), g.close(), x.sparse_dim())\n")
    assert screen_source(honest) is None


def test_the_allowlist_is_derived_so_what_a_release_adds_is_judged_without_an_edit(monkeypatch):
    """Plant what a future torch might carry: a module, a re-exported getattr, a new process-wide setter, a new
    tensor function. The derived allowlist refuses the first three and accepts the last, with no list edited."""
    import builtins
    import subprocess as sp

    import torch

    def plant(name, value):
        monkeypatch.setattr(torch, name, value, raising=False)

    try:
        plant("subprocess_like", sp)
        plant("resolve", builtins.getattr)
        plant("set_everything", lambda: None)
        plant("fancy_cumsum", torch.cumsum)
        AL.atlas.cache_clear()
        why = screen_source("import torch\nx = torch.subprocess_like.run\n")
        assert "torch.subprocess_like: is the module subprocess" in why, why
        assert "torch.resolve: reaches an attribute" in screen_source("import torch\nx = torch.resolve\n")
        assert "changes process-wide state" in screen_source("import torch\ntorch.set_everything()\n")
        assert screen_source("import torch\ny = torch.fancy_cumsum(torch.ones(3), 0)\n") is None
    finally:
        monkeypatch.undo()
        AL.atlas.cache_clear()
    assert "not a public name of torch" in screen_source("import torch\nx = torch.subprocess_like\n")


def test_the_corpus_catches_a_weakened_screen(monkeypatch):
    """Each rule is load-bearing: with it planted away, attacks in the corpus get through."""

    def accepted() -> set[str]:
        return {a.id for a in ATTACKS if screen_source(a.src, "cand.py") is None}

    assert accepted() == set()
    with monkeypatch.context() as m:  # modules may be passed around as values
        m.setattr(S._Screen, "_module_use_ok", lambda self, node: True)
        assert {"module in a list", "module returned", "module in a class body"} <= accepted()
    with monkeypatch.context() as m:  # torch's classes may be kept and changed under other names
        m.setattr(S._Screen, "_class_use_ok", lambda self, node: True)
        assert {"a torch class kept in a list and patched", "a torch class handed to a patcher"} <= accepted()
    with monkeypatch.context() as m:  # a module attribute is judged by name only, like any other object's
        m.setattr(AL, "lookup", lambda mod, name: AL.Entry(value=None))
        assert {"torch.sys.modules", "typing.sys", "rollout.paired"} <= accepted()
    with monkeypatch.context() as m:  # nothing refused on an object the screen cannot name
        real = AL.atlas()
        m.setattr(AL, "atlas", lambda: AL.Atlas(modules=real.modules, passthrough=real.passthrough, unknown={},
                                               builtins=real.builtins))
        assert {"a generator's frame", "a coroutine's frame", "AttributeError.obj"} <= accepted()
    with monkeypatch.context() as m:  # string annotations left unparsed
        m.setattr(S._Screen, "_string_annotations", lambda self: None)
        assert {"a string annotation", "a nested string annotation"} <= accepted()


def test_the_allowlist_is_derived_once_per_process():
    assert AL.atlas() is AL.atlas()


def test_the_evaluator_refuses_every_bypass_before_it_runs_under_a_trust_policy_and_without(tmp_path):
    """The whole corpus through the evolve evaluator (strict, its default), as OpenEvolve calls it: score 0, the
    refusal names the file, line and construct, and nothing of it ran (no receipt store was written)."""
    from engine.evolve.evaluator import Evaluator
    from engine.run import sandbox
    from tests.test_sandbox import keys_and_policy

    if sandbox.unavailable() is not None:
        pytest.skip(f"no sandbox on this machine: {sandbox.unavailable()}")
    key, policy = keys_and_policy(tmp_path / "pipeline", require=True)
    evaluators = (Evaluator("tapo-trajectory", receipts=tmp_path / "store"),
                  Evaluator("tapo-trajectory", receipts=tmp_path / "signed", sign_key=key, trust=policy))
    for i, attack in enumerate(ATTACKS):
        cand = tmp_path / f"attack_{i}.py"
        cand.write_text(attack.src)
        for ev in evaluators:
            res = ev.stage(1, str(cand))
            why = res.artifacts["not_checked"]
            assert res.metrics["combined_score"] == 0.0, (attack.id, res.metrics)
            assert why.startswith(f"refused by the strict screen: {cand.name}:{attack.line}:"), (attack.id, why)
            assert attack.construct in why, (attack.id, why)
    assert not (tmp_path / "store").exists() and not (tmp_path / "signed").exists()
