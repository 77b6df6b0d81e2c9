"""Mutation-test the engine: would its tests notice a broken rule?

For each module named (by default the estimators of ``docs/architecture.md``:
``_pace``, ``_limits``, ``_tokens``, ``_recovery``, ``_cache``, ``_counters``,
``_arrivals``; ``ENGINE`` names the rest run by hand: ``_rules``, the gate
``_gate``, ``_lease``, ``_turns``, ``_policies``, ``_wire``, ``_slot``), copies
``src/``, ``tests/`` and ``pyproject.toml`` to ``build/mutants/<module>``
(nothing in the work tree changes), has mutmut make every small change it
knows to that one module (a ``<`` for a ``<=``, a
constant off by one, a call dropped ...) and runs, for each change, the fast
tests that reach the function it changed (``FAST``: injected clocks, no
real-time waits; mutmut's first pass finds which test reaches which function).
A mutant no test fails on *survived*: either no behaviour can tell it from
the code (an equivalent mutant) or a rule goes unasserted. Prints one line a
module (mutants, killed, survived, other, seconds) and every survivor::

    nox -s mutants                          # every estimator, about ten minutes
    nox -s mutants -- _pace _limits         # some of them
    python scripts/mutants.py --show _pace  # with each survivor's diff
    nox -s mutants -- _gate                 # the gate: 25 min at load 3-6
    nox -s mutants -- _rules --only 'Rules.fail' 'Rules.backoff'   # some functions
    nox -s mutants -- _headers._ietf        # a module in a package (or _headers/_ietf.py)
    nox -s mutants -- _headers              # each of the package's modules (``HEADERS``)
    nox -s mutants -- _headers._llm --fresh # each survivor again, in a fresh process

mutmut runs a module's mutants in the order of the time the tests that reach
each one's function take, so a run stopped early leaves the functions the most
tests reach (``Rules.__init__``, ``Rules.observe``): ``--only`` runs those.

mutmut skips a decorated function (but a static or class method), so for a
module named in ``DECORATED`` the scratch copy takes that decorator off each
method it wraps and applies it after the class (``Rules.fail =
_under_slot_lock(Rules.fail)``): the same wrapped method at run time, which
mutmut now mutates as any other. Nothing in the work tree changes.

mutmut forks each mutant's worker from a process that has imported the module
and run the tests: a function called at import (``_llm._anthropic``) runs
unmutated, so all its mutants survive unrun, and a test of a global cache finds
what the earlier runs left there. ``--fresh`` runs each survivor again in a
fresh pytest process (:func:`_fresh`).

The scratch copy is the work tree as it is when the module's run starts: a
mutant applied by hand in ``src/`` then is in the copy too (and fails the run's
first, clean pass if a test notices it).

The counts of the last runs and each survivor's verdict (equivalent, and
why) are in ``docs/mutants.md``.

Needs ``mutmut`` (``nox -s mutants`` installs the version it was written
for). The listed modules must stay importable from ``src/autothrottle``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ESTIMATORS = ("_pace", "_limits", "_tokens", "_recovery", "_cache", "_counters", "_arrivals")
ENGINE = ("_rules", "_gate", "_lease", "_turns", "_policies", "_wire", "_slot")
#: The header dialects, a package: a module in it is named with its package
#: (``_headers._retry_after``, or as a path, ``_headers/_retry_after.py``), and
#: the package's name alone (``_headers``) runs each of these in turn.
HEADERS = (
    "_headers._retry_after",
    "_headers._values",
    "_headers._ietf",
    "_headers._budget",
    "_headers._fields",
    "_headers._cache",
    "_headers._llm",
    "_headers._names",
    "_headers._vendors",
    "_headers",
)
PACKAGE = ROOT / "src" / "autothrottle"
#: The tests that reach the estimators and the engine, directly or through the
#: rules and the gate, with an injected clock (a FakeClock, looptime's loop):
#: seconds each, not minutes. No loopback server: a real-time test would be
#: slow under the run's load and could fail where no mutant broke anything.
FAST = (
    "test_pace",
    "test_limits",
    "test_recovery",
    "test_cache",
    "test_arrivals",
    "test_token_budgets",
    "test_token_wire_order",
    "test_plain_response",
    "test_pacing_rules",
    "test_algorithm",
    "test_scheduling",
    "test_signals",
    "test_state",
    "test_stats",
    "test_spare",
    "test_windows",
    "test_counters_rules",
    "test_cache_rules",
    "test_stated_pace_rules",
    "test_recovery_rules",
    "test_debug_log",
    "test_lease_finish",
    "test_lag",
    "test_defaults",
    "test_policies",
    "test_header_dialects",
    "test_headers",
    "test_header_rules",
    "test_rate_header_styles",
    "test_set_host",
    "test_hosts",
    "test_gate_rules",
    "test_rules_edges",
    "test_rules_locked",
    "test_turns_rules",
    "test_wire_rules",
    "test_slot_rules",
    "test_fast_grant",
    "test_skeleton",
)
#: Tests left out. mutmut runs the tests twice in one process (to map them,
#: then clean), so a test that changes its own parameters fails the second
#: time: fix such a test rather than list it here.
DESELECT: tuple[str, ...] = ()
#: Per module, the decorator mutmut would skip the methods of, and their class:
#: the scratch copy applies it after the class instead (:func:`_undecorate`).
DECORATED = {"_rules": ("_under_slot_lock", "Rules")}
#: Wall-clock seconds a test may run before pytest's faulthandler ends the
#: worker with exit 1 (killed): a mutant that makes a wait unbounded blocks
#: without using the CPU, which mutmut's own limit (CPU seconds) never ends.
#: The slowest fast test takes 15 s quiet.
HANG = 120
#: mutmut's exit codes (its ``stats.py``): 1 and 3 a test failed, 0 none did.
KILLED = {1, 3}
SURVIVED = {0}
#: pytest's exit codes, run by ``--fresh``: a test failed (1), the tests could
#: not be collected (2: the mutant broke the import), pytest's internal error (3).
KILLED_FRESH = {1, 2, 3}


def _source(module: str) -> Path:
    """The file of ``module`` (a dotted name under ``autothrottle``), relative to
    the root: ``src/autothrottle/_headers/_ietf.py``; a package's ``__init__.py``."""
    path = PACKAGE.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return path.relative_to(ROOT)


