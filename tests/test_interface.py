"""Every spec declares its implementation's whole interface: each function the implementation registers and each
`impl.<name>(...)` its checks and mechanism runs call, with the registered signature, every returned dict's keys,
and a scaffold of real stubs; the declared mask and error conventions hold in the shipped implementations."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from engine.cli import app
from engine.spec import registry

ROOT = Path(__file__).resolve().parent.parent
METHODS = {"tapo-trajectory": "tapo", "mrtpo": "mrtpo", "tar-adaptive-replay": "tar", "grpo": "grpo", "gspo": "gspo"}

runner = CliRunner()


def _interface(method: str) -> dict:
    r = runner.invoke(app, ["interface", method, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _default(p: inspect.Parameter) -> str | None:
    if p.default is inspect.Parameter.empty:
        return None
    if isinstance(p.default, str):  # declared quoted, as the scaffold writes it: agg='token-mean'
        return repr(p.default)
    return f"torch.{str(p.default).split('.')[-1]}" if "torch." in str(p.default) else str(p.default)


def _called_by_checks(package: str) -> set[str]:
    """Every `impl.<name>(` (or `self.impl.<name>(`) in the method's package: what its checks and runs call."""
    names: set[str] = set()
    for path in (ROOT / "methods" / package).glob("*.py"):
        names |= set(re.findall(r"\bimpl\.([A-Za-z_][A-Za-z0-9_]*)\(", path.read_text()))
    return names


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_interface_is_declared_whole_and_is_the_registered_signatures(method):
    data = _interface(method)
    assert data["declared"] is True
    impl = registry.load().get_implementation(METHODS[method])
    declared = {f["name"]: f for f in data["functions"]}
    assert sorted(declared) == sorted(impl.functions)
    from engine.spec.loader import load_spec

    spec = load_spec(ROOT / "specs" / f"{method}.yaml", ROOT).data
    called = _called_by_checks(METHODS[method]) | {
        c["params"]["function"] for c in spec["contracts"] if "function" in (c.get("params") or {})}
    assert called and called <= set(declared), f"called but not declared: {sorted(called - set(declared))}"
    for name, f in declared.items():
        assert f["signature"] and f["summary"] and f["returns"], name
        assert all(a["meaning"] and a["type"] for a in f["args"]), name
        real = [(p.name, "keyword-only" if p.kind is inspect.Parameter.KEYWORD_ONLY else "positional", _default(p))
                for p in inspect.signature(getattr(impl, name)).parameters.values()]
        assert [(a["name"], a["kind"], a.get("default")) for a in f["args"]] == real, name
        for r in f["returns"]:
            if r["type"] == "dict":
                assert r.get("keys"), f"{name} returns a dict without declaring its keys"
    assert {c["topic"] for c in data["conventions"]} >= {"errors", "masks", "messages"}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_scaffold_has_real_signatures_and_docstrings(method, tmp_path):
    r = runner.invoke(app, ["scaffold", method])
    assert r.exit_code == 0, r.output
    assert "*args" not in r.stdout and "**kwargs" not in r.stdout
    ns: dict = {}
    exec(compile(r.stdout, str(tmp_path / "stub.py"), "exec"), ns)  # noqa: S102 - the scaffold just generated
    impl = registry.load().get_implementation(METHODS[method])
    for name in impl.functions:
        got, want = inspect.signature(ns[name]), inspect.signature(getattr(impl, name))
        assert [(p.name, p.kind, repr(p.default)) for p in got.parameters.values()] == \
            [(p.name, p.kind, repr(p.default)) for p in want.parameters.values()], name
        assert "Returns:" in ns[name].__doc__, name
        with pytest.raises(NotImplementedError):
            ns[name](*[None] * sum(p.default is inspect.Parameter.empty for p in got.parameters.values()))
    # A shape and a dtype with the same text ("same as z") read once, not twice in a row.
    assert not re.search(r"(same as \w+) \1", r.stdout), r.stdout


