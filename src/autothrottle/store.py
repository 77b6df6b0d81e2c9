"""Where what a throttle learned lives: the store interface, the in-memory store, the record.

:class:`MemoryStore` is the default (``Throttle(store=...)``); it also saves to and
loads from a file. ``autothrottle.redis.RedisStore`` shares state across a fleet.
A store keeps one :class:`SlotState` per slot key; its ``rate_limit`` field is a
:class:`RateLimit`, the budget a host's headers announced.
"""

from ._headers import RateLimit
from ._state import SlotState
from ._store import MemoryStore, SlotStore

__all__ = ["MemoryStore", "RateLimit", "SlotState", "SlotStore"]
