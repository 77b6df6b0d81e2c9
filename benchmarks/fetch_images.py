"""Regenerate docs/img/fetch-live.png and docs/img/fetch-chart.png (docs/observability.md).

Run with ``python benchmarks/fetch_images.py`` (about 20 s; needs ImageMagick's
``convert`` for the screenshot). Loopback only: a real ``autothrottle fetch``
of 3,000 URLs over 13 simulated hosts (ten 10/s APIs, two fast origins, one
2/s API that tells nobody its limit), with the live view recorded about
halfway through and the chart written at the end.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import SimProcess
from rich.console import Console, Group

import autothrottle._fetch as fetch_module
from autothrottle import Throttle
from autothrottle._fetch_options import FetchJob

IMG = Path(__file__).resolve().parent.parent / "docs" / "img"


def main() -> None:
    sim = SimProcess(
        [
            "--many",
            "10=rate:rate=10,burst=2",
            "--many",
            "2=capacity:workers=4,service_time=0.02",
            "--many",
            "1=rate:rate=2,burst=1,headers=false",
        ]
    )
    frames: list[tuple[float, Group]] = []
    original = fetch_module.live_view

    def recorded(*args: object, **kwargs: object) -> Group:
        view = original(*args, **kwargs)  # type: ignore[arg-type]
        frames.append((time.monotonic(), view))
        del frames[:-200]
        return view

    fetch_module.live_view = recorded
    try:
        with tempfile.TemporaryDirectory() as tmp:
            urls = Path(tmp) / "urls.txt"
            with urls.open("w") as fh:
                for i in range(240):
                    fh.writelines(f"{base}/page/{i}\n" for base in sim.hosts.values())
            job = FetchJob(
                urls=str(urls),
                out=str(Path(tmp) / "out.jsonl"),
                progress="live",
                chart=str(IMG / "fetch-chart.png"),
            )
            throttle = Throttle(start_delay=0.2, target_concurrency=2.0, rate_limit_headers=True)
            console = Console(stderr=True, force_terminal=True, width=110)
            started = time.monotonic()
            fetch_module.run(job, throttle, console=console)
            middle = started + 0.5 * (time.monotonic() - started)
    finally:
        fetch_module.live_view = original
        sim.stop()
    view = min(frames, key=lambda frame: abs(frame[0] - middle))[1]
    shot = Console(record=True, width=110, force_terminal=True, file=open("/dev/null", "w"))  # noqa: SIM115
    shot.print(view)
    svg = IMG / "fetch-live.svg"
    shot.save_svg(str(svg), title="autothrottle fetch urls.txt -o out.jsonl")
    subprocess.run(
        ["convert", "-density", "110", str(svg), str(IMG / "fetch-live.png")], check=True
    )
    svg.unlink()
    print(f"wrote {IMG / 'fetch-live.png'} and {IMG / 'fetch-chart.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
