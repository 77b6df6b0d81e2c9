"""Every Python block of the docs (``docs/*.md`` and ``README.md``) runs as a reader copies it.

A block is named by its page, the heading it is under and its place there
(``docs/llm.md: OpenAI #1``). Each one is either run here (:data:`RUN_HERE`, a
test a block), run by another test (:data:`RUN_ELSEWHERE`, naming it) or
listed with the reason it cannot run (:data:`NOT_RUN`); a new block that is
none of these fails :func:`test_every_block_is_run_or_listed_with_its_reason`.

A block runs as a reader pastes it into ``python -m asyncio``: top-level
``await`` and ``async with`` allowed, in one namespace. What the prose around
a block says is already there (the page's ``throttle``, a ``prompt``, a
``provider``) the test puts in that namespace, and says so. The docs name
places that are not on this machine; :func:`_on_loopback` is the one rewrite
a block gets, and only of those names. The SDKs find the simulated LLM API
where a reader points them at another one: their ``*_BASE_URL`` variables.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import types
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from autothrottle import Throttle
from loopback import LoopbackHost, loopback_hosts
from redis_keys import fresh_prefix

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
REDIS_URL = "redis://127.0.0.1:6379/0"


def _blocks_of(page: Path) -> Iterator[tuple[str, str]]:
    """``(name, code)`` for each Python block of ``page``: a fence indented in a list item
    is read dedented, and a ``#`` line inside any fence is no heading."""
    lines = page.read_text().splitlines()
    heading, count, fence = "", 0, None
    code: list[str] = []
    for line in lines:
        stripped = line.lstrip()
        if fence is not None:
            if stripped.startswith("```") and stripped.strip() == "```":
                if fence[1]:
                    count += 1
                    name = f"{page.relative_to(ROOT)}: {heading} #{count}"
                    yield name, textwrap.dedent("\n".join(code)) + "\n"
                fence, code = None, []
            else:
                code.append(line)
        elif stripped.startswith("```"):
            fence = (len(line) - len(stripped), stripped == "```python")
        elif line.startswith("#"):
            heading, count = line.lstrip("#").strip(), 0


BLOCKS: dict[str, str] = {name: code for page in PAGES for name, code in _blocks_of(page)}

RUN_ELSEWHERE = {
    "docs/cli.md: Recording your own crawl: `Timeline` #1": "test_docs.py",
    "docs/compose.md: Caches #1": "test_docs.py (hishel)",
    "docs/guide.md: Reading the debug output #1": "test_docs.py",
    "docs/guide.md: Testing your code #1": "test_docs.py, test_testing.py",
    "docs/index.md: autothrottle #1": "test_docs.py (the quickstarts)",
    "docs/observability.md: Timelines on disk #1": "test_docs.py",
    "docs/sim.md: From Python #1": "test_docs.py",
    "README.md: Quickstart: httpx #1": "test_docs.py (the quickstarts)",
    "README.md: Quickstart: httpx #2": "test_docs.py (the quickstarts)",
    "README.md: Quickstart: httpx #3": "test_docs.py (the quickstarts)",
    "README.md: Quickstart: aiohttp #1": "test_docs.py (the quickstarts)",
    "README.md: Quickstart: requests #1": "test_docs.py (the quickstarts)",
}

#: Blocks that cannot run, each with why (a fragment, say); every one runs now.
NOT_RUN: dict[str, str] = {}

RUN_HERE: dict[str, str] = {}


