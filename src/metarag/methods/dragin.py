"""DRAGIN (Su et al., 2024, "DRAGIN: Dynamic Retrieval Augmented Generation based on the Real-time
Information Needs of Large Language Models", ACL): retrieve when the model's own generation shows an
information need, with the query the need points at, then regenerate from before the need.

One question, as a policy over the shared runner loop (§3; the official code oneal2000/DRAGIN,
src/generate.py, class AttnWeightRAG, is followed where the paper leaves a detail open):

1. The model writes up to `generate_max_length` tokens of its chain-of-thought answer, continuing
   the answer written so far (few-shot exemplars, question, answer so far).
2. RIND (§3.1): the output is split into words and sentences; a word's score is
   entropy × attention × s, where entropy is the mean over its tokens of the entropy of the model's
   next-token distribution, attention is the largest attention any later output token pays it
   (last layer, max over later tokens, mean over heads, summed over its tokens, normalized over the
   sentence and multiplied by the sentence's word count, as the code does), and s is 0 for
   stopwords and punctuation, 1 otherwise. The first sentence holding a word scored above the
   threshold θ triggers retrieval; without one the whole output joins the answer.
3. QFS (§3.2): the query is the question and the `query_words` real words the triggering words
   attend to most (the attention of the position that produced each of their tokens, mean over
   heads, normalized, averaged over the triggering words), in text order.
4. The top-k passages are retrieved and put in the prompt, the answer is cut before the triggering
   sentence, and the model writes on from there: its first sentence joins the answer. The next
   round's prompt has no passages again, as in the code.
5. Rounds stop once the answer holds "the answer is", passes `generate_max_length` tokens, or
   stops growing (the code's three tests); the short answer is read by the toolkit's CoT rule.

Two methods, named for what they compute:

- `dragin`: exactly the above. It needs attention weights, which only the transformers back-end
  returns (`Completion.internals`); on any other back-end it refuses with one line naming the two
  ways out (`--llm hf`, `hf-0.5b`, `hf:PATH`, or `dragin-entropy`).
- `dragin-entropy`: the same loop with the word score entropy × s alone (no attention), so it runs
  on every back-end that reports token entropy (llama.cpp, transformers). Its query cannot follow
  attention: it is the triggering sentence with the triggering words masked (removed), which is the
  official code's `current_wo_wrong` query formulation; the question when nothing is left.

Departures, on purpose: 3 short exemplars written from HotpotQA training questions instead of the
config's 8 ("fewshot": 8): a 1.5B model's context cannot hold 8 next to the passages (IterDRAG's
docstring gives the same reason). The stopword test s is NLTK's English stopword list (below) where
the code keeps nouns, verbs, adjectives, proper nouns and numbers by spaCy part-of-speech tags
(spaCy is not shipped; the paper defines s by a stopword list). The attention for the score is read
from the pass over prompt and output (the code re-runs the output alone, making its first token the
attention sink); the normalization over the sentence cancels the scale. "Later tokens" are strictly
later (the paper); the code's max includes the token's attention to itself. The query's ranked
words are the output's: the question and the answer written in earlier rounds sit in the prompt,
whose token texts the LLM protocol does not return, so the question is kept whole at the query's
start instead of competing word by word (with 35 query words the code keeps nearly all of it too),
and the answer written in earlier rounds is left out of the query altogether: the code ranks its
words with the rest and can draw query words from it, this query cannot.
Generation stops at "\\nQuestion:" (the code generates on into a next exemplar and cuts later).
"""
from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metarag.errors import ConfigError
from metarag.llm.base import Decoding
from metarag.methods.fixed_point import LoopState
from metarag.methods.runner import Policy
from metarag.parsing import extract_short_answer, sentence_spans
from metarag.policy.actions import Ask, Note, Search
from metarag.policy.evidence import format_passages
from metarag.records import Completion, Hit, Message, Question, TokenLogprob
from metarag.settings import check_ranges, setting

# NLTK's English stopword list (nltk_data corpora/stopwords/english, 179 words), as the paper's
# stopword set S; a word is compared lower-cased with the punctuation around it stripped.
STOPWORDS = frozenset("""
i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself yourselves he him his
himself she she's her hers herself it it's its itself they them their theirs themselves what which who whom this
that that'll these those am is are was were be been being have has had having do does did doing a an the and but
if or because as until while of at by for with about against between into through during before after above below
to from up down in out on off over under again further then once here there when where why how all any both each
few more most other some such no nor not only own same so than too very s t can will just don don't should
should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn doesn't hadn hadn't hasn hasn't
haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't shan shan't shouldn shouldn't wasn wasn't
weren weren't won won't wouldn wouldn't
""".split())

