"""The ``autothrottle`` command line: ``demo``, ``fetch``, ``plot``, ``sim`` and ``--version``.

The heavy imports (rich, matplotlib, the clients, the simulator) happen only
once a subcommand has been chosen, so ``--help`` and ``--version`` stay fast
and work without the ``cli`` extra; ``sim --help`` works without the ``sim``
extra too (its parser is :mod:`autothrottle._sim_args`, the standard library's).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import sys
from collections.abc import Sequence

from autothrottle import __version__
from autothrottle._argv import OneLineParser
from autothrottle._extras import missing_extra
from autothrottle._sim_args import help_without_sim

from ._fetch_options import add_fetch_arguments, seconds_arg
from ._paths import folder_problem, input_problem, output_problem, overwrite_problem

__all__ = ["build_parser", "main"]

PROG = "autothrottle"

#: ``autothrottle demo`` defaults: long enough to watch every host settle.
DEFAULT_DURATION = 30.0
DEFAULT_OUT = "autothrottle-demo.png"

#: What each subcommand imports, and the extra that installs it.
_NEEDS: dict[str, tuple[tuple[str, ...], str]] = {
    "demo": (("rich", "httpx", "aiohttp", "matplotlib"), "cli,plot"),
    "fetch": (("rich", "httpx", "aiohttp", "protego"), "cli"),
    "plot": (("matplotlib",), "plot"),
    "sim": (("aiohttp",), "sim"),
}
_DEMO_EXTRAS = " and ".join(_NEEDS["demo"][1].split(","))
#: A fetch that draws a chart needs the plot extra too.
_CHART = (("matplotlib",), "cli,plot")


def _duration(text: str) -> float:
    return seconds_arg(text, 3600)


def _top(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be an int in [1, 1000], got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of :func:`main` (``sim``'s own options are the simulator's).

    No flag may be abbreviated: the fetch's flags share long prefixes, and
    ``--retry 3`` taken as ``--retry-after`` (not ``--retries``) is worse than an
    error that names the flag meant."""
    parser = OneLineParser(
        prog=PROG,
        allow_abbrev=False,
        description="Polite, adaptive per-host request pacing for httpx, aiohttp, requests and "
        "Scrapy.",
        epilog=f"Start with `autothrottle demo`: with the {_DEMO_EXTRAS} extras installed, "
        "it needs nothing but this machine.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        allow_abbrev=False,
        help="watch autothrottle find the pace of five simulated sites (loopback only)",
        description=(
            "Start five simulated sites on loopback (127.0.0.2 ... 127.0.0.6), each with its "
            "own behaviour (a slow origin, a rate-limited API, a CAPTCHA wall, a CDN, a site "
            "with slow and fast pages), crawl them through one Throttle with httpx and "
            "aiohttp, show each host's pace live, then print a summary judged by the sites' "
            "own counts and save a chart as PNG. Nothing leaves the machine."
        ),
    )
    demo.add_argument(
        "--duration",
        type=_duration,
        default=DEFAULT_DURATION,
        metavar="SECONDS",
        help=f"how long to crawl (default: {DEFAULT_DURATION:g})",
    )
    demo.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="PNG",
        help=f"where to save the chart (default: ./{DEFAULT_OUT})",
    )
    demo.add_argument(
        "--no-live",
        action="store_true",
        help="print a progress line every few seconds instead of the live table "
        "(automatic when the output is not a terminal)",
    )
    demo.add_argument(
        "--seed", type=int, default=None, help="seed the sites' randomness, for repeatable runs"
    )
    _add_fetch_and_plot(commands)
    commands.add_parser(
        "sim",
        add_help=False,
        help="serve simulated sites on loopback to test any crawler "
        "(`autothrottle sim --help` for its options)",
    )
    return parser


