"""OpenTelemetry metrics, read back with the SDK's in-memory reader."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from autothrottle import Throttle, ThrottleEvent
from autothrottle.httpx import AsyncThrottledClient
from autothrottle.otel import instrument
from helpers import FakeClock

sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics")
export = pytest.importorskip("opentelemetry.sdk.metrics.export")


def points(reader: Any) -> dict[str, list[Any]]:
    """Every data point by metric name."""
    found: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def provider_and_reader() -> tuple[Any, Any]:
    reader = export.InMemoryMetricReader()
    return sdk_metrics.MeterProvider(metric_readers=[reader]), reader


def respond(throttle: Throttle, clock: FakeClock, key: str, status: int, latency: float) -> None:
    clock.advance(100.0)
    lease = throttle.try_acquire(key)
    assert lease is not None
    lease.observe(latency=latency, status=status)
    lease.release()


def test_counters_histogram_and_gauges_follow_the_traffic() -> None:
    provider, reader = provider_and_reader()
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, clock=clock)
    instrument(throttle, meter_provider=provider)
    for _ in range(3):
        respond(throttle, clock, "a", 200, 0.05)
    respond(throttle, clock, "a", 429, 0.05)
    found = points(reader)
    by_status = {
        p.attributes["http.response.status_code"]: p.value for p in found["autothrottle.responses"]
    }
    assert by_status == {200: 3, 429: 1}
    (backoff,) = found["autothrottle.backoffs"]
    assert (backoff.value, backoff.attributes["autothrottle.reason"]) == (1, "status 429")
    (latency,) = found["autothrottle.latency"]
    assert latency.count == 4 and latency.sum == pytest.approx(0.2)
    (delay,) = found["autothrottle.delay"]
    assert delay.attributes["autothrottle.slot"] == "a"
    assert delay.value == pytest.approx(throttle.slot("a").delay)


def test_slot_labels_stay_bounded() -> None:
    provider, reader = provider_and_reader()
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, clock=clock)
    instrument(throttle, meter_provider=provider, top_n=3)
    for index in range(10):
        respond(throttle, clock, f"host{index}", 200, 0.01)
    labels = {p.attributes["autothrottle.slot"] for p in points(reader)["autothrottle.responses"]}
    assert labels == {"host0", "host1", "host2", "other"}


def test_a_slot_label_function_groups_slots() -> None:
    provider, reader = provider_and_reader()
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, clock=clock)
    instrument(throttle, meter_provider=provider, slot_label=lambda key: key.split(".", 1)[-1])
    respond(throttle, clock, "a.example.com", 200, 0.01)
    respond(throttle, clock, "b.example.com", 200, 0.01)
    (point,) = points(reader)["autothrottle.responses"]
    assert (point.attributes["autothrottle.slot"], point.value) == ("example.com", 2)


async def test_requests_through_the_httpx_adapter_are_counted() -> None:
    provider, reader = provider_and_reader()
    throttle = Throttle(start_delay=0.0)
    instrumentation = instrument(throttle, meter_provider=provider)
    inner = httpx.MockTransport(lambda request: httpx.Response(503))
    async with AsyncThrottledClient(throttle=throttle, transport=inner) as client:
        await client.get("http://api.example/")
    instrumentation.stop()
    async with AsyncThrottledClient(throttle=throttle, transport=inner) as client:
        await client.get("http://api.example/")  # not counted any more
    (point,) = points(reader)["autothrottle.responses"]
    assert (point.attributes["http.response.status_code"], point.value) == (503, 1)


def test_a_failing_listener_is_logged_and_does_not_break_the_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    throttle = Throttle(start_delay=0.0, clock=clock)
    seen: list[ThrottleEvent] = []

    def broken(event: ThrottleEvent) -> None:
        raise RuntimeError("metrics backend down")

    throttle.listen(broken)
    stop = throttle.listen(seen.append)
    respond(throttle, clock, "a", 200, 0.01)
    assert [e.kind for e in seen] == ["response"]
    assert "listener" in caplog.text
    stop()
    respond(throttle, clock, "a", 200, 0.01)
    assert len(seen) == 1


@pytest.mark.parametrize(("name", "value"), [("top_n", 0), ("slot_label", "host")])
def test_bad_arguments_are_named(name: str, value: object) -> None:
    with pytest.raises((TypeError, ValueError), match=name):
        instrument(Throttle(), **{name: value})  # type: ignore[arg-type]
