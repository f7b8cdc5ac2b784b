"""EvoCtx, cross-boundary context evolution (Chen, Wang, Li, Wei and Li, 2026, §3): before each step
a decision model exposes its information need in a reasoning trace, and the trace's semantic
distance from the knowledge boundary decides whether to RETRIEVE (expand the boundary) or THINK
(refine the trajectory inside it).

One question, as a policy over the shared runner loop; the state is S_i = (C_i, U_i), context
passages and generated sub-queries:

1. Bootstrap: retrieve the top-k passages for the question; C_1 = them (within the token budget).
2. For rounds i = 1..T:
   - (Table 8) a Yes/No probe "Is the current evidence sufficient to answer the question?" (a Score step);
   - the decision model f_dec(Q, C_i, U_i) writes "Reasoning: ..." (r_i) and "Action: ..." (ô_i);
   - the boundary judge embeds r_i and B_i = (Q, U_i, C_i) and scores the novelty (hybrid rule by
     default): RETRIEVE when the score exceeds 1, else THINK;
   - stop when ô_i is ANSWER and the boundary supports the trace (its verdict is THINK);
   - RETRIEVE: q = φ(Q, U_i), the top-k passages not seen before, appended in rank order, the
     context cut at the token budget; THINK: u_i = f_sub(Q, C_i, U_i), one next-hop sub-query added
     to U, no new context.
3. The final answer A = f_ans(Q, C, U), short form.

Each round records the decision model's request (a Generate step) and verdict (a Judge step whose
detail is the reasoning trace),
the boundary verdict (a Judge step) and an `evoctx-decision` Decide step with the chosen action and
its signals, so runs report retrieval calls, passages and tokens per question (Table 5), action
allocation (Figure 3), oracle agreement (Figure 4, with `oracle=True`) and confidence by round
(Table 8); see `metarag.evaluate.evoctx_analysis`.

Departures and readings, on purpose. The decision model is a judge (`DecisionModel`) so that it can
be a different LLM from the generator (`decision_llm`; the paper pairs a thinking decider with an
instruct generator): its request names that model, and the runner records its prompt and output as
a Generate step before the Judge step (whose detail is the reasoning). φ is
asked of the generator from the question and the sub-queries alone, as φ(Q, U) has no context. The
ablations keep the stopping rule; "no-reasoning" asks the generator for a bare action and executes
it, since without a trace there is nothing to place against the boundary.
"""
from __future__ import annotations

import re
from collections.abc import Collection, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from metarag.errors import ConfigError, close_matches
from metarag.judges.base import Verdict
from metarag.judges.boundary import RULES, BoundaryJudge, make_encoder
from metarag.llm.base import Decoding
from metarag.llm.registry import LLMSpec, parse_llm_spec
from metarag.methods.fixed_point import LoopState
from metarag.methods.runner import Policy
from metarag.parsing import clean_answer, strip_label
from metarag.policy.actions import Action, Ask, Assess, Note, Probe, Search
from metarag.policy.evidence import evidence_prompt, format_passages
from metarag.records import Hit, Passage, Question
from metarag.settings import check_ranges, setting

ACTIONS = ("RETRIEVE", "THINK", "ANSWER")
ABLATIONS = ("none", "no-retrieve", "no-think", "no-reasoning", "no-boundary")
# Which end of the accumulated context a token budget keeps (see `extend_context`).
ContextKeep = Literal["recent", "first"]
CONTEXT_KEEP = get_args(ContextKeep)

# f_dec: the reasoning first (it is what the boundary judge embeds), the action on its own line.
DECISION_TASK = (
    "Question: {question}\nSub-queries so far:\n{subqueries}\n"
    "Decide the next step toward answering the question. First write one line that starts with "
    "'Reasoning:' and says what the passages and sub-queries already establish and what information is "
    "still needed. Then write one line 'Action: RETRIEVE' if new passages must be searched for that "
    "information, 'Action: THINK' if the next sub-question can be worked out from the passages above, or "
    "'Action: ANSWER' if the passages are enough to answer the question.")
