"""Per-host settings: which :class:`SlotConfig` a slot key gets.

``Throttle(hosts={...})`` maps an exact host or a glob (``*.example.com``) to
settings that override the throttle's own. An exact key beats any glob; among
globs that match, the most specific wins: the one with the most literal
(non-wildcard) characters, then the longest, then the first given. Patterns
and keys compare lowercase and IDNA-encoded (``bücher.example`` matches the
slot ``xn--bcher-kva.example``). ``*.example.com`` matches ``api.example.com`` but
not ``example.com`` itself.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields
from fnmatch import fnmatchcase

from ._policy import DelayPolicy, SlotConfig
from ._request import host_key

__all__ = ["HostSettings"]

_WILDCARDS = frozenset("*?[]")


@dataclass(frozen=True, slots=True)
class HostSettings:
    """Settings for the slots of one host or host pattern; None inherits the throttle's.

    A plain dict with the same keys is accepted wherever a HostSettings is.
    """

    start_delay: float | None = None
    min_delay: float | None = None
    max_delay: float | None = None
    target_concurrency: float | None = None
    max_concurrency: int | None = None
    jitter: float | None = None
    policy: DelayPolicy | None = None
    max_wait: float | None = None


_FIELDS = tuple(f.name for f in fields(HostSettings))


def _as_settings(pattern: str, value: object) -> HostSettings:
    if isinstance(value, HostSettings):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in _FIELDS)
        if unknown:
            raise ValueError(
                f"hosts[{pattern!r}]: unknown setting(s) {unknown!r}; "
                f"expected some of {list(_FIELDS)!r}"
            )
        return HostSettings(**value)
    raise TypeError(f"hosts[{pattern!r}] must be a HostSettings or a dict, got {value!r}")


def _normalise(pattern: str) -> str:
    """A pattern in the form slot keys take: lowercase, IDNA labels, no IPv6 brackets."""
    if pattern.startswith("[") and pattern.endswith("]"):
        return pattern[1:-1].lower()
    if pattern.isascii():
        return pattern.lower()
    labels = []
    for label in pattern.split("."):
        if label.isascii() or not _WILDCARDS.isdisjoint(label):
            labels.append(label.lower())
        else:
            labels.append(host_key(label))
    return ".".join(labels)


def _specificity(pattern: str) -> tuple[int, int]:
    literal = sum(1 for ch in pattern if ch not in _WILDCARDS)
    return (literal, len(pattern))


class HostTable:
    """Resolves a slot key to its config; built once, validated at construction."""

    __slots__ = ("_base", "_base_start_given", "_exact", "_given", "_globs", "_lock")

    def __init__(
        self,
        base: SlotConfig,
        hosts: Mapping[str, object] | None,
        *,
        start_given: bool = True,
    ) -> None:
        """``start_given``: the throttle's ``start_delay`` was the user's, not its
        policy's default; a host given a policy of its own keeps it. Told, not
        inferred from the value: ``Throttle(start_delay=1.0)`` is the user's 1.0
        even where the policy's own start is 1.0 too."""
        self._base = base
        self._base_start_given = start_given
        self._exact: dict[str, SlotConfig] = {}
        self._globs: list[tuple[str, SlotConfig]] = []
        #: Normalised pattern -> its config, in the order given (the tie-break among globs).
        self._given: dict[str, SlotConfig] = {}
        self._lock = threading.Lock()  # one set() at a time; config_for takes none
        if hosts is None:
            hosts = {}
        if not isinstance(hosts, Mapping):
            raise TypeError(f"hosts must be a mapping of host pattern to settings, got {hosts!r}")
        for pattern, value in hosts.items():
            self._given[self._key(pattern)] = self._merge(pattern, _as_settings(pattern, value))
        self._index()

    @staticmethod
    def _key(pattern: object) -> str:
        if not isinstance(pattern, str) or not pattern:
            raise TypeError(f"hosts keys must be non-empty str, got {pattern!r}")
        return _normalise(pattern)

    def _index(self) -> None:
        exact: dict[str, SlotConfig] = {}
        globs: list[tuple[tuple[int, int], int, str, SlotConfig]] = []
        for index, (key, config) in enumerate(self._given.items()):
            if _WILDCARDS.isdisjoint(key):
                exact[key] = config
            else:
                spec = _specificity(key)
                globs.append(((-spec[0], -spec[1]), index, key, config))
        globs.sort(key=lambda item: (item[0], item[1]))
        # Each is replaced whole, so a reader in another thread sees the old or the new.
        self._exact = exact
        self._globs = [(key, config) for _, _, key, config in globs]

    def set(self, pattern: str, value: object) -> None:
        """Settings for ``pattern`` from now on, replacing any given before for it.

        An exact host is stored in place (one store into a dict: a reader sees
        it or not), so a crawl that sets each host's floor as it meets it
        (``autothrottle fetch``'s robots.txt) pays as much for its 100,000th
        as for its first: rebuilding the index each time made n hosts cost n
        squared. A glob rebuilds the index (the order of globs is their tie-break).
        """
        key = self._key(pattern)
        config = self._merge(pattern, _as_settings(pattern, value))
        with self._lock:
            self._given[key] = config
            if _WILDCARDS.isdisjoint(key):
                self._exact[key] = config
            else:
                self._index()

    def _merge(self, pattern: str, settings: HostSettings) -> SlotConfig:
        base = self._base
        overrides = {
            name: getattr(settings, name) for name in _FIELDS if getattr(settings, name) is not None
        }
        if not overrides:
            return base
        merged = {name: overrides.get(name, getattr(base, name)) for name in _FIELDS}
        if "policy" in overrides and "start_delay" not in overrides and not self._base_start_given:
            merged["start_delay"] = None  # the throttle's start was its policy's own: so is this
        try:
            return SlotConfig.build(**merged)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"hosts[{pattern!r}]: {exc}") from None

    def config_for(self, key: str) -> SlotConfig:
        if not self._exact and not self._globs:
            return self._base
        lowered = key.lower()
        config = self._exact.get(lowered)
        if config is not None:
            return config
        for pattern, config in self._globs:
            if fnmatchcase(lowered, pattern):
                return config
        return self._base
