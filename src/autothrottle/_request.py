"""What the adapters share about a request: its slot key and its control options.

A request may carry options for the throttle in two forms, both parsed here
so the httpx and aiohttp adapters agree to the letter:

* a mapping ``{"autothrottle": {"adjust": False, "bypass": True, "slot": "name",
  "max_wait": 2.0, "cost": 600}}`` (httpx request ``extensions``; aiohttp
  ``trace_request_ctx``; the requests adapter's ``autothrottle=`` keyword);
* the request header ``X-AutoThrottle: no-adjust | bypass | slot=NAME |
  max-wait=SECONDS | cost=TOKENS | cost=INPUT+OUTPUT`` (several directives
  may be joined by commas), which the adapters strip before the request goes
  on the wire.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import yarl

__all__ = [
    "CONTROL_HEADER",
    "Cost",
    "RequestOptions",
    "check_cost",
    "header_value",
    "host_key",
    "tokens_of",
]

CONTROL_HEADER = "X-AutoThrottle"
"""The request header that carries per-request options; never sent to the server."""

_CONTROL_KEY = "autothrottle"

_OPTIONS = ("adjust", "bypass", "slot", "max_wait", "cost")

_MAX_COST = 10**15
"""Tokens a request may say it costs, at most: any more is a bug, not an estimate."""

Cost = int | tuple[int, int]
"""A request's weight in tokens: one number, or ``(input, output)``."""


def tokens_of(cost: Cost | None, unit: str) -> int:
    """What a request of ``cost`` counts against a window of ``unit`` (``docs/signals.md``).

    A single number counts whole against every token window; ``(input,
    output)`` counts its sum against ``"tokens"``, its input against
    ``"input-tokens"`` and its output against ``"output-tokens"``. A request
    without a cost counts 0 tokens.
    """
    if cost is None:
        return 0
    if isinstance(cost, int):
        return cost
    if unit == "input-tokens":
        return cost[0]
    if unit == "output-tokens":
        return cost[1]
    return cost[0] + cost[1]


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """Per-request throttle options.

    Attributes:
        adjust: False: the request waits its turn, but its response does not
            change the slot's delay (Scrapy's ``autothrottle_dont_adjust_delay``).
        bypass: True: the request is neither delayed nor counted.
        slot: Use this slot key instead of the one derived from the URL.
        max_wait: Fail with ``ThrottleTimeout`` rather than wait longer than
            this many seconds for the turn.
        cost: The request's weight in tokens, for a host that advertises
            token budgets (the LLM APIs): a number, or ``(input, output)``.
            The request waits until its cost fits every token window
            (``docs/signals.md``, "Token budgets"). None: no weight, 0 tokens.
    """

    adjust: bool = True
    bypass: bool = False
    slot: str | None = None
    max_wait: float | None = None
    cost: Cost | None = None

    def merged(self, other: RequestOptions) -> RequestOptions:
        """Options set in either (``other`` wins on the slot name and the cost;
        the shorter wait)."""
        waits = [w for w in (self.max_wait, other.max_wait) if w is not None]
        return RequestOptions(
            adjust=self.adjust and other.adjust,
            bypass=self.bypass or other.bypass,
            slot=other.slot if other.slot is not None else self.slot,
            max_wait=min(waits) if waits else None,
            cost=other.cost if other.cost is not None else self.cost,
        )


DEFAULT_OPTIONS = RequestOptions()


