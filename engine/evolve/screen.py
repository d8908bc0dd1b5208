"""The strict screen: a candidate's source against an allowlist of imports, attribute chains and constructs,
before it runs.

The evaluator (under `strict`, its default) parses the candidate with `ast` and refuses it, scoring 0, at the
first construct a loss function has no use for and an attack does. The refusal names the line, the column and
the construct. What is allowed:

* imports of the allowed modules (engine/evolve/allowlist.py), and from them their public names;
* an attribute chain rooted at a module (`torch.where`, `F.log_softmax`, `t.nn.Module` after `import torch as
  t`) only through that module's derived public namespace: a module that is not itself allowed (`torch.sys`,
  `torch.os`, `typing.sys`, `rollout.paired`), a callable that runs text as code or reaches attributes by name,
  a process-wide setter, a metaclass or a mutable container of the module is refused, as is any name the module
  does not hold (torch's lazily imported submodules);
* a module only as the root of such a chain or the value of an alias (`t = torch`, outside a class body): never
  passed, returned, stored in a container or rebound (`def f(torch)`), so every module object the candidate
  holds is one the screen tracks by name; a class of an allowed module that Python lets anyone change
  (`torch.Tensor`, `nn.Module`) likewise only where it is called, subclassed, tested (`isinstance`, a comparison,
  `except`, a class pattern), annotated or aliased, never where another name could keep it and change it;
* an attribute of anything else (a parameter, what a call returns) unless its name starts with an underscore
  (`__name__`, `__qualname__` and `__doc__` may be read; `super().__init__` called), is an interpreter frame
  attribute (`gi_frame`, `f_back`, `tb_frame`), names a module (`x.sys`, `x.os`), or is a refused callable;
* none of the reflective built-ins (`getattr`, `setattr`, `delattr`, `exec`, `eval`, `compile`, `open`,
  `globals`, `vars`, `locals`, `dir`, `__import__`, `breakpoint`, ...), by name, as an attribute of any object,
  or bound to a name; `type` only as `type(x).__name__`, in a comparison or in `isinstance` (three arguments
  build a class, dunders and all, from strings); `.format`/`.format_map` only on a string literal whose fields
  read no attribute or item (`"{0.__class__}".format(x)` is a getattr);
* no assignment or deletion into a module or anything reached from one (`torch.allclose = ...`,
  `F.softmax.x = ...`, `copy.dispatch_table[k] = ...`): the checks that run beside a candidate use torch too;
* classes whose bases the screen can name and which are not tensor subclasses, with no class keywords
  (`metaclass=`) and only ordinary special methods (`__init__`, `__call__`, `__repr__`, `__iter__`, ...: no
  `__torch_function__`, `__getattr__`, `__del__`, `__reduce__`, `__eq__`, `__bool__`);
* string annotations are parsed and screened as code (typing evaluates them); `match` class patterns' keyword
  attributes obey the attribute rules; `global` is refused.

It is a screen, not the defence: every candidate still runs in its sandbox with the checks outside it
(engine/run/sandbox.py, docs/trust.md), and what the judge relies on holds with the screen off. It keeps a
candidate that tries such things from costing a run.
"""

from __future__ import annotations

import ast
import string
from dataclasses import dataclass
from pathlib import Path

from engine.evolve import allowlist as AL
from engine.evolve.allowlist import ALLOWED_MODULES, FORBIDDEN_NAMES

MAX_BYTES = 1 << 20
# dunder attributes that only read a name or a docstring
READABLE_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__"})
# dunder names a candidate may use as plain names
NAME_DUNDERS = frozenset({"__name__", "__doc__", "__all__"})
# special methods a candidate's class may define (and call through super()): none changes how attributes are
# found, how torch dispatches, how an object is pickled or finalised, or what it says when compared or tested
# for truth (an object equal to anything would pass a check that compares it)
SPECIAL_METHODS = frozenset({
    "__init__", "__post_init__", "__call__", "__repr__", "__str__", "__len__", "__iter__", "__next__",
    "__getitem__", "__contains__", "__enter__", "__exit__",
})
# built-ins the rules above trust by name (type's allowed uses, isinstance, super().__init__): never rebound
TRUSTED_BUILTINS = frozenset({"type", "isinstance", "issubclass", "super"})
_MAX_ANNOTATION_DEPTH = 4


