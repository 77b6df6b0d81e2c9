"""The simulator's command line (``autothrottle sim``, ``python -m autothrottle.sim``),
kept apart from the simulator so that ``--help`` answers before its extra is installed.

Importing :mod:`autothrottle.sim` needs aiohttp (the ``sim`` extra), and
without it the package refuses to import, naming what to install. A user
deciding whether to install it wants to read the options first, so the
parser is built here from the standard library alone. The simulator's
:func:`~autothrottle.sim.main` builds the same parser with the converters that
read a host's spec into a behaviour and ``--robots``' file (they need the
simulator's own modules); without them, as for the help, the values stay text.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

from autothrottle._argv import OneLineParser

__all__ = ["build_sim_parser", "help_without_sim"]

Convert = Callable[[str], Any]
"""An option's converter (argparse's ``type``)."""

_EPILOG = """\
Behaviour SPEC: KIND[:name=value,...], KIND one of capacity, rate, softblock,
cdn, variable. Examples:
  capacity:workers=4,service_time=0.05
  rate:rate=10,burst=2,headers=false
  rate:rate=10,burst=2,header_style=window
  softblock:rate=5
  cdn:hit_ratio=0.9,edge_time=0.005,workers=2,service_time=0.2
  variable:fast_time=0.03,slow_time=0.5,slow_ratio=0.2,workers=4

Every host serves its ground truth at GET /_sim/stats (?all=1 for every host),
and GET /robots.txt as --robots says.
"""


def build_sim_parser(
    prog: str,
    *,
    host: Convert = str,
    many: Convert = str,
    robots: Convert = str,
    note: str = "",
) -> argparse.ArgumentParser:
    """The simulator's argument parser: ``host``, ``many`` and ``robots`` convert
    those options' values (text when not given); ``note`` ends the help."""
    parser = OneLineParser(
        prog=prog,
        description=(
            "Serve simulated sites on loopback addresses, each with its own behaviour, "
            "and record the ground truth of what arrived. Without --host or --many, "
            "serves one host of each kind."
        ),
        epilog=_EPILOG + (f"\n{note}\n" if note else ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_host_arguments(parser, host, many, robots)
    _add_run_arguments(parser)
    return parser


def help_without_sim(argv: Sequence[str], prog: str, problem: str) -> str | None:
    """The help ``prog`` prints for ``argv`` when the simulator cannot run for the
    reason ``problem`` (its extra is missing: the note that ends the help), or
    None when ``argv`` does not ask for help (``-h``, ``--help`` or a prefix
    of it argparse takes for it, before any ``--``)."""
    args = list(argv)
    if "--" in args:
        args = args[: args.index("--")]
    if not any(a == "-h" or (len(a) > 3 and "--help".startswith(a)) for a in args):
        return None
    return build_sim_parser(prog, note=problem).format_help()


def _nonnegative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be an int in [0, 65535], got {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int, got {text!r}") from None


def _add_host_arguments(
    parser: argparse.ArgumentParser, host: Convert, many: Convert, robots: Convert
) -> None:
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        type=host,
        metavar="ADDRESS=SPEC",
        help="a host at a loopback ADDRESS, e.g. 127.0.0.2=capacity:workers=4,service_time=0.05",
    )
    parser.add_argument(
        "--many",
        action="append",
        default=[],
        type=many,
        metavar="N=SPEC",
        help="N hosts of one behaviour at free addresses from --first, e.g. 200=rate:rate=2",
    )
    parser.add_argument(
        "--first",
        default="127.0.0.2",
        metavar="ADDRESS",
        help="first address for --many and the default hosts; with --domain, the one "
        "address every host is served on (default: 127.0.0.2)",
    )
    parser.add_argument(
        "--domain",
        default=None,
        metavar="DOMAIN",
        help="serve virtual hosts, told apart by the Host header, all on the address "
        "--first: --many hosts are named h1.DOMAIN, h2.DOMAIN ... and --host takes names "
        "(e.g. --domain sim.test --many 10000=rate:rate=0.05: one socket for 10,000 hosts)",
    )
    parser.add_argument(
        "--robots",
        action="append",
        default=[],
        type=robots,
        metavar="[ADDRESS=]FILE",
        help="what GET /robots.txt answers: FILE's text, or status:CODE (e.g. status:503); "
        "for one ADDRESS, or every host without ADDRESS= (default: 404, no robots.txt)",
    )
    parser.add_argument(
        "--port",
        type=_port,
        default=0,
        help="bind every address to this port (default: 0, a free port per address)",
    )


def _add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=_seed, default=None, help="seed the service-time jitter")
    parser.add_argument(
        "--duration",
        type=_nonnegative,
        default=None,
        metavar="SECONDS",
        help="stop after this many seconds (default: run until Ctrl-C)",
    )
    parser.add_argument(
        "--stats-file",
        default=None,
        metavar="PATH",
        help="on exit, write every host's ground truth to PATH as JSON",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="print only each host's URL, one a line, once serving (for a script to read); "
        "no header, no summary on exit",
    )
    parser.add_argument(
        "--ready-json",
        action="store_true",
        help="once serving, print one JSON line for programs: "
        '{"ready": true, "hosts": {HOST: {"url": URL, "spec": SPEC, "address": ADDRESS}, ...}}',
    )
