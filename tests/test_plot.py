"""Timelines on disk (``jsonl=``, ``write_jsonl``, ``read_jsonl``) and ``autothrottle plot``.

Samples come from a fake throttle on a fake clock: the file must hold exactly
what the timeline held, so a chart drawn from the file is the chart of the run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from autothrottle.cli._main import main
from autothrottle.timeline import Timeline
from helpers import FakeClock, FakeThrottle

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def record(timeline: Timeline, clock: FakeClock, fake: FakeThrottle) -> None:
    """Three samples of two slots, with statuses, backoffs and a mark."""
    fake.set("a", delay=0.5, responses=3, status_counts={200: 3}, in_flight=2, queued=4)
    timeline.sample()
    clock.now += 0.5
    fake.set(
        "a",
        delay=1.0,
        last_latency=0.2,
        responses=9,
        status_counts={200: 5, 429: 4},
        backoffs=1,
        pauses=1,
        last_backoff_reason="status 429",
    )
    fake.set("b", delay=0.1, responses=40, status_counts={200: 40}, cache_hits=30, failures=2)
    timeline.sample()
    timeline.mark("a", "blocked")
    clock.now += 0.5
    timeline.sample()


def test_a_streamed_timeline_reads_back_exactly(tmp_path: Path) -> None:
    clock, fake = FakeClock(100.0), FakeThrottle()
    path = tmp_path / "t.jsonl"
    timeline = Timeline(fake, interval=0.5, clock=clock, jsonl=path)
    record(timeline, clock, fake)
    # Streamed as taken: the file holds every sample before the timeline is closed.
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["format"] == "autothrottle-timeline"
    assert len(lines) == 1 + 5 + 1  # header, 3 samples of a and 2 of b, one mark
    timeline.close()

    loaded = Timeline.read_jsonl(path)
    assert loaded.interval == 0.5
    assert loaded.keys == timeline.keys
    for key in timeline.keys:
        assert loaded.samples(key) == timeline.samples(key)
    assert loaded.marks() == timeline.marks()
    assert not loaded.running

    # write_jsonl of the same timeline reads back the same too.
    again = Timeline.read_jsonl(timeline.write_jsonl(tmp_path / "w.jsonl"))
    assert [again.samples(k) for k in again.keys] == [timeline.samples(k) for k in timeline.keys]
    assert again.marks() == timeline.marks()
    assert loaded.busiest(1) == ["b"]
    assert loaded.busiest(5) == ["b", "a"]


def test_reading_keeps_memory_bounded_and_skips_a_cut_last_line(tmp_path: Path) -> None:
    clock, fake = FakeClock(100.0), FakeThrottle()
    path = tmp_path / "t.jsonl"
    timeline = Timeline(fake, clock=clock, jsonl=path)
    for i in range(10):
        fake.set("a", responses=i)
        timeline.sample()
        clock.now += 0.1
    timeline.close()
    with path.open("a") as fh:
        fh.write('{"t": 9.9, "key": "a", "del')  # a recorder killed mid-write
    loaded = Timeline.read_jsonl(path, max_samples=4)
    assert [s.responses for s in loaded.samples("a")] == [1, 1, 1, 1]  # the last four
    assert len(loaded.samples("a")) == 4


def test_the_stream_stops_at_its_byte_cap(tmp_path: Path) -> None:
    clock, fake = FakeClock(100.0), FakeThrottle()
    path = tmp_path / "t.jsonl"
    timeline = Timeline(fake, clock=clock, jsonl=path, jsonl_max_bytes=2048)
    for i in range(200):
        fake.set("a", responses=i, status_counts={200: i})
        timeline.sample()
        clock.now += 0.1
    size = path.stat().st_size
    assert size <= 2048 + 100
    assert path.read_text().splitlines()[-1] == '{"truncated":true}'
    assert len(timeline.samples("a")) == 200  # memory still has them
    assert Timeline.read_jsonl(path).samples("a")  # and the file reads


@pytest.mark.parametrize(
    ("text", "needle"),
    [("", "not an autothrottle timeline"), ('{"format": "other"}\n', "not an autothrottle")],
)
def test_a_file_that_is_no_timeline_is_refused(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=needle):
        Timeline.read_jsonl(path)


def test_a_broken_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"format": "autothrottle-timeline", "version": 1}\n{"key": "a", "t": 1}\n')
    with pytest.raises(ValueError, match="line 2"):
        Timeline.read_jsonl(path)


def test_bad_jsonl_arguments_fail_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="jsonl_max_bytes"):
        Timeline(FakeThrottle(), jsonl=tmp_path / "t.jsonl", jsonl_max_bytes=10)
    with pytest.raises(OSError):
        Timeline(FakeThrottle(), jsonl=tmp_path / "missing" / "t.jsonl")


def test_plot_draws_the_chart_from_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock, fake = FakeClock(100.0), FakeThrottle()
    path = tmp_path / "t.jsonl"
    timeline = Timeline(fake, interval=0.5, clock=clock, jsonl=path)
    record(timeline, clock, fake)
    timeline.close()
    out = tmp_path / "chart.png"
    assert main(["plot", str(path), "-o", str(out), "--top", "1", "--title", "t"]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert str(out) in capsys.readouterr().out


def test_plot_names_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("hello\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", str(bad), "-o", str(tmp_path / "c.png")])
    assert exit_info.value.code == 2
    assert "bad.jsonl" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", str(tmp_path / "absent.jsonl"), "-o", str(tmp_path / "c.png")])
    assert exit_info.value.code == 2


def test_the_gap_kept_stops_with_the_last_response_instead_of_spiking() -> None:
    from autothrottle.timeline._chart import gap_kept

    times = [0.1 * i for i in range(80)]  # 8 s sampled every 0.1 s
    responses = [1] * 50 + [0] * 30  # 10/s for 5 s, then the host is done
    kept = gap_kept(times, responses, window=3.0)
    steady = [v for v in kept[35:50]]
    assert all(abs(v - 0.1) < 0.01 for v in steady)  # 10/s: a 100 ms gap
    assert all(math.isnan(v) for v in kept[50:])  # no climb to 1/(a decaying rate)
    finite = [v for v in kept if not math.isnan(v)]
    assert max(finite) <= 0.2


def test_the_legend_lists_only_the_lines_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure
    from matplotlib.legend import Legend

    legends: list[list[str]] = []
    save = Figure.savefig

    def keep_legend(self: Figure, *args: Any, **kwargs: Any) -> None:
        found = self.findobj(Legend)
        legends.append([text.get_text() for legend in found for text in legend.get_texts()])
        save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep_legend)
    clock, fake = FakeClock(), FakeThrottle()
    timeline = Timeline(fake, interval=0.1, clock=clock)
    for i in range(1, 30):  # a plain host: no cache, no capacity given, no events
        fake.set("a", delay=0.2, last_latency=0.05, responses=2 * i, status_counts={200: 2 * i})
        fake.set("c", delay=0.1, responses=3 * i, status_counts={200: 3 * i}, cache_hits=2 * i)
        timeline.sample()
        clock.now += 0.1
    timeline.plot(tmp_path / "plain.png", keys=["a"])
    timeline.plot(tmp_path / "all.png", capacities={"a": 10.0}, origin_capacities={"c": 1.0})
    plain, every = legends
    assert "cache hits/s" not in plain and "site capacity" not in plain
    assert not any(label.startswith("misses/s") for label in plain)
    assert {"delay", "responses/s", "latency (median)"} <= set(plain)
    assert {"cache hits/s", "site capacity", "misses/s (the origin's load)"} <= set(every)


def test_the_rate_is_drawn_when_samples_are_further_apart_than_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    rates: dict[int, list[float]] = {}  # by line: findobj may meet one more than once
    save = Figure.savefig

    def keep_rates(self: Figure, *args: Any, **kwargs: Any) -> None:
        for line in self.findobj(Line2D):
            ydata: Any = line.get_ydata()
            if line.get_color() == "#ff7f0e" and len(ydata) == 19:  # responses/s
                rates[id(line)] = [float(y) for y in ydata]
        save(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep_rates)
    clock, fake = FakeClock(), FakeThrottle()
    # interval_per_slot's waits over many slots: a sample every 10 s, not every 0.25 s
    timeline = Timeline(fake, interval=0.25, interval_per_slot=0.001, clock=clock)
    for i in range(1, 20):
        fake.set("a", delay=0.1, responses=100 * i, status_counts={200: 100 * i})
        timeline.sample()
        clock.now += 10.0
    timeline.plot(tmp_path / "sparse.png")
    (drawn,) = rates.values()
    assert drawn[5:] == pytest.approx([10.0] * len(drawn[5:]))  # 100 responses in 10 s
