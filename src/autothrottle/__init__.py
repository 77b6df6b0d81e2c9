"""autothrottle: polite, adaptive per-host pacing for httpx and aiohttp.

Scrapy's AutoThrottle, for asyncio clients: every host is a *slot* whose delay
between requests adapts to the host's latency, so that about
``target_concurrency`` requests are in flight to it on average.

    >>> from autothrottle import Throttle
    >>> throttle = Throttle(target_concurrency=2.0)
    >>> throttle.slot("example.com").delay
    5.0

The client adapters live in :mod:`autothrottle.httpx` and
:mod:`autothrottle.aiohttp`.
"""

from ._errors import ThrottleTimeout
from ._exchange import ThrottleInfo
from ._headers import RateLimit
from ._hosts import HostSettings
from ._lease import Lease
from ._policies import (
    AdaptiveConcurrencyPolicy,
    AIMDPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
)
from ._policy import DelayPolicy, Sample, SlotConfig
from ._request import CONTROL_HEADER, RequestOptions
from ._rules import ThrottleEvent
from ._slot import Slot, SlotSnapshot
from ._state import SlotState
from ._stats import SlotStats, ThrottleStats
from ._store import MemoryStore, SlotStore
from ._throttle import Throttle
from ._timeline import Mark, SlotSample, Timeline
from ._version import __version__

__all__ = [
    "__version__",
    "CONTROL_HEADER",
    "AIMDPolicy",
    "AdaptiveConcurrencyPolicy",
    "AutoThrottlePolicy",
    "FixedDelayPolicy",
    "FixedRatePolicy",
    "HostSettings",
    "RateLimit",
    "DelayPolicy",
    "Lease",
    "Mark",
    "MemoryStore",
    "RequestOptions",
    "Sample",
    "Slot",
    "SlotConfig",
    "SlotSample",
    "SlotSnapshot",
    "SlotState",
    "SlotStats",
    "SlotStore",
    "Throttle",
    "ThrottleEvent",
    "ThrottleInfo",
    "ThrottleStats",
    "ThrottleTimeout",
    "Timeline",
]
