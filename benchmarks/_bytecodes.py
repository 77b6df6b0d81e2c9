"""Bytecodes run and calls made by traced code, per function (``file:qualname``).

The count that does not depend on the machine or its load: ``sys.settrace``
with opcode events, in the thread that traces. A coroutine's resumption
counts as a call too. ``overhead.py``, ``stats.py`` and ``timeline_memory.py``
count their ``--bytecodes`` with it.
"""

from __future__ import annotations

import os
import sys
import types
from collections import Counter
from typing import Any

_OWN = __file__


class BytecodeCount:
    """What ran inside ``with`` it: ``ops`` (bytecodes) and ``calls``, per function."""

    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def _trace(self, frame: types.FrameType, event: str, arg: object) -> Any:
        code = frame.f_code
        if code.co_filename == _OWN:  # the block's own way out is not what it counts
            return None
        where = f"{os.path.basename(code.co_filename)}:{code.co_qualname}"
        if event == "opcode":
            self.ops[where] += 1
        elif event == "call":
            self.calls[where] += 1
            frame.f_trace_opcodes = True
        return self._trace

    def __enter__(self) -> BytecodeCount:
        """Count what this thread runs inside the ``with`` block."""
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)

    @property
    def total(self) -> int:
        """Bytecodes counted in all."""
        return sum(self.ops.values())
