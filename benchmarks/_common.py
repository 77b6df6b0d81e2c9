"""Helpers shared by every benchmark: the results file and the printed table.

Each benchmark writes ``benchmarks/results/<name>.json`` (the directory is
gitignored) with the machine that produced the figures, because a figure
without its machine cannot be compared with anything.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["RESULTS_DIR", "machine", "print_table", "write_results"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"

_PACKAGES = ("autothrottle", "httpx", "aiohttp")


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    return {
        "platform": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "packages": {name: _version(name) for name in _PACKAGES},
    }


def write_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``data`` with the machine and a UTC timestamp to ``results/<name>.json``."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    document = {
        "benchmark": name,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "results": data,
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def _is_number(cell: str) -> bool:
    try:
        float(cell.replace(",", "").rstrip("%x"))
    except ValueError:
        return not cell
    return True


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print a table: with rich if it is installed, else as aligned plain text.

    Columns of numbers are right-aligned, any other column left-aligned.
    """
    cells = [[str(cell) for cell in row] for row in rows]
    right = [all(_is_number(row[i]) for row in cells) for i in range(len(columns))]
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        widths = [len(column) for column in columns]
        for row in cells:
            widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
        print(title)
        for line in ([*columns], ["-" * width for width in widths], *cells):
            print(
                "  ".join(
                    cell.rjust(width) if flush else cell.ljust(width)
                    for cell, width, flush in zip(line, widths, right, strict=True)
                ).rstrip()
            )
        return
    table = Table(title=title)
    for column, flush in zip(columns, right, strict=True):
        table.add_column(column, justify="right" if flush else "left")
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))  # Text: no markup in cells
    Console().print(table)
