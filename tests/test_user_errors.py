"""What a user reads after a slip at construction: the library's words, naming
the parameter and the value, and the fix; never a private name of ours.

Also the one line a Scrapy crawl logs at start when the project's own
``CONCURRENT_REQUESTS_PER_DOMAIN`` / ``DOWNLOAD_DELAY`` hold it to a cap or a
floor (a new project's 1 and 1 look like a throttle that does not adapt).
"""

from __future__ import annotations

import abc
import asyncio
import copy
import inspect
import logging
import re
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from autothrottle import Acquiring, AIMDPolicy, AutoThrottlePolicy, HostSettings, Lease, Throttle
from autothrottle._request import options_from_header
from autothrottle._scrapy_settings import kept_limits
from autothrottle.aiohttp import ThrottledSession, throttle_middleware
from autothrottle.httpx import (
    AsyncThrottledClient,
    AsyncThrottledTransport,
    ThrottledClient,
    ThrottledTransport,
)
from autothrottle.options import CONTROL_HEADER
from autothrottle.policy import policy_from_text
from autothrottle.requests import ThrottledHTTPAdapter
from autothrottle.requests import ThrottledSession as RequestsSession
from autothrottle.scrapy import AutoThrottleMiddleware
from autothrottle.testing import VirtualClock
from docstring_blocks import literal_block

PRIVATE = re.compile(r"(?<![\w.])_[A-Za-z]\w*|\._[A-Za-z]")
"""A private name of ours (``_SessionFactory``, ``autothrottle._policies``)."""

ADAPTERS: list[Callable[..., Any]] = [
    ThrottledSession,
    AsyncThrottledClient,
    AsyncThrottledTransport,
    ThrottledClient,
    ThrottledTransport,
    ThrottledHTTPAdapter,
    RequestsSession,
]


def message(error: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(error.value)
    assert not PRIVATE.search(text), text
    return text


# -- adapters without a throttle -----------------------------------------------------------


def test_an_aiohttp_session_without_a_throttle_says_what_to_pass() -> None:
    with pytest.raises(TypeError) as error:
        ThrottledSession()  # type: ignore[call-arg]
    text = message(error)
    assert "throttle=" in text
    assert "autothrottle.Throttle" in text
    assert "ThrottledSession(throttle=Throttle())" in text


def test_an_aiohttp_throttle_passed_positionally_is_pointed_at() -> None:
    with pytest.raises(TypeError) as error:
        ThrottledSession(Throttle())  # type: ignore[arg-type, call-arg]
    assert "positionally, where base_url goes" in message(error)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: f"{a.__module__}.{a.__name__}")
def test_every_adapter_without_a_throttle_names_the_parameter(adapter: Callable[..., Any]) -> None:
    with pytest.raises(TypeError) as error:
        adapter()
    assert "throttle" in message(error)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: f"{a.__module__}.{a.__name__}")
def test_every_adapter_with_a_wrong_throttle_names_it_and_the_value(
    adapter: Callable[..., Any],
) -> None:
    with pytest.raises(TypeError) as error:
        adapter(throttle="slow")
    text = message(error)
    assert "throttle must be an autothrottle.Throttle" in text
    assert "'slow'" in text


# -- a policy that is not one --------------------------------------------------------------


def test_a_policy_class_asks_for_an_instance() -> None:
    with pytest.raises(TypeError) as error:
        Throttle(policy=AutoThrottlePolicy)  # type: ignore[arg-type]
    text = message(error)
    assert "policy" in text
    assert "the class AutoThrottlePolicy" in text
    assert "pass an instance: policy=AutoThrottlePolicy()" in text


def test_a_policy_named_in_text_points_to_the_reader_of_text() -> None:
    with pytest.raises(TypeError) as error:
        Throttle(policy="adaptive")  # type: ignore[arg-type]
    text = message(error)
    assert "'adaptive'" in text
    assert "policy_from_text('adaptive')" in text
    # ... and what the message suggests is accepted.
    assert Throttle(policy=policy_from_text("adaptive")).config.policy is not None


def test_a_host_s_policy_gets_the_same_hint_under_its_host() -> None:
    with pytest.raises(TypeError) as error:
        Throttle(hosts={"api.example.com": HostSettings(policy=AIMDPolicy)})  # type: ignore[arg-type]
    text = message(error)
    assert "api.example.com" in text
    assert "policy=AIMDPolicy()" in text


