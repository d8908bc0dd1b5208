"""Benchmarks: each row a ratio measured side by side in one process and run (`python -m benchmarks`)."""
