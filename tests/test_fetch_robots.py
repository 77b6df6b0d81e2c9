"""``autothrottle fetch``'s robots.txt at its edges, against a loopback server.

Each case serves one robots.txt (or none, or an error, or a redirect) from an
``aiohttp.web`` app in this process, reads it through :class:`Robots` on a
real sender of the fetch's (both clients where the client does the work: the
redirects, the body's limit), and asserts what is fetched and what is not, the
requests the site saw, and the floor set on the throttle. The RFC sections
named are RFC 9309's.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from autothrottle import FixedDelayPolicy, Throttle
from autothrottle.cli._fetch_clients import CLIENTS, Client, open_sender
from autothrottle.cli._fetch_options import USER_AGENT
from autothrottle.cli._robots import ROBOTS_BYTES, HostRules, Robots, product_token
from loopback import served_here

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Read:
    """What one read of a robots.txt gave: its rules, the requests the site saw
    for it, the notes the fetch wrote, and the throttle."""

    rules: HostRules
    base: str
    asked: int
    notes: list[str] = field(default_factory=list)
    throttle: Throttle = field(default_factory=Throttle)

    def allows(self, path: str, agent: str = USER_AGENT) -> bool:
        return self.rules.excluded(self.base + path.lstrip("/"), agent) is None


def text_of(body: str | bytes, status: int = 200) -> Handler:
    data = body.encode() if isinstance(body, str) else body

    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=status, body=data, content_type="text/plain")

    return handler


async def read(
    robots: Handler,
    *,
    client: Client = "aiohttp",
    agent: str = USER_AGENT,
    attempts: int = 1,
    throttle: Throttle | None = None,
    routes: dict[str, Handler] | None = None,
    within: float | None = None,
) -> Read:
    """Serve ``robots`` at /robots.txt (and ``routes``) on 127.0.0.2; read it once."""
    asked = [0]

    async def counted(request: web.Request) -> web.StreamResponse:
        asked[0] += 1
        return await robots(request)

    app = web.Application()
    app.router.add_get("/robots.txt", counted)
    for path, handler in (routes or {}).items():
        app.router.add_get(path, handler)
    throttle = throttle or Throttle(policy=FixedDelayPolicy(0.0))
    notes: list[str] = []
    async with (
        served_here(["127.0.0.2"], app) as (base,),
        open_sender(client, throttle, io_timeout=10.0, connections=4, headers={}) as sender,
    ):
        reader = Robots(
            sender, throttle, agent, attempts=attempts, note=notes.append, within=within
        )
        rules = await asyncio.wait_for(reader.rules(f"{base}page"), 60.0)
        assert reader.requests >= asked[0]
    return Read(rules, base, asked[0], notes, throttle)


# ----------------------------------------------------------------------------- statuses


@pytest.mark.parametrize("status", [401, 403, 404, 410])
async def test_a_4xx_robots_txt_is_none_and_everything_is_allowed(status: int) -> None:
    """2.3.1.3: a 4xx, 401 and 403 included, means the file is "unavailable": the
    crawler may access anything (a 403 from a bucket holding no robots.txt is
    no ban). Asked once, not retried."""
    got = await read(text_of("User-agent: *\nDisallow: /\n", status=status), attempts=3)
    assert got.rules.unreachable is None and got.rules.parser is None
    assert got.allows("/anything") and got.asked == 1


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_a_5xx_or_429_robots_txt_shuts_the_host_after_the_retries(status: int) -> None:
    """2.3.1.4: a server error means "complete disallow"; the fetch asks again
    within its retries (a 429 is read as the host being busy, not as none), then
    gives up on the host for the run: nothing of it is fetched."""
    got = await read(text_of("", status=status), attempts=3)
    assert got.rules.unreachable is not None and f"status {status}" in got.rules.unreachable
    assert got.asked == 3
    assert any("none of its URLs is fetched" in note for note in got.notes)


async def test_a_host_that_does_not_answer_is_shut_after_the_retries() -> None:
    """2.3.1.4 again, for a network error: a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    throttle = Throttle(policy=FixedDelayPolicy(0.0))
    notes: list[str] = []
    async with open_sender("aiohttp", throttle, io_timeout=5.0, connections=4, headers={}) as s:
        reader = Robots(s, throttle, USER_AGENT, attempts=2, note=notes.append)
        rules = await asyncio.wait_for(reader.rules(f"http://127.0.0.2:{port}/a"), 60.0)
        again = await reader.rules(f"http://127.0.0.2:{port}/b")  # kept for the run
    assert rules.unreachable is not None and "unreachable" in rules.unreachable
    assert again is rules and reader.requests == 2


