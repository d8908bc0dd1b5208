"""Imported once, for its side effect, last of `contracts mutate`'s forkserver preloads (engine/run/mutate/execute.py).

It installs the source-only finder (engine/run/sourceonly.py) and checks what the server imported before it:
torch, torch._dynamo and the runner. A worker forked afterwards inherits that check's record, so its runner's own
`sourceonly.install()` looks only at what the worker imports itself (the methods, the mutated module), instead of
resolving every one of torch's modules again in every mutant's worker. No method package is imported here: the
mutant's import hook must see its module first.
"""

from __future__ import annotations

from engine.run import sourceonly

sourceonly.install()
