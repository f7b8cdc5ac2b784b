"""The LLM protocol every back-end implements, the shared decoding settings, and the rules all
back-ends share: the stop rule, sampling, assistant-prefix continuation and whole-label scoring.

Methods never talk to a tokenizer: token ids, log-probabilities and label probabilities come
through this protocol (`Decoding.logprobs` on generation, `score_labels` for yes/no style judges).

The rules, the same in every back-end (`tests/test_llm_contract.py` checks them on each):

- Stop: the output text ends just before the earliest stop string. The token whose text crossed
  it was generated, so it is in `Completion.tokens` and counted in `completion_tokens`; nothing
  after it is generated. An end-of-sequence token ends with finish "eos" and is neither kept
  nor counted. `max_tokens` tokens without either end with finish "length".
- Continuation: a conversation whose last message has role "assistant" is continued: that turn is
  not closed, its text is the start of the answer (`render` = the rest rendered with the assistant
  turn opened, followed by the prefix). Completion text is only what comes after the prefix.
- Token-id prompts: `complete(TokenIds(...))` feeds the ids as they are (no template, no BOS).
- Sampling: a repetition penalty other than 1 first divides the positive logits and multiplies the
  negative ones of every token the prompt or the output so far holds (transformers' and vLLM's rule);
  then temperature 0 is greedy; otherwise softmax(logits / temperature) over the `top_k` best tokens
  (0: all; ties at the cut kept, as vLLM), cut to the smallest set whose probability reaches `top_p`,
  drawn with numpy's generator seeded by `seed`.
- Entropy: of the model's own next-token distribution (temperature 1), in nats.
- Labels: see `label_plan`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from metarag.errors import ConfigError
from metarag.records import Completion, LabelScores, Message, TokenLogprob


@dataclass(frozen=True)
class TokenIds:
    """A prompt given as token ids of the back-end's own tokenizer: fed as is (no template, no BOS)."""

    ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.ids:
            raise ConfigError("a token-id prompt needs at least one token")


Prompt = str | Sequence[Message] | TokenIds


@dataclass(frozen=True)
class Internals:
    """What a back-end with the weights at hand (transformers) returns when a request asks:
    `token_ids` = prompt then output, the first `n_prompt` being the prompt's; `attentions` one
    (heads, T, T) array per layer; `hidden_states` one (T, width) array per layer, embeddings first.
    Live arrays: kept in `Completion.internals`, never serialized."""

    token_ids: tuple[int, ...]
    n_prompt: int
    attentions: tuple[Any, ...] | None = None
    hidden_states: tuple[Any, ...] | None = None


