"""Writing your own delay policy: the interface and what it is handed.

The policies that ship (:class:`~autothrottle.AutoThrottlePolicy`,
:class:`~autothrottle.AdaptiveConcurrencyPolicy`, ...) are importable from
``autothrottle`` itself; this module holds what a policy of your own implements
(:class:`DelayPolicy`) and what it is given (:class:`Sample`, one response, and
:class:`SlotConfig`, the slot's settings), and :func:`policy_from_text`, which
makes a policy from the text form a flag or a setting gives it.
"""

from ._policy import DelayPolicy, Sample, SlotConfig
from ._policy_text import policy_from_text

__all__ = ["DelayPolicy", "Sample", "SlotConfig", "policy_from_text"]
