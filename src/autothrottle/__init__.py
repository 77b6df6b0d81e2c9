"""autothrottle: polite, adaptive per-host pacing for httpx, aiohttp, requests and Scrapy.

Scrapy's AutoThrottle, for Python's HTTP clients, and then past it: every host is a
*slot* whose pace adapts to that host. By default a slot finds how many requests its
host serves at once and keeps that many in flight without a queue;
``Throttle(policy=AutoThrottlePolicy())`` paces by Scrapy's rules instead, about
``target_concurrency`` requests in flight on average.

    >>> from autothrottle import Throttle
    >>> throttle = Throttle()
    >>> throttle.slot("example.com").delay  # the first delay; each response moves it
    1.0

The client adapters live in :mod:`autothrottle.httpx`,
:mod:`autothrottle.aiohttp`, :mod:`autothrottle.requests` and
:mod:`autothrottle.scrapy` (a downloader middleware). This module holds what a user of the library
types: the throttle, its policies, its errors and what it reports. The rest
has a module of its own: :mod:`autothrottle.policy` (writing a policy),
:mod:`autothrottle.store` (where learned state lives), :mod:`autothrottle.options`
(per-request control), :mod:`autothrottle.timeline` (watching a throttle over
time), :mod:`autothrottle.sim` (simulated sites) and :mod:`autothrottle.cli`
(the ``autothrottle`` command).
"""

from ._errors import ThrottleTimeout
from ._events import ThrottleEvent
from ._exchange import ThrottleInfo
from ._hosts import HostSettings
from ._lease import Lease
from ._policies import (
    AdaptiveConcurrencyPolicy,
    AIMDPolicy,
    AutoThrottlePolicy,
    FixedDelayPolicy,
    FixedRatePolicy,
)
from ._slot import Slot, SlotSnapshot
from ._stats import SlotStats, ThrottleStats
from ._throttle import Acquiring, Throttle
from ._version import __version__

__all__ = [
    "__version__",
    "AIMDPolicy",
    "Acquiring",
    "AdaptiveConcurrencyPolicy",
    "AutoThrottlePolicy",
    "FixedDelayPolicy",
    "FixedRatePolicy",
    "HostSettings",
    "Lease",
    "Slot",
    "SlotSnapshot",
    "SlotStats",
    "Throttle",
    "ThrottleEvent",
    "ThrottleInfo",
    "ThrottleStats",
    "ThrottleTimeout",
]