def _keys(method: str, function: str, value: str) -> set[str]:
    f = next(f for f in _interface(method)["functions"] if f["name"] == function)
    return {k["name"] for k in next(r for r in f["returns"] if r["name"] == value)["keys"]}


def test_declared_result_keys_are_the_returned_ones():
    from methods.mrtpo.credit import mrtpo_advantages
    from methods.tapo.objective import tapo_loss
    from methods.tar.replay import adaptive_replay_loss

    mask = torch.tensor([[True, True, False], [True, False, False]])
    _, met = mrtpo_advantages(torch.randn(2, 2, dtype=torch.float64), torch.rand(2, 2, 3, dtype=torch.float64), mask)
    assert set(met) == _keys("mrtpo", "mrtpo_advantages", "metrics")
    lt = -torch.rand(2, 3, dtype=torch.float64)
    _, met = adaptive_replay_loss(lt, lt - 0.5, mask)
    assert set(met) == _keys("tar-adaptive-replay", "adaptive_replay_loss", "metrics")
    _, met = tapo_loss(lt.clone().requires_grad_(True), lt, torch.tensor([1.0, -1.0], dtype=torch.float64), mask,
                       0.1, 0.3)
    assert set(met) == _keys("tapo-trajectory", "tapo_loss", "metrics")
    from methods.grpo.loss import grpo_loss
    from methods.gspo.loss import gspo_loss

    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    _, met = grpo_loss(lt, lt - 0.1, adv, mask, dual_clip=2.0, ref_logp=lt - 0.2, beta=0.1)
    assert set(met) == _keys("grpo", "grpo_loss", "metrics")
    _, met = gspo_loss(lt, lt - 0.1, adv, mask)
    assert set(met) == _keys("gspo", "gspo_loss", "metrics")


# --- the declared conventions, in the shipped implementations -------------------------------------


def _mask_forms(mask: torch.Tensor) -> list[torch.Tensor]:
    return [mask, mask.long(), mask.to(torch.uint8), mask.float(), mask.double()]


def test_every_method_reads_a_0_1_mask_of_any_real_dtype_as_the_bool_mask():
    from methods.mrtpo.credit import credit_weights, mrtpo_advantages
    from methods.tapo.objective import tapo_loss
    from methods.tar.fps import farthest_point_prototypes
    from methods.tar.harness import kl_to_base
    from methods.grpo.loss import group_advantages, grpo_loss
    from methods.gspo.loss import gspo_loss, sequence_ratio
    from methods.tar.replay import adaptive_replay_loss

    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[True, True, False, True], [True, False, False, False]])
    lt = -torch.rand(2, 4, generator=g, dtype=torch.float64)
    la = torch.randn(2, 4, 5, generator=g, dtype=torch.float64).log_softmax(-1)
    ll = torch.randn(2, 2, 4, 5, generator=g, dtype=torch.float64).log_softmax(-1)
    emb = torch.randn(4, 3, generator=g, dtype=torch.float64)
    calls = [
        lambda m: float(adaptive_replay_loss(lt, lt - 0.3, m)[0]),
        lambda m: credit_weights(la, ll, m, 0.5).tolist(),
        lambda m: mrtpo_advantages(torch.randn(2, 2, generator=torch.Generator().manual_seed(1)),
                                   torch.ones(2, 2, 4), m)[0].tolist(),
        lambda m: float(tapo_loss(lt, lt - 0.1, torch.tensor([1.0, -1.0], dtype=torch.float64), m, 0.1, 0.3)[0]),
        lambda m: farthest_point_prototypes(emb, m.reshape(-1)[:4], k=2).tolist(),
        lambda m: float(kl_to_base(la.log_softmax(-1), la.flip(0), m)),
        lambda m: float(grpo_loss(lt, lt - 0.1, torch.tensor([1.0, -1.0], dtype=torch.float64), m)[0]),
        lambda m: group_advantages(torch.tensor([1.0, 2.0], dtype=torch.float64), 2, mask=m).tolist(),
        lambda m: float(gspo_loss(lt, lt - 0.1, torch.tensor([1.0, -1.0], dtype=torch.float64), m)[0]),
        lambda m: sequence_ratio(lt, lt - 0.1, m).tolist(),
    ]
    for call in calls:
        want = call(mask)
        for form in _mask_forms(mask)[1:]:
            assert call(form) == want, form.dtype
        for bad in (mask.long() * 2, mask.double() * 0.5, torch.where(mask, torch.nan, 0.0)):
            with pytest.raises(ValueError):
                call(bad)


