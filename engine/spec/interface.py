"""The implementation interface a spec declares: what `--impl` must expose, as text, JSON and a stub.

A spec's optional `interface:` section names the functions the checks call,
each with its arguments (shape, dtype, meaning, default), returns (every key of
a returned dict) and errors (with the words a message must hold, where a
contract reads them), the conventions every function follows (which mistakes
are ValueError and which TypeError, which masks are accepted) and the objects
that are not tensors (a policy: how it is called; a rollout: what it holds).
The names must be exactly the registered implementation's functions (checked
with the spec's other references, from the static registry view), so the
interface cannot drift from the code the checks were written against. A spec
without the section still has an interface: the registered function names,
with nothing said about their arguments.

Nothing here imports torch or runs code named in a spec: the scaffold writes
defaults only from the schema's short literal forms (None, True, False, a
number, torch.<name>, a quoted word of letters, digits, _ . -), and every text
from the spec goes into a docstring escaped, never into code.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass, field
from typing import Any, Callable

POSITIONAL, KEYWORD_ONLY = "positional", "keyword-only"


@dataclass(frozen=True)
class Arg:
    name: str
    type: str
    meaning: str
    kind: str = POSITIONAL
    shape: str | None = None
    dtype: str | None = None
    default: str | None = None


@dataclass(frozen=True)
class Type:
    """An object the functions receive that is not a tensor or a number: how to use it, what it holds."""

    name: str
    summary: str
    fields: tuple[dict, ...] = ()


@dataclass(frozen=True)
class Function:
    name: str
    summary: str = ""
    args: tuple[Arg, ...] = ()
    returns: tuple[dict, ...] = ()
    raises: tuple[dict, ...] = ()
    declared: bool = True  # False: known only by name (the spec has no interface section)


@dataclass(frozen=True)
class Interface:
    method: str
    implementation: str
    description: str = ""
    functions: tuple[Function, ...] = field(default_factory=tuple)
    declared: bool = True
    conventions: tuple[dict, ...] = ()  # {topic, rule}: what every function follows
    types: tuple[Type, ...] = ()
    # Every contract a candidate is held to, as rules (engine/spec/rules.py), generated from the spec's contracts
    # so the interface cannot drift from what the checks hold; the limits every check runs under; and the
    # contracts a candidate is not held to (applies_to: registered).
    rules: tuple[dict, ...] = ()
    limits: dict = field(default_factory=dict)
    registered_only: tuple[dict, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.functions)


def from_spec(data: dict, registered: tuple[str, ...] | None = None) -> Interface:
    """The interface of a validated spec's data; without a section, the `registered` function names."""
    from engine.spec import rules as rules_mod

    held = {"rules": rules_mod.rules(data), "limits": rules_mod.limits(data),
            "registered_only": rules_mod.registered_only(data)}
    section = data.get("interface")
    if section is None:
        names = tuple(sorted(registered or ()))
        return Interface(method=data["method"], implementation=data["implementation"],
                         functions=tuple(Function(name=n, declared=False) for n in names), declared=False, **held)
    functions = []
    for f in section["functions"]:
        args = tuple(Arg(name=a["name"], type=a["type"], meaning=a["meaning"], kind=a.get("kind", POSITIONAL),
                         shape=a.get("shape"), dtype=a.get("dtype"), default=a.get("default")) for a in f["args"])
        functions.append(Function(name=f["name"], summary=f["summary"], args=args,
                                  returns=tuple(dict(r) for r in f["returns"]),
                                  raises=tuple(dict(r) for r in f.get("raises", []))))
    return Interface(method=data["method"], implementation=data["implementation"],
                     description=section.get("description", ""), functions=tuple(functions),
                     conventions=tuple(dict(c) for c in section.get("conventions", [])) + audited(data),
                     types=tuple(Type(name=ty["name"], summary=ty["summary"],
                                      fields=tuple(dict(f) for f in ty.get("fields", [])))
                                 for ty in section.get("types", [])), **held)


