"""Rewards of the search agents, as pure functions of a finished trace (and its gold answers): the
belief-action gap diagnosis and the correctness-gated consistency reward of the belief-action paper
(Qi et al., 2026, "MetaRAG: Belief-Action Aligned Policy Optimization for Agentic RAG", §3.4, §3.5,
Algorithm 1), its ablations, Search-R1's outcome reward, the β-GRPO baseline (Wu et al., 2025b) and
HiPRAG's hierarchical process reward (Wu et al., 2025a; its step judges are `judges/process.py`),
R1-Searcher's two stages (Song et al., 2025: format and retrieval, then answer F1 with a format
penalty) and AutoRefine's answer-plus-refine reward (Shi et al., 2025).

Every reward reads a trace through `policy/agent_trace.py` (the search agents' trace contract:
`agent_steps`, the `AgentStep` tuples, the gap diagnosis) and works on the steps it returns.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from metarag.errors import ConfigError, DataError, close_matches
from metarag.metrics import exact_match, normalize_answer, r1_normalize, r1_searcher_accuracy, token_f1
from metarag.policy.agent_trace import (
    ANSWER,
    INVALID,
    OPTIMAL,
    SEARCH,
    AgentStep,
    agent_steps,
    check_margin,
    decision_generations,
    diagnose,
    diagnoses,
    gap_rates,
)
from metarag.records import Trace
from metarag.settings import check_ranges, setting


# ------------------------------------------------------------------------------------ rewards
@dataclass(frozen=True)
class RewardSettings:
    """The reward's knobs, with the belief-action paper's defaults (Qi et al., 2026, §3.5 and
    Appendix D): λ = 0.1 (`consistency_weight`; its ablations 0.0–0.4), m = 0.0 (`margin`), the
    invalid-action reward −0.01 (`invalid_penalty`, subtracted once per invalid step as verl-agent's
    invalid-action penalty is, which the paper's trainer builds on). `query_confidence_threshold` is
    β-GRPO's β (Wu et al., 2025b, §5): the method card gives no value; 0.4 is the value we recall
    from that paper's experiments — its text is not in this library, so override it where it differs.
    `format_weight` λ_f = 0.2 and `process_weight` λ_p = 0.4 are HiPRAG's (Wu et al., 2025a: its
    trainer's `structure_format_score` default and the process bonus's 0.4 in `qa_em_format.py`).
    `r1_format_penalty` 2 is R1-Searcher's stage-2 format penalty (Song et al., 2025, §2.2; its README
    and `train/reward_server_qwen_zero.py`; the Llama server of stage 2 takes 1). `r1_stage1_answer`:
    stage 1 adds ±1 for the answer's cover match, as its released server does (off: the paper's text,
    which names only the retrieval and format halves). `refine_weight` 0.1
    is AutoRefine's retrieval reward for a wrong answer whose refine holds the gold (Shi et al.,
    2025, §3.2; `refine_score` in its `cmd/train.sh`). `outcome` "em" is the papers' R_outcome (EM of the
    final answer); "f1" its token F1, for the outcome-only and belief rewards (a denser signal where EM
    rarely fires, as R1-Searcher's stage 2 rewards F1). `support_weight` adds, to those rewards, that
    weight times the share of the question's supporting passages the trajectory retrieved (R1-Searcher's
    stage-1 idea of rewarding retrieval itself, with supporting-passage recall as the measure): 0 (off)
    by default; a setting to keep searching alive where a run's searches collapse."""

    outcome: str = "em"
    support_weight: float = setting(0.0, ge=0)
    consistency_weight: float = setting(0.1, ge=0)
    margin: float = setting(0.0, ge=0, lt=1)
    invalid_penalty: float = setting(0.01, ge=0)
    query_confidence_threshold: float = setting(0.4, ge=0, le=1)
    format_weight: float = setting(0.2, ge=0, le=1)
    process_weight: float = setting(0.4, ge=0)
    r1_format_penalty: float = setting(2.0, ge=0)
    r1_stage1_answer: bool = setting(True)
    refine_weight: float = setting(0.1, ge=0)

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.outcome not in OUTCOMES:
            raise ConfigError(f"unknown outcome {self.outcome!r}{close_matches(self.outcome, OUTCOMES)}; "
                              f"outcomes: {', '.join(OUTCOMES)}")


OUTCOMES = ("em", "f1")


