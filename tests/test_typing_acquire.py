"""What ``Throttle.acquire`` returns, as a user's code meets it in a type checker.

A user's script is checked with mypy (strict) and, when it is installed,
basedpyright (strict), as a user's CI would: each way docs/guide.md shows of
taking a turn (awaited, entered, run by a task), an annotation naming what
``acquire`` returns (:class:`~autothrottle.Acquiring`), and the subclass wrapping
``acquire`` that ``Acquiring``'s docstring shows (its own block). Only the lines
marked ``# E:`` may be flagged: an ``async def`` override returns a plain
coroutine, which ``async with`` would refuse.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autothrottle import Acquiring
from docstring_blocks import literal_block

USER_SCRIPT = """
    from __future__ import annotations

    import asyncio
    from collections.abc import Mapping
    from typing import Any

    import anyio

    from autothrottle import Acquiring, Lease, Throttle


    async def awaited(throttle: Throttle) -> Lease:
        lease = await throttle.acquire("example.com", max_wait=5.0)
        return lease


    async def entered(throttle: Throttle) -> float:
        async with throttle.acquire("example.com") as lease:
            lease.observe(latency=0.2, status=200)
            return lease.sent_at


    async def in_tasks(throttle: Throttle) -> Lease:
        task: asyncio.Task[Lease] = asyncio.create_task(throttle.acquire("example.com"))
        async with anyio.create_task_group() as group:
            group.start_soon(throttle.acquire, "example.com")
        return await task


    def annotated(throttle: Throttle) -> Acquiring:
        turn: Acquiring = throttle.acquire("example.com", cost=500)
        return turn


    # Acquiring's docstring's subclass, Counted, goes here.


    class Spelled(Throttle):
        def acquire(
            self,
            key: str,
            *,
            adjust: bool = True,
            max_wait: float | None = None,
            cost: int | tuple[int, int] | Mapping[str, float] | None = None,
        ) -> Acquiring:
            return super().acquire(key, adjust=adjust, max_wait=max_wait, cost=cost)


    async def subclassed(throttle: Counted) -> None:
        async with throttle.acquire("example.com") as lease:
            lease.observe(latency=0.2, status=200)


    class Plain(Throttle):
        async def acquire(self, key: str, **kwargs: Any) -> Lease:  # E: not enterable
            return await super().acquire(key, **kwargs)
"""


def _script(tmp_path: Path) -> tuple[Path, set[int]]:
    script = tmp_path / "user.py"
    shown = literal_block(Acquiring)  # the docstring's own subclass, as a user copies it
    code = textwrap.dedent(USER_SCRIPT).replace(
        "# Acquiring's docstring's subclass, Counted, goes here.\n", shown
    )
    assert shown in code
    script.write_text(code)
    marked = {
        number
        for number, line in enumerate(script.read_text().splitlines(), start=1)
        if "# E:" in line
    }
    return script, marked


def test_mypy_takes_every_documented_use_of_acquire(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    script, marked = _script(tmp_path)
    # In a process of its own, as tests/test_adapter_surface.py runs it (why: there).
    mypy = [sys.executable, "-m", "mypy", "--strict", "--no-incremental"]
    done = subprocess.run(
        [*mypy, "--cache-dir", str(tmp_path / "cache"), str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = done.stdout + done.stderr
    flagged = {int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line}
    assert flagged == marked, out


def test_basedpyright_takes_every_documented_use_of_acquire(tmp_path: Path) -> None:
    found = shutil.which("basedpyright", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("basedpyright is not installed (nox -s types installs it)")
    script, marked = _script(tmp_path)
    (tmp_path / "pyrightconfig.json").write_text(
        json.dumps({"typeCheckingMode": "strict", "pythonVersion": "3.11"})
    )
    done = subprocess.run(
        [found, "--outputjson", "--pythonpath", sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    report = json.loads(done.stdout)
    errors = [d for d in report["generalDiagnostics"] if d["severity"] == "error"]
    flagged = {d["range"]["start"]["line"] + 1 for d in errors}
    assert flagged == marked, json.dumps(errors, indent=1)
