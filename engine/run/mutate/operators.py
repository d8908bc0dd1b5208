"""Mutation operators: where in a source file a small, realistic defect can be planted, and what it is.

Each operator walks a libcst tree (libcst keeps every byte of the source, so a
mutant differs from the original only where the edit is and its diff reads
like a one-token bug) and yields `Edit`s: a source range, the text that
replaces it, and a short description. Nothing here imports torch or runs code.

Operators (names used in mutant ids and in specs' `equivalent_mutants`):

  arith       + <-> -, * <-> /, // -> /, ** -> *, % -> // (also in `x += y` and friends)
  compare     < <-> <=, > <-> >=, == <-> !=, is <-> is not, in <-> not in
  logic       and <-> or, `not x` -> `x`
  minmax      min <-> max, minimum <-> maximum, amin <-> amax, argmin <-> argmax,
              clamp_min <-> clamp_max, clamp(min=) <-> clamp(max=)
  sign        `-x` -> `x`
  constant    an integer or float literal +1 and -1; True <-> False
  dim         the dim of a reduction (sum, mean, amax, cumsum, softmax, ...): -1/1 -> 0, 0 -> -1
  detach      `x.detach()` -> `x`; a tensor expression assigned or returned -> `(expr).detach()`
  reduce      mean <-> sum (x.mean / torch.mean, masked_mean <-> masked_sum)

Not mutated: code inside a `raise` (the message, not the decision to raise),
string formatting, decorators, string literals, literals passed to a
configuration call (`params.get("lr", 0.02)`, `ctx.generator(101)`: settings
and seed offsets, not the method's computation), and `.detach()` is never
added to a tensor made from nothing (`torch.zeros(...)`), which has no gradient.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

OPERATORS = ("arith", "compare", "logic", "minmax", "sign", "constant", "dim", "detach", "reduce")


@dataclass(frozen=True)
class Edit:
    """Replace source[start:end] (1-based lines, 0-based columns) with `text`."""

    operator: str
    start: tuple[int, int]
    end: tuple[int, int]
    text: str
    description: str
    statement_lines: tuple[int, int]  # first and last line of the enclosing statement (for coverage)


_ARITH = {cst.Add: ("-", cst.Subtract), cst.Subtract: ("+", cst.Add), cst.Multiply: ("/", cst.Divide),
          cst.Divide: ("*", cst.Multiply), cst.FloorDivide: ("/", cst.Divide), cst.Power: ("*", cst.Multiply),
          cst.Modulo: ("//", cst.FloorDivide)}
_AUG = {cst.AddAssign: "-=", cst.SubtractAssign: "+=", cst.MultiplyAssign: "/=", cst.DivideAssign: "*=",
        cst.FloorDivideAssign: "/=", cst.PowerAssign: "*=", cst.ModuloAssign: "//="}
_COMPARE = {cst.LessThan: "<=", cst.LessThanEqual: "<", cst.GreaterThan: ">=", cst.GreaterThanEqual: ">",
            cst.Equal: "!=", cst.NotEqual: "==", cst.Is: "is not", cst.IsNot: "is", cst.In: "not in",
            cst.NotIn: "in"}
_MINMAX = {"min": "max", "max": "min", "minimum": "maximum", "maximum": "minimum", "amin": "amax", "amax": "amin",
           "argmin": "argmax", "argmax": "argmin", "clamp_min": "clamp_max", "clamp_max": "clamp_min",
           "fmin": "fmax", "fmax": "fmin"}
_MEANSUM = {"mean": "sum", "sum": "mean", "nanmean": "nansum", "nansum": "nanmean",
            "masked_mean": "masked_sum", "masked_sum": "masked_mean"}
_REDUCTIONS = frozenset({"sum", "mean", "amax", "amin", "max", "min", "logsumexp", "cumsum", "cumprod", "softmax",
                         "log_softmax", "prod", "std", "var", "norm", "any", "all", "argmax", "argmin", "nansum",
                         "nanmean", "count_nonzero", "masked_mean", "masked_sum", "cummax", "cummin", "flip",
                         "topk", "sort", "median", "unbind", "squeeze", "unsqueeze"})
# A value is taken to be a tensor (so `.detach()` may be added to it) when it calls one of these.
_TENSOR_CALLS = frozenset({"exp", "log", "expm1", "log1p", "sqrt", "rsqrt", "sum", "mean", "cumsum", "clamp",
                           "gather", "softmax", "log_softmax", "where", "logsumexp", "amax", "amin", "maximum",
                           "minimum", "abs", "pow", "square", "matmul", "einsum", "sigmoid", "tanh", "relu",
                           "masked_fill", "nan_to_num", "neg", "reciprocal", "masked_mean", "masked_sum", "exp2",
                           "clamp_min", "clamp_max"})
_TENSOR_ROOTS = frozenset({"torch", "F"})
# Tensors made from nothing carry no gradient: `.detach()` on them changes nothing, so it is never added.
_FACTORIES = frozenset({"zeros", "ones", "full", "empty", "arange", "linspace", "eye", "tensor", "as_tensor",
                        "randn", "rand", "randint", "randperm", "zeros_like", "ones_like", "full_like", "empty_like",
                        "no_grad", "device", "Generator", "finfo", "iinfo"})
# Modules whose functions return Python or NumPy scalars, never tensors (`math.log(2.0)`).
_SCALAR_ROOTS = frozenset({"math", "np", "numpy", "random", "statistics", "operator", "os", "time"})
# Constants passed to these are configuration (a dict default, a seed offset), not the method's computation.
_CONFIG_CALLS = frozenset({"get", "setdefault", "getattr", "generator", "manual_seed", "Generator"})


def _call_name(call: cst.Call) -> str | None:
    f = call.func
    if isinstance(f, cst.Name):
        return f.value
    if isinstance(f, cst.Attribute):
        return f.attr.value
    return None


def _is_method_call(call: cst.Call) -> bool:
    """`x.sum(...)` (the tensor is the receiver), not `torch.sum(x, ...)` or `sum(...)`."""
    f = call.func
    if not isinstance(f, cst.Attribute):
        return False
    root = f.value
    while isinstance(root, cst.Attribute):
        root = root.value
    return not (isinstance(root, cst.Name) and root.value in _TENSOR_ROOTS)


def _literal_int(node: cst.BaseExpression) -> int | None:
    if isinstance(node, cst.Integer):
        return int(node.value.replace("_", ""), 0)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus) and isinstance(
            node.expression, cst.Integer):
        return -int(node.expression.value.replace("_", ""), 0)
    return None


def _dim_arg(call: cst.Call) -> cst.BaseExpression | None:
    """The node holding a reduction's dim: `dim=` by keyword, or positionally (first for x.sum(d), second for
    torch.sum(x, d))."""
    for a in call.args:
        if a.keyword is not None and a.keyword.value == "dim":
            return a.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    idx = 0 if _is_method_call(call) else 1
    return positional[idx].value if len(positional) > idx else None


def _looks_tensor(node: cst.BaseExpression) -> bool:
    """Conservative: a call of a tensor function (not a factory), or arithmetic on one."""
    if isinstance(node, cst.Call):
        name = _call_name(node)
        root = node.func
        while isinstance(root, (cst.Attribute, cst.Call)):
            root = root.value if isinstance(root, cst.Attribute) else root.func
        if name in _FACTORIES or (isinstance(root, cst.Name) and root.value in _SCALAR_ROOTS):
            return False
        if name in _TENSOR_CALLS:
            return True
        f = node.func
        while isinstance(f, cst.Attribute):
            f = f.value
        return isinstance(f, cst.Name) and f.value in _TENSOR_ROOTS
    if isinstance(node, cst.BinaryOperation):
        return _looks_tensor(node.left) or _looks_tensor(node.right)
    if isinstance(node, cst.UnaryOperation):
        return _looks_tensor(node.expression)
    return False


def _is_stringy(node: cst.BaseExpression) -> bool:
    return isinstance(node, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString))


# The node each statement kind's header ends with (its own expressions); a simple statement is all header.
STATEMENT_HEADERS = {
    cst.SimpleStatementLine: lambda n: n,
    cst.If: lambda n: n.test,
    cst.While: lambda n: n.test,
    cst.For: lambda n: n.iter,
    cst.With: lambda n: n.items[-1],
    cst.FunctionDef: lambda n: n.params,  # default values are evaluated by the `def`
    cst.ClassDef: lambda n: n.name,
}
SKIPPED = frozenset({cst.Raise, cst.FormattedString, cst.Decorator})  # a raise's message, an f-string, a decorator


class _Collector(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, module: cst.Module, operators: frozenset[str]):
        super().__init__()
        self.module = module
        self.ops = operators
        self.edits: list[Edit] = []
        self._stmt: list[tuple[int, int]] = []
        self._skip = 0  # inside a raise, an f-string or a decorator
        self._dim_nodes: set[int] = set()  # literal nodes the dim operator owns (constants skip them)
        self._config: set[int] = set()  # literals passed to a configuration call (constants skip them)

    # -- bookkeeping -----------------------------------------------------------------

    def _pos(self, node: cst.CSTNode) -> CodeRange:
        return self.get_metadata(PositionProvider, node)

    def _add(self, op: str, node: cst.CSTNode, text: str, description: str) -> None:
        if op not in self.ops or self._skip or not self._stmt:
            return
        r = self._pos(node)
        self.edits.append(Edit(op, (r.start.line, r.start.column), (r.end.line, r.end.column), text, description,
                               self._stmt[-1]))

    def _code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def _push_stmt(self, node: cst.CSTNode, header_end: cst.CSTNode | None = None) -> None:
        r = self._pos(node)
        end = self._pos(header_end).end.line if header_end is not None else r.end.line
        self._stmt.append((r.start.line, end))

    # A statement's lines are its own for a simple one; a compound statement's own expressions belong to its header
    # (STATEMENT_HEADERS). Inside SKIPPED nodes nothing is mutated. One table for both, so a pushed statement or
    # skip is always popped by the same rule that pushed it.
    def on_visit(self, node: cst.CSTNode) -> bool:
        header = STATEMENT_HEADERS.get(type(node))
        if header is not None:
            self._push_stmt(node, header(node))
        elif type(node) in SKIPPED:
            self._skip += 1
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if type(original_node) in STATEMENT_HEADERS:
            self._stmt.pop()
        elif type(original_node) in SKIPPED:
            self._skip -= 1
        super().on_leave(original_node)

    def visit_Annotation(self, node: cst.Annotation) -> bool:
        return False  # type hints are not behaviour

    # -- operators -------------------------------------------------------------------

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        new = _ARITH.get(type(node.operator))
        if new is None or _is_stringy(node.left) or _is_stringy(node.right):
            return
        old = self._code(node.operator).strip()
        self._add("arith", node.operator, new[0], f"{old} -> {new[0]}")

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        new = _AUG.get(type(node.operator))
        if new is not None and not _is_stringy(node.value):
            old = self._code(node.operator).strip()
            self._add("arith", node.operator, new, f"{old} -> {new}")

    def visit_ComparisonTarget(self, node: cst.ComparisonTarget) -> None:
        new = _COMPARE.get(type(node.operator))
        if new is not None:
            old = " ".join(self._code(node.operator).split())
            self._add("compare", node.operator, new, f"{old} -> {new}")

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        new = "or" if isinstance(node.operator, cst.And) else "and"
        old = "and" if new == "or" else "or"
        self._add("logic", node.operator, new, f"{old} -> {new}")

    def visit_UnaryOperation(self, node: cst.UnaryOperation) -> None:
        if isinstance(node.operator, cst.Not):
            self._add("logic", node, self._code(node.expression), "not x -> x")
        elif isinstance(node.operator, cst.Minus) and id(node) not in self._dim_nodes:  # dims: the dim operator
            self._add("sign", node, self._code(node.expression), "-x -> x")

    def visit_Integer(self, node: cst.Integer) -> None:
        if id(node) in self._dim_nodes or id(node) in self._config:
            return
        v = int(node.value.replace("_", ""), 0)
        for d in (1, -1):
            self._add("constant", node, str(v + d) if v + d >= 0 else f"({v + d})", f"{v} -> {v + d}")

    def visit_Float(self, node: cst.Float) -> None:
        if id(node) in self._config:
            return
        v = float(node.value.replace("_", ""))
        for d in (1.0, -1.0):
            self._add("constant", node, repr(v + d) if v + d >= 0 else f"({v + d!r})", f"{node.value} -> {v + d!r}")

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in ("True", "False"):
            new = "False" if node.value == "True" else "True"
            self._add("constant", node, new, f"{node.value} -> {new}")

    def visit_Call(self, node: cst.Call) -> None:
        name = _call_name(node)
        if name in _CONFIG_CALLS:
            for a in node.args:
                for lit in (a.value, getattr(a.value, "expression", None)):
                    if isinstance(lit, (cst.Integer, cst.Float)):
                        self._config.add(id(lit))
        target = node.func.attr if isinstance(node.func, cst.Attribute) else node.func
        if name in _MINMAX and (isinstance(node.func, cst.Attribute) or name in ("min", "max")):
            self._add("minmax", target, _MINMAX[name], f"{name} -> {_MINMAX[name]}")
        if name in ("clamp", "clip"):
            for a in node.args:
                if a.keyword is not None and a.keyword.value in ("min", "max"):
                    new = "max" if a.keyword.value == "min" else "min"
                    self._add("minmax", a.keyword, new, f"{name}({a.keyword.value}=) -> {name}({new}=)")
        if name in _MEANSUM and (isinstance(node.func, cst.Attribute) or name.startswith("masked_")):
            new = _MEANSUM[name]
            if isinstance(node.func, cst.Attribute) or f"{new}" in self.module.code:
                self._add("reduce", target, new, f"{name} -> {new}")
        if name in _REDUCTIONS:
            dim = _dim_arg(node)
            d = None if dim is None else _literal_int(dim)
            if d is not None:
                new_d = -1 if d == 0 else 0
                self._add("dim", dim, str(new_d) if new_d >= 0 else f"{new_d}", f"{name} dim {d} -> {new_d}")
                self._dim_nodes.add(id(dim))
                if isinstance(dim, cst.UnaryOperation):
                    self._dim_nodes.add(id(dim.expression))
        if name == "detach" and isinstance(node.func, cst.Attribute) and not node.args:
            self._add("detach", node, self._code(node.func.value), "x.detach() -> x")

    def _maybe_add_detach(self, value: cst.BaseExpression | None) -> None:
        if value is None or not _looks_tensor(value):
            return
        if isinstance(value, cst.Call) and _call_name(value) == "detach":
            return
        self._add("detach", value, f"({self._code(value)}).detach()", "expr -> (expr).detach()")

    def visit_Assign(self, node: cst.Assign) -> None:
        self._maybe_add_detach(node.value)

    def visit_Return(self, node: cst.Return) -> None:
        self._maybe_add_detach(node.value)


def collect(source: str, operators: frozenset[str] | None = None) -> list[Edit]:
    """Every edit the operators find in `source`, in source order."""
    ops = frozenset(OPERATORS) if operators is None else operators
    unknown = ops - set(OPERATORS)
    if unknown:
        raise ValueError(f"unknown mutation operator(s) {sorted(unknown)}; known: {', '.join(OPERATORS)}")
    module = cst.parse_module(source)
    wrapper = MetadataWrapper(module)
    collector = _Collector(wrapper.module, ops)
    wrapper.visit(collector)
    return sorted(collector.edits, key=lambda e: (e.start, e.end, e.operator, e.text))


def apply(source: str, edit: Edit) -> str:
    """`source` with one edit made (columns count characters, as libcst's positions do)."""
    lines = source.splitlines(keepends=True)
    (l0, c0), (l1, c1) = edit.start, edit.end
    head = "".join(lines[:l0 - 1]) + lines[l0 - 1][:c0]
    tail = lines[l1 - 1][c1:] + "".join(lines[l1:])
    return head + edit.text + tail


def edits_on_lines(edits: list[Edit], executed: set[int]) -> Iterator[Edit]:
    """The edits whose enclosing statement ran (any of its lines was traced)."""
    for e in edits:
        first, last = e.statement_lines
        if any(line in executed for line in range(first, last + 1)):
            yield e
