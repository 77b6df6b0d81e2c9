"""OpenTelemetry metrics for a throttle (extra ``otel``: ``opentelemetry-api``).

::

    from autothrottle.otel import instrument

    instrumentation = instrument(throttle)          # the global meter provider
    ...
    instrumentation.stop()                           # stop counting

What it records, each with the attribute ``autothrottle.slot``:

* ``autothrottle.responses`` (counter, also by ``http.response.status_code``),
  ``autothrottle.failures`` (counter, by ``error.type``) and
  ``autothrottle.backoffs`` (counter, by ``autothrottle.reason``);
* ``autothrottle.latency`` (histogram, seconds: connection ready to headers);
* ``autothrottle.delay`` (seconds), ``autothrottle.in_flight`` and
  ``autothrottle.queued`` (observable gauges, read when the meter collects).

Slot keys are unbounded (every host a crawl meets), metric attributes must
not be: the first ``top_n`` slots seen keep their own key and every later one
is counted as ``"other"``, unless ``slot_label`` maps keys to a bounded set
of labels itself (a registrable domain, say). The gauges report the
``top_n`` busiest slots at each collection (``Throttle.stats(top=top_n)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

try:
    import opentelemetry as _needed  # noqa: F401  (the extra this module needs)
except ImportError as _missing:  # pragma: no cover - depends on the environment
    from ._extras import missing_extra_error

    raise missing_extra_error("autothrottle.otel", "opentelemetry", "otel") from _missing

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from ._events import ThrottleEvent
from ._throttle import Throttle, check_throttle
from ._validate import check_int

__all__ = ["Instrumentation", "instrument"]

OTHER = "other"


class Instrumentation:
    """The instruments :func:`instrument` registered for one throttle."""

    def __init__(
        self,
        throttle: Throttle,
        meter: metrics.Meter,
        top_n: int,
        slot_label: Callable[[str], str] | None,
    ) -> None:
        self._throttle = throttle
        self._top_n = top_n
        self._slot_label = slot_label
        self._labels: dict[str, str] = {}
        self._responses = meter.create_counter(
            "autothrottle.responses", unit="{response}", description="Responses observed"
        )
        self._failures = meter.create_counter(
            "autothrottle.failures", unit="{request}", description="Requests with no response"
        )
        self._backoffs = meter.create_counter(
            "autothrottle.backoffs", unit="{backoff}", description="Times a slot backed off"
        )
        self._latency = meter.create_histogram(
            "autothrottle.latency", unit="s", description="Connection ready to response headers"
        )
        for name, unit, what in (
            ("delay", "s", "The slot's delay between sends"),
            ("in_flight", "{request}", "Requests sent and not finished"),
            ("queued", "{request}", "Requests waiting for their turn"),
        ):
            meter.create_observable_gauge(
                f"autothrottle.{name}", callbacks=[self._gauge(name)], unit=unit, description=what
            )
        self._stop = throttle.listen(self._on_event)

    def label(self, key: str) -> str:
        """The ``autothrottle.slot`` attribute value of slot ``key``."""
        if self._slot_label is not None:
            return self._slot_label(key)
        label = self._labels.get(key)
        if label is None:
            label = key if len(self._labels) < self._top_n else OTHER
            if label != OTHER:
                self._labels[key] = label
        return label

    def stop(self) -> None:
        """Stop counting events (the gauges stay registered with the meter)."""
        self._stop()

    def _on_event(self, event: ThrottleEvent) -> None:
        attributes: dict[str, Any] = {"autothrottle.slot": self.label(event.slot)}
        if event.kind == "response":
            attributes["http.response.status_code"] = event.status
            self._responses.add(1, attributes)
            if event.latency is not None:
                self._latency.record(
                    event.latency, {"autothrottle.slot": attributes["autothrottle.slot"]}
                )
        elif event.kind == "failure":
            attributes["error.type"] = event.reason
            self._failures.add(1, attributes)
        elif event.kind == "backoff":
            attributes["autothrottle.reason"] = event.reason
            self._backoffs.add(1, attributes)

    def _gauge(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            rows = self._throttle.stats(top=self._top_n).slots
            return [
                Observation(getattr(row, name), {"autothrottle.slot": self.label(row.key)})
                for row in rows
            ]

        return observe


def instrument(
    throttle: Throttle,
    *,
    meter_provider: metrics.MeterProvider | None = None,
    top_n: int = 20,
    slot_label: Callable[[str], str] | None = None,
) -> Instrumentation:
    """Record ``throttle``'s responses, failures, backoffs, latency and gauges.

    Args:
        throttle: The throttle to instrument.
        meter_provider: Where the instruments live; default the global one.
        top_n: Slots that keep their own label (the rest are ``"other"``),
            and the number of slots the gauges report.
        slot_label: Maps a slot key to its label instead, bounding the
            attribute's values yourself.

    Raises:
        TypeError, ValueError: a bad argument, named.
    """
    check_throttle(throttle, "instrument")
    top_n = check_int("top_n", top_n, minimum=1)
    if slot_label is not None and not callable(slot_label):
        raise TypeError(f"slot_label must be a callable from slot key to str, got {slot_label!r}")
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    meter = provider.get_meter("autothrottle")
    return Instrumentation(throttle, meter, top_n, slot_label)
