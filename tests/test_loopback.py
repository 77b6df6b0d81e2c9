"""The loopback servers' own promises (tests/loopback.py), where a test can see them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import loopback


def test_a_real_time_server_process_is_ended_should_it_ever_spin() -> None:
    """At a real-time priority the server runs ahead of every ordinary process:
    spinning, it would hold a core from them, so the kernel's limit on unbroken
    real-time work is set to end it first."""
    loopback._PROCESS.ask("start", [])  # the server process, started if it was not
    process = loopback._PROCESS._process
    assert process is not None
    if os.sched_getscheduler(process.pid) != os.SCHED_FIFO:
        pytest.skip("the system keeps real-time priorities from this user")
    limits = Path(f"/proc/{process.pid}/limits").read_text().splitlines()
    (line,) = [line for line in limits if line.startswith("Max realtime timeout")]
    soft, hard = line.split()[3:5]
    assert int(soft) == int(hard) == int(loopback.RUN_ALONE * 1_000_000)