# The "w/o Reasoning" ablation (§4.3): a shallow action prediction, no trace.
BARE_DECISION_TASK = (
    "Question: {question}\nSub-queries so far:\n{subqueries}\n"
    "Reply with one word: RETRIEVE if new passages must be searched, THINK if the next sub-question can be "
    "worked out from the passages above, or ANSWER if the passages are enough to answer the question.")
# φ(Q, U): the retrieval query, from the question and the sub-queries only.
QUERY_TASK = (
    "Question: {question}\nSub-queries so far:\n{subqueries}\n"
    "Write one search query for the information that is still missing to answer the question. Reply with "
    "the query only.")
# f_sub(Q, C, U): one unresolved next-hop sub-query under the current boundary (Table 10).
SUBQUERY_TASK = (
    "Question: {question}\nSub-queries so far:\n{subqueries}\n"
    "Write the next sub-question that is not resolved yet: one next hop toward the answer, using what the "
    "passages above establish. Reply with the sub-question only.")
# f_ans(Q, C, U): a short-form answer from the final state (Table 10).
ANSWER_TASK = (
    "Question: {question}\nSub-queries considered:\n{subqueries}\n"
    "Answer the question using the passages. Give a short answer only: a name, a date, a number, a short "
    "phrase, or yes/no. Do not explain.\nShort answer:")
# Table 8's probe, read as the probability of the "Yes" token.
SUFFICIENCY_TASK = ("Question: {question}\nIs the current evidence sufficient to answer the question? "
                    "Answer Yes or No.")

# Tokens per whitespace word of a passage: the Qwen2.5 tokenizer of the embedded model gives 1.51
# on the demo corpus (140,267 tokens for 93,163 words of "[n] title\ntext"), so 3/2. The LLM
# protocol has no tokenizer on purpose; integers keep the budget arithmetic exact.
TOKENS_PER_WORD = (3, 2)


def decision_llm_spec(spec: str) -> LLMSpec | None:
    """The separate decision model `spec` names (any LLM spec string, `metarag.llm.registry`), or
    None for the run's own LLM; checked, not loaded."""
    if not spec:
        return None
    try:
        return parse_llm_spec(spec)
    except ConfigError as exc:
        raise ConfigError(f"evoctx decision_llm: {exc}") from None


