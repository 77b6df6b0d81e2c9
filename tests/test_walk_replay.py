"""The short crawl of ``benchmarks/rate_replay.py --walk`` on a virtual clock, and the
figures docs/recovery.md ("The refused pace") gives of it: the same on any machine."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def walk(*args: str) -> list[tuple[float, int, int]]:
    """Each seed's crawl time, requests let through and refused."""
    pytest.importorskip("looptime", reason="rate_replay.py runs on looptime's loop")
    done = subprocess.run(
        [sys.executable, "benchmarks/rate_replay.py", "--walk", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = re.findall(r"took ([\d.]+) s, (\d+) let through, (\d+) refused", done.stdout)
    return [(float(took), int(ok), int(refused)) for took, ok, refused in found]


def page() -> str:
    return " ".join((ROOT / "docs" / "recovery.md").read_text().split())


def test_a_host_that_lets_one_through_after_each_pause_is_found_in_four_refusals() -> None:
    # 5/s, a burst of 1: each refusal after a pause doubles the gap its request
    # kept. Read from the delay fallen since, 18 of the 40 were refused, 20.3 s.
    seeds = walk("--seeds", "3")
    assert len(seeds) == 3
    for took, ok, refused in seeds:
        assert (ok, refused) == (36, 4)
        assert 10.45 <= took < 10.65
    assert "4 refused, 10.5-10.6 s (on a virtual clock, in every seed" in page()


def test_the_slow_cases_the_docs_give_are_what_the_replay_prints() -> None:
    text = page()
    lagged = walk("--seeds", "3", "--lag", "0.02", "--wire", "0.002")
    assert [refused for _, _, refused in lagged] == [5, 13, 8]
    assert f"13 refused, {lagged[1][0]:.1f} s; seeds 0 and 2: 5 and 8" in text
    slow_start = walk("--seeds", "1", "--host-rate", "4", "--start-delay", "0")
    assert slow_start[0][1:] == (39, 1)
    assert f"39 of 40 let through, but in {slow_start[0][0]:.1f} s" in text
