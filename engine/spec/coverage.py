"""Interface coverage: which promise a spec's interface declares that no contract case exercises.

The promises are derived from the `interface:` section alone, mechanically:

  function   F             a contract calls F
  knob       F(a!=d)       an argument with a default d: a judged case passes another value
  default    F(a=d)        the same argument left out (or passed as d) by a judged case
  value      F(a='v')      each value an argument declares in `values:` (a mode, an enum)
  shape      F(a:[B, L])   each shape form of an argument whose `shape` offers several ("[B] or [B, L]")
  dtype      F[float16]    each floating dtype F's arguments accept: a contract calling F runs in it
  junk       F(a junk)     an argument declared `junk: true` (masked entries are never read): a masked_junk
                           case plants junk there, or a refusal case accepts NaN/inf (or its masked_fill)
                           there with the same answer; per shape form when the argument has several
  mask       F(a 0/1 float), F(a 0/1 integer)
                           an argument whose dtype says a 0/1 mask of any real dtype is accepted: a judged
                           case passes it as a floating and as an integer 0/1 tensor (the integer form alone
                           where the dtype says 'integer 0/1' and names no floating dtype)
  refusal    F raises #i   each `raises` entry: a refusal row on F raises that type, mutating an argument
                           the entry's `when` names (any, when it names none), with one of its message words
  key        F.k           each key of a returned dict: a contract reads it

A required argument is exercised with its function (no call leaves it out), so it is no promise of its own.

How a case exercises a promise is read from the contract's parameters: a call site is any mapping with a
`function:` (the contract's own call, `calls`, `also`, `before`, `equals_call`, a closed form's examples),
bound to the interface's arguments by position and keyword; a judged case is one whose result the contract
compares with something (every kind but refusal, whose accepted rows are judged only with `same`,
`same_as`, `reference` or `returns`). A registered check (mechanism, bespoke) says what it calls in the
contract's `exercises:` list: `F` (a function, in the contract's dtypes), `F(arg)` (an optional argument given
another value than its default) and `F.key` (a key of its returned dict, read and checked).

Read-only and torch-free: `contracts validate --coverage` runs it on validated spec data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

FLOATS = ("float16", "bfloat16", "float32", "float64")
CATEGORIES = ("function", "knob", "default", "value", "shape", "dtype", "junk", "mask", "refusal", "key")
_FLOAT_CASTS = {"float", "float64", "float32", "float16", "bfloat16"}
_INT_CASTS = {"long", "int64", "int32"}
_JUDGED_ROW = ("same", "same_as", "reference", "returns")
_UNKNOWN = object()  # a value the spec cannot say statically (a generator's input, a drawn tensor)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Promise:
    """One declared promise: `id` names it (stable, short), `by` the contracts that exercise it (empty: a gap)."""

    id: str
    category: str
    function: str
    text: str
    by: tuple[str, ...] = ()

    @property
    def covered(self) -> bool:
        return bool(self.by)

    def as_dict(self) -> dict:
        return {"id": self.id, "category": self.category, "function": self.function, "text": self.text,
                "covered": self.covered, "by": list(self.by)}


@dataclass
class Report:
    method: str
    declared: bool  # False: the spec has no interface section (nothing to cover)
    promises: list[Promise] = field(default_factory=list)

    @property
    def gaps(self) -> list[Promise]:
        return [p for p in self.promises if not p.covered]

    @property
    def percent(self) -> float:
        n = len(self.promises)
        return 100.0 if n == 0 else 100.0 * (n - len(self.gaps)) / n

    def as_dict(self) -> dict:
        return {"method": self.method, "interface": self.declared, "promises": len(self.promises),
                "covered": len(self.promises) - len(self.gaps), "percent": round(self.percent, 2),
                "gaps": [p.as_dict() for p in self.gaps],
                "by_category": {c: {"promises": sum(p.category == c for p in self.promises),
                                    "gaps": sum(p.category == c and not p.covered for p in self.promises)}
                                for c in CATEGORIES if any(p.category == c for p in self.promises)},
                "all": [p.as_dict() for p in self.promises]}


# --- reading the interface ------------------------------------------------------------------------------------


def float_dtypes(text: str | None, by_name: dict[str, set[str]] | None = None) -> set[str]:
    """The floating dtypes an argument's `dtype` text names ('float16, bfloat16, float32 or float64'); 'floating'
    alone (any floating dtype) is all four; 'same as X' is X's."""
    if not text:
        return set()
    low = text.lower()
    named = {d for d in FLOATS if re.search(rf"(?<![a-z0-9]){d}(?![0-9])", low)}
    if named:
        return named
    same = re.match(r"\s*same as ([a-z_][a-z0-9_]*)", low)
    if same and by_name is not None:
        return set(by_name.get(same.group(1), set()))
    if "floating" in low:
        return set(FLOATS)
    return set()


