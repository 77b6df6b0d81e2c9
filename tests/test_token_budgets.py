"""Request weight and token budgets: the ``cost`` option, and the token-window rules.

The rules (``docs/signals.md``, "Token budgets") are tested on the pure
estimator with plain numbers, and through a throttle on a hand-set clock.
"""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from autothrottle import FixedDelayPolicy, Throttle
from autothrottle._headers import RateLimit
from autothrottle._request import header_value, options_from_header, options_from_mapping
from autothrottle._tokens import TokenBook, TokenBudget, TokenWindow
from autothrottle.aiohttp import ThrottledSession
from autothrottle.httpx import AsyncThrottledClient
from autothrottle.options import RequestOptions
from autothrottle.requests import ThrottledSession as RequestsSession
from autothrottle.sim.llm import LLMLimits, LLMServer

# -- the cost option ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "cost"),
    [
        (600, 600),
        (0, 0),
        (12.2, 13),  # an estimate: a fraction of a token still counts
        ({"input": 500, "output": 100}, (500, 100)),
        ({"input": 0, "output": 7.5}, (0, 8)),
    ],
)
def test_cost_from_the_mapping(raw: object, cost: object) -> None:
    options = options_from_mapping({"autothrottle": {"cost": raw}})
    assert options == RequestOptions(cost=cost)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "cost"),
    [
        ("cost=600", 600),
        ("COST = 600", 600),
        ("cost=0", 0),
        ("cost=500+100", (500, 100)),
        ("no-adjust, cost=7", None),
    ],
)
def test_cost_from_the_header(value: str, cost: object) -> None:
    options = options_from_header(value)
    if cost is None:
        assert options == RequestOptions(adjust=False, cost=7)
    else:
        assert options == RequestOptions(cost=cost)  # type: ignore[arg-type]


@pytest.mark.parametrize("cost", [600, (500, 100), 0])
def test_cost_round_trips_through_the_header(cost: int | tuple[int, int]) -> None:
    options = RequestOptions(cost=cost, max_wait=2.0)
    assert options_from_header(header_value(options)) == options


@pytest.mark.parametrize(
    "raw",
    [
        -1,
        True,
        "600",
        None,
        float("nan"),
        float("inf"),
        10**16,
        [500, 100],
        {"input": 5},
        {"input": 5, "output": -1},
        {"input": 5, "output": 1, "cached": 3},
        {"in": 1, "out": 2},
    ],
    ids=repr,
)
def test_a_bad_cost_option_names_it(raw: object) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        options_from_mapping({"autothrottle": {"cost": raw}})
    assert "'cost'" in str(info.value)
    assert repr(raw) in str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        "cost=",
        "cost=-5",
        "cost=lots",
        "cost=1+",
        "cost=+1",
        "cost=1+2+3",
        "cost=nan",
        "cost=\u00b2",
        "cost=" + "9" * 5000,
        "cost=" + "9" * 16,
    ],
)
def test_a_bad_cost_directive_names_it(value: str) -> None:
    with pytest.raises(ValueError) as info:
        options_from_header(value)
    assert "X-AutoThrottle" in str(info.value)
    assert "cost" in str(info.value)
    assert repr(value) in str(info.value)


def test_merged_cost_takes_the_later_one() -> None:
    assert RequestOptions(cost=5).merged(RequestOptions(cost=7)).cost == 7
    assert RequestOptions(cost=5).merged(RequestOptions()).cost == 5
    assert RequestOptions().merged(RequestOptions(cost=(1, 2))).cost == (1, 2)


# -- the token-window rules, with plain numbers --------------------------------------

TOKENS = "X-RateLimit-*-Tokens"


def window(
    remaining: int, reset: float, limit: int | None = 1000, unit: str = "tokens"
) -> RateLimit:
    return RateLimit(remaining, reset, limit, TOKENS, unit=unit)


