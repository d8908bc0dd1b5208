"""Names a spec may use: implementations, checks and mutants, registered by methods.

Methods register themselves with decorators, the way pytest and pre-commit
plugins do; specs name registered things and nothing is ever imported from a
path written in a spec.

Two views of the same registry exist:

* the runtime one (`load()`), filled when the packages under `methods/` are
  imported; it holds the callables and needs torch;
* the static one (`static_names()`), read from the same source files with
  `ast`, without importing or running anything. Read-only commands
  (`validate`, `list`, `show`) use it so they stay instant and torch-free.

For the static view to see a registration, its name must be a string literal
in one of these forms (a test keeps the two views equal):

    IMPL = registry.implementation("tapo", trajectory_ratio=..., ...)
    @registry.check("tapo.prefix_ratio_forward")
    @registry.mutant("tapo.prefix_grad_leak", base="tapo")
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any, Callable

from engine.errors import LookupFailure

METHODS_PACKAGE = "methods"
# The check name the loader gives a contract that names a generic kind and no bespoke `check:`.
KIND_PREFIX = "kind:"


class NotProvided(Exception):
    """Raised by a function an implementation does not have (an adapted framework loss has no separate ratio, say):
    the contract that needed it is recorded as not applicable to that implementation, never as passed."""

    def __init__(self, function: str, reason: str):
        super().__init__(f"the implementation provides no {function}: {reason}")
        self.function = function
        self.reason = reason


def not_provided(function: str, reason: str) -> Callable[..., Any]:
    """A stand-in for an interface function an implementation lacks: calling it raises NotProvided."""

    def absent(*args: Any, **kwargs: Any) -> Any:
        raise NotProvided(function, reason)

    absent.not_provided = reason  # type: ignore[attr-defined]
    absent.__name__ = function
    return absent


def provides(impl: Any, function: str) -> bool:
    """Whether `impl` really has `function` (not a not_provided stand-in): checks that measure several functions
    skip, and declare not applicable, the measurements of one it lacks."""
    fn = getattr(impl, function, None)
    return callable(fn) and getattr(fn, "not_provided", None) is None


class Implementation(SimpleNamespace):
    """The functions a check tests, bundled so a mutant can replace one of them."""

    def __init__(self, name: str, **functions: Callable[..., Any]):
        super().__init__(**functions)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_functions", tuple(sorted(functions)))

    @property
    def name(self) -> str:
        return self._name

    @property
    def functions(self) -> tuple[str, ...]:
        return self._functions

    def replace(self, name: str, **functions: Callable[..., Any]) -> "Implementation":
        """A copy with some functions swapped out (how mutants are built)."""
        unknown = sorted(set(functions) - set(self._functions))
        if unknown:
            raise LookupFailure(
                f"implementation {self._name!r} has no function {', '.join(unknown)}; "
                f"valid: {', '.join(self._functions)}"
            )
        merged = {k: getattr(self, k) for k in self._functions}
        merged.update(functions)
        return Implementation(name, **merged)


@dataclass
class MutantEntry:
    name: str
    base: str
    factory: Callable[[], Implementation]


@dataclass
class Registry:
    implementations: dict[str, Implementation] = field(default_factory=dict)
    checks: dict[str, Callable[..., Any]] = field(default_factory=dict)
    mutants: dict[str, MutantEntry] = field(default_factory=dict)
    # float64 references the generic kinds compare against (engine/kinds), by name
    references: dict[str, Callable[..., Any]] = field(default_factory=dict)
    # (framework, implementation) -> adapt(obj) -> Adapted: how a framework's object (a verl policy loss) becomes
    # a registered implementation's interface; the method owns the mapping, the engine only looks it up.
    adapters: dict[tuple[str, str], Callable[..., Any]] = field(default_factory=dict)

    def get_adapter(self, framework: str, implementation: str) -> Callable[..., Any]:
        try:
            return self.adapters[(framework, implementation)]
        except KeyError:
            have = sorted(impl for fw, impl in self.adapters if fw == framework)
            raise LookupFailure(f"no {framework} adapter for implementation {implementation!r}; "
                                f"{framework} targets can be checked against: {', '.join(have) or '(none)'}") from None

    def get_implementation(self, name: str) -> Implementation:
        return _lookup(self.implementations, name, "implementation")

    def get_check(self, name: str) -> Callable[..., Any]:
        if name.startswith(KIND_PREFIX):  # a contract measured by a generic kind (engine/kinds)
            from engine.kinds.base import check_for

            return check_for(name[len(KIND_PREFIX):])
        return _lookup(self.checks, name, "check")

    def get_mutant(self, name: str) -> MutantEntry:
        return _lookup(self.mutants, name, "mutant")

    def get_reference(self, name: str) -> Callable[..., Any]:
        return _lookup(self.references, name, "reference")


_REGISTRY = Registry()
_LOADED = False


def _lookup(table: dict[str, Any], name: str, what: str) -> Any:
    try:
        return table[name]
    except KeyError:
        valid = ", ".join(sorted(table)) or "(none registered)"
        raise LookupFailure(f"no {what} named {name!r}; valid {what}s: {valid}") from None


def _claim(table: dict[str, Any], name: str, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"a {what} name must be a non-empty string")
    if name in table:
        raise ValueError(f"{what} {name!r} is registered twice")


def implementation(name: str, **functions: Callable[..., Any]) -> Implementation:
    """Register the functions of a method under `name` and return the bundle."""
    _claim(_REGISTRY.implementations, name, "implementation")
    impl = Implementation(name, **functions)
    _REGISTRY.implementations[name] = impl
    return impl


def check(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a check: `fn(impl, ctx) -> dict[str, measurement]`."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _claim(_REGISTRY.checks, name, "check")
        _REGISTRY.checks[name] = fn
        return fn

    return deco


def reference(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a float64 reference a kind compares against: `fn(*args, **kwargs)` takes the same arguments as
    the interface function (float64 CPU tensors) and returns the expected output; NaN marks an undefined slot."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _claim(_REGISTRY.references, name, "reference")
        _REGISTRY.references[name] = fn
        return fn

    return deco


def mutant(name: str, base: str) -> Callable[[Callable[[], Implementation]], Callable[[], Implementation]]:
    """Register a known-bad variant: `factory() -> Implementation` with one defect."""

    def deco(factory: Callable[[], Implementation]) -> Callable[[], Implementation]:
        _claim(_REGISTRY.mutants, name, "mutant")
        _REGISTRY.mutants[name] = MutantEntry(name=name, base=base, factory=factory)
        return factory

    return deco


@dataclass
class Adapted:
    """What an adapter makes of a framework's object: the interface functions it provides (`functions`), which of
    them are the framework object's own (`own`; the others the adapter supplies, each with the reason in
    `supplied`), and the interface functions nobody provides (`absent`, with the reason)."""

    functions: dict[str, Callable[..., Any]]
    own: list[str]
    supplied: dict[str, str] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def implementation(self, name: str) -> Implementation:
        stand_ins = {f: not_provided(f, why) for f, why in self.absent.items()}
        return Implementation(name, **self.functions, **stand_ins)


def adapter(framework: str, implementation: str) -> Callable[[Callable[..., Adapted]], Callable[..., Adapted]]:
    """Register `adapt(obj) -> Adapted` for checking `framework` objects against `implementation`'s interface."""

    def deco(fn: Callable[..., Adapted]) -> Callable[..., Adapted]:
        key = (framework, implementation)
        if key in _REGISTRY.adapters:
            raise ValueError(f"{framework} adapter for {implementation!r} is registered twice")
        _REGISTRY.adapters[key] = fn
        return fn

    return deco


