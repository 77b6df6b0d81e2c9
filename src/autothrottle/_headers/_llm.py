"""The LLM APIs' dialects: OpenAI's (and Groq's) and Anthropic's.

* OpenAI: ``x-ratelimit-{limit,remaining,reset}-requests``, the reset a Go
  duration (``6m0s``, ``20ms``);
* Anthropic: ``anthropic-ratelimit-requests-{limit,remaining,reset}``, the
  reset an RFC 3339 timestamp.
"""

from __future__ import annotations

from ._fields import Family

__all__ = ["ANTHROPIC_REQUESTS", "OPENAI_REQUESTS"]

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
