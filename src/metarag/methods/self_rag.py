"""Self-RAG (Asai et al., 2024, "Self-RAG: Learning to Retrieve, Generate, and Critique through
Self-Reflection", ICLR): a model trained to emit reflection tokens decides whether to retrieve,
writes one answer segment per retrieved passage and critiques each; the best-scored segment is kept.

Short-form inference, as the paper's §3.3 and its code (AkariAsai/self-rag, retrieval_lm/
run_short_form.py, `call_model_rerank_w_scores_batch`) run it, as a policy over the shared loop:

1. Retrieve? P([Retrieval]) / (P([Retrieval]) + P([No Retrieval])) as the first token of the
   response, against the threshold δ. Below it the model answers after "[No Retrieval]".
2. Otherwise, for each of the top-k passages, the segment prompt is the prompt followed by
   "[Retrieval]<paragraph>{title}\\n{text}</paragraph>": ISREL is P([Relevant]) normalized over
   [Relevant] / [Irrelevant] as the first token; the model writes its segment greedily; ISSUP is
   P([Fully supported]) + 0.5 P([Partially supported]), normalized over the three support tokens,
   where the first support token appears in the segment (0 when none appears, as the code);
   ISUSE is Σ w_i P([Utility:i]) with w = (-1, -0.5, 0, 0.5, 1), normalized over the five, where the
   first utility token appears (0 when none does).
3. Each segment's score is exp(mean token log-prob) (the code's `--use_seqscore`) + w_rel ISREL +
   w_sup ISSUP + w_use ISUSE; the best segment (the first of equals) is the answer, its reflection
   tokens removed.

Each label probability is read by a `Probe` at the place the code reads the token's log-prob: the
prompt followed by the segment up to that place (greedy decoding, so the prefix is the one the model
generated). A Self-RAG checkpoint comes by `--llm hf:PATH` or `--llm gguf:PATH`; its reflection
tokens are single tokens of its vocabulary. No such checkpoint is available offline here, so the
tests script the reflection-token probabilities.

`self-rag-prompted` runs the same algorithm on an ordinary instruction model, which has no
reflection tokens: each reflection is a question put to the model, answered by the probability of
the label words (a `Probe` over the label set): "Would passages help?" (Yes / No) for Retrieve,
Relevant / Irrelevant for ISREL, Fully / Partially / No for ISSUP and 1 … 5 for ISUSE, each asked
after the answer it judges rather than read inside one generation; the answer is asked for with a
short-answer prompt, one per passage. The retrieval threshold, weights and scores are Self-RAG's.
It is a prompted imitation of the method, not Self-RAG: the judgments come from a model never
trained to make them.

Departures, on purpose: the retrieval decision reads probabilities, as the paper (§3.3) defines it
and FlashRAG's reimplementation computes it; run_short_form.py divides the two tokens' log-probs as
vLLM returns them, unexponentiated, a ratio that falls as P([Retrieval]) rises. The question itself
is the retrieval query and the instruction (the code's PopQA / TriviaQA input).
"""
from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from metarag.llm.base import Decoding
from metarag.methods.runner import Policy
from metarag.parsing import clean_answer
from metarag.policy.actions import Ask, Note, Probe, Search
from metarag.policy.evidence import format_passages
from metarag.records import Completion, Hit, LabelScores, Message, Question
from metarag.settings import check_ranges, setting

# The reflection tokens of a Self-RAG checkpoint (retrieval_lm/utils.py).
RETRIEVAL, NO_RETRIEVAL = "[Retrieval]", "[No Retrieval]"
RELEVANT, IRRELEVANT = "[Relevant]", "[Irrelevant]"
SUPPORT = ("[Fully supported]", "[Partially supported]", "[No support / Contradictory]")
UTILITY = tuple(f"[Utility:{i}]" for i in range(1, 6))
CONTROL_TOKENS = (RETRIEVAL, NO_RETRIEVAL, RELEVANT, IRRELEVANT, *SUPPORT, *UTILITY, "<paragraph>", "</paragraph>",
                  "[Continue to Use Evidence]")
SUPPORT_WEIGHTS = (1.0, 0.5, 0.0)  # ISSUP: fully, partially, none
UTILITY_WEIGHTS = (-1.0, -0.5, 0.0, 0.5, 1.0)  # ISUSE: [Utility:1] .. [Utility:5]

# The checkpoint's own prompt format (PROMPT_DICT["prompt_no_input"]) and segment prefix.
SELF_RAG_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
PARAGRAPH = "[Retrieval]<paragraph>{title}\n{text}</paragraph>"


