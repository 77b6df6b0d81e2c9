"""The OpenAI and Anthropic SDKs, for real, through our clients, against a loopback LLM API.

The API is ``autothrottle.sim.llm`` (OpenAI's and Anthropic's request and
response shapes, streams and rate-limit headers). Each SDK gets the clients
it takes: ``openai`` 3.x an httpx or an httpx2 client, ``anthropic`` 2.x an
httpx2 one only; the sync clients run in a thread. The SDKs' own retries are
off, so a refusal shows. Every check is on what the API saw
(``LLMServer.records``) and what the slot learned, with bounds on time that
only a throttle that waited can meet (and none on how fast).
"""

from __future__ import annotations

import asyncio
import importlib
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from autothrottle import FixedDelayPolicy, Throttle, ThrottleTimeout
from autothrottle.httpx import AsyncThrottledClient
from autothrottle.httpx2 import AsyncThrottledClient as AsyncThrottledClient2
from autothrottle.redis import RedisStore
from autothrottle.sim.llm import LLMLimits, LLMServer
from redis_keys import fresh_prefix

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

KEY = "127.0.0.1"


class SDK:
    """One SDK with one of our clients: ``call`` sends a request and reads the answer."""

    def __init__(self, vendor: str, module: str, sync: bool) -> None:
        self.vendor, self.module, self.sync = vendor, module, sync
        self.id = f"{vendor}-{module}-{'sync' if sync else 'async'}"

    def open(self, api: LLMServer, throttle: Throttle, max_retries: int = 0) -> Any:
        adapter = importlib.import_module(f"autothrottle.{self.module}")
        kind = adapter.ThrottledClient if self.sync else adapter.AsyncThrottledClient
        http = kind(throttle=throttle, timeout=30.0)
        if self.vendor == "openai":
            make = openai.OpenAI if self.sync else openai.AsyncOpenAI
            return make(
                base_url=api.url + "/v1", api_key="t", http_client=http, max_retries=max_retries
            )
        make = anthropic.Anthropic if self.sync else anthropic.AsyncAnthropic
        return make(base_url=api.url, api_key="t", http_client=http, max_retries=max_retries)

    async def call(
        self,
        client: Any,
        *,
        prompt: int = 3,
        max_tokens: int = 5,
        cost: str | None = None,
        stream: bool = False,
        on_first: Callable[[], object] | None = None,
        sdk_timeout: float | None = None,
        control: str | None = None,
    ) -> str:
        """The answer's text (a stream read to its end, ``on_first`` told of its first event)."""
        directives = ([] if cost is None else [f"cost={cost}"]) + ([control] if control else [])
        headers = {"X-AutoThrottle": ", ".join(directives)} if directives else {}
        kwargs: dict[str, Any] = {
            "model": "sim",
            "messages": [{"role": "user", "content": " ".join(["word"] * prompt)}],
            "max_tokens": max_tokens,
            "extra_headers": headers,
        }
        if sdk_timeout is not None:  # the SDK's per-request timeout
            kwargs["timeout"] = sdk_timeout
        if self.sync:
            return await asyncio.to_thread(self._call_sync, client, kwargs, stream, on_first)
        if self.vendor == "openai":
            if not stream:
                reply = await client.chat.completions.create(**kwargs)
                return str(reply.choices[0].message.content)
            parts: list[str] = []
            async for chunk in await client.chat.completions.create(**kwargs, stream=True):
                if on_first is not None and not parts:
                    on_first()
                parts.append(chunk.choices[0].delta.content or "")
            return "".join(parts)
        if not stream:
            message = await client.messages.create(**kwargs)
            return str(message.content[0].text)
        parts = []
        async with client.messages.stream(**kwargs) as events:
            async for text in events.text_stream:
                if on_first is not None and not parts:
                    on_first()
                parts.append(text)
        return "".join(parts)

    def _call_sync(
        self,
        client: Any,
        kwargs: dict[str, Any],
        stream: bool,
        on_first: Callable[[], object] | None,
    ) -> str:
        parts: list[str] = []
        if self.vendor == "openai":
            if not stream:
                return str(client.chat.completions.create(**kwargs).choices[0].message.content)
            for chunk in client.chat.completions.create(**kwargs, stream=True):
                if on_first is not None and not parts:
                    on_first()
                parts.append(chunk.choices[0].delta.content or "")
            return "".join(parts)
        if not stream:
            return str(client.messages.create(**kwargs).content[0].text)
        with client.messages.stream(**kwargs) as events:
            for text in events.text_stream:
                if on_first is not None and not parts:
                    on_first()
                parts.append(text)
        return "".join(parts)

    async def close(self, client: Any) -> None:
        if self.sync:
            await asyncio.to_thread(client.close)
        else:
            await client.close()