def accepts_01_mask(arg: dict) -> bool:
    """An argument whose dtype text accepts a 0/1 tensor of another dtype than bool ('bool (or 0/1 of any real
    dtype)')."""
    return "0/1" in (arg.get("dtype") or "")


def mask_forms(arg: dict) -> tuple[str, ...]:
    """The non-bool 0/1 forms an argument accepts: float and integer, or integer alone where its dtype text names
    integers and no floating dtype ('bool or integer 0/1': a floating 0/1 tensor is refused, not a promise)."""
    if not accepts_01_mask(arg):
        return ()
    low = (arg.get("dtype") or "").lower()
    if "integer" in low and not re.search(r"real|float|floating", low):
        return ("integer",)
    return ("float", "integer")


def parse_default(text: str | None) -> Any:
    """A declared default as a Python value (the schema allows None, True, False, a number, torch.<name> or a
    quoted word); torch.<name> stays the text 'torch.<name>'."""
    if text is None:
        return _UNKNOWN
    if text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    if text.startswith("'") and text.endswith("'"):
        return text[1:-1]
    if text.startswith("torch."):
        return text
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def shape_forms(text: str | None) -> list[str]:
    """The distinct ranks of an argument's shape text when it offers several ('[B] or [B, L]' -> ['[B]',
    '[B, L]']); [] when it offers one."""
    if not text:
        return []
    seen: dict[int, str] = {}
    for m in re.finditer(r"\[([^\[\]]*)\]", text):
        inner = m.group(1).strip()
        rank = 0 if not inner else inner.count(",") + 1
        seen.setdefault(rank, f"[{inner}]")
    return [seen[r] for r in sorted(seen)] if len(seen) > 1 else []


def _rank_of(form: str) -> int:
    inner = form[1:-1].strip()
    return 0 if not inner else inner.count(",") + 1


def _names_in(text: str) -> set[str]:
    return set(_WORD.findall(text or ""))


def _mentions(text: str, name: str) -> bool:
    """Whether `text` names argument `name` as a word (its plural or singular too: 'advantage', 'advantages')."""
    words = _names_in(text)
    return name in words or name + "s" in words or (name.endswith("s") and name[:-1] in words)


# --- reading the contracts: call sites ------------------------------------------------------------------------


@dataclass
class Site:
    """One call of an interface function in a contract: what it binds and whether its answer is judged."""

    contract: dict
    function: str
    args: list  # positional: input names (str) or literals ({"value": v}) or raw literals (closed form)
    kwargs: dict
    judged: bool
    raw_literals: bool = False  # closed form: args are literals as written, not input names
    keys: set[str] = field(default_factory=set)  # keys of the result this site reads
    passes_dtype: bool = False  # the kind passes dtype= and device= (closed form's device_kwargs)


def _tensors(contract: dict) -> dict:
    return (((contract.get("params") or {}).get("inputs") or {}).get("tensors") or {})


def _has_generator(contract: dict) -> bool:
    return bool(((contract.get("params") or {}).get("inputs") or {}).get("generator"))


def _entries(spec: dict) -> list[dict]:
    if not isinstance(spec, dict):
        return []
    return [e for c in spec["cycle"] for e in _entries(c)] if "cycle" in spec else [spec]


def _input_values(contract: dict, name: str) -> list[Any]:
    """What an input can be in a case: None, the default (OMIT), a float, or _UNKNOWN (a tensor, an int from a
    dim, a generator's input)."""
    spec = _tensors(contract).get(name)
    if spec is None:
        return [_UNKNOWN]
    out = []
    for e in _entries(spec):
        if e.get("none"):
            out.append(None)
        elif e.get("omit"):
            out.append(_OMIT)
        elif "scalar" in e:
            out.append(float(e["scalar"]))
        else:
            out.append(_UNKNOWN)
    return out


