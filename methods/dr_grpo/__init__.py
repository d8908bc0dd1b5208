"""Dr. GRPO (dr-grpo, arXiv 2503.20783): importing this package registers the implementation, its references,
mutants and the framework adapters (methods/dr_grpo/adapters.py, driven by methods/common/zoo.yaml)."""

# The shared argument checks run on every call: they are this method's code for `contracts mutate`.
__mutate_also__ = ("methods.common.pg_inputs",)

from methods.dr_grpo import adapters, impl, mutants, reference  # noqa: E402,F401  (registration side effects)