def read(
    book: TokenBook,
    *windows: RateLimit,
    now: float,
    sent_at: float | None = None,
    refused: bool = False,
) -> float | None:
    return BUDGET.read(book, windows, now, sent_at, refused=refused)


BUDGET = TokenBudget(max_pause=300.0)


def test_a_cost_waits_for_the_refill_the_response_implies() -> None:
    book = TokenBook()
    read(book, window(400, 6.0), now=10.0)  # 600 missing, full in 6 s: 100 a second
    assert BUDGET.fits_at(book, 400, 10.0) == 10.0
    assert BUDGET.fits_at(book, 500, 10.0) == pytest.approx(11.0)
    assert BUDGET.fits_at(book, 500, 10.5) == pytest.approx(11.0)
    assert BUDGET.fits_at(book, 500, 11.0) == 11.0


def test_a_window_is_full_at_its_reset_s_own_instant() -> None:
    """The gate's wake for a window's reset falls on the reset's own instant
    (``fits_at`` answers ``full_at`` itself, and a virtual clock wakes exactly
    then): the window is full there, not a moment after. A window of 100
    tokens, refilling 1 a second, empty until its reset at 10 s: grants of 60,
    30 and 30 at 10 s spend from the full window, and the third waits for 20
    tokens of refill (30 s), not for 110 (120 s: the first two spent from a
    level the reset had not lifted)."""
    book = TokenBook()
    book.windows["tokens"] = TokenWindow(
        "tokens", limit=100, level=0.0, at=0.0, rate=1.0, full_at=10.0
    )
    assert BUDGET.fits_at(book, 60, 5.0) == 10.0  # the reset comes before the refill
    for cost in (60, 30):
        assert BUDGET.fits_at(book, cost, 10.0) == 10.0
        BUDGET.spend(book, cost, 10.0)
    assert BUDGET.fits_at(book, 30, 10.0) == pytest.approx(30.0)


def test_grants_since_the_request_was_sent_come_off_what_remains() -> None:
    book = TokenBook()
    read(book, window(1000, 0.0), now=0.0)
    BUDGET.spend(book, 300, 1.0)  # granted after the request below was sent at 0.5
    read(book, window(500, 5.0), now=2.0, sent_at=0.5)  # 500 left when that request arrived
    assert book.windows["tokens"].level == 200
    assert BUDGET.fits_at(book, 200, 2.0) == 2.0
    assert BUDGET.fits_at(book, 300, 2.0) == pytest.approx(3.0)  # refills 100 a second


def test_an_older_request_s_response_is_older_news() -> None:
    book = TokenBook()
    read(book, window(100, 9.0), now=5.0, sent_at=4.0)
    read(book, window(900, 1.0), now=5.5, sent_at=3.0)  # sent earlier: counted less
    assert book.windows["tokens"].level == 100


def test_a_grant_spends_its_cost_in_each_window_s_unit() -> None:
    book = TokenBook()
    read(
        book,
        window(30000, 0.0, 30000, "input-tokens"),
        window(8000, 0.0, 8000, "output-tokens"),
        now=0.0,
    )
    BUDGET.spend(book, (500, 100), 0.0)
    assert book.windows["input-tokens"].level == 29500
    assert book.windows["output-tokens"].level == 7900
    BUDGET.spend(book, 600, 0.0)  # one number counts whole against each
    assert book.windows["input-tokens"].level == 28900
    assert book.windows["output-tokens"].level == 7300


def test_a_request_waits_until_its_cost_fits_every_window() -> None:
    book = TokenBook()
    read(
        book,
        window(1000, 10.0, 2000, "input-tokens"),  # 100 a second
        window(0, 8.0, 800, "output-tokens"),  # 100 a second
        now=0.0,
    )
    assert BUDGET.fits_at(book, (500, 100), 0.0) == pytest.approx(1.0)  # the output binds
    assert BUDGET.fits_at(book, (1500, 100), 0.0) == pytest.approx(5.0)  # the input binds


