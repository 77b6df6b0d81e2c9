"""The IETF RateLimit drafts: the ``RateLimit`` field (draft 07 and 08+) and ``RateLimit-*``.

* draft 08 and later: ``RateLimit: "name";r=REMAINING;t=SECONDS``, with
  ``RateLimit-Policy: "name";q=QUOTA;w=WINDOW`` for the quota and window; each
  policy is a window of its own;
* draft 07: a dictionary, ``RateLimit: limit=100, remaining=50, reset=30``;
* the older drafts (GitLab, Twitch, Kong): separate ``RateLimit-Limit``,
  ``-Remaining`` and ``-Reset`` fields, the limit perhaps carrying its window
  (``10;w=1``).
"""

from __future__ import annotations

from collections.abc import Mapping

from ._budget import RateLimit
from ._fields import Family
from ._values import count, members, reset, seconds, show, unquote

__all__ = ["SEPARATE", "structured"]

SEPARATE = Family(
    "RateLimit-*", "ratelimit-remaining", "ratelimit-limit", (("ratelimit-reset", "reset"),)
)
"""The older drafts' separate fields."""


def structured(folded: Mapping[str, str], now: float, notes: list[str]) -> list[RateLimit]:
    """The ``RateLimit`` field, draft 07 or draft 08+ form: each policy a window."""
    raw = folded["ratelimit"]
    listed = members(raw)
    if any("=" in main and not main.startswith('"') for main, _ in listed):
        found = _draft7(raw, listed, now, notes)
        return [] if found is None else [found]
    policies = _policies(folded.get("ratelimit-policy"))
    candidates: list[RateLimit] = []
    problems: list[str] = []
    for main, params in listed:
        name = unquote(main)
        quota, window = policies.get(name, (None, None))
        remaining_raw = params.get("r")
        remaining = None if remaining_raw is None else count(remaining_raw)
        if remaining is None:
            problems.append(f"{show(main)} has no valid r= (remaining)")
            continue
        reset_raw = params.get("t")
        # No t=: the policy's window bounds the time to the reset.
        wait = window if reset_raw is None else reset(reset_raw, now=now)
        if wait is None:
            problems.append(f"{show(main)} has no valid t= (reset)")
            continue
        candidates.append(RateLimit(remaining, wait, quota, "RateLimit", name or None, window))
    if problems:
        # One note per field, however many members a hostile server sends.
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        notes.append(f"RateLimit: policy {problems[0]}{more}: skipped")
    return candidates


def _policies(raw: str | None) -> dict[str, tuple[int | None, float | None]]:
    """``RateLimit-Policy``: each policy's quota (``q``) and window (``w``) by name."""
    policies: dict[str, tuple[int | None, float | None]] = {}
    if raw is not None:
        for main, params in members(raw):
            quota_raw = params.get("q")
            window_raw = params.get("w")
            policies[unquote(main)] = (
                None if quota_raw is None else count(quota_raw),
                None if window_raw is None else seconds(window_raw),
            )
    return policies


def _draft7(
    raw: str, listed: list[tuple[str, dict[str, str]]], now: float, notes: list[str]
) -> RateLimit | None:
    """Draft 07's dictionary form: ``RateLimit: limit=100, remaining=50, reset=30``."""
    fields: dict[str, str] = {}
    for main, _ in listed:
        key, _, value = main.partition("=")
        fields[key.strip().lower()] = value
    remaining = count(fields.get("remaining", ""))
    wait = reset(fields.get("reset", ""), now=now)
    if remaining is None or wait is None:
        notes.append(f"RateLimit {show(raw)}: no valid remaining= and reset=")
        return None
    limit_raw = fields.get("limit")
    limit = None if limit_raw is None else count(limit_raw)
    return RateLimit(remaining, wait, limit, "RateLimit")
