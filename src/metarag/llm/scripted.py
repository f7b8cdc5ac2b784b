"""The deterministic fake LLM for tests and examples: answers come from a script, not a model.

A script is a list of rules tried in order; a rule matches when its pattern (a regular expression)
is found in the prompt, and each rule's responses are used in turn (the last one repeats). A
response is a string, a function of the prompt, or `ScriptedTokens` (pieces with their own
log-probabilities, e.g. one unlikely token to trigger FLARE's retrieval).

Tokens are whitespace-delimited words with the whitespace after them (`re.findall(r"\\s*\\S+\\s*")`:
leading whitespace joins the first word), so token counts are word counts, checkable by hand, and a
stop string at a word's end ("\\n") is crossed by the word before it; a token's id is the crc32
of its text. It follows the protocol's stop, continuation and token-id rules exactly like the real
back-ends (`metarag.llm.base`).
"""
from __future__ import annotations

import math
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from metarag.errors import BackendError, ConfigError
from metarag.llm.base import (
    Decoding,
    Prompt,
    TokenIds,
    TokenStream,
    as_messages,
    is_raw,
    label_plan,
    render_continuing,
)
from metarag.records import Completion, LabelScores, Message, Usage

DEFAULT_LOGPROB = -0.01  # a scripted token's log-probability unless the script says otherwise
ALTERNATIVE = "<other>"  # the second entry of a scripted token's top alternatives


@dataclass(frozen=True)
class ScriptedTokens:
    """A scripted response given token by token: (piece, log-prob) pairs, a bare piece meaning
    DEFAULT_LOGPROB. `ScriptedTokens.of("The", " capital", (" Lyon", -4.0))`."""

    pieces: tuple[tuple[str, float], ...]

    @classmethod
    def of(cls, *items: str | tuple[str, float]) -> ScriptedTokens:
        return cls(tuple((i, DEFAULT_LOGPROB) if isinstance(i, str) else (i[0], float(i[1])) for i in items))

    @property
    def text(self) -> str:
        return "".join(p for p, _ in self.pieces)


Response = str | ScriptedTokens | Callable[[str], str]


@dataclass
class Rule:
    """Answer prompts matching `pattern` with `responses`, one per call, the last repeating."""

    pattern: str
    responses: Sequence[Response]
    calls: int = field(default=0, compare=False)

    def next(self, prompt: str) -> str | ScriptedTokens:
        response = self.peek(prompt)
        self.calls += 1
        return response

    def peek(self, prompt: str) -> str | ScriptedTokens:
        """The response the next call gets, without using it up."""
        response = self.responses[min(self.calls, len(self.responses) - 1)]
        return response(prompt) if callable(response) else response


def split_words(text: str) -> list[str]:
    """The scripted tokenization: each word with the whitespace after it (whitespace alone is one token)."""
    return re.findall(r"\s*\S+\s*", text) or ([text] if text else [])


def token_id(piece: str) -> int:
    return zlib.crc32(piece.encode("utf-8")) & 0x7FFFFFFF


