"""Validation: every bad setting fails at once, naming the parameter and the value.

Also the per-request options (mapping and ``X-AutoThrottle`` header) and the
default slot key of a URL or host.
"""

from __future__ import annotations

import math
import random
from typing import Any, cast

import pytest

from autothrottle import AutoThrottlePolicy, Throttle
from autothrottle._request import host_key, options_from_header, options_from_mapping
from autothrottle.options import CONTROL_HEADER, RequestOptions
from autothrottle.store import MemoryStore


def assert_names(info: pytest.ExceptionInfo[BaseException], name: str, value: object) -> None:
    message = str(info.value)
    assert name in message, message
    assert repr(value) in message, message


# -- Throttle arguments -----------------------------------------------------------

FLOAT_PARAMS = ["start_delay", "max_delay", "min_delay", "target_concurrency", "jitter"]

BAD_TYPES: list[object] = ["1", "", None, True, False, [1.0], b"1", 1j]
NON_FINITE: list[object] = [math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("name", FLOAT_PARAMS)
@pytest.mark.parametrize("value", BAD_TYPES, ids=repr)
def test_number_parameters_reject_wrong_types(name: str, value: object) -> None:
    if name == "start_delay" and value is None:
        return  # None is the policy's own start (test_the_start_delay_none_is_the_policys)
    with pytest.raises(TypeError) as info:
        Throttle(**cast(dict[str, Any], {name: value}))
    assert_names(info, name, value)


@pytest.mark.parametrize("name", FLOAT_PARAMS)
@pytest.mark.parametrize("value", NON_FINITE, ids=repr)
def test_number_parameters_reject_nan_and_infinities(name: str, value: object) -> None:
    kwargs: dict[str, Any] = {name: value}
    if name == "min_delay" and value == math.inf:
        kwargs["max_delay"] = math.inf  # make the finiteness the only fault
    with pytest.raises(ValueError) as info:
        Throttle(**kwargs)
    assert name in str(info.value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "name", "value"),
    [
        ({"start_delay": -1}, "start_delay", -1),
        ({"start_delay": -0.001}, "start_delay", -0.001),
        ({"max_delay": -1.0}, "max_delay", -1.0),
        ({"min_delay": -0.5}, "min_delay", -0.5),
        ({"target_concurrency": 0}, "target_concurrency", 0),
        ({"target_concurrency": 0.0}, "target_concurrency", 0.0),
        ({"target_concurrency": -1.0}, "target_concurrency", -1.0),
        ({"target_concurrency": -0.5}, "target_concurrency", -0.5),
        ({"max_concurrency": 0}, "max_concurrency", 0),
        ({"max_concurrency": -3}, "max_concurrency", -3),
        ({"jitter": -0.1}, "jitter", -0.1),
        ({"jitter": 1.0}, "jitter", 1.0),
        ({"jitter": 1}, "jitter", 1),
        ({"jitter": 1.5}, "jitter", 1.5),
        ({"hold_timeout": 0}, "hold_timeout", 0),
        ({"hold_timeout": -1.0}, "hold_timeout", -1.0),
        ({"hold_timeout": math.nan}, "hold_timeout", math.nan),
        ({"hold_timeout": -math.inf}, "hold_timeout", -math.inf),
    ],
)
def test_out_of_range_values_raise_value_error(
    kwargs: dict[str, Any], name: str, value: object
) -> None:
    with pytest.raises(ValueError) as info:
        Throttle(**kwargs)
    assert_names(info, name, value)


@pytest.mark.parametrize(
    ("max_delay", "min_delay"),
    [(1.0, 2.0), (0.0, 0.5), (4, 5), (59.9, 60.0)],
)
def test_max_delay_below_min_delay(max_delay: float, min_delay: float) -> None:
    with pytest.raises(ValueError) as info:
        Throttle(max_delay=max_delay, min_delay=min_delay)
    message = str(info.value)
    assert "max_delay" in message
    assert "min_delay" in message
    assert repr(max_delay) in message
    assert repr(min_delay) in message


def test_default_max_delay_below_a_large_min_delay() -> None:
    with pytest.raises(ValueError) as info:
        Throttle(min_delay=61.0)  # default max_delay is 60
    assert "min_delay" in str(info.value)
    assert "61.0" in str(info.value)


