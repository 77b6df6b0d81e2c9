"""Writing your own delay policy: the interface and what it is handed.

The policies that ship (:class:`~autothrottle.AutoThrottlePolicy`,
:class:`~autothrottle.AdaptiveConcurrencyPolicy`, ...) are importable from
``autothrottle`` itself; this module holds what a policy of your own implements
(:class:`DelayPolicy`) and what it is given (:class:`Sample`, one response, and
:class:`SlotConfig`, the slot's settings).
"""

from ._policy import DelayPolicy, Sample, SlotConfig

__all__ = ["DelayPolicy", "Sample", "SlotConfig"]
