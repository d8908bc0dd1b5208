"""What the strict screen lets a candidate name, derived from the allowed modules themselves at run time.

A hand-written list of torch functions goes stale with every torch release and misses what a release adds (torch
2.x carries `sys`, `os`, `builtins`, `importlib`, `ctypes` and `inspect` as plain attributes). So each allowed
module's public namespace (`vars(module)`, names without a leading underscore; `__all__` leaves out honest names
such as `torch.unique` and lists TorchScript's plumbing) is read once per process and each name sorted into:

* a module: allowed only where it is itself an allowed module (`torch.nn`, `F.torch`), else refused, whatever
  its name (`torch.sys`, `typing.sys`, `dataclasses.inspect`, `enum.bltns`, `F.np`, `rollout.paired`);
* a callable that runs text as code or reaches attributes by a computed name (the reflective built-ins,
  `operator.attrgetter`/`methodcaller`, `typing.get_type_hints`/`ForwardRef`, `functools.singledispatch`, whose
  `register` evaluates string annotations, `functools.wraps`/`update_wrapper`, which copy attributes named by
  strings, `dataclasses.make_dataclass`, whose namespace is a dict of strings), found by identity wherever it is
  re-exported;
* a class or function bound from C++ with pybind11 (told by its metaclass or function record): torch re-exports
  TorchScript's IR, compiler and zip-file serialisation from torch._C this way (`torch.CompilationUnit` compiles
  source text, `torch.import_ir_module_from_buffer` loads code, `torch.PyTorchFileWriter` writes files), while
  the tensor API is bound with torch's own C API;
* a named refusal kept from the first screen (`load`, `save`, `from_file`, `compile`, `jit`, `hub`, ...),
  `frombuffer` (tensors over Python memory the meters do not see) and `get_device_module` (returns a module);
* a metaclass (calling it builds a class, dunders included, from strings), a mutable container (`dict`, `list`,
  `set`: writing it changes the process for everyone, e.g. `copy.dispatch_table`), or a module-level `set_*`,
  `use_*` or `register_*` callable (process-wide defaults and hooks: `torch.set_default_dtype`,
  `torch.distributions.register_kl`), except `set_grad_enabled`, the grad mode a loss runs under;
* anything else: allowed, with the public attributes of the value that are one of the above recorded against
  it (`torch.Tensor.x` where x were a module). A class that subclasses `torch.Tensor`, and a class whose
  attributes Python lets anyone set (a Python class, not a built-in type), are marked for the screen.

Names a module holds only through its `__getattr__` (torch's lazily imported submodules) are not in `vars()`
and so are refused with every other name the module does not hold.

Some objects are unknown to a screen that only reads source: a function's parameters, what a call returns. On
them an attribute is refused when its name is one of:

* the interpreter's introspection attributes, read from its own types (frame, traceback, generator, coroutine,
  async generator: `gi_frame`, `f_back`, `f_globals`, `tb_frame`, ...; `send`, `throw`, `close`, `clear` stay);
* every standard-library module's name and the name under which a module from outside torch is bound in an
  allowed module or on what it exports (`np`, `bltns`, `paired`), less the methods an honest candidate calls on
  the values it handles (tensors, nn.Modules, containers, strings, numbers, dtypes, a rollout): `x.sys`,
  `x.os`, `x.inspect` are refused, `x.cpu()`, `d.copy()`, `t.select(0, i)` and `policy.eval()` are not (torch's
  own submodule names, `beta`, `kl`, `normal`, ..., lead only back to names refused here);
* the reflective built-ins' names (less those same methods), the callables above, the named refusals, `numpy`
  (a numpy array carries raw pointers, `.ctypes`, and file writers) and `obj` (an AttributeError's object can
  be a module).

What keeps this sound is the screen's tracking (engine/evolve/screen.py): every name bound to a module is known
and a module is refused anywhere but at the root of an attribute chain or as the value of an alias, so an
unknown object is never one of them; the name rule on unknown objects is the second line.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import inspect
import sys
import types
from dataclasses import dataclass, field
from typing import Any

ALLOWED_MODULES = frozenset({
    "torch", "torch.nn", "torch.nn.functional", "torch.linalg", "torch.special", "torch.fft", "torch.autograd",
    "torch.distributions",
    "math", "typing", "typing_extensions", "functools", "itertools", "dataclasses", "collections",
    "collections.abc", "numbers", "enum", "abc", "operator", "copy", "__future__",
    # the harness's scoring helper, which interfaces taking a policy (proximal_logprobs) are written against
    "methods.common.rollout",
})

# Built-in names a candidate may not use at all (any context: a call, a value, a binding): they run text as
# code, open files, import by name, reach attributes by a computed name, or read the interpreter's namespaces.
FORBIDDEN_NAMES = {
    "eval": "runs text as code", "exec": "runs text as code", "compile": "compiles text to code",
    "open": "opens files", "__import__": "imports by name", "getattr": "reaches an attribute by a computed name",
    "setattr": "sets an attribute by a computed name", "delattr": "deletes an attribute by a computed name",
    "vars": "reads an object's namespace", "globals": "reads the module's namespace",
    "locals": "reads a frame's namespace", "dir": "lists attribute names for a computed lookup",
    "breakpoint": "starts a debugger", "input": "reads the terminal", "help": "imports modules by name",
    "exit": "ends the process", "quit": "ends the process", "memoryview": "writes raw memory",
    "__builtins__": "the built-ins' namespace", "__loader__": "the module's loader", "__spec__": "the module's spec",
}
# (module, name) of callables that run text as code or reach attributes named by strings; refused by identity
# wherever an allowed module re-exports them, and by name on any object.
_DANGEROUS = (
    [("builtins", n) for n in FORBIDDEN_NAMES if not n.startswith("__") or n == "__import__"]
    + [("operator", "attrgetter"), ("operator", "methodcaller"),
       ("typing", "get_type_hints"), ("typing", "ForwardRef"),
       ("typing_extensions", "get_type_hints"), ("typing_extensions", "ForwardRef"),
       ("typing_extensions", "get_annotations"), ("typing_extensions", "evaluate_forward_ref"),
       ("inspect", "get_annotations"), ("functools", "singledispatch"), ("functools", "singledispatchmethod"),
       ("functools", "update_wrapper"), ("functools", "wraps"), ("dataclasses", "make_dataclass")])
_DANGEROUS_WHY = {
    "attrgetter": "reaches attributes named by strings", "methodcaller": "calls methods named by strings",
    "get_type_hints": "evaluates string annotations as code", "ForwardRef": "evaluates a string as code",
    "get_annotations": "evaluates string annotations as code", "evaluate_forward_ref": "evaluates a string as code",
    "singledispatch": "its register() evaluates string annotations as code",
    "singledispatchmethod": "its register() evaluates string annotations as code",
    "update_wrapper": "copies attributes named by strings", "wraps": "copies attributes named by strings",
    "make_dataclass": "builds a class from a namespace of strings",
}
# Kept from the first screen (torch functions that load or run code, read or write files, reach native
# internals), with frombuffer/from_buffer (tensors over Python memory) and numpy (raw pointers, file writers).
NAMED_REFUSALS = {
    **dict.fromkeys(("load", "save", "from_file", "compile", "jit", "hub", "ops", "utils", "classes", "library",
                     "package", "cpp_extension", "fx", "export", "multiprocessing", "distributed", "_C", "_dynamo",
                     "_inductor"), "loads, saves, compiles or reaches torch internals"),
    "frombuffer": "a tensor over Python memory that no meter counts",
    "from_buffer": "a tensor over Python memory that no meter counts",
    "numpy": "a numpy array carries raw pointers (.ctypes) and file writers (.tofile, .dump)",
    "obj": "an AttributeError's object can be a module",
    "get_device_module": "returns a module",
}
# Process-wide state a loss has no business changing; the grad mode is the one it runs under.
_STATE_PREFIXES = ("set_", "use_", "register_")
_STATE_KEPT = frozenset({"set_grad_enabled"})
# Introspection types whose attributes lead to frames (and from a frame to every module's globals).
_INTROSPECTION_TYPES = (types.FrameType, types.TracebackType, types.GeneratorType, types.CoroutineType,
                        types.AsyncGeneratorType)
_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: built-in and extension types refuse attribute writes
_INTROSPECTION_KEPT = frozenset({"send", "throw", "close", "clear", "asend", "athrow", "aclose"})


@dataclass(frozen=True)
class Entry:
    """One public name of an allowed module: a module (`module` names it), a refusal (`why`), or a value."""

    module: str | None = None
    why: str | None = None
    value: Any = None
    tensor_class: bool = False
    mutable_class: bool = False  # a class whose attributes Python lets anyone set (torch.Tensor, nn.Module)
    refused_attrs: dict = field(default_factory=dict)  # attribute of this value -> why it is refused


@dataclass(frozen=True)
class Atlas:
    """Everything the screen looks up, derived once per process (`atlas()`)."""

    modules: dict  # allowed module -> {public name -> Entry}
    passthrough: frozenset  # packages on the way to an allowed module only (methods, methods.common)
    unknown: dict  # attribute name -> why it is refused on an object the screen cannot name
    builtins: dict  # built-in name -> Entry (the built-in classes and functions a candidate may use)
    missing: frozenset = frozenset()  # allowed modules this Python cannot import (their names are all refused)


def _dangerous() -> dict[int, str]:
    out = {}
    for mod, name in _DANGEROUS:
        try:
            obj = getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError):
            continue
        out[id(obj)] = FORBIDDEN_NAMES.get(name) or _DANGEROUS_WHY[name]
    return out


def _is_metaclass(v: Any) -> bool:
    return isinstance(v, type) and issubclass(v, type)


def _is_mutable_class(v: Any) -> bool:
    return isinstance(v, type) and not v.__flags__ & _IMMUTABLE_TYPE


def _is_binding(v: Any) -> bool:
    """A class or function bound from C++ with pybind11: TorchScript's IR, compiler and serialisation (torch
    re-exports them from torch._C), not the tensor API, which torch binds with its own C API."""
    if isinstance(v, type):
        return type(v).__name__ == "pybind11_type"
    return isinstance(v, types.BuiltinFunctionType) and \
        type(getattr(v, "__self__", None)).__name__.startswith("pybind11_")


def _is_mutable(v: Any) -> bool:
    return isinstance(v, (dict, list, set, bytearray))


def _attrs(value: Any) -> dict:
    """A value's own public attributes, read without running descriptors or __getattr__ (the class's MRO for a
    class, the instance's dict and its class for anything else)."""
    out: dict = {}
    owners = list(value.__mro__) if isinstance(value, type) else [type(value)]
    if not isinstance(value, type):
        try:
            out.update({k: v for k, v in vars(value).items() if isinstance(k, str)})
        except Exception:  # noqa: BLE001 - no instance dict (or a hostile one): its class still counts
            pass
    for klass in reversed(owners):
        try:
            ns = vars(klass)
        except TypeError:
            continue
        for k, v in ns.items():
            if isinstance(k, str) and k not in out:
                out[k] = v
    return {k: (v.__func__ if isinstance(v, (staticmethod, classmethod)) else v) for k, v in out.items()
            if not k.startswith("_")}


