"""Regenerate docs/img/fetch-live.png and docs/img/fetch-chart.png (docs/observability.md).

Run with ``python benchmarks/fetch_images.py`` (about 20 s). Loopback only:
a real ``autothrottle fetch`` of 2,840 URLs over 13 simulated hosts (ten 10/s
APIs, two fast origins, one 2/s API that tells nobody its limit), with the
live view recorded about halfway through and the chart written at the end.
The screenshot is drawn with matplotlib, one monospace cell per character,
in rich's colours. ``--out DIR`` writes the two images there instead, and
``--pages N`` fetches N pages a host (240; the 2/s host min(N, 40)): the test
suite runs ``--pages 2`` into a temporary directory to keep this working.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _common import SimProcess
from rich.console import Console, Group
from rich.segment import Segment
from rich.terminal_theme import MONOKAI

import autothrottle.cli._fetch as fetch_module
from autothrottle import Throttle
from autothrottle.cli._fetch_options import FetchJob

IMG = Path(__file__).resolve().parent.parent / "docs" / "img"


def screenshot(view: Group, path: Path, width: int = 110) -> None:
    """Draw ``view`` as a terminal would: dark background, rich's colours and bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    console = Console(width=width, force_terminal=True, color_system="truecolor")
    lines = list(Segment.split_and_crop_lines(console.render(view), width, pad=False))
    cell_w, cell_h = 0.0725, 0.17  # inches per character cell at 9 pt
    fig = plt.figure(figsize=(width * cell_w + 0.4, len(lines) * cell_h + 0.4), dpi=110)
    fig.patch.set_facecolor("#1e1e1e")
    for row, line in enumerate(lines):
        col = 0
        for segment in line:
            text, style = segment.text, segment.style
            colour, bold = "#d4d4d4", False
            if style is not None:
                bold = bool(style.bold)
                if style.color is not None and not style.color.is_default:
                    colour = style.color.get_truecolor(MONOKAI).hex
                if style.dim:
                    colour = "#8a8a8a"
            if text.strip():
                fig.text(
                    (0.2 + col * cell_w) / fig.get_figwidth(),
                    1 - (0.2 + (row + 0.8) * cell_h) / fig.get_figheight(),
                    text,
                    family="DejaVu Sans Mono",
                    size=9,
                    color=colour,
                    weight="bold" if bold else "normal",
                )
            col += len(text)
    fig.savefig(path, facecolor=fig.get_facecolor())
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=IMG, help="where the images go (default docs/img)"
    )
    parser.add_argument("--pages", type=int, default=240, help="pages a host (default 240)")
    args = parser.parse_args()
    if args.pages < 1:
        parser.error("--pages must be >= 1")
    out: Path = args.out
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
                for i in range(args.pages):
                    # The 2/s host gets fewer URLs: it would take two minutes for 240.
                    fh.writelines(
                        f"{base}/page/{i}\n"
                        for base in sim.hosts.values()
                        if i < 40 or not base.startswith("http://127.0.0.14:")
                    )
            job = FetchJob(
                urls=str(urls),
                out=str(Path(tmp) / "out.jsonl"),
                progress="live",
                chart=str(out / "fetch-chart.png"),
            )
            throttle = Throttle(start_delay=0.2, target_concurrency=2.0, rate_limit_headers=True)
            console = Console(stderr=True, force_terminal=True, width=110)
            started = time.monotonic()
            fetch_module.run(job, throttle, console=console)
            middle = started + 0.4 * (time.monotonic() - started)
    finally:
        fetch_module.live_view = original
        sim.stop()
    view = min(frames, key=lambda frame: abs(frame[0] - middle))[1]
    screenshot(view, out / "fetch-live.png")
    print(f"wrote {out / 'fetch-live.png'} and {out / 'fetch-chart.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
