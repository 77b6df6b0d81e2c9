"""The host side of the virtual-clock replays (``rate_replay.py``, ``slow_replay.py``).

One request on looptime's clock: it reaches the host ``wire`` seconds after
it went, where the simulator's own token bucket serves it (10 ms, +-10 %) or
refuses it at once with ``Retry-After``, and its answer comes back ``wire``
later, plus ``lag`` seconds of client time (exponential, the mean given) to
stand for a loaded machine.
"""

from __future__ import annotations

import asyncio
import random

from autothrottle.sim._buckets import Bucket

__all__ = ["through_bucket"]


async def through_bucket(
    bucket: Bucket,
    ok: list[float],
    refused: list[float],
    rng: random.Random,
    wire: float,
    lag: float,
) -> tuple[int, dict[str, str]]:
    """Send one request through ``bucket``; its status and headers. The arrival
    time at the host goes to ``ok`` or ``refused``."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(wire)
    arrival = loop.time()
    if bucket.take(arrival):
        ok.append(arrival)
        await asyncio.sleep(0.01 * rng.uniform(0.9, 1.1))
        status, headers = 200, {}
    else:
        refused.append(arrival)
        status, headers = 429, {"Retry-After": str(bucket.retry_after())}
    await asyncio.sleep(wire + (rng.expovariate(1.0 / lag) if lag else 0.0))
    return status, headers
