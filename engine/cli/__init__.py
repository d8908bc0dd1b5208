"""`contracts`: one command per verb, one module per verb. Read-only verbs never import torch.

Exit codes: 0 ok / gate open; 1 a contract failed, a mutant survived, the gate
is closed or verify found a problem; 2 usage error (bad argument, bad spec,
request over budget); 3 internal error (a check raised); 4 the environment
cannot do what was asked; 5 nothing selected; 130 interrupted.
"""

# Each verb registers itself on `app` when imported; the order here is the order of `contracts --help`.
from engine.cli import check, gate, keys, kinds, list, mutate, promote, review, schema, show, tui, validate, verify, version  # noqa: F401,E402
from engine.cli import interface  # noqa: F401,E402  [impl] interface, scaffold
from engine.cli import evolve  # noqa: F401,E402  [evolve] evolve-evaluator
from engine.cli import conformance  # noqa: F401,E402  the framework zoo's matrix (docs/conformance.md)
from engine.cli.common import app
from engine.cli.main import _DIRECT, _DIRECT_FLAGS, _DIRECT_OPTIONS, _TYPER_ONLY_OPTIONS, _direct_call, main  # noqa: E402

__all__ = ["app", "main", "_DIRECT", "_DIRECT_FLAGS", "_DIRECT_OPTIONS", "_TYPER_ONLY_OPTIONS", "_direct_call"]
