"""Generate the sync httpx adapter and the whole httpx2 adapter from one source.

``python scripts/unasync.py`` writes the generated modules; ``--check`` fails
(exit 1, naming the files) when one differs from what would be written, which
``tests/test_generated.py`` runs. What is generated from what:

* ``_httpx/_sync.py`` from ``_httpx/_async.py``: ``async``/``await`` dropped,
  async names turned into their sync twins (``AsyncClient`` -> ``Client``,
  ``aclose`` -> ``close``, ``acquire(`` -> ``acquire_blocking(`` ...). A line
  whose sync form differs otherwise ends in ``# unasync: CODE`` (the sync
  line's code) or ``# unasync: -`` (no such line in the sync module).
* ``httpx2.py`` and ``_httpx2/*`` from ``httpx.py`` and ``_httpx/*``: the
  ``httpx`` and ``httpcore`` packages renamed ``httpx2`` and ``httpcore2``
  (pydantic's fork keeps httpx's API under new names).

Each generated module has its imports sorted and is formatted by ruff, as
the sources are. The rules
are plain regular expressions, as httpcore's own unasync script uses.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "autothrottle"

SYNC_RULES = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\baclose\b", "close"),
    (r"\baread\b", "read"),
    (r"\bhandle_async_request\b", "handle_request"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncByteStream\b", "SyncByteStream"),
    (r"\b_AsyncClientOptions\b", "_SyncClientOptions"),
    (r"\.acquire\(", ".acquire_blocking("),
    (r"\.on_wire\(", ".on_wire_blocking("),
    (r"\.lend_unlocked\(", ".lend("),  # the sync client's pools are shared by threads
    (r"\bpaced\b", "paced_blocking"),
    (r"Wait for the slot's turn", "Block for the slot's turn"),
    (r"\ban (\S*?)Async([A-Z])", r"a \1\2"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\bThe async httpx adapter\b", "The sync httpx adapter"),
]

HTTPX2_RULES = [
    (r"\bhttpx\b", "httpx2"),
    (r"\bhttpcore\b", "httpcore2"),
    (r"\b_httpx\b", "_httpx2"),
]

_MARKER = re.compile(r"^(?P<indent>\s*)(?P<code>.*?)\s+# unasync: (?P<sync>.*)$")

HEADER = "# Generated from {source} by scripts/unasync.py: edit that file and rerun.\n"


def _substitute(text: str, rules: list[tuple[str, str]]) -> str:
    for pattern, replacement in rules:
        text = re.sub(pattern, replacement, text)
    return text


def to_sync(text: str) -> str:
    """The sync module from the async one."""
    lines = []
    for line in text.splitlines():
        marked = _MARKER.match(line)
        if marked is None:
            lines.append(_substitute(line, SYNC_RULES))
        elif marked["sync"].strip() != "-":
            lines.append(marked["indent"] + marked["sync"].strip())
    return "\n".join(lines) + "\n"


def drop_markers(text: str) -> str:
    """The async source without its ``# unasync:`` notes (for a generated async module)."""
    return (
        "\n".join(
            line if (m := _MARKER.match(line)) is None else m["indent"] + m["code"]
            for line in text.splitlines()
        )
        + "\n"
    )


def to_httpx2(text: str) -> str:
    return _substitute(text, HTTPX2_RULES)


def _plan() -> list[tuple[Path, Path, Callable[[str], str]]]:
    """(source, target, transform) for every generated module, in order."""
    httpx, httpx2 = PACKAGE / "_httpx", PACKAGE / "_httpx2"
    return [
        (httpx / "_async.py", httpx / "_sync.py", to_sync),
        (PACKAGE / "httpx.py", PACKAGE / "httpx2.py", to_httpx2),
        (httpx / "__init__.py", httpx2 / "__init__.py", to_httpx2),
        (httpx / "_common.py", httpx2 / "_common.py", to_httpx2),
        (httpx / "_pools.py", httpx2 / "_pools.py", to_httpx2),
        (httpx / "_async.py", httpx2 / "_async.py", lambda t: to_httpx2(drop_markers(t))),
        (httpx / "_async.py", httpx2 / "_sync.py", lambda t: to_httpx2(to_sync(t))),
    ]


def _ruff(text: str, target: Path, *command: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "--stdin-filename", str(target), "-"],
        input=text,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return result.stdout


def _format(text: str, target: Path) -> str:
    """Imports sorted and the code formatted, as ruff leaves the sources."""
    sorted_imports = _ruff(text, target, "check", "--select", "I", "--fix", "--exit-zero", "-q")
    return _ruff(sorted_imports, target, "format")


def generated() -> dict[Path, str]:
    """Every generated module's path and the text it must have."""
    out = {}
    for source, target, transform in _plan():
        text = source.read_text()
        name = source.relative_to(PACKAGE).as_posix()
        body = transform(text)
        if body.startswith("# Generated from"):
            body = body.split("\n", 1)[1]
        out[target] = _format(HEADER.format(source=name) + body, target)
    return out


def stale() -> list[Path]:
    """The generated modules that differ from what would be written."""
    return [
        path for path, text in generated().items() if not path.exists() or path.read_text() != text
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a generated file is stale")
    args = parser.parse_args()
    if args.check:
        old = stale()
        for path in old:
            print(f"stale: {path.relative_to(ROOT)} (run python scripts/unasync.py)")
        return 1 if old else 0
    for path, text in generated().items():
        path.parent.mkdir(exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