def test_any_other_value_is_named() -> None:
    with pytest.raises(TypeError) as error:
        Throttle(policy=3)  # type: ignore[arg-type]
    assert "policy must be a DelayPolicy, got 3" in message(error)


# -- Scrapy: the project's own cap and floor, said once at start ---------------------------


def test_a_new_project_s_cap_and_floor_are_named_with_their_meaning() -> None:
    line = kept_limits(Settings({"CONCURRENT_REQUESTS_PER_DOMAIN": 1, "DOWNLOAD_DELAY": 1}))
    assert line is not None
    assert "CONCURRENT_REQUESTS_PER_DOMAIN = 1 (at most 1 request at a time per slot)" in line
    assert "DOWNLOAD_DELAY = 1 (never faster than 1/s per slot" in line
    assert "remove them" in line


def test_a_floor_without_jitter_is_exact_and_a_cap_plural() -> None:
    settings = {
        "CONCURRENT_REQUESTS_PER_DOMAIN": 4,
        "DOWNLOAD_DELAY": 0.25,
        "RANDOMIZE_DOWNLOAD_DELAY": False,
    }
    line = kept_limits(Settings(settings))
    assert line is not None
    assert "at most 4 requests at a time per slot" in line
    assert "never faster than 4/s per slot)" in line


@pytest.mark.filterwarnings("ignore:The CONCURRENT_REQUESTS_PER_IP setting is deprecated")
def test_the_per_ip_cap_is_the_one_named_when_set() -> None:
    line = kept_limits(Settings({"CONCURRENT_REQUESTS_PER_IP": 2}))
    assert line is not None
    assert "CONCURRENT_REQUESTS_PER_IP = 2" in line
    assert "CONCURRENT_REQUESTS_PER_DOMAIN" not in line
    assert "remove it " in line


@pytest.mark.parametrize(
    "settings",
    [{}, {"DOWNLOAD_DELAY": 0}, {"AUTOTHROTTLE_POLICY": "adaptive"}],
    ids=["scrapy-defaults", "no-floor", "other-settings"],
)
def test_scrapy_s_defaults_and_no_floor_say_nothing(settings: dict[str, Any]) -> None:
    assert kept_limits(Settings(settings)) is None


def _middleware_lines(
    caplog: pytest.LogCaptureFixture, settings: dict[str, Any]
) -> list[logging.LogRecord]:
    crawler = get_crawler(settings_dict={"AUTOTHROTTLE_ENABLED": False, **settings})
    with caplog.at_level(logging.INFO, logger="autothrottle.scrapy"):
        AutoThrottleMiddleware(crawler)
    return [r for r in caplog.records if "keeps the project's" in r.getMessage()]


def test_the_middleware_logs_the_line_once_at_info(caplog: pytest.LogCaptureFixture) -> None:
    lines = _middleware_lines(caplog, {"CONCURRENT_REQUESTS_PER_DOMAIN": 1, "DOWNLOAD_DELAY": 1})
    assert [r.levelno for r in lines] == [logging.INFO]
    assert "DOWNLOAD_DELAY = 1" in lines[0].getMessage()


def test_the_middleware_is_quiet_on_scrapy_s_defaults(caplog: pytest.LogCaptureFixture) -> None:
    assert _middleware_lines(caplog, {}) == []


# -- the per-request control header -----------------------------------------------------------

#: (the header value, the directive's key, the value given to it): each key's bad values.
BAD_HEADER_VALUES = [
    ("slot=", "slot", ""),
    ("bypass, SLOT=  ", "slot", ""),
    ("max-wait=abc", "max-wait", "abc"),
    ("max-wait=-1", "max-wait", "-1"),
    ("max-wait=nan", "max-wait", "nan"),
    ("max-wait=inf", "max-wait", "inf"),
    ("Max-Wait=", "max-wait", ""),
    ("no-adjust, max-wait=2s", "max-wait", "2s"),
    ("cost=abc", "cost", "abc"),
    ("cost=-5", "cost", "-5"),
    ("cost=1.5", "cost", "1.5"),
    ("cost=1+2+3", "cost", "1+2+3"),
    ("cost = 500+", "cost", "500+"),
    ("cost=99999999999999999", "cost", "99999999999999999"),
]