class _Omitted:
    def __repr__(self) -> str:
        return "OMIT"


_OMIT = _Omitted()


def _input_shapes(contract: dict, name: str) -> set[int] | None:
    """The ranks an input takes over its cycle; None when a named Python generator draws it (any rank)."""
    spec = _tensors(contract).get(name)
    if spec is None and _has_generator(contract):
        return None
    out = set()
    for e in _entries(spec or {}):
        if isinstance(e.get("shape"), list):
            out.add(len(e["shape"]))
        elif "values" in e:  # a literal tensor: its nesting depth
            depth, v = 0, e["values"]
            while isinstance(v, list):
                depth, v = depth + 1, (v[0] if v else None)
            out.add(depth)
    return out


def _takes(contract: dict, name: str, rank: int | None) -> bool:
    ranks = _input_shapes(contract, name)
    return rank is None or ranks is None or rank in ranks


def _input_dtypes(contract: dict, name: str) -> set[str]:
    spec = _tensors(contract).get(name)
    return {e["dtype"] for e in _entries(spec or {}) if e.get("dtype")}


def sites(contract: dict) -> list[Site]:
    """Every call of an interface function a contract makes (refusal rows apart: `refusal_rows`)."""
    params = contract.get("params") or {}
    kind = contract.get("kind")
    judged = kind != "refusal"
    out: list[Site] = []
    if kind == "closed_form" and isinstance(params.get("function"), str):
        for ex in params.get("examples") or []:
            out.append(Site(contract, params["function"], list(ex.get("args") or []), dict(ex.get("kwargs") or {}),
                            True, raw_literals=True, passes_dtype=bool(ex.get("device_kwargs"))))
        return out
    skip = {"refuse", "accept", "inputs", "examples"}
    stack: list[Any] = [params]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        fn = node.get("function")
        if isinstance(fn, str) and "implementation" not in node:  # equals_call on another implementation: not ours
            site = Site(contract, fn, list(node.get("args") or []), dict(node.get("kwargs") or {}), judged)
            if isinstance(node.get("key"), str):
                site.keys.add(node["key"])
            out.append(site)
        for k, v in node.items():
            if k not in skip and isinstance(v, (dict, list)):
                stack.append(v)
    main = next((s for s in out if s.function == params.get("function") and s.args == list(params.get("args") or [])),
                None)
    if main is not None:
        ka = params.get("keys_agree")
        if isinstance(ka, dict):
            main.keys.update(k for k in ka.get("keys") or [] if isinstance(k, str))
        times = params.get("times")
        if isinstance(times, dict) and isinstance(times.get("key"), str):
            main.keys.add(times["key"])
        if "metrics_output" in params:  # a reference's scalars, each judged as KEY_abs_err against the reported KEY
            main.keys.update(e["metric"][: -len("_abs_err")] for e in contract.get("expect") or []
                             if str(e.get("metric", "")).endswith("_abs_err"))
        if kind == "split_merge" and isinstance(params.get("weight"), str) and "metrics_output" in params:
            main.keys.add(params["weight"])
    return out


@dataclass
class Row:
    """One refusal row: the call it makes, the arguments it mutates and how."""

    contract: dict
    function: str
    site: Site
    refuse: bool
    mutations: list[dict]

    @property
    def raises(self) -> str:
        return next((m["raises"] for m in self.mutations if "raises" in m), "ValueError")  # the kind's default

    @property
    def match(self) -> list[str]:
        out: list[str] = []
        for m in self.mutations:
            v = m.get("match")
            out += [v] if isinstance(v, str) else list(v or [])
        return out

    @property
    def judged(self) -> bool:
        return any(k in m for m in self.mutations for k in _JUDGED_ROW)