def audited(data: dict) -> tuple[dict, ...]:
    """The rules the supervisor holds every function to in the mechanism runs, as conventions, from the spec's
    gradient_audit and reported_metrics contracts (their tolerances stated once, in the contracts)."""
    out = []
    for c in data.get("contracts") or []:
        p = c.get("params") or {}
        if c.get("kind") == "gradient_audit":
            tol = "; ".join(f"{d}: cosine >= {t.get('min_cosine', 'default')}, relative error <= "
                            f"{t.get('max_rel_err', 'default')}, values within {t.get('max_value_err', 'default')}"
                            for d, t in (p.get("tolerances") or {}).items())
            out.append({"topic": "audited gradients", "rule": (
                "A policy a function is given stays with the checks (it crosses as a handle; calling it runs the "
                "checks' own module). Whatever a function returns is held to the Policy type's declared scoring "
                "(temperature-1 log_softmax of the logits, the logits at position i giving token i + 1): in every "
                f"update of every arm of the mechanism run {p.get('run')} the values a loss reads must equal the "
                "supervisor's own scoring of the same tokens, and the gradient the backward leaves in the policy's "
                "parameters (a function's own vector-Jacobian product, where it scored the policy) must equal the "
                "supervisor's autograd of that scoring with the same upstream gradient, by cosine and relative "
                f"error ({tol}; contract {c['id']}). Every other contract's runs are held to the same tolerances.")})
        elif c.get("kind") == "arm_audit":
            for a in p.get("arms") or []:
                loss = a.get("loss") or {}
                args = ", ".join(f"{k}={v}" for k, v in (loss.get("args") or {}).items()) or "its defaults"
                adv = a.get("advantages")
                adv_text = (f"; its advantages equal {adv.get('reference')} of the recorded rewards "
                            f"({', '.join(f'{k}={v}' for k, v in (adv.get('args') or {}).items())})" if adv else "")
                opt = a.get("optimiser") or {}
                out.append({"topic": f"audited arm {a.get('arm')}", "rule": (
                    f"In every update of arm {a.get('arm')} of the mechanism run {p.get('run')} the loss must equal "
                    f"the {a.get('spec')} spec's float64 reference {loss.get('reference')} ({args}) of the tensors "
                    f"it was computed from{adv_text}; the behaviour log-probs, and every scoring the run keeps of "
                    "its policy (a replay snapshot, a bank's base), equal a rescoring from the policy's weights as "
                    f"they were when it sampled; each update moves the arm's parameters ({opt.get('name')}, lr "
                    f"{opt.get('lr')}), {a.get('updates')} updates per seed (contract {c['id']}).")})
        elif c.get("kind") == "reported_metrics":
            req = ", ".join(p.get("required") or []) or "none"
            out.append({"topic": "reported metrics", "rule": (
                "A metrics dict a function returns is its report, never a measurement: the mechanism runs compute "
                "every figure they judge (ratio extremes, clip counts, gates, the cap) from the tensors that "
                f"crossed, and each reported key is checked against the supervisor's figure for the same update "
                f"(contract {c['id']}; required keys: {req}).")})
    return tuple(out)


# --- validation (called from engine/spec/loader.py reference_errors) ----------------------


def reference_problems(data: dict, registered: tuple[str, ...] | None,
                       err: Callable[[list, str, str], None]) -> None:
    """Report, through `err(json_path, message, fix)`, an interface that is not the registered implementation's
    or that no Python signature could have (duplicate names, a keyword, a required argument after a default)."""
    section = data.get("interface")
    if section is None:
        return
    impl = data["implementation"]
    seen: set[str] = set()
    for i, f in enumerate(section["functions"]):
        name = f["name"]
        if name in seen:
            err(["interface", "functions", i, "name"], f"function {name!r} is declared twice", "declare it once")
        seen.add(name)
        if registered is not None and name not in registered:
            err(["interface", "functions", i, "name"], f"implementation {impl!r} has no function {name!r}",
                f"declare only its functions: {', '.join(sorted(registered)) or '(none)'}")
        _signature_problems(f, ["interface", "functions", i], err)
    if registered is not None:
        lacking = sorted(set(registered) - seen)
        if lacking:
            err(["interface", "functions"], f"the interface lacks function(s) {', '.join(lacking)} of "
                f"implementation {impl!r}", "declare every function the checks call")