def options_from_mapping(container: object) -> RequestOptions:
    """Options from ``container["autothrottle"]``; defaults when absent.

    Raises TypeError/ValueError naming the option when it is malformed: a typo
    in an option should fail loudly, not silently throttle the wrong way.
    """
    # A dict (httpx's extensions, on every request) skips the ABC's isinstance, a call.
    if type(container) is not dict and not isinstance(container, Mapping):
        return DEFAULT_OPTIONS
    raw = container.get(_CONTROL_KEY)
    if raw is None:
        return DEFAULT_OPTIONS
    if not isinstance(raw, Mapping):
        raise TypeError(f"the 'autothrottle' request option must be a dict, got {raw!r}")
    unknown = set(raw) - set(_OPTIONS)
    if unknown:
        raise ValueError(
            f"unknown 'autothrottle' request option(s) {sorted(map(str, unknown))!r}; "
            "expected 'adjust', 'bypass', 'slot', 'max_wait' or 'cost'"
        )
    adjust = raw.get("adjust", True)
    bypass = raw.get("bypass", False)
    slot = raw.get("slot")
    if not isinstance(adjust, bool):
        raise TypeError(f"the 'adjust' request option must be a bool, got {adjust!r}")
    if not isinstance(bypass, bool):
        raise TypeError(f"the 'bypass' request option must be a bool, got {bypass!r}")
    if slot is not None and (not isinstance(slot, str) or not slot):
        raise TypeError(f"the 'slot' request option must be a non-empty str, got {slot!r}")
    max_wait = raw.get("max_wait")
    if max_wait is not None:
        seconds = _seconds(max_wait)
        if seconds is None:
            raise ValueError(
                f"the 'max_wait' request option must be seconds >= 0, got {max_wait!r}"
            )
        max_wait = seconds
    cost = None if "cost" not in raw else check_cost(raw["cost"], "the 'cost' request option")
    if adjust and not bypass and slot is None and max_wait is None and cost is None:
        return DEFAULT_OPTIONS
    return RequestOptions(adjust=adjust, bypass=bypass, slot=slot, max_wait=max_wait, cost=cost)


def check_cost(value: object, name: str = "cost") -> Cost:
    """A request's cost: tokens >= 0 (an estimate: a fraction rounds up), or
    ``{"input": TOKENS, "output": TOKENS}`` (also as an ``(input, output)`` pair).

    Raises:
        ValueError: anything else, naming ``name`` and the value.
    """
    pair: object = None
    if isinstance(value, Mapping):
        if set(value) == {"input", "output"}:
            pair = (value["input"], value["output"])
    elif isinstance(value, tuple) and len(value) == 2:
        pair = value
    else:
        tokens = _tokens(value)
        if tokens is not None:
            return tokens
    if isinstance(pair, tuple):
        tokens_in, tokens_out = _tokens(pair[0]), _tokens(pair[1])
        if tokens_in is not None and tokens_out is not None:
            return (tokens_in, tokens_out)
    raise ValueError(
        f"{name} must be tokens >= 0 or {{'input': TOKENS, 'output': TOKENS}}, got {value!r}"
    )


def _digits(text: str) -> bool:
    """ASCII digits, few enough to be a count (``int`` refuses very long text)."""
    return 0 < len(text) <= 16 and text.isascii() and text.isdigit()


