"""The deterministic fake LLM for tests and examples: answers come from a script, not a model.

A script is a list of rules tried in order; a rule matches when its pattern (a regular expression)
is found in the prompt, and each rule's responses are used in turn (the last one repeats).
Token counts are whitespace word counts, so usage accounting is checkable by hand.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from metarag.errors import BackendError
from metarag.llm.base import Decoding, Prompt, as_messages, truncate_at_stop
from metarag.records import Completion, LabelScores, Message, TokenLogprob, Usage

Response = str | Callable[[str], str]


@dataclass
class Rule:
    """Answer prompts matching `pattern` with `responses`, one per call, the last repeating."""

    pattern: str
    responses: Sequence[Response]
    calls: int = field(default=0, compare=False)

    def next(self, prompt: str) -> str:
        response = self.responses[min(self.calls, len(self.responses) - 1)]
        self.calls += 1
        return response(prompt) if callable(response) else response


class ScriptedLLM:
    """An LLM whose every answer is scripted: `rules` for generation, `label_rules` for
    `score_labels` (pattern -> {label: prob}). An unmatched prompt is a BackendError naming it."""

    def __init__(self, rules: Sequence[tuple[str, Response | Sequence[Response]]] = (),
                 label_rules: Sequence[tuple[str, dict[str, float]]] = (), *,
                 default: str | None = None, name: str = "scripted"):
        self.rules = [Rule(p, [r] if isinstance(r, str) or callable(r) else list(r)) for p, r in rules]
        self.label_rules = [(re.compile(p, re.S), probs) for p, probs in label_rules]
        self.default = default
        self.identity = f"scripted:{name}"
        self.prompts: list[str] = []  # every prompt seen, rendered, for assertions in tests

    def complete(self, prompt: str, decoding: Decoding = Decoding()) -> Completion:
        self.prompts.append(prompt)
        text = self._respond(prompt)
        text, stopped = truncate_at_stop(text, decoding.stop)
        words = text.split()[: decoding.max_tokens]
        if len(words) < len(text.split()):
            text, stopped = " ".join(words), False
        logprobs = None
        if decoding.logprobs:
            logprobs = tuple(TokenLogprob(w, -0.01, ((w, -0.01),)) for w in words)
        usage = Usage(prompt_tokens=len(prompt.split()), completion_tokens=len(words), llm_requests=1)
        return Completion(text, usage, logprobs, "stop" if stopped or len(words) < decoding.max_tokens
                          else "length")

    def chat(self, messages: Sequence[Message], decoding: Decoding = Decoding()) -> Completion:
        return self.complete(render(messages), decoding)

    def score_labels(self, prompt: Prompt, labels: Sequence[str]) -> LabelScores:
        text = render(as_messages(prompt))
        self.prompts.append(text)
        for pattern, probs in self.label_rules:
            if pattern.search(text):
                return LabelScores(tuple(labels), tuple(float(probs.get(label, 0.0)) for label in labels),
                                   Usage(prompt_tokens=len(text.split()), llm_requests=1))
        raise BackendError(f"scripted LLM has no label rule for prompt: {text[:120]!r}")

    def _respond(self, prompt: str) -> str:
        for rule in self.rules:
            if re.search(rule.pattern, prompt, re.S):
                return rule.next(prompt)
        if self.default is not None:
            return self.default
        raise BackendError(f"scripted LLM has no rule for prompt: {prompt[:120]!r}")


def render(messages: Sequence[Message]) -> str:
    """A plain rendering of chat messages, for back-ends without a template."""
    if len(messages) == 1 and messages[0].role == "raw":
        return messages[0].content
    return "\n".join(f"<{m.role}>\n{m.content}" for m in messages) + "\n<assistant>\n"