SDKS = [
    SDK("openai", "httpx", sync=False),
    SDK("openai", "httpx2", sync=False),
    SDK("openai", "httpx", sync=True),
    SDK("anthropic", "httpx2", sync=False),
    SDK("anthropic", "httpx2", sync=True),
]


@pytest.fixture(params=SDKS, ids=[sdk.id for sdk in SDKS])
def sdk(request: pytest.FixtureRequest) -> SDK:
    return request.param  # type: ignore[no-any-return]


def llm_throttle(**kwargs: Any) -> Throttle:
    """The throttle docs/llm.md recommends: the API's answers pace it, nothing else."""
    kwargs.setdefault("max_concurrency", 8)
    return Throttle(policy=FixedDelayPolicy(0.0), **kwargs)


def arrivals(api: LLMServer) -> list[float]:
    return [record.arrival for record in api.records]


def refused(api: LLMServer) -> list[str | None]:
    return [record.refused_by for record in api.records if record.status == 429]


async def test_a_spent_request_budget_holds_the_next_request(sdk: SDK) -> None:
    """The first answer says no request remains, and the next waits for the refill.

    The key allows one request in 2 s, and the first call takes it: its answer
    says none remains however long the client took to send it. (With two and
    another client's charge before the first call, a first call slowed past
    the refill, 3.9 s at load 6, found one back, and no pause was needed.)"""
    throttle = llm_throttle()
    async with LLMServer(LLMLimits(requests=1, window=2.0)) as api:
        client = sdk.open(api, throttle)
        try:
            for _ in range(2):  # the first answer says none remain
                assert await sdk.call(client) == "token " * 4 + "token"
        finally:
            await sdk.close(client)
    assert refused(api) == []
    first, second = arrivals(api)
    assert second - first >= 1.9  # a request refills in 2 s
    assert throttle.slot(KEY).snapshot().pauses == 2  # each answer says none remains


async def test_a_spent_token_budget_holds_a_request_until_its_cost_fits(sdk: SDK) -> None:
    if sdk.vendor == "openai":
        limits = LLMLimits(requests=100, tokens=1000, window=1.0)  # 1000 tokens a second
        cost = "800"
    else:
        limits = LLMLimits(requests=100, input_tokens=2000, output_tokens=600, window=1.0)
        cost = "300+500"  # the output window binds: 600 a second
    throttle = llm_throttle()
    async with LLMServer(limits) as api:
        client = sdk.open(api, throttle)
        try:
            for _ in range(2):
                await sdk.call(client, prompt=300, max_tokens=500, cost=cost)
        finally:
            await sdk.close(client)
    assert refused(api) == []
    first, second = arrivals(api)
    assert second - first >= 0.5  # 600 more tokens (400 more output tokens) to refill
    assert throttle.slot(KEY).snapshot().rate_limit is not None