@dataclass(frozen=True)
class SelfRAGSettings:
    """Self-RAG short-form settings (AkariAsai/self-rag README, "Short-form" commands, and
    run_short_form.py): threshold δ = 0.2 (`--threshold 0.2` in every command); k = 5 passages
    (`--ndocs 5`, the ARC-Challenge and PubHealth commands; 10 for PopQA; 5 is also EvoCtx's k);
    w_rel = 1, w_sup = 1, w_use = 0.5 (the README's defaults and the function's; the argparse default
    of w_use is 1.0, which the README's commands leave in place); use_seqscore = True
    (`--use_seqscore` in every command); max_tokens = 100 (`--max_new_tokens 100`, PopQA)."""

    k: int = setting(5, ge=1)
    threshold: float = setting(0.2, ge=0, le=1)
    w_rel: float = setting(1.0, ge=0)
    w_sup: float = setting(1.0, ge=0)
    w_use: float = setting(0.5, ge=0)
    use_seqscore: bool = True
    max_tokens: int = setting(100, ge=1)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class Segment:
    """One passage's segment: its answer and critique scores."""

    answer: str
    relevance: float
    support: float
    utility: float
    sequence: float

    def score(self, s: Any) -> float:
        return (self.sequence if s.use_seqscore else 0.0) + s.w_rel * self.relevance + s.w_sup * self.support + \
            s.w_use * self.utility