@dataclass(frozen=True)
class Reward:
    """A trajectory's reward and its parts, each logged on its own by the trainer: `total`, the
    outcome (EM of the final answer), the consistency R_consist (None for rewards without one), the
    penalty taken for invalid actions, the searches made, the share of its ANSWER steps diagnosed
    under-search (None without a probed ANSWER step) and each step's diagnosis (None: unprobed).
    `process`: HiPRAG's share of clean steps N_corr/N (None for the other rewards, and for a HiPRAG
    trajectory whose bonus is gated off, which is never judged). `retrieval`: the retrieval term of
    AutoRefine (1: the refined evidence holds a gold answer) and of R1-Searcher's stage 1 (1: it
    searched, in format), before its weight; None for the other rewards."""

    total: float
    outcome: float
    consistency: float | None = None
    penalty: float = 0.0
    searches: int = 0
    invalid_actions: int = 0
    under_search_rate: float | None = None
    diagnoses: tuple[str | None, ...] = ()
    process: float | None = None
    retrieval: float | None = None

    def components(self) -> dict[str, float]:
        """The numbers a trainer logs, one name each (NaN where a part does not apply)."""
        nan = math.nan
        return {"reward": self.total, "outcome": self.outcome,
                "consistency": nan if self.consistency is None else self.consistency,
                "penalty": self.penalty, "searches": float(self.searches),
                "invalid_actions": float(self.invalid_actions),
                "under_search_rate": nan if self.under_search_rate is None else self.under_search_rate,
                "process": nan if self.process is None else self.process,
                "retrieval": nan if self.retrieval is None else self.retrieval}


def outcome_reward(answer: str | None, golds: Sequence[str], metric: str = "em") -> float:
    """R_outcome = 1[EM(final answer, gold)] (Search-R1's and the paper's outcome reward), or with
    `metric` "f1" the answer's token F1; 0 for a trajectory that ended without an answer."""
    if isinstance(golds, str) or not golds:
        raise DataError("the reward needs the question's gold answers (a non-empty list of strings)")
    if not answer:
        return 0.0
    return token_f1(answer, golds) if metric == "f1" else exact_match(answer, golds)


def support_share(trace: Trace, supporting: Sequence[str]) -> float:
    """The share of the question's supporting passages among everything the trajectory retrieved (0
    when the question names none)."""
    wanted = set(supporting)
    return len(wanted & set(trace.retrieved_ids())) / len(wanted) if wanted else 0.0


def with_support(reward: Reward | None, trace: Trace, supporting: Sequence[str],
                 settings: RewardSettings) -> Reward | None:
    """`reward` plus `support_weight` × the supporting passages' share retrieved (`support_share`, kept
    as the reward's `retrieval`), for a reward without a retrieval term of its own; unchanged at weight
    0, for a rollout without a reward, and for the rewards that have one (AutoRefine's, R1-Searcher's)."""
    if reward is None or not settings.support_weight or reward.retrieval is not None:
        return reward
    share = support_share(trace, supporting)
    return dataclasses.replace(reward, total=reward.total + settings.support_weight * share, retrieval=share)


# which steps a consistency variant credits (o_t = 1): the full reward credits both OPTIMAL cases
_CREDITED: dict[str, Callable[[AgentStep, str], bool]] = {
    "both": lambda s, d: d == OPTIMAL,
    "over-only": lambda s, d: d == OPTIMAL and s.action == ANSWER,   # confident ANSWER: no over-search
    "under-only": lambda s, d: d == OPTIMAL and s.action == SEARCH,  # unconfident SEARCH: no under-search
}


def consistency_reward(steps: Sequence[AgentStep], margin: float = 0.0, credit: str = "both") -> float:
    """R_consist(τ) = (1/T_τ) Σ_t o_t over the trajectory's decision steps (Algorithm 1), with o_t = 1
    for an OPTIMAL step and 0 for over-search, under-search, the margin zone and an invalid step
    (a decision step at which the model took no valid action). `credit` "over-only" credits only the
    OPTIMAL steps that guard against over-search (b > m and ANSWER), "under-only" only those against
    under-search (b < −m and SEARCH): the paper's two single-sided ablations. 0 for no steps. With the
    probe every step has its belief score; a belief table (belief-agent's `belief_table`) gives the
    first step alone one, and then the sum runs over the steps that have one. A trajectory without
    any belief cannot be rewarded for consistency."""
    if credit not in _CREDITED:
        raise ConfigError(f"unknown consistency credit {credit!r}{close_matches(credit, _CREDITED)}")
    check_margin(margin)
    if not steps:
        return 0.0
    believed = [s for s in steps if s.belief is not None]
    if not believed:
        raise DataError("the trajectory has no belief score: the consistency reward needs the belief probe at "
                        "every decision step (--set probe=true) or a belief table (--set belief_table=FILE)")
    credited = _CREDITED[credit]
    return sum(credited(s, diagnose(s.belief, s.action, margin)) for s in believed) / len(believed)