def _add_fetch_and_plot(commands: argparse._SubParsersAction[OneLineParser]) -> None:
    fetch = commands.add_parser(
        "fetch",
        allow_abbrev=False,
        help="fetch a list of URLs politely, each host at its own pace, all at once",
        description=(
            "Fetch every URL of URLS_FILE through one Throttle: each host at the pace it "
            "allows, all hosts at once, each host's robots.txt obeyed. Writes one JSON line "
            "per URL (url, final_url, status, bytes, seconds, slot, attempts, blocked, "
            "excluded, error); a rerun with the same --out file skips the URLs done. Ctrl-C "
            "stops taking URLs and keeps every finished line."
        ),
        epilog=(
            "exit status: 0 every URL answered (or excluded by robots.txt); 1 some URL ended "
            "in an error (its line says which); 2 a bad flag or path; 3 the output could not "
            "be written; 130/143 stopped by SIGINT/SIGTERM (run it again to go on). "
            "Example: autothrottle fetch urls.txt -o out.jsonl --start-delay 0.5 --chart c.png"
        ),
    )
    add_fetch_arguments(fetch)
    plot = commands.add_parser(
        "plot",
        allow_abbrev=False,
        help="draw a timeline file (fetch --timeline, Timeline(jsonl=...)) as the demo's chart",
        description="Draw the chart the demo draws, from a timeline JSON-lines file.",
    )
    plot.add_argument("timeline", metavar="TIMELINE.jsonl", help="the timeline file")
    plot.add_argument("-o", "--out", required=True, metavar="PNG", help="where to save the chart")
    plot.add_argument(
        "--top",
        type=_top,
        default=8,
        metavar="N",
        help="draw the N slots with the most responses (default: 8)",
    )
    plot.add_argument("--title", default=None, help="a title for the chart")


def _missing(modules: Sequence[str]) -> list[str]:
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def _check_extra(command: str, needs: tuple[tuple[str, ...], str] | None = None) -> str | None:
    """An error message if ``command`` cannot run for lack of its extra, else None."""
    modules, extra = needs or _NEEDS[command]
    missing = _missing(modules)
    if not missing:
        return None
    return missing_extra(f"{PROG} {command}", missing, extra)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``autothrottle`` command; returns the exit status.

    ``autothrottle sim ...`` hands everything after ``sim`` to
    :func:`autothrottle.sim.main` unchanged.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["sim"]:
        problem = _check_extra("sim")
        if problem:
            # The options can be read before the extra is installed; a run cannot.
            sim_help = help_without_sim(args[1:], f"{PROG} sim", problem)
            if sim_help is not None:
                sys.stdout.write(sim_help)
                return 0
            print(problem, file=sys.stderr)
            return 1
        from autothrottle.sim import main as sim_main

        return sim_main(args[1:], prog=f"{PROG} sim")

    parser = build_parser()
    ns, unknown = parser.parse_known_args(args)
    if unknown:
        command = f"{PROG} {ns.command}" if ns.command else PROG
        parser.exit(2, f"{command}: error: {_unknown(parser, ns.command, unknown)}\n")
    if ns.command is None:
        parser.print_help()
        return 2
    problem = _check_extra(ns.command)
    if problem is None and ns.command == "fetch" and ns.chart is not None:
        problem = _check_extra("fetch --chart", _CHART)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    run = {"demo": _demo, "fetch": _fetch, "plot": _plot}[ns.command]
    try:
        return run(ns, parser)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


#: wget's flags a fetch user may reach for, and what the fetch has instead.
_WGET = {
    "-O": "the lines go to -o (- for stdout), the bodies to --bodies DIR",
    "--output-document": "the lines go to -o (- for stdout), the bodies to --bodies DIR",
    "-t": "wget's -t N is --retries N-1 here",
    "--tries": "wget's --tries N is --retries N-1 here",
    "-U": "wget's -U is --user-agent here",
    "-c": "a fetch resumes by itself: run it again with the same -o",
    "--continue": "a fetch resumes by itself: run it again with the same -o",
    "-nc": "bodies (--bodies DIR) are named by their SHA-256: none is overwritten",
    "--no-clobber": "bodies (--bodies DIR) are named by their SHA-256: none is overwritten",
}


