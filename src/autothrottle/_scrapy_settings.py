"""Scrapy's settings read into a :class:`~autothrottle.Throttle`: the ``AUTOTHROTTLE_*``
settings with their Scrapy meaning, and ours (``docs/scrapy.md``)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, cast

from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings
from scrapy.utils.misc import load_object

from ._policy import DelayPolicy
from ._policy_text import policy_from_text
from ._store import MemoryStore, SlotStore
from ._throttle import Throttle

__all__ = ["kept_limits", "policy_from_setting", "throttle_from_settings"]


def policy_from_setting(value: object, setting: str = "AUTOTHROTTLE_POLICY") -> DelayPolicy:
    """A delay policy from its setting: a name, ``fixed-rate=N``, a dotted path, or one.

    ``autothrottle`` (Scrapy's rules, the default), ``adaptive``, ``aimd``,
    ``fixed-rate=N`` (N requests a second), ``fixed-delay=S``, a policy
    instance, or a class (or its dotted path) called with no arguments.

    Raises:
        ValueError, TypeError: naming the setting and the value.
    """
    if isinstance(value, DelayPolicy):
        return value
    if isinstance(value, str):
        if "." not in value or "=" in value:
            try:
                return policy_from_text(value, name=setting)
            except ValueError as error:
                raise ValueError(f"{error} (or a dotted path)") from None
        value = load_object(value)
    try:
        made = value() if callable(value) else value
    except TypeError as error:
        raise TypeError(f"{setting}: {value!r} cannot be made with no arguments: {error}") from None
    if not isinstance(made, DelayPolicy):
        raise TypeError(f"{setting}: {value!r} is not a DelayPolicy (made {made!r})")
    return made


def _jitter(settings: BaseSettings) -> float:
    """Scrapy's spread of each delay: ``DOWNLOAD_DELAY_JITTER`` (Scrapy 2.19), or
    ``RANDOMIZE_DOWNLOAD_DELAY`` (±50 %) where that is set with more priority."""
    randomize = settings.getpriority("RANDOMIZE_DOWNLOAD_DELAY") or 0
    jitter = settings.getpriority("DOWNLOAD_DELAY_JITTER")
    if jitter is None or randomize > jitter:
        return 0.5 if settings.getbool("RANDOMIZE_DOWNLOAD_DELAY") else 0.0
    value = settings.getfloat("DOWNLOAD_DELAY_JITTER")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"DOWNLOAD_DELAY_JITTER must be in [0, 1) under autothrottle, got {value}")
    return value


def _hosts(settings: BaseSettings) -> dict[str, Any]:
    """``AUTOTHROTTLE_HOSTS``, over what ``DOWNLOAD_SLOTS`` says of the same slots
    (its ``delay`` is the slot's start delay, as AutoThrottle reads it)."""
    hosts: dict[str, Any] = {}
    for key, slot in settings.getdict("DOWNLOAD_SLOTS").items():
        entry: dict[str, Any] = {}
        if isinstance(slot, Mapping) and "delay" in slot:
            entry["start_delay"] = float(slot["delay"])
        if isinstance(slot, Mapping) and "concurrency" in slot:
            entry["max_concurrency"] = int(slot["concurrency"])
        if entry:
            hosts[key] = entry
    for pattern, given in settings.getdict("AUTOTHROTTLE_HOSTS").items():
        if not isinstance(given, Mapping):
            raise TypeError(f"AUTOTHROTTLE_HOSTS[{pattern!r}] must be a dict, got {given!r}")
        entry = dict(given)
        if "policy" in entry and entry["policy"] is not None:
            entry["policy"] = policy_from_setting(
                entry["policy"], f"AUTOTHROTTLE_HOSTS[{pattern!r}]['policy']"
            )
        hosts[pattern] = {**hosts.get(pattern, {}), **entry}
    return hosts


def _store(settings: BaseSettings, spider_name: str) -> SlotStore | None:
    url = settings.get("AUTOTHROTTLE_REDIS_URL")
    path = settings.get("AUTOTHROTTLE_STATE_FILE")
    if url and path:
        raise ValueError(
            "AUTOTHROTTLE_REDIS_URL and AUTOTHROTTLE_STATE_FILE: choose one; "
            "a fleet keeps what it learned in Redis"
        )
    if url:
        from .redis import RedisStore  # the redis extra, only for a fleet

        prefix = settings.get("AUTOTHROTTLE_REDIS_PREFIX") or f"scrapy:{spider_name}"
        return cast(SlotStore, RedisStore(str(url), prefix=str(prefix)))
    if path:
        # Kept whole: a slot forgotten while idle would be missing from the file.
        return MemoryStore.from_file(str(path), now=time.monotonic(), idle_timeout=math.inf)
    return None


#: Throttle keywords and the Scrapy settings they come from.
_SETTINGS = (
    ("start_delay", "AUTOTHROTTLE_START_DELAY"),
    ("max_delay", "AUTOTHROTTLE_MAX_DELAY"),
    ("target_concurrency", "AUTOTHROTTLE_TARGET_CONCURRENCY"),
    ("min_delay", "DOWNLOAD_DELAY"),
)


def throttle_from_settings(settings: BaseSettings, spider_name: str = "spider") -> Throttle:
    """The :class:`~autothrottle.Throttle` a crawl's settings describe.

    Raises:
        ValueError, TypeError: a setting is wrong; the message names it.
    """
    kwargs: dict[str, Any] = {name: settings.getfloat(key) for name, key in _SETTINGS}
    per_ip = settings.getint("CONCURRENT_REQUESTS_PER_IP")
    kwargs["max_concurrency"] = per_ip or settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
    kwargs["jitter"] = _jitter(settings)
    kwargs["policy"] = policy_from_setting(settings.get("AUTOTHROTTLE_POLICY") or "autothrottle")
    kwargs["hosts"] = _hosts(settings)
    statuses = frozenset(settings.getlist("AUTOTHROTTLE_BLOCK_STATUSES"))
    if statuses:
        codes = frozenset(int(status) for status in statuses)
        kwargs["block_classifier"] = lambda status, headers: status in codes
    kwargs["store"] = _store(settings, spider_name)
    try:
        return Throttle(**kwargs)
    except (TypeError, ValueError) as error:
        named = [key for name, key in _SETTINGS if name in str(error)]
        if "max_concurrency" in str(error):
            named.append("CONCURRENT_REQUESTS_PER_DOMAIN")
        raise type(error)(f"{' / '.join(named) or 'autothrottle settings'}: {error}") from error


def _project_set(settings: BaseSettings, name: str) -> bool:
    """Whether ``name`` comes from the project (or a spider, an add-on, the
    command line) rather than Scrapy's defaults."""
    return (settings.getpriority(name) or 0) > SETTINGS_PRIORITIES["default"]


def kept_limits(settings: BaseSettings) -> str | None:
    """The line saying which of the project's own cap and floor the throttle
    keeps, or None when neither binds.

    ``scrapy startproject`` writes ``CONCURRENT_REQUESTS_PER_DOMAIN = 1`` and
    ``DOWNLOAD_DELAY = 1`` into a new project; kept as Scrapy means them, they
    hold every host to one request at a time and a second apart whatever the
    policy finds, which looks like a throttle that does not adapt. Said once
    at start, naming each setting, the user can tell a choice from a default.
    Scrapy's own defaults (a cap of 8, no floor) are not a choice and are not
    named.
    """
    kept: list[str] = []
    per_ip = settings.getint("CONCURRENT_REQUESTS_PER_IP")
    cap = "CONCURRENT_REQUESTS_PER_IP" if per_ip else "CONCURRENT_REQUESTS_PER_DOMAIN"
    if _project_set(settings, cap):
        value = settings.getint(cap)
        noun = "request" if value == 1 else "requests"
        kept.append(f"{cap} = {value} (at most {value} {noun} at a time per slot)")
    delay = settings.getfloat("DOWNLOAD_DELAY")
    if delay > 0 and _project_set(settings, "DOWNLOAD_DELAY"):
        spread = _jitter(settings)
        average = f", on average: each gap is spread ±{spread:.0%}" if spread else ""
        kept.append(
            f"DOWNLOAD_DELAY = {delay:g} (never faster than {1 / delay:.3g}/s per slot{average})"
        )
    if not kept:
        return None
    return (
        f"autothrottle keeps the project's {' and '.join(kept)}, whatever the policy "
        f"finds; remove {'them' if len(kept) > 1 else 'it'} for the policy to find each host's "
        "pace (docs/scrapy.md)"
    )
