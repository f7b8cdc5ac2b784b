"""What a method can ask the runner to do. A method is a generator policy: it yields these
actions, the runner carries each out, records it as a trace step and sends back the result."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from metarag.llm.base import Decoding, TokenIds
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
    """Generate text for `purpose` (answer, reason, rewrite ...). Sends back a `Completion`.

    `prompt` is a conversation (a final assistant message is continued, not closed: FLARE resumes a
    partial answer so), one message with role "raw" (no template), or `TokenIds` (the back-end's own
    token ids, e.g. a prompt built from a previous Completion's `prompt_ids` and `token_ids`).
    `model` None asks the run's LLM; a spec string (e.g. "embedded-0.5b", "openai:MODEL@URL") asks the
    model it names, built once per run by the runner (EvoCtx's separate decision model)."""

    purpose: str
    prompt: tuple[Message, ...] | TokenIds
    decoding: Decoding = Decoding()
    model: str | None = None


@dataclass(frozen=True)
class Probe:
    """Read the probability of each whole label as the continuation of `prompt` (yes/no judges,
    reflection labels). Sends back `LabelScores`; read it with `LabelScores.p`. `prompt` and `model`
    as in Ask."""

    purpose: str
    prompt: tuple[Message, ...] | TokenIds
    labels: tuple[str, ...] = ("Yes", "No")
    model: str | None = None


@dataclass(frozen=True)
class Assess:
    """Ask a judge (see `metarag.judges.base.Judge`) for a verdict on named inputs: texts, or tuples
    of texts (e.g. an evidence boundary). Sends back a `Verdict`. A judge that asks a model is run as
    a sub-policy: its own Ask / Probe steps come first in the trace, then its Judge step."""

    judge: Any
    inputs: Mapping[str, str | tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Note:
    """Record a control decision with its signals; costs nothing. Sends back None."""

    name: str
    choice: str
    signals: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Clip:
    """Cut `text` to its first `max_tokens` tokens of the run's model (Search-R1's `max_obs_length`
    on an observation), as that model's tokenizer splits it. Sends back the text, whole when it fits
    or when the back-end has no tokenizer (a server: nothing to count with); a cut is recorded as a
    Decide step "clip" with the token counts; a text that fits costs nothing and leaves no step."""

    purpose: str
    text: str
    max_tokens: int


Action = Search | Ask | Probe | Assess | Note | Clip
