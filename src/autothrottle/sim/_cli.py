"""``python -m autothrottle.sim``: run simulated hosts from the command line.

Kept free of global state so that a later ``autothrottle sim`` subcommand can
hand its arguments straight to :func:`main`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from autothrottle._sim_args import build_sim_parser

from ._behaviours import Behaviour
from ._buckets import RateLimited, SoftBlock
from ._server import SimServer, host_name, host_names, loopback_address, loopback_addresses
from ._workers import CDN, Capacity, VariableLatency

__all__ = ["main", "parse_behaviour"]

_KINDS: dict[str, type[Behaviour]] = {
    "capacity": Capacity,
    "rate": RateLimited,
    "rate-limited": RateLimited,
    "ratelimited": RateLimited,
    "softblock": SoftBlock,
    "soft-block": SoftBlock,
    "cdn": CDN,
    "variable": VariableLatency,
    "variable-latency": VariableLatency,
}
_INTS = {"workers", "burst"}
_BOOLS = {"retry_after", "headers"}
_STRS = {"header_style"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_CDN_ORIGIN = ("workers", "service_time", "jitter")

#: The hosts ``python -m autothrottle.sim`` serves when given none: one of each kind.
DEFAULT_SPECS = (
    "capacity:workers=4,service_time=0.05",
    "rate:rate=5,burst=5",
    "softblock:rate=5",
    "cdn:hit_ratio=0.9,edge_time=0.005,workers=2,service_time=0.2",
    "variable:fast_time=0.03,slow_time=0.5,slow_ratio=0.2,workers=4",
)


def _parameters(cls: type[Behaviour]) -> list[str]:
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    if cls is CDN:
        names = [n for n in names if n != "origin"] + list(_CDN_ORIGIN)
    return names


def _convert(kind: str, name: str, text: str) -> object:
    if name in _STRS:
        return text
    if name in _BOOLS:
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"{kind}: {name} must be true or false, got {text!r}")
    try:
        return int(text) if name in _INTS else float(text)
    except ValueError:
        what = "an int" if name in _INTS else "a number"
        raise ValueError(f"{kind}: {name} must be {what}, got {text!r}") from None


def parse_behaviour(spec: str) -> Behaviour:
    """A behaviour from its command-line form, ``kind[:name=value,...]``.

    Kinds: ``capacity``, ``rate`` (or ``rate-limited``), ``softblock``,
    ``cdn`` and ``variable``; parameters are the dataclass fields (``-`` may
    stand for ``_``). A ``cdn`` takes its origin's ``workers``,
    ``service_time`` and ``jitter`` directly. ``Behaviour.spec`` gives the
    inverse. Raises ValueError naming what is wrong.
    """
    kind, _, rest = spec.strip().partition(":")
    kind = kind.strip().lower()
    cls = _KINDS.get(kind)
    if cls is None:
        raise ValueError(
            f"unknown behaviour kind {kind!r} in {spec!r}; expected one of {sorted(_KINDS)}"
        )
    allowed = _parameters(cls)
    values: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        name, eq, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not eq:
            raise ValueError(f"{kind}: expected name=value, got {item!r}")
        if name not in allowed:
            raise ValueError(f"{kind}: unknown parameter {name!r}; expected one of {allowed}")
        if name in values:
            raise ValueError(f"{kind}: {name} is given twice")
        values[name] = _convert(kind, name, text.strip())
    if cls is CDN:
        default = CDN().origin
        origin = {n: values.pop(n, getattr(default, n)) for n in _CDN_ORIGIN}
        values["origin"] = Capacity(**origin)
    missing = [
        f.name
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"{kind}: {', '.join(missing)} required, as in {kind}:{missing[0]}=...")
    return cls(**values)


def _unnamed(exc: ValueError, name: str) -> str:
    """``exc``'s message without the leading ``name: ``: argparse names the flag itself."""
    return str(exc).removeprefix(f"{name}: ")


def _renamed(exc: ValueError, flags: dict[str, str]) -> str:
    """``exc``'s message with the parameter it starts with (``name: ...`` or
    ``name[...]``) told as the flag the user typed, ``flags[name]``."""
    text = str(exc)
    for name, flag in flags.items():
        if text.startswith((f"{name}: ", f"{name}[")):
            return flag + ": " + text.removeprefix(name).removeprefix(": ")
    return text


def _assignment(text: str, left: Callable[[str], Any]) -> tuple[Any, Behaviour]:
    head, eq, spec = text.partition("=")
    if not eq:
        raise argparse.ArgumentTypeError(f"expected X=KIND:name=value,..., got {text!r}")
    try:
        return left(head.strip()), parse_behaviour(spec)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _host_key(text: str, flag: str = "--host") -> str:
    """A loopback address, or a host name (for ``--domain``; checked once it is known);
    the error, if any, without the flag's name (argparse adds it)."""
    try:
        return loopback_address(flag, text)
    except ValueError as not_loopback:
        try:
            return host_name(flag, text)
        except ValueError:
            raise ValueError(_unnamed(not_loopback, flag)) from None