def _unknown(parser: argparse.ArgumentParser, command: str | None, unknown: list[str]) -> str:
    """argparse's "unrecognized arguments", said by the command they were given to
    (argparse has the top-level ``autothrottle`` say it, whose ``--help`` lists
    none of a subcommand's flags), with the flag meant when one is near, or,
    for a flag of wget's given to ``fetch``, what the fetch has instead."""
    wget = next((_WGET[a.partition("=")[0]] for a in unknown if a.partition("=")[0] in _WGET), "")
    if command == "fetch" and wget:
        return f"unrecognized arguments: {' '.join(unknown)} ({wget}; see --help)"
    typo = next((arg for arg in unknown if arg.startswith("--")), "")
    flags = _flags(parser, command)
    near = difflib.get_close_matches(typo.partition("=")[0], flags, n=1, cutoff=0.75)
    hint = f"did you mean {near[0]}? " if typo and near else ""
    return f"unrecognized arguments: {' '.join(unknown)} ({hint}see --help)"


def _flags(parser: argparse.ArgumentParser, command: str | None) -> list[str]:
    """The flags of subcommand ``command``, or of ``parser`` itself for None."""
    actions = parser._actions  # noqa: SLF001 (argparse lists a parser's flags nowhere public)
    for action in actions:
        choices = action.choices
        if command is not None and isinstance(choices, dict) and command in choices:
            return _flags(choices[command], None)
    return [flag for action in actions for flag in action.option_strings]


def _fail(parser: argparse.ArgumentParser, command: str, problem: str | None) -> None:
    """Exit with status 2 and one line if there is a ``problem``."""
    if problem is not None:
        parser.exit(2, f"{PROG} {command}: error: {problem}\n")


def _demo(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _fail(parser, "demo", output_problem("--out", ns.out))
    from ._demo import run

    try:
        return run(duration=ns.duration, out=ns.out, live=not ns.no_live, seed=ns.seed)
    except ValueError as exc:
        parser.exit(2, f"{PROG} demo: error: {exc}\n")


def _fetch(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from autothrottle import Throttle

    from ._fetch_options import SETTINGS, job_from_args, throttle_kwargs

    _fail(parser, "fetch", input_problem("URLS_FILE", ns.urls))
    for flag in ("out", "chart", "timeline", "summary_json"):
        path, name = getattr(ns, flag), "--" + flag.replace("_", "-")
        _fail(parser, "fetch", output_problem(name, path))
        _fail(parser, "fetch", overwrite_problem(name, path, "URLS_FILE", ns.urls))
    _fail(parser, "fetch", folder_problem("--bodies", ns.bodies))
    try:
        throttle = Throttle(**throttle_kwargs(ns))
    except (TypeError, ValueError) as exc:
        named = [name for name in SETTINGS if name in str(exc)] or ["policy"]
        flag = "--" + max(named, key=len).replace("_", "-")
        _fail(parser, "fetch", f"argument {flag}: {exc}")
        raise  # pragma: no cover - _fail exits
    from ._fetch import run

    return run(job_from_args(ns), throttle)


def _plot(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from autothrottle.timeline import Timeline

    _fail(parser, "plot", input_problem("TIMELINE.jsonl", ns.timeline))
    _fail(parser, "plot", output_problem("--out", ns.out))
    try:
        timeline = Timeline.read_jsonl(ns.timeline)
        keys = timeline.busiest(ns.top)
        timeline.plot(ns.out, title=ns.title, keys=keys)
    except (OSError, ValueError) as exc:
        parser.exit(2, f"{PROG} plot: error: {exc}{_fetch_lines_hint(ns.timeline)}\n")
    print(f"chart saved to {ns.out}")
    return 0


def _fetch_lines_hint(path: str) -> str:
    """What to say when ``path`` holds the fetch's lines (``-o``), the likeliest file
    given in place of its timeline (``--timeline``): nothing otherwise."""
    try:
        with open(path, encoding="utf-8") as fh:
            first = json.loads(fh.readline(64 * 1024))
    except (OSError, ValueError):
        return ""
    if not isinstance(first, dict) or "url" not in first:
        return ""
    return (
        "; it holds the lines of `autothrottle fetch -o`: the timeline is the file "
        "`autothrottle fetch --timeline FILE.jsonl` writes"
    )
