"""Would a compiled usual path make a request almost free? A probe, not a build.

Copies ``src/autothrottle`` to a scratch directory, compiles the modules of a
request's usual path there with mypyc (it ships with mypy), and prints the
``PYTHONPATH`` that runs the compiled copy; nothing in ``src/`` or in the
package's build changes. With ``--count`` it also runs the instruction count
of ``benchmarks/overhead.py`` against the compiled copy::

    python scripts/mypyc_probe.py --count --clients aiohttp
    PYTHONPATH=/tmp/autothrottle-mypyc python benchmarks/overhead.py --instructions
    PYTHONPATH=/tmp/autothrottle-mypyc python benchmarks/overhead.py   # by the clock

It checks that each compiled module imports from its extension module with
that ``PYTHONPATH`` (an editable install's finder would otherwise win).

What the copy changes before compiling (mypyc's rules, not the engine's):
``object.__new__`` of a compiled class is refused, so the lease (made that
way on every grant) and the free turn's exchange (``free_exchange``) are made
by calling their classes; the two frozen dataclasses
made that way (the policy's sample, ``ThrottleInfo``) stay interpreted
classes, since a compiled one's ``__init__`` goes through
``object.__setattr__`` (8k instructions a sample), and so do ``SlotState``
and ``Throttle``, whose class attributes are descriptors mypyc drops, and
``Watch``, a subclass of ``weakref.ref`` that mypyc compiles without a
word but whose native layout crashes the interpreter in the collector (a
segmentation fault in the adapters' tests); their methods are compiled
still. Even so the hold's collection callback fails compiled (the watch
has no ``lease`` in it: a lease whose owner was collected is not
released), so the copy times and counts the usual path, not the holds'; an
attribute deleted is declared deletable; and the classes users or
interpreted modules subclass (the policies, the adapters' plugs) allow it.
Everything else is compiled as written. ``aiohttp.py`` itself stays
interpreted: mypyc refuses its session factory's nested classes.

Needs a C compiler and the Python headers (mypyc builds the extension
modules in place, about a minute).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODULES = [
    "_gate",
    "_wire",
    "_lease",
    "_turns",
    "_slot",
    "_counters",
    "_recovery",
    "_cache",
    "_pace",
    "_policies",
    "_policy",
    "_table",
    "_throttle",
    "_exchange",
    "_hold",
    "_request",
    "_state",
    "_arrivals",
    "_tokens",
    "_aiohttp_parts",
]
"""The modules a request's usual path runs through (``overhead.py --bytecodes``)."""

PATCHES = {
    "_lease.py": [  # object.__new__ of a compiled class is refused: call the class
        (
            r"    lease: Lease = _new_object\(Lease\)\n.*?    return lease\n",
            "    return Lease(live, reporter, sent_at, sent_at + expiry, adjust)\n",
        ),
    ],
    "_exchange.py": [
        (  # a compiled class's attribute is deleted only if it says so
            r"    wire_error: Exception\n",
            '    wire_error: Exception\n    __deletable__ = ["wire_error"]\n',
        ),
        (  # the free turn's exchange, made by object.__new__ too: call the class
            r"    exchange: Exchange = _new_object\(Exchange\)\n.*?    return exchange\n",
            "    return Exchange(lease, asked, key, True)\n",
        ),
    ],
}
"""Per file: what mypyc refuses, and what it takes instead (one place each)."""

INTERPRETED = {
    "_policy.py": ["Sample"],
    "_exchange.py": ["ThrottleInfo"],
    "_hold.py": ["Watch"],
    "_state.py": ["SlotState"],
    "_throttle.py": ["Throttle"],
}
"""Classes that stay interpreted: the frozen dataclasses made by ``object.__new__``
and their fields' setters (as native classes, their ``__init__`` runs through
``object.__setattr__``, 8k instructions a sample), the classes whose
class attributes are descriptors mypyc would drop (the state record's flat
fields, the throttle's settings), and the response's hold, a ``weakref.ref``
subclass that crashes as a native class."""

