"""A one-function method for tests/test_mutate.py: small enough that every mutant of it is known."""
