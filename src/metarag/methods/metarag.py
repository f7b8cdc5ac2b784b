"""MetaRAG (Zhou et al., 2024), as the reproducibility study ran it (§3.1, §4.3.3): a cognitive space
that retrieves and answers, watched by a metacognitive space that monitors, evaluates and plans.

One question, as a policy over the shared runner loop:

1. Cognitive space: retrieve the top-k passages for the question; the reasoner answers with a
   rationale and a short final answer.
2. For up to `max_iter` rounds:
   - **Monitor**: the expert reads a reference answer y′ off the passages; if the similarity of y and
     y′ is at or above `threshold`, the answer is accepted and the loop ends.
   - **Evaluate** (a metacognitive transition): a reasoning check of the answer (flawed logic,
     misaligned, redundant, with feedback); internal-knowledge sufficiency; external (evidence)
     sufficiency; and, when both are sufficient, an entailment check of the answer by the passages
     and rationale.
   - **Plan** on internal × external: both → keep the evidence (ask for hop-by-hop reasoning when the
     answer is not entailed); internal only → rewrite the query toward the missing information,
     retrieve, and allow own knowledge; external only → answer strictly from the passages;
     neither → decompose into a sub-question, retrieve, and answer from the passages.
   - The reasoner answers again with the plan's suggestion and the critic's feedback.

Departures from the original code, on purpose: new passages are appended in rank order after
de-duplication (the original put them through a Python `set()`, which reorders them at random), and
queries are not truncated to 64 characters as the original's retriever call did. Every judge is a
trace step; transitions (`ms-transition`), reasoning iterations (`iteration`) and plans (`plan`)
are Decide steps, so the harness reproduces the study's Tables 2 and 3.
"""
from __future__ import annotations

from dataclasses import dataclass

from metarag.errors import ConfigError
from metarag.judges.llm_judges import ReasoningCheck, external_sufficiency, internal_sufficiency
from metarag.judges.models import make_entailment, make_expert
from metarag.judges.similarity import AnswerSimilarity
from metarag.llm.base import Decoding
from metarag.methods.fixed_point import LoopState
from metarag.methods.runner import Policy
from metarag.parsing import clean_answer, marked_answer
from metarag.policy.actions import Ask, Assess, Note, Search
from metarag.policy.evidence import evidence_prompt, format_passages
from metarag.records import Hit, Message, Question
from metarag.settings import check_ranges, setting

REASON_TASK = ("Question: {question}\n{guidance}"
               "Think step by step in {length}, then give the final answer on a last "
               "line of the form 'Answer: <short answer>' (a name, a date, a number, a short phrase, or "
               "yes/no).")
REWRITE_TASK = ("Question: {question}\nThe passages above miss information needed to answer the question. "
                "Write one search query for the missing information. Reply with the query only.")
FINALIZE_TASK = "Give only the final short answer to the question, with no explanation."
DECOMPOSE_TASK = ("Question: {question}\nWrite the first simpler sub-question that must be answered to answer "
                  "the question. Reply with the sub-question only.")

# What the reasoner is told to do next, per plan (the original's planning suggestions).
SUGGESTIONS = {
    "keep": "Check your previous answer against the passages.",
    "reason-hops": "Reason step by step over the passages: connect the facts hop by hop before answering.",
    "rewrite": "New passages were added for the missing information. You may also rely on your own knowledge.",
    "strict-passages": "Answer strictly from the passages; do not rely on outside knowledge.",
    "decompose": "New passages were added for a sub-question. Answer from the passages.",
}


@dataclass(frozen=True)
class MetaRAGSettings:
    """MetaRAG settings, with the reproducibility study's defaults.

    k = 5 passages per retrieval (§4.3.2 "we retain the top five passages"); threshold = 0.4, the
    judgment threshold of the study and of the original paper (the original code used 0.3; the
    study's Table 3 sweeps 0.1–0.4); max_iter = 5 (§4.3.3; the original code used 3).
    `similarity` "minilm" is the original code's all-MiniLM-L6-v2 cosine ("token-f1" needs no model).
    `expert` "llm" is an extractive LLM reader standing in for the fine-tuned T5-large expert ("qa:PATH"
    for a Hugging Face extractive-QA directory). `entailment` "llm" is a label-probability judge standing
    in for the T5-XXL NLI model ("cross-encoder:PATH" for an NLI CrossEncoder directory).
    The reasoner's budget: `reason_max_tokens` = 160 tokens and `reason_length`, the length its prompt
    asks for ("Think step by step in <reason_length>, then ..."), this toolkit's choices (the study gives
    neither); sweep both for the cost-quality curve. `stop_at_fixed_point` ends the loop when an iteration
    would start from the evidence and guidance of an earlier one (greedy decoding only; the answer is
    the one the full loop gives, see `methods/fixed_point.py`); False runs the papers' full loop.
    `internal_threshold` / `external_threshold`: P(Yes) at or above which the sufficiency judges say
    "sufficient". 0.5 (default) is the paper's rule, the verdict the model prefers; a threshold chosen
    on training questions (`metarag calibrate-judges`) is the alternative for a judge that always says
    one thing.
    """

    k: int = setting(5, ge=1)
    threshold: float = setting(0.4, ge=0, le=1)
    max_iter: int = setting(5, ge=0)
    similarity: str = "minilm"
    expert: str = "llm"
    entailment: str = "llm"
    entailment_threshold: float = setting(0.5, ge=0, le=1)
    reason_max_tokens: int = setting(160, ge=1)
    reason_length: str = "at most three short sentences"
    query_max_tokens: int = setting(32, ge=1)
    stop_at_fixed_point: bool = True
    internal_threshold: float = setting(0.5, ge=0, le=1)
    external_threshold: float = setting(0.5, ge=0, le=1)

    def __post_init__(self) -> None:
        check_ranges(self)
        if not self.reason_length.strip():
            raise ConfigError("MetaRAGSettings setting 'reason_length' must name a length, e.g. "
                              "'at most three short sentences'")


