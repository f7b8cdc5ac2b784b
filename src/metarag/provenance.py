"""Where a result came from, on the ground floor: the source revision an evaluation run's or a
training run's settings record (`git_commit`)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit() -> str | None:
    """The git commit this copy of metarag runs from (`git rev-parse HEAD` in the package's folder);
    None outside a git checkout, without git, or when git does not answer within 5 seconds."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
