"""CISPO (cispo, MiniMax-M1, arXiv 2506.13585): importing this package registers the implementation, its
references, mutants and the framework adapters (methods/cispo/adapters.py, driven by methods/common/zoo.yaml)."""

# The shared argument checks run on every call: they are this method's code for `contracts mutate`.
__mutate_also__ = ("methods.common.pg_inputs",)

from methods.cispo import adapters, impl, mutants, reference  # noqa: E402,F401  (registration side effects)
