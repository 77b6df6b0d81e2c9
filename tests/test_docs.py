"""The docs against the code: every flag ``--help`` shows is documented (and every flag the
docs name exists), every install command works from a checkout, every page is in the site, and
the docs' examples that can run on loopback run as a reader copies them."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from autothrottle import Throttle, __version__, _extras
from autothrottle.cli._main import build_parser
from autothrottle.sim._cli import build_parser as build_sim_parser
from loopback import loopback_hosts, running_hosts

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """The long flags a parser shows in ``--help`` (``--no-X`` twins left out)."""
    flags = set()
    for action in parser._actions:
        if action.help == argparse.SUPPRESS:
            continue
        flags |= {o for o in action.option_strings if o.startswith("--") and o != "--help"}
    return {f for f in flags if not (f.startswith("--no-") and "--" + f[5:] in flags)}


def _mentions(text: str, flag: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


COMMANDS = {name: p for name, p in _subparsers(build_parser()).items() if name != "sim"}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_help_shows_is_in_docs_cli(command: str) -> None:
    text = (DOCS / "cli.md").read_text()
    missing = sorted(f for f in _flags(COMMANDS[command]) if not _mentions(text, f))
    assert not missing, f"autothrottle {command}: document {missing} in docs/cli.md"


def test_every_flag_of_the_simulator_is_in_docs_sim() -> None:
    text = (DOCS / "sim.md").read_text()
    missing = sorted(f for f in _flags(build_sim_parser()) if not _mentions(text, f))
    assert not missing, f"autothrottle sim: document {missing} in docs/sim.md"


def test_every_flag_docs_cli_names_exists() -> None:
    known = set().union(*(_flags(p) for p in COMMANDS.values()), _flags(build_sim_parser()))
    known |= {"--version", "--help", "--no"}  # "`--no-...`": the booleans' twins
    named = set(re.findall(r"`(--[a-z][a-z-]*[a-z])", (DOCS / "cli.md").read_text()))
    named = {f for f in named if not (f.startswith("--no-") and "--" + f[5:] in known)}
    assert not named - known, f"docs/cli.md names flags no command has: {sorted(named - known)}"


def _commands_broken_across_lines() -> list[tuple[str, str]]:
    """``(page, command)`` for each inline command of the docs (not the log, whose commands are
    history) that a line end breaks: ``python benchmarks/NAME.py`` or ``python -m
    autothrottle.sim``, its lines joined as a reader's shell would read them pasted."""
    found = []
    for page in [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]:
        if page.name == "benchmarks-log.md":
            continue
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
        for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", text):
            command = " ".join(span.split())  # a break after "python" too
            wrapped = "\n" in span
            if wrapped and command.startswith(("python benchmarks/", "python -m autothrottle")):
                found.append((page.name, command))
    return found


def test_every_flag_of_a_command_broken_across_lines_is_in_its_help() -> None:
    """tests/test_benchmarks_run.py checks a benchmark command's flags up to the line's end; a
    command the docs wrap (``--crawl-only`` on the next line) is read whole here, so a renamed
    or misspelt flag after the break fails too."""
    commands = _commands_broken_across_lines()
    assert commands, "no wrapped command left: fold this test into the benchmarks' flag check"
    helps: dict[str, set[str]] = {"-m": _flags(build_sim_parser())}
    unknown = []
    for page, command in commands:
        script = command.split()[1]
        if script not in helps:
            shown = subprocess.run(
                [sys.executable, script, "--help"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "COLUMNS": "200"},
            )
            assert shown.returncode == 0, (script, shown.stderr[-2000:])
            helps[script] = set(re.findall(r"--[\w-]+", shown.stdout))
        named = {word.strip("[]").split("=")[0] for word in command.split()}
        unknown += [
            (page, flag)
            for flag in sorted(named)
            if flag.startswith("--") and flag not in helps[script]
        ]
    assert not unknown, f"flags no --help shows, in wrapped commands: {unknown}"


def _install_lines() -> list[tuple[str, str]]:
    pages = [*DOCS.glob("*.md"), ROOT / "README.md"]
    return [
        (page.name, line)
        for page in pages
        for line in page.read_text().splitlines()
        if ("pip install" in line and "autothrottle" in line)
        or 'pip install -e "' in line
        or ".whl[" in line
    ]