@dataclass(frozen=True)
class EvoCtxSettings:
    """EvoCtx settings, with the paper's defaults.

    k = 5 passages per retrieval and T = 8 rounds (§4.1, Implementation Details; Table 10 "top-k=5"
    for the bootstrap and each RETRIEVE). tau_near = 0.3, tau_cent = 0.2, tau_90 = 0.4 (§4.1) for
    `rule` "hybrid" (§3.2); the rule families of Tables 4, 6, 7 are in `metarag.judges.boundary.RULES`.
    `ablation` one of ABLATIONS (Table 2). context_budget_tokens = 1024 (Table 10, "truncated to a
    1024-token context budget"; 0 means no budget), tokens counted as whitespace words × 3/2, the
    ratio measured with the embedded model's tokenizer (see TOKENS_PER_WORD). `context_keep` "first"
    keeps the oldest passages within the budget ("recent" keeps the newest and drops the oldest;
    see `extend_context` for the choice). `encoder` "minilm" is
    the paper's all-MiniLM-L6-v2 (§4.1); "bag-of-words" needs no model (tests).
    `tail_percentile` = 10: d_90 is read as the 10th percentile of the trace's distances to the
    boundary items (the 90th percentile of its similarities), i.e. §3.2's gloss "the reasoning trace
    is far from most boundary items"; 90 is the literal 90th percentile of the distances (the issue's
    reading). Chosen by measurement, since the paper gives no formula: with MiniLM, off-topic
    passages sit ~0.7–0.9 away from any trace, so at 90 the tail term exceeds τ_90 = 0.4 at every
    step (100% of the 153 decisions of a 20-question HotpotQA run; 97% on the demo questions). The
    method then RETRIEVEs every round, never THINKs, so U stays empty and φ(Q, U) writes the same
    query each round: EvoCtx degenerates into its own "w/o THINK" ablation, which the paper reports
    as worse than the full method (Table 2). At 10, 12% of those decisions RETRIEVE and the rest
    THINK: the alternation the paper describes. docs/notes/2026-11-30-evoctx-*.md have both runs.
    `decision_llm` "" asks the run's LLM; "embedded", "embedded-0.5b", "gguf:PATH" or
    "openai:MODEL[@BASE_URL]" name a separate decision model (§4.1 pairs Qwen3-4B-Thinking with a
    LLaMA-3.1-8B generator). `confidence_probe` records Table 8's sufficiency probe each round: an
    analysis-only request (its answer steers nothing), so off by default, and the cost columns compare
    the method, not the instrumentation; `metarag report --analysis evoctx` needs it on.
    `oracle` also computes, when the question has gold answers, the oracle margin of Figure 4 (the
    gold answer against the same boundary; analysis only, it never steers the run).
    `decision_max_tokens` = 192 bounds the decision model's reasoning trace (this toolkit's choice; the
    paper gives none). `stop_at_fixed_point` ends the rounds when one would start from the context,
    sub-queries and Search exclusions of an earlier round (greedy decoding only; the answer is the
    one the full T rounds give, see `methods/fixed_point.py`); False runs all rounds as the paper does.
    """

    k: int = setting(5, ge=1)
    T: int = setting(8, ge=0)
    tau_near: float = setting(0.3, gt=0)  # the thresholds divide the distances
    tau_cent: float = setting(0.2, gt=0)
    tau_90: float = setting(0.4, gt=0)
    tail_percentile: float = setting(10.0, ge=0, le=100)
    rule: str = "hybrid"
    ablation: str = "none"
    context_budget_tokens: int = setting(1024, ge=0)
    context_keep: ContextKeep = "first"
    encoder: str = "minilm"
    decision_llm: str = ""
    decision_max_tokens: int = setting(192, ge=1)
    query_max_tokens: int = setting(32, ge=1)
    answer_max_tokens: int = setting(32, ge=1)
    confidence_probe: bool = False
    oracle: bool = False
    stop_at_fixed_point: bool = True

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.rule not in RULES:
            raise ConfigError(f"unknown evoctx rule {self.rule!r}{close_matches(self.rule, RULES)}")
        if self.ablation not in ABLATIONS:
            raise ConfigError(f"unknown evoctx ablation {self.ablation!r}{close_matches(self.ablation, ABLATIONS)}")
        make_encoder(self.encoder)
        decision_llm_spec(self.decision_llm)

    @property
    def thresholds(self) -> tuple[float, float, float]:
        return (self.tau_near, self.tau_cent, self.tau_90)