def test_a_wrong_dtype_class_is_a_type_error_and_a_wrong_value_a_value_error():
    from methods.mrtpo.credit import js_distance
    from methods.tar.fps import farthest_point_prototypes
    from methods.tar.replay import adaptive_replay_loss, soft_gate

    lt = -torch.rand(2, 3, dtype=torch.float64)
    mask = torch.ones(2, 3, dtype=torch.bool)
    emb = torch.randn(3, 2, dtype=torch.float64)
    marks = torch.ones(3, dtype=torch.bool)
    for call in (lambda: adaptive_replay_loss(lt.long(), lt, mask), lambda: soft_gate(torch.arange(3)),
                 lambda: farthest_point_prototypes(emb.long(), marks),
                 lambda: farthest_point_prototypes(emb, marks, prompt_ids=torch.zeros(3)),
                 lambda: js_distance(lt.long(), lt.long())):
        with pytest.raises(TypeError):
            call()
    for call in (lambda: adaptive_replay_loss(lt, lt[:, :2], mask), lambda: farthest_point_prototypes(emb[0], marks),
                 lambda: farthest_point_prototypes(emb, marks, k=-1), lambda: js_distance(lt, lt[:, :2])):
        with pytest.raises(ValueError):
            call()


# --- one error convention: contracts read only the message text the interface declares --------------------------

SPECS = sorted(p.stem for p in (ROOT / "specs").glob("*.yaml"))


def _declared_words(spec: dict) -> dict[str, list[str]]:
    """function -> the message words and prefixes its `raises` entries declare (lower case)."""
    out: dict[str, list[str]] = {}
    for f in (spec.get("interface") or {}).get("functions") or []:
        for r in f.get("raises") or []:
            words = list(r.get("message_contains") or []) + ([r["message_prefix"]] if r.get("message_prefix") else [])
            out.setdefault(f["name"], []).extend(w.lower() for w in words)
    return out


def _message_reads(spec: dict) -> list[tuple[str, str, str]]:
    """(contract, function, fragment) for each piece of message text a contract of `spec` matches: the refusal
    kind's `match:` words and `message_prefix`es (of each call a row makes), and the MESSAGE_READS its bespoke
    checks' modules declare."""
    import sys

    reg = registry.load()
    out = []
    for c in spec["contracts"]:
        params = c.get("params") or {}
        check = c.get("check") or "kind:"  # the loader names a kind's contract `kind:<name>`
        if check.startswith("kind:") and c["kind"] == "refusal":
            calls = params.get("calls") or {}
            for name, call in [(None, params), *calls.items()]:
                prefix = call.get("message_prefix") or []
                out += [(c["id"], call["function"], p) for p in ([prefix] if isinstance(prefix, str) else prefix)]
            for row in params.get("refuse") or []:
                muts = row if isinstance(row, list) else [row]
                call = next((mu["call"] for mu in muts if "call" in mu), None)
                function = calls[call]["function"] if call else params["function"]
                for mu in muts:
                    words = mu.get("match") or []
                    out += [(c["id"], function, w) for w in ([words] if isinstance(words, str) else words)]
        elif not check.startswith("kind:"):
            module = sys.modules[reg.get_check(check).__module__]
            for fn, frags in getattr(module, "MESSAGE_READS", {}).get(check, {}).items():
                out += [(c["id"], fn, f) for f in frags]
    return out