def test_every_install_command_in_the_docs_works_from_a_checkout() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    wheel = f"autothrottle-{__version__}-py3-none-any.whl["  # what python -m build makes
    lines = _install_lines()
    assert len(lines) >= 8
    for page, line in lines:
        assert 'pip install -e ".[' in line or "published" in line or ".whl[" in line, (page, line)
        assert ".whl[" not in line or wheel in line, (page, line, f"the wheel is {wheel}")
        for group in re.findall(r"\[([a-z,]+)\]", line):
            assert set(group.split(",")) <= extras, (page, line)


def test_the_fetch_verbose_help_says_what_docs_cli_says_it_prints() -> None:
    """``-v`` prints a line for each robots.txt floor, each unreachable robots.txt and
    each URL that ends in an error (``test_fetch_cli.py`` checks them); its help
    promised one for every robots.txt read and every block, which it never printed."""
    fetch = next(
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["fetch"]
    (verbose,) = (a for a in fetch._actions if "--verbose" in a.option_strings)
    said = " ".join(str(verbose.help).split())
    row = next(
        line for line in (DOCS / "cli.md").read_text().splitlines() if "`-v, --verbose`" in line
    )
    for what in ("robots.txt floor", "unreachable robots.txt", "URL that ends in an error"):
        assert what in said and what in row, (what, said, row)
    assert "block" not in said and "read" not in said, said


def test_every_key_of_the_fetch_summary_json_is_in_docs_cli(tmp_path: Path) -> None:
    """A script reads ``--summary-json`` by the names docs/cli.md gives it."""
    urls, summary = tmp_path / "urls.txt", tmp_path / "summary.json"
    urls.write_text("# none yet\n")
    command = ["fetch", str(urls), "-q", "--summary-json", str(summary)]
    done = subprocess.run(
        [sys.executable, "-m", "autothrottle", *command], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(summary.read_text())
    keys = set(data) | set(data["robots"])
    row = next(
        line
        for line in (DOCS / "cli.md").read_text().splitlines()
        if line.startswith("| `--summary-json PATH`")
    )
    missing = sorted(k for k in keys if f"`{k}`" not in row)
    assert not missing, f"docs/cli.md's --summary-json row does not name {missing}"


def test_every_page_is_in_the_site() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.name for p in DOCS.glob("*.md")}
    assert "index.md" in pages
    missing = sorted(p for p in pages if f": {p}" not in nav)
    assert not missing, f"add to mkdocs.yml's nav: {missing}"


def _python_block_after(page: Path, heading: str) -> str:
    """The first Python code block under ``heading`` in ``page``, as a reader copies it."""
    text = page.read_text()
    section = text[text.index(heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, f"{page.name}: no Python block under {heading!r}"
    return match.group(1)


async def test_the_guides_virtual_clock_test_runs_as_written() -> None:
    """The guide's example test, copied into a test file, passes against a loopback server."""
    source = _python_block_after(DOCS / "guide.md", "## Testing your code")
    namespace: dict[str, object] = {}
    exec(compile(source, "docs/guide.md", "exec"), namespace)  # the docs' own code
    test = namespace["test_my_crawler_is_polite"]
    assert any(m.name == "asyncio" for m in getattr(test, "pytestmark", ())), (
        "pytest runs an async test only when marked (or under asyncio_mode = 'auto')"
    )
    async with loopback_hosts(1) as (host,):
        await test(host.origin)  # type: ignore[operator]


def test_the_simulators_python_example_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/sim.md's first example, run as a script: four simulated hosts on loopback."""
    source = _python_block_after(DOCS / "sim.md", "## From Python")
    exec(compile(source, "docs/sim.md", "exec"), {"__name__": "__main__"})  # the docs' own code
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("127.0.0.4 served a CAPTCHA page") for line in lines)
    requests, limited, max_in_window, _goodput = lines[-1].split()
    assert int(requests) == 20  # what the example sent the rate-limited host
    assert int(limited) < 20 and int(max_in_window) >= 1


def _python_blocks_in(page: Path, heading: str) -> list[str]:
    """Every Python code block of the section under ``heading`` (up to the next ``## ``)."""
    text = page.read_text()
    section = text[text.index(heading) + len(heading) :]
    section = section.split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


async def _run_awaiting(block: str, namespace: dict[str, object]) -> None:
    """Run a block with top-level ``await``s as a reader does: in an async function."""
    source = "async def _block():\n" + textwrap.indent(block, "    ") + "    return locals()\n"
    exec(compile(source, "README.md", "exec"), namespace)  # the docs' own code
    namespace.update(await namespace["_block"]())  # type: ignore[operator]


def test_the_readmes_quickstarts_run_as_scripts_against_a_loopback_host(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each quickstart (and docs/index.md's), pasted into a file and run with ``python``: the
    async ones are whole scripts (a top-level ``async with`` is a SyntaxError there), the
    fragments after them run where they say, and the thread ones with the ``urls`` they
    define."""
    httpx_blocks = _python_blocks_in(ROOT / "README.md", "## Quickstart: httpx")
    aiohttp_blocks = _python_blocks_in(ROOT / "README.md", "## Quickstart: aiohttp")
    (requests_block,) = _python_blocks_in(ROOT / "README.md", "## Quickstart: requests")
    with running_hosts(1) as (host,):
        (index,) = re.findall(r"```python\n(.*?)```", (DOCS / "index.md").read_text(), re.DOTALL)
        for block in (httpx_blocks[0], aiohttp_blocks[0], index):
            namespace: dict[str, object] = {"__name__": "__main__"}
            script = block.replace("https://example.com/", host.url("/"))
            exec(compile(script, "README.md", "exec"), namespace)  # the docs' own code
            assert namespace["throttle"].stats().totals.sent == 1  # type: ignore[attr-defined]
            assert capsys.readouterr().out.startswith("200 ThrottleInfo(slot='127.0.0.2'")
        assert len(host.arrivals) == 3

        # The mounts example, in main() as it says, with a request where it has ``...``.
        mounts = httpx_blocks[1].replace("https://api.example.com", host.origin)
        mounts = mounts.replace("    ...", f"    await client.get({host.url('/')!r})")
        namespace = {"throttle": Throttle()}
        asyncio.run(_run_awaiting("import httpx\n" + mounts, namespace))
        assert namespace["throttle"].stats().totals.sent == 1  # type: ignore[attr-defined]
        assert len(host.arrivals) == 4

        for block in (httpx_blocks[-1], requests_block):
            namespace = {"throttle": Throttle()}  # the httpx one goes on from the first block
            script = block.replace("https://example.com", host.origin)
            exec(compile(script, "README.md", "exec"), namespace)  # the docs' own code
            pages = namespace["pages"]
            assert [p.status_code for p in pages] == [200] * 20  # type: ignore[attr-defined]
        assert capsys.readouterr().out == f"{[200] * 20}\n"
        assert len(host.arrivals) == 44


CLIENTS = ("httpx", "httpx2", "aiohttp", "requests", "scrapy", "redis")


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.py")))
def test_every_example_runs(example: str) -> None:
    """``python examples/NAME.py``, as the README says: each against its own loopback servers,
    with only its own client's extra installed (``CLIENT_example.py`` needs ``[CLIENT]``)."""
    client = example.removesuffix("_example.py")
    assert client in CLIENTS, f"examples/{example}: name it after the extra it needs"
    absent = [name for name in CLIENTS if name != client]
    code = (
        "import runpy, sys\n"
        f"for name in {absent!r}:\n"
        "    sys.modules[name] = None  # as if not installed\n"
        "runpy.run_path(sys.argv[1], run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "examples" / example)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"statuses:? \[200\]", done.stdout), done.stdout[-2000:]


def test_the_scrapy_docs_name_what_scrapy_startproject_sets_against_the_pace() -> None:
    """The settings a new Scrapy project sets that cap or floor the pace are named, with their
    values, where the docs tell how to turn the middleware on: a reader who adds the five lines
    to a new project is otherwise held at one request a second per host without a word."""
    scrapy = pytest.importorskip("scrapy")
    template = Path(scrapy.__file__).parent / "templates/project/module/settings.py.tmpl"
    pacing = {"DOWNLOAD_DELAY", "CONCURRENT_REQUESTS_PER_DOMAIN", "CONCURRENT_REQUESTS_PER_IP"}
    lines = re.findall(r"^([A-Z_]+) = (.+)$", template.read_text(), re.MULTILINE)
    set_there = [f"{name} = {value}" for name, value in lines if name in pacing]
    assert set_there, "scrapy startproject sets no pacing setting now: drop the docs' warning"
    scrapy_md = (DOCS / "scrapy.md").read_text()
    five_lines = scrapy_md[scrapy_md.index("## Migrating") :].split("\n## ", 1)[0]
    readme = (ROOT / "README.md").read_text()
    inside_scrapy = readme[readme.index("## Inside Scrapy") :].split("\n## ", 1)[0]
    for line in set_there:
        assert f"`{line}`" in " ".join(five_lines.split()), f"docs/scrapy.md: name {line}"
        assert f"`{line}`" in " ".join(inside_scrapy.split()), f"README.md: name {line}"


async def test_the_compose_cache_recipe_answers_a_hit_without_the_throttle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/compose.md's hishel recipe as written: the second request, a hit, never reaches
    the host nor the throttle."""
    pytest.importorskip("hishel.httpx", reason="hishel 1 or 2 (the dev extra's hishel[async])")
    monkeypatch.chdir(tmp_path)  # hishel's default storage is a file under the working folder
    (recipe, *_) = _python_blocks_in(DOCS / "compose.md", "## Caches")
    from autothrottle.httpx import AsyncThrottledTransport

    namespace: dict[str, object] = {"throttle": Throttle()}
    exec("import httpx", namespace)
    namespace["AsyncThrottledTransport"] = AsyncThrottledTransport
    exec(compile(textwrap.dedent(recipe), "docs/compose.md", "exec"), namespace)  # the docs' own
    client = namespace["client"]
    async with loopback_hosts(1) as (host,), client:  # type: ignore[attr-defined]
        url = host.url("/?h.Cache-Control=max-age%3D60")
        statuses = [(await client.get(url)).status_code for _ in range(2)]  # type: ignore[attr-defined]
        assert statuses == [200, 200]
        assert len(host.arrivals) == 1
    assert namespace["throttle"].stats().totals.sent == 1  # type: ignore[attr-defined]


async def test_the_timeline_on_disk_example_runs_and_names_a_slot_it_never_saw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/observability.md's timeline on disk, with a crawl of a loopback host: the file is
    read back and drawn; the example's own slot (a host this crawl never asked) is named in the
    error, with the slots there are, rather than said to be no samples at all."""
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    (example,) = _python_blocks_in(DOCS / "observability.md", "## Timelines on disk")
    from autothrottle.httpx import AsyncThrottledClient

    async with loopback_hosts(1) as (host,):

        async def crawl(throttle: Throttle) -> None:
            async with AsyncThrottledClient(throttle=throttle) as client:
                for i in range(3):
                    await client.get(host.url(f"/page/{i}"))

        namespace: dict[str, object] = {"crawl": crawl}
        with pytest.raises(ValueError, match=rf"api\.example\.com.*{re.escape(host.address)}"):
            await _run_awaiting(example, namespace)
        mine = example.replace('"api.example.com"', repr(host.address))
        await _run_awaiting(mine, namespace)
    assert (tmp_path / "crawl.png").stat().st_size > 0
    assert (tmp_path / "crawl.jsonl").read_text().count(host.address) >= 1


def test_the_guides_debug_setup_shows_the_debug_records() -> None:
    """``debug=True`` logs at DEBUG, which Python hides by default: the guide's block sets the
    ``autothrottle`` logger's level, so a reader who pastes it sees the records."""
    (block,) = _python_blocks_in(DOCS / "guide.md", "## Reading the debug output")
    logger = logging.getLogger("autothrottle")
    level, handlers = logger.level, list(logging.root.handlers)
    try:
        logger.setLevel(logging.NOTSET)
        namespace: dict[str, object] = {}
        exec(compile(block, "docs/guide.md", "exec"), namespace)  # the docs' own code
        assert namespace["throttle"].debug  # type: ignore[attr-defined]
        assert logger.isEnabledFor(logging.DEBUG)
    finally:
        logger.setLevel(level)
        logging.root.handlers[:] = handlers  # what basicConfig added, if anything


def test_the_timeline_example_of_docs_cli_runs_as_a_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/cli.md's ``Timeline`` example, pasted into a file and run against a loopback host:
    it crawls, draws the chart, and prints the samples of the slot it crawled."""
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    (block,) = _python_blocks_in(DOCS / "cli.md", "## Recording your own crawl: `Timeline`")
    with running_hosts(1) as (host,):
        script = block.replace("https://example.com", host.origin)
        script = script.replace('"example.com"', repr(host.address))
        exec(compile(script, "docs/cli.md", "exec"), {"__name__": "__main__"})  # the docs' own
        assert len(host.arrivals) == 20
    assert (tmp_path / "crawl.png").stat().st_size > 0
    assert len(capsys.readouterr().out.splitlines()) >= 1  # a sample of the slot, at least


def test_the_readmes_per_host_settings_build_and_name_every_key() -> None:
    """The README's one-line ``hosts=`` and ``set_host`` examples run as written, and the keys
    they list are exactly the per-host settings there are."""
    import dataclasses

    from autothrottle import FixedRatePolicy, HostSettings

    readme = " ".join((ROOT / "README.md").read_text().split())
    (example,) = re.findall(r"`(Throttle\(hosts=\{.*?\}\}\))`", readme)
    # A key or a value the throttle does not take raises here, naming it.
    throttle = eval(example, {"Throttle": Throttle, "FixedRatePolicy": FixedRatePolicy})
    (later,) = re.findall(r"`(throttle\.set_host\(.*?\}\))`", readme)
    eval(later, {"throttle": throttle})  # the docs' own code
    listed = re.search(r"the keys are (.*?) \(", readme)
    assert listed, "README.md: list the per-host keys"
    named = re.findall(r"`([a-z_]+)`", listed.group(1))
    assert named == [f.name for f in dataclasses.fields(HostSettings)]


class _Dist:
    """What ``importlib.metadata.distribution`` returns, with a ``direct_url.json`` of choice."""

    def __init__(self, direct_url: str | None, package: Path) -> None:
        self.direct_url, self.package = direct_url, package

    def locate_file(self, path: str) -> Path:
        return self.package.parent / path

    def read_text(self, name: str) -> str | None:
        return self.direct_url if name == "direct_url.json" else None


#: The install command a missing extra's message gives (``_extras``), where the docs'
#: ``pip install "autothrottle[...]"`` would ask an index that has no such package.
HERE = Path(_extras.__file__).resolve().parent
WHEEL = "file:///tmp/w/autothrottle-0.1.0-py3-none-any.whl"


@pytest.mark.parametrize(
    ("direct_url", "package", "command"),
    [
        # pip install /tmp/w/autothrottle-0.1.0-py3-none-any.whl: the index has no such package.
        (
            json.dumps({"url": WHEEL, "archive_info": {}}),
            HERE,
            f'pip install "autothrottle[cli,plot] @ {WHEEL}"',
        ),
        # pip install git+https://github.com/o/autothrottle@v1
        (
            json.dumps(
                {
                    "url": "https://github.com/o/autothrottle",
                    "vcs_info": {"vcs": "git", "requested_revision": "v1", "commit_id": "ab"},
                }
            ),
            HERE,
            'pip install "autothrottle[cli,plot] @ git+https://github.com/o/autothrottle@v1"',
        ),
        # A path a shell would expand inside double quotes: single quotes.
        (
            json.dumps({"url": "file:///tmp/$HOME/a.whl", "archive_info": {}}),
            HERE,
            "pip install 'autothrottle[cli,plot] @ file:///tmp/$HOME/a.whl'",
        ),
        (None, HERE, 'pip install "autothrottle[cli,plot]"'),  # from an index
        ("not json", HERE, 'pip install "autothrottle[cli,plot]"'),
        # Metadata of another copy of the package, earlier on the path: not this one's source.
        (
            json.dumps({"url": WHEEL}),
            Path("/elsewhere/autothrottle"),
            'pip install "autothrottle[cli,plot]"',
        ),
    ],
)
def test_an_installed_package_names_the_file_or_url_it_came_from(
    monkeypatch: pytest.MonkeyPatch, direct_url: str | None, package: Path, command: str
) -> None:
    monkeypatch.setattr(_extras, "_checkout", lambda: None)
    monkeypatch.setattr(
        "autothrottle._extras.metadata.distribution", lambda name: _Dist(direct_url, package)
    )
    assert _extras.install_command("cli,plot") == command


def _replay(*args: str) -> str:
    """What a virtual-clock replay of ``benchmarks/`` prints: the same on any machine."""
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout


def test_docs_recoverys_replayed_figures_are_what_the_replays_print_today() -> None:
    """docs/recovery.md states the replays' figures as rerunnable by anyone, so they must be
    what the replays print, and the page must still say them."""
    page = " ".join((DOCS / "recovery.md").read_text().split())
    slow = _replay("benchmarks/slow_replay.py")
    assert "60 s: 1.00 refusals a host" in slow
    assert "300 s: 1.20 refusals a host" in slow
    assert "goodput 98.8% of the rate" in slow
    assert "1.0 and 1.2 now, at 98.8 % of the host's rate" in page
    assert "back in 161 s" in slow
    assert "(it comes back in 161 s there" in page
    for burst in ("3", "5"):
        burst_slow = _replay("benchmarks/slow_replay.py", "--burst", burst)
        assert "60 s: 2.00 refusals a host" in burst_slow
    assert "2 refusals a host in 60 s at a burst of 3 or 5" in page
    rate = _replay("benchmarks/rate_replay.py", "--quiet").splitlines()[-1]
    assert rate.startswith("mean: 9.44/s,"), rate
    assert "6.0 pages in the first 2 s, 9.90/s after" in rate
    assert "9.43/s after, 9.68/s → 9.89/s from the second second on" in page
    assert "as of the gap its request kept, above, 9.44/s, 9.90/s" in page
    assert "6 pages in the first two seconds" in page
