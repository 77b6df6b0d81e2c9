"""A slot's learned state: its flat form, and every field checked when it is loaded.

The flat form is what state files and shared records hold: it stays byte for
byte what earlier versions wrote, so their files still load. A file comes from
outside the process, so every field is checked on load (docs/fleet.md, "State
files"): a bad one raises a ValueError naming the slot and the field, at load
time, never an error later inside a request; and a throttle that takes a
loaded record holds it to its own bounds (max_pause, max_delay).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from autothrottle import AdaptiveConcurrencyPolicy, Throttle
from autothrottle.store import MemoryStore, SlotState
from helpers import FakeClock, record_of

GOLDEN = (Path(__file__).parent / "data" / "slot-state.json").read_text()
"""A record as this engine wrote it before its state was split into owned records
(the scenario of :func:`learned`, saved 0.5 s after its last response)."""


def learned() -> tuple[FakeClock, MemoryStore]:
    """Responses, a rate-limit budget, a cache hit, a 404 and a 429, on a fake clock."""
    clock = FakeClock()
    store = MemoryStore()
    throttle = Throttle(
        start_delay=1.0,
        store=store,
        clock=clock,
        wall_clock=clock.wall,
        policy=AdaptiveConcurrencyPolicy(),
    )
    budget = {"RateLimit": '"d";r=5;t=10', "RateLimit-Policy": '"d";q=10;w=10'}
    for _ in range(12):
        throttle.try_acquire("a")
        clock.advance(1.0)
        throttle.observe("a", latency=0.2, status=200, headers=budget)
    throttle.observe("a", latency=0.01, status=200, headers={"Age": "3"})
    throttle.observe("a", latency=0.3, status=404)
    throttle.observe("a", latency=0.1, status=429, headers={"Retry-After": "30"})
    clock.advance(0.5)
    return clock, store


def test_the_flat_form_is_what_earlier_versions_wrote() -> None:
    clock, store = learned()
    state = store.load("a")
    assert state is not None
    assert json.dumps(state.to_dict(clock.now)) == GOLDEN


def test_an_earlier_file_loads_and_writes_back_byte_for_byte() -> None:
    loaded = SlotState.from_dict(json.loads(GOLDEN), now=7.0)
    assert json.dumps(loaded.to_dict(now=7.0)) == GOLDEN
    assert loaded.delay == 0.2
    assert loaded.pause_until == pytest.approx(7.0 + 29.5)
    assert loaded.status_counts == {200: 13, 404: 1, 429: 1}


def test_every_field_reads_flat_and_none_can_be_set_flat() -> None:
    state = SlotState(delay=1.0, refused_gap=0.5, miss_share=0.5)
    assert (state.delay, state.refused_gap, state.miss_share) == (1.0, 0.5, 0.5)
    assert state.pace.delay == 1.0 and state.refusal.refused_gap == 0.5
    with pytest.raises(AttributeError):
        state.delay = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError, match="colour"):
        SlotState(delay=1.0, colour="red")


def good() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(GOLDEN)
    return doc


def changed(**fields: object) -> dict[str, Any]:
    data = good()
    data.update(fields)
    return data


def deep(levels: int) -> object:
    value: object = 1.0
    for _ in range(levels):
        value = {"x": value}
    return value


BAD_FIELDS = [
    # wrongly typed: each would have raised later, inside a request
    ("delay", "0.2"),
    ("delay", True),
    ("sent", 2.5),
    ("sent", "2"),
    ("in_flight_cap", None),
    ("miss_share", [1.0]),
    ("latency_buckets", [1] * 79),  # an IndexError at the next response
    ("latency_buckets", {"0": 1}),
    ("latency_buckets", [0.5] * 80),
    ("status_counts", [[200, 1]]),  # a list where a mapping belongs
    ("status_counts", {"ok": 1}),
    ("backoff_reasons", ["status 429"]),
    ("backoff_reasons", {"status 429": -1}),
    ("policy_state", [1.0]),
    ("policy_state", {"limit": "2"}),
    ("policy_state", {"limit": {"deeper": 1.0}}),
    ("rate_limit", [5, 10.0]),
    ("rate_limit", {"remaining": 5}),
    ("rate_limit", {"remaining": "5", "reset": 1.0}),
    ("rate_limit", {"remaining": 5, "reset": 1.0, "windows": {"a": 1}}),
    ("rate_limit", {"remaining": 5, "reset": 1.0, "colour": "red"}),
    ("backoff_reason", 429),
    ("pause_until", "soon"),
    ("pause_until", [1.0]),
    # absurd numbers: each would have overflowed, divided by zero or stalled
    ("delay", -1.0),
    ("delay", 1e300),
    ("delay", 10**400),
    ("hit_latency", 1e300),
    ("miss_share", 0.0),
    ("miss_share", 1.5),
    ("sent", -1),
    ("sent", 10**30),
    ("allowed", -3.0),
    ("pause_until", 1e300),
    ("backoff_at", -1e300),
    ("rate_limit", {"remaining": 5, "reset": 1e300}),
    ("policy_state", {"limit": 1e300}),
    ("backoff_reason", "x" * 5000),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
def test_a_bad_field_is_refused_naming_it(field: str, value: object) -> None:
    with pytest.raises((TypeError, ValueError), match=field):
        SlotState.from_dict(changed(**{field: value}), now=100.0)


def test_nested_windows_are_refused_not_recursed() -> None:
    window: dict[str, Any] = {"remaining": 1, "reset": 1.0, "windows": []}
    for _ in range(2000):
        window = {"remaining": 1, "reset": 1.0, "windows": [window]}
    with pytest.raises(ValueError, match="rate_limit"):
        SlotState.from_dict(changed(rate_limit=window), now=100.0)


def write(path: Path, document: object) -> Path:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
def test_a_file_with_a_bad_field_raises_a_value_error_naming_slot_and_field(
    tmp_path: Path, field: str, value: object
) -> None:
    data = changed(**{field: value})
    path = write(tmp_path / "learned.json", {"autothrottle_slots": 1, "slots": {"api": data}})
    with pytest.raises(ValueError, match=rf"learned\.json.*'api'.*{field}"):
        MemoryStore.from_file(path, now=100.0)


@pytest.mark.parametrize(
    "document",
    [
        [1, 2],
        {"slots": []},  # a list where the mapping of slots belongs
        {"slots": {"api": []}},
        {"slots": {"api": [["delay", 1.0]]}},
        {"slots": "api"},
        {"autothrottle_slots": 1},
        {"slots": {"api": {"delay": 1.0, "policy_state": deep(100)}}},
        "[" * 100_000 + "]" * 100_000,  # deep nesting: no RecursionError
        '{"slots": {"api": {"delay": NaN}}}',
        '{"slots": {"api": {"delay": Infinity}}}',
        "not json",
        b"\xff\xfe".decode("latin-1"),
    ],
)
def test_a_file_that_is_no_state_file_raises_a_value_error(
    tmp_path: Path, document: object
) -> None:
    path = write(tmp_path / "learned.json", document)
    with pytest.raises(ValueError, match=r"learned\.json"):
        MemoryStore.from_file(path, now=100.0)


def test_a_file_of_bad_bytes_raises_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "learned.json"
    path.write_bytes(b'{"slots": {"\xff": {"delay": 1.0}}}')
    with pytest.raises(ValueError, match=r"learned\.json"):
        MemoryStore.from_file(path, now=100.0)


def loaded_throttle(tmp_path: Path, data: dict[str, Any], **settings: Any) -> Throttle:
    """A throttle on a fake clock at 100.0 whose store was loaded from a file holding ``data``."""
    path = write(tmp_path / "learned.json", {"autothrottle_slots": 1, "slots": {"api": data}})
    clock = FakeClock(100.0)
    store = MemoryStore.from_file(path, now=clock.now)
    return Throttle(store=store, clock=clock, **settings)


def test_a_pause_loaded_from_a_file_obeys_the_loading_throttles_max_pause(tmp_path: Path) -> None:
    an_hour = {"delay": 0.5, "pause_until": -3600.0}  # ends an hour from now
    slot = loaded_throttle(tmp_path, an_hour, max_pause=2.0).slot("api")
    assert slot.snapshot().pause_remaining == pytest.approx(2.0)
    assert slot.pause_until == pytest.approx(102.0)


def test_a_budget_loaded_from_a_file_obeys_the_loading_throttles_max_pause(
    tmp_path: Path,
) -> None:
    data = {
        "delay": 0.5,
        "budget_gap": 3600.0,
        "budget_until": -3600.0,
        "sustained_gap": 3600.0,
        "sustained_until": -3600.0,
    }
    throttle = loaded_throttle(tmp_path, data, max_pause=2.0, start_delay=0.0)
    first = throttle.try_acquire("api")
    assert first is not None
    state = record_of(throttle.slot("api"))
    assert state.budget_until == pytest.approx(102.0)
    assert state.sustained_until == pytest.approx(102.0)
    assert record_of(throttle.slot("api")).pace.delay == 0.5
    # The next send waits for the budget's end at most, not an hour.
    assert throttle.slot("api").snapshot().pause_remaining == 0.0
    gate = throttle.slot("api")
    assert gate.idle is False  # the budget still holds for two seconds


def test_a_delay_loaded_from_a_file_obeys_the_loading_throttles_max_delay(tmp_path: Path) -> None:
    slot = loaded_throttle(tmp_path, {"delay": 3000.0}, max_delay=10.0).slot("api")
    assert slot.delay == 10.0


def test_times_of_past_events_loaded_from_the_future_are_placed_now(tmp_path: Path) -> None:
    data = {"delay": 0.5, "backoff_at": -3600.0, "last_activity": -3600.0, "adjusted_at": -60.0}
    throttle = loaded_throttle(tmp_path, data)
    state = record_of(throttle.slot("api"))
    assert (state.backoff_at, state.last_activity, state.adjusted_at) == (100.0, 100.0, 100.0)
    # A backoff "an hour from now" would have made every refusal for an hour look like lag.
    assert throttle.backoff("api", sent_at=100.5) is True


def test_a_cap_loaded_from_a_file_obeys_the_loading_throttles_max_concurrency(
    tmp_path: Path,
) -> None:
    state = record_of(
        loaded_throttle(tmp_path, {"delay": 0.5, "in_flight_cap": 10**6}, max_concurrency=4).slot(
            "api"
        )
    )
    assert state.in_flight_cap == 4


def test_a_loaded_record_is_used_inside_requests_without_errors(tmp_path: Path) -> None:
    """The golden record, loaded, serves responses of every kind."""
    throttle = loaded_throttle(tmp_path, good(), policy=AdaptiveConcurrencyPolicy())
    for status, headers in [(200, {}), (200, {"Age": "1"}), (429, {}), (503, {"Retry-After": "1"})]:
        throttle.observe("api", latency=0.05, status=status, headers=headers)
    assert math.isfinite(throttle.slot("api").delay)
    assert throttle.stats().totals is not None


@pytest.mark.parametrize("limit", [0.0, -3.0])
def test_a_loaded_policy_memory_that_is_no_limit_starts_from_the_initial_one(
    tmp_path: Path, limit: float
) -> None:
    data = {"delay": 0.5, "policy_state": {"limit": limit, "base": 0.1}}
    throttle = loaded_throttle(tmp_path, data, policy=AdaptiveConcurrencyPolicy(initial_limit=2))
    throttle.observe("api", latency=0.1, status=200)  # was a ZeroDivisionError inside a request
    assert record_of(throttle.slot("api")).in_flight_cap == 2
