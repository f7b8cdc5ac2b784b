"""Where metarag keeps what it builds or assembles (indexes, models, caches): one home folder."""
from __future__ import annotations

import os
from pathlib import Path


def metarag_home() -> Path:
    """The folder for metarag's persistent files: `$METARAG_HOME`, else `~/.cache/metarag`.

    Read on every call, not at import, so a test or a run can point it elsewhere.
    """
    home = os.environ.get("METARAG_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "metarag"
