"""The OpenAI and Anthropic SDKs, for real, through our clients, against a loopback LLM API.

The API is ``autothrottle.sim.llm`` (OpenAI's and Anthropic's request and
response shapes, streams and rate-limit headers). Each SDK gets the client it
takes: ``openai`` 3.x takes an httpx or an httpx2 client, ``anthropic`` 2.x
an httpx2 one only. Every check is on what the API saw (``LLMServer.records``)
and what the slot learned, with generous bounds on time.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest

from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.sim.llm import LLMLimits, LLMServer

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

HOST = "127.0.0.1"
COST = "X-AutoThrottle"


def llm_throttle() -> Throttle:
    """The throttle docs/llm.md recommends: the API's headers pace it, nothing else."""
    return Throttle(policy=FixedDelayPolicy(0.0), max_concurrency=8)


def _async_client_modules() -> list[str]:
    names = ["httpx"]
    if importlib.util.find_spec("httpx2") is not None:
        names.append("httpx2")
    return names


def _async_client(module: str, throttle: Throttle) -> Any:
    adapter = importlib.import_module(f"autothrottle.{module}")
    return adapter.AsyncThrottledClient(throttle=throttle, timeout=30.0)


def _sync_client(module: str, throttle: Throttle) -> Any:
    adapter = importlib.import_module(f"autothrottle.{module}")
    return adapter.ThrottledClient(throttle=throttle, timeout=30.0)


import importlib  # noqa: E402  (kept beside its only users above)


@asynccontextmanager
async def openai_async(api: LLMServer, module: str, throttle: Throttle) -> AsyncIterator[Any]:
    async with _async_client(module, throttle) as http:
        yield openai.AsyncOpenAI(base_url=api.url + "/v1", api_key="test", http_client=http)


@asynccontextmanager
async def anthropic_async(api: LLMServer, module: str, throttle: Throttle) -> AsyncIterator[Any]:
    async with _async_client(module, throttle) as http:
        yield anthropic.AsyncAnthropic(base_url=api.url, api_key="test", http_client=http)


def prompt(tokens: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": " ".join(["word"] * tokens)}]