@dataclass(frozen=True)
class _Module:
    name: str  # an allowed module, or a package on the way to one


@dataclass(frozen=True)
class _Known:
    entry: AL.Entry  # a public non-module value of an allowed module, or a built-in

    def same(self, other) -> bool:
        return isinstance(other, _Known) and other.entry.value is self.entry.value


_OWN_CLASS = "own class"  # a class the candidate defines (screened itself)
_CLASS_VALUE = ("{shown}: a class of an allowed module used as a value (named only to call, subclass, test with "
                "isinstance or compare, where no other name can keep it and change it)")


def screen_source(text: str, name: str = "<candidate>") -> str | None:
    """Why `text` is refused (`name:LINE:COL: what`), or None when every construct is allowed."""
    try:
        tree = ast.parse(text, filename=name)
    except SyntaxError as exc:
        return f"{name}:{exc.lineno}:{exc.offset}: not valid Python ({exc.msg})"
    refused = _Screen(tree).refusals()
    if not refused:
        return None
    # the first in reading order (torch.__class__.__dict__: __class__, whose expression ends first)
    node, why = min(refused, key=lambda nw: (getattr(nw[0], "lineno", 0), getattr(nw[0], "col_offset", 0),
                                             getattr(nw[0], "end_col_offset", 0) or 0))
    return f"{name}:{getattr(node, 'lineno', '?')}:{getattr(node, 'col_offset', -1) + 1}: {why}"