def _signature_problems(f: dict, at: list, err: Callable[[list, str, str], None]) -> None:
    if keyword.iskeyword(f["name"]):
        err(at + ["name"], f"{f['name']!r} is a Python keyword", "use another function name")
    names: set[str] = set()
    kw_seen = default_seen = False
    for j, a in enumerate(f["args"]):
        where = at + ["args", j]
        if keyword.iskeyword(a["name"]):
            err(where + ["name"], f"argument name {a['name']!r} is a Python keyword", "rename the argument")
        if a["name"] in names:
            err(where + ["name"], f"argument {a['name']!r} is declared twice", "declare it once")
        names.add(a["name"])
        if a.get("kind", POSITIONAL) == KEYWORD_ONLY:
            kw_seen = True
            continue
        if kw_seen:
            err(where + ["kind"], f"positional argument {a['name']!r} follows a keyword-only one",
                "list positional arguments first")
        if "default" in a:
            default_seen = True
        elif default_seen:
            err(where, f"argument {a['name']!r} has no default but follows one that has",
                "give it a default or move it before the defaulted arguments")


# --- output -------------------------------------------------------------------------------


def as_json(iface: Interface) -> dict:
    def arg(a: Arg) -> dict:
        out = {"name": a.name, "kind": a.kind, "type": a.type}
        for k in ("shape", "dtype", "default"):
            if getattr(a, k) is not None:
                out[k] = getattr(a, k)
        out["meaning"] = a.meaning
        return out

    return {"method": iface.method, "implementation": iface.implementation, "declared": iface.declared,
            "description": iface.description, "conventions": [dict(c) for c in iface.conventions],
            "limits": dict(iface.limits), "rules": [dict(r) for r in iface.rules],
            "registered_only": [dict(r) for r in iface.registered_only],
            "types": [{"name": ty.name, "summary": ty.summary, "fields": [dict(f) for f in ty.fields]}
                      for ty in iface.types],
            "functions": [{"name": f.name, "signature": signature(f) if f.declared else None, "summary": f.summary,
                           "args": [arg(a) for a in f.args], "returns": [dict(r) for r in f.returns],
                           "raises": [dict(r) for r in f.raises]} for f in iface.functions]}


def signature(f: Function) -> str:
    """`name(a, b, c=None, *, d=torch.float64)`: the Python signature the interface declares."""
    parts: list[str] = []
    star = False
    for a in f.args:
        if a.kind == KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(a.name if a.default is None else f"{a.name}={a.default}")
    return f"{f.name}({', '.join(parts)})"


def _describe(item: Any) -> str:
    get = item.get if isinstance(item, dict) else (lambda k: getattr(item, k, None))
    shape, dtype = get("shape"), get("dtype")
    # "same as z" for both reads once, not "same as z same as z".
    bits = [b for b in ((shape, dtype) if shape != dtype else (shape,)) if b]
    return f"{get('type')}" + (f" {' '.join(bits)}" if bits else "")


def _clean(text: str) -> str:
    """Spec text as plain printable characters: no terminal control sequences."""
    return "".join(ch if ch.isprintable() or ch == "\n" else repr(ch)[1:-1] for ch in str(text))


def text_lines(iface: Interface) -> list[str]:
    """The interface for a terminal: one block per function."""
    lines = [f"{iface.method}: implementation interface (registered implementation {iface.implementation!r})"]
    if iface.description:
        lines.append(_clean(iface.description))
    if not iface.declared:
        lines.append("this spec declares no interface section: only the function names are known")
    if iface.conventions:
        lines.append("")
        lines.append("conventions (every function):")
        for c in iface.conventions:
            lines.append(f"    {c['topic']}: {_clean(c['rule'])}")
    for ty in iface.types:
        lines.append("")
        lines.append(f"type {ty.name}: {_clean(ty.summary)}")
        for fl in ty.fields:
            lines += _value_lines(fl, "    ", "")
    for f in iface.functions:
        lines.append("")
        if not f.declared:
            lines.append(f"{f.name}(...)")
            continue
        lines.append(signature(f))
        lines.append(f"    {_clean(f.summary)}")
        for a in f.args:
            lines.append(f"    {a.name}: {_clean(_describe(a))}" + (" (keyword-only)" if a.kind == KEYWORD_ONLY else "")
                         + f" - {_clean(a.meaning)}")
        for r in f.returns:
            lines += _value_lines(r, "    ", "returns ")
        for r in f.raises:
            lines.append(f"    raises {r['type']} when {_clean(r['when'])}{_clean(_message_words(r))}")
    lines += rules_text(iface)
    return lines


