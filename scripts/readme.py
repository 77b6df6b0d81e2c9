"""Keep the README's demo sample true to a real run of the current code.

``python scripts/readme.py`` (or ``nox -s readme``) runs ``autothrottle demo``
and checks that the sample pasted in README.md and docs/cli.md gives the same
verdict word for every site ("found the pace", "too cautious", ...); it fails
with the difference otherwise. ``--write`` pastes the new run's verdict lines
(and the summary table, in docs/cli.md) in place of the old ones.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITES = ("slow origin", "rate-limited API", "CAPTCHA wall", "CDN", "mixed pages")
VERDICT = re.compile(r"^(" + "|".join(map(re.escape, SITES)) + r")\s+([a-z ]+?):", re.M)


def run_demo() -> str:
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [sys.executable, "-m", "autothrottle", "demo", "--no-live", "--out", f"{folder}/c.png"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "COLUMNS": "200"},
        )
    return done.stdout


def verdicts(text: str) -> dict[str, str]:
    return dict(VERDICT.findall(text))


def block(text: str, table: bool) -> str:
    """The demo's closing lines: from the summary table (``table``) or from the
    first verdict, through the verdict words' definitions."""
    lines = [line.rstrip() for line in text.splitlines()]
    if table:
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("after "))
    else:
        start = next(i for i, line in enumerate(lines) if line.startswith("slow origin "))
    ends = (i for i, line in enumerate(lines) if line.startswith("pushed too hard"))
    end = next(i for i in ends if i > start)
    return "\n".join(lines[start : end + 1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="paste the new run's sample")
    args = parser.parse_args()
    output = run_demo()
    found = verdicts(output)
    status = 0
    for name in ("README.md", "docs/cli.md"):
        path = ROOT / name
        text = path.read_text()
        shown = verdicts(text)
        if args.write:
            table = name != "README.md"
            old = block(text, table)
            path.write_text(text.replace(old, block(output, table)))
            print(f"{name}: pasted the new run")
        elif shown != found:
            status = 1
            print(f"{name}: the sample says {shown}, a run now says {found}")
        else:
            print(f"{name}: the sample's verdicts match a run now")
    return status


if __name__ == "__main__":
    sys.exit(main())