# ----------------------------------------------------------------------------- redirects


def redirects(count: int, last: Handler) -> tuple[Handler, dict[str, Handler]]:
    """/robots.txt redirecting ``count`` times (/r1, /r2, ...), then ``last``."""

    def hop(n: int) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            if n == count:
                return await last(request)
            raise web.HTTPFound(f"/r{n + 1}")

        return handler

    return hop(0), {f"/r{n}": hop(n) for n in range(1, count + 1)}


@pytest.mark.parametrize("client", CLIENTS)
async def test_five_redirects_are_followed_and_a_sixth_means_none(client: Client) -> None:
    """2.3.1.2: at least five redirects are followed, and the rules at their end
    are the first origin's; past five the file may be taken as unavailable. The
    same for both clients (httpx would follow 20, aiohttp 10), and each hop a
    request of its own: the site saw six, not a client's whole chain per retry."""
    rules = text_of("User-agent: *\nDisallow: /private\n")
    first, routes = redirects(5, rules)
    got = await read(first, client=client, routes=routes)
    assert got.allows("/page") and not got.allows("/private/x")
    first, routes = redirects(6, rules)
    hops: list[str] = []

    async def seen(request: web.Request) -> web.StreamResponse:
        hops.append(request.path)
        return await routes[request.path](request)

    got = await read(first, client=client, routes=dict.fromkeys(routes, seen), attempts=3)
    assert got.rules.parser is None and got.rules.unreachable is None
    assert got.allows("/private/x")
    assert hops == ["/r1", "/r2", "/r3", "/r4", "/r5"]  # then /r6 never asked for
    assert any("still a redirect after 5" in note for note in got.notes)


async def test_rules_found_at_another_host_are_the_first_hosts() -> None:
    """2.3.1.2: a robots.txt reached through a redirect to another authority is
    followed "in the context of the initial authority": its Crawl-delay is the
    floor of the host asked, not of the one that answered."""
    app = web.Application()

    async def robots(request: web.Request) -> web.StreamResponse:
        if request.host.startswith("127.0.0.2"):
            raise web.HTTPFound(f"http://127.0.0.3:{request.url.port}/robots.txt")
        return web.Response(text="User-agent: *\nCrawl-delay: 2\nDisallow: /no\n")

    app.router.add_get("/robots.txt", robots)
    throttle = Throttle(policy=FixedDelayPolicy(0.0))
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    try:
        with socket.socket() as probe:  # one port on both addresses
            probe.bind(("127.0.0.2", 0))
            port = probe.getsockname()[1]
        for address in ("127.0.0.2", "127.0.0.3"):
            await web.TCPSite(runner, address, port).start()
        opened = open_sender("aiohttp", throttle, io_timeout=10.0, connections=4, headers={})
        async with opened as sender:
            reader = Robots(sender, throttle, USER_AGENT, attempts=1, note=lambda text: None)
            rules = await asyncio.wait_for(reader.rules(f"http://127.0.0.2:{port}/a"), 60.0)
    finally:
        await runner.cleanup()
    assert rules.origin == f"http://127.0.0.2:{port}"
    assert rules.excluded(f"http://127.0.0.2:{port}/no", USER_AGENT) is not None
    assert throttle.config_for("127.0.0.2").min_delay == 2.0
    assert throttle.config_for("127.0.0.3").min_delay == 0.0
    assert reader.floors == {"127.0.0.2": 2.0} and reader.requests == 2