def total_reward(outcome: float, consistency: float, weight: float = 0.1, *, gated: bool = True) -> float:
    """R_total = R_outcome · (1 + λ·R_consist): consistency counts only on a correct trajectory. The
    ungated ablation, R_outcome + λ·R_consist, rewards consistency on wrong trajectories too."""
    return outcome * (1 + weight * consistency) if gated else outcome + weight * consistency


def _base(trace: Trace, golds: Sequence[str], metric: str = "em") -> tuple[tuple[AgentStep, ...], float]:
    return agent_steps(trace), outcome_reward(trace.answer, golds, metric)


def _counts(steps: Sequence[AgentStep]) -> dict[str, int]:
    return {"searches": sum(s.action == SEARCH for s in steps),
            "invalid_actions": sum(s.action == INVALID for s in steps)}


def _under_share(steps: Sequence[AgentStep], margin: float) -> float | None:
    rates = gap_rates([steps], margin)
    return None if rates.answer_steps == 0 else rates.under_search_rate


def search_r1_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings = RewardSettings()) -> Reward:
    """Search-R1's reward: the outcome (EM) alone, no format or invalid-action term (Jin et al., 2025)."""
    steps, outcome = _base(trace, golds, settings.outcome)
    return Reward(outcome, outcome, **_counts(steps), under_search_rate=_under_share(steps, settings.margin),
                  diagnoses=diagnoses(steps, settings.margin))


def _belief_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings, credit: str,
                   gated: bool) -> Reward:
    steps, outcome = _base(trace, golds, settings.outcome)
    consistency = consistency_reward(steps, settings.margin, credit)
    counts = _counts(steps)
    penalty = settings.invalid_penalty * counts["invalid_actions"]
    total = total_reward(outcome, consistency, settings.consistency_weight, gated=gated) - penalty
    return Reward(total, outcome, consistency, penalty, **counts,
                  under_search_rate=_under_share(steps, settings.margin), diagnoses=diagnoses(steps, settings.margin))


def belief_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings = RewardSettings()) -> Reward:
    """The belief-action paper's reward (§3.5): R_outcome·(1 + λ·R_consist), minus the invalid-action
    penalty once per invalid step."""
    return _belief_reward(trace, golds, settings, "both", gated=True)


def belief_over_only_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings = RewardSettings()) -> Reward:
    """Ablation "over-search only": consistency credit for confident ANSWER steps only."""
    return _belief_reward(trace, golds, settings, "over-only", gated=True)


def belief_under_only_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings = RewardSettings()) -> Reward:
    """Ablation "under-search only": consistency credit for unconfident SEARCH steps only."""
    return _belief_reward(trace, golds, settings, "under-only", gated=True)


def belief_ungated_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings = RewardSettings()) -> Reward:
    """Ablation "ungated": R_outcome + λ·R_consist, consistency rewarded on wrong trajectories too
    (the paper's most damaging variant)."""
    return _belief_reward(trace, golds, settings, "both", gated=False)


def beta_grpo_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings = RewardSettings()) -> Reward:
    """β-GRPO (Wu et al., 2025b; the paper's Appendix E baseline): 1 for a correct trajectory whose every
    search call is confident — the lowest token probability of its query at least β — else 0. A
    search step recorded without its query's token log-probs is a DataError (ask with logprobs)."""
    steps, outcome = _base(trace, golds)
    for s in steps:
        if s.action == SEARCH and s.query_confidence is None:
            raise DataError(f"trace of question {trace.question_id!r}, agent step {s.step}: a search without "
                            "its query's token log-probs; β-GRPO reads them (Decoding(logprobs=1))")
    confident = all(s.query_confidence >= settings.query_confidence_threshold  # type: ignore[operator]
                    for s in steps if s.action == SEARCH)
    total = outcome if confident else 0.0
    return Reward(total, outcome, **_counts(steps), under_search_rate=_under_share(steps, settings.margin),
                  diagnoses=diagnoses(steps, settings.margin))


