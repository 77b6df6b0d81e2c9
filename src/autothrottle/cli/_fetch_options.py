"""``autothrottle fetch``'s flags: what to fetch (:class:`FetchJob`), and the throttle's.

The throttle has one flag per ``Throttle(...)`` setting, from a table.

Each flag is the keyword's name with dashes (``start_delay`` is
``--start-delay``); a flag not given leaves the keyword out, so the throttle's
own default applies and is shown in ``--help`` (read from the signature, never
copied). Booleans get ``--X`` and ``--no-X``. Keywords that take Python
objects (a key function, a store, clocks) have no flag; the policy has
``--policy``. ``tests/test_fetch.py`` checks that every keyword is one or the other.

Light on imports: the parser is built before the ``cli`` extra is checked.
"""

from __future__ import annotations

import argparse
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from autothrottle import (
    Throttle,
    __version__,
)
from autothrottle.policy import DelayPolicy, policy_from_text

__all__ = [
    "NOT_FLAGS",
    "SETTINGS",
    "FetchJob",
    "add_fetch_arguments",
    "add_throttle_arguments",
    "job_from_args",
    "seconds_arg",
    "parse_policy",
    "throttle_kwargs",
]

Client = Literal["httpx", "aiohttp"]
Progress = Literal["auto", "live", "plain", "none"]


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: The default User-Agent: the tool, its version, and where to read about it.
USER_AGENT = f"autothrottle/{__version__} (fetch; +https://github.com/autothrottle/autothrottle)"


@dataclass(frozen=True)
class FetchJob:
    """What ``autothrottle fetch`` was asked to do (its flags, but the throttle's)."""

    urls: str
    out: str | None = None  # None: standard output, no resume
    client: Client = "aiohttp"
    retries: int = 2
    max_in_flight: int = 256
    buffer: int = 10_000
    timeout: float = 30.0
    grace: float = 5.0
    bodies: str | None = None
    chart: str | None = None
    timeline: str | None = None
    summary_json: str | None = None
    progress: Progress = "auto"
    interval: float = 5.0
    verbosity: int = 0  # -1 quiet, 0 normal, 1 verbose
    user_agent: str = USER_AGENT
    headers: tuple[tuple[str, str], ...] = ()
    proxy: str | None = None
    robots: bool = True
    block_pattern: re.Pattern[str] | None = None
    block_statuses: frozenset[int] = frozenset()

    def request_headers(self) -> dict[str, str]:
        """The headers every request carries: the user agent, then each ``-H`` (last wins)."""
        headers = {"User-Agent": self.user_agent}
        for name, value in self.headers:
            for old in [k for k in headers if k.lower() == name.lower()]:
                del headers[old]
            headers[name] = value
        return headers

    @property
    def agent(self) -> str:
        """The user agent robots.txt rules are matched against (a ``-H`` one wins)."""
        return next(
            (v for k, v in reversed(self.headers) if k.lower() == "user-agent"), self.user_agent
        )


