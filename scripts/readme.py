"""Keep the README's demo sample true to a real run of the current code.

``python scripts/readme.py`` (or ``nox -s readme``) runs ``autothrottle demo``
twice at the same time (two demos sharing the machine's cores, as a busy
machine would), and checks that the sample pasted in README.md and
docs/cli.md gives the same verdict word for every site ("found the pace",
"too cautious", ...) in both; it fails with the difference otherwise.
``--runs N`` repeats that N times and says how many runs matched (each demo's
verdict lines are printed, with their figures);
``--together 1`` runs one demo alone. ``--write`` pastes the first demo's
verdict lines (and the summary table, in docs/cli.md) in place of the old ones.
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


def run_demos(together: int) -> list[str]:
    """Run ``together`` demos at once; each one's output."""
    with tempfile.TemporaryDirectory() as folder:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "autothrottle",
                    "demo",
                    "--no-live",
                    "--out",
                    f"{folder}/chart-{i}.png",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "COLUMNS": "200"},
            )
            for i in range(together)
        ]
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            if proc.returncode != 0:
                raise SystemExit(f"the demo failed ({proc.returncode}):\n{err}")
            outputs.append(out)
    return outputs


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
    parser.add_argument("--write", action="store_true", help="paste the first demo's sample")
    parser.add_argument("--runs", type=int, default=1, help="how many times (default 1)")
    parser.add_argument(
        "--together", type=int, default=2, help="demos at the same time in a run (default 2)"
    )
    args = parser.parse_args()
    shown = {name: verdicts((ROOT / name).read_text()) for name in ("README.md", "docs/cli.md")}
    matched = 0
    for run in range(1, args.runs + 1):
        outputs = run_demos(args.together)
        found = [verdicts(output) for output in outputs]
        if args.write:
            paste(outputs[0])
            return 0
        bad = [i for i, f in enumerate(found) if any(f != s for s in shown.values())]
        matched += not bad
        for i, output in enumerate(outputs):
            differs = "differ from" if i in bad else "match"
            print(f"run {run}, demo {i + 1}: its verdicts {differs} the sample's")
            print("\n".join("    " + line for line in block(output, False).splitlines()[:5]))
    print(f"{matched} of {args.runs} runs ({args.together} demos at once) match the sample")
    return 0 if matched == args.runs else 1


def paste(output: str) -> None:
    for name in ("README.md", "docs/cli.md"):
        path = ROOT / name
        text = path.read_text()
        table = name != "README.md"
        path.write_text(text.replace(block(text, table), block(output, table)))
        print(f"{name}: pasted the new run")


if __name__ == "__main__":
    sys.exit(main())
