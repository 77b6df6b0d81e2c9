"""The ``autothrottle`` command line, the demo, and the Timeline recorder.

The demo test is a real (short) run on loopback; it asserts what the user must
get (a summary naming every host, a PNG), never how fast anything went.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import autothrottle
import autothrottle.sim
from autothrottle import Throttle
from autothrottle.cli._main import DEFAULT_DURATION, DEFAULT_OUT, build_parser, main
from autothrottle.policy import policy_from_text
from autothrottle.sim import CDN, Capacity, HostStats, RateLimited, SoftBlock
from autothrottle.timeline import Timeline
from helpers import FakeClock, FakeThrottle

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# ----------------------------------------------------------------------------- arguments


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"autothrottle {autothrottle.__version__}"


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out = capsys.readouterr().out
    assert "demo" in out and "sim" in out


def test_demo_defaults_need_no_arguments() -> None:
    args = build_parser().parse_args(["demo"])
    assert args.command == "demo"
    assert (args.duration, args.out, args.no_live, args.seed) == (
        DEFAULT_DURATION,
        DEFAULT_OUT,
        False,
        None,
    )
    assert DEFAULT_DURATION <= 35  # the whole demo must end within a minute


def test_demo_options() -> None:
    args = build_parser().parse_args(
        ["demo", "--duration", "2.5", "--out", "x/y.png", "--no-live", "--seed", "7"]
    )
    assert (args.duration, args.out, args.no_live, args.seed) == (2.5, "x/y.png", True, 7)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon", "3601"])
def test_demo_rejects_bad_duration(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--duration", value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--duration" in err and repr(value) in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["fetch", "urls.txt", "--start-dealy", "0.5"],
            "autothrottle fetch: error: unrecognized arguments: --start-dealy 0.5 "
            "(did you mean --start-delay? see --help)",
        ),
        (
            ["demo", "--duraton=5"],
            "autothrottle demo: error: unrecognized arguments: --duraton=5 "
            "(did you mean --duration? see --help)",
        ),
        (
            ["--versoin"],
            "autothrottle: error: unrecognized arguments: --versoin "
            "(did you mean --version? see --help)",
        ),
        # Not taken for --retry-after, a flag it begins: no flag is abbreviated.
        (
            ["fetch", "urls.txt", "--retry", "3"],
            "autothrottle fetch: error: unrecognized arguments: --retry 3 "
            "(did you mean --retries? see --help)",
        ),
        (
            ["fetch", "urls.txt", "--xyz"],
            "autothrottle fetch: error: unrecognized arguments: --xyz (see --help)",
        ),
        # wget's flags, which a fetch user reaches for: what the fetch has instead.
        (
            ["fetch", "urls.txt", "-O", "-"],
            "autothrottle fetch: error: unrecognized arguments: -O - (the lines go to -o "
            "(- for stdout), the bodies to --bodies DIR; see --help)",
        ),
        (
            ["fetch", "urls.txt", "--tries=3"],
            "autothrottle fetch: error: unrecognized arguments: --tries=3 "
            "(wget's --tries N is --retries N-1 here; see --help)",
        ),
        (
            ["fetch", "urls.txt", "-c"],
            "autothrottle fetch: error: unrecognized arguments: -c "
            "(a fetch resumes by itself: run it again with the same -o; see --help)",
        ),
        (
            ["fetch", "urls.txt", "--no-clobber"],
            "autothrottle fetch: error: unrecognized arguments: --no-clobber (bodies "
            "(--bodies DIR) are named by their SHA-256: none is overwritten; see --help)",
        ),
    ],
)
def test_a_typo_d_flag_is_named_by_its_subcommand_with_the_flag_meant(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The subcommand says it, whose ``--help`` lists the flag (the top-level
    ``autothrottle --help`` lists none of the fetch's)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == said + "\n"


def test_demo_rejects_unwritable_out_before_crawling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--duration", "30", "--no-live", "--out", str(blocker / "x.png")])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "out" in captured.err and "x.png" in captured.err
    assert "simulated sites" not in captured.out  # nothing was started


def test_sim_delegates_its_arguments_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[str], str]] = []

    def fake_main(argv: list[str], *, prog: str) -> int:
        calls.append((argv, prog))
        return 5

    monkeypatch.setattr(autothrottle.sim, "main", fake_main)
    argv = ["--host", "127.0.0.2=rate:rate=2", "--help", "--version", "demo"]
    assert main(["sim", *argv]) == 5
    assert calls == [(argv, "autothrottle sim")]


def test_sim_runs_the_simulator(capsys: pytest.CaptureFixture[str]) -> None:
    spec = "127.0.0.2=capacity:workers=1,service_time=0.01"
    assert main(["sim", "--host", spec, "--duration", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "http://127.0.0.2:" in out and "capacity:workers=1" in out


@pytest.mark.parametrize(
    ("argv", "module", "extra"),
    [
        (["demo"], "rich", "cli,plot"),
        (["demo"], "matplotlib", "cli,plot"),
        (["demo"], "httpx", "cli,plot"),
        (["fetch", "u.txt"], "protego", "cli"),
        (["fetch", "u.txt", "--chart", "c.png"], "matplotlib", "cli,plot"),
        (["plot", "t.jsonl", "-o", "c.png"], "matplotlib", "plot"),
        (["sim"], "aiohttp", "sim"),
    ],
)
def test_a_missing_extra_names_the_pip_command_of_this_checkout(
    argv: list[str],
    module: str,
    extra: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert module in err and "Traceback" not in err
    root = Path(autothrottle.__file__).resolve().parent.parent.parent
    assert f'cd {root} && pip install -e ".[{extra}]"' in err


def test_sim_help_without_aiohttp_lists_the_options_and_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sim --help`` answers before the extra is installed; a run still refuses."""
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    assert main(["sim", "--help"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "--many N=SPEC" in out and "--ready-json" in out
    assert out.rstrip().endswith('pip install -e ".[sim]"')
    assert main(["sim", "--many", "2=rate:rate=2", "--", "--help"]) == 1  # not a flag there
    out, err = capsys.readouterr()
    assert out == "" and "autothrottle sim needs aiohttp" in err


def test_the_help_names_the_extras_the_demo_asks_for(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``autothrottle --help`` sends a newcomer to the demo: it must not promise a run
    that the next command refuses for lack of an extra."""
    for module in ("rich", "httpx", "aiohttp", "matplotlib"):
        monkeypatch.setitem(sys.modules, module, None)
    assert main(["demo"]) == 1
    asked = re.search(r"\(the '([a-z,]+)' extras?\)", capsys.readouterr().err)
    assert asked is not None
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    extras = " and ".join(asked.group(1).split(","))
    assert f"Start with `autothrottle demo`: with the {extras} extras installed" in help_text


def _fetch_help(flag: str) -> str:
    fetch = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["fetch"]
    action = next(a for a in fetch._actions if flag in a.option_strings)
    assert action.help is not None
    return str(action.help)


def test_fetch_help_gives_each_policy_s_start_delay_as_the_throttle_has_it() -> None:
    """A default of None is the policy's: ``--help`` names it per policy, and no
    setting the policy does not decide (``--max-wait``) is said to be the policy's."""
    said = re.search(r"default: the policy's own: (.*)\)", _fetch_help("--start-delay"))
    assert said is not None
    named = re.findall(r"([\d.]+) for ([\w-]+(?: and [\w-]+)*)", said.group(1))
    assert {n for _, names in named for n in names.split(" and ")} == {
        "adaptive",
        "autothrottle",
        "aimd",
    }
    for seconds, names in named:
        for name in names.split(" and "):
            throttle = Throttle(policy=policy_from_text(name))
            assert throttle.config.start_delay == float(seconds), name
    unbounded = _fetch_help("--max-wait")
    assert "policy" not in unbounded and "waits as long as its turn takes" in unbounded


def test_the_fetch_summary_counts_in_words_and_titles_the_hosts_it_shows() -> None:
    """One of a thing is not "1 errors"; a table of every host is not "the 1 hosts
    with the most URLs"; a table of some says of how many."""
    from rich.console import Console

    from autothrottle.cli._fetch_progress import Tally, summary

    def text(tally: Tally, rows: int) -> str:
        console = Console(width=200, record=True, file=io.StringIO())
        console.print(summary(tally, Throttle(), interrupted=False, rows=rows))
        return " ".join(console.export_text().split())

    tally = Tally(total=2, clock=FakeClock(1.0), started=0.0)
    fields = {"status": None, "bytes": 0, "attempts": 2, "error": "ConnectError: refused"}
    tally.finished("a.example", fields)
    tally.finished("b.example", {**fields, "status": 200, "attempts": 1, "error": None})
    one = text(tally, rows=10)
    assert "; 1 error; 1 retry;" in one and "per host" in one
    assert "hosts with the most URLs" not in one
    some = text(tally, rows=1)
    assert "the host with the most URLs, of 2" in some


def test_fetch_needs_no_matplotlib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The cli extra has no matplotlib: only a chart asks for the plot extra."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    urls = tmp_path / "urls.txt"
    urls.write_text("ftp://not-http/\n")
    assert main(["fetch", str(urls), "-o", str(tmp_path / "o.jsonl"), "-q"]) == 1  # ran
    assert "matplotlib" not in (tmp_path / "o.jsonl").read_text()


def test_outside_a_checkout_the_command_names_the_published_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autothrottle import _extras

    monkeypatch.setattr(_extras, "_checkout", lambda: None)
    assert _extras.install_command("cli") == 'pip install "autothrottle[cli]"'


def test_plot_given_the_fetch_s_lines_says_which_file_the_timeline_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tmp_path / "out.jsonl"
    lines.write_text('{"url":"http://127.0.0.2/","status":200}\n')
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", str(lines), "-o", str(tmp_path / "c.png")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "is not an autothrottle timeline file" in err
    assert err.endswith(
        "; it holds the lines of `autothrottle fetch -o`: the timeline is the file "
        "`autothrottle fetch --timeline FILE.jsonl` writes\n"
    )
    other = tmp_path / "other.jsonl"
    other.write_text("hello\n")
    with pytest.raises(SystemExit):
        main(["plot", str(other), "-o", str(tmp_path / "c.png")])
    assert "autothrottle fetch" not in capsys.readouterr().err


def test_plotting_without_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clock, fake = FakeClock(), FakeThrottle()
    timeline = Timeline(fake, clock=clock)
    fake.set("a", responses=1)
    timeline.sample()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install .*\[plot\]"):
        timeline.plot(tmp_path / "c.png")


def test_python_dash_m_autothrottle() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "autothrottle", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"autothrottle {autothrottle.__version__}"


# ----------------------------------------------------------------------------- the demo


def test_demo_short_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from autothrottle.cli._demo_sites import sites

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    # A path longer than the terminal is wide must still print on one line, to be copied.
    monkeypatch.setenv("COLUMNS", "100")

    out = tmp_path / ("long-directory-name-" * 4) / "charts" / "x.png"
    out.parent.mkdir(parents=True)
    assert main(["demo", "--duration", "2", "--no-live", "--out", str(out), "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert f"chart saved to {out}" in text
    demo_sites = sites()
    assert {s.client for s in demo_sites} == {"httpx", "aiohttp"}
    intro, summary = text.split("as the sites counted it")
    for site in demo_sites:
        assert f"http://{site.address}:" in intro
        assert summary.count(site.name) == 2  # its row and its verdict
    assert "[  1 s]" in text  # plain progress lines, as stdout is not a terminal
    assert "\x1b[" not in text  # and no live view or colours


# ----------------------------------------------------------------------------- verdicts


def _stats(**values: Any) -> HostStats:
    base: dict[str, Any] = {
        f.name: (None if f.name in ("first_arrival", "last_finish", "origin") else 0)
        for f in dataclasses.fields(HostStats)
    }
    base.update(host="127.0.0.9", url="", behaviour="", statuses={}, arrivals=(), records=())
    base.update(in_service_series=(), queued_series=())
    base.update(values)
    return HostStats(**base)


def _verdict(behaviour: Any, **values: Any) -> str:
    from autothrottle.cli._demo_crawl import Tally
    from autothrottle.cli._demo_judge import Outcome
    from autothrottle.cli._demo_sites import Site

    site = Site("127.0.0.9", "x", "x", behaviour, "httpx")
    stats = _stats(capacity=behaviour.capacity, **values)
    return Outcome(site, Tally(), stats, 0.1).verdict()


def test_verdicts_say_what_happened() -> None:
    rate = RateLimited(rate=10)
    assert _verdict(rate, goodput=9.6, completed=250, limited=1) == (
        "found the pace: 9.6/s of 10/s allowed, 0.4 % refused"
    )
    assert _verdict(rate, goodput=9.9, completed=100, limited=20).startswith("too fast: 20.0 %")
    assert _verdict(rate, goodput=3.0, completed=100).startswith("too cautious")
    soft = SoftBlock(rate=5)
    assert "2.0 % CAPTCHA" in _verdict(soft, goodput=4.8, completed=100, blocked=2)
    assert _verdict(soft, goodput=4.8, completed=100, blocked=30).startswith("too fast")
    origin = Capacity(workers=4, service_time=0.05)
    assert _verdict(origin, goodput=70.0, mean_in_service=3.5, mean_queued=0.1).startswith(
        "found the pace: its 4 workers busy 88% of the time (70.0/s of the 80/s"
    )
    assert _verdict(origin, goodput=79.0, mean_in_service=4, mean_queued=6.0).startswith(
        "pushed too hard"
    )
    assert _verdict(origin, goodput=20.0, mean_in_service=1.0).startswith("too cautious")
    assert _verdict(origin, goodput=61.0, mean_in_service=3.0).startswith("found the pace")
    cdn = CDN()
    # A CDN is judged by its origin's workers: busy 19 % of the time is too
    # cautious, however quiet the origin was.
    calm = _stats(goodput=1.9, mean_in_service=0.38, mean_queued=0.0)
    assert _verdict(cdn, goodput=19.0, origin=calm).startswith(
        "too cautious: its origin's 2 workers busy 19% of the time (1.9 misses/s"
    )
    steady = _stats(goodput=8.0, mean_in_service=1.6, mean_queued=0.6)
    assert _verdict(cdn, goodput=80.0, origin=steady).startswith("found the pace")
    busy = _stats(goodput=10.0, mean_in_service=2.0, mean_queued=3.0)
    assert _verdict(cdn, goodput=99.0, origin=busy).startswith("pushed too hard")


def test_a_verdict_judges_the_second_half_of_the_crawl_by_the_site_s_own_records() -> None:
    from autothrottle.cli._demo_judge import Figures
    from autothrottle.sim import RequestRecord

    # 20 s at a 5/s wall: the first 10 s slow (1/s) with a CAPTCHA page, then 4.5/s.
    early = [RequestRecord(t, t, t + 0.01, 200, "ok") for t in range(10)]
    early.append(RequestRecord(5.5, 5.5, 5.51, 200, "blocked"))
    late = [
        RequestRecord(10 + i / 4.5, 10 + i / 4.5, 10.01 + i / 4.5, 200, "ok") for i in range(45)
    ]
    records = tuple(sorted(early + late, key=lambda r: r.finish))
    whole = _stats(
        goodput=len(records) / 20.0,
        completed=len(records),
        blocked=1,
        first_arrival=0.0,
        last_finish=records[-1].finish,
        records=records,
        queued_series=((0.0, 0), (12.0, 2), (13.0, 0)),
    )
    judged = Figures.judged(whole)
    assert judged.goodput == pytest.approx(4.5, abs=0.3)
    assert (judged.answered, judged.blocked) == (45, 0)
    assert judged.mean_queued == pytest.approx(2.0 / (records[-1].finish - 10.0), abs=0.01)
    soft = SoftBlock(rate=5)
    from autothrottle.cli._demo_crawl import Tally
    from autothrottle.cli._demo_judge import Outcome
    from autothrottle.cli._demo_sites import Site

    site = Site("127.0.0.9", "x", "x", soft, "httpx")
    verdict = Outcome(site, Tally(), whole, 0.2).verdict()
    assert verdict.startswith("found the pace: 4.5/s of 5/s allowed, 0.0 % CAPTCHA pages")


def test_the_demo_s_sites_serve_from_a_process_of_their_own() -> None:
    from autothrottle.cli._demo_sites import Sites

    async def visit() -> tuple[int, dict[str, HostStats]]:
        async with Sites({"127.0.0.2": Capacity(workers=2, service_time=0.01)}, 1) as sites:
            url = sites.base_url("127.0.0.2")
            reader, writer = await asyncio.open_connection("127.0.0.2", int(url.rsplit(":")[-1]))
            writer.write(b"GET /page/1 HTTP/1.1\r\nHost: 127.0.0.2\r\nConnection: close\r\n\r\n")
            status = int((await reader.readline()).split()[1])
            await reader.read()
            writer.close()
            return status, await sites.stats()

    status, stats = asyncio.run(visit())
    assert status == 200
    assert stats["127.0.0.2"].requests == 1  # counted by the child, read back across the pipe


def test_every_verdict_word_is_defined() -> None:
    from autothrottle.cli._demo_judge import VERDICT_WORDS

    words = [word for word, _ in VERDICT_WORDS]
    assert words == ["found the pace", "too cautious", "too fast", "pushed too hard"]
    assert all(meaning for _, meaning in VERDICT_WORDS)


# ----------------------------------------------------------------------------- Timeline


def test_timeline_records_values_and_deltas() -> None:
    clock, fake = FakeClock(100.0), FakeThrottle()
    timeline = Timeline(fake, interval=0.5, clock=clock)
    fake.set("a", delay=0.5, responses=3, status_counts={200: 3}, in_flight=2, queued=4)
    timeline.sample()

    clock.now += 1.0
    fake.set(
        "a",
        delay=1.0,
        last_latency=0.2,
        responses=7,
        status_counts={200: 5, 429: 2},
        cache_hits=1,
        backoffs=1,
        ignored_backoffs=1,
        pauses=1,
        failures=1,
        last_backoff_reason="status 429",
        in_flight=1,
        queued=0,
    )
    fake.set("b", responses=2, status_counts={503: 2}, backoffs=1, last_backoff_reason="status 503")
    timeline.sample()

    clock.now += 1.0
    timeline.sample()  # nothing happened since

    first, second, third = timeline.samples("a")
    assert (first.time, first.delay, first.responses, first.statuses) == (0.0, 0.5, 3, {200: 3})
    assert (first.in_flight, first.queued, first.latency) == (2, 4, None)
    assert second.time == 1.0 and second.delay == 1.0 and second.latency == 0.2
    assert second.responses == 4 and second.statuses == {200: 2, 429: 2}
    assert (second.cache_hits, second.backoffs, second.pauses, second.failures) == (1, 2, 1, 1)
    assert second.backoff_reason == "status 429"
    assert (third.responses, third.statuses, third.backoffs, third.backoff_reason) == (
        0,
        {},
        0,
        None,
    )
    # A slot first seen later counts everything it had as new.
    (b_first, _) = timeline.samples("b")
    assert b_first.time == 1.0 and b_first.statuses == {503: 2} and b_first.backoffs == 1
    assert timeline.keys == ("a", "b")
    assert timeline.samples("never") == []


def test_timeline_counts_a_recreated_slot_from_zero() -> None:
    clock, fake = FakeClock(100.0), FakeThrottle()
    timeline = Timeline(fake, clock=clock)
    fake.set("a", sent=50, responses=50, status_counts={200: 50})
    timeline.sample()
    del fake.slots["a"]  # evicted while idle, then used again
    fake.set("a", sent=2, responses=2, status_counts={429: 2}, backoffs=1)
    timeline.sample()
    last = timeline.samples("a")[-1]
    assert (last.responses, last.statuses, last.backoffs) == (2, {429: 2}, 1)


def test_timeline_rate_and_marks() -> None:
    clock, fake = FakeClock(100.0), FakeThrottle()
    timeline = Timeline(fake, clock=clock)
    total = 0
    for added in (5, 10, 20):
        total += added
        fake.set("a", responses=total)
        timeline.sample()
        clock.now += 1.0
    assert timeline.rate("a", window=1.0) == 20.0  # t=1..2: the last sample's 20
    assert timeline.rate("a", window=2.0) == 15.0  # t=0..2: 10 + 20 over 2 s
    assert timeline.rate("a", window=60.0) == 15.0  # the first sample's 5 came before t=0
    assert timeline.rate("missing") == 0.0
    with pytest.raises(ValueError, match="window"):
        timeline.rate("a", window=0)

    clock.now = 100.0 + 2.5
    timeline.mark("a", "blocked")
    timeline.mark("b", "login wall")
    assert [(m.time, m.kind) for m in timeline.marks("a")] == [(2.5, "blocked")]
    assert len(timeline.marks()) == 2


def test_timeline_keeps_at_most_max_samples() -> None:
    clock, fake = FakeClock(100.0), FakeThrottle()
    timeline = Timeline(fake, clock=clock, max_samples=3)
    fake.set("a")
    for _ in range(10):
        timeline.sample()
        timeline.mark("a", "x")
        clock.now += 1.0
    assert [s.time for s in timeline.samples("a")] == [7.0, 8.0, 9.0]
    assert len(timeline.marks()) == 3
    timeline.clear()
    assert timeline.keys == () and timeline.marks() == [] and timeline.now() == 0.0


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"interval": 0}, ValueError, "interval"),
        ({"interval": math.nan}, ValueError, "interval"),
        ({"interval": "fast"}, TypeError, "interval"),
        ({"max_samples": 0}, ValueError, "max_samples"),
        ({"clock": 3}, TypeError, "clock"),
    ],
)
def test_timeline_rejects_bad_arguments(
    kwargs: dict[str, Any], error: type[Exception], name: str
) -> None:
    with pytest.raises(error, match=name):
        Timeline(FakeThrottle(), **kwargs)


def test_timeline_needs_something_with_snapshot() -> None:
    with pytest.raises(TypeError, match="snapshot"):
        Timeline(object())  # type: ignore[arg-type]


async def test_timeline_samples_a_real_throttle_in_the_background() -> None:
    clock = FakeClock(100.0)
    throttle = Throttle(start_delay=0.0, clock=clock)
    async with Timeline(throttle, interval=0.01) as timeline:
        assert timeline.running
        with pytest.raises(RuntimeError, match="already started"):
            await timeline.start()
        lease = await throttle.acquire("example.com")
        lease.observe(latency=0.1, status=429, headers={"Retry-After": "3"})
        lease.release()
        for _ in range(200):  # until the task has sampled at least once
            if timeline.samples("example.com"):
                break
            await asyncio.sleep(0.01)
    assert not timeline.running
    await timeline.stop()  # idempotent
    samples = timeline.samples("example.com")
    assert sum(s.statuses.get(429, 0) for s in samples) == 1
    assert sum(s.backoffs for s in samples) == 1
    assert sum(s.pauses for s in samples) == 1
    assert any(s.backoff_reason == "status 429" for s in samples)
    assert samples[-1].delay > 0.0 and samples[-1].in_flight == 0


def test_timeline_plot_writes_a_png(tmp_path: Path) -> None:
    clock, fake = FakeClock(100.0), FakeThrottle()
    timeline = Timeline(fake, interval=0.1, clock=clock)
    with pytest.raises(ValueError, match="no samples"):
        timeline.plot(tmp_path / "empty.png")
    for i in range(1, 40):
        fake.set(
            "api",
            delay=0.5 / i,
            last_latency=0.05,
            responses=3 * i,
            status_counts={200: 3 * i - i // 10, 429: i // 10},
            backoffs=i // 10,
            pauses=i // 20,
            in_flight=i % 3,
        )
        fake.set("cdn", delay=0.1, responses=2 * i, status_counts={200: 2 * i}, cache_hits=i)
        timeline.sample()
        if i == 15:
            timeline.mark("api", "blocked")
        clock.now += 0.1
    path = timeline.plot(
        tmp_path / "sub" / "chart.png",
        title="test",
        labels={"api": "the API"},
        capacities={"api": 10.0, "cdn": math.inf},
    )
    assert path == tmp_path / "sub" / "chart.png"
    assert path.read_bytes().startswith(PNG_MAGIC)
    only = timeline.plot(tmp_path / "one.png", keys=["cdn"])
    assert only.stat().st_size > 0
    behind = timeline.plot(tmp_path / "origin.png", keys=["cdn"], origin_capacities={"cdn": 5.0})
    assert behind.read_bytes().startswith(PNG_MAGIC)
    assert behind.read_bytes() != only.read_bytes()  # the misses and the origin's line


def test_demo_out_into_a_missing_directory_is_an_error_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(SystemExit) as info:
        main(["demo", "--out", str(missing / "chart.png"), "--duration", "1"])
    assert info.value.code == 2
    assert str(missing) in capsys.readouterr().err
    assert not missing.exists()


def test_the_demo_reads_at_80_columns_without_cutting_a_column_or_a_url() -> None:
    from rich.console import Console

    from autothrottle.cli._demo_crawl import Tally
    from autothrottle.cli._demo_judge import Outcome
    from autothrottle.cli._demo_sites import Site
    from autothrottle.cli._demo_view import summary_table

    outcomes = [
        Outcome(
            Site(f"127.0.0.{i}", name, "x", Capacity(workers=4, service_time=0.05), "httpx"),
            Tally(),
            _stats(capacity=80.0, goodput=65.5, requests=1970, completed=1970, max_in_window=80),
            0.014,
        )
        for i, name in enumerate(["slow origin", "rate-limited API", "mixed pages"], start=2)
    ]
    for width in (80, 120):
        console = Console(width=width, record=True, file=io.StringIO())
        console.print(summary_table(outcomes, 30.0, width))
        text = console.export_text()
        assert "…" not in text
        assert all(len(line) <= width for line in text.splitlines())
        assert "goodput" in text and "true capacity" in text  # the columns that matter stay
    assert "max in 1 s" in text  # and at 120 columns every column is there
