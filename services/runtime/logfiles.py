"""Log files bounded across runs: a log a process appends to is rotated when a start finds it past its
limit, and a folder of per-start logs keeps only its newest files."""
from __future__ import annotations

from pathlib import Path

MAX_BYTES = 64 * 2**20  # a log larger than this when its process starts is rotated


def rotate(path: Path, max_bytes: int = MAX_BYTES, keep: int = 2) -> bool:
    """Before a process appends to `path`: when it is over `max_bytes`, it becomes `path.1` (an older `.1`
    becomes `.2`, and so on up to `keep`; the oldest is dropped). Whether it rotated."""
    if not path.is_file() or path.stat().st_size <= max_bytes:
        return False
    for n in range(keep, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            if n == keep:
                older.unlink()
            else:
                older.rename(path.with_name(f"{path.name}.{n + 1}"))
    path.rename(path.with_name(f"{path.name}.1"))
    return True


def prune(folder: Path, pattern: str, keep: int) -> list[Path]:
    """Delete all but the `keep` newest files of `folder` matching `pattern`; the files deleted."""
    found = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in found[keep:]:
        old.unlink(missing_ok=True)
    return found[keep:]
