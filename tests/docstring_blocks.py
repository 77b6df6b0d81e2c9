"""The literal block (the one after ``::``) of a docstring, as code.

A test that checks what a docstring shows runs the docstring's own block, so
the text a user copies is what is checked, not a copy of it kept beside it.
"""

from __future__ import annotations

import inspect
import textwrap


def literal_block(documented: object) -> str:
    """The first ``::`` block of ``documented``'s docstring, dedented."""
    doc = inspect.getdoc(documented)
    assert doc is not None and "::\n" in doc, f"{documented!r} shows no literal block"
    lines = doc.split("::\n", 1)[1].splitlines()
    block: list[str] = []
    for line in lines:
        if line and not line.startswith(" ") and block:
            break
        block.append(line)
    return textwrap.dedent("\n".join(block)).strip() + "\n"
