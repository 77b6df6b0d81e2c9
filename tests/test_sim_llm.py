"""The simulated LLM API (autothrottle.sim.llm): its limits, headers and shapes, on loopback."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import pytest

from autothrottle.sim.llm import LLMLimits, LLMServer, go_duration, rfc3339


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"requests": 0}, "requests"),
        ({"requests": 1.5}, "requests"),
        ({"requests": 5, "tokens": 0}, "tokens"),
        ({"requests": 5, "output_tokens": True}, "output_tokens"),
        ({"requests": 5, "window": 0.0}, "window"),
        ({"requests": 5, "latency": -1.0}, "latency"),
        ({"requests": 5, "token_time": "fast"}, "token_time"),
    ],
)
def test_limits_name_a_bad_value(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        LLMLimits(**kwargs)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0123, "13ms"),
        (0.0, "0ms"),
        (1.5, "1.5s"),
        (60.0, "1m0s"),
        (360.0, "6m0s"),
        (61.25, "1m1.25s"),
    ],
)
def test_resets_are_written_as_go_durations(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_anthropic_resets_are_whole_seconds_rounded_up() -> None:
    assert rfc3339(1_700_000_000.2) == "2023-11-14T22:13:21Z"


async def _post(
    http: aiohttp.ClientSession, api: LLMServer, path: str, **body: Any
) -> tuple[int, dict[str, str], str]:
    body.setdefault("messages", [{"role": "user", "content": "one two three"}])
    async with http.post(api.url + path, json={"model": "m", **body}) as response:
        headers = {name.lower(): value for name, value in response.headers.items()}
        return response.status, headers, await response.text()


async def test_openai_headers_count_requests_and_tokens() -> None:
    limits = LLMLimits(requests=3, tokens=100, window=10.0)
    async with LLMServer(limits) as api, aiohttp.ClientSession() as http:
        status, headers, text = await _post(http, api, "/v1/chat/completions", max_tokens=7)
        assert status == 200
        assert json.loads(text)["usage"] == {
            "prompt_tokens": 3,
            "completion_tokens": 7,
            "total_tokens": 10,
        }
        assert headers["x-ratelimit-limit-requests"] == "3"
        assert headers["x-ratelimit-remaining-requests"] == "2"
        assert headers["x-ratelimit-limit-tokens"] == "100"
        assert int(headers["x-ratelimit-remaining-tokens"]) in (90, 91)  # refilled a little
        assert headers["x-ratelimit-reset-tokens"].endswith("s")
        # 95 tokens do not fit: 429, with the wait in seconds and milliseconds.
        status, headers, text = await _post(http, api, "/v1/chat/completions", max_tokens=92)
        assert status == 429
        assert json.loads(text)["error"]["type"] == "tokens"
        assert 0 < int(headers["retry-after-ms"]) <= 1000
        assert headers["retry-after"] == "1"
    assert [(r.status, r.refused_by) for r in api.records] == [(200, None), (429, "tokens")]
    assert api.used("tokens") == 10


async def test_anthropic_headers_split_input_and_output() -> None:
    limits = LLMLimits(requests=50, input_tokens=1000, output_tokens=100, window=60.0)
    async with LLMServer(limits) as api, aiohttp.ClientSession() as http:
        before = time.time()
        status, headers, text = await _post(http, api, "/v1/messages", max_tokens=60)
        assert status == 200
        assert json.loads(text)["usage"] == {"input_tokens": 3, "output_tokens": 60}
        assert headers["anthropic-ratelimit-input-tokens-remaining"] == "997"
        assert headers["anthropic-ratelimit-output-tokens-remaining"] == "40"
        # The combined window shows the stricter one, the output.
        assert headers["anthropic-ratelimit-tokens-limit"] == "100"
        assert headers["anthropic-ratelimit-tokens-remaining"] == "40"
        reset = headers["anthropic-ratelimit-output-tokens-reset"]
        assert reset >= rfc3339(before + 36.0)
        status, headers, text = await _post(http, api, "/v1/messages", max_tokens=60)
        assert status == 429
        assert json.loads(text)["error"]["type"] == "rate_limit_error"
        assert "retry-after-ms" not in headers
        assert int(headers["retry-after"]) >= 12  # 20 more output tokens at 100 a minute


async def test_a_request_above_a_limit_never_fits() -> None:
    async with LLMServer(LLMLimits(requests=5, tokens=50)) as api, aiohttp.ClientSession() as http:
        status, headers, _ = await _post(http, api, "/v1/chat/completions", max_tokens=60)
        assert status == 429
        assert headers["retry-after"] == "60"


@pytest.mark.parametrize(
    ("path", "marker"),
    [("/v1/chat/completions", "data: [DONE]"), ("/v1/messages", "event: message_stop")],
)
async def test_a_streamed_answer_sends_one_event_per_token(path: str, marker: str) -> None:
    async with LLMServer(LLMLimits(requests=5)) as api, aiohttp.ClientSession() as http:
        status, headers, text = await _post(http, api, path, max_tokens=4, stream=True)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert text.count('"token "') == 4
    assert marker in text
    assert api.records[0].stream


async def test_a_malformed_request_is_a_400() -> None:
    async with LLMServer(LLMLimits(requests=5)) as api, aiohttp.ClientSession() as http:
        status = (await http.post(api.url + "/v1/messages", data=b"{")).status
    assert status == 400
    assert api.records[0].status == 400


async def test_another_client_of_the_key_spends_from_the_same_limits() -> None:
    limits = LLMLimits(requests=5, tokens=1000, window=60.0)
    async with LLMServer(limits) as api, aiohttp.ClientSession() as http:
        api.charge(requests=5, input_tokens=10)
        status, headers, _ = await _post(http, api, "/v1/chat/completions", max_tokens=5)
        assert status == 429
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert int(headers["x-ratelimit-remaining-tokens"]) in (990, 991)