class EvoCtx:
    """EvoCtx as a policy; `encoder` replaces the one the settings name (tests inject a fake)."""

    name = "evoctx"

    def __init__(self, settings: EvoCtxSettings = EvoCtxSettings(), *, encoder: Any = None):
        self.settings = settings
        self.boundary = BoundaryJudge(settings.rule, settings.thresholds,
                                      encoder if encoder is not None else make_encoder(settings.encoder),
                                      settings.tail_percentile)
        bare = settings.ablation == "no-reasoning"
        # Without reasoning the paper asks the generator for the action (§4.3), not the thinking decider.
        self.decision_model = DecisionModel("" if bare else settings.decision_llm, reasoning=not bare,
                                            max_tokens=settings.decision_max_tokens)

    def named_models(self) -> tuple[str, ...]:
        """The spec strings of the models this method asks besides the run's own (the harness checks them)."""
        return (self.decision_model.model,) if self.decision_model.model else ()

    def policy(self, question: Question) -> Policy:
        s = self.settings
        hits = yield Search(question.text, s.k)
        seen = {h.passage.id for h in hits}
        context = extend_context([], hits, s.context_budget_tokens, s.context_keep)
        subqueries: list[str] = []
        gold = question.answers[0] if s.oracle and question.answers else ""
        states: list[tuple[list[Hit], list[str]]] = [([], [])]  # (C_i, U_i) at the start of round i (0: unused)
        for round_ in range(1, s.T + 1):
            if s.stop_at_fixed_point:
                # what every later prompt, the boundary and the next Search see: the context passages, the
                # sub-queries and the ids the next Search excludes (among them passages retrieved but cut
                # by the budget or dropped as copies, which reach no prompt but change what comes next),
                # unless no passage can enter the context any more
                excluded = () if context_is_closed(context, s.context_budget_tokens, s.context_keep) else seen
                state = (tuple((h.passage.id, h.passage.title, h.passage.text) for h in context), tuple(subqueries),
                         tuple(sorted(excluded)))
                fixed = yield LoopState(state, round_, s.T + 1)
                if fixed is not None:  # the full T rounds would end in the state round `ends_as` started from
                    context, subqueries = states[fixed.ends_as]
                    break
                states.append((list(context), list(subqueries)))
            passages = format_passages(context)
            listed = format_subqueries(subqueries)
            if s.confidence_probe:
                yield Probe("sufficiency", evidence_prompt(passages, SUFFICIENCY_TASK.format(question=question.text)))
            decision = yield Assess(self.decision_model, {"question": question.text, "passages": passages,
                                                          "subqueries": listed})
            boundary = None
            if s.ablation != "no-reasoning":
                inputs: dict[str, str | tuple[str, ...]] = {
                    "trace": decision.detail,
                    "boundary": (question.text, *subqueries, *(h.passage.contents() for h in context))}
                if gold:
                    inputs["gold"] = gold
                boundary = yield Assess(self.boundary, inputs)
            chosen = choose_action(decision.verdict, None if boundary is None else boundary.verdict, s.ablation)
            yield Note("evoctx-decision", chosen,
                       decision_signals(round_, decision.verdict, boundary, context))
            if chosen == "ANSWER":
                break
            if chosen == "RETRIEVE":
                out = yield Ask("retrieve-query",
                                evidence_prompt("", QUERY_TASK.format(question=question.text, subqueries=listed)),
                                Decoding(max_tokens=s.query_max_tokens, stop=("\n",)))
                query = strip_label(out.text) or (subqueries[-1] if subqueries else question.text)
                new = yield Search(query, s.k, exclude=frozenset(seen))
                seen.update(h.passage.id for h in new)
                context = extend_context(context, new, s.context_budget_tokens, s.context_keep)
            else:
                out = yield Ask("sub-query",
                                evidence_prompt(passages, SUBQUERY_TASK.format(question=question.text,
                                                                               subqueries=listed)),
                                Decoding(max_tokens=s.query_max_tokens, stop=("\n",)))
                subquery = strip_label(out.text)
                if subquery and subquery not in subqueries:
                    subqueries.append(subquery)
        task = ANSWER_TASK.format(question=question.text, subqueries=format_subqueries(subqueries))
        out = yield Ask("answer", evidence_prompt(format_passages(context), task),
                        Decoding(max_tokens=s.answer_max_tokens, stop=("\n",)))
        return clean_answer(out.text)


def choose_action(proposed: str, boundary: str | None, ablation: str = "none") -> str:
    """The executed action from the decision model's proposal and the boundary verdict.

    ANSWER needs the boundary's support (a THINK verdict: the trace lies inside the boundary);
    otherwise the boundary decides, except in the ablations: "no-retrieve" always THINKs,
    "no-think" always RETRIEVEs, "no-boundary" and "no-reasoning" execute the proposal as it is.
    """
    if ablation in ("no-boundary", "no-reasoning") or boundary is None:
        return proposed
    if proposed == "ANSWER" and boundary == "THINK":
        return "ANSWER"
    if ablation == "no-retrieve":
        return "THINK"
    if ablation == "no-think":
        return "RETRIEVE"
    return boundary


