"""The one error tree of metarag: every user-facing failure is one of these, with a one-line message."""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class MetaRAGError(Exception):
    """Base of every error metarag raises on purpose; the CLI prints its message and exits non-zero."""


class ConfigError(MetaRAGError):
    """An unknown name or a setting that does not fit, found before any model is loaded."""


class DataError(MetaRAGError):
    """Bad input data: the message names the file, and the line or record and field where known."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 field: str | None = None):
        where = ""
        if path is not None:
            where = f"{path}"
            if line is not None:
                where += f":{line}"
            where += ": "
        if field is not None:
            message = f"{message} (field {field!r})"
        super().__init__(where + message)
        self.path, self.line, self.field = path, line, field


class MissingDependency(MetaRAGError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, package: str, extra: str):
        super().__init__(f"{package} is not installed: pip install 'metarag[{extra}]'")
        self.package, self.extra = package, extra


class BackendError(MetaRAGError):
    """A model or retrieval back-end failed; `retryable` says whether trying again may help."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


def retrying(attempt: Callable[[], T], *, tries: int, backoff_s: float, failed: str, jitter: float = 0.0) -> T:
    """`attempt()`, called again while it raises a retryable BackendError, `tries` times at most: the
    one retry loop of the back-ends (the OpenAI client, the remote retriever). Waits `backoff_s`
    before the second try, then twice that, and so on, each wait stretched by up to `jitter` of itself
    at random (clients that failed together do not retry in step). A non-retryable error is raised at
    once; after the last try, a retryable BackendError "<failed> after <tries> tries: <last error>"."""
    tries = max(tries, 1)
    last: BackendError | None = None
    for n in range(tries):
        if n:
            time.sleep(backoff_s * 2 ** (n - 1) * (1 + jitter * random.random()))
        try:
            return attempt()
        except BackendError as exc:
            if not exc.retryable:
                raise
            last = exc
    raise BackendError(f"{failed} after {tries} {'try' if tries == 1 else 'tries'}: {last}", retryable=True)


def close_matches(name: str, valid) -> str:
    """A ' (did you mean ...?)' hint plus the list of valid names, for unknown-name errors."""
    import difflib

    valid = sorted(valid)
    near = difflib.get_close_matches(name, valid, n=3)
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    return f"{hint}; valid: {', '.join(valid)}"