def _host_arg(text: str) -> tuple[str, Behaviour]:
    result: tuple[str, Behaviour] = _assignment(text, _host_key)
    return result


def _count_arg(text: str) -> int:
    n = int(text)
    if n < 1:
        raise ValueError(text)
    return n


def _many_arg(text: str) -> tuple[int, Behaviour]:
    def count(head: str) -> int:
        try:
            return _count_arg(head)
        except ValueError:
            raise ValueError(f"the count must be an int >= 1, got {head!r}") from None

    result: tuple[int, Behaviour] = _assignment(text, count)
    return result


def _robots_arg(text: str) -> tuple[str, str | int]:
    address, eq, source = text.partition("=")
    if not eq:
        address, source = "*", text
    elif address != "*":
        try:
            address = _host_key(address.strip(), "--robots")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if source.startswith("status:"):
        code = source.removeprefix("status:")
        if not (code.isdigit() and 100 <= int(code) <= 599):
            raise argparse.ArgumentTypeError(f"status must be in [100, 599], got {code!r}")
        return address, int(code)
    try:
        with open(source, encoding="utf-8") as fh:
            return address, fh.read()
    except (OSError, UnicodeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot read {source!r}: {exc}") from None


def build_parser(prog: str = "python -m autothrottle.sim") -> argparse.ArgumentParser:
    """The argument parser of :func:`main`: the command line's, with the
    hosts' specs and ``--robots`` checked and read as they are parsed."""
    return build_sim_parser(prog, host=_host_arg, many=_many_arg, robots=_robots_arg)


def hosts_from_args(args: argparse.Namespace) -> dict[str, Behaviour]:
    """The address-to-behaviour mapping the parsed arguments describe.

    Raises ValueError starting ``--FLAG:``, naming the flag and the value at fault.
    """
    if args.domain is None:
        _check_first(args.first)
    else:
        host_name("--domain", args.domain)
    hosts: dict[str, Behaviour] = {}
    for address, behaviour in args.host:
        if args.domain is None:
            loopback_address("--host", address)
        else:
            _host_name(address)
        if address in hosts:
            raise ValueError(f"--host: {address} is given twice")
        hosts[address] = behaviour
    blocks: list[tuple[int, Behaviour]] = list(args.many)
    if not hosts and not blocks:
        blocks = [(1, parse_behaviour(spec)) for spec in DEFAULT_SPECS]
    wanted = sum(n for n, _ in blocks)
    if wanted:
        if args.domain is None:
            try:
                names = loopback_addresses(args.first, wanted + len(hosts))
            except ValueError as exc:
                raise ValueError(_renamed(exc, {"n": "--many", "first": "--first"})) from None
        else:
            names = host_names(host_name("--domain", args.domain), wanted + len(hosts))
        free = iter(a for a in names if a not in hosts)
        for n, behaviour in blocks:
            for _ in range(n):
                hosts[next(free)] = behaviour
    return hosts


def _check_first(first: str) -> None:
    """``--first`` as :func:`loopback_addresses` takes it: a loopback IPv4 address."""
    try:
        loopback_addresses(first, 1)
    except ValueError as exc:
        raise ValueError(_renamed(exc, {"first": "--first"})) from None


def _host_name(text: str) -> None:
    try:
        host_name("--host", text)
    except ValueError as exc:
        raise ValueError(f"{exc}; with --domain, hosts are named") from None


class _StatsFile:
    """``--stats-file``: replaced whole at exit, never emptied before.

    The stats are written beside the file and renamed over it, so the file
    holds the previous run's stats until this run's are complete, and a run
    stopped before its end (a crash, SIGKILL) leaves them as they were. The
    directory is tried at once (a file made and removed there), so a path that
    cannot be written fails before serving, not at exit with the ground truth
    lost.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        target = os.path.realpath(path)  # a link's target is replaced, not the link
        folder, name = os.path.split(target)
        self._target = target
        self._temp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
        try:
            if os.path.isdir(target):
                raise IsADirectoryError(errno.EISDIR, "Is a directory")
            with open(self._temp, "w", encoding="utf-8"):
                pass
            os.remove(self._temp)
        except OSError as exc:
            raise self._refused(exc) from None

    def _refused(self, exc: OSError) -> ValueError:
        return ValueError(f"--stats-file: cannot write {self.path!r}: {exc.strerror or exc}")

    def write(self, text: str) -> None:
        """Write ``text`` beside the file, then rename it over the file."""
        try:
            with open(self._temp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(self._temp, self._target)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.remove(self._temp)
            raise self._refused(exc) from None


#: What :class:`SimServer` calls a parameter, told as the flag that sets it.
_FLAGS = {
    "hosts": "--host",
    "address": "--first",
    "robots": "--robots",
    "port": "--port",
    "seed": "--seed",
}


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m autothrottle.sim") -> int:
    """Run simulated hosts until Ctrl-C or ``--duration``; returns the exit status.

    A bad value exits with status 2 and one line naming the flag and the value.
    """
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        hosts = hosts_from_args(args)
        for key, _ in args.robots:
            if key != "*" and key not in hosts:
                raise ValueError(f"--robots: {key!r} is not one of the hosts served")
        address = None if args.domain is None else args.first
        sim = SimServer(
            hosts, port=args.port, seed=args.seed, robots=dict(args.robots), address=address
        )
        stats_file = _StatsFile(args.stats_file) if args.stats_file else None
    except ValueError as exc:
        text = _renamed(exc, _FLAGS)
        parser.error(f"argument {text}" if text.startswith("--") else text)
    out = sys.stdout
    try:
        stats_text, summary = asyncio.run(_serve(sim, args, out))
    except KeyboardInterrupt:  # where signal handlers are unavailable (Windows)
        return 0
    if stats_file is not None:
        try:
            stats_file.write(stats_text)
        except ValueError as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr)
            return 1
    if args.stats_file and not args.quiet:
        print(f"stats written to {args.stats_file}", file=out)
    if not args.quiet:
        print(summary, file=out)
    out.flush()
    return 0


async def _serve(sim: SimServer, args: argparse.Namespace, out: TextIO) -> tuple[str, str]:
    """Serve until stopped; returns the stats JSON and the summary table.

    The signal handlers go in before the server starts, so that a SIGTERM or
    Ctrl-C from the moment the URLs (or the ``--ready-json`` line) are out, or
    even during start-up, stops the run the ordinary way: stats written, exit 0.
    """
    with _stop_on_signals() as stop:
        async with sim:
            if args.quiet:
                for host in sim.hosts:
                    print(sim.base_url(host), file=out)
                out.flush()
            else:
                _print_hosts(sim, args.duration, out)
            if args.ready_json:
                ready = {
                    host: {
                        "url": sim.url(host).rstrip("/"),
                        "spec": sim.behaviour(host).spec,
                        "address": sim.address(host),
                    }
                    for host in sim.hosts
                }
                print(json.dumps({"ready": True, "hosts": ready}), file=out, flush=True)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), args.duration)
            return (sim.stats_json() if args.stats_file else ""), _summary(sim)


def _print_hosts(sim: SimServer, duration: float | None, out: TextIO) -> None:
    n = len(sim.hosts)
    print(f"autothrottle.sim: {n} simulated host{'s' * (n != 1)}", file=out)
    for host in sim.hosts:
        b = sim.behaviour(host)
        cap = f"{b.capacity:.4g}/s" if math.isfinite(b.capacity) else "unlimited"
        print(f"  {sim.url(host)}  {b.spec}  (capacity {cap})", file=out)
    print(
        "ground truth: GET <url>/_sim/stats (?all=1: every host), reset: POST <url>/_sim/reset",
        file=out,
    )
    until = "Ctrl-C" if duration is None else f"{duration:g} s"
    print(f"running until {until}", file=out, flush=True)


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[asyncio.Event]:
    """An event that SIGINT and SIGTERM set, for as long as the block runs."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # Windows or not the main thread: Ctrl-C raises KeyboardInterrupt
    try:
        yield stop
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def _summary(sim: SimServer) -> str:
    width = max(16, *(len(h) + 1 for h in sim.hosts))
    head = (
        f"{'host':<{width}}{'requests':>9}{'ok':>7}{'429':>6}{'blocked':>8}"
        f"{'goodput/s':>10}{'capacity/s':>11}{'max/1s':>7}{'mean queue':>11}"
    )
    lines = [head]
    for address, s in sim.stats().items():
        cap = f"{s.capacity:.1f}" if math.isfinite(s.capacity) else "inf"
        queue = s.origin.mean_queued if s.origin is not None else s.mean_queued
        # A rate over less than a second of activity says nothing: one quick
        # request would read as dozens a second.
        goodput = f"{s.goodput:.1f}" if s.active >= _RATE_SAMPLE else "n/a"
        lines.append(
            f"{address:<{width}}{s.requests:>9}{s.ok:>7}{s.limited:>6}{s.blocked:>8}"
            f"{goodput:>10}{cap:>11}{s.max_in_window:>7}{queue:>11.2f}"
        )
    return "\n".join(lines)


_RATE_SAMPLE = 1.0
"""Seconds of activity below which the summary shows no rate."""