async def test_a_redirect_loop_ends_as_none() -> None:
    asked = [0]

    async def loop(request: web.Request) -> web.StreamResponse:
        asked[0] += 1
        raise web.HTTPMovedPermanently("/robots.txt")

    got = await read(loop, attempts=3)
    assert got.rules.parser is None and got.allows("/x")
    assert asked[0] == 6  # the first ask and five redirects, once: no retry of a loop


# ----------------------------------------------------------------------------- the body


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_robots_txt_that_never_ends_is_read_to_its_limit(client: Client) -> None:
    """2.5: a limit of at least 500 KiB; the fetch reads 512 KiB and stops, where
    it read on to the end before: a body that never ends held every URL of
    the host for ever. Rules past the limit are not read."""
    sent = [0]

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "text/plain"
        await response.prepare(request)
        await response.write(b"User-agent: *\nDisallow: /early\n")
        line = b"# " + b"x" * 1021 + b"\n"
        while sent[0] < 200 * ROBOTS_BYTES:  # bounded: 100 MiB, never reached
            await response.write(line)
            sent[0] += len(line)
        await response.write(b"Disallow: /late\n")
        return response

    got = await read(endless, client=client)
    assert not got.allows("/early") and got.allows("/late")
    assert sent[0] < 50 * ROBOTS_BYTES


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_robots_txt_that_trickles_in_is_no_answer(client: Client) -> None:
    """A byte every 0.1 s keeps under any timeout between reads, and 512 KiB of
    it would take 15 hours: the body must come within ``within`` (the fetch's
    ``--timeout``) of its headers, else the host is unreachable (2.3.1.4), and
    its URLs are not held meanwhile."""
    sent = [0]

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_type = "text/plain"
        await response.prepare(request)
        await response.write(b"User-agent: *\n")
        for _ in range(600):  # bounded: a minute
            await response.write(b"#")
            sent[0] += 1
            await asyncio.sleep(0.1)
        return response

    got = await read(trickle, client=client, within=1.0, attempts=2)
    assert got.rules.unreachable is not None and "TimeoutError" in got.rules.unreachable
    assert got.asked == 2 and sent[0] < 100


async def test_the_line_the_limit_cuts_is_dropped_not_read_short() -> None:
    """``Disallow: /private-area`` cut at 512 KiB to ``Disallow: /`` would shut
    the whole site: the cut line is dropped."""
    head = b"User-agent: *\nDisallow: /early\n"
    rule = b"Disallow: /"
    filler = b"#" * (ROBOTS_BYTES - len(head) - len(rule) - 1) + b"\n"
    body = head + filler + rule + b"private-area\n"
    assert len(head + filler + rule) == ROBOTS_BYTES
    got = await read(text_of(body))
    assert not got.allows("/early") and got.allows("/page")


async def test_a_robots_txt_just_at_the_limit_is_read_whole() -> None:
    head = b"User-agent: *\n"
    rule = b"Disallow: /last\n"
    body = head + b"#" * (ROBOTS_BYTES - len(head) - len(rule) - 1) + b"\n" + rule
    assert len(body) == ROBOTS_BYTES
    got = await read(text_of(body))
    assert not got.allows("/last") and got.allows("/page")


async def test_a_byte_order_mark_and_bytes_not_utf8_keep_their_rules() -> None:
    """2.2 asks for UTF-8. A byte-order mark at the start made the first line an
    unknown field, and a ``User-agent: *`` there was lost with its rules; a
    Latin-1 path still excludes the URL a browser sends for it."""
    got = await read(text_of(b"\xef\xbb\xbfUser-agent: *\nDisallow: /\n"))
    assert not got.allows("/anything")
    got = await read(text_of(b"User-agent: *\nDisallow: /caf\xe9\n\xff\xfe\x00garbage\n"))
    assert not got.allows("/caf%E9") and got.allows("/cafe")