def test_a_request_without_a_cost_waits_only_while_a_window_is_spent() -> None:
    book = TokenBook()
    read(book, window(3, 10.0), now=0.0)
    assert BUDGET.fits_at(book, None, 0.0) == 0.0
    read(book, window(0, 10.0), now=0.0)  # 100 a second: one token in 10 ms
    # 10 ms, and the microsecond past it that the server's rounding may need
    assert BUDGET.fits_at(book, None, 0.0) == pytest.approx(0.01, abs=2e-6)
    BUDGET.spend(book, None, 0.0)  # and spends nothing
    assert book.windows["tokens"].level == 0


def test_a_cost_above_the_limit_goes_when_the_window_is_full() -> None:
    book = TokenBook()
    read(book, window(0, 10.0), now=0.0)
    assert BUDGET.fits_at(book, 5000, 0.0) == pytest.approx(10.0)


def test_the_window_is_full_again_at_its_reset_whatever_the_rate() -> None:
    book = TokenBook()
    read(book, window(0, 5.0, limit=None), now=0.0)  # no limit: no rate to work out
    assert BUDGET.fits_at(book, 100, 0.0) == 5.0
    BUDGET.spend(book, 100, 6.0)
    assert BUDGET.fits_at(book, 10**6, 6.0) == 6.0  # after the reset, nothing is known


def test_until_a_response_shows_the_rate_a_window_refills_its_limit_in_a_minute() -> None:
    book = TokenBook()
    read(book, window(1000, 0.0), now=0.0, sent_at=0.0)  # full: no rate to read
    BUDGET.spend(book, 1000, 0.0)
    assert BUDGET.fits_at(book, 100, 0.0) == pytest.approx(6.0)  # 1000 a minute
    read(book, window(995, 1.0), now=1.0, sent_at=0.5)  # nearly full: 5/s is rounding
    BUDGET.spend(book, 995, 1.0)
    assert BUDGET.fits_at(book, 100, 1.0) == pytest.approx(7.0)  # still a minute's rate
    read(book, window(500, 2.0), now=2.0, sent_at=1.5)  # half empty: 250 a second
    assert book.windows["tokens"].rate == 250
    read(book, window(999, 1.0), now=3.0, sent_at=2.5)  # nearly full again: the rate stands
    assert book.windows["tokens"].rate == 250


def test_a_refusal_that_says_a_window_is_spent_pauses_until_its_reset() -> None:
    book = TokenBook()
    assert read(book, window(0, 7.5), now=0.0, refused=True) == 7.5
    assert read(book, window(0, 7.5), now=0.0) is None  # a success that spent the last
    assert read(book, window(10, 7.5), now=0.0, refused=True) is None  # refused for another cause


def test_answers_to_grants_of_one_moment_count_none_of_them_twice() -> None:
    # Three grants at one moment (100, 200, 300 tokens), taken by the server in
    # that order. Each answer's remaining counts those taken before it, and the
    # grants of that moment count as spent after it, the smallest aside: the
    # first answer reads 900 - 500 = 400, the truth; the others read 200 and
    # -100, and used to stand, holding the slot a window for tokens it had.
    book = TokenBook()
    read(book, window(1000, 0.0), now=0.0, sent_at=0.0)
    for cost in (100, 200, 300):
        BUDGET.spend(book, cost, 1.0)
    for remaining in (900, 700, 400):
        read(book, window(remaining, 6.0), now=1.0, sent_at=1.0)
    assert book.windows["tokens"].level == pytest.approx(400.0)
    assert BUDGET.fits_at(book, 400, 1.0) == 1.0


def test_no_wait_is_longer_than_max_pause() -> None:
    book = TokenBook()
    read(book, window(0, 1e9, limit=None), now=0.0)
    TokenBudget(max_pause=30.0).read(book, [window(0, 1e9, limit=None)], 0.0, 0.0, refused=False)
    assert TokenBudget.fits_at(book, 1, 0.0) == 30.0