@pytest.mark.parametrize("value", [1.5, 2.0, "2", None, True, False, [2]], ids=repr)
def test_max_concurrency_must_be_an_int(value: object) -> None:
    with pytest.raises(TypeError) as info:
        Throttle(max_concurrency=value)  # type: ignore[arg-type]
    assert_names(info, "max_concurrency", value)


@pytest.mark.parametrize("value", ["yes", 1, 0, None, "False"], ids=repr)
def test_debug_must_be_a_bool(value: object) -> None:
    with pytest.raises(TypeError) as info:
        Throttle(debug=value)  # type: ignore[arg-type]
    assert_names(info, "debug", value)


@pytest.mark.parametrize("value", ["host", 5, b"x", ("a",)], ids=repr)
def test_key_must_be_callable(value: object) -> None:
    with pytest.raises(TypeError) as info:
        Throttle(key=value)  # type: ignore[arg-type]
    assert_names(info, "key", value)


class NotAPolicy:
    def initial_delay(self, config: object) -> float:  # no next_delay
        return 1.0

    def __repr__(self) -> str:
        return "NotAPolicy()"


class NotAStore:
    def get(self, key: str) -> None:  # no get_or_create, no __iter__, no __len__
        return None

    def __repr__(self) -> str:
        return "NotAStore()"


@pytest.mark.parametrize("value", ["scrapy", 5, NotAPolicy()], ids=repr)
def test_policy_must_implement_delay_policy(value: object) -> None:
    with pytest.raises(TypeError) as info:
        Throttle(policy=value)  # type: ignore[arg-type]
    assert_names(info, "policy", value)


@pytest.mark.parametrize("value", [{}, "memory", NotAStore(), [1]], ids=repr)
def test_store_must_implement_slot_store(value: object) -> None:
    with pytest.raises(TypeError) as info:
        Throttle(store=value)  # type: ignore[arg-type]
    assert_names(info, "store", value)


@pytest.mark.parametrize("value", [5.0, "monotonic", None], ids=repr)
def test_clock_must_be_callable(value: object) -> None:
    with pytest.raises(TypeError) as info:
        Throttle(clock=value)  # type: ignore[arg-type]
    assert_names(info, "clock", value)


@pytest.mark.parametrize("value", [42, "seed", random.random], ids=["int", "str", "function"])
def test_rng_must_be_a_random(value: object) -> None:
    with pytest.raises(TypeError) as info:
        Throttle(rng=value)  # type: ignore[arg-type]
    assert_names(info, "rng", value)


@pytest.mark.parametrize("value", ["300", None, True, [1]], ids=repr)
def test_hold_timeout_wrong_type(value: object) -> None:
    with pytest.raises(TypeError) as info:
        Throttle(hold_timeout=value)  # type: ignore[arg-type]
    assert_names(info, "hold_timeout", value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("backoff_statuses", "429"),
        ("backoff_statuses", None),
        ("backoff_statuses", [99]),
        ("backoff_statuses", [600]),
        ("backoff_statuses", [True]),
        ("backoff_statuses", [429.0]),
        ("backoff_factor", 0.5),
        ("backoff_factor", math.nan),
        ("backoff_factor", "2"),
        ("max_pause", -1.0),
        ("max_pause", None),
        ("strict_scrapy", 1),
        ("backoff_on_failure", None),
        ("retry_after", "yes"),
        ("rate_limit_headers", 0),
        ("cache_hits_lower_delay", 1),
        ("wall_clock", 3.0),
        ("block_classifier", "block"),
        ("hosts", 5),
    ],
    ids=repr,
)
def test_signal_settings_are_validated_too(name: str, value: object) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        Throttle(**cast(dict[str, Any], {name: value}))
    shown = value[0] if isinstance(value, list) else value  # the offending member
    assert_names(info, name, shown)