def runs(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Marks the test that runs block ``name``."""

    def mark(test: Callable[..., Any]) -> Callable[..., Any]:
        RUN_HERE[name] = test.__name__
        return test

    return mark


def test_every_block_is_run_or_listed_with_its_reason() -> None:
    listed = [*RUN_HERE, *RUN_ELSEWHERE, *NOT_RUN]
    assert len(listed) == len(set(listed)), "a block is listed twice"
    new = sorted(set(BLOCKS) - set(listed))
    assert not new, f"run these docs blocks here, or list them in NOT_RUN with why: {new}"
    gone = sorted(set(listed) - set(BLOCKS))
    assert not gone, f"no such block in the docs now (renamed?): {gone}"
    for name in NOT_RUN:  # what cannot run still compiles
        compile(BLOCKS[name], name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


# -- how a block runs ----------------------------------------------------------------


EXAMPLE_HOST = re.compile(r"(https://)?\b((?:[a-z0-9-]+\.)*example\.com)\b")
REDIS_PLACE = re.compile(r'redis://10\.0\.0\.5:6379/0|prefix="([^"]*)"')


def _on_loopback(code: str, host: LoopbackHost | None = None, prefix: str = "") -> str:
    """The one rewrite a block gets: the places it names, made this machine's.

    Every ``example.com`` host name (``example.com``, ``api.example.com``) is the loopback
    ``host``: in a URL its origin (``https://api.example.com`` -> ``http://127.0.0.2:PORT``),
    elsewhere its address (a slot key, ``"api.example.com/search"`` -> ``"127.0.0.2/search"``).
    The docs' Redis (``redis://10.0.0.5:6379/0``) is the one on 127.0.0.1, and a key
    ``prefix="P"`` is ``prefix="<this test's own prefix>P"``, so the shared Redis keeps
    nothing of another's. Nothing else of the block changes.
    """

    def host_name(match: re.Match[str]) -> str:
        assert host is not None, f"the block names {match.group(0)}: give it a host"
        return host.origin if match.group(1) else host.address

    def redis_place(match: re.Match[str]) -> str:
        assert prefix, f"the block names {match.group(0)}: give it a prefix"
        return REDIS_URL if match.group(1) is None else f'prefix="{prefix}{match.group(1)}"'

    return REDIS_PLACE.sub(redis_place, EXAMPLE_HOST.sub(host_name, code))


async def _run(name: str, namespace: dict[str, Any], code: str | None = None) -> dict[str, Any]:
    """Run block ``name`` (or its loopback ``code``) in ``namespace``, as ``python -m asyncio``
    runs what is pasted into it."""
    source = BLOCKS[name] if code is None else code
    compiled = compile(source, name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, namespace)  # the docs' own code
    if compiled.co_flags & inspect.CO_COROUTINE:
        await result
    return namespace


@contextlib.asynccontextmanager
async def _redis_prefix() -> AsyncIterator[str]:
    """A key prefix of this test's own on the shared Redis, its keys deleted after
    the test (``redis_keys``)."""
    aioredis = pytest.importorskip("redis.asyncio", reason="the redis extra")
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except Exception as error:  # any failure to reach it: no Redis here
        await client.aclose()
        pytest.skip(f"no Redis on 127.0.0.1:6379 ({error!r})")
    await client.aclose()
    yield fresh_prefix("at-c-docs") + "-"


# -- Scrapy settings ---------------------------------------------------------------------


@runs("docs/scrapy.md: Migrating from AutoThrottle, in five lines #1")
@runs("README.md: Inside Scrapy #1")
@pytest.mark.parametrize(
    "name",
    [
        "docs/scrapy.md: Migrating from AutoThrottle, in five lines #1",
        "README.md: Inside Scrapy #1",
    ],
)
def test_scrapy_settings(name: str) -> None:
    """A ``settings.py`` as Scrapy reads one: its upper-case names, each middleware built from
    the crawler they make (a crawl with them is tests/test_scrapy.py's)."""
    pytest.importorskip("scrapy", reason="the scrapy extra")
    from scrapy.utils.misc import load_object
    from scrapy.utils.test import get_crawler

    from autothrottle import AdaptiveConcurrencyPolicy

    module = types.ModuleType("settings")
    exec(compile(BLOCKS[name], name, "exec"), module.__dict__)  # the docs' own code
    settings = {key: value for key, value in vars(module).items() if key.isupper()}
    crawler = get_crawler(settings_dict=settings)
    (path,) = settings["DOWNLOADER_MIDDLEWARES"]
    middleware = load_object(path).from_crawler(crawler)
    assert isinstance(middleware.throttle.config.policy, AdaptiveConcurrencyPolicy)
    assert not crawler.settings.getbool("AUTOTHROTTLE_ENABLED")  # Scrapy's own extension off


START = "docs/scrapy.md: A spider with only `start_requests()` crawls nothing on Scrapy 2.19 #1"


@runs(START)
async def test_scrapy_start() -> None:
    """The method in a spider that has only ``start_requests()``: it yields those requests."""
    pytest.importorskip("scrapy", reason="the scrapy extra")
    import scrapy

    namespace = await _run(START, {})

    class Spider(scrapy.Spider):
        name = "docs"
        start = namespace["start"]

        def start_requests(self) -> Iterator[Any]:
            for i in range(3):
                yield scrapy.Request(f"http://127.0.0.2/page/{i}")

    urls = [request.url async for request in Spider().start()]
    assert urls == [f"http://127.0.0.2/page/{i}" for i in range(3)]


@runs("docs/scrapy.md: Soft blocks #1")
async def test_scrapy_soft_blocks() -> None:
    """The callback in a spider: a CAPTCHA page sends the ``blocked`` signal, with it."""
    pytest.importorskip("scrapy", reason="the scrapy extra")
    import scrapy
    from scrapy.http import HtmlResponse
    from scrapy.utils.test import get_crawler

    import autothrottle.scrapy

    namespace = await _run("docs/scrapy.md: Soft blocks #1", {})

    class Spider(scrapy.Spider):
        name = "docs"
        parse = namespace["parse"]

    crawler = get_crawler(Spider)
    spider = Spider.from_crawler(crawler)
    heard: list[object] = []

    def hear(response: object) -> None:  # held here: Scrapy holds a receiver only weakly
        heard.append(response)

    crawler.signals.connect(hear, autothrottle.scrapy.blocked)
    pages = {
        text: HtmlResponse("http://127.0.0.2/", body=text.encode(), encoding="utf-8")
        for text in ("<p>a page</p>", "<p>solve this captcha</p>")
    }
    for page in pages.values():
        assert list(spider.parse(page) or ()) == []
    assert heard == [pages["<p>solve this captcha</p>"]]


# -- docs/guide.md -------------------------------------------------------------------------


@runs("docs/guide.md: Policies #1")
async def test_guide_policies() -> None:
    """The hosts the block names get what the prose under it says: an exact host beats any
    glob, the most specific glob wins whole, and ``*.example.com`` is not ``example.com``."""
    from autothrottle import FixedRatePolicy

    throttle = (await _run("docs/guide.md: Policies #1", {}))["throttle"]
    api, cdn, www, bare = map(
        throttle.config_for,
        ["api.example.com", "img.cdn.example.com", "www.example.com", "example.com"],
    )
    assert isinstance(api.policy, FixedRatePolicy) and api.target_concurrency == 1.0
    assert (cdn.min_delay, cdn.max_concurrency, cdn.target_concurrency) == (0.5, 2, 1.0)
    assert www.target_concurrency == 4.0 and www.max_concurrency == bare.max_concurrency
    assert bare == throttle.config


@runs("docs/guide.md: Soft blocks #1")
async def test_guide_soft_blocks() -> None:
    """Under "Soft blocks", in a crawl's async function: ``throttle`` and ``url`` are the
    crawl's (a host that answers a CAPTCHA page), ``AsyncThrottledClient`` the guide's."""
    import httpx

    from autothrottle.httpx import AsyncThrottledClient
    from autothrottle.sim import SimServer, SoftBlock

    throttle = Throttle()
    async with SimServer({"127.0.0.2": SoftBlock(rate=0.01, burst=1)}) as sim:
        url = sim.url("127.0.0.2", "/page")
        async with httpx.AsyncClient() as plain:
            await plain.get(url)  # the host's one allowed page: the next is its CAPTCHA
        namespace = {"AsyncThrottledClient": AsyncThrottledClient, "throttle": throttle, "url": url}
        await _run("docs/guide.md: Soft blocks #1", namespace)
    (row,) = throttle.stats().slots
    assert row.backoff_reasons == {"manual": 1}
    assert throttle.snapshot()[row.key].pause_remaining > 25.0  # the 30 s it asked for


@runs("docs/guide.md: A big crawl: Python's garbage collector #1")
def test_guide_garbage_collector() -> None:
    """As a script of its own: it sets the process's collector, not this test run's."""
    code = BLOCKS["docs/guide.md: A big crawl: Python's garbage collector #1"]
    code += "print(gc.get_threshold()[0], gc.get_freeze_count() > 0)\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["10000", "True"]


REDRAWN_JITTER = "docs/guide.md: Where latency-only throttling fails, and what autothrottle does #1"


@runs(REDRAWN_JITTER)
def test_guide_scrapy_redrawn_jitter() -> None:
    """The simulation of Scrapy's redrawn delay prints the 1.22 its table claims."""
    code = BLOCKS[REDRAWN_JITTER]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert 1.20 < float(done.stdout) < 1.24


@runs("docs/guide.md: Testing your code #2")
def test_guide_clock_fixture(tmp_path: Path) -> None:
    """The fixture in a test file after the example's imports, as pytest runs it."""
    imports = BLOCKS["docs/guide.md: Testing your code #1"].split("\n@pytest", 1)[0]
    fixture = BLOCKS["docs/guide.md: Testing your code #2"]
    test = "def test_a_test_gets_a_clock(clock):\n    assert clock.waits == []\n"
    (tmp_path / "test_fixture.py").write_text(f"{imports}\n\n{fixture}\n\n{test}")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_fixture.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # a sync test: no plugin
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert "1 passed" in done.stdout


# -- docs/compose.md -----------------------------------------------------------------------


@runs("docs/compose.md: Mocks #1")
async def test_compose_mocks() -> None:
    """Under "Mocks", a throttled aiohttp session: the page's ``throttle``, ``ThrottledSession``."""
    from autothrottle.aiohttp import ThrottledSession

    throttle = Throttle(start_delay=0.0)
    namespace = {"throttle": throttle, "ThrottledSession": ThrottledSession}
    stats = (await _run("docs/compose.md: Mocks #1", namespace))["stats"]
    assert stats.requests == 10
    assert throttle.stats().totals.sent == 10


@runs("docs/compose.md: Per-path slots #1")
async def test_compose_per_path_slots() -> None:
    async with loopback_hosts(1) as (host,):
        name = "docs/compose.md: Per-path slots #1"
        namespace = await _run(name, {}, _on_loopback(BLOCKS[name], host))
        throttle = namespace["throttle"]
        assert throttle.key_for(host.url("/search?q=1")) == f"{host.address}/search"
        assert throttle.key_for(host.url("/items/1")) == host.address
        assert throttle.config_for(f"{host.address}/search").min_delay == 2.0
        assert {row.key: row.sent for row in throttle.stats().slots} == {
            f"{host.address}/search": 1
        }
        assert len(host.arrivals) == 1


# -- docs/fleet.md -------------------------------------------------------------------------


@runs("docs/fleet.md: A fleet: many processes, one politeness #1")
async def test_fleet_store() -> None:
    name = "docs/fleet.md: A fleet: many processes, one politeness #1"
    async with _redis_prefix() as prefix:
        namespace = await _run(name, {}, _on_loopback(BLOCKS[name], prefix=prefix))
        store = namespace["store"]
        assert store.prefix == prefix + "crawl-42"
        assert namespace["throttle"].store is store


@runs("docs/fleet.md: Without Redis: keep what was learned across runs #1")
async def test_fleet_state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    name = "docs/fleet.md: Without Redis: keep what was learned across runs #1"
    namespace = await _run(name, {})
    assert isinstance(json.loads((tmp_path / "learned.json").read_text()), dict)
    again = await _run(name, {})  # the re-run reads what the first saved
    assert again["store"] is not namespace["store"]


# -- docs/llm.md and the README's SDKs -------------------------------------------------------


@contextlib.asynccontextmanager
async def _llm_api(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    """The simulated LLM API, where both SDKs look for theirs (and a key for each)."""
    from autothrottle.sim.llm import LLMLimits, LLMServer

    async with LLMServer(LLMLimits(requests=100, tokens=100_000, window=60.0)) as api:
        monkeypatch.setenv("OPENAI_BASE_URL", api.url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
        yield api


LLM_GIVEN = {"prompt": "Say hello.", "estimate": 3}  # "prompt" and "estimate" are the reader's


@runs("docs/llm.md: The throttle for an API #1")
@runs("docs/llm.md: OpenAI #1")
async def test_llm_openai(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openai", reason="the openai SDK (yours to install, docs/llm.md)")
    namespace = await _run("docs/llm.md: The throttle for an API #1", dict(LLM_GIVEN))
    async with _llm_api(monkeypatch) as api:
        await _run("docs/llm.md: OpenAI #1", namespace)
        assert namespace["reply"].choices[0].message.content
        assert len(api.records) == 1
    assert namespace["throttle"].stats().totals.sent == 1
    assert namespace["sync_client"] is not None


@runs("docs/llm.md: Streams #1")
async def test_llm_stream(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stream, with the OpenAI block's ``client``: it holds its slot until it ends."""
    pytest.importorskip("openai", reason="the openai SDK (yours to install, docs/llm.md)")
    namespace = await _run("docs/llm.md: The throttle for an API #1", dict(LLM_GIVEN))
    async with _llm_api(monkeypatch) as api:
        await _run("docs/llm.md: OpenAI #1", namespace)
        capsys.readouterr()
        await _run("docs/llm.md: Streams #1", namespace)
        assert len(capsys.readouterr().out.split()) == 16  # the API's default answer: 16 words
        assert len(api.records) == 2
    (slot,) = namespace["throttle"].snapshot().values()
    assert slot.in_flight == 0 and slot.sent == 2


@runs("docs/llm.md: Anthropic #1")
@pytest.mark.filterwarnings("error:The model:DeprecationWarning")  # the SDK's: a model retiring
async def test_llm_anthropic(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("anthropic", reason="the anthropic SDK (yours to install, docs/llm.md)")
    pytest.importorskip("httpx2", reason="the httpx2 extra")
    namespace = await _run("docs/llm.md: The throttle for an API #1", dict(LLM_GIVEN))
    async with _llm_api(monkeypatch) as api:
        await _run("docs/llm.md: Anthropic #1", namespace)
        assert namespace["message"].content[0].text
        assert len(api.records) == 1
    assert namespace["throttle"].stats().totals.sent == 1


@runs("docs/llm.md: A fleet sharing one key #1")
async def test_llm_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openai", reason="the openai SDK (yours to install, docs/llm.md)")
    name = "docs/llm.md: A fleet sharing one key #1"
    namespace = await _run("docs/llm.md: The throttle for an API #1", dict(LLM_GIVEN))
    async with _redis_prefix() as prefix, _llm_api(monkeypatch) as api:
        await _run(name, namespace, _on_loopback(BLOCKS[name], prefix=prefix))
        throttle = namespace["throttle"]
        try:
            await _run("docs/llm.md: OpenAI #1", namespace)  # the page's call, through Redis
        finally:
            await throttle.store.aclose()
        assert throttle.store.prefix == prefix + "openai-key-1"
        assert len(api.records) == 1


@runs("README.md: The OpenAI and Anthropic SDKs #1")
@pytest.mark.filterwarnings("error:The model:DeprecationWarning")
async def test_readme_sdks(monkeypatch: pytest.MonkeyPatch) -> None:
    """``messages`` and ``prompt_tokens`` are the reader's, the README says."""
    for sdk in ("openai", "anthropic"):
        pytest.importorskip(sdk, reason=f"the {sdk} SDK (yours to install, README.md)")
    pytest.importorskip("httpx2", reason="the httpx2 extra")
    given = {"messages": [{"role": "user", "content": "Say hello."}], "prompt_tokens": 3}
    async with _llm_api(monkeypatch) as api:
        namespace = await _run("README.md: The OpenAI and Anthropic SDKs #1", given)
        assert namespace["reply"].choices[0].message.content
        assert len(api.records) == 1
        claude = namespace["claude"]
        answer = await claude.messages.create(
            model="claude-sonnet-5-5", max_tokens=5, messages=given["messages"]
        )
        assert answer.content[0].text
    assert namespace["throttle"].stats().totals.sent == 2  # one throttle for both


# -- docs/observability.md and the README's logging --------------------------------------------


async def _crawled(host: LoopbackHost, throttle: Throttle, pages: int = 3) -> None:
    from autothrottle.httpx import AsyncThrottledClient

    async with AsyncThrottledClient(throttle=throttle) as client:
        for i in range(pages):
            await client.get(host.url(f"/page/{i}"))


@runs("docs/observability.md: stats(): the figures as plain data #1")
async def test_observability_stats(capsys: pytest.CaptureFixture[str]) -> None:
    """``throttle`` is the page's, after a crawl."""
    throttle = Throttle(start_delay=0.0)
    async with loopback_hosts(1) as (host,):
        await _crawled(host, throttle)
    await _run(
        "docs/observability.md: stats(): the figures as plain data #1", {"throttle": throttle}
    )
    first, row = capsys.readouterr().out.splitlines()
    assert first.startswith("{200: 3}")
    assert row.startswith(f"{host.address} 3 ")


@runs("docs/observability.md: OpenTelemetry #1")
async def test_observability_otel_global() -> None:
    """``throttle`` is the page's."""
    pytest.importorskip("opentelemetry.metrics", reason="the otel extra")
    from autothrottle.otel import Instrumentation

    namespace = await _run("docs/observability.md: OpenTelemetry #1", {"throttle": Throttle()})
    assert isinstance(namespace["instrumentation"], Instrumentation)


@runs("docs/observability.md: OpenTelemetry #2")
async def test_observability_otel_own_provider() -> None:
    """``throttle`` is the page's; ``provider`` the reader's own meter provider."""
    pytest.importorskip("opentelemetry.sdk", reason="an OpenTelemetry SDK (the otel extra's API)")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

    reader = InMemoryMetricReader()
    throttle = Throttle(start_delay=0.0)
    namespace = {"throttle": throttle, "provider": MeterProvider(metric_readers=[reader])}
    await _run("docs/observability.md: OpenTelemetry #2", namespace)
    async with loopback_hosts(1) as (host,):
        await _crawled(host, throttle)
    data = reader.get_metrics_data()
    assert data is not None
    (responses,) = (
        m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "autothrottle.responses"
    )
    (point,) = responses.data.data_points
    assert isinstance(point, NumberDataPoint) and point.attributes is not None
    assert point.value == 3  # one call, counted once
    assert point.attributes["autothrottle.slot"] == host.address.split(".", 2)[-1]  # "0.2"


@runs("README.md: Seeing what it does #1")
async def test_readme_seeing_what_it_does(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """``Throttle`` is imported by the quickstarts above it. The record the block shows in a
    comment has the fields, in their order, that a crawl's records have."""
    name = "README.md: Seeing what it does #1"
    logger = logging.getLogger("autothrottle")
    level, handlers = logger.level, list(logging.root.handlers)
    try:
        namespace = await _run(name, {"Throttle": Throttle})
        assert capsys.readouterr().out == ""  # a new throttle: no slot yet
        throttle = namespace["throttle"]
        assert throttle.debug
        async with loopback_hosts(1) as (host,):
            await _crawled(host, throttle, pages=2)
    finally:
        logger.setLevel(level)
        logging.root.handlers[:] = handlers
    (shown,) = re.findall(r"# DEBUG:autothrottle:(.*)", BLOCKS[name])
    logged = [r.getMessage() for r in caplog.records if r.name == "autothrottle"]
    assert logged, "debug=True logged nothing"
    fields = re.compile(r"(\w+)=")
    assert all(fields.findall(line) == fields.findall(shown) for line in logged), logged


def test_every_docstring_example_of_the_library_holds() -> None:
    """The API reference shows the modules' docstrings, so a ``>>>`` example in one
    is read and copied as a page's block is; doctest runs each of them."""
    import doctest
    import importlib

    package = ROOT / "src" / "autothrottle"
    failed: dict[str, int] = {}
    tried = 0
    for path in sorted(package.rglob("*.py")):
        if ">>> " not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
        tried += result.attempted
        if result.failed:
            failed[name] = result.failed
    assert tried > 0
    assert not failed