@dataclass(frozen=True)
class Decoding:
    """How to decode one request. Greedy (temperature 0) by default, as in all three papers.

    `logprobs` is how many top alternatives to return per generated token (0 = none); per-token
    data is kept in a trace's Generate step only when `logprobs` > 0 or `keep_tokens` is set.
    `attentions` / `hidden_states` ask a back-end that has them (transformers) for the attention
    weights / hidden states of the prompt and output, in `Completion.internals`. `top_k` (0: off) and
    `repetition_penalty` (1: off) are vLLM's sampling parameters of the same names, applied by the
    shared rule (`sample_token`), passed on to vLLM and sent to a server."""

    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    temperature: float = 0.0
    seed: int = 0
    logprobs: int = 0
    top_p: float = 1.0
    keep_tokens: bool = False
    attentions: bool = False
    hidden_states: bool = False
    top_k: int = 0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0: off), got {self.top_k}")
        if not self.repetition_penalty > 0:
            raise ConfigError(f"repetition_penalty must be > 0 (1: off), got {self.repetition_penalty}")
        if self.max_tokens < 0:
            raise ConfigError(f"max_tokens must be >= 0, got {self.max_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.logprobs < 0:
            raise ConfigError(f"logprobs must be >= 0, got {self.logprobs}")
        if isinstance(self.stop, str):
            raise ConfigError(f"stop must be a tuple of strings, got the string {self.stop!r}")

    @property
    def wants_tokens(self) -> bool:
        """Whether a trace keeps this request's per-token data."""
        return self.logprobs > 0 or self.keep_tokens


# What a back-end can return per generated token: probabilities (`TokenLogprob.logprob`), the entropy
# of each next-token distribution (`TokenLogprob.entropy`), attention weights and hidden states
# (`Completion.internals`).
CAPABILITIES = ("token_logprobs", "token_entropy", "attentions", "hidden_states")


@runtime_checkable
class LLM(Protocol):
    """A text generator. `identity` names back-end and weights exactly (GGUF sha256, a model
    folder's weight hash, a trained checkpoint's hash, or a server's model name): it keys the
    response cache and is written into every run's manifest.

    Optional extras a back-end may have (callers test with `hasattr`): `generate_batch(prompts,
    decodings)` and `score_labels_batch(prompts, labels)` (one padded batch), `tokenize(text)`, and
    `provides`, the per-token data it returns (`CAPABILITIES`), which a method's `needs` is checked
    against before the first question (`methods.runner.check_needs`)."""

    identity: str

    def complete(self, prompt: str | TokenIds, decoding: Decoding = Decoding()) -> Completion:
        """Continue a raw prompt (no chat template) or a prompt given as token ids."""
        ...

    def chat(self, messages: Sequence[Message], decoding: Decoding = Decoding()) -> Completion:
        """Answer a conversation rendered with the model's own chat template; a final assistant
        message is continued, not closed."""
        ...

    def render(self, messages: Sequence[Message]) -> str:
        """The exact text `chat` feeds the model for `messages`."""
        ...

    def score_labels(self, prompt: Prompt, labels: Sequence[str]) -> LabelScores:
        """Probability of each whole label as the continuation of `prompt` (a conversation is
        rendered with the template, assistant turn opened), by the rule of `label_plan`."""
        ...


def as_messages(prompt: str | Sequence[Message]) -> tuple[Message, ...]:
    """A prompt as chat messages; a raw string becomes one message with role 'raw'."""
    if isinstance(prompt, str):
        return (Message("raw", prompt),)
    return tuple(prompt)


def is_raw(messages: Sequence[Message]) -> bool:
    return len(messages) == 1 and messages[0].role == "raw"


def generate(llm: LLM, prompt: Prompt, decoding: Decoding) -> Completion:
    """Dispatch a prompt to `complete` or `chat` by its form."""
    if isinstance(prompt, TokenIds):
        return llm.complete(prompt, decoding)
    messages = as_messages(prompt)
    if is_raw(messages):
        return llm.complete(messages[0].content, decoding)
    return llm.chat(messages, decoding)


def prompt_text(llm: LLM, prompt: str | Sequence[Message]) -> str:
    """The text a back-end feeds for a raw or chat prompt."""
    messages = as_messages(prompt)
    return messages[0].content if is_raw(messages) else llm.render(messages)


def prompt_ids(prompt: Prompt, tokenize: Callable[[str], list[int]], render: Callable[[Sequence[Message]], str],
               check_fits: Callable[[list[int]], list[int]]) -> list[int]:
    """The token ids a local back-end feeds for `prompt`: given ids checked to fit, else the raw text or
    the rendered chat tokenized (`tokenize` checks the fit itself)."""
    if isinstance(prompt, TokenIds):
        return check_fits(list(prompt.ids))
    messages = as_messages(prompt)
    return tokenize(messages[0].content if is_raw(messages) else render(messages))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def split_prefix(messages: Sequence[Message]) -> tuple[tuple[Message, ...], str | None]:
    """(the conversation before a final assistant message, that message's text) — or the messages
    and None when the last turn is not the assistant's."""
    messages = tuple(messages)
    if messages and messages[-1].role == "assistant":
        return messages[:-1], messages[-1].content
    return messages, None


def render_continuing(messages: Sequence[Message], render_open: Callable[[Sequence[Message]], str]) -> str:
    """Render with `render_open` (messages -> text with the assistant turn opened), continuing a final
    assistant message instead of closing it."""
    head, prefix = split_prefix(messages)
    return render_open(head) + (prefix or "")


# ------------------------------------------------------------------------------------- stop rule
def find_stop(text: str, stop: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """(index, stop string) of the earliest stop string found in `text` at or after `start` (the
    longest one when two start at the same index), or None."""
    best: tuple[int, str] | None = None
    for s in stop:
        if not s:
            continue
        i = text.find(s, start)
        if i >= 0 and (best is None or i < best[0] or (i == best[0] and len(s) > len(best[1]))):
            best = (i, s)
    return best


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut `text` at the earliest stop sequence; says whether one was found."""
    found = find_stop(text, stop)
    return (text[:found[0]], True) if found else (text, False)


class TokenStream:
    """Collects generated tokens one at a time and applies the stop rule; a back-end pushes each
    token with the decoded raw output so far and stops when `push` returns True."""

    def __init__(self, stop: Sequence[str]):
        self.stop = tuple(s for s in stop if s)
        self.longest = max((len(s) for s in self.stop), default=0)
        self.tokens: list[TokenLogprob] = []
        self.raw = ""
        self.fired: tuple[int, str] | None = None

    def push(self, token_id: int | None, piece: str, raw_after: str, logprob: float,
             top: tuple[tuple[str, float], ...] = (), entropy: float | None = None) -> bool:
        """Record one token; `raw_after` is the whole output decoded through it (an incomplete
        UTF-8 character at its end already dropped). True when a stop string has fired."""
        offset = len(self.raw)
        self.tokens.append(TokenLogprob(piece, float(logprob), top, token_id, offset, entropy))
        self.raw = raw_after
        if self.stop:
            self.fired = find_stop(raw_after, self.stop, max(0, offset - self.longest + 1))
        return self.fired is not None

    def finish(self, ended_by_eos: bool) -> tuple[str, str, str | None]:
        """(text, finish_reason, stop string) by the stop rule."""
        if self.fired is not None:
            return self.raw[:self.fired[0]], "stop", self.fired[1]
        return self.raw, ("eos" if ended_by_eos else "length"), None


# -------------------------------------------------------------------------------------- sampling
def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - float(np.max(logits))
    return shifted - np.log(np.exp(shifted).sum())


def entropy_of(logprobs: np.ndarray) -> float:
    """Entropy in nats of a distribution given as log-probabilities."""
    p = np.exp(logprobs)
    return float(-(p * np.where(p > 0, logprobs, 0.0)).sum())


def top_alternatives(logprobs: np.ndarray, k: int, piece: Callable[[int], str]) -> tuple[tuple[str, float], ...]:
    """The k most likely tokens as (text, log-prob), best first."""
    if k <= 0:
        return ()
    k = min(k, logprobs.shape[0])
    best = np.argpartition(-logprobs, k - 1)[:k]
    best = best[np.argsort(-logprobs[best], kind="stable")]
    return tuple((piece(int(t)), float(logprobs[t])) for t in best)


def sample_token(logits: np.ndarray, decoding: Decoding, rng: np.random.Generator,
                 history: Sequence[int] = ()) -> int:
    """The next token by the shared sampling rule (see the module docstring); `history` is the
    token ids of the prompt and of the output so far, which a repetition penalty reads."""
    if decoding.repetition_penalty != 1.0 and len(history):
        logits = penalized(logits, history, decoding.repetition_penalty)
    if decoding.temperature <= 0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / decoding.temperature
    if 0 < decoding.top_k < scaled.shape[0]:
        kth = np.partition(scaled, -decoding.top_k)[-decoding.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    p = np.exp(scaled - scaled.max())
    p /= p.sum()
    if decoding.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        keep = int(np.searchsorted(np.cumsum(p[order]), decoding.top_p) + 1)
        mask = np.zeros_like(p)
        mask[order[:keep]] = p[order[:keep]]
        p = mask / mask.sum()
    return int(rng.choice(p.shape[0], p=p))


def penalized(logits: np.ndarray, history: Sequence[int], penalty: float) -> np.ndarray:
    """The logits with the repetition penalty on every token id in `history`: a positive logit
    divided by `penalty`, a negative one multiplied (CTRL's rule, as transformers and vLLM apply it)."""
    seen = np.unique(np.asarray(history, dtype=np.int64))
    out = logits.astype(np.float64, copy=True)
    picked = out[seen]
    out[seen] = np.where(picked > 0, picked / penalty, picked * penalty)
    return out


# ---------------------------------------------------------------------------------------- labels
def label_variants(label: str) -> tuple[str, ...]:
    """The spellings of a label that count as the label: as written, lower-case, capitalized and
    upper-case, each bare and after one leading space (after a chat template's assistant header a
    model's first token carries no space; after "Answer:" in a raw prompt it does)."""
    if not label.strip():
        raise ConfigError(f"label {label!r} is empty")
    base = label.strip()
    forms = dict.fromkeys((base, base.lower(), base.capitalize(), base.upper()))
    return tuple(dict.fromkeys([f for f in forms] + [" " + f for f in forms]))


def label_plan(labels: Sequence[str], tokenize: Callable[[str], Sequence[int]]) -> list[tuple[tuple[int, ...], ...]]:
    """The token sequences that score each label, by the one rule every back-end uses.

    P(label) = Σ over the label's variants (`label_variants`) of Π over the variant's tokens of
    P(token | prompt, the tokens before it): teacher-forced whole-label probability, summed over
    variants (distinct token sequences, none a prefix of another, are disjoint continuations, so
    the sum is a probability; a variant whose sequence extends another of the same label is already
    counted by it and dropped; a path below PRUNE_LOGPROB counts 0). A label set where a sequence
    of one label equals or starts another label's sequence is refused: such labels cannot be told
    apart (ConfigError naming both)."""
    if len(set(labels)) != len(labels) or not labels:
        raise ConfigError(f"labels must be distinct and at least one, got {tuple(labels)!r}")
    plans: list[tuple[tuple[int, ...], ...]] = []
    for label in labels:
        seqs = []
        for variant in label_variants(label):
            ids = tuple(int(t) for t in tokenize(variant))
            if not ids:
                raise ConfigError(f"label {label!r} has no tokens")
            seqs.append(ids)
        seqs = sorted(set(seqs), key=len)
        kept: list[tuple[int, ...]] = []
        for seq in seqs:
            if not any(seq[:len(k)] == k for k in kept):
                kept.append(seq)
        plans.append(tuple(kept))
    for i, a in enumerate(plans):
        for j, b in enumerate(plans):
            if i == j:
                continue
            for x in a:
                for y in b:
                    if y[:len(x)] == x:
                        raise ConfigError(f"labels {labels[i]!r} and {labels[j]!r} collide: a tokenization of "
                                          f"{labels[i]!r} is {'the same as' if x == y else 'a prefix of'} one of "
                                          f"{labels[j]!r}; choose labels that differ in their first tokens")
    return plans


# A label-token path whose probability falls below this is counted as 0 and not followed further:
# it cannot matter beside LabelScores.MIN_MASS, and it saves a model call per pruned token.
PRUNE_LOGPROB = math.log(1e-9)


def label_probs(plans: Sequence[Sequence[tuple[int, ...]]],
                next_logprobs: Callable[[tuple[int, ...]], np.ndarray]) -> tuple[float, ...]:
    """Each label's probability; `next_logprobs(prefix)` is the next-token log-distribution after
    the prompt followed by `prefix` (label tokens), asked at most once per prefix, parents before
    children, and never below a path already under PRUNE_LOGPROB."""
    seen: dict[tuple[int, ...], np.ndarray] = {}

    def dist(prefix: tuple[int, ...]) -> np.ndarray:
        if prefix not in seen:
            seen[prefix] = next_logprobs(prefix)
        return seen[prefix]

    probs = []
    for seqs in plans:
        total = 0.0
        for seq in seqs:
            logprob = 0.0
            for i in range(len(seq)):
                logprob += float(dist(seq[:i])[seq[i]])
                if logprob < PRUNE_LOGPROB:
                    break
            else:
                total += math.exp(logprob)
        probs.append(min(total, 1.0))
    return tuple(probs)


def label_prefixes(plans: Sequence[Sequence[tuple[int, ...]]]) -> list[tuple[int, ...]]:
    """Every distinct label-token prefix whose next-token distribution the scoring needs, shortest
    first (the empty prefix is the prompt itself)."""
    needed = {seq[:i] for seqs in plans for seq in seqs for i in range(len(seq))}
    return sorted(needed, key=lambda p: (len(p), p))