def format_ok(trace: Trace, steps: Sequence[AgentStep]) -> bool:
    """HiPRAG's format term F for our agents: every decision step took a valid action and the
    trajectory ended with an ANSWER step that gave an answer (HiPRAG checks its own XML step format;
    a Search-R1-format trajectory's equivalent is a valid tag at every step and a final answer)."""
    return bool(steps) and all(s.action != INVALID for s in steps) and steps[-1].action == ANSWER \
        and bool(trace.answer)


def hiprag_needs_judging(trace: Trace, golds: Sequence[str]) -> bool:
    """Whether HiPRAG's process bonus applies (A·F = 1), so its steps must be judged: only a correct,
    well-formed trajectory's are, as in HiPRAG's trainer."""
    from metarag.metrics import accuracy

    steps = agent_steps(trace)
    return bool(trace.answer) and accuracy(trace.answer, golds) == 1.0 and format_ok(trace, steps)


def hiprag_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings = RewardSettings(), *,
                  verdicts: Sequence[str] | None = None) -> Reward:
    """HiPRAG's hierarchical reward (Wu et al., 2025a): R = A·(1 − λ_f) + λ_f·F + λ_p·A·F·(N_corr/N),
    A the outcome — the gold contained in the answer (HiPRAG's cover exact match; `metrics.
    accuracy`, on token boundaries) —, F the format term (`format_ok`), N_corr/N the share of steps
    the process judges (`judges/process.py`) found neither over- nor under-search. `verdicts`: one per
    decision step, as `judges.process.step_verdicts` gives them; needed only when A·F = 1 (a wrong or
    malformed trajectory gets no bonus and is never judged), a DataError when missing then."""
    from metarag.judges.process import clean_share
    from metarag.metrics import accuracy

    if isinstance(golds, str) or not golds:
        raise DataError("the reward needs the question's gold answers (a non-empty list of strings)")
    steps = agent_steps(trace)
    outcome = accuracy(trace.answer, golds) if trace.answer else 0.0
    form = 1.0 if format_ok(trace, steps) else 0.0
    total = outcome * (1 - settings.format_weight) + settings.format_weight * form
    process = None
    if outcome * form == 1.0:
        if verdicts is None:
            raise DataError(f"trace of question {trace.question_id!r}: the hiprag reward needs the process "
                            "judges' step verdicts of a correct trajectory (judges.process.ProcessAudit)")
        process = clean_share(verdicts, steps)
        total += settings.process_weight * process
    return Reward(total, outcome, **_counts(steps), under_search_rate=_under_share(steps, settings.margin),
                  diagnoses=diagnoses(steps, settings.margin), process=process)


# ------------------------------------------------------------------ R1-Searcher and AutoRefine
# R1-Searcher's markers (`methods/r1_searcher.py`), as its reward servers count them
_R1_QUERY = ("<|begin_of_query|>", "<|end_of_query|>")
_R1_DOCUMENTS = ("<|begin_of_documents|>", "<|end_of_documents|>")
_R1_BLOCKS = re.compile(r"<\|begin_of_documents\|>.*?<\|end_of_documents\|>", re.S)
_R1_SOLUTION = "\nAssistant: <think>"
_CJK = re.compile(r"[\u4e00-\u9fff]")
_REFINE = re.compile(r"<refine>(.*?)</refine>", re.S)


def r1_solution(trace: Trace) -> str:
    """The text R1-Searcher's reward servers score, rebuilt from a `r1-searcher` trace: everything after
    the prompt's "Assistant: <think>" — the generations, the closing marker each stop cut, the
    documents blocks injected — as the last step's prompt and its generation hold it (the closing
    `</answer>` or `<|end_of_query|>` its stop cut restored from the step's action). A trace of
    another agent: its step generations joined."""
    generations = decision_generations(trace)
    if not generations:
        return ""
    steps = agent_steps(trace)
    last = generations[-1]
    closer = {ANSWER: "</answer>", SEARCH: _R1_QUERY[1]}.get(steps[-1].action, "") if steps else ""
    text = last.text if closer and last.text.endswith(closer) else last.text + closer
    prompt = last.prompt[0].content if len(last.prompt) == 1 and last.prompt[0].role == "raw" else ""
    if _R1_SOLUTION not in prompt:
        return "".join(g.text for g in generations)
    return (prompt.split(_R1_SOLUTION)[-1] + text).strip()


