"""GSPO (gspo), the ratio family's middle member: importing this package registers the implementation and mutants."""

from methods.gspo import impl, mutants, reference, verl_adapter  # noqa: F401  (registration side effects)
from methods.gspo.loss import gspo_loss, sequence_ratio  # noqa: F401
