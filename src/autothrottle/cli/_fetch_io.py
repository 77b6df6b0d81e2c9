"""``autothrottle fetch``'s files: the URL list in, the JSON lines out, resume, bodies.

Nothing here touches the network. The rules it keeps (docs/cli.md, "fetch"):

* the input is read lazily, a line at a time: a list of 10**6 URLs never sits
  in memory, only a compact set of 8-byte hashes of the URLs seen;
* every output line is written whole, with one ``os.write`` loop, and nothing
  else is ever written to the file, so a line is either all there or (after a
  crash in the middle of the write) a trailing fragment without its newline;
* resuming drops such a fragment (truncates it) and skips every URL that has a
  line already;
* a body is stored under the SHA-256 of its bytes, never under a name taken
  from the URL.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import os
import sys
import tempfile
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "BodyStore",
    "LineWriter",
    "UrlSet",
    "count_urls",
    "read_urls",
    "resume",
    "url_hash",
]


def url_hash(url: str) -> int:
    """A 64-bit hash of ``url``, never 0 (stable across runs, unlike ``hash``)."""
    digest = hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


class UrlSet:
    """A set of URLs kept as 8-byte hashes in one flat array (open addressing).

    About 16 to 32 bytes per URL, against about 100 for a ``set`` of str: the
    memory a resumable fetch of 10**6 URLs needs to remember what it has seen.
    Two URLs whose 64-bit hashes collide count as one (odds of about 3e-8 in
    10**6 URLs).
    """

    __slots__ = ("_mask", "_slots", "_used")

    def __init__(self) -> None:
        self._slots = array("Q", bytes(8 * 1024))
        self._mask = 1023
        self._used = 0

    def __len__(self) -> int:
        return self._used

    def _find(self, h: int) -> int:
        """The index of ``h``, or of the empty slot where it would go."""
        slots, mask = self._slots, self._mask
        i = h & mask
        while True:  # ends: the table is never more than half full
            value = slots[i]
            if value == h or value == 0:
                return i
            i = (i + 1) & mask

    def __contains__(self, url: object) -> bool:
        if not isinstance(url, str):
            return False
        return self._slots[self._find(url_hash(url))] != 0

    def add(self, url: str) -> bool:
        """Add ``url``; True if it was not in the set before."""
        h = url_hash(url)
        i = self._find(h)
        if self._slots[i] != 0:
            return False
        self._slots[i] = h
        self._used += 1
        if 2 * self._used > self._mask:
            self._grow()
        return True

    def _grow(self) -> None:
        old = self._slots
        self._slots = array("Q", bytes(16 * len(old)))
        self._mask = 2 * len(old) - 1
        for h in old:
            if h:
                self._slots[self._find(h)] = h

    @property
    def nbytes(self) -> int:
        """Bytes the table takes."""
        return self._slots.itemsize * len(self._slots)


def _open_input(path: str) -> IO[str]:
    """The input as text; ``utf-8-sig`` drops the byte-order mark an editor may put at
    the start of a UTF-8 file (Notepad's "UTF-8 with BOM"), which would else begin
    the first URL."""
    if path == "-":
        return open(
            sys.stdin.fileno(), encoding="utf-8-sig", errors="surrogateescape", closefd=False
        )
    return open(path, encoding="utf-8-sig", errors="surrogateescape")


def _escape_bytes(url: str) -> str:
    """``url`` with each byte that was not UTF-8 (read as a lone surrogate) as ``%XX``.

    A URL's bytes beyond ASCII are percent-encoded on the wire anyway, so this
    is the URL a browser would send; and its output line is valid UTF-8 JSON,
    which a rerun reads back as the same URL.
    """
    if url.isascii():
        return url
    return "".join(f"%{ord(ch) - 0xDC00:02X}" if 0xDC80 <= ord(ch) <= 0xDCFF else ch for ch in url)


def read_urls(path: str) -> Iterator[str]:
    """The URLs of a file (``-``: standard input), one a line, lazily.

    Blank lines and lines starting with ``#`` are skipped; surrounding
    whitespace is dropped; bytes that are not UTF-8 become ``%XX``.
    """
    stream = _open_input(path)
    try:
        for line in stream:
            url = line.strip()
            if url and not url.startswith("#"):
                yield _escape_bytes(url)
    finally:
        stream.close()


def count_urls(path: str) -> int | None:
    """How many URL lines a regular file holds (for the ETA); None for stdin."""
    if path == "-":
        return None
    n = 0
    with open(path, "rb") as fh:
        for line in fh:
            text = line.strip().removeprefix(codecs.BOM_UTF8)
            if text and not text.startswith(b"#"):
                n += 1
    return n


def resume(path: str | None) -> tuple[UrlSet, int]:
    """The URLs an earlier run already wrote to ``path``, and how many lines it holds.

    Only a regular file is read back: ``/dev/stdout``, a pipe or a device is
    written to, never read.

    A trailing fragment without a newline (a write cut short) is truncated
    away, so the file ends on a whole line before anything is appended.
    A line that is not a JSON object with a ``url`` is kept but not counted
    as done: its URL is fetched again.
    """
    done = UrlSet()
    if path is None or not os.path.isfile(path):
        return done, 0  # stdout, a pipe, a device: nothing to read back
    lines = 0
    end = 0  # the offset after the last whole line
    with open(path, "r+b") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break
            end += len(raw)
            lines += 1
            url = _line_url(raw)
            if url is not None:
                done.add(url)
        fh.truncate(end)
    return done, lines


def _line_url(raw: bytes) -> str | None:
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    url = record.get("url") if isinstance(record, dict) else None
    return url if isinstance(url, str) else None


class LineWriter:
    """Appends JSON records to a file (or standard output), one whole line each.

    Each line goes out in one ``os.write`` loop with no buffer in between, so
    a finished line is on disk (in the OS's hands) as soon as :meth:`write`
    returns, and a crash can leave at most one partial line, at the end.
    """

    def __init__(self, path: str | None) -> None:
        if path is None:
            sys.stdout.flush()
            self._fd = sys.stdout.fileno()
            self._own = False
        else:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._own = True
        self.lines = 0

    def write(self, record: dict[str, Any]) -> None:
        """Write one line; an ``OSError`` (a full disk, a closed pipe) is the caller's."""
        # A lone surrogate (a byte that was not UTF-8) becomes the JSON escape \udcXX:
        # the line stays valid UTF-8 and valid JSON.
        data = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode(
            "utf-8", "backslashreplace"
        )
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self.lines += 1

    def close(self) -> None:
        if self._own:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
            os.close(self._fd)
            self._own = False


class BodyStore:
    """Response bodies in a folder, each named by the SHA-256 of its bytes.

    ``ab/abcdef…`` (the first two hex digits as a subfolder); a body is first
    written to a temporary file in the folder, then renamed into place, so a
    name always holds a complete body and equal bodies are stored once.
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def open(self) -> BodyFile:
        fd, name = tempfile.mkstemp(dir=self.folder, prefix=".part-")
        return BodyFile(self, os.fdopen(fd, "wb"), Path(name))


class BodyFile:
    """One body being written; :meth:`commit` names it by its hash."""

    def __init__(self, store: BodyStore, fh: IO[bytes], temp: Path) -> None:
        self._store = store
        self._fh = fh
        self._temp = temp
        self._sha = hashlib.sha256()

    def write(self, chunk: bytes) -> None:
        self._sha.update(chunk)
        self._fh.write(chunk)

    def commit(self) -> str:
        """Close the file, move it to its content name; returns the hex digest."""
        self._fh.close()
        digest = self._sha.hexdigest()
        target = self._store.folder / digest[:2] / digest
        target.parent.mkdir(exist_ok=True)
        os.replace(self._temp, target)
        return digest

    def discard(self) -> None:
        self._fh.close()
        with contextlib.suppress(OSError):
            self._temp.unlink()