@pytest.mark.parametrize(
    "name", ["start_delay", "max_delay", "min_delay", "target_concurrency", "hold_timeout"]
)
def test_an_int_too_large_for_a_float_raises_value_error(name: str) -> None:
    value = 10**400  # an int, but no finite float
    kwargs: dict[str, Any] = {name: value}
    if name == "min_delay":
        kwargs["max_delay"] = 10**400
    with pytest.raises(ValueError) as info:
        Throttle(**kwargs)
    assert name in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"start_delay": 0, "min_delay": 0, "max_delay": 0},
        {"start_delay": 0.0, "max_delay": 0.0},
        {"min_delay": 60.0, "max_delay": 60.0},
        {"start_delay": 100.0},  # above max_delay: allowed, the slot is clamped
        {"target_concurrency": 0.001},
        {"target_concurrency": 64},
        {"max_concurrency": 1},
        {"max_concurrency": 10_000},
        {"jitter": 0},
        {"jitter": 0.999},
        {"debug": True},
        {"hold_timeout": math.inf},
        {"hold_timeout": 0.001},
        {"key": lambda url: "one"},
        {"store": MemoryStore(idle_timeout=1.0)},
        {"rng": random.Random(1)},
        {"clock": lambda: 0.0},
    ],
)
def test_valid_arguments_are_accepted(kwargs: dict[str, Any]) -> None:
    Throttle(**kwargs)


def test_arguments_are_keyword_only() -> None:
    # Throttle(2.0) reads as a target to most people and as Scrapy's start delay to others.
    with pytest.raises(TypeError):
        Throttle(2.0)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("name", "value"),
    [("strict_scrapy", True), ("backoff_factor", 3.0), ("debug", True), ("max_pause", 1.0)],
)
def test_settings_are_read_only_after_construction(name: str, value: object) -> None:
    throttle = Throttle()
    with pytest.raises(AttributeError):
        setattr(throttle, name, value)


def test_integer_settings_are_stored_as_floats() -> None:
    config = Throttle(start_delay=2, max_delay=10, min_delay=1, target_concurrency=3).config
    for value in (config.start_delay, config.max_delay, config.min_delay):
        assert type(value) is float
    assert type(config.target_concurrency) is float


# -- MemoryStore ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-1.0, ValueError),
        (math.nan, ValueError),
        (-math.inf, ValueError),
        ("600", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
    ids=repr,
)
def test_memory_store_idle_timeout(value: object, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        MemoryStore(idle_timeout=value)  # type: ignore[arg-type]
    assert_names(info, "idle_timeout", value)


def test_memory_store_accepts_infinite_idle_timeout() -> None:
    assert MemoryStore(idle_timeout=math.inf).idle_timeout == math.inf


# -- Slot.delay -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (-1.0, ValueError),
        (-0.001, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("2", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
    ids=repr,
)
def test_slot_delay_setter_rejects_bad_values(value: object, error: type[Exception]) -> None:
    slot = Throttle(start_delay=5.0).slot("example.com")
    with pytest.raises(error) as info:
        slot.delay = value  # type: ignore[assignment]
    assert_names(info, "delay", value)
    assert slot.delay == 5.0


@pytest.mark.parametrize(("value", "expected"), [(2, 2.0), (0, 0.0), (0.25, 0.25), (30.0, 30.0)])
def test_slot_delay_setter_accepts_numbers(value: float, expected: float) -> None:
    slot = Throttle(start_delay=5.0).slot("example.com")
    slot.delay = value
    assert slot.delay == expected
    assert type(slot.delay) is float


@pytest.mark.parametrize("key", ["", None, 5, b"host"], ids=repr)
def test_throttle_slot_rejects_a_bad_key(key: object) -> None:
    with pytest.raises(TypeError) as info:
        Throttle().slot(key)  # type: ignore[arg-type]
    assert_names(info, "key", key)


# -- per-request options: mapping -------------------------------------------------


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        (None, RequestOptions()),
        ("autothrottle", RequestOptions()),
        ([("autothrottle", {"bypass": True})], RequestOptions()),
        ({}, RequestOptions()),
        ({"other": 1}, RequestOptions()),
        ({"autothrottle": None}, RequestOptions()),
        ({"autothrottle": {}}, RequestOptions()),
        ({"autothrottle": {"adjust": False}}, RequestOptions(adjust=False)),
        ({"autothrottle": {"adjust": True}}, RequestOptions()),
        ({"autothrottle": {"bypass": True}}, RequestOptions(bypass=True)),
        ({"autothrottle": {"bypass": False}}, RequestOptions()),
        ({"autothrottle": {"slot": "api"}}, RequestOptions(slot="api")),
        (
            {"autothrottle": {"adjust": False, "bypass": True, "slot": "Api"}},
            RequestOptions(adjust=False, bypass=True, slot="Api"),
        ),
    ],
)
def test_options_from_mapping(container: object, expected: RequestOptions) -> None:
    assert options_from_mapping(container) == expected