def r1_searcher_format(solution: str) -> dict[str, bool]:
    """R1-Searcher's format checks of a solution, each True when it passes (`train/reward_server_*.py`):
    `retrieval`: it searched, and every query and documents marker came in matched blocks, each block
    holding a first "(1)" document (stage 1's retrieval reward; a search that found nothing writes
    "None" and fails it); `blocks`: the same without the search (stage 2); `tags`: no `<think>` (the
    prompt opened it), one `</think>`, one `<answer>` and one `</answer>`; `clean`: no "Assistant" /
    "assistant", no marker inside the answer, an answer of at most 10 words, no CJK character
    outside the documents (the Qwen server's further checks)."""
    counts = {solution.count(_R1_DOCUMENTS[0] + "\n"), solution.count(_R1_DOCUMENTS[1] + "\n\n"),
              solution.count(_R1_QUERY[0]), solution.count(_R1_QUERY[1]), solution.count(_R1_DOCUMENTS[0]),
              solution.count(_R1_DOCUMENTS[1]), solution.count(_R1_DOCUMENTS[0] + "\n(1)")}
    blocks = len(counts) == 1
    tags = solution.count("<think>") == 0 and solution.count("</think>") == solution.count("<answer>") \
        == solution.count("</answer>") == 1
    answer = solution.split("<answer>")[-1].split("</answer>")[0].strip()
    clean = "Assistant" not in solution and "assistant" not in solution \
        and "begin_of_query" not in answer and "begin_of_documents" not in answer and len(answer.split()) <= 10 \
        and not _CJK.search(_R1_BLOCKS.sub("", solution))
    return {"retrieval": blocks and solution.count(_R1_QUERY[0]) >= 1, "blocks": blocks, "tags": tags, "clean": clean}


def _answer_f1(trace: Trace, golds: Sequence[str]) -> float:
    """The F1 of the trace's answer, the best over the gold aliases (SQuAD's normalization, as
    AutoRefine's `compute_f1_scores`); 0 without an answer."""
    return token_f1(trace.answer, golds) if trace.answer else 0.0


def r1_answer_f1(answer: str | None, golds: Sequence[str]) -> float:
    """R1-Searcher's answer reward: token F1 on `r1_normalize`d text, 0 when one side is yes / no /
    noanswer and the other differs; the best over the gold aliases (its servers score one gold);
    0 without an answer. For `r1-searcher` the answer is the text after the last `<answer>` of a
    reply that stopped at `</answer>` (or the forced one), as the servers extract it."""
    if not answer:
        return 0.0
    prediction = r1_normalize(answer).split()
    best = 0.0
    for gold in golds:
        truth = r1_normalize(gold).split()
        special = {"yes", "no", "noanswer"}
        if (" ".join(prediction) in special or " ".join(truth) in special) and prediction != truth:
            continue
        same = sum((Counter(prediction) & Counter(truth)).values())
        if same:
            precision, recall = same / len(prediction), same / len(truth)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def _check_golds(golds: Sequence[str]) -> None:
    if isinstance(golds, str) or not golds:
        raise DataError("the reward needs the question's gold answers (a non-empty list of strings)")


def r1_searcher_stage1_reward(trace: Trace, golds: Sequence[str],
                              settings: RewardSettings = RewardSettings()) -> Reward:
    """R1-Searcher's stage 1 (Song et al., 2025, §2.2): learn to search, as its released server scores
    it (`train/reward_server_llama_stage1.py`, lines 155-198): R = R_answer + 0.5·R_retrieval +
    0.5·R_format. R_answer = +1 when the solution holds `<answer>` and `</answer>` and its answer (the
    text after the last `<answer>`, stripped) covers a gold answer's tokens (`metrics.
    r1_searcher_accuracy`), else −1; R_retrieval = 1 when the solution searched with its markers in
    order (`r1_searcher_format`'s `retrieval`), R_format = 1 when its think / answer tags are right
    (`tags`). `RewardSettings.r1_stage1_answer` off drops R_answer, the rule as the paper's text
    states it; the answer's F1 is logged as the outcome either way."""
    _check_golds(golds)
    solution, steps = r1_solution(trace), agent_steps(trace)
    checks = r1_searcher_format(solution)
    total = 0.5 * checks["retrieval"] + 0.5 * checks["tags"]
    if settings.r1_stage1_answer:
        answered = "<answer>" in solution and "</answer>" in solution
        prediction = solution.split("<answer>")[-1].split("</answer>")[0].strip()
        total += 1.0 if answered and r1_searcher_accuracy(prediction, golds) else -1.0
    return Reward(total, r1_answer_f1(trace.answer, golds), **_counts(steps), retrieval=float(checks["retrieval"]))


