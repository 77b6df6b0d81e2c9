"""A simulated LLM API on loopback: OpenAI's and Anthropic's shapes, limits and headers.

:class:`LLMServer` answers ``POST /v1/chat/completions`` as OpenAI does and
``POST /v1/messages`` as Anthropic does, streamed (server-sent events) or not,
under the limits an API key has there (:class:`LLMLimits`): requests and
tokens per window, or input and output tokens per window apart. Each limit is
a token bucket that holds one window's worth and refills continuously, as both
vendors document theirs; a request that does not fit every bucket gets a 429
(``retry-after`` and, for OpenAI, ``retry-after-ms``), and every response
carries the vendor's rate-limit headers:

* OpenAI: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, the
  resets Go durations (``6m0s``, ``20ms``), the time until the bucket is full;
* Anthropic: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
  {limit,remaining,reset}``, the resets RFC 3339 timestamps (whole seconds,
  rounded up); ``tokens`` is the stricter of input and output.

A request counts its prompt's words as input tokens and its ``max_tokens``
(16 if absent) as output tokens, and is answered with exactly that many
words: what a client estimates is what the server counts. It does not
depend on the rest of autothrottle, only on aiohttp::

    async with LLMServer(LLMLimits(requests=50, tokens=40_000, window=60.0)) as api:
        client = openai.AsyncOpenAI(base_url=api.url + "/v1", api_key="test")
        ...
        api.records  # what arrived, when, and what it got
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, NamedTuple

from aiohttp import web

__all__ = ["LLMLimits", "LLMRecord", "LLMServer"]

_UNITS = ("requests", "tokens", "input-tokens", "output-tokens")


@dataclass(frozen=True, slots=True)
class LLMLimits:
    """The limits of one API key: how much a window allows, per unit.

    Attributes:
        requests: Requests per window.
        tokens: Tokens (input plus output) per window, or None: no such limit.
        input_tokens: Input tokens per window, or None.
        output_tokens: Output tokens per window, or None.
        window: The window in seconds (60 for the vendors' "per minute";
            shorter makes a quick test).
        latency: Seconds before the response headers (the time to the first
            token when streamed).
        token_time: Seconds per output token while streaming.
    """

    requests: int
    tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    window: float = 60.0
    latency: float = 0.01
    token_time: float = 0.0

    def __post_init__(self) -> None:
        for name in ("requests", "tokens", "input_tokens", "output_tokens"):
            value = getattr(self, name)
            if value is None and name != "requests":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LLMLimits: {name} must be an int >= 1, got {value!r}")
        for name in ("window", "latency", "token_time"):
            value = getattr(self, name)
            low = 0.0 if name != "window" else 1e-3
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"LLMLimits: {name} must be seconds, got {value!r}")
            if not low <= value < 1e6:
                raise ValueError(f"LLMLimits: {name} must be seconds >= {low}, got {value!r}")

    def limit(self, unit: str) -> int | None:
        """The limit of ``unit`` (``"requests"``, ``"tokens"``, ``"input-tokens"`` ...)."""
        return {
            "requests": self.requests,
            "tokens": self.tokens,
            "input-tokens": self.input_tokens,
            "output-tokens": self.output_tokens,
        }[unit]


class LLMRecord(NamedTuple):
    """One request as the API saw it.

    Attributes:
        arrival: When it arrived (seconds since the server started).
        api: ``"openai"`` or ``"anthropic"``.
        status: 200, or 429 when it did not fit (400 for a malformed body).
        input_tokens: Its prompt's tokens (words).
        output_tokens: Its ``max_tokens``.
        refused_by: The unit whose bucket refused it, or None.
        stream: Whether the answer was streamed.
    """

    arrival: float
    api: str
    status: int
    input_tokens: int
    output_tokens: int
    refused_by: str | None
    stream: bool


class _Bucket:
    """One limit: holds ``limit``, refills ``limit / window`` a second."""

    __slots__ = ("level", "limit", "rate", "stamp")

    def __init__(self, limit: int, window: float, now: float) -> None:
        self.limit = limit
        self.rate = limit / window
        self.level = float(limit)
        self.stamp = now

    def refill(self, now: float) -> None:
        self.level = min(float(self.limit), self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait_for(self, amount: int) -> float:
        """Seconds until ``amount`` fits (inf if it never can)."""
        if amount > self.limit:
            return math.inf
        return max(0.0, (amount - self.level) / self.rate)

    def until_full(self) -> float:
        return (self.limit - self.level) / self.rate


class _Buckets:
    """Every limit of the key, charged together: a request fits all or none."""

    def __init__(self, limits: LLMLimits, now: float) -> None:
        self.buckets = {
            unit: _Bucket(limit, limits.window, now)
            for unit in _UNITS
            if (limit := limits.limit(unit)) is not None
        }

    def take(self, now: float, input_tokens: int, output_tokens: int) -> tuple[str | None, float]:
        """Charge one request; the unit that refused it (None: taken) and the wait it needs."""
        amounts = {
            "requests": 1,
            "tokens": input_tokens + output_tokens,
            "input-tokens": input_tokens,
            "output-tokens": output_tokens,
        }
        for bucket in self.buckets.values():
            bucket.refill(now)
        refused, wait = None, 0.0
        for unit, bucket in self.buckets.items():
            unit_wait = bucket.wait_for(amounts[unit])
            if unit_wait > wait:
                refused, wait = unit, unit_wait
        if refused is None:
            for unit, bucket in self.buckets.items():
                bucket.level -= amounts[unit]
        return refused, wait

    def openai_headers(self) -> dict[str, str]:
        headers = {}
        for unit in ("requests", "tokens"):
            bucket = self.buckets.get(unit)
            if bucket is not None:
                headers[f"x-ratelimit-limit-{unit}"] = str(bucket.limit)
                headers[f"x-ratelimit-remaining-{unit}"] = str(max(0, math.floor(bucket.level)))
                headers[f"x-ratelimit-reset-{unit}"] = go_duration(bucket.until_full())
        return headers

    def anthropic_headers(self, wall: float) -> dict[str, str]:
        headers = {}
        shown = {unit: self.buckets[unit] for unit in _UNITS if unit in self.buckets}
        split = [shown[u] for u in ("input-tokens", "output-tokens") if u in shown]
        if "tokens" not in shown and split:  # "the most restrictive limit currently in effect"
            shown["tokens"] = min(split, key=lambda b: b.level / b.limit)
        for unit, bucket in shown.items():
            prefix = f"anthropic-ratelimit-{unit}"
            headers[f"{prefix}-limit"] = str(bucket.limit)
            headers[f"{prefix}-remaining"] = str(max(0, math.floor(bucket.level)))
            headers[f"{prefix}-reset"] = rfc3339(wall + bucket.until_full())
        return headers


def go_duration(seconds: float) -> str:
    """Seconds as OpenAI writes a reset: a Go duration (``6m0s``, ``1.5s``, ``20ms``)."""
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60.0)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


def rfc3339(moment: float) -> str:
    """Epoch seconds as Anthropic writes a reset: RFC 3339, whole seconds rounded up."""
    return datetime.fromtimestamp(math.ceil(moment), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _words(content: Any) -> int:
    """Tokens of a message's content, counted as words (text parts of a list too)."""
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(_words(part.get("text", "")) for part in content if isinstance(part, dict))
    return 0


