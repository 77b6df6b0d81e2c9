"""A token cost held at the wire by a pause is not in what the answers of later sends say.

An LLM API's answer says what remained of its tokens when the request arrived:
every request that reached the API before it is counted. The throttle takes
off what it granted since (``docs/signals.md``, "Token budgets"). A request
granted before a refusal paused the slot is held at its wire turn until the
pause ends, and may reach the API after requests granted once it ended: its
cost is in no answer until it arrives. Found walking ``docs/llm.md`` with the
real SDKs: after another client of the key spent its tokens, one request too
many went when the pause ended, and was refused.
"""

from __future__ import annotations

import pytest

from autothrottle import FixedDelayPolicy, Lease, Throttle, _tokens
from autothrottle._headers import RateLimit
from autothrottle._tokens import TokenBook, TokenBudget, TokenWindow
from helpers import FakeClock, gate_of

BUDGET = TokenBudget(max_pause=300.0)


def window(remaining: int, reset: float) -> RateLimit:
    return RateLimit(remaining, reset, 1000, "X-RateLimit-*-Tokens", unit="tokens")


KEY = "api.example.com"


def tokens(remaining: int, reset: str) -> dict[str, str]:
    return {
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": str(remaining),
        "x-ratelimit-reset-tokens": reset,
    }


def fits_in(throttle: Throttle, clock: FakeClock, cost: int) -> float:
    """Seconds until ``cost`` fits the token window, as the slot estimates it (the
    backoff the refusal set spaces the sends too: that is not looked at here)."""
    book = gate_of(throttle.slot(KEY)).token_book
    return TokenBudget.fits_at(book, cost, clock.now) - clock.now


def on_wire(clock: FakeClock, lease: Lease) -> None:
    """Let ``lease`` take its wire turn, the clock moved on as it is told to wait."""
    for _ in range(10):
        wait = lease.wire_wait()
        if wait == 0.0:
            return
        clock.advance(wait)
    raise AssertionError("never on the wire")


def granted(throttle: Throttle, cost: int) -> Lease:
    lease = throttle.try_acquire(KEY, cost=cost)
    assert lease is not None
    return lease


@pytest.fixture
def paused() -> tuple[FakeClock, Throttle, Lease]:
    """1,000 tokens a second. A request is granted, and before it reaches the
    wire another's refusal (another client spent the key's tokens) pauses the
    slot for 2 s: it is held at its wire turn. The pause ends."""
    clock = FakeClock()
    throttle = Throttle(clock=clock, policy=FixedDelayPolicy(0.0), max_concurrency=10)
    first = granted(throttle, 400)
    assert first.wire_wait() == 0.0
    first.finish(0.01, 200, tokens(700, "300ms"))  # 300 counted: 1,000 a second
    clock.advance(1.0)
    refused, held = granted(throttle, 400), granted(throttle, 400)
    assert refused.wire_wait() == 0.0
    refused.finish(0.01, 429, tokens(0, "2s"))
    assert held.wire_wait() > 0.0  # paused
    clock.advance(2.0)
    return clock, throttle, held


def test_a_send_held_through_a_pause_comes_off_a_later_send_s_answer(
    paused: tuple[FakeClock, Throttle, Lease],
) -> None:
    """The pause over, a new request overtakes the held one on the wire; its
    answer says 700 remain, which the held request's 400 are not in yet: 300
    are left, and a third 400 waits for the refill (0.1 s), not sent now to be
    refused."""
    clock, throttle, held = paused
    overtaking = granted(throttle, 400)
    assert overtaking.wire_wait() == 0.0
    overtaking.finish(0.01, 200, tokens(700, "300ms"))
    assert fits_in(throttle, clock, 300) == 0.0
    assert fits_in(throttle, clock, 400) == pytest.approx(0.1, abs=1e-5)
    held.release()


def test_once_on_the_wire_the_held_send_is_in_the_answers_of_later_sends(
    paused: tuple[FakeClock, Throttle, Lease],
) -> None:
    """The held request goes on the wire after the new one: an answer to a
    request sent after it counts it, and nothing comes off that answer."""
    clock, throttle, held = paused
    overtaking = granted(throttle, 400)
    assert overtaking.wire_wait() == 0.0
    on_wire(clock, held)
    later = granted(throttle, 100)
    on_wire(clock, later)
    later.finish(0.01, 200, tokens(500, "500ms"))  # all three counted
    assert fits_in(throttle, clock, 500) == 0.0  # 500 left, and none to come off
    assert fits_in(throttle, clock, 501) > 0.0
    for lease in (overtaking, held):
        lease.release()


def test_a_held_send_let_go_before_the_wire_comes_off_no_answer(
    paused: tuple[FakeClock, Throttle, Lease],
) -> None:
    """A request held at the wire and then let go (cancelled, timed out) never
    reaches the API: once it is let go, answers are taken at their word again."""
    clock, throttle, held = paused
    held.release()
    overtaking = granted(throttle, 400)
    assert overtaking.wire_wait() == 0.0
    overtaking.finish(0.01, 200, tokens(700, "300ms"))
    assert fits_in(throttle, clock, 700) == 0.0