async def test_a_429_pauses_the_slot_for_its_retry_after(sdk: SDK) -> None:
    """Another client of the key spent its tokens: the API refuses with the wait it
    needs, ``retry-after-ms`` (OpenAI, 700 ms here) or ``retry-after`` (Anthropic,
    whole seconds), and the slot sends nothing until then."""
    if sdk.vendor == "openai":
        limits = LLMLimits(requests=100, tokens=1000, window=1.0)
        other, longest = {"input_tokens": 900}, 0.75  # 700 ms, not Retry-After's 1 s
    else:
        limits = LLMLimits(requests=100, input_tokens=10_000, output_tokens=600, window=1.0)
        other, longest = {"output_tokens": 500}, 1.0
    throttle = llm_throttle()
    async with LLMServer(limits) as api:
        client = sdk.open(api, throttle)
        try:
            await sdk.call(client, prompt=1, max_tokens=1)
            await asyncio.sleep(0.1)  # the window refills
            api.charge(requests=0, **other)
            with pytest.raises((openai.RateLimitError, anthropic.RateLimitError)):
                await sdk.call(client, prompt=300, max_tokens=500)
            refusal = time.monotonic()
            refused_on = api.now()  # the same moment, on the server's clock
            pause = throttle.slot(KEY).snapshot().pause_remaining
            await sdk.call(client, prompt=300, max_tokens=500)  # waits out the pause
            waited = time.monotonic() - refusal
        finally:
            await sdk.close(client)
    assert refused(api) == ["tokens" if sdk.vendor == "openai" else "output-tokens"]
    # The pause runs from the refusal, not from when the SDK got round to raising
    # it: on a loaded machine that took 0.44 s, and less of the pause was left.
    refused_at = next(record.arrival for record in api.records if record.status == 429)
    assert longest - 0.35 < refused_on + pause - refused_at
    assert pause <= longest
    assert waited >= pause - 0.05
    assert throttle.slot(KEY).snapshot().last_backoff_reason == "status 429"


async def test_the_sdks_own_retries_are_paced_and_counted_once_each(sdk: SDK) -> None:
    """The SDK retries a 429 itself (``max_retries``), resending through our
    client: each try takes a turn of its own and is counted once (sent,
    answered, its status), and the retry waits out the refusal's pause, so
    it is not refused again. Another client of the key spent its tokens for
    more than two seconds."""
    if sdk.vendor == "openai":
        limits = LLMLimits(requests=100, tokens=1000, window=1.0)
        other, cost = {"input_tokens": 2500}, "800"
    else:
        limits = LLMLimits(requests=100, input_tokens=10_000, output_tokens=600, window=1.0)
        other, cost = {"output_tokens": 1500}, "300+500"
    throttle = llm_throttle()
    async with LLMServer(limits) as api:
        client = sdk.open(api, throttle, max_retries=3)
        try:
            api.charge(requests=0, **other)
            await sdk.call(client, prompt=300, max_tokens=500, cost=cost)
        finally:
            await sdk.close(client)
    assert [record.status for record in api.records] == [429, 200]
    snapshot = throttle.slot(KEY).snapshot()
    assert (snapshot.sent, snapshot.responses) == (2, 2)
    assert snapshot.status_counts == {429: 1, 200: 1}
    assert (snapshot.backoffs, snapshot.in_flight) == (1, 0)
    first, second = arrivals(api)
    assert second - first >= 1.5  # the key's tokens came back only then


async def test_the_sdks_timeout_bounds_the_wait_for_the_turn_and_sends_nothing(sdk: SDK) -> None:
    """The SDK's per-request timeout is a timeout chosen for the request: it
    bounds the turn as httpx's pool timeout, the SDK retries the
    ``ThrottlePoolTimeout`` as a timeout, and at last raises its own."""
    throttle = llm_throttle()
    async with LLMServer(LLMLimits(requests=100, window=1.0)) as api:
        client = sdk.open(api, throttle, max_retries=1)
        throttle.backoff(KEY, pause=60.0)
        try:
            with pytest.raises((openai.APITimeoutError, anthropic.APITimeoutError)) as caught:
                await sdk.call(client, sdk_timeout=0.3)
        finally:
            await sdk.close(client)
    assert isinstance(caught.value.__cause__, ThrottleTimeout)
    assert api.records == []
    assert throttle.slot(KEY).snapshot().sent == 0