@pytest.mark.parametrize(
    ("raw", "error", "name", "value"),
    [
        ("bypass", TypeError, "autothrottle", "bypass"),
        (["adjust"], TypeError, "autothrottle", ["adjust"]),
        (True, TypeError, "autothrottle", True),
        ({"adjust": "no"}, TypeError, "adjust", "no"),
        ({"adjust": 0}, TypeError, "adjust", 0),
        ({"adjust": None}, TypeError, "adjust", None),
        ({"bypass": 1}, TypeError, "bypass", 1),
        ({"bypass": "yes"}, TypeError, "bypass", "yes"),
        ({"slot": 5}, TypeError, "slot", 5),
        ({"slot": b"api"}, TypeError, "slot", b"api"),
        ({"slot": ""}, (TypeError, ValueError), "slot", ""),
        ({"ajdust": False}, ValueError, "ajdust", None),
        ({"adjust": False, "slots": "x"}, ValueError, "slots", None),
    ],
    ids=repr,
)
def test_options_from_mapping_errors(
    raw: object, error: type[Exception] | tuple[type[Exception], ...], name: str, value: object
) -> None:
    with pytest.raises(error) as info:
        options_from_mapping({"autothrottle": raw})
    message = str(info.value)
    assert name in message, message
    if value is not None:
        assert repr(value) in message, message


# -- per-request options: header --------------------------------------------------


def test_control_header_name() -> None:
    assert CONTROL_HEADER == "X-AutoThrottle"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("no-adjust", RequestOptions(adjust=False)),
        ("No-Adjust", RequestOptions(adjust=False)),
        ("bypass", RequestOptions(bypass=True)),
        ("BYPASS", RequestOptions(bypass=True)),
        ("slot=api", RequestOptions(slot="api")),
        ("slot=Api.Example", RequestOptions(slot="Api.Example")),  # the name keeps its case
        ("SLOT=api", RequestOptions(slot="api")),
        ("slot= api ", RequestOptions(slot="api")),
        ("  bypass  ", RequestOptions(bypass=True)),
        ("no-adjust, slot=x", RequestOptions(adjust=False, slot="x")),
        ("bypass,no-adjust", RequestOptions(adjust=False, bypass=True)),
    ],
)
def test_options_from_header(value: str, expected: RequestOptions) -> None:
    assert options_from_header(value) == expected


@pytest.mark.parametrize(
    ("value", "culprit"),
    [
        ("slot=", "slot"),
        ("slot=   ", "slot"),
        ("bogus", "bogus"),
        ("no_adjust", "no_adjust"),
        ("nobypass", "nobypass"),
        ("bypass, turbo", "turbo"),
        ("adjust=false", "adjust=false"),
    ],
)
def test_options_from_header_errors(value: str, culprit: str) -> None:
    with pytest.raises(ValueError) as info:
        options_from_header(value)
    message = str(info.value)
    assert CONTROL_HEADER in message, message
    assert culprit in message, message
    assert repr(value) in message, message


def test_merged_options() -> None:
    a = RequestOptions(adjust=False, slot="a")
    b = RequestOptions(bypass=True, slot="b")
    assert a.merged(b) == RequestOptions(adjust=False, bypass=True, slot="b")
    assert b.merged(RequestOptions()) == RequestOptions(bypass=True, slot="b")


# -- the default slot key ---------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        # lowercase
        ("Example.COM", "example.com"),
        ("http://Example.COM/path?q=1", "example.com"),
        ("HTTPS://WWW.EXAMPLE.COM", "www.example.com"),
        # port excluded
        ("http://example.com:8080/x", "example.com"),
        ("https://Example.com:443/", "example.com"),
        ("http://127.0.0.2:9001/", "127.0.0.2"),
        ("http://user:secret@Host.example:81/", "host.example"),
        # IDNA
        ("bücher.de", "xn--bcher-kva.de"),
        ("BÜCHER.de", "xn--bcher-kva.de"),
        ("http://Bücher.DE:8443/a", "xn--bcher-kva.de"),
        ("http://xn--bcher-kva.de/", "xn--bcher-kva.de"),
        # IPv6
        ("http://[::1]:8080/", "::1"),
        ("http://[2001:DB8::1]/", "2001:db8::1"),
        ("::1", "::1"),
        ("2001:DB8::1", "2001:db8::1"),
    ],
)
def test_host_key(host: str, expected: str) -> None:
    assert host_key(host) == expected


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("example.com:8080", "example.com"),
        ("Example.COM:443", "example.com"),
        ("[::1]", "::1"),
        ("[::1]:8080", "::1"),
    ],
)
def test_host_key_of_a_bare_authority_excludes_the_port(host: str, expected: str) -> None:
    assert host_key(host) == expected