class ScriptedLLM:
    """An LLM whose every answer is scripted: `rules` for generation, `label_rules` for
    `score_labels` (pattern -> {label: prob}). An unmatched prompt is a BackendError naming it."""

    provides = frozenset({"token_logprobs", "token_entropy"})

    def __init__(self, rules: Sequence[tuple[str, Response | Sequence[Response]]] = (),
                 label_rules: Sequence[tuple[str, dict[str, float]]] = (), *,
                 default: str | None = None, name: str = "scripted"):
        self.rules = [Rule(p, [r] if isinstance(r, (str, ScriptedTokens)) or callable(r) else list(r))
                      for p, r in rules]
        self.label_rules = [(re.compile(p, re.S), probs) for p, probs in label_rules]
        self.default = default
        self.identity = f"scripted:{name}"
        self.prompts: list[str] = []  # every prompt seen, rendered, for assertions in tests
        self._pieces: dict[int, str] = {}

    # ------------------------------------------------------------------------------ protocol
    def complete(self, prompt: str | TokenIds, decoding: Decoding = Decoding()) -> Completion:
        text = self.detokenize(prompt.ids) if isinstance(prompt, TokenIds) else prompt
        prompt_ids = tuple(prompt.ids) if isinstance(prompt, TokenIds) else tuple(self.tokenize(text))
        self.prompts.append(text)
        response = self._respond(text)
        pieces = response.pieces if isinstance(response, ScriptedTokens) else \
            tuple((w, DEFAULT_LOGPROB) for w in split_words(response))
        stream = TokenStream(decoding.stop)
        eos = True
        for i, (piece, logprob) in enumerate(pieces):
            if i == decoding.max_tokens:
                eos = False
                break
            top = ()
            if decoding.logprobs:
                rest = math.log1p(-math.exp(logprob)) if logprob < 0 else -math.inf
                top = tuple(sorted(((piece, logprob), (ALTERNATIVE, rest)), key=lambda t: -t[1]))[:decoding.logprobs]
            if stream.push(self._register(piece), piece, stream.raw + piece, logprob, top, _binary_entropy(logprob)):
                break
        text_out, finish, stop = stream.finish(ended_by_eos=eos)
        usage = Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(stream.tokens), llm_requests=1)
        return Completion(text_out, usage, tuple(stream.tokens), finish, stop, prompt_ids)

    def chat(self, messages: Sequence[Message], decoding: Decoding = Decoding()) -> Completion:
        return self.complete(self.render(messages), decoding)

    def render(self, messages: Sequence[Message]) -> str:
        return render(messages)

    def score_labels(self, prompt: Prompt, labels: Sequence[str]) -> LabelScores:
        """The probabilities of the first label rule whose pattern is found in the prompt (a label it
        does not name gets 0). Without one, the generation script is the model: a label variant
        (`label_variants`) that the scripted response starts with gets the product of the
        probabilities of the response tokens it spans, any other 0 (the response is not consumed).
        Collisions are checked on text (a variant that starts another label's variant is refused)."""
        plans = label_plan(labels, lambda v: [ord(c) for c in v])
        if isinstance(prompt, TokenIds):
            text = self.detokenize(prompt.ids)
        else:
            messages = as_messages(prompt)
            text = messages[0].content if is_raw(messages) else self.render(messages)
        self.prompts.append(text)
        usage = Usage(prompt_tokens=len(split_words(text)) if text.strip() else 0, llm_requests=1)
        for pattern, probs in self.label_rules:
            if pattern.search(text):
                return LabelScores(tuple(labels), tuple(float(probs.get(label, 0.0)) for label in labels), usage)
        response = self._respond(text, consume=False)
        pieces = response.pieces if isinstance(response, ScriptedTokens) else \
            tuple((w, DEFAULT_LOGPROB) for w in split_words(response))
        said = "".join(piece for piece, _ in pieces)
        probs = []
        for seqs in plans:
            total = 0.0
            for variant in ("".join(map(chr, seq)) for seq in seqs):
                if said.startswith(variant):
                    spanned, logprob = 0, 0.0
                    for piece, lp in pieces:
                        if spanned >= len(variant):
                            break
                        spanned, logprob = spanned + len(piece), logprob + lp
                    total += math.exp(logprob)
            probs.append(min(total, 1.0))
        return LabelScores(tuple(labels), tuple(probs), usage)

    # ----------------------------------------------------------------------------- tokenizer
    def tokenize(self, text: str) -> list[int]:
        return [self._register(p) for p in split_words(text)] if text.strip() else []

    def piece_tokens(self, text: str) -> list[int]:
        """Token ids of a piece of text inside a sequence (the scripted tokenizer adds nothing)."""
        return self.tokenize(text)

    def detokenize(self, ids: Sequence[int]) -> str:
        try:
            return "".join(self._pieces[i] for i in ids)
        except KeyError as exc:
            raise ConfigError(f"token id {exc.args[0]} was never produced by this scripted LLM") from None

    def _register(self, piece: str) -> int:
        tid = token_id(piece)
        self._pieces[tid] = piece
        return tid

    def _respond(self, prompt: str, consume: bool = True) -> str | ScriptedTokens:
        for rule in self.rules:
            if re.search(rule.pattern, prompt, re.S):
                return rule.next(prompt) if consume else rule.peek(prompt)
        if self.default is not None:
            return self.default
        raise BackendError(f"scripted LLM has no rule for prompt: {prompt[:120]!r}")


