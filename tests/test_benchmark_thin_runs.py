"""A benchmark's report survives a thin run.

The smoke runs (tests/test_benchmarks_run.py) are tiny, and on a loaded
machine a tiny run can be thinner still: a host that got one request or none
has no gap and no rate, a ticker that never ticked has no lateness. The
reports formatted such a None as a number and the run died after its crawl,
with nothing written. Here each report is given such a thin result directly (no
crawl, no server): it must print a ``-`` where a figure is missing, and a
verdict that says the run was too thin rather than crash or pass it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    """``benchmarks/NAME.py`` as a module, imported from its folder as the scripts
    import each other (``_common``, ``many_hosts``)."""
    pytest.importorskip("aiohttp")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setenv("COLUMNS", "200")
    __import__(name)
    return sys.modules[name]


def _host(arrivals: list[float], outcomes: list[str] | None = None) -> dict[str, Any]:
    """One host's stats as ``python -m autothrottle.sim`` gives them, with series."""
    outcomes = ["ok"] * len(arrivals) if outcomes is None else outcomes
    return {
        "requests": len(arrivals),
        "outcomes": {"ok": outcomes.count("ok"), "limited": outcomes.count("limited")},
        "max_in_window": min(len(arrivals), 2),
        "series": {"arrivals": arrivals, "requests": {"arrival": arrivals, "outcome": outcomes}},
    }


# -- many_hosts.py ---------------------------------------------------------------------


def _thin_doc() -> dict[str, Any]:
    """One host reached once, one never: not a gap in the run."""
    return {"hosts": {"127.0.0.2:8000": _host([10.0]), "127.0.0.3:8000": _host([])}}


def test_many_hosts_summary_of_a_thin_run_has_no_gap_and_counts_the_thin_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    many_hosts = _load(monkeypatch, "many_hosts")
    s = many_hosts.summarize(_thin_doc(), 2.0)
    assert s["min_gap"] is None and s["gap_median"] is None
    assert s["hosts_thin"] == 2
    assert s["aggregate_rate"] == 0.0
    assert many_hosts.summarize({"hosts": {}}, 2.0)["worst_window"] == 0


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
def test_many_hosts_tables_of_a_thin_run_show_dashes_and_say_too_thin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    many_hosts = _load(monkeypatch, "many_hosts")
    run = dict(many_hosts.summarize(_thin_doc(), 2.0), label="aiohttp, thin")
    rows, goal_rows = many_hosts.tables([run], policy)
    (row,) = rows
    assert row[8] == "-"  # min gap ms: none
    assert row[9] == "-"  # share of gaps below the limit's: none to share
    ((label, goal, figure, verdict),) = goal_rows
    assert label == "aiohttp, thin" and goal
    assert figure
    assert verdict == "MISSED: too thin to judge (2 of 2 hosts with < 2 arrivals)"
    many_hosts.print_table("thin", [str(i) for i in range(len(row))], rows)
    assert "thin" in capsys.readouterr().out


