"""mechanism and bespoke: contracts whose measuring routine stays Python, named by `check:` in the spec."""

from __future__ import annotations

from engine.kinds.base import Kind, kind


class _Registered(Kind):
    parameters = {}
    required = []

    @classmethod
    def schema(cls):
        # the registered check reads its own params: any scalars and lists the spec schema allows
        return {"type": "object"}

    def measure(self, impl, ctx, params):  # pragma: no cover - the runner calls the registered check directly
        raise RuntimeError(f"a {self.name} contract is measured by the check its spec names (check:)")


@kind
class Mechanism(_Registered):
    name = "mechanism"
    description = ("A training run (real rollouts, optimizer updates, a control arm): a registered Python check "
                   "named by `check:`, with the spec's `why:` saying why no generic kind serves.")


@kind
class Bespoke(_Registered):
    name = "bespoke"
    description = ("A property unique to one paper: a registered Python check named by `check:`, with the spec's "
                   "`why:` saying why no generic kind serves.")