# -- the book's side, with plain numbers -------------------------------------------------


class Request:
    """A granted request as the wire turn holds it."""

    def __init__(self, sent_at: float) -> None:
        self.sent_at = sent_at
        self.released = False


def test_a_held_grant_without_a_cost_moves_nothing() -> None:
    book = TokenBook()
    TokenBudget.spend(book, 0, 0.0)  # no window known yet: nothing is kept
    TokenBudget.hold(book, Request(0.0))
    assert book.held is None
    book.windows["tokens"] = TokenWindow("tokens", limit=1000, level=1000.0, at=0.0)
    TokenBudget.spend(book, 100, 1.0)
    TokenBudget.hold(book, Request(2.0))  # granted after every cost spent: none of them
    TokenBudget.hold(book, Request(0.5))  # granted between: none of them either
    assert list(book.spends) == [(1.0, 100)] and book.held is None


def test_a_held_grant_moves_to_when_it_went_and_its_answer_is_read_as_of_then() -> None:
    book = TokenBook()
    book.windows["tokens"] = TokenWindow("tokens", limit=1000, level=1000.0, at=0.0)
    held, later = Request(1.0), Request(2.0)
    TokenBudget.spend(book, 300, 1.0)
    TokenBudget.spend(book, 200, 2.0)
    TokenBudget.hold(book, held)
    assert list(book.spends) == [(2.0, 200)]
    TokenBudget.went(book, later, 2.5)  # not held: nothing moves
    TokenBudget.went(book, held, 3.0)
    assert list(book.spends) == [(2.0, 200), (3.0, 300)] and book.held == []
    # The held request's own answer: as of when it went, the later one (sent
    # before it) counted, nothing to come off.
    BUDGET.read(book, [window(500, 0.5)], 3.1, 1.0, refused=False)
    assert book.windows["tokens"].level == 500
    assert book.went == {}


def test_the_times_grants_went_are_forgotten_past_the_bound() -> None:
    book = TokenBook()
    book.windows["tokens"] = TokenWindow("tokens", limit=10**9, level=1e9, at=0.0)
    for n in range(_tokens._MAX_SPENDS + 1):  # answers never read
        request = Request(float(n))
        TokenBudget.spend(book, 1, float(n))
        TokenBudget.hold(book, request)
        TokenBudget.went(book, request, n + 0.5)
    assert book.went is not None and len(book.went) == 1


def test_an_answer_to_a_grant_that_never_waited_is_read_as_of_its_grant() -> None:
    """Beside a grant that waited for its wire turn and went, one that never
    waited is read as of its own grant: the book knows when the other went,
    not when this one did."""
    book = TokenBook()
    book.windows["tokens"] = TokenWindow("tokens", limit=1000, level=1000.0, at=0.0)
    held = Request(1.0)  # the plain request, granted at 2.0, never waits
    TokenBudget.spend(book, 300, 1.0)
    TokenBudget.hold(book, held)
    TokenBudget.spend(book, 200, 2.0)
    TokenBudget.went(book, held, 3.0)
    # The plain request's answer: its own 200 counted, the held one's 300 (it
    # went after) not yet, so they come off.
    BUDGET.read(book, [window(800, 0.5)], 3.1, 2.0, refused=False)
    assert book.windows["tokens"].level == 500
    assert book.went == {1.0: 3.0}  # the held request's answer is still to come


def test_a_cost_still_held_comes_off_beside_the_grants_since() -> None:
    """An answer counts neither the grants after its request nor a cost the wire
    still holds: both come off what it says remains."""
    book = TokenBook()
    book.windows["tokens"] = TokenWindow("tokens", limit=1000, level=1000.0, at=0.0)
    held = Request(1.0)
    TokenBudget.spend(book, 300, 1.0)
    TokenBudget.hold(book, held)
    TokenBudget.spend(book, 200, 2.0)  # went at once
    TokenBudget.spend(book, 100, 3.0)  # granted after it
    BUDGET.read(book, [window(800, 0.5)], 3.5, 2.0, refused=False)
    assert book.windows["tokens"].level == 400  # 800 - 100 granted since - 300 held


def test_each_held_grant_keeps_when_it_went_until_its_answer() -> None:
    """Two grants held, both go: each answer is read as of when its own request
    went, the second's going forgetting nothing of the first's."""
    book = TokenBook()
    book.windows["tokens"] = TokenWindow("tokens", limit=1000, level=1000.0, at=0.0)
    first, second = Request(1.0), Request(1.5)
    TokenBudget.spend(book, 300, 1.0)
    TokenBudget.spend(book, 200, 1.5)
    TokenBudget.hold(book, first)
    TokenBudget.hold(book, second)
    TokenBudget.went(book, first, 3.0)
    TokenBudget.went(book, second, 3.2)
    assert book.went == {1.0: 3.0, 1.5: 3.2}
    # The first's answer counts its own 300, not the second's 200 (it went later).
    BUDGET.read(book, [window(700, 0.5)], 3.3, 1.0, refused=False)
    assert book.windows["tokens"].level == 500
    assert book.went == {1.5: 3.2}
