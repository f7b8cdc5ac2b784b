"""Settings as values: override a frozen settings dataclass by name from `key=value` strings, and
hash resolved settings into run ids. Unknown names fail here, before any model is loaded.

Public for methods of your own: declare each number with its range, and the range is checked at
construction and on every `--set` / `settings=` override, as for ours:

    from dataclasses import dataclass
    from metarag.settings import check_ranges, setting

    @dataclass(frozen=True)
    class MySettings:
        k: int = setting(5, ge=1)                  # passages a search; k=0 is refused
        threshold: float = setting(0.4, ge=0, le=1)

        def __post_init__(self) -> None:
            check_ranges(self)
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

from metarag.errors import ConfigError, close_matches
from metarag.records import to_plain

__all__ = ["Range", "check_ranges", "override", "parse_assignments", "setting", "settings_hash"]


def parse_assignments(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`['k=5', 'threshold=0.3']` -> `{'k': '5', 'threshold': '0.3'}`."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def override(settings: Any, values: Mapping[str, Any], *, owner: str) -> Any:
    """A copy of the dataclass `settings` with `values` (strings or typed) converted and applied."""
    fields = {f.name: f for f in dataclasses.fields(settings)}
    hints = typing.get_type_hints(type(settings))
    changes = {}
    for key, raw in values.items():
        if key not in fields:
            raise ConfigError(f"{owner} has no setting {key!r}{close_matches(key, fields)}")
        what = f"{owner} setting {key!r}"
        changes[key] = convert(raw, hints[key], what)
        check_field(fields[key], changes[key], what)
    return dataclasses.replace(settings, **changes)


@dataclasses.dataclass(frozen=True)
class Range:
    """The allowed values of a numeric setting: bounds inclusive (`ge`, `le`) or strict (`gt`, `lt`).

    NaN is never in range; an infinity only where that side is unbounded.
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def admits(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def describe(self) -> str:
        """'>= 1', '> 0', 'in [0, 1]', 'in (0, 100]' ..."""
        low = ("[", self.ge) if self.ge is not None else ("(", self.gt) if self.gt is not None else None
        high = (self.le, "]") if self.le is not None else (self.lt, ")") if self.lt is not None else None
        if low and high:
            return f"in {low[0]}{_num(low[1])}, {_num(high[0])}{high[1]}"
        if low:
            return f"{'>=' if low[0] == '[' else '>'} {_num(low[1])}"
        if high:
            return f"{'<=' if high[1] == ']' else '<'} {_num(high[0])}"
        return "a number"

    def check(self, value: Any, what: str) -> None:
        """ConfigError `"<what> must be <range>, got <value>"` unless `value` is None or in range."""
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        if not self.admits(value):
            raise ConfigError(f"{what} must be {self.describe()}, got {value!r}")


def _num(bound: float) -> str:
    return f"{bound:g}"


def setting(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, **field_args: Any) -> Any:
    """A settings dataclass field with its allowed range, checked by `check_ranges` and `override`:
    `k: int = setting(5, ge=1)`, `threshold: float = setting(0.4, ge=0, le=1)`."""
    metadata = {**field_args.pop("metadata", {}), "range": Range(ge=ge, gt=gt, le=le, lt=lt)}
    return dataclasses.field(default=default, metadata=metadata, **field_args)


def check_field(field: dataclasses.Field, value: Any, what: str) -> None:
    """Check one value against the range its field declares (see `setting`); NaN fits no field."""
    bounds = field.metadata.get("range", Range())
    bounds.check(value, what)


def check_ranges(settings: Any, owner: str | None = None) -> None:
    """Check every ranged field of a settings dataclass; every settings class calls this in
    `__post_init__`, so no out-of-range value is ever constructed. Errors read
    `"<owner> setting 'k' must be >= 1, got -1"` (owner: the class name unless given)."""
    owner = owner or type(settings).__name__
    choices = _literal_choices(type(settings))
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        check_field(field, value, f"{owner} setting {field.name!r}")
        if field.name in choices and value not in choices[field.name]:
            raise ConfigError(f"{owner} setting {field.name!r} must be one of "
                              f"{', '.join(map(str, choices[field.name]))}, got {value!r}")


@functools.cache
def _literal_choices(cls: type) -> dict[str, tuple]:
    """The choices of each `Literal`-typed field of a settings class (annotations resolved once)."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation that does not resolve: no choices to check
        return {}
    return {name: typing.get_args(tp) for name, tp in hints.items() if typing.get_origin(tp) is typing.Literal}


def convert(raw: Any, tp: Any, what: str) -> Any:
    """Convert a command-line string to the annotated type (bool, int, float, str, tuples, optionals)."""
    if not isinstance(raw, str):
        return raw
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if raw.lower() in ("none", "null", "") and len(args) < len(typing.get_args(tp)):
            return None
        return convert(raw, args[0], what)
    if origin is tuple:
        inner = typing.get_args(tp)[0]
        return tuple(convert(part.strip(), inner, what) for part in raw.split(",") if part.strip())
    if typing.get_origin(tp) is typing.Literal:
        choices = typing.get_args(tp)
        if raw not in choices:
            raise ConfigError(f"{what} must be one of {', '.join(map(str, choices))}, got {raw!r}")
        return raw
    try:
        if tp is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if tp in (int, float, str):
            return tp(raw)
    except ValueError:
        raise ConfigError(f"{what} expects {tp.__name__}, got {raw!r}") from None
    return raw


def settings_hash(*parts: Any) -> str:
    """A short stable hash of resolved settings (dataclasses, dicts, strings)."""
    blob = json.dumps([to_plain(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


# A setting may name a model by path, bare or after a back-end prefix ("gguf:PATH", "cross-encoder:PATH").
_PATH_PREFIXES = ("gguf:", "cross-encoder:")


def artifact_digests(values: Any) -> dict[str, str]:
    """sha256 of the content of every file or folder a setting names by path, keyed by the setting's
    dotted name, so that retraining a critic (or replacing any model behind an unchanged path)
    changes the run id. Settings that name no existing path contribute nothing, so run ids of runs
    that use no such model are unchanged."""
    from pathlib import Path

    out: dict[str, str] = {}

    def visit(name: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, inner in value.items():
                visit(f"{name}.{key}" if name else str(key), inner)
        elif isinstance(value, str) and value.strip():
            raw = value.strip()
            for prefix in _PATH_PREFIXES:
                if raw.startswith(prefix):
                    raw = raw[len(prefix):]
                    break
            path = Path(raw).expanduser()
            if path.exists():
                out[name] = content_sha256(path)

    visit("", to_plain(values))
    return out


def content_sha256(path: Any) -> str:
    """sha256 of a file's bytes, or of a folder's files (relative names and contents, in name order).
    Files are hashed once per process for a given size and modification time."""
    from pathlib import Path

    path = Path(path)
    if path.is_file():
        stat = path.stat()
        return file_digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        stat = file.stat()
        sha = file_digest(str(file.resolve()), stat.st_size, stat.st_mtime_ns)
        digest.update(f"{file.relative_to(path).as_posix()}:{sha}\n".encode())
    return digest.hexdigest()


@functools.lru_cache(maxsize=256)
def file_digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, keyed on its size and mtime too so a rewritten file is hashed again."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
