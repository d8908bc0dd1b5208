"""Torch implementations of paper methods, one package each, plus `common`.

Every package here is imported by `engine.spec.registry.load()`; each registers its
implementation, checks and mutants with `engine.spec.registry`.
"""
