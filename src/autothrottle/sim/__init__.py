"""Simulated sites on loopback, for testing any crawler (autothrottle's or not).

One aiohttp.web server serves many independent hosts at once, each on its own
loopback address (127.0.0.2, 127.0.0.3 …) and with its own behaviour:

* :class:`Capacity`: C workers, service time S; the rest queue, latency grows.
* :class:`RateLimited`: a token bucket; excess gets 429, ``Retry-After`` and
  rate-limit headers.
* :class:`SoftBlock`: a token bucket; excess gets a fast 200 CAPTCHA page
  (tell it apart with :func:`is_blocked_page`).
* :class:`CDN`: most paths are fast cache hits, the rest go to a slow origin.
* :class:`VariableLatency`: fast and slow pages, by path.

Each host records the ground truth (arrivals, statuses, load over time, the
busiest 1-second window), readable as :class:`HostStats` in Python or as JSON
at ``GET /_sim/stats`` on the host itself. It does not depend on the rest of
autothrottle, only on aiohttp.

Example::

    import asyncio, aiohttp
    from autothrottle.sim import Capacity, RateLimited, SimServer

    async def demo() -> None:
        hosts = {"127.0.0.2": Capacity(workers=4, service_time=0.05),
                 "127.0.0.3": RateLimited(rate=10, burst=2)}
        async with SimServer(hosts) as sim, aiohttp.ClientSession() as http:
            for host in sim.hosts:
                async with http.get(sim.url(host, "/page/1")) as response:
                    print(host, response.status)
            truth = sim.stats()["127.0.0.3"]
            print(truth.requests, truth.limited, truth.max_in_window)

    asyncio.run(demo())

From the shell: ``python -m autothrottle.sim --host
127.0.0.2=capacity:workers=4,service_time=0.05 --host 127.0.0.3=rate:rate=10``
(see ``--help`` and docs/sim.md).
"""

try:
    import aiohttp as _aiohttp  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    import sys
    from itertools import pairwise

    from .._extras import missing_extra

    # `python -m autothrottle.sim` imports this package before its __main__, with
    # sys.argv[0] "-m" until it is found: an ImportError then is shown as a
    # traceback, so the command says what to install as `autothrottle sim` does.
    if sys.argv[:1] == ["-m"]:
        _args = pairwise([*sys.orig_argv[1:], ""])
        _target = next((f[2:] or a for f, a in _args if f.startswith("-m")), "")
        if (_target + ".").startswith(__name__ + "."):
            from .._sim_args import help_without_sim

            _prog = f"python -m {_target}"
            _problem = missing_extra(_prog, ["aiohttp"], "sim")
            _help = help_without_sim(sys.argv[1:], _prog, _problem)
            if _help is not None:  # the options can be read before the extra is installed
                sys.stdout.write(_help)
                raise SystemExit(0) from None
            raise SystemExit(_problem) from None
    raise ImportError(
        missing_extra("autothrottle.sim", ["aiohttp"], "sim"), name="aiohttp"
    ) from exc

from ._behaviours import Behaviour
from ._buckets import RateLimited, SoftBlock
from ._cli import main, parse_behaviour
from ._pages import is_blocked_page
from ._server import SimServer
from ._stats import HostStats, RequestRecord, max_in_window
from ._workers import CDN, Capacity, VariableLatency

__all__ = [
    "CDN",
    "Behaviour",
    "Capacity",
    "HostStats",
    "RateLimited",
    "RequestRecord",
    "SimServer",
    "SoftBlock",
    "VariableLatency",
    "is_blocked_page",
    "main",
    "max_in_window",
    "parse_behaviour",
]
