"""Rewards of the search agents, as pure functions of a finished trace (and its gold answers): the
belief-action gap diagnosis and the correctness-gated consistency reward of the belief-action paper
(Qi et al., 2026, "MetaRAG: Belief-Action Aligned Policy Optimization for Agentic RAG", §3.4, §3.5,
Algorithm 1), its ablations, Search-R1's outcome reward, the β-GRPO baseline (Wu et al., 2025b) and
HiPRAG's hierarchical process reward (Wu et al., 2025a; its step judges are `judges/process.py`).

Every reward reads a trace through `policy/agent_trace.py` (the search agents' trace contract:
`agent_steps`, the `AgentStep` tuples, the gap diagnosis) and works on the steps it returns.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from metarag.errors import ConfigError, DataError, close_matches
from metarag.metrics import exact_match
from metarag.policy.agent_trace import (
    ANSWER,
    INVALID,
    OPTIMAL,
    SEARCH,
    AgentStep,
    agent_steps,
    check_margin,
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
    trainer's `structure_format_score` default and the process bonus's 0.4 in `qa_em_format.py`)."""

    consistency_weight: float = setting(0.1, ge=0)
    margin: float = setting(0.0, ge=0, lt=1)
    invalid_penalty: float = setting(0.01, ge=0)
    query_confidence_threshold: float = setting(0.4, ge=0, le=1)
    format_weight: float = setting(0.2, ge=0, le=1)
    process_weight: float = setting(0.4, ge=0)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class Reward:
    """A trajectory's reward and its parts, each logged on its own by the trainer: `total`, the
    outcome (EM of the final answer), the consistency R_consist (None for rewards without one), the
    penalty taken for invalid actions, the searches made, the share of its ANSWER steps diagnosed
    under-search (None without a probed ANSWER step) and each step's diagnosis (None: unprobed).
    `process`: HiPRAG's share of clean steps N_corr/N (None for the other rewards, and for a HiPRAG
    trajectory whose bonus is gated off, which is never judged)."""

    total: float
    outcome: float
    consistency: float | None = None
    penalty: float = 0.0
    searches: int = 0
    invalid_actions: int = 0
    under_search_rate: float | None = None
    diagnoses: tuple[str | None, ...] = ()
    process: float | None = None

    def components(self) -> dict[str, float]:
        """The numbers a trainer logs, one name each (NaN where a part does not apply)."""
        nan = math.nan
        return {"reward": self.total, "outcome": self.outcome,
                "consistency": nan if self.consistency is None else self.consistency,
                "penalty": self.penalty, "searches": float(self.searches),
                "invalid_actions": float(self.invalid_actions),
                "under_search_rate": nan if self.under_search_rate is None else self.under_search_rate,
                "process": nan if self.process is None else self.process}


def outcome_reward(answer: str | None, golds: Sequence[str]) -> float:
    """R_outcome = 1[EM(final answer, gold)] (Search-R1's and the paper's outcome reward); 0 for a
    trajectory that ended without an answer."""
    if isinstance(golds, str) or not golds:
        raise DataError("the reward needs the question's gold answers (a non-empty list of strings)")
    return exact_match(answer, golds) if answer else 0.0


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
    under-search (b < −m and SEARCH): the paper's two single-sided ablations. 0 for no steps. Every
    step needs its belief score: a run without the probe cannot be rewarded for consistency."""
    if credit not in _CREDITED:
        raise ConfigError(f"unknown consistency credit {credit!r}{close_matches(credit, _CREDITED)}")
    check_margin(margin)
    if not steps:
        return 0.0
    credited = _CREDITED[credit]
    total = 0
    for s in steps:
        if s.belief is None:
            raise DataError(f"agent step {s.step} has no belief score: the consistency reward needs the belief "
                            "probe at every decision step (--set probe=true)")
        total += credited(s, diagnose(s.belief, s.action, margin))
    return total / len(steps)


def total_reward(outcome: float, consistency: float, weight: float = 0.1, *, gated: bool = True) -> float:
    """R_total = R_outcome · (1 + λ·R_consist): consistency counts only on a correct trajectory. The
    ungated ablation, R_outcome + λ·R_consist, rewards consistency on wrong trajectories too."""
    return outcome * (1 + weight * consistency) if gated else outcome + weight * consistency


def _base(trace: Trace, golds: Sequence[str]) -> tuple[tuple[AgentStep, ...], float]:
    return agent_steps(trace), outcome_reward(trace.answer, golds)


def _counts(steps: Sequence[AgentStep]) -> dict[str, int]:
    return {"searches": sum(s.action == SEARCH for s in steps),
            "invalid_actions": sum(s.action == INVALID for s in steps)}


def _under_share(steps: Sequence[AgentStep], margin: float) -> float | None:
    rates = gap_rates([steps], margin)
    return None if rates.answer_steps == 0 else rates.under_search_rate


def search_r1_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings = RewardSettings()) -> Reward:
    """Search-R1's reward: the outcome (EM) alone, no format or invalid-action term (Jin et al., 2025)."""
    steps, outcome = _base(trace, golds)
    return Reward(outcome, outcome, **_counts(steps), under_search_rate=_under_share(steps, settings.margin),
                  diagnoses=diagnoses(steps, settings.margin))


def _belief_reward(trace: Trace, golds: Sequence[str], settings: RewardSettings, credit: str,
                   gated: bool) -> Reward:
    steps, outcome = _base(trace, golds)
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


RewardFunction = Callable[..., Reward]

REWARDS: Mapping[str, RewardFunction] = {
    "search-r1": search_r1_reward,
    "belief": belief_reward,
    "belief-over-only": belief_over_only_reward,
    "belief-under-only": belief_under_only_reward,
    "belief-ungated": belief_ungated_reward,
    "beta-grpo": beta_grpo_reward,
    "hiprag": hiprag_reward,
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
