"""The command lines' argument parser: a bad value is one line naming the flag.

argparse prints the whole usage before an error; at a shell that pushes the
one line that matters off the screen, and ``--help`` shows the usage anyway.
``autothrottle`` and its subcommands, and ``python -m autothrottle.sim``, all
build on this parser so that every bad value reads alike and exits 2.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["OneLineParser"]


class OneLineParser(argparse.ArgumentParser):
    """An argument error is one line, ``PROG: error: argument --FLAG: ...``, then exit
    status 2 (no usage first: ``--help`` has it)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
