"""Draw the demo's final screen (80 and 120 columns) and its chart into docs/img/.

``python scripts/screenshots.py`` (or ``nox -s screenshots``; about a minute)
runs ``autothrottle demo`` twice, at 80 and at 120 columns, keeps the text
from its summary table to the end, and draws it as a terminal would (a
monospace font on a dark background) with matplotlib. The 120-column run's
chart is saved too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "img"


def final_screen(width: int, chart: Path | None) -> str:
    out = chart if chart is not None else IMAGES / "scratch.png"
    done = subprocess.run(
        [sys.executable, "-m", "autothrottle", "demo", "--no-live", "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": str(width)},
    )
    if chart is None:
        out.unlink(missing_ok=True)
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "as the sites counted it" in line)
    text = "\n".join(lines[start:])
    return text.replace(str(out), "autothrottle-demo.png")


def draw(text: str, width: int, path: Path) -> None:
    lines = text.splitlines()
    figure = plt.figure(figsize=(width * 0.085, (len(lines) + 1) * 0.165), dpi=110)
    figure.patch.set_facecolor("#1e1e1e")
    figure.text(
        0.01, 0.98, text, family="monospace", fontsize=9, color="#e6e6e6", va="top", ha="left"
    )
    figure.savefig(path, facecolor=figure.get_facecolor())
    plt.close(figure)


def main() -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    for width in (80, 120):
        chart = IMAGES / "demo-chart.png" if width == 120 else None
        draw(final_screen(width, chart), width, IMAGES / f"demo-{width}-columns.png")
        print(f"docs/img/demo-{width}-columns.png")
    print("docs/img/demo-chart.png")


if __name__ == "__main__":
    main()