def _modules(names: list[str]) -> list[str]:
    """Each name as a dotted module under ``autothrottle``: ``_gate``,
    ``_headers._ietf``, ``_headers/_ietf.py``, ``src/autothrottle/_headers/_ietf.py``
    or ``autothrottle._headers._ietf`` all name one module. ``_headers`` (a
    package) names each of its modules (:data:`HEADERS`); ``_headers.__init__``
    its ``__init__.py`` alone."""
    out: list[str] = []
    for name in names:
        dotted = name.removesuffix(".py").replace("/", ".").replace("\\", ".")
        dotted = dotted.removeprefix("src.").removeprefix("autothrottle.")
        if dotted == "_headers":
            out.extend(HEADERS)
            continue
        dotted = dotted.removesuffix(".__init__")
        if not (ROOT / _source(dotted)).is_file():
            sys.exit(f"{name}: no module {PACKAGE.name}.{dotted} in {PACKAGE.relative_to(ROOT)}")
        out.append(dotted)
    return out


def _config(module: str, tests: list[str]) -> str:
    """The ``setup.cfg`` section that points mutmut at one module and the tests."""
    lines = [
        "[mutmut]",
        "source_paths = src",
        f"only_mutate = {_source(module).as_posix()}",
        "pytest_add_cli_args_test_selection =",
        *(f"    {t}" for t in tests),
        # The copy's own tests only; xdist off: mutmut forks its own workers. One
        # argument a line (mutmut passes each line as one): "-p x -p y" on one
        # line would reach pytest as a single "-p" naming no plugin it knows.
        "pytest_add_cli_args =",
        "    -pno:cacheprovider",
        "    -pno:xdist",
        f"    -ofaulthandler_timeout={HANG}",
        "    -ofaulthandler_exit_on_timeout=true",
        *(f"    --deselect={t}" for t in DESELECT),
    ]
    return "\n".join(lines) + "\n"


def _undecorate(path: Path, decorator: str, cls: str) -> list[str]:
    """Take ``@decorator`` off each method of ``cls`` in ``path`` and apply it
    after the module's last line instead: what runs is the same, but mutmut,
    which mutates no decorated function, now mutates these. Returns their names."""
    text = path.read_text()
    pattern = re.compile(rf"^([ \t]+)@{re.escape(decorator)}\n(\1def (\w+)\()", re.MULTILINE)
    names = [m.group(3) for m in pattern.finditer(text)]
    if not names:
        sys.exit(f"{path.name}: no method under @{decorator}: update DECORATED")
    text = pattern.sub(r"\2", text)
    text += f"\n\n# scripts/mutants.py: @{decorator} applied here, so that mutmut mutates these.\n"
    text += "".join(f"{cls}.{n} = {decorator}({cls}.{n})\n" for n in names)
    path.write_text(text)
    return names


def _patterns(module: str, only: list[str]) -> list[str]:
    """mutmut's names for the mutants of the functions in ``only`` (``Class.method``
    or ``function``): ``autothrottle._rules.xǁRulesǁfail__mutmut_3``, ``..._1``."""
    out = []
    for name in only:
        cls, _, func = name.rpartition(".")
        mangled = f"x\u01c1{cls}\u01c1{func}" if cls else f"x_{func}"
        out.append(f"autothrottle.{module}.{mangled}__mutmut_*")  # dotted: a package's too
    return out


