"""The suite makes no event loop behind a test's back (``pytest_configure`` in
tests/conftest.py).

looptime's pytest plugin asks the event-loop policy for the current loop
before every test, synchronous ones too. On CPython up to 3.13 a policy never
given a loop makes one there and then, on the first such test of a process:
a loop nothing closes (an unclosed-loop ``ResourceWarning`` when it is
dropped) and, from 3.12, a ``DeprecationWarning`` in the test's report. The
suite tells the policy "no loop" at the start, so it raises instead, as it
does on 3.14, and looptime takes that for "not an asyncio test".
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def test_a_synchronous_test_finds_no_current_event_loop() -> None:
    try:
        loop = asyncio.get_event_loop()
    except RuntimeError:
        return
    raise AssertionError(f"a synchronous test found a current event loop: {loop!r}")


def test_the_first_test_of_a_fresh_process_finds_none_and_no_warning() -> None:
    # In a process of its own, the synchronous test above is its first: the one
    # that found the loop looptime's question made, with the warning on 3.12+.
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-W",
            "error:There is no current event loop:DeprecationWarning",
            f"{HERE}::test_a_synchronous_test_finds_no_current_event_loop",
        ],
        cwd=HERE.parent.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
    assert "warning" not in run.stdout.lower()