def _refusal_on_value(v: Any, dangerous: dict[int, str], allowed: frozenset) -> str | None:
    if inspect.ismodule(v):
        mod = getattr(v, "__name__", "?")
        return None if mod in allowed else f"is the module {mod}, outside the allowlist"
    if id(v) in dangerous:
        return dangerous[id(v)]
    if _is_mutable(v):
        return "a mutable container of the module (writing it changes the process for every caller)"
    return None


def _module_table(modname: str, mod: types.ModuleType, dangerous: dict[int, str], tensor: type | None,
                  allowed: frozenset) -> tuple[dict, dict]:
    """(name -> Entry, module-name refusals found on its values)."""
    table, found = {}, {}
    for name, v in list(vars(mod).items()):
        if not isinstance(name, str) or name.startswith("_") or not name.isidentifier():
            continue
        if inspect.ismodule(v):
            target = v.__name__
            if target in allowed:
                table[name] = Entry(module=target)
            else:
                table[name] = Entry(why=f"is the module {target}, outside the allowlist")
                if target.split(".")[0] != "torch":  # torch's own submodules lead back to the names refused here
                    found.setdefault(name, f"names the module {target} (as {modname}.{name})")
            continue
        why = dangerous.get(id(v)) or NAMED_REFUSALS.get(name)
        if why is None and _is_binding(v):
            why = "a C++ binding of TorchScript's runtime (IR, compiler, serialisation, dispatch), not the tensor API"
        if why is None and _is_metaclass(v):
            why = "a metaclass: calling it builds a class (dunders included) from strings"
        if why is None and _is_mutable(v):
            why = "a mutable container of the module (writing it changes the process for every caller)"
        if why is None and callable(v) and name.startswith(_STATE_PREFIXES) and name not in _STATE_KEPT:
            why = "changes process-wide state (defaults, hooks, registries) the checks run under"
        if why is not None:
            table[name] = Entry(why=why)
            continue
        refused = {}
        for attr, av in _attrs(v).items():
            r = _refusal_on_value(av, dangerous, allowed)
            if r is not None:
                refused[attr] = r
                if inspect.ismodule(av) and av.__name__.split(".")[0] != "torch":
                    found.setdefault(attr, f"names the module {av.__name__} (on {modname}.{name})")
        table[name] = Entry(value=v, tensor_class=bool(tensor is not None and isinstance(v, type)
                                                       and issubclass(v, tensor)),
                            mutable_class=_is_mutable_class(v), refused_attrs=refused)
    return table, found


