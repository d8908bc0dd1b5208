"""Frameworks whose objects can be checked with `--impl FRAMEWORK:...` (engine/run/impl_loader.py dispatches here).

Each module knows one framework (how a target names an object in it, which of its files bind, how to call the
object the way the framework does) and nothing about any method: how a framework object becomes a method's
interface is the method's adapter, registered with `engine.spec.registry.adapter(framework, implementation)`.
"""

FRAMEWORKS = {"verl": "engine.run.adapters.verl", "trl": "engine.run.adapters.trl"}