@pytest.mark.parametrize("url", ["/just/a/path", "", "http:///no-host"])
def test_key_for_a_url_without_host_raises_naming_the_url(url: str) -> None:
    with pytest.raises(ValueError) as info:
        Throttle().key_for(url)
    assert repr(url) in str(info.value)


def test_key_for_uses_host_key_by_default() -> None:
    throttle = Throttle()
    assert throttle.key_for("http://Bücher.DE:8080/x") == "xn--bcher-kva.de"
    assert throttle.key_for("http://a.example/") != throttle.key_for("http://b.example/")
    assert throttle.key_for("http://a.example:1/") == throttle.key_for("https://A.example:2/")


def test_key_for_uses_the_key_function() -> None:
    seen: list[str] = []

    def by_path(url: str) -> str:
        seen.append(url)
        return url.rsplit("/", 1)[-1]

    throttle = Throttle(key=by_path)
    assert throttle.key_for("http://example.com/api") == "api"
    assert seen == ["http://example.com/api"]


@pytest.mark.parametrize("result", ["", None, 5, b"host"], ids=repr)
def test_key_for_rejects_a_bad_key_function_result(result: object) -> None:
    throttle = Throttle(key=lambda url: result)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError) as info:
        throttle.key_for("http://example.com/")
    assert "key" in str(info.value)
    assert repr(result) in str(info.value)


# -- one response's values --------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("latency", math.nan),
        ("latency", math.inf),
        ("latency", -0.5),
        ("latency", "0.1"),
        ("latency", True),
        ("status", True),
        ("status", "200"),
        ("status", 200.0),
        ("headers", [("Age", "1")]),
        ("from_cache", 1),
    ],
    ids=repr,
)
def test_each_response_is_checked_after_good_ones_too(field: str, bad: object) -> None:
    # The good values adapters hand over take a short way through the checks;
    # a bad one must still fail, naming the value, however many came before.
    throttle = Throttle(start_delay=0.0)
    good: dict[str, Any] = {"latency": 0.01, "status": 200, "headers": {"Age": "0"}}
    for _ in range(3):
        throttle.observe("k", **good)
    with pytest.raises((TypeError, ValueError)) as info:
        throttle.observe("k", **{**good, field: bad})
    assert_names(info, field, bad)


def test_the_start_delay_none_is_the_policys() -> None:
    assert Throttle().config.start_delay == 1.0  # the adaptive policy's
    assert Throttle(start_delay=None, policy=AutoThrottlePolicy()).config.start_delay == 5.0
    assert Throttle(start_delay=2.0, policy=AutoThrottlePolicy()).config.start_delay == 2.0
    # A host given its own policy starts at that policy's start, when the
    # throttle's was its policy's own too.
    throttle = Throttle(hosts={"scrapy.test": {"policy": AutoThrottlePolicy()}})
    assert throttle.config_for("scrapy.test").start_delay == 5.0
    fixed = Throttle(start_delay=2.0, hosts={"scrapy.test": {"policy": AutoThrottlePolicy()}})
    assert fixed.config_for("scrapy.test").start_delay == 2.0
    # A start the user gave is theirs, though it equals the policy's own (1.0):
    # the host with a policy of its own keeps it, and so does one added later.
    given = Throttle(start_delay=1.0, hosts={"scrapy.test": {"policy": AutoThrottlePolicy()}})
    assert given.config_for("scrapy.test").start_delay == 1.0
    given.set_host("later.test", {"policy": AutoThrottlePolicy()})
    assert given.config_for("later.test").start_delay == 1.0
    unset = Throttle()
    unset.set_host("later.test", {"policy": AutoThrottlePolicy()})
    assert unset.config_for("later.test").start_delay == 5.0
