"""Source-edit mutants: a module's functions recompiled with one textual edit, beside the module's own names."""

from __future__ import annotations

import inspect
import textwrap
from types import ModuleType

# Mutant machinery, not a mutation target of `contracts mutate`.
__mutate__ = False


def recompile(module: ModuleType, names: tuple[str, ...], edits: list[tuple[str, str, str]], label: str) -> dict:
    """The namespace of `module` with `names` recompiled in order, each with the `edits` aimed at it applied:
    (function or class name, old text, new text). Text that does not occur exactly once raises, so a mutant
    cannot silently become the original when the source changes."""
    namespace = dict(vars(module))
    for obj_name in names:
        source = textwrap.dedent(inspect.getsource(getattr(module, obj_name)))
        for target, old, new in edits:
            if target != obj_name:
                continue
            if source.count(old) != 1:
                raise RuntimeError(f"mutant {label}: {old!r} occurs {source.count(old)} times in {obj_name}, expected once")
            source = source.replace(old, new)
        exec(compile(source, f"<mutant {label}: {obj_name}>", "exec"), namespace)
    return namespace