def test_many_hosts_judges_a_full_run_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thin rule judges only thin runs: two hosts, each at 2/s for 10 s, meet the goal."""
    many_hosts = _load(monkeypatch, "many_hosts")
    arrivals = [0.5 * i for i in range(21)]
    doc = {"hosts": {"127.0.0.2:8000": _host(arrivals), "127.0.0.3:8000": _host(arrivals)}}
    run = dict(many_hosts.summarize(doc, 2.0), label="full")
    rows, goal_rows = many_hosts.tables([run], "fixed")
    assert rows[0][8] == "500.0"
    assert goal_rows[0][3] == "met"
    slow = [1.0 * i for i in range(11)]  # half the limit: missed, and not for thinness
    doc = {"hosts": {"127.0.0.2:8000": _host(slow)}}
    run = dict(many_hosts.summarize(doc, 2.0), label="slow")
    assert many_hosts.tables([run], "fixed")[1][0][3] == "MISSED"


# -- redis_store.py --------------------------------------------------------------------


def _redis_store(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    pytest.importorskip("redis", reason="redis_store.py imports the Redis store")
    return _load(monkeypatch, "redis_store")


def test_redis_store_goals_of_a_thin_fleet_crawl(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    redis_store = _redis_store(monkeypatch)
    crawl = redis_store.summarize(_thin_doc(), 2.0)
    crawl["round_trips_per_request"] = 1.0
    redis_store.print_goals(crawl)
    out = capsys.readouterr().out
    assert out.count("  goal ") == 3
    assert "smallest gap - ms" in out
    assert "MISSED: too thin to judge (2 of 2 hosts with < 2 arrivals)" in out


@pytest.mark.parametrize("arrivals", [[], [1.0], [1.0, 1.0]])
def test_redis_store_one_slot_with_too_few_arrivals_has_no_rate(
    monkeypatch: pytest.MonkeyPatch, arrivals: list[float]
) -> None:
    redis_store = _redis_store(monkeypatch)
    row = redis_store.slot_figures(arrivals)
    assert row["rate"] is None
    assert row["requests"] == len(arrivals)
    assert row["max_in_1s"] == len(arrivals)


def test_redis_store_one_slot_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    redis_store = _redis_store(monkeypatch)
    row = redis_store.slot_figures([0.1 * i for i in range(31)])  # 10/s for 3 s
    assert row["rate"] == pytest.approx(10.0)
    assert row["max_in_1s"] == 10


# -- crawl_10k.py ----------------------------------------------------------------------


def _crawl_run(lag: float | None) -> dict[str, Any]:
    return {
        "client": "aiohttp",
        "policy": "fixed",
        "limit_sum": 100.0,
        "rate": 1.0,
        "goodput": 1.0,
        "limited": 0,
        "requests": 10,
        "hosts": 50,
        "cpu_per_request": None,
        "cpu_share": 0.1,
        "loop_lag_p99": lag,
        "sim_cpu_per_request": None,
        "bytes_per_host": 1000.0,
        "slots": 50,
        "gc_passes": [0, 0, 0],
        "gc_cpu": [0.0, 0.0, 0.0],
        "responses": 0,
        "gc_longest_pause": 0.0,
        "load_average": (9.0, 9.0, 9.0),
    }


def test_crawl_10k_goal_and_table_of_a_crawl_whose_ticker_never_ticked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ticker measures the loop's lateness until the deadline; on a loaded
    machine a tiny crawl's deadline can come first: no lateness, shown ``-``."""
    crawl_10k = _load(monkeypatch, "crawl_10k")
    _, figure, verdict = crawl_10k.goal_of(_crawl_run(None))
    assert "loop late - ms (p99)" in figure
    assert verdict == "MISSED"  # 1 % of the sum, and nothing says why
    args = argparse.Namespace(hosts=50, rate=2.0, burst=1, seconds=2.0)
    crawl_10k.report([_crawl_run(None)], args)
    assert "loop late" in capsys.readouterr().out
    _, figure, verdict = crawl_10k.goal_of(_crawl_run(0.5))
    assert "loop late 500 ms (p99)" in figure
    assert verdict.startswith("MISSED (machine load")


# -- overhead.py -----------------------------------------------------------------------


def test_overhead_round_whose_deadline_passed_before_its_tasks_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round's deadline is set before its tasks start; on a loaded machine a
    0.2-s smoke round can be over before they run. Each task still sends one
    request, so the round has a rate and a CPU per request."""
    pytest.importorskip("httpx")
    overhead = _load(monkeypatch, "overhead")
    variant = overhead.Variant("raw", "aiohttp", "raw")
    sent = 0

    async def fetch() -> None:
        nonlocal sent
        sent += 1
        await asyncio.sleep(0)

    variant.fetch = fetch
    assert asyncio.run(variant.run(0.0, 3)) == 3 == sent
    (rate,) = variant.rates
    (cpu,) = variant.cpu_us
    assert rate > 0 and cpu >= 0