class LLMServer:
    """The simulated API on ``host`` (loopback), on a free port unless ``port`` is given."""

    def __init__(self, limits: LLMLimits, *, host: str = "127.0.0.1", port: int = 0) -> None:
        if not isinstance(limits, LLMLimits):
            raise TypeError(f"limits must be LLMLimits, got {limits!r}")
        self.limits = limits
        self.records: list[LLMRecord] = []
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self._t0 = time.monotonic()
        self._buckets = _Buckets(limits, self._t0)

    @property
    def url(self) -> str:
        """The base URL (``http://127.0.0.1:PORT``); the APIs are under ``/v1``."""
        return f"http://{self._host}:{self._port}"

    def now(self) -> float:
        """Seconds since the server started."""
        return time.monotonic() - self._t0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/messages", self._anthropic)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        self._runner = runner
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self._host, self._port))
        self._port = sock.getsockname()[1]
        await web.SockSite(runner, sock, backlog=512).start()
        self._t0 = time.monotonic()
        self._buckets = _Buckets(self.limits, self._t0)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> LLMServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def charge(self, *, requests: int = 1, input_tokens: int = 0, output_tokens: int = 0) -> None:
        """Spend from the key's limits as another client of the same key would.

        The buckets may go below zero (that client's requests were let in
        before the others). Nothing is recorded.
        """
        buckets = self._buckets.buckets
        now = time.monotonic()
        amounts = {
            "requests": requests,
            "tokens": input_tokens + output_tokens,
            "input-tokens": input_tokens,
            "output-tokens": output_tokens,
        }
        for unit, bucket in buckets.items():
            bucket.refill(now)
            bucket.level -= amounts[unit]

    def used(self, unit: str, since: float = 0.0, until: float = math.inf) -> int:
        """What the accepted requests that arrived in ``[since, until)`` counted in ``unit``."""
        total = 0
        for r in self.records:
            if r.status == 200 and since <= r.arrival < until:
                total += {
                    "requests": 1,
                    "tokens": r.input_tokens + r.output_tokens,
                    "input-tokens": r.input_tokens,
                    "output-tokens": r.output_tokens,
                }[unit]
        return total

    # -- the two APIs ---------------------------------------------------------------

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "openai")

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "anthropic")

    async def _serve(self, request: web.Request, api: str) -> web.StreamResponse:
        arrival = self.now()
        try:
            body = await request.json()
            messages = body["messages"]
            output = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
            stream = bool(body.get("stream", False))
            prompt = sum(_words(m.get("content")) for m in messages) + _words(body.get("system"))
        except (ValueError, KeyError, TypeError, AttributeError):
            self.records.append(LLMRecord(arrival, api, 400, 0, 0, None, False))
            return web.json_response({"error": {"message": "malformed request"}}, status=400)
        refused, wait = self._buckets.take(time.monotonic(), prompt, output)
        headers = self._headers(api)
        self.records.append(
            LLMRecord(arrival, api, 429 if refused else 200, prompt, output, refused, stream)
        )
        if refused is not None:
            return _refusal(api, refused, wait, headers)
        await asyncio.sleep(self.limits.latency)
        if stream:
            return await self._stream(request, api, prompt, output, headers)
        return web.json_response(_completion(api, body, prompt, output), headers=headers)

    def _headers(self, api: str) -> dict[str, str]:
        if api == "openai":
            return self._buckets.openai_headers()
        return self._buckets.anthropic_headers(time.time())

    async def _stream(
        self, request: web.Request, api: str, prompt: int, output: int, headers: dict[str, str]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in _events(api, prompt, output):
            await response.write(event.encode())
            if self.limits.token_time and '"delta"' in event:
                await asyncio.sleep(self.limits.token_time)
        await response.write_eof()
        return response


def _refusal(api: str, unit: str, wait: float, headers: dict[str, str]) -> web.Response:
    seconds = 60.0 if math.isinf(wait) else wait
    headers = {**headers, "retry-after": str(max(1, math.ceil(seconds)))}
    message = f"Rate limit reached for {unit}"
    if api == "openai":
        headers["retry-after-ms"] = str(math.ceil(seconds * 1000))
        error: dict[str, Any] = {
            "error": {"message": message, "type": unit, "code": "rate_limit_exceeded"}
        }
    else:
        error = {"type": "error", "error": {"type": "rate_limit_error", "message": message}}
    return web.json_response(error, status=429, headers=headers)


def _completion(api: str, body: dict[str, Any], prompt: int, output: int) -> dict[str, Any]:
    text = " ".join(["token"] * output)
    model = str(body.get("model", "sim"))
    if api == "openai":
        return {
            "id": "chatcmpl-sim",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": output,
                "total_tokens": prompt + output,
            },
        }
    return {
        "id": "msg_sim",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": output},
    }


def _events(api: str, prompt: int, output: int) -> list[str]:
    """The server-sent events of a streamed answer of ``output`` words."""
    if api == "openai":
        base = {
            "id": "chatcmpl-sim",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "sim",
        }
        chunks = [
            {
                **base,
                "choices": [{"index": 0, "delta": {"content": "token "}, "finish_reason": None}],
            }
            for _ in range(output)
        ]
        chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        return [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    message: dict[str, Any] = {
        "id": "msg_sim",
        "type": "message",
        "role": "assistant",
        "model": "sim",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": 0},
    }
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "token "},
    }
    events = [
        ("message_start", {"type": "message_start", "message": message}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        *[("content_block_delta", delta) for _ in range(output)],
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                "usage": {"output_tokens": output},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return [f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events]