def _fresh(scratch: Path, tests: list[str], name: str) -> bool:
    """Whether the tests fail on mutant ``name`` run in a fresh process.

    mutmut forks each mutant's worker from a process that has already imported
    the module and run the tests: a function called at import (one that builds
    a module's constants) ran unmutated, and a test of a module's global state
    (a cache) finds what the earlier runs left. A fresh pytest in the scratch
    copy's ``mutants/``, with ``MUTANT_UNDER_TEST`` set before the import, has
    neither; ``-x``: the first failure kills."""
    env = {**os.environ, "MUTANT_UNDER_TEST": name, "PYTHONPATH": "src"}
    args = ["-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    args += [f"-ofaulthandler_timeout={HANG}", "-ofaulthandler_exit_on_timeout=true"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args, *tests],
        cwd=scratch / "mutants",
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return done.returncode in KILLED_FRESH


def _run_one(
    module: str, tests: list[str], *, show: bool, workers: int, only: list[str], fresh: bool
) -> dict[str, object]:
    """Mutate ``module`` in a scratch copy, run mutmut there, count the verdicts."""
    scratch = ROOT / "build" / "mutants" / module
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    shutil.copytree(ROOT / "src", scratch / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", scratch / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", scratch / "pyproject.toml")
    (scratch / "setup.cfg").write_text(_config(module, tests))
    if module in DECORATED:
        decorator, cls = DECORATED[module]
        names = _undecorate(scratch / _source(module), decorator, cls)
        print(f"{module}: @{decorator} applied after the class to {', '.join(names)}", flush=True)
    patterns = _patterns(module, only)
    log = scratch / "mutmut.log"
    start = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(workers), *patterns],
            cwd=scratch,
            stdout=out,
            stderr=out,
            check=False,
        )
    source = _source(module)
    meta = scratch / "mutants" / source.with_name(source.name + ".meta")
    if done.returncode or not meta.exists():
        sys.exit(f"{module}: mutmut failed (exit {done.returncode}); see {log}")
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    if patterns:  # the others are listed too, not run
        codes = {k: c for k, c in codes.items() if any(fnmatch.fnmatch(k, p) for p in patterns)}
    survivors = sorted(k for k, c in codes.items() if c in SURVIVED)
    other = sorted(k for k, c in codes.items() if c not in SURVIVED | KILLED)
    killed_fresh = [k for k in survivors if _fresh(scratch, tests, k)] if fresh else []
    seconds = time.monotonic() - start
    result = {
        "module": module,
        "mutants": len(codes),
        "killed": sum(c in KILLED for c in codes.values()),
        "survived": len(survivors),
        "other": len(other),
        "seconds": round(seconds),
    }
    if fresh:
        result["killed_fresh"] = len(killed_fresh)
    print(
        f"{module:<10} mutants {result['mutants']:>4}  killed {result['killed']:>4}  "
        f"survived {result['survived']:>3}  other {result['other']:>3}  {seconds:>5.0f} s"
        + (f"  (of the survivors, killed fresh {len(killed_fresh)})" if fresh else ""),
        flush=True,
    )
    for name in survivors + other:
        verdict = "survived" if name in survivors else f"exit {codes[name]}"
        if name in killed_fresh:
            verdict += " (killed in a fresh process)"
        print(f"    {verdict}: {name}")
        if show:
            diff = subprocess.run(
                [sys.executable, "-m", "mutmut", "show", name],
                cwd=scratch,
                capture_output=True,
                text=True,
                check=False,
            )
            print("      " + diff.stdout.strip().replace("\n", "\n      "))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "modules",
        nargs="*",
        default=list(ESTIMATORS),
        help="e.g. _pace _limits; the engine: "
        + " ".join(ENGINE)
        + "; a header dialect: _headers._ietf (or _headers/_ietf.py); _headers: each",
    )
    parser.add_argument("--show", action="store_true", help="print each survivor's diff")
    parser.add_argument("--json", type=Path, help="also write the counts to this file")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="mutants run at once (mutmut's --max-children; default 1: the machine is shared)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="run each survivor again in a fresh pytest process (a function called at "
        "import, a test of a module's global state): slower, by a test run a survivor",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=[],
        metavar="FUNCTION",
        help="only these functions' mutants, e.g. Rules.fail Turns.take_blocking",
    )
    args = parser.parse_args()
    try:
        import mutmut  # noqa: F401
    except ImportError:
        sys.exit("needs mutmut: `nox -s mutants`, or `pip install mutmut==3.8.1`")
    tests = [f"tests/{name}.py" for name in FAST if (ROOT / "tests" / f"{name}.py").exists()]
    results = [
        _run_one(m, tests, show=args.show, workers=args.workers, only=args.only, fresh=args.fresh)
        for m in _modules(args.modules)
    ]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