def rules_text(iface: Interface) -> list[str]:
    """The limits, every rule a candidate is held to, and the contracts it is not, as terminal-safe lines."""
    from engine.spec.rules import limit_lines, rule_lines

    out = []
    if iface.limits:
        out += ["", "limits (every check of an implementation runs under them):"]
        out += [f"    {_clean(x)}" for x in limit_lines(iface.limits)]
    if iface.rules:
        out += ["", f"rules: the {len(iface.rules)} contracts an implementation is held to, each expectation and "
                    "parameter as the spec states it (an equality is exact)"]
        for rule in iface.rules:
            out.append("")
            out += [_clean(x) for x in rule_lines(rule)]
    if iface.registered_only:
        out += ["", "not held to a candidate (applies_to: registered: they test how the registered implementation "
                    "is built, and run on it only):"]
        out += [f"    {_clean(r['contract'])}: {_clean(r['why'])}" for r in iface.registered_only]
    return out


def _value_lines(v: dict, indent: str, word: str) -> list[str]:
    """A returned value (or a type's field) and, for a dict, each of its keys one level deeper."""
    out = [f"{indent}{word}{v['name']}: {_clean(_describe(v))} - {_clean(v['meaning'])}"]
    for k in v.get("keys") or []:
        out += _value_lines(k, indent + "    ", "key " if v.get("type") == "dict" else "")
    return out


def _message_words(r: dict) -> str:
    """`; the message starts with "x: " and contains "a" or "b"`: only what a contract reads."""
    parts = []
    if r.get("message_prefix"):
        parts.append(f"starts with {r['message_prefix']!r}")
    if r.get("message_contains"):
        parts.append("contains " + " and ".join(repr(w) for w in r["message_contains"]))
    return f"; the message {' and '.join(parts)}" if parts else ""


# --- scaffold -----------------------------------------------------------------------------


def _doc(text: str, indent: str) -> str:
    """Spec text safe inside a triple-quoted docstring: backslashes and quotes escaped, no control characters."""
    text = _clean(text).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    if text.endswith('"'):
        text += " "
    return text.replace("\n", "\n" + indent)


def _value_doc(v: dict, indent: str) -> list[str]:
    """Docstring lines for a returned value or a field, a dict's keys one level deeper."""
    out = [f"{indent}{v['name']}: {_doc(_describe(v), indent + '    ')}. {_doc(v['meaning'], indent + '    ')}"]
    for k in v.get("keys") or []:
        out += _value_doc(k, indent + "    ")
    return out


def scaffold(iface: Interface, spec_name: str) -> str:
    """A Python module with one stub per interface function: docstrings with shapes, bodies raising
    NotImplementedError. `contracts check METHOD --impl FILE` accepts it as soon as the bodies are filled."""
    out = [
        f'"""My implementation of {iface.method}, to be checked with',
        "",
        f"    contracts check {iface.method} --impl THIS_FILE.py",
        "",
        f"Generated by `contracts scaffold {iface.method}` from {spec_name}: fill in each function body.",
    ]
    if iface.conventions:
        out += ["", "Conventions every function follows:"]
        out += [f"    {c['topic']}: {_doc(c['rule'], '        ')}" for c in iface.conventions]
    for ty in iface.types:
        out += ["", f"{ty.name}: {_doc(ty.summary, '    ')}"]
        for fl in ty.fields:
            out += _value_doc(fl, "    ")
    out += [
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "import torch",
    ]
    for f in iface.functions:
        out += ["", ""]
        if not f.declared:
            out.append(f"def {f.name}(*args, **kwargs):")
            out.append(f'    """The spec declares no interface: see how the checks call {f.name}."""')
            out.append(f'    raise NotImplementedError("{f.name}")')
            continue
        out.append(f"def {signature(f)}:")
        ind = "    "
        doc = [f'{ind}"""{_doc(f.summary, ind)}', ""]
        if f.args:
            doc.append(f"{ind}Args:")
            for a in f.args:
                doc.append(f"{ind}    {a.name}: {_doc(_describe(a), ind + '        ')}. {_doc(a.meaning, ind + '        ')}")
        doc.append("")
        doc.append(f"{ind}Returns:" + (" a tuple, in this order" if len(f.returns) > 1 else ""))
        for r in f.returns:
            doc += _value_doc(r, ind + "    ")
        if f.raises:
            doc.append("")
            doc.append(f"{ind}Raises:")
            for r in f.raises:
                doc.append(f"{ind}    {r['type']}: {_doc(r['when'] + _message_words(r), ind + '        ')}")
        doc.append(f'{ind}"""')
        out += doc
        out.append(f'{ind}raise NotImplementedError("{f.name}")')
    return "\n".join(out).rstrip() + "\n"