SUBCLASSED = {
    "_policy.py": ["DelayPolicy"],
    "_policies.py": [
        "AutoThrottlePolicy",
        "FixedDelayPolicy",
        "FixedRatePolicy",
        "AIMDPolicy",
        "AdaptiveConcurrencyPolicy",
    ],
    "_exchange.py": ["Plug"],
}
"""Classes that interpreted code subclasses (a user's policy, an adapter's plug)."""


def _prepare(tree: Path) -> None:
    """Copy the package into ``tree`` and make the changes mypyc needs."""
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(ROOT / "src" / "autothrottle", tree / "autothrottle")
    package = tree / "autothrottle"
    for name, patches in PATCHES.items():
        path = package / name
        text = path.read_text()
        for pattern, replacement in patches:
            text, count = re.subn(pattern, replacement, text, flags=re.DOTALL)
            if count != 1:
                raise SystemExit(f"{name}: {pattern!r} not found")
        path.write_text(text)
    decorators = {
        "native_class=False": INTERPRETED,
        "allow_interpreted_subclasses=True": SUBCLASSED,
    }
    for name in sorted({*INTERPRETED, *SUBCLASSED}):
        path = package / name
        text = path.read_text().replace(
            "from __future__ import annotations\n",
            "from __future__ import annotations\n\nfrom mypy_extensions import mypyc_attr\n",
            1,
        )
        for attribute, classes in decorators.items():
            for cls in classes.get(name, ()):
                text, count = re.subn(
                    rf"^(@dataclass\(.*\)\n)?class {cls}\b",
                    rf"@mypyc_attr({attribute})\n\1class {cls}",
                    text,
                    flags=re.MULTILINE,
                )
                if count != 1:
                    raise SystemExit(f"{name}: class {cls} not found")
        path.write_text(text)


def _compile(tree: Path, modules: list[str]) -> None:
    files = [f"autothrottle/{module}.py" for module in modules]
    done = subprocess.run(
        [sys.executable, "-m", "mypyc", *files], cwd=tree, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"mypyc failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    built = sorted(p.name for p in (tree / "autothrottle").glob("*.so"))
    print(f"compiled {len(built)} modules in {tree}: {' '.join(modules)}")
    _check(tree, modules)


def _check(tree: Path, modules: list[str]) -> None:
    """Refuse a copy whose modules would not run compiled: with ``PYTHONPATH``
    at the copy, each must import from its extension module, not from ``src``
    (an editable install's finder) or the ``.py`` beside it."""
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    print(importlib.import_module('autothrottle.' + name).__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *modules],
        env=dict(os.environ, PYTHONPATH=str(tree)),
        capture_output=True,
        text=True,
        check=True,
    )
    files = done.stdout.split()
    interpreted = [f for f in files if not (f.startswith(str(tree)) and f.endswith(".so"))]
    if interpreted:
        raise SystemExit(f"not running compiled: {' '.join(interpreted)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default="/tmp/autothrottle-mypyc", help="scratch directory")
    parser.add_argument("--modules", default=" ".join(MODULES), help="modules to compile")
    parser.add_argument("--count", action="store_true", help="then run overhead.py --instructions")
    parser.add_argument("--clients", default="aiohttp", help="for --count (aiohttp,httpx)")
    parser.add_argument("--policy", default="adaptive", help="for --count")
    args = parser.parse_args()
    tree = Path(args.tree).resolve()
    _prepare(tree)
    _compile(tree, args.modules.split())
    print(f"run the compiled copy with PYTHONPATH={tree}")
    if args.count:
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
        command = [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--instructions"]
        command += ["--clients", args.clients, "--policy", args.policy]
        subprocess.run(command, env=env, check=True)


if __name__ == "__main__":
    main()
