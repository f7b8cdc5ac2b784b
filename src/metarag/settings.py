"""Settings as values: override a frozen settings dataclass by name from `key=value` strings, and
hash resolved settings into run ids. Unknown names fail here, before any model is loaded."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

from metarag.errors import ConfigError, close_matches
from metarag.records import to_plain


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
        changes[key] = convert(raw, hints[key], f"{owner} setting {key!r}")
    return dataclasses.replace(settings, **changes)


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