@pytest.mark.parametrize(("header", "key", "value"), BAD_HEADER_VALUES)
def test_a_bad_control_header_value_names_the_header_the_key_and_the_value(
    header: str, key: str, value: str
) -> None:
    """A user who set ``X-AutoThrottle`` reads the header's words, not the Python
    option's (``max_wait``) they never wrote."""
    with pytest.raises(ValueError) as error:
        options_from_header(header)
    text = message(error)
    assert text.startswith(f"{CONTROL_HEADER} header: {key} must be "), text
    assert f"got {value!r} in {header!r}" in text, text
    assert "max_wait" not in text and "request option" not in text, text


def test_the_requests_adapter_raises_it_before_sending() -> None:
    with (
        RequestsSession(throttle=Throttle()) as session,
        pytest.raises(ValueError, match=r"X-AutoThrottle header: max-wait .* got 'abc'"),
    ):
        session.get("http://127.0.0.2:9/", headers={CONTROL_HEADER: "max-wait=abc"})


# -- a value given positionally, a throttle class given for an instance ---------------------


def test_a_number_given_to_throttle_positionally_names_the_keywords_it_may_mean() -> None:
    with pytest.raises(TypeError) as error:
        Throttle(2.0)  # type: ignore[call-arg]
    text = message(error)
    assert "keyword arguments only" in text
    assert "Throttle(min_delay=2.0)" in text and "Throttle(start_delay=2.0)" in text


def test_a_policy_given_to_throttle_positionally_is_pointed_at_policy() -> None:
    with pytest.raises(TypeError) as error:
        Throttle(AIMDPolicy())  # type: ignore[call-arg, arg-type]
    assert "Throttle(policy=" in message(error)


def test_the_keyword_check_keeps_throttle_s_signature_and_leaves_subclasses_alone() -> None:
    assert "min_delay" in inspect.signature(Throttle).parameters
    assert "args" not in inspect.signature(Throttle).parameters

    class Fixed(Throttle):
        def __init__(self, delay: float) -> None:
            super().__init__(min_delay=delay)

    assert Fixed(2.0).config.min_delay == 2.0


NEEDS_THROTTLE = [adapter for adapter in ADAPTERS if adapter is not ThrottledSession]
"""The adapters that are classes of ours (aiohttp's session is a factory, tested above)."""


@pytest.mark.parametrize("adapter", NEEDS_THROTTLE, ids=lambda a: f"{a.__module__}.{a.__name__}")
def test_every_adapter_given_a_throttle_positionally_says_to_pass_it_by_keyword(
    adapter: Callable[..., Any],
) -> None:
    with pytest.raises(TypeError) as error:
        adapter(Throttle())
    text = message(error)
    assert f"{adapter.__name__}(throttle=Throttle())" in text
    assert "the Throttle was passed positionally" in text


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: f"{a.__module__}.{a.__name__}")
def test_every_adapter_without_a_throttle_shows_how_to_pass_one(
    adapter: Callable[..., Any],
) -> None:
    with pytest.raises(TypeError) as error:
        adapter()
    assert f"{adapter.__name__}(throttle=Throttle())" in message(error)


@pytest.mark.parametrize("adapter", ADAPTERS, ids=lambda a: f"{a.__module__}.{a.__name__}")
def test_every_adapter_given_the_throttle_class_asks_for_an_instance(
    adapter: Callable[..., Any],
) -> None:
    with pytest.raises(TypeError) as error:
        adapter(throttle=Throttle)
    text = message(error)
    assert text.startswith(f"{adapter.__name__}: throttle must be an autothrottle.Throttle")
    assert "pass an instance: throttle=Throttle()" in text


@pytest.mark.parametrize(
    "take",
    [throttle_middleware, VirtualClock().attach],
    ids=["throttle_middleware", "VirtualClock.attach"],
)
def test_the_other_takers_of_a_throttle_ask_for_an_instance(take: Callable[[Any], Any]) -> None:
    with pytest.raises(TypeError) as error:
        take(Throttle)
    assert "pass an instance: throttle=Throttle()" in message(error)


class _Registering(type):
    """Another library's metaclass (a plugin registry's, an ORM's)."""


class _Plugin(metaclass=_Registering):
    pass


