"""Directories kts creates for itself: made with the mode asked for, whatever the umask, and
never a change to a directory that was already there (kts does not loosen or tighten what it did
not create: a 0700 parent of KTS_HOME stays 0700)."""

from __future__ import annotations

import os
from pathlib import Path


def make_dirs(path: str | os.PathLike, mode: int = 0o700) -> list[Path]:
    """Create ``path`` and its missing ancestors, each with exactly ``mode``; the ones created,
    outermost first. Existing directories are left as they are."""
    path = Path(path).absolute()
    missing = []
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            break
        missing.append(candidate)
    created = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue  # a concurrent process made it first; its mode is its own
        os.chmod(directory, mode)  # mkdir's mode is masked by the umask
        created.append(directory)
    return created
