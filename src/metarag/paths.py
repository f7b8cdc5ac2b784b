"""Where metarag keeps what it builds or assembles (indexes, models, caches): one home folder."""
from __future__ import annotations

import os
from pathlib import Path

from metarag.errors import ConfigError


def metarag_home() -> Path:
    """The folder for metarag's persistent files: `$METARAG_HOME`, else `~/.cache/metarag`.

    Read on every call, not at import, so a test or a run can point it elsewhere. ConfigError when
    `$METARAG_HOME` names something that exists and is not a folder.
    """
    home = os.environ.get("METARAG_HOME")
    if not home:
        return Path.home() / ".cache" / "metarag"
    path = Path(home).expanduser()
    existing = next((p for p in (path, *path.parents) if p.exists()), path)
    if existing.exists() and not existing.is_dir():  # it, or a folder it would be created in, is a file
        raise ConfigError(f"METARAG_HOME {str(path)!r} is not a folder; point it at a folder (or unset it for "
                          "~/.cache/metarag)")
    return path


def check_folder(path: str | os.PathLike[str], what: str) -> Path:
    """`path`, if it is a folder or could be created as one (nothing is created here); else
    ConfigError naming `what` (e.g. "--runs-dir") and why not: it is a file, a folder it would be
    created in is a file, or it cannot be written."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{what} {str(folder)!r} is a file, not a folder")
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and existing != folder:
        if not existing.is_dir():
            raise ConfigError(f"{what} {str(folder)!r} cannot be created: {str(existing)!r} is a file")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(f"{what} {str(folder)!r} cannot be created: {str(existing)!r} is not writable")
    elif existing == folder and not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {str(folder)!r} is not writable")
    return folder