async def test_a_max_wait_of_yours_bounds_each_try_of_the_sdk_and_sends_nothing(
    sdk: SDK,
) -> None:
    """docs/llm.md: ``X-AutoThrottle: max-wait=S`` bounds each try's wait for
    its turn; the SDK takes the ``ThrottlePoolTimeout`` for a timeout, retries
    it (each try bounded again), and at last raises its own. Nothing is sent."""
    throttle = llm_throttle()
    async with LLMServer(LLMLimits(requests=100, window=1.0)) as api:
        client = sdk.open(api, throttle, max_retries=1)
        throttle.backoff(KEY, pause=60.0)
        try:
            with pytest.raises((openai.APITimeoutError, anthropic.APITimeoutError)) as caught:
                await sdk.call(client, control="max-wait=0.3")
        finally:
            await sdk.close(client)
    assert isinstance(caught.value.__cause__, ThrottleTimeout)
    assert api.records == []
    assert throttle.slot(KEY).snapshot().sent == 0


async def test_a_stream_holds_its_slot_until_it_ends(sdk: SDK) -> None:
    throttle = llm_throttle(max_concurrency=1)
    async with LLMServer(LLMLimits(requests=50, window=60.0, token_time=0.02)) as api:
        client = sdk.open(api, throttle)
        first_event = asyncio.Event()
        loop = asyncio.get_running_loop()

        async def stream() -> str:
            return await sdk.call(
                client,
                max_tokens=20,
                stream=True,
                on_first=lambda: loop.call_soon_threadsafe(first_event.set),
            )

        try:
            streaming = asyncio.create_task(stream())
            await first_event.wait()
            assert throttle.slot(KEY).snapshot().in_flight == 1
            await sdk.call(client)  # the cap is 1: it waits for the stream's end
            assert (await streaming).split() == ["token"] * 20
        finally:
            await sdk.close(client)
    assert refused(api) == []
    assert [r.stream for r in api.records] == [True, False]
    assert api.records[1].arrival - api.records[0].arrival >= 0.35  # 20 tokens at 20 ms
    assert throttle.slot(KEY).snapshot().in_flight == 0


def _first_event_then_close(sdk: SDK, client: Any) -> Any:
    """docs/llm.md's stream, left after its first event: ``with`` closes it."""
    kwargs: dict[str, Any] = {
        "model": "sim",
        "messages": [{"role": "user", "content": "word"}],
        "max_tokens": 200,
        "stream": True,
    }
    create = client.chat.completions.create if sdk.vendor == "openai" else client.messages.create
    stream = create(**kwargs)
    with stream:
        for event in stream:
            return event


async def _first_event_then_aclose(sdk: SDK, client: Any) -> Any:
    kwargs: dict[str, Any] = {
        "model": "sim",
        "messages": [{"role": "user", "content": "word"}],
        "max_tokens": 200,
        "stream": True,
    }
    create = client.chat.completions.create if sdk.vendor == "openai" else client.messages.create
    stream = await create(**kwargs)
    async with stream:
        async for event in stream:
            return event


async def test_a_stream_left_early_in_its_with_block_hands_its_slot_back(sdk: SDK) -> None:
    """docs/llm.md: "``async with`` the stream ... read through or not, the
    slot is handed back here". A stream of 200 tokens at 20 ms each (4 s) is
    left after its first event: its slot (the cap is 1) is free at once, the
    stream still referenced, and the next request goes."""
    throttle = llm_throttle(max_concurrency=1)
    async with LLMServer(LLMLimits(requests=50, window=60.0, token_time=0.02)) as api:
        client = sdk.open(api, throttle)
        try:
            if sdk.sync:
                first = await asyncio.to_thread(_first_event_then_close, sdk, client)
            else:
                first = await _first_event_then_aclose(sdk, client)
            assert first is not None
            assert throttle.slot(KEY).snapshot().in_flight == 0
            await sdk.call(client)
        finally:
            await sdk.close(client)
    assert [r.stream for r in api.records] == [True, False]