def _count(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an int in [{low}, {high}], got {text!r}")
        return value

    return parse


def seconds_arg(text: str, high: float = 86_400) -> float:
    """A number of seconds in (0, ``high``]; argparse's error naming the value otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= high):
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds in (0, {high:g}], got {text!r}"
        )
    return value


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""What a header value may not hold (RFC 9110, 5.5): a control character other
than a tab. aiohttp refuses to send one as it writes the request, httpx's h11
too: checked with the flags, before anything is fetched."""


def _header_arg(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not name or not _TOKEN.fullmatch(name):
        raise argparse.ArgumentTypeError(f"must be 'Name: value', got {text!r}")
    if _CONTROL.search(value):
        raise argparse.ArgumentTypeError(
            f"a header value may not hold a control character (a line break, ...), got {text!r}"
        )
    if name.lower() == "user-agent" and not value:
        raise argparse.ArgumentTypeError(f"a User-Agent may not be empty, got {text!r}")
    return name, value


def _user_agent_arg(text: str) -> str:
    """A User-Agent the fetch can send. Not an empty one: wget takes
    ``--user-agent ''`` to send none, but a polite fetch says who it is, and
    robots.txt rules are matched against that name."""
    if _CONTROL.search(text):
        raise argparse.ArgumentTypeError(
            f"a User-Agent may not hold a control character (a line break, ...), got {text!r}"
        )
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "a User-Agent may not be empty: the fetch says who it is, and robots.txt "
            f"rules are matched against that name, got {text!r}"
        )
    return text


def _proxy_arg(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"must be an http:// or https:// URL, got {text!r}")
    return text


def _pattern_arg(text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression ({exc}): {text!r}") from None


#: The fetch's own flags: name -> (type, default, metavar, help).
_JOB_FLAGS: dict[str, tuple[Callable[[str], Any], object, str, str]] = {
    "retries": (_count(0, 20), 2, "N", "retries of a 429, a 503, a block or a failure, each paced"),
    "max_in_flight": (_count(1, 100_000), 256, "N", "requests under way at once, all hosts"),
    "buffer": (_count(1, 10_000_000), 10_000, "N", "URLs read ahead, queued per host"),
    "timeout": (seconds_arg, 30.0, "SECONDS", "to connect, and between reads"),
    "grace": (seconds_arg, 5.0, "SECONDS", "on Ctrl-C, time given to requests under way"),
    "interval": (seconds_arg, 5.0, "SECONDS", "between progress lines in plain mode"),
}


def add_fetch_arguments(parser: argparse.ArgumentParser) -> None:
    """The fetch's flags, then the throttle's (see :func:`add_throttle_arguments`)."""
    parser.add_argument("urls", metavar="URLS_FILE", help="one URL a line; - for stdin")
    parser.add_argument(
        "-o",
        "--out",
        default="-",
        metavar="OUT.jsonl",
        help="append one JSON line per URL here, skipping URLs it holds already; "
        "- (the default) streams them to stdout, with no resume",
    )
    parser.add_argument(
        "--client",
        choices=("aiohttp", "httpx"),
        default="aiohttp",
        help="the HTTP client (default: aiohttp, the faster with many hosts)",
    )
    for name, (kind, default, metavar, about) in _JOB_FLAGS.items():
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            default=default,
            metavar=metavar,
            help=f"{about} (default: {default})",
        )
    _add_paths(parser)
    _add_manners(parser)
    _add_request(parser)
    add_throttle_arguments(parser)


def _add_paths(parser: argparse.ArgumentParser) -> None:
    paths = {
        "bodies": ("DIR", "save bodies in DIR, named by their SHA-256"),
        "chart": ("PNG", "at the end, draw the busiest hosts' pace as the demo does"),
        "timeline": ("FILE.jsonl", "stream the throttle's timeline to this file"),
        "summary_json": ("PATH", "at the end, write the summary as JSON to PATH"),
    }
    for name, (metavar, about) in paths.items():
        parser.add_argument(
            "--" + name.replace("_", "-"), dest=name, default=None, metavar=metavar, help=about
        )
    parser.add_argument(
        "--progress",
        choices=("auto", "live", "plain", "none"),
        default="auto",
        help="live table on a terminal (unless the lines go there: no -o), else a plain line "
        "per --interval (default: auto)",
    )
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument(
        "-q", "--quiet", action="store_true", help="no progress and no summary; errors only"
    )
    loud.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help=(
            "also a line on stderr for each robots.txt floor, unreachable robots.txt "
            "(or one still a redirect after 5), and URL that ends in an error"
        ),
    )


def _add_manners(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ignore-robots",
        action="store_true",
        help="do not read robots.txt (by default each host's is read once, through the "
        "throttle: a disallowed URL is not fetched, and Crawl-delay or Request-rate "
        "becomes the host's min_delay)",
    )
    parser.add_argument(
        "--block-pattern",
        type=_pattern_arg,
        default=None,
        metavar="REGEX",
        help="a response whose body (its first MiB) matches REGEX is a block: the host "
        "backs off and the URL is retried within --retries",
    )
    parser.add_argument(
        "--block-status",
        type=_statuses,
        default=(),
        metavar="CODES",
        help="responses with these statuses are blocks too, e.g. 403",
    )


def _add_request(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--user-agent",
        type=_user_agent_arg,
        default=USER_AGENT,
        metavar="TEXT",
        help="the User-Agent header, and the name robots.txt rules are matched against "
        "(default: autothrottle/VERSION (fetch; +URL))",
    )
    parser.add_argument(
        "-H",
        "--header",
        dest="headers",
        action="append",
        type=_header_arg,
        default=[],
        metavar="'NAME: VALUE'",
        help="send this header with every request (repeatable; a later one of the same name wins)",
    )
    parser.add_argument(
        "--proxy", type=_proxy_arg, default=None, metavar="URL", help="send through this HTTP proxy"
    )