@pytest.mark.parametrize("method", SPECS)
def test_every_message_fragment_a_contract_matches_is_declared_by_the_interface(method):
    """A correct implementation written from `contracts interface` alone must not fail on wording: each word or
    prefix a contract reads in an error message is one its function's `raises` declares (message_contains: the
    word, or the word followed by what the conventions say, as 'candidate 3'; message_prefix: the prefix)."""
    from engine.spec.loader import load_spec

    spec = load_spec(ROOT / "specs" / f"{method}.yaml", ROOT).data
    declared = _declared_words(spec)
    reads = _message_reads(spec)
    assert reads or method not in ("grpo", "tar-adaptive-replay"), "the walk found none: it reads nothing"
    undeclared = [(cid, fn, frag) for cid, fn, frag in reads
                  if not any(frag.lower() == w or frag.lower().startswith(w) for w in declared.get(fn, []))]
    assert undeclared == [], f"{method}: contracts read message text the interface does not declare: {undeclared}"


def test_checks_that_read_message_text_declare_it():
    """The guard on MESSAGE_READS: a check module that compares a literal with an error message (`"x" in msg`)
    lists that literal in its MESSAGE_READS, which the test above holds to the interface."""
    import ast
    import importlib

    missing = []
    for path in sorted((ROOT / "methods").glob("*/*.py")):
        text = path.read_text()
        if "registry.check(" not in text:
            continue
        literals = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and \
                    isinstance(node.left.value, str) and any(isinstance(op, ast.In) for op in node.ops):
                right = ast.unparse(node.comparators[0]).lower()
                if "msg" in right or "message" in right or "str(e" in right:
                    literals.add(node.left.value)
        if not literals:
            continue
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        reads = {f for per_fn in getattr(module, "MESSAGE_READS", {}).values() for fs in per_fn.values() for f in fs}
        missing += [(path.relative_to(ROOT).as_posix(), lit) for lit in sorted(literals - reads)]
    assert missing == [], f"message text read but not in the module's MESSAGE_READS: {missing}"


# --- every rule the contracts hold an implementation to is in the interface, generated from the spec -------------

_SYM = {"le": "<=", "lt": "<", "ge": ">=", "gt": ">", "eq": "="}


