"""Log files bounded across runs and within one: a log a process appends to is rotated when a start finds it
past its limit, and while the process runs by copying it aside and truncating it (the process keeps its
file open, in append mode, so it writes on at the start); a folder of per-start logs keeps only its
newest files."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

MAX_BYTES = 64 * 2**20  # a log larger than this when its process starts is rotated


def rotate(path: Path, max_bytes: int = MAX_BYTES, keep: int = 2) -> bool:
    """Before a process appends to `path`: when it is over `max_bytes`, it becomes `path.1` (an older `.1`
    becomes `.2`, and so on up to `keep`; the oldest is dropped). Whether it rotated."""
    if not path.is_file() or path.stat().st_size <= max_bytes:
        return False
    _shift(path, keep)
    path.rename(path.with_name(f"{path.name}.1"))
    return True


def rotate_open(path: Path, max_bytes: int = MAX_BYTES, keep: int = 2) -> bool:
    """While a process appends to `path` (opened with O_APPEND): when it is over `max_bytes`, its content
    becomes `path.1` (older ones shift as in `rotate`) and `path` is truncated in place. Lines written
    between the last copy and the truncation, an instant, are lost. Whether it rotated."""
    if not path.is_file() or path.stat().st_size <= max_bytes:
        return False
    _shift(path, keep)
    with open(path, "rb") as source, open(path.with_name(f"{path.name}.1"), "wb") as copy:
        shutil.copyfileobj(source, copy)
        copy.write(source.read())  # what was appended while copying
        os.truncate(path, 0)
    return True


def _shift(path: Path, keep: int) -> None:
    for n in range(keep, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            if n == keep:
                older.unlink()
            else:
                older.rename(path.with_name(f"{path.name}.{n + 1}"))


def prune(folder: Path, pattern: str, keep: int) -> list[Path]:
    """Delete all but the `keep` newest files of `folder` matching `pattern`; the files deleted."""
    found = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in found[keep:]:
        old.unlink(missing_ok=True)
    return found[keep:]
