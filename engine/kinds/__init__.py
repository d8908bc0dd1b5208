"""Generic contract kinds: one measuring routine per recurring invariant, its parameters declared in the spec.

A kind is a class registered with `@kind`; it carries a JSON Schema for its
parameters (checked by `contracts validate`, torch-free) and a `measure(impl,
ctx, params)` that calls the implementation only through its interface. The
modules of this package import torch only inside `measure`, so listing and
validating kinds stays instant.
"""

from engine.kinds.base import Kind, all_kinds, get_kind, kind, kind_names

__all__ = ["Kind", "all_kinds", "get_kind", "kind", "kind_names"]
