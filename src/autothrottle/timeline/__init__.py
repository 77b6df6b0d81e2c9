"""Watch a throttle over time: :class:`Timeline` samples its slots, and draws them.

A :class:`Timeline` samples :meth:`Throttle.snapshot <autothrottle.Throttle.snapshot>`
every ``interval`` seconds and keeps, per slot, what the slot looked like and what
happened since the sample before (:class:`SlotSample`), plus the events you mark
yourself (:class:`Mark`). It streams to a JSON-lines file on request and draws a
chart as PNG (matplotlib, the ``plot`` extra, imported only when drawing).

    from autothrottle.timeline import Timeline

    async with Timeline(throttle, interval=0.1, jsonl="crawl.jsonl") as timeline:
        await crawl()
    timeline.plot("crawl.png")
    Timeline.read_jsonl("crawl.jsonl").plot("same-chart.png")

It reads the throttle through its public ``snapshot()`` only, so it is a tool
on top of the library, not a part of the engine.
"""

from ._record import Timeline
from ._samples import Mark, SlotSample

__all__ = ["Mark", "SlotSample", "Timeline"]