# ----------------------------------------------------------------------------- matching


def test_the_product_token_is_the_agents_first_word() -> None:
    assert product_token(USER_AGENT) == "autothrottle"
    assert product_token("MyBot/2.1 (+https://example.com/bot)") == "mybot"
    assert product_token("my_bot-x") == "my_bot-x"
    assert product_token("123 bot") == ""


GROUPS = """\
User-agent: *
Disallow: /private

User-agent: fetch
User-agent: github
Disallow: /

User-agent: AutoThrottle
Disallow: /mine
"""


async def test_the_tools_group_applies_not_one_named_for_a_word_of_its_agent() -> None:
    """2.2.1: the group is found by the product token, case-insensitively. The
    default agent's comment says ``fetch`` and its URL ``github``: groups of
    those names applied to the fetch before, and ``Disallow: /`` shut the site."""
    got = await read(text_of(GROUPS))
    assert not got.allows("/mine") and got.allows("/private") and got.allows("/page")
    got = await read(text_of(GROUPS.replace("AutoThrottle", "otherbot")))
    assert not got.allows("/private") and got.allows("/page")
    assert got.allows("/private", "otherbot/1.0") and not got.allows("/mine", "otherbot/1.0")


async def test_the_longest_match_wins_and_wildcards_match() -> None:
    """2.2.2: the most specific (longest) match decides, ``Allow`` on a tie;
    ``*`` is any run of characters and ``$`` the end of the path."""
    got = await read(
        text_of(
            "User-agent: *\n"
            "Disallow: /shop\nAllow: /shop/public\n"
            "Disallow: /*.pdf$\nDisallow: /tmp*/draft\n"
            "Allow: /same\nDisallow: /same\n"
        )
    )
    verdicts = {
        path: got.allows(path)
        for path in (
            "/shop/cart",
            "/shop/public/a",
            "/doc.pdf",
            "/doc.pdf?x=1",
            "/doc.pdfx",
            "/tmp1/draft",
            "/tmp/final",
            "/same",
        )
    }
    assert verdicts == {
        "/shop/cart": False,
        "/shop/public/a": True,
        "/doc.pdf": False,
        "/doc.pdf?x=1": True,
        "/doc.pdfx": True,
        "/tmp1/draft": False,
        "/tmp/final": True,
        "/same": True,
    }


# ----------------------------------------------------------------------------- Crawl-delay


async def test_crawl_delay_is_the_hosts_floor_and_never_lowers_the_users() -> None:
    """``Crawl-delay`` is the host's ``min_delay``, and raises its ``max_delay``
    to it when below; a ``--min-delay`` of the user's above it stays (it was
    replaced by the site's smaller one before)."""
    throttle = Throttle(policy=FixedDelayPolicy(0.0), max_delay=3.0)
    got = await read(text_of("User-agent: *\nCrawl-delay: 5\n"), throttle=throttle)
    config = throttle.config_for("127.0.0.2")
    assert (config.min_delay, config.max_delay) == (5.0, 5.0)
    assert got.rules.floor == 5.0
    throttle = Throttle(policy=FixedDelayPolicy(0.0), min_delay=2.0)
    await read(text_of("User-agent: *\nCrawl-delay: 0.5\n"), throttle=throttle)
    assert throttle.config_for("127.0.0.2").min_delay == 2.0


async def test_a_crawl_delay_past_max_pause_is_held_to_it_and_said() -> None:
    """A robots.txt that asks for a request a year would hold the fetch for a
    year: like a header's pause, it is held to ``max_pause``, and a note says so."""
    throttle = Throttle(policy=FixedDelayPolicy(0.0), max_pause=30.0)
    got = await read(text_of("User-agent: *\nCrawl-delay: 31536000\n"), throttle=throttle)
    assert throttle.config_for("127.0.0.2").min_delay == 30.0
    assert any("held to 30 s" in note for note in got.notes)