def refusal_rows(contract: dict) -> list[Row]:
    if contract.get("kind") != "refusal":
        return []
    params = contract.get("params") or {}
    base = Site(contract, params.get("function", ""), list(params.get("args") or []),
                dict(params.get("kwargs") or {}), False)
    named = {n: Site(contract, c["function"], list(c.get("args") or []), dict(c.get("kwargs") or {}), False)
             for n, c in (params.get("calls") or {}).items() if isinstance(c, dict) and "function" in c}
    out = []
    for refuse, table in ((True, params.get("refuse") or []), (False, params.get("accept") or [])):
        for row in table:
            muts = [m for m in (row if isinstance(row, list) else [row]) if isinstance(m, dict)]
            call = next((m["call"] for m in muts if "call" in m), None)
            site = named.get(call, base) if call else base
            out.append(Row(contract, site.function, site, refuse, muts))
    return out


# --- binding a site's arguments to the interface's -------------------------------------------------------------


def _positional(fn: dict) -> list[dict]:
    return [a for a in fn["args"] if a.get("kind", "positional") == "positional"]


def bound(site: Site, fn: dict) -> dict[str, Any]:
    """Interface argument name -> what the site passes (an input name, {"value": v}, or a raw literal)."""
    pos = _positional(fn)
    out: dict[str, Any] = {}
    for i, a in enumerate(site.args):
        if i < len(pos):
            out[pos[i]["name"]] = a
    names = {a["name"] for a in fn["args"]}
    for k, v in site.kwargs.items():
        if k in names:
            out[k] = v
    if site.passes_dtype:
        for k in ("dtype", "device"):
            if k in names:
                out[k] = {"value": _UNKNOWN}
    return out


def _values(site: Site, passed: Any) -> list[Any]:
    if site.raw_literals:
        return [passed]
    if isinstance(passed, dict):
        return [passed.get("value")]
    if isinstance(passed, str):
        return _input_values(site.contract, passed)
    return [_UNKNOWN]


def _arg_of(site: Site, fn: dict, name: str) -> str | None:
    """The interface argument a refusal row's `arg` names: an input the site binds, a keyword, or a position."""
    b = bound(site, fn)
    for arg, passed in b.items():
        if passed == name:
            return arg
    names = [a["name"] for a in fn["args"]]
    if name in names:
        return name
    if name.isdigit() and int(name) < len(_positional(fn)):
        return _positional(fn)[int(name)]["name"]
    return None


def _differs(value: Any, default: Any) -> bool:
    if value is _OMIT:
        return False
    if value is _UNKNOWN or default is _UNKNOWN:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return value is not default
    if isinstance(default, (int, float)) and isinstance(value, (int, float)):
        return float(value) != float(default)
    return value != default


# --- the report ------------------------------------------------------------------------------------------------


