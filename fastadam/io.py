"""Files written whole or not at all: :func:`atomic_write`.

Design: the data goes to a temporary file in the target's folder (same file system, so the
final rename is atomic), which is flushed and fsynced, then ``os.replace``d over the target;
the folder is fsynced last so the rename itself survives a power cut.  Any exception while
writing (a full disk, a file-size limit, KeyboardInterrupt) removes the temporary file and
leaves the previous file untouched; a killed process leaves at most a ``.NAME.*.tmp`` file
beside it, never a truncated target.  The optimizer objects' ``save`` and
``fastadam.onnx.TrainingSession.save`` both write through it.
"""
from __future__ import annotations

import contextlib
import os
import secrets
from typing import Any, BinaryIO, Iterator

__all__ = ["atomic_write"]


def _fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not possible on every platform (Windows): the rename is done anyway
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(path: Any) -> Iterator[BinaryIO]:
    """Open a binary file that replaces ``path`` only when the ``with`` block ends normally.

    ``with fastadam.io.atomic_write("model.onnx") as f: f.write(data)``.  On an exception
    inside the block, or while flushing and syncing, the temporary file is removed, the
    exception propagates and ``path`` keeps its previous content (or stays absent).
    """
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_folder(folder)
