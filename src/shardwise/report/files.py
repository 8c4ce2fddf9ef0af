"""Writing reports to files: whole or not at all (a temporary file beside the target, then renamed)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from shardwise.errors import SpecError


def _folder(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def check_writable(path: Path) -> None:
    """Refuse, before any work, a path `write_text` could not write: a folder, or a file in a folder that does not
    exist or cannot be written to."""
    folder = _folder(path)
    if path.is_dir():
        raise SpecError(f"cannot write {path}: it is a folder; give a file path")
    if not folder.is_dir():
        raise SpecError(f"cannot write {path}: no folder {folder}; give a path in a folder that exists")
    if not os.access(folder, os.W_OK):
        raise SpecError(f"cannot write {path}: {folder} is not writable; give a path in a folder you can write to")


def write_text(path: Path, text: str) -> None:
    """Write `text` to `path` atomically; a path that cannot be written is one clear error."""
    folder = _folder(path)
    try:
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, delete=False, suffix=".tmp") as out:
            out.write(text)
            temp = Path(out.name)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp, 0o666 & ~umask)  # as an ordinary file would be, not the temporary file's 0600
        os.replace(temp, path)
    except OSError as exc:
        raise SpecError(
            f"cannot write {path}: {exc.strerror or exc}; give a path in a folder you can write to"
        ) from exc
