"""The command's paths, checked before any work starts: one line naming the flag, or None.

A file to write is opened (created and removed again if it was not there), so
what fails is what would fail later: a folder, a missing parent, no
permission, a read-only file system. ``-`` is standard output and always
passes.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["input_problem", "folder_problem", "output_problem", "overwrite_problem"]


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def output_problem(flag: str, path: str | None) -> str | None:
    """Why ``path`` cannot be written (appended to), or None."""
    if path is None or path == "-":
        return None
    if os.path.isdir(path):
        return f"{flag} {path!r}: is a directory; give a file name"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"{flag} {path!r}: no such directory {folder!r}"
    existed = os.path.exists(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        return f"{flag} {path!r}: cannot write: {_reason(exc)}"
    os.close(fd)
    if not existed:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return None


def folder_problem(flag: str, path: str | None) -> str | None:
    """Why ``path`` cannot be (made) a folder to write files in, or None; makes it."""
    if path is None:
        return None
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{flag} {path!r}: exists and is not a directory"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return f"{flag} {path!r}: cannot make the directory: {_reason(exc)}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{flag} {path!r}: cannot write in it"
    return None


def input_problem(name: str, path: str) -> str | None:
    """Why ``path`` cannot be read as a file of lines, or None (``-`` is standard input)."""
    if path == "-":
        return None
    if os.path.isdir(path):
        return f"{name} {path!r}: is a directory; give a file of URLs, one a line"
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        return f"{name} {path!r}: {_reason(exc)}"
    return None


def overwrite_problem(flag: str, path: str | None, name: str, source: str) -> str | None:
    """Why writing ``path`` would write into ``source``, the file read as ``name``, or None.

    ``fetch urls.txt -o urls.txt`` appends its JSON lines to the list of URLs, which
    a rerun then reads as URLs. Only regular files are compared: ``/dev/stdin`` and
    ``/dev/stdout`` may be one terminal, read and written as two streams.
    """
    if path is None or not (os.path.isfile(path) and os.path.isfile(source)):
        return None
    try:
        same = os.path.samefile(path, source)
    except OSError:
        return None
    if not same:
        return None
    return f"{flag} {path!r}: is {name}, the file read; give another file to write"
