"""The LLM APIs' dialects: OpenAI's (and Groq's) and Anthropic's, requests and tokens.

* OpenAI: ``x-ratelimit-{limit,remaining,reset}-requests`` and ``-tokens``,
  the resets Go durations (``6m0s``, ``20ms``);
* Anthropic: ``anthropic-ratelimit-requests-{limit,remaining,reset}``, and the
  same for ``tokens``, ``input-tokens`` and ``output-tokens``, the resets RFC
  3339 timestamps.

The requests budget is one of the main dialects; the token windows are read
apart (:func:`token_windows`), each with its :attr:`RateLimit.unit`, since
they count tokens, not requests (``docs/signals.md``, "Token budgets").
"""

from __future__ import annotations

from collections.abc import Mapping

from ._budget import RateLimit
from ._fields import Family, read_family

__all__ = ["ANTHROPIC_REQUESTS", "OPENAI_REQUESTS", "token_windows"]

OPENAI_REQUESTS = Family(
    "X-RateLimit-*-Requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-limit-requests",
    (("x-ratelimit-reset-requests", "go"),),
)

ANTHROPIC_REQUESTS = Family(
    "Anthropic-RateLimit-Requests-*",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-limit",
    (("anthropic-ratelimit-requests-reset", "reset"),),
)

_OPENAI_TOKENS = Family(
    "X-RateLimit-*-Tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-limit-tokens",
    (("x-ratelimit-reset-tokens", "go"),),
    unit="tokens",
)


def _anthropic(unit: str, source: str) -> Family:
    prefix = f"anthropic-ratelimit-{unit}"
    return Family(
        source,
        f"{prefix}-remaining",
        f"{prefix}-limit",
        ((f"{prefix}-reset", "reset"),),
        unit=unit,
    )


_ANTHROPIC_TOKENS = _anthropic("tokens", "Anthropic-RateLimit-Tokens-*")
_ANTHROPIC_SPLIT = (
    _anthropic("input-tokens", "Anthropic-RateLimit-Input-Tokens-*"),
    _anthropic("output-tokens", "Anthropic-RateLimit-Output-Tokens-*"),
)


def token_windows(folded: Mapping[str, str], now: float, notes: list[str]) -> tuple[RateLimit, ...]:
    """Every token window the headers advertise, in the order above; () if none.

    Anthropic's ``tokens`` window is "the most restrictive limit currently in
    effect" of its input and output windows: with either of those present it
    is not a third limit, and is not read (a request's tokens would count
    twice against the one limit).
    """
    found: list[RateLimit] = []
    for family in (_OPENAI_TOKENS, *_ANTHROPIC_SPLIT):
        if family.remaining in folded:
            window = read_family(folded, now, notes, family)
            if window is not None:
                found.append(window)
    split = any(family.remaining in folded for family in _ANTHROPIC_SPLIT)
    if not split and _ANTHROPIC_TOKENS.remaining in folded:
        window = read_family(folded, now, notes, _ANTHROPIC_TOKENS)
        if window is not None:
            found.append(window)
    return tuple(found)
