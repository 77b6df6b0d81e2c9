"""What a simulated host does with a request: a behaviour and its runtime.

A behaviour is an immutable, validated description (a frozen dataclass). The
server turns it into a private runtime object per host, which holds the mutable
state (workers, queue, token bucket) and answers requests. Keeping the two
apart lets one behaviour describe many hosts (``SimServer.many``) without any
of them sharing state.

This module holds the two base classes and the checks every behaviour's fields
go through; the behaviours come in two families, each with its runtimes: the
hosts bound by their workers, which queue the excess (``_workers``:
:class:`Capacity`, :class:`CDN`, :class:`VariableLatency`), and the hosts
bound by a rate, which refuse it (``_buckets``: :class:`RateLimited`,
:class:`SoftBlock`).

Everything here is free of aiohttp: a runtime returns a :class:`Reply` and the
server turns it into an HTTP response.
"""

from __future__ import annotations

import math
import random
from dataclasses import fields
from typing import ClassVar

from ._pages import Reply
from ._stats import Recorder, Ticket

__all__ = ["Behaviour", "Runtime", "at_least", "count", "flag", "fraction", "positive"]

# --------------------------------------------------------------------------- checks


def number(owner: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{owner}: {name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be finite, got {value!r}")
    return float(value)


def at_least(owner: str, name: str, value: object, minimum: float) -> None:
    if number(owner, name, value) < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum:g}, got {value!r}")


def positive(owner: str, name: str, value: object) -> None:
    if number(owner, name, value) <= 0:
        raise ValueError(f"{owner}: {name} must be > 0, got {value!r}")


def fraction(owner: str, name: str, value: object, *, below_one: bool = False) -> None:
    x = number(owner, name, value)
    if x < 0 or x > 1 or (below_one and x == 1):
        bound = "[0, 1)" if below_one else "[0, 1]"
        raise ValueError(f"{owner}: {name} must be in {bound}, got {value!r}")


def count(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name} must be an int >= 1, got {value!r}")


def flag(owner: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}: {name} must be a bool, got {value!r}")


# --------------------------------------------------------------------------- the two halves


class Runtime:
    """Per-host mutable state of a behaviour; subclasses answer requests."""

    origin: Recorder | None = None

    def __init__(self, host: str, rng: random.Random) -> None:
        self.host = host
        self.rng = rng

    async def serve(self, target: str, ticket: Ticket, rec: Recorder) -> Reply:
        raise NotImplementedError

    def reset(self, now: float) -> None:
        """Back to the initial state (full buckets); in-progress requests go on."""
        if self.origin is not None:
            self.origin.reset(now)

    def jittered(self, seconds: float, jitter: float) -> float:
        if jitter == 0 or seconds == 0:
            return seconds
        return seconds * self.rng.uniform(1.0 - jitter, 1.0 + jitter)


class Behaviour:
    """Base class of the behaviours; each is a frozen, validated dataclass."""

    __slots__ = ()

    kind: ClassVar[str] = ""

    @property
    def capacity(self) -> float:
        """The most successful responses per second the host can sustain."""
        raise NotImplementedError

    @property
    def spec(self) -> str:
        """The behaviour in command-line syntax (``kind:name=value,...``)."""
        return f"{self.kind}:{','.join(_spec_fields(self))}"

    def new_runtime(self, host: str, rng: random.Random, now: float) -> Runtime:
        """A fresh per-host state for a server starting at ``now``: the server
        calls it once per host and run, so a restart begins with full buckets."""
        raise NotImplementedError


def _spec_fields(behaviour: Behaviour) -> list[str]:
    """``name=value`` for each field; a behaviour inside (a CDN's origin), its fields in line."""
    parts = []
    for f in fields(behaviour):  # type: ignore[arg-type]
        value = getattr(behaviour, f.name)
        if isinstance(value, Behaviour):
            parts.extend(_spec_fields(value))
        elif isinstance(value, bool):
            parts.append(f"{f.name}={str(value).lower()}")
        elif isinstance(value, float):
            parts.append(f"{f.name}={value:g}")
        else:
            parts.append(f"{f.name}={value}")
    return parts