def _binary_entropy(logprob: float) -> float:
    """The scripted next-token distribution has two outcomes: the token, and everything else."""
    p = math.exp(logprob)
    return -sum(x * math.log(x) for x in (p, 1.0 - p) if x > 0)


def _render_open(messages: Sequence[Message]) -> str:
    return "".join(f"<{m.role}>\n{m.content}\n" for m in messages) + "<assistant>\n"


def render(messages: Sequence[Message]) -> str:
    """A plain rendering of chat messages, for back-ends without a template; a final assistant
    message is continued."""
    if len(messages) == 1 and messages[0].role == "raw":
        return messages[0].content
    return render_continuing(messages, _render_open)


# ------------------------------------------------------------------------------- a script file
@dataclass(frozen=True)
class ScriptSettings:
    """`--llm scripted:FILE`: a scripted model whose rules come from a file (see `load_script`)."""

    path: str | None = None
    n_ctx: int = 4096
    n_threads: int | None = None


def load_script(path: str) -> dict:
    """The rules of a script file, TOML (`.toml`) or JSON (anything else):

        name = "paris"                      # optional: the model's identity is scripted:<name>:<sha>
        default = "I do not know"           # optional: the answer to a prompt no rule matches
        [[rules]]                           # tried in order: the first whose regular expression is
        pattern = "capital of France"       # found in the prompt answers it
        responses = ["Paris"]               # one per call, the last repeating (or response = "Paris")
        [[labels]]                          # label probabilities for yes/no judges and probes
        pattern = "sufficient"
        probs = { Yes = 0.8, No = 0.2 }

    A file that is missing or malformed is a ConfigError naming it and the field at fault."""
    import hashlib
    import json
    from pathlib import Path

    import tomllib

    file = Path(path).expanduser()
    try:
        raw_bytes = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"script file {path!r}: {exc.strerror or exc}") from None
    try:
        raw = tomllib.loads(raw_bytes.decode()) if file.suffix == ".toml" else json.loads(raw_bytes)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"script file {path!r} does not parse: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"script file {path!r}: the top level must be a table of rules, labels and default")
    unknown = sorted(set(raw) - {"name", "default", "rules", "labels"})
    if unknown:
        raise ConfigError(f"script file {path!r}: unknown field {unknown[0]!r} (fields: name, default, rules, labels)")
    rules = []
    for i, rule in enumerate(raw.get("rules", [])):
        responses = rule.get("responses", [rule["response"]] if "response" in rule else None) \
            if isinstance(rule, dict) else None
        if not isinstance(rule, dict) or not isinstance(rule.get("pattern"), str) or not responses \
                or not all(isinstance(r, str) for r in responses):
            raise ConfigError(f"script file {path!r}: rules[{i}] needs a pattern and responses (a list of strings)")
        rules.append((rule["pattern"], list(responses)))
    labels = []
    for i, rule in enumerate(raw.get("labels", [])):
        probs = rule.get("probs") if isinstance(rule, dict) else None
        if not isinstance(rule, dict) or not isinstance(rule.get("pattern"), str) or not isinstance(probs, dict) \
                or not all(isinstance(v, (int, float)) and 0 <= v <= 1 for v in probs.values()):
            raise ConfigError(f"script file {path!r}: labels[{i}] needs a pattern and probs (label -> 0..1)")
        labels.append((rule["pattern"], {str(k): float(v) for k, v in probs.items()}))
    default = raw.get("default")
    if default is not None and not isinstance(default, str):
        raise ConfigError(f"script file {path!r}: default must be a string")
    name = str(raw.get("name") or file.stem)
    return {"rules": rules, "label_rules": labels, "default": default,
            "name": f"{name}:{hashlib.sha256(raw_bytes).hexdigest()[:12]}"}


class ScriptFileLLM(ScriptedLLM):
    """The back-end of `--llm scripted:FILE`: a `ScriptedLLM` whose rules a file gives, so the CLI and
    experiment files can run any method with no model (its identity names the file's content)."""

    def __init__(self, settings: ScriptSettings):
        if not settings.path:
            raise ConfigError("--llm scripted needs a script file (--llm scripted:FILE)")
        script = load_script(settings.path)
        super().__init__(script["rules"], script["label_rules"], default=script["default"], name=script["name"])

    @classmethod
    def identity_for(cls, settings: ScriptSettings) -> str:
        return f"scripted:{load_script(settings.path or '')['name']}"