def _everyday(tables: dict) -> set[str]:
    """Attribute names of the values an honest candidate handles: never refused on an unknown object."""
    kinds: list[Any] = [object, int, float, complex, bool, str, bytes, list, tuple, dict, set, frozenset, range,
                        slice, BaseException]
    for modname, names in (("torch", ("Tensor", "dtype", "device", "Size", "Generator", "finfo", "iinfo")),
                           ("torch.nn", ("Module", "Parameter")), ("torch.distributions", ("Distribution",)),
                           ("methods.common.rollout", ("Rollout",))):
        for n in names:
            e = tables.get(modname, {}).get(n)
            if e is not None and e.value is not None:
                kinds.append(e.value)
    return {n for k in kinds for n in dir(k) if not n.startswith("_")}


@functools.lru_cache(maxsize=1)
def atlas() -> Atlas:
    """The derived allowlist; imports the allowed modules (torch among them) on first use, then cached."""
    allowed = ALLOWED_MODULES
    dangerous = _dangerous()
    passthrough = frozenset(".".join(m.split(".")[:i]) for m in allowed for i in range(1, m.count(".") + 1)) - allowed
    loaded, missing = {}, set()
    for m in sorted(allowed):
        try:
            loaded[m] = importlib.import_module(m)
        except Exception:  # noqa: BLE001 - an allowed module this Python lacks: its names are refused
            missing.add(m)
    tensor = getattr(loaded.get("torch"), "Tensor", None)
    tables, module_names = {}, {}
    for m, mod in loaded.items():
        tables[m], found = _module_table(m, mod, dangerous, tensor, allowed)
        for k, why in found.items():
            module_names.setdefault(k, why)
    everyday = _everyday(tables)
    unknown: dict[str, str] = {}
    for k in sorted(set(sys.stdlib_module_names) | set(module_names)):
        if not k.startswith("_") and k not in everyday and k.split(".")[-1] not in {a.split(".")[-1] for a in allowed}:
            unknown[k] = module_names.get(k, f"names the standard-library module {k}")
    for t in _INTROSPECTION_TYPES:
        for k in dir(t):
            if not k.startswith("_") and k not in _INTROSPECTION_KEPT:
                unknown[k] = f"an interpreter frame attribute ({t.__name__}.{k}): frames hold every module's globals"
    for k, why in FORBIDDEN_NAMES.items():
        if not k.startswith("_") and k not in everyday:
            unknown[k] = why
    for _mod, k in _DANGEROUS:
        if k not in everyday and k not in FORBIDDEN_NAMES:
            unknown[k] = _DANGEROUS_WHY[k]
    unknown.update({k: why for k, why in NAMED_REFUSALS.items() if not k.startswith("_")})
    bt = {}
    for name, v in vars(builtins).items():
        if name.startswith("_") or name in FORBIDDEN_NAMES:
            continue
        bt[name] = Entry(value=v, refused_attrs={a: r for a, av in _attrs(v).items()
                                                 if (r := _refusal_on_value(av, dangerous, allowed))})
    return Atlas(modules=tables, passthrough=passthrough, unknown=unknown, builtins=bt, missing=frozenset(missing))


def lookup(mod: str, name: str) -> Entry | None:
    """The Entry for `mod.name` (None: not a public name of mod); a package on the way to an allowed module
    (methods, methods.common) has only that way."""
    a = atlas()
    full = f"{mod}.{name}"
    if full in ALLOWED_MODULES or full in a.passthrough:
        return Entry(module=full)
    if mod in a.passthrough:
        ways = sorted(m for m in ALLOWED_MODULES if m.startswith(mod + "."))
        return Entry(why=f"only the way to {', '.join(ways)} is allowed")
    return a.modules.get(mod, {}).get(name)


__all__ = ["ALLOWED_MODULES", "FORBIDDEN_NAMES", "NAMED_REFUSALS", "Atlas", "Entry", "atlas", "lookup"]
