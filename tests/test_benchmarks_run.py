"""Every benchmark in ``benchmarks/`` still runs: each script, in its tiniest form.

The figures in docs/benchmarks.md, fleet.md and scrapy.md come from these
scripts, and a figure is only worth its command if anyone can rerun it. Nothing
else runs them, and they reach into the library (private fields, patched
methods): renamed code in ``src`` broke three of them, unnoticed until they
were run by hand (one traced crawl sent nothing, then failed on its empty
figures). Here each runs as a user runs it (``python benchmarks/NAME.py``, in a
subprocess, from the repository's root), with the flags or ``--smoke`` that
make it short while every part of its report still runs, and writes its JSON
into a temporary directory (``--results-dir``, never the checkout). What is
checked: the exit status, that the JSON parses with the keys the docs' tables
come from, each goal's figure and verdict (met or missed: never which), and
that the run did some work. Never a speed or a figure: a smoke run on a busy
machine is no verdict. And every flag the docs give a benchmark is one its
``--help`` shows.

Left out: ``overhead.py --instructions`` unless ``AUTOTHROTTLE_BENCH_VALGRIND=1``
(even its smoke form is six runs under callgrind a client, ~30 s each);
``--count-engine``, one such run, runs wherever valgrind is installed.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import needs_redis
from redis_keys import fresh_prefix

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
TIMEOUT = 400.0
"""Seconds a smoke run may take (most take 1-25 s; generous for a loaded machine)."""
ENV = {**os.environ, "NO_PROXY": "*", "no_proxy": "*", "COLUMNS": "200"}


def run(script: str, *args: str, ok: tuple[int, ...] = (0,)) -> str:
    """Run ``benchmarks/SCRIPT`` with ``args`` from the repository's root; its stdout.

    On a timeout the script gets SIGTERM first, so that its ``finally`` stops the
    simulator it started, then its whole process group SIGKILL.
    """
    command = [sys.executable, str(BENCHMARKS / script), *args]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(
            f"{' '.join(command[1:])} ran past {TIMEOUT:g} s:\n{out[-3000:]}\n{err[-3000:]}"
        )
    assert proc.returncode in ok, (
        f"{' '.join(command[1:])} exited {proc.returncode}:\n{out[-3000:]}\n{err[-5000:]}"
    )
    return out


def results(tmp_path: Path, name: str) -> dict[str, Any]:
    """The ``results`` of ``NAME.json`` as ``_common.write_results`` wrote it."""
    doc = json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))
    assert doc["benchmark"] == name
    assert doc["timestamp"] and doc["command"]
    assert doc["machine"]["python"] and doc["machine"]["packages"]["autothrottle"]
    assert doc["autothrottle"] == _SOURCE, "not the autothrottle this suite runs"
    found: dict[str, Any] = doc["results"]
    return found


def _source_of_this_suite() -> dict[str, Any]:
    """What ``write_results`` should say ran: this checkout's commit, if the
    package is imported from it (the scripts run in a subprocess, from ROOT)."""
    import autothrottle

    package = Path(autothrottle.__file__).resolve().parent
    commit = dirty = None
    if package.is_relative_to(ROOT) and (ROOT / ".git").exists():
        git = ["git", "-C", str(ROOT)]
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
        status = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
        commit, dirty = head.stdout.strip(), bool(status.stdout.strip())
    return {"version": autothrottle.__version__, "commit": commit, "dirty": dirty}


_SOURCE = _source_of_this_suite()


def _load_common(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``benchmarks/_common.py``, imported as the scripts import it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("_common")


def _commit_all(repo: Path) -> str:
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True, capture_output=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    return head.stdout.strip()


def test_results_name_the_commit_and_whether_the_tree_was_dirty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A figure is only comparable with the code that produced it: the results
    name the package's checkout's commit and whether its tracked files differed
    from it (an untracked scratch file does not count); outside a checkout of
    the package (a wheel in a virtualenv inside another repository, or no
    repository at all), only the version."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    common = _load_common(monkeypatch)
    version = common._version("autothrottle")
    repo = tmp_path / "checkout"
    package = repo / "src" / "autothrottle"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("x = 1\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    commit = _commit_all(repo)
    assert common.source(package) == {"version": version, "commit": commit, "dirty": False}
    (package / "scratch.py").write_text("")
    assert common.source(package)["dirty"] is False
    (package / "__init__.py").write_text("x = 2\n")
    assert common.source(package) == {"version": version, "commit": commit, "dirty": True}
    # Not tracked by the repository it sits in: no checkout of the package's.
    elsewhere = repo / "venv" / "site-packages" / "autothrottle"
    elsewhere.mkdir(parents=True)
    (elsewhere / "__init__.py").write_text("")
    (repo / ".gitignore").write_text("venv/\n")
    assert common.source(elsewhere) == {"version": version, "commit": None, "dirty": None}
    assert common.source(tmp_path) == {"version": version, "commit": None, "dirty": None}
    # What a benchmark writes: the autothrottle imported, this suite's own.
    monkeypatch.setattr(common, "_RESULTS", [tmp_path / "results"])
    written = json.loads(common.write_results("probe", {"n": 1}).read_text())
    assert written["autothrottle"] == _SOURCE


def has(data: dict[str, Any], *keys: str) -> None:
    """Each of ``keys`` (dotted: ``a.b``) is in ``data``."""
    for key in keys:
        here: Any = data
        for part in key.split("."):
            assert isinstance(here, dict) and part in here, f"no {key!r} in {sorted(data)}"
            here = here[part]


def goals_shaped(goals: list[dict[str, Any]], verdict: str = "verdict") -> None:
    """Every goal names itself and its figure, and says met or missed (which, not asked)."""
    assert goals, "no goal reported"
    for goal in goals:
        assert isinstance(goal["goal"], str) and goal["goal"]
        assert isinstance(goal["figure"], str) and goal["figure"]
        if verdict == "met":
            assert isinstance(goal["met"], bool)
        else:
            assert goal[verdict] == "met" or goal[verdict].startswith("MISSED"), goal


def results_option(tmp_path: Path) -> tuple[str, str]:
    return ("--results-dir", str(tmp_path))


# -- no network, no server ----------------------------------------------------------------


def test_stats() -> None:
    out = run("stats.py", "--slots", "500")
    for call in ("stats()", "stats(top=20)", "snapshot()", "stats_async(top=20)"):
        assert f"\n{call} " in f"\n{out}"
    assert "loop blocked at most" in out
    counted = run("stats.py", "--bytecodes")  # the docs' counts a slot come from it
    for call in ("snapshot()", "stats(top=20)", "stats()"):
        assert f"\n{call}: " in f"\n{counted}" and "bytecodes and" in counted


def test_timeline_memory() -> None:
    out = run(
        "timeline_memory.py",
        "--hosts",
        "60",
        "--minutes",
        "0.5",
        "--max-slots",
        "60",
        "--bytecodes",
    )
    assert "held: " in out and "a slot's series with one sample" in out
    assert "µs a slot sampled (CPU)" in out and "bytecodes a slot sampled" in out


def test_scrapy_rule() -> None:
    out = run("scrapy_rule.py", "--overhead", "0.002")
    assert out.startswith("300 s: goodput ")
    assert "15-s runs: goodput median" in out


def test_lag_replay() -> None:
    pytest.importorskip("looptime", reason="lag_replay.py runs on looptime's loop")
    out = run("lag_replay.py", "--seconds", "2", "--seeds", "1", "--lag", "0,0.01")
    assert out.count("one policy") == 2
    assert "limit pinned at 4" in out


@pytest.mark.parametrize("policy", ["autothrottle", "adaptive"])
def test_rate_replay(policy: str) -> None:
    pytest.importorskip("looptime", reason="rate_replay.py runs on looptime's loop")
    out = run("rate_replay.py", "--seconds", "3", "--seeds", "1", "--policy", policy)
    assert "seed 0: " in out
    assert "\nmean: " in out


def test_slow_replay() -> None:
    pytest.importorskip("looptime", reason="slow_replay.py runs on looptime's loop")
    out = run("slow_replay.py", "--hosts", "2", "--trace", "1")
    assert "host 0 (starts at 0.00 s)" in out
    assert "\n60 s: " in out and "\n300 s: " in out


def test_scale(tmp_path: Path) -> None:
    run("scale.py", "--smoke", *results_option(tmp_path))
    found = results(tmp_path, "scale")
    has(found, "memory", "requests", "eviction.memory", "eviction.timing")
    assert [m["slots"] for m in found["memory"]] == [r["slots"] for r in found["requests"]]
    for mem in found["memory"]:
        has(mem, "bytes_per_slot", "top_sites")
    for req in found["requests"]:
        has(req, "us_per_request", "us_first_request_new_slot")
        assert req["requests"] > 0
    evicted = found["eviction"]["memory"]
    has(evicted, "traced_bytes_before", "traced_bytes_after", "store_table_bytes_after")
    assert evicted["slots_after"] < evicted["slots_before"]
    has(found["eviction"]["timing"], "sweep_ms_evicting", "new_slot_ms_evicting_a_batch")


# -- loopback servers and the simulator ---------------------------------------------------


def test_compose() -> None:
    pytest.importorskip("hishel", reason="compose.py stacks hishel's cache with the throttle")
    out = run("compose.py")
    rows = [line for line in out.splitlines()[1:] if line.strip()]
    assert len(rows) == 5, out
    assert all(line.split()[-1] in ("-", "ms") for line in rows), out


def test_wire_gap(tmp_path: Path) -> None:
    # A broken promise exits 1: a verdict, which a smoke run on a loaded machine
    # does not give; the run must still finish and say it.
    out = run("wire_gap.py", "--smoke", *results_option(tmp_path), ok=(0, 1))
    assert "kept the 200 ms promise at the host" in out
    cases = results(tmp_path, "wire_gap")["cases"]
    assert {(c["client"], c["setting"]) for c in cases} == {
        (client, setting)
        for client in ("httpx", "aiohttp")
        for setting in ("saturated pool", "slow setup")
    }
    for case in cases:
        has(case, "min_gap_ms", "median_gap_ms", "kept")
        assert case["requests"] == 8


def test_llm(tmp_path: Path) -> None:
    out = run(
        "llm.py",
        *("--seconds", "0.5", "--workers", "4", "--window", "1"),
        *results_option(tmp_path),
    )
    assert "autothrottle" in out
    found = results(tmp_path, "llm")
    assert set(found["runs"]) == {
        "no throttle",
        "request limiter at RPM",
        "request limiter at TPM/mean",
        "autothrottle",
    }
    for runs in found["runs"].values():
        for r in runs:
            has(r, "requests", "tokens", "binding", "refused")
            assert r["sent"] > 0


@pytest.mark.parametrize("client", ["openai", "httpx"])
def test_llm_spent(tmp_path: Path, client: str) -> None:
    # The scenario docs/benchmarks.md's table of refusals after another client
    # spent the key's tokens comes from: through the SDK and without it.
    if client == "openai":
        pytest.importorskip("openai", reason="--client openai calls through the OpenAI SDK")
    out = run(
        "llm.py",
        *("--spent", "--runs", "1", "--calls", "3", "--client", client),
        *results_option(tmp_path),
    )
    assert "runs refused past the first" in out
    found = results(tmp_path, "llm_spent")
    has(found, "client", "source", "extra")
    assert found["client"] == client
    [r] = found["runs"]
    has(r, "refused", "failed", "outcomes", "arrivals")
    assert r["first"] == "ok"
    assert len(r["outcomes"]) == 3
    assert r["sent"] >= 3 and r["refused"] >= 1  # the other client's spend is seen


def test_fetch(tmp_path: Path) -> None:
    run(
        "fetch.py",
        *("--hosts", "2", "--seconds", "1", "--urls", "2000", "--fresh", "100"),
        *results_option(tmp_path),
    )
    found = results(tmp_path, "fetch")
    has(found, "goal", "met", "memory.bytes_per_url", "memory.large.rss_kib")
    speed = found["throughput"]
    has(speed, "share_of_limits", "limited_429", "max_in_1s_any_host", "urls_per_wall_second")
    assert speed["urls"] == 20
    assert isinstance(found["met"], bool)


def test_fetch_images(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="fetch_images.py draws with matplotlib")
    pytest.importorskip("rich", reason="fetch_images.py records rich's live view")
    # Two pages a host run every part (the fetch, its live view, both images)
    # as 240 do; four took 17 s against 7 s (2026-11-28, load 6).
    run("fetch_images.py", "--pages", "2", "--out", str(tmp_path))
    for image in ("fetch-live.png", "fetch-chart.png"):
        assert (tmp_path / image).read_bytes().startswith(b"\x89PNG"), image


def test_many_hosts_with_the_wire_truth(tmp_path: Path) -> None:
    run(
        "many_hosts.py",
        *("--hosts", "4", "--seconds", "2", "--client", "all", "--wire-truth", "--profile"),
        *results_option(tmp_path),
    )
    found = results(tmp_path, "many_hosts")
    goals_shaped(found["goals"])
    assert len(found["runs"]) == 3
    for r in found["runs"]:
        has(r, "aggregate_rate", "aggregate_goodput", "limit_sum", "worst_window", "min_gap")
        has(r, "hosts_above_limit", "limited", "wire_truth.matched")
        assert r["requests"] > 0
    assert len(list(tmp_path.glob("many_hosts-*-fixed.prof"))) == 3


def test_many_hosts_adaptive(tmp_path: Path) -> None:
    run(
        "many_hosts.py",
        *("--hosts", "4", "--seconds", "2", "--client", "aiohttp"),
        *("--policy", "adaptive", "--burst", "2", "--headers"),
        *results_option(tmp_path),
    )
    found = results(tmp_path, "many_hosts")
    goals_shaped(found["goals"])
    assert "refusals per host" in found["goals"][0]["figure"]
    assert found["runs"][0]["requests"] > 0


def test_many_hosts_new_hosts(tmp_path: Path) -> None:
    run("many_hosts.py", "--new-hosts", "12", "--smoke", *results_option(tmp_path))
    runs = results(tmp_path, "many_hosts_new")["runs"]
    assert [r["client"] for r in runs] == ["aiohttp", "httpx"]
    for r in runs:
        has(r, "bytes_per_host", "cpu_per_host", "pools_left", "met")
        assert r["new_hosts"] == 11


def test_crawl_10k(tmp_path: Path) -> None:
    run(
        "crawl_10k.py",
        *("--hosts", "5", "--rate", "10", "--seconds", "1", "--client", "all"),
        *("--policy", "adaptive", "--census", "--profile", "--gc-freeze"),
        *("--gc-threshold", "700,10,10"),
        *results_option(tmp_path),
    )
    found = results(tmp_path, "crawl_10k")
    goals_shaped(found["goals"])
    assert [(r["client"], r["policy"]) for r in found["runs"]] == [
        ("raw", "adaptive"),
        ("aiohttp", "adaptive"),
        ("httpx", "adaptive"),
    ]
    for r in found["runs"]:
        has(r, "goodput", "limit_sum", "cpu_per_request", "loop_lag_p99", "bytes_per_host")
        has(r, "gc_passes", "census.tracked", "census.old_garbage")
        assert r["responses"] > 0
    assert len(list(tmp_path.glob("crawl_10k-*-adaptive.prof"))) == 3


# -- the overhead -------------------------------------------------------------------------


def test_overhead_by_the_clock(tmp_path: Path) -> None:
    run(
        "overhead.py",
        *("--smoke", "--breakdown", "--profile", "--body-bytes", "2000"),
        *results_option(tmp_path),
    )
    found = results(tmp_path, "overhead_body2000")
    goals_shaped(found["goals"], verdict="met")
    assert len(found["goals"]) == 4  # two a client
    for goal in found["goals"]:
        has(goal, "engine_us", "adapter_us", "total_us")
    variants = found["variants"]
    assert "aiohttp + empty TraceConfig" in variants  # --breakdown's
    for variant in variants.values():
        has(variant, "median_ratio_to_raw", "cpu_us_added_per_request", "median_rps")
    has(found, "engine_us_per_request.aiohttp", "engine_us_per_request.httpx", "settings")
    assert found["profiles"]


def test_overhead_bytecodes() -> None:
    out = run("overhead.py", "--bytecodes", "--policy", "adaptive")
    for client in ("aiohttp", "httpx"):
        assert f"{client}: what a throttled request adds, by function" in out
    assert "_gate.py:" in out  # the engine's functions are among those counted


def test_overhead_instructions(tmp_path: Path) -> None:
    if shutil.which("valgrind") is None:
        pytest.skip("--instructions needs valgrind (apt-get install valgrind)")
    if os.environ.get("AUTOTHROTTLE_BENCH_VALGRIND") != "1":
        pytest.skip(
            "AUTOTHROTTLE_BENCH_VALGRIND=1 runs it: even --smoke is six callgrind runs "
            "of ~30 s, more than this file's share of the suite's time"
        )
    run(
        "overhead.py",
        *("--instructions", "--smoke", "--clients", "aiohttp"),
        *results_option(tmp_path),
    )
    found = results(tmp_path, "overhead_instructions")
    has(found, "per_request.aiohttp.raw", "per_request.aiohttp.throttled")
    has(found, "per_request.aiohttp.engine")


def test_overhead_count_engine(tmp_path: Path) -> None:
    """``--count-engine`` runs (one callgrind run a client), wherever valgrind is.

    Nearly all of its time is the interpreter starting and importing the
    engine under valgrind, before anything is counted, so the child imports no
    client it does not use: 15 s alone at load 3 (2026-11-28), where importing
    aiohttp and httpx too took 33 s."""
    if shutil.which("valgrind") is None:
        pytest.skip("--count-engine needs valgrind (apt-get install valgrind)")
    out = run(
        "overhead.py",
        *("--count-engine", "20", "--clients", "aiohttp", "--policy", "adaptive"),
        *results_option(tmp_path),
    )
    assert "the engine alone, instructions a request" in out
    found = results(tmp_path, "overhead_count_engine")
    has(found, "engine_per_request.aiohttp", "requests", "autothrottle")
    assert found["engine_per_request"]["aiohttp"] > 0  # something was counted
    assert Path(found["autothrottle"]).name == "autothrottle"  # which tree's it counted


# -- the one policy on every simulated site, and Scrapy -----------------------------------


def _adaptive_runs(found: dict[str, Any]) -> set[tuple[str, str]]:
    for r in found["runs"]:
        if r["behaviour"] == "learn":
            has(r, "refusals_per_host", "allowed_share", "limited_share")
            assert r["ok"] > 0
        else:
            has(r, "goodput", "goodput_share", "steady_share", "limited_share", "mean_queue")
            has(r, "max_in_window", "settle", "error_share")
            assert r["requests"] > 0
    return {(r["behaviour"], r["client"]) for r in found["runs"]}


def test_adaptive_beside_scrapy(tmp_path: Path) -> None:
    pytest.importorskip("scrapy", reason="the scrapy clients run a real Scrapy spider")
    run(
        "adaptive.py",
        *("--smoke", "--sites", "cdn,learn"),
        *("--clients", "one-policy,httpx,scrapy,scrapy-autothrottle"),
        *results_option(tmp_path),
    )
    found = results(tmp_path, "adaptive")
    runs = _adaptive_runs(found)
    assert runs == {
        (site, client)
        for site in ("cdn", "learn")
        for client in ("one-policy", "httpx", "scrapy", "scrapy-autothrottle")
    }
    goals_shaped(found["goals"])
    sites = {g["site"] for g in found["goals"]}
    assert sites == {"cdn", "learn"}, sites
    cdn = next(r for r in found["runs"] if r["behaviour"] == "cdn" and r["client"] == "scrapy")
    has(cdn, "origin.mean_queue", "final_delay", "scrapy")


def test_adaptive_defaults_and_soft_blocks(tmp_path: Path) -> None:
    run(
        "adaptive.py",
        *("--smoke", "--sites", "softblock,api", "--clients", "defaults,aiohttp,fixed"),
        *("--busy", "0.005", "--throttle-args", "recovery_time=10"),
        *results_option(tmp_path),
    )
    found = results(tmp_path, "adaptive")
    assert len(_adaptive_runs(found)) == 6
    goals_shaped(found["goals"])
    assert {g["site"] for g in found["goals"]} == {"api"}
    throttled = [r for r in found["runs"] if r["client"] != "fixed"]
    for r in throttled:
        has(r, "throttle.backoffs", "policy_state", "client_lag.lateness", "tenth_ok")


# -- the Redis fleet ----------------------------------------------------------------------


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of this test's own, its keys deleted afterwards (a shared Redis):
    every part of redis_store.py names its own prefixes starting with it."""
    needs_redis()
    pytest.importorskip("redis", reason="redis_store.py runs the Redis store")
    return fresh_prefix("bench-smoke") + "-"