def screen(path: Path) -> str | None:
    """screen_source for the file at `path` (named by its file name only)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as err:
        return f"{path.name}: cannot read ({err.strerror})"
    if len(raw) > MAX_BYTES:
        return f"{path.name}: over {MAX_BYTES} bytes"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"{path.name}: not UTF-8 text"
    return screen_source(text, path.name)


def _shown(node: ast.AST, limit: int = 60) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _allowed_text() -> str:
    return ", ".join(sorted(m for m in ALLOWED_MODULES if m != "__future__"))


def _format_field_reach(fmt: str, depth: int = 0) -> str | None:
    """The first replacement field of `fmt` that reads an attribute or an item ('0.__class__', 'x[k]'), '' for
    a string str.format would refuse, None when every field is a plain position or name."""
    try:
        for _lit, fieldname, spec, _conv in string.Formatter().parse(fmt):
            if fieldname is not None and ("." in fieldname or "[" in fieldname):
                return fieldname
            if spec and depth < 2 and (bad := _format_field_reach(spec, depth + 1)) is not None:
                return bad
    except ValueError:
        return ""
    return None


class _Screen:
    """One pass to learn what every name is bound to, one to check every node against the rules."""

    def __init__(self, tree: ast.Module):
        self.atlas = AL.atlas()
        self.tree = tree
        self.parent: dict[ast.AST, ast.AST] = {}
        self.kinds: dict[type, list] = {}
        self.annotation_nodes: set[int] = set()
        self.bindings: dict[str, list[tuple[ast.AST, object]]] = {}
        self.out: list[tuple[ast.AST, str]] = []
        self._memo: dict[str, object] = {}
        self._resolving: set[str] = set()

    # -- driving --------------------------------------------------------------------------------------------

    def refusals(self) -> list[tuple[ast.AST, str]]:
        self._link(self.tree)  # one walk: every later pass reads the nodes of the kinds it judges
        self._string_annotations()
        self._bind()
        self._one_meaning_per_module_name()
        for kinds, check in self._checks().items():
            for kind in kinds:
                for node in self.kinds.get(kind, ()):
                    check(node)
        return self.out

    def refuse(self, node: ast.AST, why: str) -> None:
        self.out.append((node, why))

    def of(self, *kinds: type) -> list:
        return [n for k in kinds for n in self.kinds.get(k, ())]

    def _link(self, root: ast.AST) -> None:
        """Record each node under root by its kind, and each child's parent."""
        stack = [root]
        while stack:
            node = stack.pop()
            self.kinds.setdefault(type(node), []).append(node)
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
                stack.append(child)

    def _string_annotations(self) -> None:
        """Parse each string in an annotation and screen it as the expression typing would evaluate."""
        anns = [n.annotation for n in self.of(ast.arg) if n.annotation is not None]
        anns += [n.returns for n in self.of(ast.FunctionDef, ast.AsyncFunctionDef) if n.returns is not None]
        anns += [n.annotation for n in self.of(ast.AnnAssign)]
        for a in anns:
            self.annotation_nodes.update(id(n) for n in ast.walk(a))
            self._strings_in(a, 0)

    def _strings_in(self, annotation: ast.AST, depth: int) -> None:
        for const in ast.walk(annotation):
            if not (isinstance(const, ast.Constant) and isinstance(const.value, str)):
                continue
            if depth >= _MAX_ANNOTATION_DEPTH:
                self.refuse(const, "a string annotation nested too deep to screen")
                continue
            try:
                sub = ast.parse(const.value.strip(), mode="eval").body
            except SyntaxError:
                self.refuse(const, f"string annotation {const.value[:40]!r}: not an expression (typing would "
                                   f"evaluate it as code)")
                continue
            for n in ast.walk(sub):  # report at the string, shifted by where the inner node starts
                if hasattr(n, "lineno"):
                    n.lineno = n.end_lineno = const.lineno
                    n.col_offset = const.col_offset + 1 + (n.col_offset or 0)
                    n.end_col_offset = const.col_offset + 1 + (n.end_col_offset or 0)
            self._link(sub)
            self.parent[sub] = const
            self.annotation_nodes.update(id(n) for n in ast.walk(sub))
            self._strings_in(sub, depth + 1)  # a string inside it is an annotation too

    # -- what names are bound to ----------------------------------------------------------------------------

    def _bind(self) -> None:
        def bind(name: str, node: ast.AST, value: object) -> None:
            self.bindings.setdefault(name, []).append((node, value))

        for node in self.of(ast.Import):
            for a in node.names:
                if a.asname:
                    bind(a.asname, node, _Module(a.name) if a.name in ALLOWED_MODULES else None)
                else:
                    top = a.name.split(".")[0]
                    bind(top, node, _Module(top) if a.name in ALLOWED_MODULES else None)
        for node in self.of(ast.ImportFrom):
            for a in node.names:
                if a.name != "*":
                    bind(a.asname or a.name, node, self._imported(node.module or "", a.name, node.level))
        aliases: set[int] = set()
        for node in self.of(ast.Assign):
            if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                bind(node.targets[0].id, node.targets[0], node.value)  # an expression: resolved when asked
                aliases.add(id(node.targets[0]))
        for node in self.of(ast.AnnAssign):
            if isinstance(node.target, ast.Name):
                bind(node.target.id, node.target, node.value)
                aliases.add(id(node.target))
        for node in self.of(ast.Name):
            if not isinstance(node.ctx, ast.Load) and id(node) not in aliases:
                bind(node.id, node, None)
        for node in self.of(ast.arg):
            bind(node.arg, node, None)
        for node in self.of(ast.FunctionDef, ast.AsyncFunctionDef, ast.ExceptHandler, ast.MatchAs, ast.MatchStar):
            if node.name:
                bind(node.name, node, None)
        for node in self.of(ast.MatchMapping):
            if node.rest:
                bind(node.rest, node, None)
        for node in self.of(ast.ClassDef):
            bind(node.name, node, _OWN_CLASS)
        for bound in self.bindings.values():  # reading order: the first binding is the one reported against
            bound.sort(key=lambda nv: (getattr(nv[0], "lineno", 0), getattr(nv[0], "col_offset", 0)))

    def _imported(self, module: str, name: str, level: int) -> object:
        if level or not (module in ALLOWED_MODULES or module in self.atlas.passthrough):
            return None
        e = AL.lookup(module, name)
        if e is None or e.why:
            return None
        return _Module(e.module) if e.module else _Known(e)

    def _value_of_binding(self, value: object) -> object:
        if isinstance(value, ast.AST):
            return self.static(value)
        return value

    def name_value(self, name: str) -> object:
        """What `name` is bound to wherever it is used (flow-insensitive): a module, a known value, one of the
        candidate's classes, or None (unknown). A name with any module binding counts as that module."""
        if name in self._memo:
            return self._memo[name]
        bound = self.bindings.get(name)
        if not bound:
            e = self.atlas.builtins.get(name)
            return _Known(e) if e is not None else None
        if name in self._resolving:
            return None
        self._resolving.add(name)
        try:
            values = [self._value_of_binding(v) for _n, v in bound]
        finally:
            self._resolving.discard(name)
        modules = [v for v in values if isinstance(v, _Module)]
        first = values[0]
        if modules:
            out = modules[0]
        elif all(v == _OWN_CLASS for v in values):
            out = _OWN_CLASS
        elif isinstance(first, _Known) and all(first.same(v) for v in values):
            out = first
        else:
            out = None
        self._memo[name] = out
        return out

    def _one_meaning_per_module_name(self) -> None:
        """A name bound to a module, or to a class of an allowed module, is bound to nothing else: otherwise the
        flow-insensitive reading above could take the other binding for it, or the class escape under it."""
        for name, bound in self.bindings.items():
            values = [self._value_of_binding(v) for _n, v in bound]
            held = [v for v in values if isinstance(v, _Module) or (isinstance(v, _Known) and v.entry.mutable_class)]
            if not held:
                continue
            first = held[0]
            what = f"the module {first.name}" if isinstance(first, _Module) else \
                f"the class {getattr(first.entry.value, '__qualname__', '?')}"
            for (node, _v), value in zip(bound, values):
                if value == first or (isinstance(first, _Known) and first.same(value)):
                    continue
                other = f"the module {value.name}" if isinstance(value, _Module) else "something else"
                self.refuse(node, f"{name}: bound to {what} and here to {other}; a name that names a module or a "
                                  f"class of one names only that")
                break

    def static(self, node: ast.AST) -> object:
        """What an expression is, where the source alone says: a module, a known value, or None."""
        if isinstance(node, ast.Name):
            return self.name_value(node.id)
        if isinstance(node, ast.Attribute):
            base = self.static(node.value)
            if isinstance(base, _Module) and node.attr not in READABLE_DUNDERS:
                e = AL.lookup(base.name, node.attr)
                if e is not None and e.why is None:
                    return _Module(e.module) if e.module else _Known(e)
        return None

    # -- the rules ------------------------------------------------------------------------------------------

    def _checks(self) -> dict:
        return {
            (ast.Import,): self._check_import,
            (ast.ImportFrom,): self._check_import_from,
            (ast.Name,): self._check_name,
            (ast.Attribute,): self._check_attribute,
            (ast.Subscript,): lambda n: None if isinstance(n.ctx, ast.Load) else self._check_store_into(n),
            (ast.ClassDef,): self._check_class,
            (ast.FunctionDef, ast.AsyncFunctionDef): lambda n: self._check_binding_name(n, n.name, special_ok=True),
            (ast.arg,): lambda n: self._check_binding_name(n, n.arg),
            (ast.ExceptHandler, ast.MatchAs, ast.MatchStar): lambda n: n.name and self._check_binding_name(n, n.name),
            (ast.MatchClass,): self._check_match_class,
            (ast.Global,): lambda n: self.refuse(n, f"global {', '.join(n.names)}: a candidate keeps no module state"),
        }

    def _in_class_body(self, node: ast.AST) -> bool:
        """True where a binding becomes a class attribute (a module bound there escapes the screen's tracking)."""
        p = self.parent.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
            if isinstance(p, ast.ClassDef):
                return True
            p = self.parent.get(p)
        return False

    def _check_import(self, node: ast.Import) -> None:
        if self._in_class_body(node):
            self.refuse(node, "an import in a class body: the module would become a class attribute")
            return
        for a in node.names:
            if a.name not in ALLOWED_MODULES:
                self.refuse(node, f"import {a.name}: not in the allowlist ({_allowed_text()})")
            elif a.asname:
                self._check_binding_name(node, a.asname)

    def _check_import_from(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            self.refuse(node, "a relative import: a candidate is one file")
            return
        if self._in_class_body(node):
            self.refuse(node, "an import in a class body: the module would become a class attribute")
            return
        if module not in ALLOWED_MODULES and module not in self.atlas.passthrough:
            self.refuse(node, f"from {module} import ...: not in the allowlist ({_allowed_text()})")
            return
        for a in node.names:
            if a.name == "*":
                self.refuse(node, f"from {module} import *: name what is used")
            elif module == "__future__":
                continue
            elif a.name.startswith("_"):
                self.refuse(node, f"from {module} import {a.name}: a private name")
            else:
                e = AL.lookup(module, a.name)
                if e is None:
                    self.refuse(node, f"from {module} import {a.name}: not a public name of {module}"
                                      + (" (not installed here)" if module in self.atlas.missing else ""))
                elif e.why:
                    self.refuse(node, f"from {module} import {a.name}: {e.why}")
                else:
                    self._check_binding_name(node, a.asname or a.name)

    def _check_binding_name(self, node: ast.AST, name: str, special_ok: bool = False) -> None:
        if name in FORBIDDEN_NAMES:
            self.refuse(node, f"{name}: not allowed in a candidate")
        elif name in TRUSTED_BUILTINS:
            self.refuse(node, f"{name}: a built-in the screen relies on; a candidate does not rebind it")
        elif name.startswith("__") and name.endswith("__"):
            if special_ok and name not in SPECIAL_METHODS:
                self.refuse(node, f"def {name}: a special method the screen does not allow (it changes how Python "
                                  f"or torch treats the object: attribute lookup, dispatch, pickling, finalising, "
                                  f"comparison, truth)")
            elif not special_ok and name not in NAME_DUNDERS:
                self.refuse(node, f"{name}: dunder names are not allowed in a candidate")

    def _check_name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES:
            self.refuse(node, f"{node.id}: not allowed in a candidate")
            return
        if node.id.startswith("__") and node.id.endswith("__") and node.id not in NAME_DUNDERS:
            self.refuse(node, f"{node.id}: dunder names are not allowed in a candidate")
            return
        if not isinstance(node.ctx, ast.Load):
            self._check_binding_name(node, node.id)
            return
        value = self.name_value(node.id)
        if isinstance(value, _Module) and not self._module_use_ok(node):
            self.refuse(node, f"{node.id}: the module {value.name} used as a value (a module is named only before "
                              f"a dot, or aliased with =)")
        elif isinstance(value, _Known) and value.entry.mutable_class and not self._class_use_ok(node):
            self.refuse(node, _CLASS_VALUE.format(shown=node.id))
        elif node.id == "type" and not self._type_use_ok(node):
            self.refuse(node, "type: only type(x).__name__, a comparison or isinstance (a type object builds "
                              "classes, dunders and all, from strings)")

    def _module_use_ok(self, node: ast.AST) -> bool:
        p = self.parent.get(node)
        if isinstance(p, ast.Attribute) and p.value is node:
            return True
        if isinstance(p, ast.Assign) and p.value is node:
            return len(p.targets) == 1 and isinstance(p.targets[0], ast.Name) and not self._in_class_body(p)
        return isinstance(p, ast.AnnAssign) and p.value is node and isinstance(p.target, ast.Name) and \
            not self._in_class_body(p)

    def _class_use_ok(self, node: ast.AST) -> bool:
        """Where a class of an allowed module may appear: what it is for (a call, a base, an isinstance check, a
        comparison, an except clause, a class pattern, an annotation, a typing subscript, an alias), never where
        it could be kept and later written under another name."""
        if id(node) in self.annotation_nodes or self._module_use_ok(node):
            return True
        p = self.parent.get(node)
        holder = p
        if isinstance(p, ast.Tuple):  # (torch.Tensor, float) inside isinstance, except, a subscript
            holder = self.parent.get(p)
        if isinstance(p, ast.Call) and p.func is node or isinstance(p, (ast.Compare, ast.ClassDef)):
            return isinstance(p, ast.Call) or isinstance(p, ast.Compare) or node in p.bases
        if isinstance(p, ast.MatchClass):
            return p.cls is node
        if isinstance(holder, ast.ExceptHandler):
            return holder.type is node or holder.type is p
        if isinstance(holder, ast.Call):
            return isinstance(holder.func, ast.Name) and holder.func.id in ("isinstance", "issubclass") and \
                (node in holder.args or p in holder.args)
        if isinstance(holder, ast.Subscript):
            return (holder.slice is node or holder.slice is p) and isinstance(self.static(holder.value), _Known)
        return False

    def _type_use_ok(self, node: ast.Name) -> bool:
        p = self.parent.get(node)
        if isinstance(p, ast.Call) and node in p.args:
            return isinstance(p.func, ast.Name) and p.func.id in ("isinstance", "issubclass")
        if not (isinstance(p, ast.Call) and p.func is node and len(p.args) == 1 and not p.keywords
                and not isinstance(p.args[0], ast.Starred)):
            return False
        gp = self.parent.get(p)
        if isinstance(gp, ast.Attribute) and gp.value is p:
            return gp.attr in ("__name__", "__qualname__")
        if isinstance(gp, ast.Compare):
            return True
        return isinstance(gp, ast.Call) and p in gp.args and isinstance(gp.func, ast.Name) and \
            gp.func.id in ("isinstance", "issubclass")

    def _check_attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        loading = isinstance(node.ctx, ast.Load)
        if attr.startswith("_"):
            on_super = isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and \
                node.value.func.id == "super" and attr in SPECIAL_METHODS
            if not (loading and (attr in READABLE_DUNDERS or on_super)):
                self.refuse(node, f"attribute {attr}: underscore and dunder attributes are not allowed in a "
                                  f"candidate")
            return
        if not loading:
            self._check_store_into(node)
        base = self.static(node.value)
        if isinstance(base, _Module):
            e = AL.lookup(base.name, attr)
            if e is None:
                self.refuse(node, f"{base.name}.{attr}: not a public name of {base.name}"
                                  + (" (not installed here)" if base.name in self.atlas.missing else ""))
            elif e.why:
                self.refuse(node, f"{base.name}.{attr}: {e.why}")
            elif e.module and loading and not self._module_use_ok(node):
                self.refuse(node, f"{_shown(node)}: the module {e.module} used as a value (a module is named only "
                                  f"before a dot, or aliased with =)")
            elif e.mutable_class and loading and not self._class_use_ok(node):
                self.refuse(node, _CLASS_VALUE.format(shown=_shown(node)))
            return
        if isinstance(base, _Known) and attr in base.entry.refused_attrs:
            self.refuse(node, f"{_shown(node)}: {base.entry.refused_attrs[attr]}")
        elif attr in self.atlas.unknown:
            self.refuse(node, f"attribute .{attr}: {self.atlas.unknown[attr]}")
        elif attr in ("format", "format_map"):
            recv = node.value
            if not (isinstance(recv, ast.Constant) and isinstance(recv.value, str)):
                self.refuse(node, f".{attr}: only on a string literal (a format string's fields read attributes "
                                  f"by name: '{{0.__class__}}')")
            elif (bad := _format_field_reach(recv.value)) is not None:
                self.refuse(node, f".{attr}: the field {{{bad}}} reads an attribute or item by name" if bad else
                            f".{attr}: not a valid format string")

    def _check_store_into(self, node: ast.AST) -> None:
        root = node
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        if isinstance(root, ast.Name):
            value = self.name_value(root.id)
            if isinstance(value, (_Module, _Known)):
                self.refuse(node, f"{_shown(node)} = ...: a candidate changes no module, nor anything reached from "
                                  f"one (the checks beside it use them too)")

    def _check_class(self, node: ast.ClassDef) -> None:
        self._check_binding_name(node, node.name)
        for kw in node.keywords:
            self.refuse(node, f"class {node.name}(..., {kw.arg or '**'}=...): a class keyword (metaclass=) builds "
                              f"the class another way")
        for b in node.bases:
            target = b.value if isinstance(b, ast.Subscript) else b
            value = self.static(target)
            if isinstance(value, _Module):
                continue  # refused where it is named: a module used as a value
            if isinstance(value, _Known):
                if value.entry.tensor_class:
                    self.refuse(b, f"class {node.name}({_shown(b)}): a tensor subclass can change what torch's "
                                   f"functions return")
            elif value != _OWN_CLASS:
                self.refuse(b, f"class {node.name}({_shown(b)}): a base the screen cannot name (give a class "
                               f"of an allowed module or of this file)")

    def _check_match_class(self, node: ast.MatchClass) -> None:
        base = self.static(node.cls)
        for attr in node.kwd_attrs:
            if attr.startswith("_"):
                self.refuse(node, f"case ...({attr}=...): underscore and dunder attributes are not allowed in a "
                                  f"candidate")
            elif isinstance(base, _Known) and attr in base.entry.refused_attrs:
                self.refuse(node, f"case ...({attr}=...): {base.entry.refused_attrs[attr]}")
            elif attr in self.atlas.unknown:
                self.refuse(node, f"case ...({attr}=...): {self.atlas.unknown[attr]}")


__all__ = ["ALLOWED_MODULES", "screen", "screen_source"]
