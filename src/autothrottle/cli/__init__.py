"""The ``autothrottle`` command: ``demo``, ``fetch``, ``plot`` and ``sim``.

An application built on the library's public API, not a part of it: nothing
here is meant to be imported but :func:`main` (the console script, and
``python -m autothrottle``). Its dependencies are the ``cli`` extra (and
``plot`` for charts); a command whose extra is missing says what to install.
"""

from ._main import main

__all__ = ["main"]