@pytest.mark.parametrize("other", [abc.ABC, _Plugin], ids=["abc.ABC", "another-metaclass"])
@pytest.mark.parametrize(
    "ours", [Throttle, *NEEDS_THROTTLE], ids=lambda a: f"{a.__module__}.{a.__name__}"
)
async def test_a_class_of_ours_combines_with_an_abc_and_keeps_its_hints(
    ours: type[Any], other: type[Any]
) -> None:
    """A user's class over one of ours and an ABC (or any base with a metaclass of
    its own) is made, works, stays abstract until its methods are given, and
    still says the fix when called with a slip."""

    class Base(ours, other):  # type: ignore[misc]
        @abc.abstractmethod
        def name(self) -> str: ...

    class Mine(Base):
        def name(self) -> str:
            return "mine"

    kwargs: dict[str, Any] = {} if ours is Throttle else {"throttle": Throttle()}
    if other is abc.ABC:
        with pytest.raises(TypeError, match="abstract"):
            Base(**kwargs)
    mine = Mine(**kwargs)
    assert mine.name() == "mine" and isinstance(mine, (ours, other))
    if hasattr(mine, "aclose"):
        await mine.aclose()
    elif hasattr(mine, "close"):
        mine.close()
    with pytest.raises(TypeError) as error:
        Mine(2.0) if ours is Throttle else Mine(Throttle())
    text = message(error)
    if ours is Throttle:
        assert "Throttle(min_delay=2.0)" in text
    else:
        assert "Mine(throttle=Throttle())" in text and "passed positionally" in text


def test_the_adapters_check_only_calls_a_copy_still_works() -> None:
    """A copy makes its object without a call (no ``throttle=`` to check)."""
    with RequestsSession(throttle=Throttle()) as session:
        assert type(copy.copy(session)) is RequestsSession


# -- acquire: awaited, or entered --------------------------------------------------------------


async def test_acquire_entered_holds_the_lease_for_the_block_and_releases_it() -> None:
    throttle = Throttle(start_delay=0.0)
    async with throttle.acquire("h") as lease:
        assert throttle.slot("h").in_flight == 1
        lease.observe(latency=0.1, status=200)
    assert lease.released and throttle.slot("h").in_flight == 0
    with pytest.raises(KeyError):
        async with throttle.acquire("h"):
            raise KeyError("the block failed")
    assert throttle.slot("h").in_flight == 0


async def test_acquire_entered_and_cancelled_while_waiting_leaves_nothing_behind() -> None:
    throttle = Throttle(start_delay=0.0, max_concurrency=1)
    first = await throttle.acquire("h")  # awaiting still gives the lease
    entered = False

    async def second() -> None:
        nonlocal entered
        async with throttle.acquire("h"):
            entered = True

    task = asyncio.create_task(second())
    await asyncio.sleep(0)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    first.release()
    assert not entered
    assert throttle.try_acquire("h") is not None  # no phantom holds the one place


async def test_what_acquire_returns_is_still_a_coroutine_a_task_runs() -> None:
    throttle = Throttle(start_delay=0.0)
    lease = await asyncio.create_task(throttle.acquire("h"))
    lease.release()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(throttle.acquire, "h")
    assert throttle.slot("h").in_flight == 1


async def test_a_subclass_wrapping_acquire_as_documented_is_awaited_entered_and_run() -> None:
    """The subclass ``Acquiring``'s docstring shows (its own block, run): its wrapper
    runs on every way of taking a turn, and what it returns is still entered,
    awaited and run by a task."""
    shown = {"Any": Any, "Acquiring": Acquiring, "Lease": Lease, "Throttle": Throttle}
    exec(literal_block(Acquiring), shown)
    throttle = shown["Counted"](start_delay=0.0)
    async with throttle.acquire("h") as lease:
        assert throttle.slot("h").in_flight == 1
    assert lease.released
    (await throttle.acquire("h", max_wait=1.0)).release()
    (await asyncio.create_task(throttle.acquire("h"))).release()
    assert throttle.waits == 3 and throttle.slot("h").in_flight == 0


def test_acquiring_made_of_anything_but_a_coroutine_names_it() -> None:
    with pytest.raises(TypeError) as error:
        Acquiring(None)  # type: ignore[arg-type]
    assert message(error) == "turn must be a coroutine of a Lease, got None"