def r1_searcher_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings = RewardSettings()) -> Reward:
    """R1-Searcher's stage 2 (Song et al., 2025, §2.2): learn to answer. R = F1(answer, gold) − P, P =
    `r1_format_penalty` (2) when the solution breaks the format (`r1_searcher_format`: unmatched
    marker blocks, wrong tags, or the Qwen server's further checks), else 0 (F1: `r1_answer_f1`)."""
    _check_golds(golds)
    solution, steps = r1_solution(trace), agent_steps(trace)
    checks = r1_searcher_format(solution)
    outcome = r1_answer_f1(trace.answer, golds)
    penalty = 0.0 if checks["blocks"] and checks["tags"] and checks["clean"] else settings.r1_format_penalty
    return Reward(outcome - penalty, outcome, penalty=penalty, **_counts(steps))


def refined_evidence(trace: Trace) -> str | None:
    """Everything the model wrote inside `<refine> </refine>` over an episode, joined by spaces; None
    when it never refined (AutoRefine's `extract_refine`)."""
    found = [m for g in decision_generations(trace) for m in _REFINE.findall(g.text)]
    return " ".join(found).strip() if found else None


def contains_gold(text: str, golds: Sequence[str]) -> float:
    """1 when a normalized gold alias occurs in the normalized text as a substring (AutoRefine's
    `cover_em_check`; unlike `metrics.accuracy`, not on token boundaries), else 0."""
    norm = normalize_answer(text)
    return float(any(g and g in norm for g in (normalize_answer(a) for a in golds)))


def autorefine_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings = RewardSettings()) -> Reward:
    """AutoRefine's reward (Shi et al., 2025, §3.2; `verl/utils/reward_score/qa_em.py`, `compute_reward`,
    with `cmd/train.sh`'s F1 answer score, `refine_score` 0.1 and `format_score` 0): R = F1(answer,
    gold) when it is above 0; otherwise `refine_weight` when the refined evidence holds a gold
    answer (R_ret = 1), else 0."""
    _check_golds(golds)
    steps = agent_steps(trace)
    outcome = _answer_f1(trace, golds)
    refined = refined_evidence(trace)
    retrieval = contains_gold(refined, golds) if refined else 0.0
    total = outcome if outcome > 0 else settings.refine_weight * retrieval
    return Reward(total, outcome, **_counts(steps), retrieval=retrieval)


RewardFunction = Callable[..., Reward]

REWARDS: Mapping[str, RewardFunction] = {
    "search-r1": search_r1_reward,
    "belief": belief_reward,
    "belief-over-only": belief_over_only_reward,
    "belief-under-only": belief_under_only_reward,
    "belief-ungated": belief_ungated_reward,
    "beta-grpo": beta_grpo_reward,
    "hiprag": hiprag_reward,
    "r1-searcher-stage1": r1_searcher_stage1_reward,
    "r1-searcher": r1_searcher_reward,
    "autorefine": autorefine_reward,
}

# rewards that read the belief probe at every step: a trainer must run the probe for these
NEEDS_PROBE = frozenset({"belief", "belief-over-only", "belief-under-only", "belief-ungated"})
# rewards that read LLM judgments of each step (HiPRAG's process judges): a trainer runs
# `judges.process.ProcessAudit` on the rollouts `hiprag_needs_judging` selects and passes `verdicts`
NEEDS_STEP_JUDGES = frozenset({"hiprag"})


def reward_function(name: str) -> RewardFunction:
    """The reward a trainer's `--reward NAME` names; ConfigError with the close matches otherwise."""
    try:
        return REWARDS[name]
    except KeyError:
        raise ConfigError(f"unknown reward {name!r}{close_matches(name, REWARDS)}") from None
