"""Which seeds a run uses: the spec budget's, a list given, or seeds drawn fresh from the operating system.

A fixed, public seed is a check a candidate can recognise (and so pass while wrong). `--seeds fresh` (alias
`random`) draws each seed from the operating system's generator (`secrets`) when the run starts; nothing
before the run knows them, and the receipt records them afterwards (`request.seeds`, with
`request.seed_source: fresh`), so `--seeds S,S,...` with the recorded seeds reruns the very same cases.
Every input a contract draws (values and, through `dims`, shapes) depends on (seed, stream, case) only.

No torch here: `check`'s argument parsing and the gate read it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from engine.errors import UsageError

FRESH_WORDS = ("fresh", "random")
SOURCES = ("budget", "given", "fresh")
MAX_SEED = 2**32 - 1  # the spec schema's bound on a budget seed: a drawn seed fits wherever a listed one does


@dataclass(frozen=True)
class SeedRequest:
    """What `--seeds` asked for: a list (`seeds`), fresh draws (`fresh`, `count` of them or as many as the budget
    lists), or nothing (the budget's)."""

    seeds: tuple[int, ...] | None = None
    fresh: bool = False
    count: int | None = None

    @property
    def source(self) -> str:
        return "fresh" if self.fresh else "given" if self.seeds else "budget"


def parse(text: str | None, option: str = "--seeds") -> SeedRequest:
    """`42,43,44`, `fresh` / `random` (as many seeds as the budget lists), `fresh:N` / `random:N`, or None."""
    if text is None:
        return SeedRequest()
    word, _, n = text.strip().partition(":")
    if word.lower() in FRESH_WORDS:
        if not n:
            return SeedRequest(fresh=True)
        try:
            count = int(n)
        except ValueError:
            count = 0
        if count < 1:
            raise UsageError(f"{option} {text!r}: give the number of fresh seeds as a positive integer, e.g. fresh:3")
        return SeedRequest(fresh=True, count=count)
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"{option} {text!r} is not a comma-separated list of integers (e.g. 42,43,44), nor "
                         "'fresh' (seeds drawn at run time, recorded in the receipt)") from None
    if not seeds or any(s < 0 for s in seeds):
        raise UsageError(f"{option} {text!r}: give one or more non-negative integers")
    return SeedRequest(seeds=tuple(seeds))


def draw(n: int) -> list[int]:
    """`n` distinct seeds from the operating system's generator, in [0, 2^32): unknown until this call returns."""
    out: list[int] = []
    while len(out) < n:
        s = secrets.randbelow(MAX_SEED + 1)
        if s not in out:
            out.append(s)
    return out


def resolve(request: SeedRequest, budget: dict) -> tuple[list[int], str]:
    """(the seeds a run uses, where they came from: budget | given | fresh) for one spec's budget."""
    if request.fresh:
        return draw(request.count or len(budget["seeds"])), "fresh"
    if request.seeds:
        return list(request.seeds), "given"
    return list(budget["seeds"]), "budget"
