"""Helpers shared by every benchmark: the results file, the printed table, the simulator.

Each benchmark writes ``benchmarks/results/<name>.json`` (the directory is
gitignored) with the machine that produced the figures and the autothrottle
that ran (its commit, and whether the checkout had changes), because a figure
without its machine and its code cannot be compared with anything. ``--results-dir DIR``
(``add_results_option``) sends it, and any profile a benchmark keeps,
elsewhere: the test that runs every benchmark in a tiny form
(tests/test_benchmarks_run.py) writes into its own temporary directory, never
into the checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp

__all__ = [
    "RESULTS_DIR",
    "SimProcess",
    "add_results_option",
    "control_session",
    "machine",
    "print_table",
    "results_dir",
    "source",
    "write_results",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
"""Where results go unless ``--results-dir`` says otherwise."""

_RESULTS = [RESULTS_DIR]


def results_dir() -> Path:
    """The directory this run writes its results (and profiles) to."""
    return _RESULTS[0]


class _ResultsDir(argparse.Action):
    """Sets the directory as the option is parsed: ``write_results`` needs no argument."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        _RESULTS[0] = Path(values).resolve()
        setattr(namespace, self.dest, _RESULTS[0])


def add_results_option(parser: argparse.ArgumentParser) -> None:
    """``--results-dir DIR``: where ``write_results`` (and a kept profile) writes."""
    parser.add_argument(
        "--results-dir",
        metavar="DIR",
        default=RESULTS_DIR,
        action=_ResultsDir,
        help="where the results JSON goes (default benchmarks/results)",
    )


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


def _git(folder: Path, *args: str) -> str | None:
    """``git -C folder ARGS``'s output, or None (no git, not a checkout, an error)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def source(package_dir: Path | None = None) -> dict[str, Any]:
    """Which autothrottle produced the figures: its ``version``, and when it was
    imported from a git checkout, that checkout's ``commit`` and whether its
    tracked files differed from it (``dirty``); both None otherwise.

    The checkout is the one the package was imported from, found by asking git
    whether it tracks the package's ``__init__.py``: a wheel installed in a
    virtualenv that happens to sit inside some other repository is no checkout
    of autothrottle's.
    """
    if package_dir is None:
        spec = importlib.util.find_spec("autothrottle")
        origin = spec.origin if spec is not None else None
        package_dir = Path(origin).parent if origin else None
    commit = dirty = None
    if package_dir is not None and _git(package_dir, "ls-files", "--error-unmatch", "__init__.py"):
        head = _git(package_dir, "rev-parse", "HEAD")
        status = _git(package_dir, "status", "--porcelain", "--untracked-files=no")
        if head is not None and status is not None:
            commit, dirty = head.strip(), bool(status.strip())
    return {"version": _version("autothrottle"), "commit": commit, "dirty": dirty}


def write_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``data`` with the machine, the autothrottle that ran (:func:`source`)
    and a UTC timestamp to ``results/<name>.json`` (or ``--results-dir``'s)."""
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    document = {
        "benchmark": name,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "autothrottle": source(),
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


# -- the simulator in its own process ----------------------------------------------------


class SimProcess:
    """``python -m autothrottle.sim`` in a child process, driven over HTTP.

    Start with the sim's command-line arguments; ``hosts`` maps each address
    to its base URL. Ground truth comes from ``GET /_sim/stats?all=1`` and
    ``POST /_sim/reset``, the control endpoints every simulated host serves.
    """

    def __init__(self, sim_args: Sequence[str], *, start_timeout: float = 60.0) -> None:
        command = [
            sys.executable,
            "-m",
            "autothrottle.sim",
            "--quiet",
            "--ready-json",
            *sim_args,
        ]
        self._proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ctrl-C in the terminal goes to us, not it
        )
        self.hosts: dict[str, str] = {}
        self.specs: dict[str, str] = {}
        deadline = time.monotonic() + start_timeout
        assert self._proc.stdout is not None
        try:
            for line in self._proc.stdout:
                if line.startswith('{"ready"'):
                    for address, host in json.loads(line)["hosts"].items():
                        self.hosts[address] = host["url"]
                        self.specs[address] = host["spec"]
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the simulator did not start in time")
            if not self.hosts or self._proc.poll() is not None:
                err = self._proc.stderr.read() if self._proc.stderr else ""
                raise RuntimeError(f"the simulator did not start: {err.strip()}")
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        """The simulator's process id (to read its CPU time, say)."""
        return self._proc.pid

    @property
    def control_url(self) -> str:
        return next(iter(self.hosts.values()))

    async def stats(
        self, http: aiohttp.ClientSession, host: str | None = None, *, series: bool = True
    ) -> dict[str, Any]:
        """Every host's ground truth (or one host's), as the sim's JSON."""
        flag = "1" if series else "0"
        if host is None:
            url = f"{self.control_url}/_sim/stats?all=1&series={flag}"
        else:
            url = f"{self.hosts[host]}/_sim/stats?series={flag}"
        async with http.get(url) as response:
            response.raise_for_status()
            doc: dict[str, Any] = await response.json(loads=json.loads)
        return doc

    async def reset(self, http: aiohttp.ClientSession, host: str | None = None) -> None:
        url = (
            f"{self.control_url}/_sim/reset?all=1"
            if host is None
            else f"{self.hosts[host]}/_sim/reset"
        )
        async with http.post(url) as response:
            response.raise_for_status()

    async def wait_idle(
        self, http: aiohttp.ClientSession, host: str | None = None, within: float = 30.0
    ) -> None:
        """Wait until nothing is queued or in service (abandoned requests finish)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            doc = await self.stats(http, host, series=False)
            hosts = doc["hosts"].values() if host is None else [doc]
            busy = sum(h["in_service"] + h["queued"] for h in hosts)
            if not busy:
                return
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(5)
        for stream in (self._proc.stdout, self._proc.stderr):
            if stream is not None:
                stream.close()


def control_session() -> aiohttp.ClientSession:
    """A plain session for the simulator's control endpoints (never throttled)."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