SYSTEM = "You are a careful assistant for multi-hop question answering."
INSTRUCTION = ("Answer the question by reasoning step by step in short sentences, and end with "
               "'So the answer is <short answer>.' (a name, a date, a number, a short phrase, or yes/no), "
               "as in the examples.")
# Written from HotpotQA training questions (train100_official.json) and their supporting facts, in
# DRAGIN's CoT exemplar format ("... So the answer is X.").
EXEMPLARS = (
    ("Who directed the film that was shot in or around Leland, North Carolina in 1986?",
     "Maximum Overdrive (1986) was shot in or around Leland, North Carolina. Maximum Overdrive was written and "
     "directed by Stephen King. So the answer is Stephen King."),
    ("Which band was formed first, The Exies or Circus Diablo?",
     "The Exies were formed in 1997. Circus Diablo was formed in 2006. 1997 is earlier than 2006. "
     "So the answer is The Exies."),
    ("Are Christopher Nolan and Sathish Kalathil both film directors?",
     "Christopher Nolan is an English-American film director. Sathish Kalathil is an Indian film and "
     "documentary director. So the answer is yes."),
)
EXEMPLAR = "Question: {question}\nAnswer: {answer}"
# As the code's retrieval prompt: the passages, then "Answer in the same format as before."
CONTEXT = "Context:\n{passages}\nAnswer in the same format as before."
QUESTION = "Question: {question}"
ANSWER_PREFIX = "Answer:"
STOP = ("\nQuestion:",)
DONE = "the answer is"
FORCE_ANSWER = "So the answer is"

NEEDS_ATTENTION = ("dragin needs attention weights, which this LLM back-end does not return: run it with "
                   "--llm hf (or hf-0.5b, hf:PATH), or use the method dragin-entropy (entropy alone)")
NEEDS_ENTROPY = ("{name} needs each generated token's entropy, which this LLM back-end does not return "
                 "(an OpenAI-compatible server gives only top alternatives): use --llm embedded, gguf:PATH or hf")


