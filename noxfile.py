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
#: uv makes each session's virtualenv in seconds where pip takes a minute or two
#: (the types session's install was most of CI's first three minutes); without
#: uv on PATH nox falls back to virtualenv and pip, as before.
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.error_on_missing_interpreters = True


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The test suite: real loopback servers, injected clocks, property tests.

    In three processes (pytest-xdist) on a 2-core machine: most of a test's
    time is a real server's or a real wait's (with two, the suite kept under
    one core busy: 320 s of processor in 358 s), so a third fills the waits,
    and the suite runs beside more loads of itself, as its timing verdicts
    must hold under. Four were faster again, but a fleet test whose bound
    counts a process's start failed once under them at load 11
    (`nox -s tests -- -n 0` runs it in one process)."""
    session.install("-e", ".[dev,sim,cli,plot]")
    session.run("pytest", "-n", "3", *session.posargs)


#: The oldest release of each client that pyproject.toml allows, and of what the
#: adapters reach into through it (httpcore under httpx; yarl and multidict come
#: with aiohttp, whose oldest release needs yarl 1.17). Scrapy 2.13.0 imports a
#: Twisted private that Twisted 26 removed: it runs on the Twisted of its day.
#: urllib3 2.0.0 and 2.0.1 are yanked; requests 2.32.0 and 2.32.1 too.
OLDEST = (
    "aiohttp==3.12.0",
    "yarl==1.17.0",
    "httpx==0.27.0",
    "httpcore==1.0.0",
    "anyio==4.0.0",
    "scrapy==2.13.0",
    "twisted==25.5.0",
    "requests==2.32.2",
    "urllib3==2.0.2",
    "redis==5.0.1",
)
#: httpx2's oldest needs a newer anyio and h11 than httpx's oldest: a second step.
OLDEST_HTTPX2 = ("httpx2==2.16.0", "httpcore2==2.16.0", "anyio==4.10.0")
#: The tests of the adapters and of what they lean on (the whole suite runs in `tests`).
ADAPTER_TESTS = (
    "tests/test_privates.py",
    "tests/test_adapter_surface.py",
    "tests/test_aiohttp_adapter.py",
    "tests/test_aiohttp_connector.py",
    "tests/test_httpx_adapter.py",
    "tests/test_httpx_pools.py",
    "tests/test_httpx_unit.py",
    "tests/test_lifecycle.py",
    "tests/test_requests_adapter.py",
    # urllib3's retry steps the adapter hooks (_requests_parts._RetryTurns).
    "tests/test_requests_retry.py",
    "tests/test_requests_retry_steps.py",
    "tests/test_review_requests_retry.py",
    "tests/test_scrapy.py",
    "tests/test_scrapy_tls.py",
    "tests/test_redis_wire.py",
    "tests/test_tls.py",
    "tests/test_http2.py",
    "tests/test_fleet_unsent.py",
    "tests/test_relayed_body.py",
)


@nox.session(python=PYTHONS[0])
def oldest(session: nox.Session) -> None:
    """The adapters' tests on the oldest client versions pyproject.toml declares
    (``OLDEST``), then the httpx2 half on httpx2's oldest; `nox -s oldest`."""
    session.install(
        "-e",
        ".",
        "pytest>=8",
        "pytest-asyncio>=0.24",
        "pytest-xdist>=3",
        "hypothesis>=6.100",
        "respx>=0.21",
        "looptime>=0.2",
        "mypy>=1.10",
        # HTTPS and HTTP/2 on loopback (tests/tls.py): the stream order under
        # the oldest httpcore is what the HTTP/2 hand-over leans on.
        "trustme>=1.1",
        "hypercorn>=0.16",
        "h2>=4",
        *OLDEST,
    )
    # What was installed, for the log: uv's virtualenvs have no pip.
    lister = ("uv", "pip") if session.venv_backend == "uv" else ("python", "-m", "pip")
    session.run(*lister, "list", silent=False, external=True)
    session.run("pytest", "-n", "2", *ADAPTER_TESTS, *session.posargs)
    session.install(*OLDEST_HTTPX2)
    httpx2 = [
        t
        for t in ADAPTER_TESTS
        if any(part in t for part in ("httpx", "lifecycle", "privates", "http2", "tls"))
    ]
    session.run("pytest", "-n", "2", "-k", "httpx2", *httpx2, *session.posargs)


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
    """mypy --strict over the package and its tests (pyproject.toml's ``files``); and
    pyright strict (basedpyright, which bundles its node) over a user's script of the
    public API (tests/typing)."""
    session.install("-e", ".[dev,sim,cli,plot,redis]", "basedpyright>=1.20")
    session.run("mypy")
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


@nox.session(python=PYTHONS[0])
def mutants(session: nox.Session) -> None:
    """Mutation-test the estimators (``scripts/mutants.py``): which small change to a
    rule does no test notice? ``nox -s mutants -- _pace _limits`` for some of them,
    ``nox -s mutants -- _gate`` (or ``_rules``, ``_lease``, ``_turns``) for the
    engine's, ``nox -s mutants -- _headers._ietf`` (or ``_headers``: each) for a
    header dialect's; each survivor's verdict is in docs/mutants.md."""
    session.install("-e", ".[dev,sim]", "mutmut==3.8.1")
    session.run("python", "scripts/mutants.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks at full length; each prints a table and writes JSON.

    The test run starts each in a tiny form (tests/test_benchmarks_run.py) only
    to keep it running; the figures come from here."""
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