def decision_signals(round_: int, proposed: str, boundary: Verdict | None,
                     context: Sequence[Hit]) -> tuple[tuple[str, float], ...]:
    """The numbers of one round's Decide step: the proposal as 0/1 flags, the boundary signals (when
    judged), the round and the context's size."""
    flags = tuple((f"proposed_{a.lower()}", float(proposed == a)) for a in ACTIONS)
    judged = boundary.signals if boundary is not None else ()
    size = (("context_passages", float(len(context))),
            ("context_tokens", float(sum(passage_tokens(h.passage) for h in context))))
    return (*flags, *judged, ("round", float(round_)), *size)


def format_subqueries(subqueries: Sequence[str]) -> str:
    """The sub-queries as a numbered list, or "(none)"."""
    return "\n".join(f"{i}. {u}" for i, u in enumerate(subqueries, 1)) if subqueries else "(none)"


# ----------------------------------------------------------------------------- context budget
def approx_tokens(text: str) -> int:
    """Tokens of `text` as whitespace words × 3/2, rounded up (see TOKENS_PER_WORD)."""
    num, den = TOKENS_PER_WORD
    return (len(text.split()) * num + den - 1) // den


def passage_tokens(passage: Passage) -> int:
    """A passage's share of the context budget: its title and text."""
    return approx_tokens(f"{passage.title} {passage.text}")


def extend_context(context: Sequence[Hit], new: Sequence[Hit], budget: int, keep: ContextKeep = "first") -> list[Hit]:
    """`context` with the `new` hits appended in their (retrieval-score) order, duplicates (same id or
    same title and text) left out, and the whole cut at `budget` tokens (0: no budget).

    Table 10 says only "appended in retrieval-score order and truncated to a 1024-token context
    budget"; which end the cut keeps is `keep`:
    - "first" (the default) keeps what came first: the passage that crosses the budget keeps the
      words of its text that fit (with its title) and nothing after it is added. It is the literal
      reading (append, then truncate the concatenation), and it measured better: on 20 HotpotQA dev
      questions EvoCtx scored F1 42.3 with it and 34.0 with "recent"
      (docs/notes/2026-11-30-evoctx-against-standard-rag-and-iterdrag-n20.md). Its cost: five
      HotpotQA passages are ~740 tokens, so after the bootstrap at most one more passage (cut) fits,
      and later RETRIEVEs change neither the context nor the boundary.
    - "recent" keeps the newest passages that fit, in order, and drops the oldest (the crossing
      passage cut the same way), so that every RETRIEVE "expands the boundary with new external
      evidence" (§3.2) — at the price of the bootstrap's first-hop evidence.
    """
    if keep not in CONTEXT_KEEP:
        raise ConfigError(f"context_keep must be one of {', '.join(CONTEXT_KEEP)}, got {keep!r}")
    merged = list(context)
    ids = {h.passage.id for h in merged}
    texts = {(h.passage.title, " ".join(h.passage.text.split())) for h in merged}
    for hit in new:
        key = (hit.passage.title, " ".join(hit.passage.text.split()))
        if hit.passage.id in ids or key in texts:
            continue
        merged.append(hit)
        ids.add(hit.passage.id)
        texts.add(key)
    if not budget:
        return merged
    order = merged if keep == "first" else merged[::-1]
    kept: list[Hit] = []
    used = 0
    for hit in order:
        cost = passage_tokens(hit.passage)
        if used + cost > budget:
            cut = truncate_passage(hit.passage, budget - used)
            if cut is not None:
                kept.append(Hit(cut, hit.score, hit.retriever))
            break
        kept.append(hit)
        used += cost
    return kept if keep == "first" else kept[::-1]


def context_is_closed(context: Sequence[Hit], budget: int, keep: str = "first") -> bool:
    """True when `extend_context` can add no passage to `context` any more, whatever is retrieved:
    keep "first" with less of the budget left than the smallest passage's cut (one word, no title)."""
    if keep != "first" or not budget:
        return False
    left = budget - sum(passage_tokens(h.passage) for h in context)
    return truncate_passage(Passage("", "", "word"), left) is None