def job_from_args(ns: argparse.Namespace) -> FetchJob:
    """The :class:`FetchJob` the parsed flags describe."""
    names = ("urls", "client", *_JOB_FLAGS, "bodies", "chart", "timeline", "summary_json")
    return FetchJob(
        out=None if ns.out == "-" else ns.out,
        progress="none" if ns.quiet else ns.progress,
        verbosity=-1 if ns.quiet else int(ns.verbose),
        user_agent=ns.user_agent,
        headers=tuple(ns.headers),
        proxy=ns.proxy,
        robots=not ns.ignore_robots,
        block_pattern=ns.block_pattern,
        block_statuses=frozenset(ns.block_status),
        **{name: getattr(ns, name) for name in names},
    )


def _statuses(text: str) -> tuple[int, ...]:
    try:
        codes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be HTTP statuses separated by commas (e.g. 429,503), got {text!r}"
        ) from None
    return codes


#: Throttle keyword -> (argparse type, or "bool"; what it does).
SETTINGS: dict[str, tuple[Callable[[str], Any] | str, str]] = {
    "start_delay": (float, "seconds between sends to a host at first"),
    "max_delay": (float, "the delay never rises above this many seconds"),
    "target_concurrency": (float, "requests to keep in flight per host on average"),
    "min_delay": (float, "the delay never falls below this many seconds"),
    "max_concurrency": (int, "hard cap of requests in flight per host"),
    "jitter": (float, "vary each gap by up to this fraction, in [0, 1)"),
    "debug": ("bool", "log each delay change and its reason"),
    "backoff_statuses": (_statuses, "statuses that back a host off, e.g. 429,503"),
    "backoff_factor": (float, "how much a backoff multiplies the delay (>= 1)"),
    "backoff_on_failure": ("bool", "connection errors and timeouts back off too"),
    "retry_after": ("bool", "obey Retry-After: send nothing to the host until then"),
    "rate_limit_headers": ("bool", "obey RateLimit / X-RateLimit-* headers"),
    "max_pause": (float, "the longest pause a header may impose, in seconds"),
    "cache_hits_lower_delay": ("bool", "let cache hits' latency lower the delay"),
    "strict_scrapy": ("bool", "Scrapy's plain rules only (no status or header signals)"),
    "recovery_margin": (float, "after a refusal, come back to this fraction of the rate"),
    "recovery_time": (float, "seconds until a refused rate may be reached again"),
    "hold_timeout": (float, "seconds after which an unfinished request stops counting"),
    "max_wait": (float, "the longest a request waits for its turn; then it fails"),
}

#: Throttle keywords with no flag of their own, and why.
NOT_FLAGS: dict[str, str] = {
    "policy": "--policy",
    "key": "a Python function",
    "hosts": "Python objects per host",
    "block_classifier": "a Python function",
    "store": "a Python object",
    "clock": "a Python function",
    "wall_clock": "a Python function",
    "rng": "a Python object",
}


def _default(name: str) -> object:
    return inspect.signature(Throttle).parameters[name].default


#: What a setting left at None means, in ``--help``'s words.
_UNSET = {
    "start_delay": "the policy's own: 1 for adaptive, 5 for autothrottle and aimd; "
    "the fixed ones start at their pace",
    "max_wait": "none: a request waits as long as its turn takes",
}


def _shown(name: str, value: object) -> str:
    if value is None:
        return _UNSET[name]
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_throttle_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per entry of :data:`SETTINGS`, and ``--policy``."""
    group = parser.add_argument_group(
        "throttle settings", "named as in Throttle(...); default: the throttle's own"
    )
    group.add_argument(
        "--policy",
        type=_policy_arg,
        default=None,
        metavar="POLICY",
        help="adaptive (default: finds each host's pace), autothrottle (Scrapy's rules), "
        "aimd, fixed-rate=N (N requests/s per host) or fixed-delay=S (S seconds apart)",
    )
    for name, (kind, about) in SETTINGS.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{about} (default: {_shown(name, _default(name))})"
        if kind == "bool":
            group.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            assert callable(kind)
            metavar = "N" if kind is int else "CODES" if kind is _statuses else "X"
            group.add_argument(
                flag, dest=name, type=kind, default=None, metavar=metavar, help=help_text
            )


def parse_policy(text: str) -> DelayPolicy:
    """A policy from its flag form; ValueError naming the value if it is none of them."""
    return policy_from_text(text, name="--policy")


def _policy_arg(text: str) -> DelayPolicy:
    try:
        return parse_policy(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--policy: ")) from None


def throttle_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """The ``Throttle(...)`` keywords the parsed flags give (only those given)."""
    given = {name: getattr(ns, name) for name in SETTINGS if getattr(ns, name) is not None}
    if ns.policy is not None:
        given["policy"] = ns.policy
    return given
