"""The budget a response advertised: :class:`RateLimit`, and which of several windows binds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

__all__ = ["RateLimit", "combine"]


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A rate-limit budget a response advertised.

    When a response advertises several windows at once ("10 per second and
    10,000 per day"), the record's own fields are those of the **binding**
    window, the one that holds sends back the most, and :attr:`windows` lists
    them all (``docs/signals.md``, "Several windows"). After a response with
    ``X-Limit-Per-Second: 10``, ``X-Remaining-This-Second: 9``,
    ``X-Limit-Per-Day: 10000`` and ``X-Remaining-Today: 9000``::

        budget = throttle.slot("api.example").snapshot().rate_limit
        budget.policy, [w.policy for w in budget.windows]  # 'day', ['second', 'day']

    Attributes:
        remaining: Requests the server still accepts before ``reset`` (>= 0).
            A fractional count (Reddit's ``598.0``) is rounded down.
        reset: Seconds from the response until the budget refills (finite, >= 0).
        limit: The whole quota of the window, if the server said.
        source: The header family read, e.g. ``"RateLimit"`` (the IETF draft's
            structured field), ``"RateLimit-*"`` (the older draft's separate
            fields), ``"X-RateLimit-*"``; ``docs/signals.md`` lists them all.
        policy: The draft's policy name (``"default"`` in
            ``RateLimit: "default";r=5;t=30``), or the window's name for the
            dialects that name it (``"minute"``, ``"day"``, ``"1s"``).
        window: The policy's window in seconds (``w`` of ``RateLimit-Policy``,
            or ``;w=`` on a ``-Limit`` field), when the server said.
        windows: Every window the response advertised, the binding one among
            them, when there were several; empty when there was one.
        unit: What the window counts: ``"requests"``, or for the LLM APIs'
            token windows ``"tokens"``, ``"input-tokens"`` or
            ``"output-tokens"`` (``docs/signals.md``, "Token budgets").
    """

    remaining: int
    reset: float
    limit: int | None = None
    source: str = "RateLimit"
    policy: str | None = None
    window: float | None = None
    windows: tuple[RateLimit, ...] = ()
    unit: str = "requests"

    @property
    def sustained(self) -> float | None:
        """Seconds between requests at the policy's own pace (``window / limit``), if known.

        Unlike :attr:`spacing`, it does not hang on ``reset``, which servers
        round up to whole seconds, send as 0 while tokens remain, or measure to
        a full refill: it is the pace the quota allows in the long run.
        """
        if self.window is None or not self.limit:
            return None
        return self.window / self.limit

    @property
    def slowest(self) -> RateLimit:
        """The window whose own pace (:attr:`sustained`) is the slowest: this one if alone.

        With several windows the long-run pace is the slowest of theirs, which
        need not be the binding window's (that one may be binding for now only).
        """
        if not self.windows:
            return self
        return max(self.windows, key=lambda window: window.sustained or 0.0)

    @property
    def spacing(self) -> float:
        """Seconds between requests that spend the budget evenly until the reset.

        With nothing remaining it is the whole ``reset``: wait for the refill.
        """
        if self.remaining == 0:
            return self.reset
        return self.reset / self.remaining

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready data (its windows as a list of such dicts).

        ``unit`` is written only when it is not ``"requests"``, so a requests
        budget reads as it did before windows had units.
        """
        data = {part.name: getattr(self, part.name) for part in fields(self)}
        data["windows"] = [window.to_dict() for window in self.windows]
        if self.unit == "requests":
            del data["unit"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RateLimit:
        """A record from :meth:`to_dict`'s data (older data without ``windows`` or ``unit`` too)."""
        values = dict(data)
        values["windows"] = tuple(cls.from_dict(window) for window in values.get("windows", ()))
        return cls(**values)


def combine(main: Sequence[RateLimit], extra: Sequence[RateLimit]) -> RateLimit | None:
    """One budget from the main dialect's windows and the per-window dialects'.

    With several windows, the binding one: an exhausted one (longest reset
    first), else the one demanding the widest gap, the wider of
    ``reset / remaining`` and its own pace ``window / limit`` (ties: fewer
    remaining). That is the gap that honours every window at once; the window
    with the fewest remaining alone could still overrun a larger, longer one.
    """
    windows = list(main)
    for window in extra:
        same = next((i for i, w in enumerate(windows) if _same_window(w, window)), None)
        if same is None:
            windows.append(window)
        else:  # one window in two dialects: the main one's reset, the other's length
            windows[same] = replace(windows[same], window=window.window)
    if len(windows) <= 1:
        return windows[0] if windows else None
    binding = max(windows, key=_restrictiveness)
    return replace(binding, windows=tuple(windows))


def _same_window(main: RateLimit, other: RateLimit) -> bool:
    """Kong sends the binding window twice: as ``RateLimit-*`` and per unit."""
    return main.window is None and (main.remaining, main.limit) == (other.remaining, other.limit)


def _restrictiveness(budget: RateLimit) -> tuple[int, float, int]:
    """Exhausted windows first (longest reset), then the widest gap, then fewer left.

    The gap is the wider of the spacing until the reset and the window's own
    pace: a window that says ``t=0`` while tokens remain still binds by its pace.
    """
    if budget.remaining == 0:
        return (1, budget.reset, 0)
    return (0, max(budget.spacing, budget.sustained or 0.0), -budget.remaining)
