"""What a method can ask the runner to do. A method is a generator policy: it yields these
actions, the runner carries each out, records it as a trace step and sends back the result."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from metarag.llm.base import Decoding
from metarag.records import Message


@dataclass(frozen=True)
class Search:
    """Retrieve the top `k` passages for `query`, skipping the ids in `exclude`. Sends back
    `list[Hit]`."""

    query: str
    k: int
    exclude: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Ask:
    """Generate text for `purpose` (answer, reason, rewrite ...). Sends back a `Completion`."""

    purpose: str
    prompt: tuple[Message, ...]
    decoding: Decoding = Decoding()


@dataclass(frozen=True)
class Probe:
    """Read the next-token probability of each label (yes/no judges). Sends back `LabelScores`."""

    purpose: str
    prompt: tuple[Message, ...]
    labels: tuple[str, ...] = ("Yes", "No")


@dataclass(frozen=True)
class Assess:
    """Ask a judge (see `metarag.judges.base.Judge`) for a verdict on named inputs: texts, or tuples
    of texts (e.g. an evidence boundary). Sends back a `Verdict`."""

    judge: Any
    inputs: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Note:
    """Record a control decision with its signals; costs nothing. Sends back None."""

    name: str
    choice: str
    signals: tuple[tuple[str, float], ...] = ()


Action = Search | Ask | Probe | Assess | Note