class MetaRAG:
    name = "metarag"

    def __init__(self, settings: MetaRAGSettings = MetaRAGSettings()):
        self.settings = settings
        self.monitor = AnswerSimilarity(settings.threshold, settings.similarity)
        self.expert = make_expert(settings.expert)
        self.entailment = make_entailment(settings.entailment, settings.entailment_threshold)
        self.reasoning = ReasoningCheck()
        self.internal = internal_sufficiency(settings.internal_threshold)
        self.external = external_sufficiency(settings.external_threshold)

    def policy(self, question: Question) -> Policy:
        s = self.settings
        hits: list[Hit] = list((yield Search(question.text, s.k)))
        answers: list[str] = []  # the reasoner's answer of each iteration (0: the cognitive space's first)
        guidance = rationale = ""
        for iteration in range(s.max_iter + 1):
            if iteration:  # round `iteration` of the metacognitive space judges the last answer
                answer, passages = answers[-1], format_passages(hits)
                reference = yield Assess(self.expert, {"question": question.text, "passages": passages})
                monitor = yield Assess(self.monitor, {"answer": answer, "reference": reference.verdict})
                if monitor.verdict == "accept":
                    break
                yield Note("ms-transition", "evaluate", (("round", float(iteration)), ("similarity", monitor.score)))
                inputs = {"question": question.text, "passages": passages, "answer": answer, "rationale": rationale}
                check = yield Assess(self.reasoning, inputs)
                internal = yield Assess(self.internal, {"question": question.text})
                external = yield Assess(self.external, inputs)
                entailed = None
                if internal.verdict == "sufficient" and external.verdict == "sufficient":
                    entailed = yield Assess(self.entailment, inputs)
                plan = choose_plan(internal.verdict == "sufficient", external.verdict == "sufficient",
                                   None if entailed is None else entailed.verdict == "entailed")
                yield Note("plan", plan, (("round", float(iteration)),))
                if plan in ("rewrite", "decompose"):
                    task = REWRITE_TASK if plan == "rewrite" else DECOMPOSE_TASK
                    out = yield Ask(f"{plan}-query", evidence_prompt(passages, task.format(question=question.text)),
                                    Decoding(max_tokens=s.query_max_tokens, stop=("\n",)))
                    query = clean_answer(out.text) or question.text
                    seen = frozenset(h.passage.id for h in hits)
                    new = yield Search(query, s.k, exclude=seen)
                    hits.extend(h for h in new if h.passage.id not in seen)
                guidance = SUGGESTIONS[plan] + (f" Critic feedback: {check.detail}" if check.detail else "") + "\n"
            if s.stop_at_fixed_point:
                # the next reasoning prompt is the evidence and the guidance (plan and critic feedback)
                state = (tuple(h.passage.id for h in hits), guidance)
                fixed = yield LoopState(state, iteration, s.max_iter)
                if fixed is not None:
                    return answers[fixed.ends_as]
            answer, rationale = yield from self._reason(question, hits, guidance=guidance)
            answers.append(answer)
        return answers[-1]

    def _reason(self, question: Question, hits: list[Hit], guidance: str):
        """The cognitive-space reasoner: rationale, then 'Answer: ...' (the fixed extraction rule)."""
        yield Note("iteration", "reason")
        task = REASON_TASK.format(question=question.text, guidance=guidance, length=self.settings.reason_length)
        prompt = evidence_prompt(format_passages(hits), task)
        out = yield Ask("reason", prompt, Decoding(max_tokens=self.settings.reason_max_tokens))
        answer = marked_answer(out.text)
        rationale = "\n".join(line for line in out.text.strip().splitlines()
                              if not line.strip().lower().startswith(("answer:", "**answer")))
        if answer is None:
            # The reasoning ran out of tokens before its 'Answer:' line: ask for the answer alone in the
            # same conversation (the prompt prefix is reused), rather than scoring a reasoning line.
            final = yield Ask("finalize", (*prompt, Message("assistant", out.text), Message("user", FINALIZE_TASK)),
                              Decoding(max_tokens=self.settings.query_max_tokens, stop=("\n",)))
            answer = clean_answer(final.text)
        return answer, rationale.strip()


def choose_plan(internal: bool, external: bool, entailed: bool | None) -> str:
    """The planning 2×2: internal × external knowledge sufficiency (and entailment when both)."""
    if internal and external:
        return "keep" if entailed else "reason-hops"
    if internal:
        return "rewrite"
    if external:
        return "strict-passages"
    return "decompose"
