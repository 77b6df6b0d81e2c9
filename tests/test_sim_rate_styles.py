"""The simulator's rate-limit header styles: the three ways servers word a budget.

What each style must say is in RateLimited's docstring and docs/sim.md; these
tests read the headers of a real loopback server's answers.
"""

from __future__ import annotations

import aiohttp
import pytest

from autothrottle.sim import RateLimited, SimServer


async def budgets(style: str, count: int) -> list[tuple[int, str, str]]:
    behaviour = RateLimited(rate=10, burst=2, header_style=style)
    async with (
        SimServer({"127.0.0.2": behaviour}) as server,
        aiohttp.ClientSession() as session,
    ):
        seen = []
        for i in range(count):
            async with session.get(server.url("127.0.0.2", f"/page/{i}")) as response:
                seen.append(
                    (
                        response.status,
                        response.headers["RateLimit"],
                        response.headers["RateLimit-Policy"],
                    )
                )
        return seen


async def test_eager_sends_t0_while_tokens_remain_and_t_when_empty() -> None:
    seen = await budgets("eager", 3)
    assert seen[0] == (200, '"default";r=1;t=0', '"default";q=10;w=1')
    assert seen[1][0] == 200 and seen[1][1].endswith("r=0;t=1")
    assert seen[2][0] == 429 and seen[2][1].endswith("r=0;t=1")


async def test_refill_sends_the_time_until_the_bucket_is_full() -> None:
    seen = await budgets("refill", 2)
    assert seen[0][1] == '"default";r=1;t=1'


async def test_window_counts_down_a_fixed_quota() -> None:
    seen = await budgets("window", 11)
    remaining = [int(h.split("r=")[1].split(";")[0]) for _, h, _ in seen]
    assert remaining[:10] == list(range(9, -1, -1))
    assert [status for status, _, _ in seen[:10]] == [200] * 10
    assert seen[10][0] == 429


def test_an_unknown_style_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="header_style"):
        RateLimited(rate=1, header_style="lazy")
