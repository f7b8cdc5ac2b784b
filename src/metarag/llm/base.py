"""The LLM protocol every back-end implements, and the shared decoding settings.

Methods never talk to a tokenizer: token log-probabilities and next-token label probabilities come
through this protocol (`logprobs=` on generation, `score_labels` for yes/no style judges).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from metarag.records import Completion, LabelScores, Message

Prompt = str | Sequence[Message]


@dataclass(frozen=True)
class Decoding:
    """How to decode one request. Greedy (temperature 0) by default, as in all three papers."""

    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    seed: int = 0
    logprobs: int = 0  # how many top alternatives to return per generated token; 0 = none


@runtime_checkable
class LLM(Protocol):
    """A text generator. `identity` names back-end and model exactly (GGUF sha256 or server model
    name): it keys the response cache and is written into every run's manifest."""

    identity: str

    def complete(self, prompt: str, decoding: Decoding = Decoding()) -> Completion:
        """Continue a raw prompt (no chat template)."""
        ...

    def chat(self, messages: Sequence[Message], decoding: Decoding = Decoding()) -> Completion:
        """Answer a conversation, rendered with the model's own chat template."""
        ...

    def score_labels(self, prompt: Prompt, labels: Sequence[str]) -> LabelScores:
        """Probability of each label's first token as the next token after `prompt` (a chat prompt
        is rendered with the template, generation prompt included)."""
        ...


def as_messages(prompt: Prompt) -> tuple[Message, ...]:
    """A prompt as chat messages; a raw string becomes one message with role 'raw'."""
    if isinstance(prompt, str):
        return (Message("raw", prompt),)
    return tuple(prompt)


def is_raw(messages: Sequence[Message]) -> bool:
    return len(messages) == 1 and messages[0].role == "raw"


def generate(llm: LLM, prompt: Prompt, decoding: Decoding) -> Completion:
    """Dispatch a prompt to `complete` or `chat` by its form."""
    messages = as_messages(prompt)
    if is_raw(messages):
        return llm.complete(messages[0].content, decoding)
    return llm.chat(messages, decoding)


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut `text` at the earliest stop sequence; says whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