def report(data: dict) -> Report:
    """Every promise of a validated spec's interface, with the contracts that exercise it."""
    section = data.get("interface")
    method = data.get("method", "?")
    if not section:
        return Report(method, False)
    contracts = list(data.get("contracts") or [])
    all_sites = [s for c in contracts for s in sites(c)]
    rows = [r for c in contracts for r in refusal_rows(c)]
    exercised = {c["id"]: [e for e in c.get("exercises") or [] if isinstance(e, str)] for c in contracts}
    promises: list[Promise] = []

    def add(pid: str, category: str, fname: str, text: str, by: Iterable[str]) -> None:
        promises.append(Promise(pid, category, fname, text, tuple(dict.fromkeys(by))))

    for fn in section["functions"]:
        name = fn["name"]
        fsites = [s for s in all_sites if s.function == name]
        judged = [s for s in fsites if s.judged]
        frows = [r for r in rows if r.function == name]
        declared_by = [cid for cid, ex in exercised.items() if any(_declared_function(e) == name for e in ex)]
        add(name, "function", name, f"{name} is called",
            [s.contract["id"] for s in fsites] + [r.contract["id"] for r in frows] + declared_by)

        accepted = [r for r in frows if not r.refuse and r.judged]
        by_name: dict[str, set[str]] = {}
        for a in fn["args"]:
            by_name[a["name"]] = float_dtypes(a.get("dtype"), by_name)

        for a in fn["args"]:
            an = a["name"]
            if "default" in a:
                default = parse_default(a["default"])
                other, same = [], []
                for s in judged:
                    b = bound(s, fn)
                    if an not in b:
                        same.append(s.contract["id"])
                        continue
                    vals = _values(s, b[an])
                    if any(_differs(v, default) for v in vals):
                        other.append(s.contract["id"])
                    if any(not _differs(v, default) for v in vals):
                        same.append(s.contract["id"])
                for r in accepted:
                    m = next((m for m in r.mutations if _arg_of(r.site, fn, str(m.get("arg"))) == an), None)
                    if m is not None and "value" in m and _differs(m["value"], default):
                        other.append(r.contract["id"])
                    elif (m is not None and m.get("omit")) or (m is None and an not in bound(r.site, fn)):
                        same.append(r.contract["id"])  # left out: the judged answer is the default's
                other += [cid for cid, ex in exercised.items() if f"{name}({an})" in ex]
                add(f"{name}({an}!={a['default']})", "knob", name, f"{an} given another value than {a['default']}",
                    other)
                add(f"{name}({an}={a['default']})", "default", name, f"{an} left at its default {a['default']}",
                    same)
            for v in a.get("values") or []:
                default = parse_default(a.get("default"))
                using = []
                for s in judged:
                    b = bound(s, fn)
                    vals = _values(s, b[an]) if an in b else [_OMIT]
                    if any((x is _OMIT and "default" in a and not _differs(v, default)) or
                           (x is not _OMIT and x is not _UNKNOWN and not _differs(x, v)) for x in vals):
                        using.append(s.contract["id"])
                add(f"{name}({an}={v!r})", "value", name, f"{an} = {v!r}", using)
            for form in shape_forms(a.get("shape")):
                rank = _rank_of(form)
                using = []
                for s in judged + accepted_sites(accepted, fn, an):
                    passed = bound(s, fn).get(an)
                    if isinstance(passed, str) and _takes(s.contract, passed, rank):
                        using.append(s.contract["id"])  # a generator's input counts for every rank: it is Python
                forms = shape_forms(a.get("shape"))
                for r in accepted:
                    for m in r.mutations:
                        if _arg_of(r.site, fn, str(m.get("arg"))) != an:
                            continue
                        if isinstance(m.get("from"), str) and "[" not in m["from"] and _takes(r.contract, m["from"], rank):
                            using.append(r.contract["id"])
                        elif m.get("items") and rank < _rank_of(forms[-1]):
                            using.append(r.contract["id"])  # a list of tensors: the per-element forms
                add(f"{name}({an}:{form})", "shape", name, f"{an} of shape {form}", using)
            if a.get("junk"):
                # per shape form: junk in the masked slots of [B, L] advantages is not junk in an empty row's [B] one
                for form in shape_forms(a.get("shape")) or [None]:
                    rank = None if form is None else _rank_of(form)
                    using = []
                    for s in judged:
                        c = s.contract
                        if c.get("kind") != "masked_junk":
                            continue
                        p = c.get("params") or {}
                        planted = set(p.get("junk_args") or []) | set(p.get("junk_rows") or [])
                        passed = bound(s, fn).get(an)
                        if passed in planted and _takes(c, passed, rank):
                            using.append(c["id"])
                    for r in accepted:
                        # accepted with the same answer: slots that hold NaN/inf (or the masked_fill) are never read
                        same = any(k in x for x in r.mutations for k in ("same", "same_as"))
                        for m in r.mutations:
                            if (same and _arg_of(r.site, fn, str(m.get("arg"))) == an
                                    and ("masked_fill" in m or m.get("fill") in ("nan", "inf", "-inf"))):
                                using.append(r.contract["id"])
                    label = f"{an}" if form is None else f"{an}:{form}"
                    add(f"{name}({label} junk)", "junk", name, f"junk in {an}'s masked entries is never read"
                        + ("" if form is None else f" ({form})"), using)
            for label in mask_forms(a):
                casts = _FLOAT_CASTS if label == "float" else _INT_CASTS
                using = []
                for s in judged:
                    passed = bound(s, fn).get(an)
                    dts = _input_dtypes(s.contract, passed) if isinstance(passed, str) else set()
                    if (label == "float" and "float" in dts) or (label == "integer" and "long" in dts):
                        using.append(s.contract["id"])
                for r in accepted:
                    for m in r.mutations:
                        if (_arg_of(r.site, fn, str(m.get("arg"))) == an and m.get("cast") in casts
                                and "fill" not in m and "value" not in m):
                            using.append(r.contract["id"])
                add(f"{name}({an} 0/1 {label})", "mask", name, f"{an} as a 0/1 {label} tensor", using)

        floats = set().union(*by_name.values()) if by_name else set()
        for dt in [d for d in FLOATS if d in floats]:
            using = [s.contract["id"] for s in judged if dt in s.contract.get("dtypes", [])]
            using += [cid for cid in declared_by if dt in next(c for c in contracts if c["id"] == cid)["dtypes"]]
            add(f"{name}[{dt}]", "dtype", name, f"inputs in {dt}", using)

        arg_names = [a["name"] for a in fn["args"]]
        for i, rz in enumerate(fn.get("raises") or []):
            named = [n for n in arg_names if _mentions(rz["when"], n)]
            words = [w.lower() for w in rz.get("message_contains") or []]
            using = []
            for r in frows:
                if not r.refuse or r.raises not in (rz["type"], "any"):
                    continue
                mutated = {_arg_of(r.site, fn, str(m.get("arg"))) for m in r.mutations}
                if named and not (mutated & set(named)):
                    continue
                if words and not any(w in x.lower() for x in r.match for w in words):
                    continue
                using.append(r.contract["id"])
            add(f"{name} raises #{i + 1}", "refusal", name, f"{rz['type']} when {rz['when']}", using)

        for ret in fn["returns"]:
            for k in ret.get("keys") or []:
                using = [s.contract["id"] for s in fsites if k["name"] in s.keys]
                using += [r.contract["id"] for r in frows if not r.refuse and _reads_key(r, k["name"])]
                using += [cid for cid, ex in exercised.items() if f"{name}.{k['name']}" in ex]
                add(f"{name}.{k['name']}", "key", name, f"the {ret['name']} key {k['name']!r} is read", using)
    return Report(method, True, promises)