async def test_a_bad_cost_header_is_refused_as_the_mistake_it_is(sdk: SDK) -> None:
    """A cost the header cannot hold raises the ``ValueError`` that names it,
    before anything is sent, and no SDK takes it for a connection error to
    retry: the ``anthropic`` SDK wraps whatever the client's ``send`` raises
    as ``APIConnectionError`` ("Connection error.") and retried it twice, so
    the client refuses the header as it builds the request."""
    throttle = llm_throttle()
    async with LLMServer(LLMLimits(requests=100, window=1.0)) as api:
        client = sdk.open(api, throttle, max_retries=2)
        try:
            with pytest.raises(ValueError, match="X-AutoThrottle header: cost") as caught:
                await sdk.call(client, cost="1+x")
        finally:
            await sdk.close(client)
    assert not isinstance(caught.value, (openai.APIError, anthropic.APIError))
    assert api.records == []
    assert throttle.slot(KEY).snapshot().sent == 0


async def test_the_anthropic_sdk_s_own_span_says_how_long_the_throttle_held_the_call() -> None:
    """docs/llm.md, "Tracing": the ``anthropic`` SDK opens a span of its own
    around each call (its ``open_telemetry`` option), and the adapter sets
    ``autothrottle.slot`` and ``autothrottle.wait_s`` on it: the second call
    to a key allowing one request in 3 s waited for the refill, and says so
    (at least 1 s of it: the first call's way back through the SDK is slack)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    throttle = llm_throttle()
    async with LLMServer(LLMLimits(requests=1, window=3.0)) as api:
        client = anthropic.AsyncAnthropic(
            base_url=api.url,
            api_key="t",
            http_client=AsyncThrottledClient2(throttle=throttle, timeout=30.0),
            max_retries=0,
            open_telemetry={"tracer_provider": provider},
        )
        try:
            for _ in range(2):
                await SDK("anthropic", "httpx2", sync=False).call(client)
        finally:
            await client.close()
    assert [record.status for record in api.records] == [200, 200]
    spans = [span for span in exporter.get_finished_spans() if span.attributes]
    assert len(spans) == 2
    waits = [float(span.attributes["autothrottle.wait_s"]) for span in spans]  # type: ignore[arg-type,index]
    assert {span.attributes["autothrottle.slot"] for span in spans} == {KEY}  # type: ignore[index]
    assert waits[0] < 1.0 <= waits[1]  # the second waited for the refill (3 s a request)


def _redis_up() -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", 6379)) == 0


@pytest.mark.skipif(not _redis_up(), reason="no Redis on 127.0.0.1:6379")
async def test_a_fleet_sharing_a_key_through_redis_pauses_together() -> None:
    """docs/llm.md's fleet: two workers with one key, their throttles on one Redis.
    The 429 one of them gets holds the other for its ``retry-after-ms``."""
    prefix = fresh_prefix("test-llm")
    limits = LLMLimits(requests=100, tokens=1000, window=1.0)
    stores = [RedisStore("redis://127.0.0.1:6379/0", prefix=prefix) for _ in range(2)]
    throttles = [llm_throttle(store=store) for store in stores]
    async with LLMServer(limits) as api:
        https = [AsyncThrottledClient(throttle=t, timeout=30.0) for t in throttles]
        one, other = (
            openai.AsyncOpenAI(base_url=api.url + "/v1", api_key="t", http_client=h, max_retries=0)
            for h in https
        )
        messages = [{"role": "user", "content": " ".join(["word"] * 300)}]
        try:
            await one.chat.completions.create(model="sim", messages=messages, max_tokens=1)
            await asyncio.sleep(0.1)
            api.charge(requests=0, input_tokens=900)  # a third client of the key
            with pytest.raises(openai.RateLimitError):
                await one.chat.completions.create(model="sim", messages=messages, max_tokens=500)
            await stores[0].flush()
            refusal = time.monotonic()
            await other.chat.completions.create(model="sim", messages=messages, max_tokens=500)
            waited = time.monotonic() - refusal
        finally:
            for http in https:
                await http.aclose()
            for store in stores:
                await store.aclose()
    assert refused(api) == ["tokens"]
    assert waited >= 0.5  # the 700 ms retry-after-ms, less the time it took to share it