def test_a_slow_window_refills_at_the_rate_it_said() -> None:
    # 30 tokens, all spent, full in 120 s: a quarter of a token a second, as said
    # (slower than the limit a minute, which holds only until a response says).
    book = TokenBook()
    read(book, window(0, 120.0, limit=30), now=0.0)
    assert BUDGET.fits_at(book, 2, 0.0) == pytest.approx(8.0)
    assert BUDGET.fits_at(book, 2, 8.0) == 8.0


def test_a_cost_equal_to_what_remains_fits() -> None:
    book = TokenBook()
    read(book, window(5, 10.0, limit=None), now=0.0)
    assert BUDGET.fits_at(book, 5, 0.0) == 0.0
    assert BUDGET.fits_at(book, 6, 0.0) == 10.0  # no rate known: at the reset


def test_a_window_holds_no_more_than_its_limit() -> None:
    # Nearly full (a reset that is rounding): the minute's rate, 1000/60 a second,
    # would take the level past the limit in 10 s; the bucket holds 1000.
    book = TokenBook()
    read(book, window(990, 100.0), now=0.0)
    BUDGET.spend(book, 500, 10.0)
    assert BUDGET.fits_at(book, 500, 10.0) == 10.0
    assert BUDGET.fits_at(book, 600, 10.0) == pytest.approx(10.0 + 100 / (1000 / 60))


def test_a_whole_window_cost_goes_at_the_reset_even_when_the_rate_is_slower() -> None:
    # The rate was read off a half-empty window (10 a second); a nearly full one
    # since says the reset is in 2 s, which is rounding, not a rate: the rate
    # stands, but the window is full at its reset at the latest.
    book = TokenBook()
    read(book, window(500, 50.0), now=0.0, sent_at=0.0)
    read(book, window(920, 2.0), now=0.0, sent_at=0.0)
    assert book.windows["tokens"].rate == 10
    assert BUDGET.fits_at(book, 1000, 0.0) == 2.0
    assert BUDGET.fits_at(book, 5000, 0.0) == 2.0  # above the limit: a full window


def test_exactly_a_tenth_empty_tells_the_rate() -> None:
    book = TokenBook()
    read(book, window(900, 2.0), now=0.0, sent_at=0.0)  # 100 of 1000 missing: 50 a second
    read(book, window(999, 1.0), now=1.0, sent_at=0.5)  # nearly full: the rate stands
    assert book.windows["tokens"].rate == 50


@pytest.mark.parametrize("reset", [0.0, 0.01])
def test_a_reset_that_says_no_rate_leaves_the_minute_s(reset: float) -> None:
    # A spent window full again now (reset 0), or a full one whose reset is 10 ms
    # of rounding: neither says how fast it refills.
    book = TokenBook()
    remaining = 0 if reset == 0.0 else 1000
    read(book, window(remaining, reset), now=0.0, sent_at=0.0)
    BUDGET.spend(book, 1000, 0.5)
    assert BUDGET.fits_at(book, 100, 0.5) == pytest.approx(0.5 + 6.0)


@pytest.mark.parametrize("order", [(900, 700), (700, 900)])
def test_two_grants_of_one_moment_read_in_either_order(order: tuple[int, int]) -> None:
    # 100 and 200 tokens granted at one moment, taken by the server in that order:
    # the 100's answer says 900, the 200's 700. Whichever comes first, the level
    # is 700 (the highest reading of the moment, the 200 counted after it).
    book = TokenBook()
    read(book, window(1000, 0.0), now=0.0, sent_at=0.0)
    BUDGET.spend(book, 100, 1.0)
    BUDGET.spend(book, 200, 1.0)
    for remaining in order:
        read(book, window(remaining, 6.0), now=1.5, sent_at=1.0)
    assert book.windows["tokens"].level == pytest.approx(700.0)


