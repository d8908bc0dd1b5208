"""The limits every candidate check runs under that a spec does not set: one leaf module, so the interface
(engine/spec/rules.py) can state them without importing the isolation layer that enforces them. Torch-free."""

DEFAULT_MEMORY_MB = 4096  # address-space limit of a candidate worker, MiB (engine/run/isolation.py)
