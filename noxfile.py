"""Developer tasks: `nox` runs lint, types and tests (what CI runs); `nox -s bench` benchmarks."""

from __future__ import annotations

import shutil
import subprocess

import nox

nox.options.sessions = ["lint", "types", "tests"]


#: Every Python the package declares (requires-python >= 3.11) that this machine has.
def _runs(version: str) -> bool:
    """True when ``python<version>`` is on PATH and actually starts (pyenv shims may not)."""
    exe = shutil.which(f"python{version}")
    if exe is None:
        return False
    try:
        return subprocess.run([exe, "-c", "pass"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


PYTHONS = [v for v in ("3.11", "3.12", "3.13", "3.14") if _runs(v)] or ["3.11"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The test suite: real loopback servers, injected clocks, property tests."""
    session.install("-e", ".[dev,sim,cli,plot]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and formatting) and import-linter (the layers of docs/architecture.md)."""
    session.install("ruff>=0.5", "import-linter>=2.0", "-e", ".")
    paths = ("src", "tests", "examples", "benchmarks", "scripts", "noxfile.py")
    session.run("ruff", "check", *paths)
    session.run("ruff", "format", "--check", *paths)
    session.run("lint-imports")


@nox.session
def types(session: nox.Session) -> None:
    """mypy --strict over the package; mypy --strict and pyright strict (basedpyright,
    which bundles its node) over a user's script of the public API (tests/typing)."""
    session.install("-e", ".[dev,sim,cli,plot,redis]", "basedpyright>=1.20")
    session.run("mypy")
    session.run("mypy", "--strict", "tests/typing")
    session.run("basedpyright", "--pythonpath", f"{session.bin}/python")


@nox.session
def readme(session: nox.Session) -> None:
    """Run two demos at once and check both give the README sample's verdicts
    (``-- --runs 5``: five times; ``-- --write`` pastes a new run's)."""
    session.install("-e", ".[sim,cli,plot]")
    session.run("python", "scripts/readme.py", *session.posargs)


@nox.session
def screenshots(session: nox.Session) -> None:
    """Redraw docs/img/demo-*.png: the demo's final screen at 80 and 120 columns, and its chart."""
    session.install("-e", ".[sim,cli,plot]")
    session.run("python", "scripts/screenshots.py")


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site with the API reference from the docstrings; fails on any warning."""
    session.install("mkdocs>=1.6", "mkdocstrings[python]>=0.26", "-e", ".[dev,sim,cli,plot]")
    session.run("mkdocs", "build", "--strict")


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks (never part of the test run); each prints a table and writes JSON."""
    session.install("-e", ".[dev,sim,cli,plot,bench]")
    # redis_store needs Redis on 127.0.0.1:6379 (as the tests do).
    names = session.posargs or [
        "overhead",
        "many_hosts",
        "crawl_10k",
        "adaptive",
        "scale",
        "wire_gap",
        "fetch",
        "redis_store",
        "stats",
        "compose",
        "llm",
    ]
    for name in names:
        session.run("python", f"benchmarks/{name}.py")