class SelfRAG:
    """Self-RAG's short-form inference over a Self-RAG checkpoint (reflection tokens in its vocabulary)."""

    name = "self-rag"
    revision = 1

    def __init__(self, settings: SelfRAGSettings = SelfRAGSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        s = self.settings
        scores = yield Probe("retrieve", self.retrieve_prompt(question.text), self.retrieve_labels)
        p_retrieve, fallback = scores.p(self.retrieve_labels[0])  # no mass: 1/2, above δ = 0.2: retrieve
        retrieve = p_retrieve > s.threshold
        yield Note("self-rag-retrieve", "retrieve" if retrieve else "no-retrieval",
                   (("p_retrieval", p_retrieve), ("threshold", s.threshold), ("no_label_mass", float(bool(fallback)))))
        if not retrieve:
            out = yield Ask("answer", self.closed_prompt(question.text), self.decoding(logprobs=False))
            return postprocess(out.text)
        hits = yield Search(question.text, s.k)
        segments = []
        for rank, hit in enumerate(hits, 1):
            segment = yield from self.segment(question.text, hit)
            segments.append(segment)
            yield Note("self-rag-segment", f"passage {rank}", (
                ("relevance", segment.relevance), ("support", segment.support), ("utility", segment.utility),
                ("sequence", segment.sequence), ("score", segment.score(s))))
        if not segments:  # nothing retrieved: the model answers on its own
            out = yield Ask("answer", self.closed_prompt(question.text), self.decoding(logprobs=False))
            return postprocess(out.text)
        best = max(range(len(segments)), key=lambda i: (segments[i].score(s), -i))
        yield Note("self-rag-select", f"passage {best + 1}", (("score", segments[best].score(s)),))
        return segments[best].answer

    # ------------------------------------------------------------------------------ the checkpoint
    retrieve_labels = (RETRIEVAL, NO_RETRIEVAL)

    def decoding(self, logprobs: bool = True) -> Decoding:
        return Decoding(max_tokens=self.settings.max_tokens, logprobs=1 if logprobs else 0)

    def retrieve_prompt(self, question: str) -> tuple[Message, ...]:
        return (Message("raw", SELF_RAG_PROMPT.format(instruction=question)),)

    def closed_prompt(self, question: str) -> tuple[Message, ...]:
        return (Message("raw", SELF_RAG_PROMPT.format(instruction=question) + NO_RETRIEVAL),)

    def segment(self, question: str, hit: Hit) -> Generator[Any, Any, Segment]:
        """One passage's segment, read where the checkpoint writes its reflection tokens."""
        prompt = SELF_RAG_PROMPT.format(instruction=question) + \
            PARAGRAPH.format(title=hit.passage.title, text=hit.passage.text)
        rel = yield Probe("isrel", (Message("raw", prompt),), (RELEVANT, IRRELEVANT))
        out = yield Ask("segment", (Message("raw", prompt),), self.decoding())
        support = utility = 0.0
        at = first_of(out.text, SUPPORT)
        if at is not None:  # the code scores support only where the model wrote a support token
            scores = yield Probe("issup", (Message("raw", prompt + out.text[:at]),), SUPPORT)
            support = weighted(scores, SUPPORT_WEIGHTS)
        at = first_of(out.text, UTILITY)
        if at is not None:
            scores = yield Probe("isuse", (Message("raw", prompt + out.text[:at]),), UTILITY)
            utility = weighted(scores, UTILITY_WEIGHTS)
        return Segment(postprocess(out.text), rel.p(RELEVANT)[0], support, utility, sequence_score(out))


# --------------------------------------------------------------------------------- prompted
RETRIEVE_QUESTION = ("Question: {question}\nWould passages retrieved from Wikipedia help you answer this question "
                     "correctly? Answer Yes or No.")
ANSWER_SYSTEM = ("Answer the question using the passage when it helps. Give a short answer only: a name, a date, "
                 "a number, a short phrase, or yes/no. Do not explain.")
CLOSED_SYSTEM = ("Answer the question. Give a short answer only: a name, a date, a number, a short phrase, or "
                 "yes/no. Do not explain.")
ANSWER_USER = "Passage:\n{passage}\n\nQuestion: {question}\nShort answer:"
CLOSED_USER = "Question: {question}\nShort answer:"
RELEVANCE_QUESTION = ("Passage:\n{passage}\n\nQuestion: {question}\nIs the passage relevant to the question, that "
                      "is, does it give information useful to answer it? Answer Relevant or Irrelevant.")
SUPPORT_QUESTION = ("Passage:\n{passage}\n\nQuestion: {question}\nAnswer: {answer}\nIs the answer supported by the "
                    "passage? Answer Fully (everything in the answer is supported), Partially, or No.")
UTILITY_QUESTION = ("Question: {question}\nAnswer: {answer}\nRate how useful the answer is for the question, from "
                    "1 (not useful at all) to 5 (complete and highly useful). Answer with one digit.")
PROMPTED_SUPPORT = ("Fully", "Partially", "No")
PROMPTED_UTILITY = ("1", "2", "3", "4", "5")


@dataclass(frozen=True)
class SelfRAGPromptedSettings(SelfRAGSettings):
    """Self-RAG's settings (see SelfRAGSettings) for the prompted variant, with max_tokens = 32: the
    answer is a short answer (the toolkit's short-answer prompt), not a Self-RAG segment."""

    max_tokens: int = setting(32, ge=1)


class SelfRAGPrompted(SelfRAG):
    """Self-RAG's algorithm on an instruction model: each reflection asked as a label question."""

    name = "self-rag-prompted"
    revision = 1
    retrieve_labels = ("Yes", "No")

    def decoding(self, logprobs: bool = True) -> Decoding:
        return Decoding(max_tokens=self.settings.max_tokens, stop=("\n",), logprobs=1 if logprobs else 0)

    def retrieve_prompt(self, question: str) -> tuple[Message, ...]:
        return (Message("user", RETRIEVE_QUESTION.format(question=question)),)

    def closed_prompt(self, question: str) -> tuple[Message, ...]:
        return (Message("system", CLOSED_SYSTEM), Message("user", CLOSED_USER.format(question=question)))

    def segment(self, question: str, hit: Hit) -> Generator[Any, Any, Segment]:
        passage = format_passages([hit])
        rel = yield Probe("isrel", (Message("user", RELEVANCE_QUESTION.format(passage=passage, question=question)),),
                          ("Relevant", "Irrelevant"))
        out = yield Ask("segment", (Message("system", ANSWER_SYSTEM),
                                    Message("user", ANSWER_USER.format(passage=passage, question=question))),
                        self.decoding())
        answer = clean_answer(out.text)
        sup = yield Probe("issup", (Message("user", SUPPORT_QUESTION.format(
            passage=passage, question=question, answer=answer)),), PROMPTED_SUPPORT)
        use = yield Probe("isuse", (Message("user", UTILITY_QUESTION.format(question=question, answer=answer)),),
                          PROMPTED_UTILITY)
        return Segment(answer, rel.p("Relevant")[0], weighted(sup, SUPPORT_WEIGHTS), weighted(use, UTILITY_WEIGHTS),
                       sequence_score(out))


# ----------------------------------------------------------------------------------- helpers
def weighted(scores: LabelScores, weights: Sequence[float]) -> float:
    """Σ weight × P(label) normalized over the labels (uniform when they get no mass, as `p` rules)."""
    return sum(w * scores.p(label)[0] for w, label in zip(weights, scores.labels))


def first_of(text: str, tokens: Sequence[str]) -> int | None:
    """Where the first of `tokens` appears in `text`, None when none does."""
    found = [i for i in (text.find(t) for t in tokens) if i >= 0]
    return min(found) if found else None


def sequence_score(out: Completion) -> float:
    """exp of the mean log-prob of the generated tokens (the code's cumulative log-prob / length)."""
    tokens = out.tokens or ()
    if not tokens:
        return 0.0
    return math.exp(sum(t.logprob for t in tokens) / len(tokens))


def postprocess(text: str) -> str:
    """The answer without reflection tokens, end-of-text marks and line breaks (the code's
    `postprocess_answer_option_conditioned`), a leading "#" or ":" dropped, then cleaned."""
    for token in CONTROL_TOKENS + ("</s>", "<|endoftext|>"):
        text = text.replace(token, "")
    text = text.replace("\n", "").strip()
    if text[:1] in ("#", ":"):
        text = text[1:]
    return clean_answer(text)
