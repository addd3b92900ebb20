"""Atomic file writes.

Rule: a file is written to a temporary name in its destination folder, flushed,
fsynced, then renamed over the destination with ``os.replace``. A failure at any
point removes the temporary file and leaves the destination as it was (absent, or
the old complete file); a reader never sees a half-written file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterator

from tracker.errors import DataError


def _file_mode(dest: Path) -> int:
    """The mode a new file gets (0o666 less the umask), or the mode of the file replaced."""
    try:
        return dest.stat().st_mode & 0o7777
    except FileNotFoundError:
        mask = os.umask(0o022)
        os.umask(mask)
        return 0o666 & ~mask


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Yield a binary file that becomes ``path`` only when the block ends without error."""
    dest = Path(path)
    folder = dest.parent if str(dest.parent) else Path(".")
    if not folder.is_dir():
        raise DataError(f"output folder {str(folder)!r} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _file_mode(dest))
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; return the path."""
    with atomic_writer(path) as fh:
        fh.write(data)
    return Path(path)