def _fleet_crawl_shaped(crawl: dict[str, Any]) -> None:
    has(crawl, "aggregate_rate", "limit_sum", "hosts_above_limit", "worst_window", "min_gap")
    has(crawl, "round_trips_per_request", "gc", "workers")
    assert crawl["sent"] > 0 and crawl["requests"] > 0  # the crawl sent and hosts saw it


def test_redis_store(tmp_path: Path, redis_prefix: str) -> None:
    out = run(
        "redis_store.py",
        *("--smoke", "--prefix", redis_prefix),
        *results_option(tmp_path),
    )
    assert out.count("  goal ") == 3
    found = results(tmp_path, "redis_store")["figures"]
    _fleet_crawl_shaped(found["fleet_crawl"])
    for part in ("cost", "cost_blocking"):
        has(found[part], "memory_us", "redis_us", "added_us", "round_trips_per_request")
    assert set(found["turns"]) == {"1x1", "4x1", "1x1000", "4x1000"}
    for row in found["one_slot"].values():
        has(row, "rate", "max_in_1s")


def test_redis_store_trace(tmp_path: Path, redis_prefix: str) -> None:
    run(
        "redis_store.py",
        *("--smoke", "--trace", "--crawl-only", "--gc-freeze", "--gc-threshold", "700,10,10"),
        *("--prefix", redis_prefix),
        *results_option(tmp_path),
    )
    crawl = results(tmp_path, "redis_store")["figures"]["fleet_crawl"]
    _fleet_crawl_shaped(crawl)
    has(crawl, "trace.causes", "trace.host_time_lost", "trace.mean_parts_ms")
    assert crawl["trace"]["turns"] > 0  # the traced workers took turns (once they sent nothing)
    traces = results(tmp_path, "redis_store_trace")["traces"]
    assert any(traces)