def _threshold(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return repr(v) if isinstance(v, float) else str(v)


def _missing_rules(text: str, spec: dict) -> list[str]:
    """What of the spec's contracts the interface text does not state: each contract a candidate is held to, by
    its description and every expectation (metric, comparison, threshold, dtype, note); each it is not held to;
    and the limits every check runs under."""
    missing = []
    blocks = {}
    for block in text.split("\ncontract ")[1:]:
        blocks[block.split(" ", 1)[0]] = block.split("\n\n", 1)[0]
    registered = text.split("not held to a candidate", 1)[1] if "not held to a candidate" in text else ""
    for c in spec["contracts"]:
        if c.get("applies_to", "any") == "registered":
            if f"    {c['id']}: " not in registered:
                missing.append(f"{c['id']} is not listed as not held to a candidate")
            if c["id"] in blocks:
                missing.append(f"{c['id']} is stated as a rule a candidate is held to")
            continue
        block = blocks.get(c["id"])
        if block is None:
            missing.append(f"no rule for contract {c['id']}")
            continue
        if c["description"] not in block:
            missing.append(f"{c['id']}: its description")
        for e in c["expect"]:
            op = next(k for k in _SYM if k in e)
            rule = f"holds {e['metric']} {_SYM[op]} {_threshold(e[op])}" + (f" for {e['dtype']}" if "dtype" in e else "")
            line = next((ln for ln in block.splitlines() if ln.strip().startswith(rule + " (") or ln.strip() == rule),
                        None)
            if line is None:
                missing.append(f"{c['id']}: {rule}")
            elif e.get("note") and e["note"] not in line:
                missing.append(f"{c['id']}: the note of {rule}")
            elif op == "eq" and "exactly" not in line:
                missing.append(f"{c['id']}: {rule} is not said to be exact")
    b = spec["budget"]
    for needle in (f"within {b['per_contract_timeout_seconds']} s", f"within {b['max_wall_seconds']} s",
                   f"at most {b['max_updates_per_seed']} optimizer updates"):
        if needle not in text:
            missing.append(f"limit: {needle}")
    return missing


def _rules_json(method: str) -> dict:
    return _interface(method)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_interface_lists_every_rule_the_contracts_check(method):
    from ruamel.yaml import YAML

    text = runner.invoke(app, ["interface", method]).stdout
    spec = YAML(typ="safe").load((ROOT / "specs" / f"{method}.yaml").read_text())
    assert _missing_rules(text, spec) == []
    # the parameters each rule states are the contract's own, and --json carries the same rules
    data = _interface(method)
    held = [c for c in spec["contracts"] if c.get("applies_to", "any") == "any"]
    assert [r["contract"] for r in data["rules"]] == [c["id"] for c in held]
    for r, c in zip(data["rules"], held):
        assert json.loads(json.dumps(r["params"])) == json.loads(json.dumps(c.get("params") or {}))
        assert [e["rule"] for e in r["expect"]] and len(r["expect"]) == len(c["expect"])
    assert [r["contract"] for r in data["registered_only"]] == [
        c["id"] for c in spec["contracts"] if c.get("applies_to") == "registered"]
    # a budget contract states its memory unit in bytes and its operation limit
    for r in data["rules"]:
        if any(e["metric"] == "peak_memory_ratio" for e in r["expect"]):
            assert r["unit"] and f"memory unit: {r['unit']}" in text
        if "max_ops" in r["params"]:
            assert f"operation limit: {r['params']['max_ops']} ATen operations" in text


def test_a_rule_left_out_of_the_interface_is_found():
    from ruamel.yaml import YAML

    text = runner.invoke(app, ["interface", "tapo-trajectory"]).stdout
    spec = YAML(typ="safe").load((ROOT / "specs" / "tapo-trajectory.yaml").read_text())
    # planted: one expectation line dropped, one contract's block dropped, the registered-only list dropped
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("holds eps_hi_abs_err <= 6e-08 for float32"))
    assert any("eps_hi_abs_err <= 6e-08 for float32" in m for m in _missing_rules(text.replace(line + "\n", ""), spec))
    cut = text.split("\ncontract overflow_gradient ", 1)
    dropped = cut[0] + "\n" + cut[1].split("\n\n", 1)[1]
    assert "no rule for contract overflow_gradient" in _missing_rules(dropped, spec)
    assert any("not listed" in m for m in _missing_rules(text.split("not held to a candidate")[0], spec))


def test_the_interface_answers_what_implementers_had_to_guess():
    tapo = runner.invoke(app, ["interface", "tapo-trajectory"]).stdout
    assert "a token exactly on a bound keeps -A_t R~_t / N" in tapo
    assert "a group whose rows have no valid token at all is such a group" in tapo
    assert "never 0 * inf = NaN" in tapo and "not bit for bit" in tapo
    mrtpo = runner.invoke(app, ["interface", "mrtpo"]).stdout
    assert "credit_weights refuses them too" in mrtpo and "credit_weights_from_logits and mrtpo_advantages accept" in mrtpo
    assert "float64 when it is float64, else float32, whatever logp_loo's dtype" in mrtpo
    assert "A 0/1 integer or floating tensor means the same as the bool one" in mrtpo
    tar = runner.invoke(app, ["interface", "tar-adaptive-replay"]).stdout
    assert "PAD (id 0)" in tar and "the lowest prompt id first, then the lowest candidate index" in tar
    assert "a 0-d tensor included" in tar and "before the conversion to the compute dtype" in tar
    assert "0 log 0 = 0" in tar