@dataclass(frozen=True)
class DRAGINSettings:
    """DRAGIN settings: the official HotpotQA configuration for Llama2-7b-chat, the smallest model
    the paper ran (oneal2000/DRAGIN, config/Llama2-7b-chat/HotpotQA/DRAGIN.json):
    threshold θ = 0.8 ("hallucination_threshold"; 1.2 in the 13B configs), k = 3 passages
    ("retrieve_topk"), query_words = 35 ("retrieve_keep_top_k" with "query_formulation":
    "real_words"; `dragin` only), generate_max_length = 100 tokens per generation and for the whole answer
    ("generate_max_length"), exemplars 3 of the config's 8 ("fewshot"; see the module docstring).
    max_rounds bounds the loop, which the code bounds only by the answer's length: 8, EvoCtx's
    round budget T (EvoCtx §4.1 aligns its baselines to T = 8), so at most 8 retrieval calls.
    `stop_at_fixed_point`: the shared rule (`methods/fixed_point.py`) on the answer so far; it
    cannot fire as the loop stands, since a round that does not grow the answer ends the loop.
    `force_answer`: a chain that ends without "the answer is" (its budget spent, or the model
    stopped) is continued with " So the answer is" for `answer_max_tokens` = 20 tokens, as the
    authors' evaluation does (src/eval.py, `regenerate_answer`); off, the answer is read from the
    chain alone (its first line when it names none)."""

    threshold: float = setting(0.8, ge=0)
    k: int = setting(3, ge=1)
    query_words: int = setting(35, ge=1)
    generate_max_length: int = setting(100, ge=1)
    exemplars: int = setting(3, ge=0, le=len(EXEMPLARS))
    max_rounds: int = setting(8, ge=1)
    stop_at_fixed_point: bool = True
    force_answer: bool = True
    answer_max_tokens: int = setting(20, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class Word:
    """One whitespace-delimited word of an output: its text, character span and the indices of the
    output tokens whose first character lies in it."""

    text: str
    start: int
    end: int
    tokens: tuple[int, ...]

    @property
    def core(self) -> str:
        """The word without the punctuation around it."""
        return re.sub(r"^\W+|\W+$", "", self.text)

    @property
    def real(self) -> bool:
        """s of RIND: 1 unless the word is a stopword or has no letter or digit."""
        core = self.core.lower()
        return any(c.isalnum() for c in core) and core not in STOPWORDS


@dataclass(frozen=True)
class Trigger:
    """The first sentence with a word scored above θ: its span, its words (indices into the output's
    words) and which of them triggered, with the best score."""

    sentence: tuple[int, int]
    index: int
    words: tuple[int, ...]
    hits: tuple[int, ...]
    score: float


class DRAGIN:
    """DRAGIN as a policy: RIND decides when to retrieve, QFS what to retrieve (attention version)."""

    name = "dragin"
    revision = 2  # 2: the forced final answer (force_answer)
    attention = True
    # checked against the back-end before the first question (methods.runner.check_needs)
    needs = {"token_entropy": NEEDS_ENTROPY.format(name="dragin"), "attentions": NEEDS_ATTENTION}

    def __init__(self, settings: DRAGINSettings = DRAGINSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        s = self.settings
        answer, length = "", 0  # the answer so far and its length in tokens
        for round_ in range(s.max_rounds):
            if s.stop_at_fixed_point:
                if (yield LoopState((answer,), round_, s.max_rounds - 1)) is not None:
                    break
            out = yield Ask("generate", self.prompt(question.text, answer, ()), Decoding(
                max_tokens=s.generate_max_length, stop=STOP, keep_tokens=True, attentions=self.attention))
            tokens = kept_tokens(out)
            if any(t.entropy is None for t in tokens):
                raise ConfigError(NEEDS_ENTROPY.format(name=self.name))
            words = output_words(out.text, tokens)
            amax = self.later_attention(out, len(tokens))
            trigger = find_trigger(out.text, words, tokens, amax, s.threshold)
            if trigger is None:
                yield Note("dragin-trigger", "none", (("round", float(round_)), ("words", float(len(words)))))
                grown, added = join(answer, out.text), len(tokens)
            else:
                yield Note("dragin-trigger", "retrieve", (
                    ("round", float(round_)), ("sentence", float(trigger.index)), ("hits", float(len(trigger.hits))),
                    ("score", trigger.score), ("threshold", s.threshold)))
                query = self.query(question.text, out, tokens, words, trigger)
                hits = yield Search(query, s.k)
                before = out.text[:trigger.sentence[0]]
                prefix = join(answer, before)
                resumed = yield Ask("generate-with-passages", self.prompt(question.text, prefix, hits),
                                    Decoding(max_tokens=s.generate_max_length, stop=STOP, keep_tokens=True))
                spans = sentence_spans(resumed.text)  # the first sentence of the resumed output joins
                end = spans[0][1] if spans else 0
                grown = join(prefix, resumed.text[:end])
                added = sum(1 for t in tokens if t.offset < trigger.sentence[0]) + \
                    sum(1 for t in kept_tokens(resumed) if t.offset < end)
            if len(grown) <= len(answer):
                break
            answer, length = grown, length + added
            if length > s.generate_max_length or DONE in answer.lower():
                break
        if s.force_answer and DONE not in answer.lower():
            # the authors' evaluation (src/eval.py, regenerate_answer): the chain so far, " So the answer
            # is", and 20 more tokens, with the exemplars and the question but no passages
            forced = join(answer, FORCE_ANSWER)
            out = yield Ask("force-answer", self.prompt(question.text, forced, ()),
                            Decoding(max_tokens=s.answer_max_tokens, stop=STOP))
            answer = join(forced, out.text.strip())
        return extract_short_answer(answer)

    # ---------------------------------------------------------------------------------- prompts
    def prompt(self, question: str, answer: str, hits: Sequence[Hit]) -> tuple[Message, ...]:
        """Exemplars, the passages when retrieved, the question, and the answer so far continued."""
        parts = [INSTRUCTION] + [EXEMPLAR.format(question=q, answer=a) for q, a in EXEMPLARS[:self.settings.exemplars]]
        if hits:
            parts.append(CONTEXT.format(passages=format_passages(hits)))
        parts.append(QUESTION.format(question=question))
        return (Message("system", SYSTEM), Message("user", "\n\n".join(parts)),
                Message("assistant", join(ANSWER_PREFIX, answer)))

    # ----------------------------------------------------------------------------------- signals
    def later_attention(self, out: Completion, n: int) -> np.ndarray | None:
        """For each of the first n output tokens, the largest attention a later output token pays it
        (last layer, max over later tokens, then mean over heads, as the code); None for the
        entropy-only variant. Refuses a back-end without attention weights."""
        attentions = last_layer(out)
        first = out.internals.n_prompt
        block = attentions[:, first:first + n, first:first + n]  # (heads, queries, keys)
        later = np.tril(np.ones((n, n)), k=-1)  # query row after key column
        return (block * later).max(axis=1, initial=0.0).mean(axis=0)

    def query(self, question: str, out: Completion, tokens: Sequence[TokenLogprob], words: Sequence[Word],
              trigger: Trigger) -> str:
        """QFS: the question and the real words the triggering words attend to most, in text order."""
        attentions = last_layer(out).mean(axis=0)  # (T, T), mean over heads
        first = out.internals.n_prompt
        paid = np.zeros(len(tokens))
        for w in trigger.hits:
            word = words[w]
            before = word.tokens[0]  # output positions before the word
            row = np.zeros(len(tokens))
            for t in word.tokens:
                # the position that produced token t is the one before it (the code's "previous position")
                attention = attentions[first + t - 1, first:first + before]
                total = attention.sum()
                if total > 0:
                    row[:before] += attention / total
            paid += row / len(word.tokens)
        paid /= len(trigger.hits)
        hits = set(trigger.hits)
        end = trigger.sentence[1]
        candidates = [(float(paid[list(word.tokens)].sum()), i) for i, word in enumerate(words)
                      if i not in hits and word.start < end and word.real]
        best = sorted(candidates, key=lambda c: -c[0])[:self.settings.query_words]
        return join(question, " ".join(words[i].core for _, i in sorted(best, key=lambda c: c[1])))


class DRAGINEntropy(DRAGIN):
    """DRAGIN's loop with the RIND score entropy × s alone and the masked-sentence query: for back-ends
    without attention weights (see the module docstring)."""

    name = "dragin-entropy"
    revision = 2  # 2: the forced final answer (force_answer)
    attention = False
    needs = {"token_entropy": NEEDS_ENTROPY.format(name="dragin-entropy")}

    def later_attention(self, out: Completion, n: int) -> None:
        return None

    def query(self, question: str, out: Completion, tokens: Sequence[TokenLogprob], words: Sequence[Word],
              trigger: Trigger) -> str:
        """The triggering sentence without its triggering words (the code's `current_wo_wrong`); the
        question when no real word is left."""
        kept = [words[i] for i in trigger.words if i not in set(trigger.hits)]
        if not any(w.real for w in kept):
            return question
        return " ".join(w.text for w in kept)


# ----------------------------------------------------------------------------------- helpers
def last_layer(out: Completion) -> np.ndarray:
    """The last layer's attention weights (heads, T, T) of a completion, or the one-line refusal."""
    internals = out.internals
    if internals is None or not internals.attentions:
        raise ConfigError(NEEDS_ATTENTION)
    return np.asarray(internals.attentions[-1], dtype=np.float64)


def kept_tokens(out: Completion) -> list[TokenLogprob]:
    """The output tokens whose text is in the completion (the one that crossed a stop string is not)."""
    return [t for t in out.tokens or () if t.offset < len(out.text)]


def output_words(text: str, tokens: Sequence[TokenLogprob]) -> list[Word]:
    """The words of `text` with the tokens that start in each; a word no token starts in is left out
    (a token spanning two words counts for the first)."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    starts = [a for a, _ in spans]
    owned: list[list[int]] = [[] for _ in spans]
    for i, token in enumerate(tokens):
        if not token.token.strip():
            continue
        at = token.offset + len(token.token) - len(token.token.lstrip())
        w = bisect.bisect_right(starts, at) - 1
        if w >= 0 and at < spans[w][1]:
            owned[w].append(i)
    return [Word(text[a:b], a, b, tuple(own)) for (a, b), own in zip(spans, owned) if own]


def find_trigger(text: str, words: Sequence[Word], tokens: Sequence[TokenLogprob], amax: np.ndarray | None,
                 threshold: float) -> Trigger | None:
    """RIND over the output's sentences in order: the first sentence with a word scored above θ."""
    for index, (start, end) in enumerate(sentence_spans(text)):
        inside = [i for i, w in enumerate(words) if start <= w.start < end]
        if not inside:
            continue
        entropy = [float(np.mean([tokens[t].entropy for t in words[i].tokens])) for i in inside]
        if amax is None:
            factor = [1.0] * len(inside)
        else:
            paid = [float(sum(amax[t] for t in words[i].tokens)) for i in inside]
            total = sum(paid)
            factor = [p / total * len(inside) if total > 0 else 0.0 for p in paid]
        scores = [h * a * words[i].real for h, a, i in zip(entropy, factor, inside)]
        hits = tuple(i for i, score in zip(inside, scores) if score > threshold)
        if hits:
            return Trigger((start, end), index, tuple(inside), hits, max(scores))
    return None


def join(*parts: str) -> str:
    """Texts joined by one space, empty ones skipped (the code's `" ".join(s for s in ... if s)`)."""
    return " ".join(p.strip() for p in parts if p.strip())
