"""paper-contracts engine: specs, registry, runner, receipts, gate, CLI."""

__version__ = "0.1.0"
