"""The engine's log lines: delay changes and pauses (``debug=True``), header problems.

Everything goes to the ``autothrottle`` logger, each record with the slot as
``record.slot`` and its numbers as extra fields. A header problem is logged
once per slot and kind at its level, then at DEBUG (``docs/signals.md``, step
2): a server that sends the same bad header on every response must not flood
the log, and the first one is worth a look.
"""

from __future__ import annotations

import logging

__all__ = ["log_delay", "log_pause", "note", "seconds_text"]

logger = logging.getLogger("autothrottle")

MAX_NOTED = 32
"""Kinds of header problem remembered per slot (a hostile server cannot grow it)."""


def seconds_text(value: float) -> str:
    """Seconds for a log line: whole above 10 s, else with the digits that matter."""
    return f"{value:.0f}s" if value >= 10 else f"{value:.3g}s"


def _ms(seconds: float) -> str:
    """Milliseconds with enough digits that a small change does not read as none."""
    ms = seconds * 1000.0
    if abs(ms) >= 100.0:
        return f"{ms:.0f}ms"
    if abs(ms) >= 10.0:
        return f"{ms:.1f}ms"
    return f"{ms:.2f}ms"


def note(noted: set[str], key: str, kind: str, text: str, level: int) -> None:
    """Log a problem of slot ``key`` once per ``kind`` at ``level``, then at DEBUG.

    ``noted`` is the slot's set of kinds already logged (at most ``MAX_NOTED``).
    """
    if kind in noted or len(noted) >= MAX_NOTED:
        level = logging.DEBUG
    else:
        noted.add(kind)
    if logger.isEnabledFor(level):
        logger.log(level, "slot %s: %s", key, text, extra={"slot": key})


def log_delay(
    key: str,
    in_flight: int,
    old: float,
    new: float,
    reason: str,
    latency: float | None,
    status: int | None,
) -> None:
    """One debug line for a delay that was set (changed or not), with its reason."""
    if new == old:
        change = f"{_ms(new)} (unchanged)"
    else:
        sign = "+" if new > old else "-"
        change = f"{_ms(old)}->{_ms(new)} ({sign}{_ms(abs(new - old))})"
    logger.debug(
        "slot=%s in_flight=%d delay=%s latency=%s status=%s reason=%s",
        key,
        in_flight,
        change,
        "-" if latency is None else _ms(latency),
        "-" if status is None else status,
        reason,
        extra={
            "slot": key,
            "in_flight": in_flight,
            "old_delay": old,
            "new_delay": new,
            "latency": latency,
            "status": status,
            "reason": reason,
        },
    )


def log_pause(key: str, seconds: float, reason: str) -> None:
    """One debug line for a pause."""
    logger.debug(
        "slot=%s paused for %.0fms reason=%s",
        key,
        seconds * 1000,
        reason,
        extra={"slot": key, "pause": seconds, "reason": reason},
    )