def truncate_passage(passage: Passage, tokens: int) -> Passage | None:
    """The passage cut to at most `tokens` (title kept whole), or None when not one word of its
    text fits."""
    num, den = TOKENS_PER_WORD
    words = max(tokens, 0) * den // num - len(passage.title.split())
    if words <= 0:
        return None
    return Passage(passage.id, passage.title, " ".join(passage.text.split()[:words]))


# ----------------------------------------------------------------------------- decision model
class DecisionModel:
    """f_dec(Q, C, U): the decision model writes its reasoning trace and proposes an action.

    A judge whose one request may go to another LLM than the run's: `llm_spec` (a spec string, "" for
    the run's own) travels on its Ask, and the runner resolves it once per run. Inputs: "question",
    "passages" (formatted), "subqueries" (formatted). Verdict: the proposed action, with the
    reasoning trace as its detail; an unreadable action falls back to THINK, recorded. With
    `reasoning` False the prompt asks for the bare action (the w/o-Reasoning ablation).
    """

    def __init__(self, llm_spec: str = "", *, reasoning: bool = True, max_tokens: int = 192,
                 name: str = "evoctx-decision-model"):
        decision_llm_spec(llm_spec)  # a bad spec fails here, before any model loads
        self.model = llm_spec or None
        self.reasoning = reasoning
        self.max_tokens = max_tokens
        self.name = name

    def judge(self, inputs: Mapping[str, str | tuple[str, ...]]) -> Generator[Action, Any, Verdict]:
        task = (DECISION_TASK if self.reasoning else BARE_DECISION_TASK).format(
            question=inputs["question"], subqueries=inputs.get("subqueries", "(none)"))
        prompt = evidence_prompt(str(inputs.get("passages", "")), task)
        out = yield Ask(self.name, prompt, Decoding(max_tokens=self.max_tokens), model=self.model)
        action, reasoning = parse_decision(out.text, ACTIONS)
        if action is None:
            return Verdict("THINK", None, detail=reasoning, fallback=f"unparseable action: {out.text[-80:]!r}")
        return Verdict(action, None, detail=reasoning)


# ------------------------------------------------------------------------- EvoCtx's decisions
# "Action:" anywhere (small models often end the reasoning line with it), not inside a word ("reaction:").
_ACTION = re.compile(r"(?<![A-Za-z])action[*_\s]*:[*_\s]*([A-Za-z]+)", re.IGNORECASE)
_REASONING_LABEL = re.compile(r"^(?:[^\w\n]|_)*reasoning(?:[^\w\n]|_)*:[*_\s]*", re.IGNORECASE)
_THINK_TAGS = re.compile(r"</?think>", re.IGNORECASE)
_FIRST_WORD = re.compile(r"[A-Za-z]+")


def parse_decision(text: str, actions: Collection[str] = ACTIONS) -> tuple[str | None, str]:
    """(proposed action, reasoning trace) from a decision model's reply, by fixed rules.

    Action: the word after the last "Action:" label (any case, markdown ignored, on its own line or
    at the end of the reasoning) when it is one of `actions` (upper case; EvoCtx's by default);
    without any label, for a bare reply, the first word of the text when it is one of them; else
    None (the caller records its fallback). Reasoning: the text without the "Action: <word>" labels,
    <think> tags, a leading "Reasoning:" label and lines without a letter or digit, its lines
    joined; "" when nothing is left.
    """
    text = _THINK_TAGS.sub("\n", text)
    action = None
    labelled = list(_ACTION.finditer(text))
    if labelled:
        word = labelled[-1].group(1).upper()
        action = word if word in actions else None
        text = _ACTION.sub("\n", text)
    else:
        first = _FIRST_WORD.search(text)
        if first is not None and first.group(0).upper() in actions:
            action = first.group(0).upper()
            text = text[first.end():]
    lines = [_REASONING_LABEL.sub("", ln).strip() for ln in text.splitlines()]
    return action, " ".join(ln for ln in lines if any(ch.isalnum() for ch in ln)).strip()