def test_a_grant_of_the_same_moment_is_taken_as_later_but_the_smallest() -> None:
    # Two grants at one moment, one answer: the smallest (by its tokens) is taken
    # as the answered request's own, the other as later.
    book = TokenBook()
    read(book, window(1000, 0.0), now=0.0, sent_at=0.0)
    BUDGET.spend(book, (100, 250), 1.0)  # 350 tokens
    BUDGET.spend(book, (300, 0), 1.0)  # 300 tokens: the smallest
    read(book, window(700, 6.0), now=1.5, sent_at=1.0)
    assert book.windows["tokens"].level == pytest.approx(700 - 350)


def test_one_grant_with_a_cost_at_a_moment_is_its_answer_s_own() -> None:
    # A request without a cost and one of 100 tokens granted at one moment: only
    # grants with a cost are counted, and the one of the moment is the answer's
    # own. The server took the cost-less one first (1000 left when it came), then
    # the 100's (900): its reading is the later truth, and stands though lower.
    book = TokenBook()
    read(book, window(1000, 0.0), now=0.0, sent_at=0.0)
    BUDGET.spend(book, None, 1.0)
    BUDGET.spend(book, 100, 1.0)
    read(book, window(1000, 6.0), now=1.5, sent_at=1.0)
    assert book.windows["tokens"].level == pytest.approx(1000.0)
    read(book, window(900, 6.0), now=1.6, sent_at=1.0)
    assert book.windows["tokens"].level == pytest.approx(900.0)


def test_a_grant_comes_off_every_later_answer_of_a_request_sent_before_it() -> None:
    # On a clock that reads 1000 s and more (costs smaller than the times).
    book = TokenBook()
    read(book, window(1000, 0.0), now=1000.0, sent_at=1000.0)
    BUDGET.spend(book, 300, 1001.0)
    read(book, window(1000, 6.0), now=1002.0, sent_at=1000.5)
    assert book.windows["tokens"].level == pytest.approx(700.0)
    read(book, window(990, 6.0), now=1003.0, sent_at=1000.8)  # sent before it too
    assert book.windows["tokens"].level == pytest.approx(690.0)


def test_a_grant_since_comes_off_a_window_in_its_own_unit() -> None:
    book = TokenBook()
    read(book, window(30000, 0.0, 30000, "input-tokens"), now=0.0, sent_at=0.0)
    BUDGET.spend(book, (500, 100), 1.0)
    read(book, window(30000, 6.0, 30000, "input-tokens"), now=2.0, sent_at=0.5)
    assert book.windows["input-tokens"].level == pytest.approx(29500.0)


def test_a_refusal_pauses_until_a_spent_window_s_reset_however_near() -> None:
    assert read(TokenBook(), window(0, 0.25), now=0.0, refused=True) == 0.25