# -- every entry script is run above, and every command the docs give parses -------------

_FLAGS_OF = """
import contextlib, io, json, runpy, sys
sys.path.insert(0, sys.argv[1])
flags = {}
for name in sys.argv[2:]:
    script = sys.path[0] + "/" + name
    sys.argv = [script, "--help"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        runpy.run_path(script, run_name="__main__")
    flags[name] = out.getvalue()
print(json.dumps(flags))
"""


def test_every_flag_the_docs_give_a_benchmark_is_in_its_help() -> None:
    """A command the docs give (docs/*.md but the log, whose commands are history)
    names only flags its script's ``--help`` shows: a renamed flag fails it here."""
    commands = re.compile(r"python (benchmarks/\w+\.py)([^`|#\n]*)")
    named: dict[str, set[str]] = {}
    for page in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        if page.name == "benchmarks-log.md":
            continue
        for script, args in commands.findall(page.read_text(encoding="utf-8")):
            flags = {arg.split("=")[0] for arg in args.split() if arg.startswith("--")}
            named.setdefault(Path(script).name, set()).update(flags)
    assert "adaptive.py" in named and "overhead.py" in named, named
    parsed = [name for name in sorted(named) if "argparse" in (BENCHMARKS / name).read_text()]
    done = subprocess.run(
        [sys.executable, "-c", _FLAGS_OF, str(BENCHMARKS), *parsed],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    shown = {
        name: set(re.findall(r"--[\w-]+", text)) for name, text in json.loads(done.stdout).items()
    }
    assert "--clients" in shown["adaptive.py"]
    unknown = {
        name: sorted(named[name] - shown[name]) for name in parsed if named[name] - shown[name]
    }
    assert not unknown, unknown
    assert not {name for name in named if name not in parsed and named[name]}


RUN_HERE: dict[str, Callable[..., None]] = {
    "adaptive.py": test_adaptive_beside_scrapy,
    "compose.py": test_compose,
    "crawl_10k.py": test_crawl_10k,
    "fetch.py": test_fetch,
    "fetch_images.py": test_fetch_images,
    "lag_replay.py": test_lag_replay,
    "llm.py": test_llm,
    "many_hosts.py": test_many_hosts_with_the_wire_truth,
    "overhead.py": test_overhead_by_the_clock,
    "rate_replay.py": test_rate_replay,
    "redis_store.py": test_redis_store,
    "scale.py": test_scale,
    "scrapy_rule.py": test_scrapy_rule,
    "slow_replay.py": test_slow_replay,
    "stats.py": test_stats,
    "timeline_memory.py": test_timeline_memory,
    "wire_gap.py": test_wire_gap,
    # run by adaptive.py's scrapy clients, in a process of their own
    "_scrapy_runner.py": test_adaptive_beside_scrapy,
}


def test_every_entry_script_is_run_here() -> None:
    """A new benchmark (any script with a ``__main__``) gets its smoke run here too."""
    entries = {
        path.name
        for path in BENCHMARKS.glob("*.py")
        if '__name__ == "__main__"' in path.read_text(encoding="utf-8")
    }
    assert entries == set(RUN_HERE)
