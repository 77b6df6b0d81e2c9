"""The signal settings: how a throttle reads what a response says beyond its latency.

Built and validated once by :class:`~autothrottle.Throttle`, then frozen: a
setting changed after the fact could leave the rules half on (strict mode
turned on later would keep the 429 backoff but stop header reading), so there
is no way to change one. ``strict_scrapy`` is folded in here, at build time,
and nowhere else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from ._validate import check_bool, check_number, check_positive

__all__ = ["BlockClassifier", "Signals"]

BlockClassifier = Callable[[int, Mapping[str, str]], bool]


@dataclass(frozen=True, slots=True)
class Signals:
    """Which response signals slow a slot down, and how much (see ``Throttle``)."""

    backoff_statuses: frozenset[int]
    backoff_factor: float
    backoff_on_failure: bool
    retry_after: bool
    rate_limit_headers: bool
    max_pause: float
    cache_hits_lower_delay: bool
    block_classifier: BlockClassifier | None
    strict_scrapy: bool
    hold_timeout: float

    @property
    def reads_headers(self) -> bool:
        """True when responses' headers are read at all (everything but strict mode)."""
        return not self.strict_scrapy

    def backoff_reason(self, status: int, headers: Mapping[str, str]) -> str | None:
        """Why a response backs its slot off (``"status 429"``, ``"blocked"``), or None."""
        if status in self.backoff_statuses:
            return f"status {status}"
        if self.block_classifier is not None and self.block_classifier(status, headers):
            return "blocked"
        return None

    @classmethod
    def build(
        cls,
        *,
        backoff_statuses: object,
        backoff_factor: object,
        backoff_on_failure: object,
        retry_after: object,
        rate_limit_headers: object,
        max_pause: object,
        cache_hits_lower_delay: object,
        block_classifier: object,
        strict_scrapy: object,
        hold_timeout: object,
    ) -> Signals:
        """Validate every setting (naming the bad one) and apply strict mode."""
        if isinstance(backoff_statuses, (str, bytes)) or not isinstance(
            backoff_statuses, Collection
        ):
            raise TypeError(
                f"backoff_statuses must be a collection of ints, got {backoff_statuses!r}"
            )
        for status in backoff_statuses:
            if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
                raise ValueError(f"backoff_statuses must hold HTTP statuses, got {status!r}")
        factor = check_number("backoff_factor", backoff_factor, minimum=1.0)
        pause = check_number("max_pause", max_pause)
        strict = check_bool("strict_scrapy", strict_scrapy)
        on_failure = check_bool("backoff_on_failure", backoff_on_failure)
        obey_retry_after = check_bool("retry_after", retry_after)
        obey_rate_limit = check_bool("rate_limit_headers", rate_limit_headers)
        hits_lower = check_bool("cache_hits_lower_delay", cache_hits_lower_delay)
        if block_classifier is not None and not callable(block_classifier):
            raise TypeError(f"block_classifier must be callable, got {block_classifier!r}")
        if hold_timeout != math.inf:
            check_positive("hold_timeout", hold_timeout)
        assert isinstance(hold_timeout, (int, float))
        return cls(
            backoff_statuses=frozenset() if strict else frozenset(backoff_statuses),
            backoff_factor=factor,
            backoff_on_failure=on_failure and not strict,
            retry_after=obey_retry_after and not strict,
            rate_limit_headers=obey_rate_limit and not strict,
            max_pause=pause,
            cache_hits_lower_delay=hits_lower or strict,
            block_classifier=None if strict else block_classifier,
            strict_scrapy=strict,
            hold_timeout=float(hold_timeout),
        )