def method_packages() -> list[str]:
    """The importable names of the method packages (`methods.tapo`, ...), found without importing any of them:
    the one place the engine names the methods package (the engine looks methods up here, never imports them)."""
    return [f"{METHODS_PACKAGE}.{info.name}"
            for info in sorted(pkgutil.iter_modules([str(methods_root())]), key=lambda m: m.name) if info.ispkg]


def load() -> Registry:
    """Import every method package (this imports torch) and return the registry."""
    from engine.run.imports import gc_paused

    global _LOADED
    if not _LOADED:
        with gc_paused():
            for name in method_packages():
                importlib.import_module(name)
        _LOADED = True
    return _REGISTRY


# --- static view ----------------------------------------------------------


@dataclass(frozen=True)
class StaticNames:
    implementations: MappingProxyType  # name -> tuple of function names
    checks: frozenset
    mutants: MappingProxyType  # name -> base implementation name
    files: tuple  # source files, relative to the methods package's parent


def methods_root() -> Path:
    spec = importlib.util.find_spec(METHODS_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LookupFailure("the 'methods' package is not importable; install the project with pip install -e .")
    return Path(list(spec.submodule_search_locations)[0])


def _registry_call(node: ast.AST) -> tuple[str, ast.Call] | None:
    if not isinstance(node, ast.Call):
        return None
    fn = node.func
    if not (isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and fn.value.id == "registry"):
        return None
    if fn.attr not in {"implementation", "check", "mutant"}:
        return None
    if not node.args or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
        return None
    return fn.attr, node


_STATIC: StaticNames | None = None


def static_names() -> StaticNames:
    """Registered names read from source with `ast`: nothing is imported or run."""
    global _STATIC
    if _STATIC is not None:
        return _STATIC
    root = methods_root()
    impls: dict[str, tuple[str, ...]] = {}
    checks: set[str] = set()
    mutants: dict[str, str] = {}
    files = []
    for path in sorted(root.rglob("*.py")):
        files.append(path.relative_to(root.parent).as_posix())
        text = path.read_text(encoding="utf-8")
        if text.isascii() and "registry" not in text:
            continue  # no name `registry` can occur in it (only a non-ASCII identifier could normalise to one)
        tree = ast.parse(text, filename=str(path))
        for node in ast.walk(tree):
            hit = _registry_call(node)
            if hit is None:
                continue
            kind, call = hit
            name = call.args[0].value
            if kind == "implementation":
                impls[name] = tuple(sorted(k.arg for k in call.keywords if k.arg))
            elif kind == "check":
                checks.add(name)
            else:
                base = next(
                    (k.value.value for k in call.keywords if k.arg == "base" and isinstance(k.value, ast.Constant)),
                    None,
                )
                mutants[name] = base
    _STATIC = StaticNames(
        implementations=MappingProxyType(impls),
        checks=frozenset(checks),
        mutants=MappingProxyType(mutants),
        files=tuple(files),
    )
    return _STATIC


def implementation_file(name: str) -> str | None:
    """The file under methods/ that registers implementation `name` (e.g. 'methods/tapo/impl.py'), read with
    `ast` like static_names() (nothing imported); None when no file there registers it."""
    try:
        root = methods_root()
    except LookupFailure:
        return None
    needle = name.encode("utf-8")
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        try:
            raw = path.read_bytes()
        except OSError:
            continue
        if b"implementation(" not in raw or needle not in raw:
            continue
        try:
            tree = ast.parse(raw, filename=str(path))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            hit = _registry_call(node)
            if hit is not None and hit[0] == "implementation" and hit[1].args[0].value == name:
                return path.relative_to(root.parent).as_posix()
    return None


# --- static and runtime together ------------------------------------------------


def known_names() -> StaticNames:
    """Names a spec may use: the static scan, plus anything registered at runtime in this process.

    Read-only commands never import methods, so for them this is exactly
    `static_names()`. A process that registered names itself (a test's
    misbehaving implementation, a plugin loaded by hand) can validate specs
    that use them; nothing is imported here either way.
    """
    return with_runtime(static_names())


def with_runtime(static: StaticNames) -> StaticNames:
    """`static` plus anything registered at runtime in this process (see known_names)."""
    runtime = _REGISTRY
    if not (runtime.implementations or runtime.checks or runtime.mutants):
        return static
    impls = dict(static.implementations)
    impls.update({name: impl.functions for name, impl in runtime.implementations.items()})
    mutants = dict(static.mutants)
    mutants.update({name: entry.base for name, entry in runtime.mutants.items()})
    return StaticNames(implementations=MappingProxyType(impls), checks=static.checks | frozenset(runtime.checks),
                       mutants=MappingProxyType(mutants), files=static.files)
