"""The strict screen: a candidate's source against an allowlist of imports and constructs, before it runs.

The evaluator (under `strict`, its default) parses the candidate with `ast` and refuses it, scoring 0, at the
first construct a loss function has no use for and an attack does: importing anything but the numeric and
typing modules below; reaching an attribute whose name starts with an underscore (`__globals__`,
`__class__`, `torch._C`, `sys._getframe` all go that way); the built-ins that run text as code, open files,
import by name or reach attributes by a computed name; `global` declarations; and the few torch functions that
deserialize, load code or compile it. The refusal names the line, the column and the construct.

It is a screen, not the defence: every candidate still runs in its sandbox with the checks outside it
(engine/run/sandbox.py, docs/trust.md). It keeps a candidate that tries such things from costing a run.
"""

from __future__ import annotations

import ast
from pathlib import Path

ALLOWED_MODULES = frozenset({
    "torch", "torch.nn", "torch.nn.functional", "math", "typing", "functools", "itertools", "dataclasses",
    "collections", "collections.abc", "numbers", "enum", "abc", "operator", "__future__", "typing_extensions",
    # the harness's scoring helper, which interfaces taking a policy (proximal_logprobs) are written against
    "methods.common.rollout",
})
FORBIDDEN_NAMES = frozenset({
    "eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr", "vars", "globals", "locals",
    "breakpoint", "input", "help", "exit", "quit", "memoryview", "__builtins__", "__loader__", "__spec__",
})
# torch attributes that load or run code, read or write files, or reach native internals
FORBIDDEN_ATTRIBUTES = frozenset({
    "load", "save", "hub", "ops", "utils", "classes", "library", "from_file", "compile", "jit", "package",
    "_C", "_dynamo", "_inductor", "cpp_extension", "fx", "export", "multiprocessing", "distributed",
})
MAX_BYTES = 1 << 20


def screen_source(text: str, name: str = "<candidate>") -> str | None:
    """Why `text` is refused (`name:LINE:COL: what`), or None when every construct is allowed."""
    try:
        tree = ast.parse(text, filename=name)
    except SyntaxError as exc:
        return f"{name}:{exc.lineno}:{exc.offset}: not valid Python ({exc.msg})"
    refused = [(node, why) for node in ast.walk(tree) if (why := _refuse(node))]
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


def _allowed_module(name: str) -> bool:
    return name in ALLOWED_MODULES


def _refuse(node: ast.AST) -> str | None:
    allowed = ", ".join(sorted(m for m in ALLOWED_MODULES if m != "__future__"))
    if isinstance(node, ast.Import):
        for a in node.names:
            if not _allowed_module(a.name):
                return f"import {a.name}: not in the allowlist ({allowed})"
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            return "a relative import: a candidate is one file"
        if not _allowed_module(node.module or ""):
            return f"from {node.module} import ...: not in the allowlist ({allowed})"
        for a in node.names:
            if a.name == "*":
                return f"from {node.module} import *: name what is used"
            if a.name.startswith("_") and node.module != "__future__":
                return f"from {node.module} import {a.name}: a private name"
            if a.name in FORBIDDEN_ATTRIBUTES or a.name in FORBIDDEN_NAMES:
                return f"from {node.module} import {a.name}: not allowed in a candidate"
            if f"{node.module}.{a.name}" not in ALLOWED_MODULES and _looks_like_module(node.module, a.name):
                return f"from {node.module} import {a.name}: not in the allowlist ({allowed})"
    elif isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            return f"attribute {node.attr}: underscore and dunder attributes are not allowed in a candidate"
        if node.attr in FORBIDDEN_ATTRIBUTES:
            return f"attribute .{node.attr}: loads, saves, compiles or reaches torch internals"
    elif isinstance(node, ast.Name):
        if node.id in FORBIDDEN_NAMES:
            return f"{node.id}: not allowed in a candidate"
        if node.id.startswith("__") and node.id.endswith("__") and node.id not in ("__name__", "__doc__"):
            return f"{node.id}: dunder names are not allowed in a candidate"
    elif isinstance(node, ast.Global):
        return f"global {', '.join(node.names)}: a candidate keeps no module state"
    return None


def _looks_like_module(module: str, name: str) -> bool:
    """True for `from torch import nn`-style imports of a submodule that is not on the allowlist."""
    return module == "torch" and name in ("cuda", "backends", "autograd", "optim", "testing", "overrides", "random")


__all__ = ["ALLOWED_MODULES", "screen", "screen_source"]