def _tokens(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not 0 <= value <= _MAX_COST:  # also refuses NaN
        return None
    return math.ceil(value)


def _seconds(value: object) -> float | None:
    """A ``max_wait``: a finite number of seconds >= 0 (or its text), else None."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        return None
    return float(value)


def _bad_directive(key: str, text: str, expected: str, value: str) -> ValueError:
    """What a user who wrote the header reads: the header, the directive's key,
    the value given to it, and the whole header value it came in."""
    return ValueError(
        f"{CONTROL_HEADER} header: {key} must be {expected}, got {text!r} in {value!r}"
    )


@lru_cache(maxsize=1024)
def options_from_header(value: str) -> RequestOptions:
    """Options from an ``X-AutoThrottle`` header value.

    Raises:
        ValueError: a directive it does not know, or a bad value of one, naming
            the header, the directive's key and the value.
    """
    adjust, bypass, slot, max_wait, cost = True, False, None, None, None
    for part in value.split(","):
        directive = part.strip()
        lowered = directive.lower()
        if lowered == "no-adjust":
            adjust = False
        elif lowered == "bypass":
            bypass = True
        elif lowered.startswith("slot="):
            slot = directive[5:].strip()
            if not slot:
                raise _bad_directive("slot", slot, "a non-empty slot name", value)
        elif lowered.startswith("max-wait="):
            text = directive[9:].strip()
            max_wait = _seconds(text)
            if max_wait is None:
                raise _bad_directive("max-wait", text, "seconds >= 0", value)
        elif lowered.replace(" ", "").startswith("cost="):
            cost = _cost_directive(directive.partition("=")[2].strip(), value)
        elif directive:
            raise ValueError(
                f"{CONTROL_HEADER} header: unknown directive {directive!r} in {value!r}; "
                "expected 'no-adjust', 'bypass', 'slot=NAME', 'max-wait=SECONDS' "
                "or 'cost=TOKENS'"
            )
    return RequestOptions(adjust=adjust, bypass=bypass, slot=slot, max_wait=max_wait, cost=cost)


def _cost_directive(text: str, value: str) -> Cost:
    """``cost=600`` (tokens) or ``cost=500+100`` (input + output tokens)."""
    parts = [part.strip() for part in text.split("+")]
    counts = [
        count for part in parts if _digits(part) and (count := _tokens(int(part))) is not None
    ]
    if len(counts) == len(parts) == 1:
        return counts[0]
    if len(counts) == len(parts) == 2:
        return (counts[0], counts[1])
    raise _bad_directive("cost", text, "TOKENS or INPUT+OUTPUT tokens", value)


def header_value(options: RequestOptions) -> str:
    """The ``X-AutoThrottle`` header value that :func:`options_from_header` reads back
    as ``options``: for a client whose requests can carry nothing but headers.

    Raises:
        ValueError: the slot name has a comma, which the header cannot carry.
    """
    parts = []
    if not options.adjust:
        parts.append("no-adjust")
    if options.bypass:
        parts.append("bypass")
    if options.slot is not None:
        if "," in options.slot or options.slot.strip() != options.slot:
            raise ValueError(
                f"the 'slot' request option {options.slot!r} cannot go in the "
                f"{CONTROL_HEADER} header: no commas, no surrounding spaces"
            )
        parts.append(f"slot={options.slot}")
    if options.max_wait is not None:
        parts.append(f"max-wait={options.max_wait!r}")
    cost = options.cost
    if cost is not None:
        parts.append(f"cost={cost}" if isinstance(cost, int) else f"cost={cost[0]}+{cost[1]}")
    return ", ".join(parts)


@lru_cache(maxsize=4096)
def host_key(host: str) -> str:
    """The default slot key of a host: lowercase, IDNA-encoded, no port.

    ``host`` may be a bare host (``Example.COM``, ``example.com:8080``,
    ``[::1]``) or a whole URL. One host gets one key however it is spelled: a
    fully qualified name's trailing dot is dropped (``example.com.`` is
    ``example.com``) and an IPv6 address takes its compressed form
    (``0:0:0:0:0:0:0:1`` is ``::1``), as yarl writes it.

    Raises:
        ValueError: ``host`` names no host (``""``, ``"/just/a/path"``).
    """
    if host.isascii() and host and not any(ch in host for ch in ":/[@?#"):
        return _plain(host.lower())
    if "/" not in host and host.count(":") > 1 and "[" not in host:
        return _ipv6(host)  # a bare IPv6 address
    raw = yarl.URL(host if "/" in host else "//" + host).raw_host
    if not raw:
        raise ValueError(f"cannot derive a slot key: no host in URL {host!r}")
    return _ipv6(raw) if ":" in raw else _plain(raw.lower())


def _plain(name: str) -> str:
    stripped = name.rstrip(".")
    return stripped if stripped else name


def _ipv6(address: str) -> str:
    try:
        return ipaddress.IPv6Address(address.split("%", 1)[0]).compressed + (
            "%" + address.split("%", 1)[1] if "%" in address else ""
        )
    except ValueError:
        return address.lower()