def accepted_sites(rows: list[Row], fn: dict, arg: str) -> list[Site]:
    """Judged accepted rows whose mutation does not touch `arg`: they pass it as their call binds it."""
    out = []
    for r in rows:
        if all(_arg_of(r.site, fn, str(m.get("arg"))) != arg for m in r.mutations):
            out.append(Site(r.contract, r.function, r.site.args, r.site.kwargs, True))
    return out


def _reads_key(row: Row, key: str) -> bool:
    for m in row.mutations:
        for ret in m.get("returns") or []:
            if key in [p for p in ret.get("path") or [] if isinstance(p, str)]:
                return True
    return False


# --- cross-references of `exercises:` (called from engine/spec/loader.py) ---------------------------------------


def _declared_function(entry: str) -> str:
    """The function an `exercises:` entry names: `F`, `F.key` or `F(arg)`."""
    return re.split(r"[.(]", entry, maxsplit=1)[0]


def reference_problems(data: dict, err) -> None:
    """A contract's `exercises:` names interface functions, their optional arguments and the keys of their
    returned dicts only."""
    section = data.get("interface")
    if not section:
        for i, c in enumerate(data.get("contracts") or []):
            if c.get("exercises"):
                err(["contracts", i, "exercises"], "exercises: names interface functions, and this spec declares "
                    "no interface", "declare the interface section, or remove exercises:")
        return
    functions = {f["name"]: {k["name"] for r in f["returns"] for k in r.get("keys") or []}
                 for f in section["functions"]}
    knobs = {f["name"]: {a["name"] for a in f["args"] if "default" in a} for f in section["functions"]}
    for i, c in enumerate(data.get("contracts") or []):
        for j, e in enumerate(c.get("exercises") or []):
            fname = _declared_function(e)
            key = e[len(fname) + 1:] if e[len(fname):].startswith(".") else ""
            arg = e[len(fname) + 1:-1] if e[len(fname):].startswith("(") else ""
            if fname not in functions:
                err(["contracts", i, "exercises", j], f"exercises names no interface function {fname!r}",
                    "use one of: " + ", ".join(sorted(functions)))
            elif key and key not in functions[fname]:
                err(["contracts", i, "exercises", j], f"{fname} returns no key {key!r}",
                    "use one of: " + (", ".join(sorted(functions[fname])) or "(it declares none)"))
            elif arg and arg not in knobs[fname]:
                err(["contracts", i, "exercises", j], f"{fname} has no argument {arg!r} with a default",
                    "use one of: " + (", ".join(sorted(knobs[fname])) or "(it declares none)"))