class _Bucket:
    """A token bucket as the LLM APIs run one, on plain numbers."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit, self.rate, self.level, self.stamp = limit, limit / window, float(limit), 0.0

    def take(self, now: float, cost: int) -> tuple[bool, RateLimit]:
        self.level = min(self.limit, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        ok = self.level >= cost
        if ok:
            self.level -= cost
        reset = math.ceil((self.limit - self.level) / self.rate * 1000) / 1000  # in ms, rounded up
        return ok, window(math.floor(self.level), reset, self.limit)


# Found by a run: the bucket emptied at 6.27 s held the next request's 31 tokens
# at 7.2 s by the book's sum and 30.999999999 by the server's, counted from its
# own stamps, and refused it at that instant.
@example(limit=2000, window_s=60.0, latency=0.0625, in_flight=9, seed=2)
@settings(max_examples=30, deadline=None)
@given(
    limit=st.integers(2000, 50_000),
    window_s=st.floats(1.0, 60.0),
    latency=st.floats(0.001, 0.1),
    in_flight=st.integers(4, 16),
    seed=st.integers(0, 2**32),
)
def test_property_costs_kept_within_the_bucket_use_it_and_are_never_refused(
    limit: int, window_s: float, latency: float, in_flight: int, seed: int
) -> None:
    """Requests of random costs, up to ``in_flight`` at once, each sent when the rules
    say it fits and answered ``latency`` (of a window) later: once a first answer
    has told the window, none is refused, and the bucket's refill is used."""
    rng = random.Random(seed)
    server, book = _Bucket(limit, window_s), TokenBook()
    flying: list[tuple[float, float, int, RateLimit]] = []
    now, taken = 0.0, 0
    latency *= window_s
    end = 10 * window_s
    costs = [rng.randint(1, limit // 8) for _ in range(5_000)]
    read(book, server.take(0.0, 0)[1], now=0.0, sent_at=0.0)  # what a first answer said
    while now < end and costs:
        send_at = math.inf
        if len(flying) < in_flight:
            send_at = BUDGET.fits_at(book, costs[-1], now)
        if flying and flying[0][0] <= send_at:  # a response comes first
            answered, sent, cost, said = flying.pop(0)
            now = max(now, answered)
            read(book, said, now=now, sent_at=sent)
            continue
        now, cost = send_at, costs.pop()
        BUDGET.spend(book, cost, now)
        ok, said = server.take(now, cost)
        assert ok, "refused"
        taken += cost
        flying.append((now + latency, now, cost, said))
        flying.sort(key=lambda flight: flight[0])
    allowed = limit + limit / window_s * now
    assert costs  # the run was limited by the bucket, not by the requests to send
    assert taken >= 0.95 * allowed


# -- the cost through every adapter, against a loopback API ----------------------------


async def _send_twice(client: str, url: str, throttle: Throttle) -> None:
    body = {
        "model": "sim",
        "messages": [{"role": "user", "content": "w " * 300}],
        "max_tokens": 500,
    }
    option = {"autothrottle": {"cost": 800}}
    if client == "httpx":
        async with AsyncThrottledClient(throttle=throttle) as http:
            for _ in range(2):
                (await http.post(url, json=body, extensions=option)).raise_for_status()
    elif client == "httpx-header":
        async with AsyncThrottledClient(throttle=throttle) as http:
            for _ in range(2):
                headers = {"X-AutoThrottle": "cost=800"}
                (await http.post(url, json=body, headers=headers)).raise_for_status()
    elif client == "aiohttp":
        async with ThrottledSession(throttle=throttle) as session:
            for _ in range(2):
                async with session.post(url, json=body, trace_request_ctx=option) as response:
                    response.raise_for_status()
    else:

        def send() -> None:
            with RequestsSession(throttle=throttle) as session:
                for _ in range(2):
                    session.post(
                        url, json=body, autothrottle=option["autothrottle"]
                    ).raise_for_status()

        await asyncio.to_thread(send)


@pytest.mark.parametrize("client", ["httpx", "httpx-header", "aiohttp", "requests"])
async def test_every_adapter_holds_a_request_until_its_cost_fits(client: str) -> None:
    throttle = Throttle(policy=FixedDelayPolicy(0.0))
    async with LLMServer(LLMLimits(requests=100, tokens=1000, window=1.0)) as api:
        await _send_twice(client, api.url + "/v1/chat/completions", throttle)
    assert [r.status for r in api.records] == [200, 200]  # the second was never refused
    first, second = (r.arrival for r in api.records)
    assert second - first >= 0.5  # 600 more tokens at 1000 a second


def test_a_book_has_spends_of_its_own_from_its_first_grant_with_a_cost() -> None:
    # Books that spent nothing share one empty deque (no 760-byte block a slot).
    from autothrottle import _tokens

    spent, idle = TokenBook(), TokenBook()
    for book in (spent, idle):
        read(book, window(1000, 10.0), now=0.0)
    BUDGET.spend(spent, 100, 1.0)
    assert list(spent.spends) == [(1.0, 100)]
    assert list(idle.spends) == [] and len(_tokens._NO_SPENDS) == 0
    assert spent.spends.maxlen == _tokens._MAX_SPENDS
