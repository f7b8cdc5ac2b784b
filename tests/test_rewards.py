"""The search agents' rewards and gap diagnosis (train/rewards.py) on hand-made traces that follow the
trace contract: every branch of Algorithm 1 and margin values, the rates, each reward variant, the
β-GRPO query confidence, and a trace made by the real runner from a contract-following policy."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import CITIES
from hypothesis import given
from hypothesis import strategies as st

from metarag.errors import ConfigError, DataError
from metarag.llm.base import Decoding
from metarag.llm.scripted import ScriptedLLM, ScriptedTokens
from metarag.methods.runner import Runtime, run
from metarag.policy.actions import Ask, Note, Search
from metarag.policy.agent_trace import (
    ANSWER,
    INVALID,
    MARGIN_ZONE,
    OPTIMAL,
    OVER_SEARCH,
    SEARCH,
    UNDER_SEARCH,
    AgentStep,
    agent_steps,
    diagnose,
    gap_rates,
)
from metarag.records import (
    Answer,
    Decide,
    Generate,
    Hit,
    Message,
    Question,
    Rerank,
    Retrieve,
    TokenLogprob,
    Trace,
    Usage,
    from_plain,
)
from metarag.retrieve.memory import MemoryRetriever
from metarag.train import rewards as R
from metarag.train.rewards import REWARDS, RewardSettings, consistency_reward, reward_function, total_reward

U = Usage()
GOLD = ("Paris",)


def tokens(*pieces: tuple[str, float], offsets: bool = True) -> tuple[TokenLogprob, ...]:
    out, at = [], 0
    for piece, logprob in pieces:
        out.append(TokenLogprob(piece, logprob, offset=at if offsets else 0))
        at += len(piece)
    return tuple(out)


def step_steps(t: int, action: str, *, belief: float | None = None, candidate: str | None = None,
               text: str | None = None, logprobs: tuple[TokenLogprob, ...] | None = None,
               query: str = "capital of France", hits: tuple[str, ...] = ("p1", "p3", "p2"),
               forced: int = 0, verified: int = 1) -> list:
    """The steps one decision step writes, in the contract's order."""
    out: list = []
    if belief is not None:
        out.append(Decide(U, "belief", "yes" if belief >= 0 else "no", {"step": float(t), "b": belief}))
    if candidate is not None:
        out.append(Decide(U, "agent-candidate", candidate, {"step": float(t)}))
    if text is None:
        text = {SEARCH: f"<think>need facts</think>\n<search> {query}",
                ANSWER: "<think>known</think>\n<answer> Paris", INVALID: "I am not sure"}[action]
    out.append(Generate(U, "agent-step", (Message("user", "q"),), text, logprobs))
    signals = {"step": float(t), "forced": float(forced)}
    if candidate is not None:
        signals["verified"] = float(verified)
    out.append(Decide(U, "agent-step", action, signals))
    if action == SEARCH:
        by_id = {p.id: p for p in CITIES}
        out.append(Retrieve(U, query, 3, tuple(Hit(by_id[i], 1.0 / (r + 1), "bm25") for r, i in enumerate(hits))))
    return out


def trace_of(*groups: list, answer: str | None = "Paris", error: str | None = None) -> Trace:
    steps = [s for g in groups for s in g]
    if answer is not None:
        steps.append(Answer(U, answer))
    return Trace("q1", "What is the capital of France?", "belief-agent", tuple(steps), answer=answer, error=error)


def steps_of(*spec: tuple[str, float | None]) -> tuple[AgentStep, ...]:
    return tuple(AgentStep(t, action, belief=b) for t, (action, b) in enumerate(spec))


# ------------------------------------------------------------------------------ agent_steps
def test_agent_steps_reads_every_field_of_the_contract():
    query_tokens = tokens(("<think>need facts</think>\n", -0.1), ("<search>", -0.01), (" capital", -0.2),
                          (" of", -0.05), (" France", -1.5))
    trace = trace_of(step_steps(0, SEARCH, belief=-0.4, candidate=ANSWER, logprobs=query_tokens, verified=0),
                     step_steps(1, ANSWER, belief=0.6, candidate=ANSWER, forced=1))
    first, second = agent_steps(trace)
    assert first == AgentStep(0, SEARCH, candidate=ANSWER, belief=-0.4, query="capital of France",
                              passage_ids=("p1", "p3", "p2"), query_logprobs=(-0.2, -0.05, -1.5), forced=False,
                              verified=False, text="<think>need facts</think>\n<search> capital of France")
    assert first.query_confidence == pytest.approx(math.exp(-1.5))
    assert second.action == ANSWER and second.forced and second.verified and second.query is None
    assert second.passage_ids == () and second.query_logprobs == ()


def test_agent_steps_without_probe_or_candidate():
    steps = agent_steps(trace_of(step_steps(0, INVALID), step_steps(1, SEARCH), step_steps(2, ANSWER)))
    assert [s.action for s in steps] == [INVALID, SEARCH, ANSWER]
    assert all(s.belief is None and s.candidate is None and s.verified is None for s in steps)


def test_query_tokens_are_the_ones_inside_the_search_tag():
    # the closing tag present; tokens straddling the tags count when they overlap the query
    text = "<think>x</think><search>who wrote it</search>"
    toks = tokens(("<think>x</think>", -0.1), ("<search>who", -0.3), (" wrote", -0.2), (" it", -0.7),
                  ("</search>", -2.0))
    trace = trace_of(step_steps(0, SEARCH, text=text, logprobs=toks, query="who wrote it"))
    assert agent_steps(trace)[0].query_logprobs == (-0.3, -0.2, -0.7)


def test_query_tokens_placed_by_their_pieces_when_offsets_are_missing():
    toks = tokens(("<search>", -0.1), (" a", -0.2), (" b", -0.3), offsets=False)
    trace = trace_of(step_steps(0, SEARCH, text="<search> a b", logprobs=toks, query="a b"))
    assert agent_steps(trace)[0].query_logprobs == (-0.2, -0.3)


def test_the_last_search_tag_is_the_query():
    text = "<think>I could <search> not this</think> <search> this one"
    toks = tokens(("<think>I could <search> not this</think> <search>", -0.1), (" this", -0.4), (" one", -0.5))
    assert agent_steps(trace_of(step_steps(0, SEARCH, text=text, logprobs=toks, query="this one")))[0] \
        .query_logprobs == (-0.4, -0.5)


def test_a_rerank_replaces_the_passages_of_its_search():
    steps = step_steps(0, SEARCH) + [Rerank(U, "ce", "capital of France", ("p1", "p3", "p2"),
                                            (Hit(CITIES[2], 2.0, "ce"),))]
    assert agent_steps(trace_of(steps, step_steps(1, ANSWER)))[0].passage_ids == ("p3",)


def test_a_trace_of_another_method_has_no_agent_steps():
    trace = Trace("q", "?", "standard-rag", (Retrieve(U, "x", 3, ()), Generate(U, "answer", (), "Paris"),
                                             Answer(U, "Paris")), answer="Paris")
    assert agent_steps(trace) == ()


@pytest.mark.parametrize("groups, message", [
    ([step_steps(1, ANSWER)], "step 1 where step 0 was due"),
    ([step_steps(0, SEARCH), step_steps(0, ANSWER)], "step 0 where step 1 was due"),
    ([[Decide(U, "belief", "yes", {"step": 0.0})]], "no signal 'b'"),
    ([[Decide(U, "agent-step", "answer", {})]], "no valid 'step' signal"),
    ([[Decide(U, "agent-step", "answer", {"step": 0.5})]], "no valid 'step' signal"),
    ([step_steps(0, ANSWER, belief=1.5)], "outside [-1, 1]"),
    ([[Decide(U, "agent-step", "think", {"step": 0.0})]], "action 'think'"),
])
def test_a_trace_that_breaks_the_contract_is_named(groups, message):
    with pytest.raises(DataError, match="q1|step") as info:
        agent_steps(trace_of(*groups))
    assert message in str(info.value)


# -------------------------------------------------------------------------------- diagnosis
@pytest.mark.parametrize("belief, action, margin, expected", [
    (0.5, ANSWER, 0.0, OPTIMAL), (-0.5, SEARCH, 0.0, OPTIMAL),
    (0.5, SEARCH, 0.0, OVER_SEARCH), (-0.5, ANSWER, 0.0, UNDER_SEARCH),
    (0.0, ANSWER, 0.0, MARGIN_ZONE), (0.0, SEARCH, 0.0, MARGIN_ZONE),  # b = 0 is |b| <= m at m = 0
    (1e-9, SEARCH, 0.0, OVER_SEARCH), (-1e-9, ANSWER, 0.0, UNDER_SEARCH),
    (0.3, ANSWER, 0.3, MARGIN_ZONE), (-0.3, ANSWER, 0.3, MARGIN_ZONE),  # the zone's edges are inside it
    (0.2, SEARCH, 0.3, MARGIN_ZONE), (-0.2, ANSWER, 0.3, MARGIN_ZONE),
    (0.31, SEARCH, 0.3, OVER_SEARCH), (-0.31, ANSWER, 0.3, UNDER_SEARCH),
    (0.31, ANSWER, 0.3, OPTIMAL), (-0.31, SEARCH, 0.3, OPTIMAL),
    (1.0, ANSWER, 0.99, OPTIMAL), (-1.0, ANSWER, 0.99, UNDER_SEARCH),
    (0.9, INVALID, 0.0, INVALID), (0.0, INVALID, 0.5, INVALID),
])
def test_every_branch_of_algorithm_1(belief, action, margin, expected):
    assert diagnose(belief, action, margin) == expected


@pytest.mark.parametrize("margin", [1.0, -0.1, math.nan, 2.0])
def test_a_margin_outside_0_1_is_refused(margin):
    with pytest.raises(ConfigError, match="margin m must be in"):
        diagnose(0.5, ANSWER, margin)


def test_a_belief_outside_the_range_or_an_unknown_action_is_refused():
    with pytest.raises(DataError, match="outside"):
        diagnose(1.2, ANSWER)
    with pytest.raises(DataError, match="'think'"):
        diagnose(0.5, "think")


beliefs = st.floats(-1, 1, allow_nan=False)
margins = st.floats(0, 0.999, allow_nan=False)


@given(beliefs, margins)
def test_diagnosis_is_symmetric_in_the_belief(b, m):
    mirror = {OPTIMAL: OPTIMAL, OVER_SEARCH: UNDER_SEARCH, UNDER_SEARCH: OVER_SEARCH, MARGIN_ZONE: MARGIN_ZONE}
    assert diagnose(-b, ANSWER, m) == mirror[diagnose(b, SEARCH, m)]
    assert diagnose(-b, SEARCH, m) == mirror[diagnose(b, ANSWER, m)]


@given(beliefs, margins, st.sampled_from([SEARCH, ANSWER]))
def test_diagnosis_agrees_with_the_definitions(b, m, action):
    d = diagnose(b, action, m)
    assert (d == MARGIN_ZONE) == (abs(b) <= m)
    assert (d == OPTIMAL) == ((b > m and action == ANSWER) or (b < -m and action == SEARCH))
    assert (d == OVER_SEARCH) == (b > m and action == SEARCH)
    assert (d == UNDER_SEARCH) == (b < -m and action == ANSWER)


def test_gap_rates_pool_the_steps_of_every_trajectory():
    runs = [steps_of((SEARCH, 0.8), (ANSWER, -0.5)),           # over-search, under-search
            steps_of((SEARCH, -0.9), (SEARCH, 0.1), (ANSWER, 0.7)),  # optimal, over, optimal
            steps_of((INVALID, 0.9), (SEARCH, None), (ANSWER, 0.05))]  # invalid skipped, unprobed, answer
    rates = gap_rates(runs)
    assert (rates.answer_steps, rates.under_search, rates.search_steps, rates.over_search, rates.unprobed) == \
        (3, 1, 3, 2, 1)
    assert rates.under_search_rate == pytest.approx(1 / 3) and rates.over_search_rate == pytest.approx(2 / 3)
    wide = gap_rates(runs, margin=0.2)  # 0.1 and 0.05 fall in the zone: neither error
    assert (wide.under_search, wide.over_search) == (1, 1)
    assert math.isnan(gap_rates([]).under_search_rate) and math.isnan(gap_rates([]).over_search_rate)


# ---------------------------------------------------------------------------------- rewards
def test_consistency_is_the_share_of_optimal_steps():
    steps = steps_of((SEARCH, -0.6), (SEARCH, 0.4), (INVALID, -0.2), (ANSWER, 0.9))  # opt, over, invalid, opt
    assert consistency_reward(steps) == pytest.approx(2 / 4)
    assert consistency_reward(steps, credit="over-only") == pytest.approx(1 / 4)   # the confident ANSWER
    assert consistency_reward(steps, credit="under-only") == pytest.approx(1 / 4)  # the unconfident SEARCH
    assert consistency_reward(steps, margin=0.5) == pytest.approx(2 / 4)  # 0.4 in the zone: still not optimal
    assert consistency_reward(steps, margin=0.7) == pytest.approx(1 / 4)  # only b = 0.9 stays outside the zone
    assert consistency_reward(()) == 0.0


def test_consistency_reads_the_steps_that_have_a_belief():
    # a belief table gives the first step alone a belief: the sum runs over it (SEARCH while unsure: optimal)
    assert consistency_reward(steps_of((SEARCH, -0.6), (ANSWER, None))) == 1.0
    assert consistency_reward(steps_of((ANSWER, -0.6), (ANSWER, None))) == 0.0  # under-search at step 0
    with pytest.raises(DataError, match="no belief score.*probe=true.*belief_table"):
        consistency_reward(steps_of((SEARCH, None), (ANSWER, None)))
    with pytest.raises(ConfigError, match="unknown consistency credit"):
        consistency_reward((), credit="over")


def test_the_total_is_gated_by_correctness():
    assert total_reward(1.0, 0.5, 0.1) == pytest.approx(1.05)
    assert total_reward(0.0, 1.0, 0.1) == 0.0
    assert total_reward(0.0, 1.0, 0.1, gated=False) == pytest.approx(0.1)
    assert total_reward(1.0, 1.0, 0.4, gated=False) == pytest.approx(1.4)


def consistent_correct_trace(answer: str = "Paris") -> Trace:
    """search with b < 0 (optimal), then answer with b > 0 (optimal): R_consist = 1."""
    return trace_of(step_steps(0, SEARCH, belief=-0.5), step_steps(1, ANSWER, belief=0.5), answer=answer)


def test_belief_reward_and_its_ablations_on_one_trajectory():
    mixed = trace_of(step_steps(0, SEARCH, belief=0.5),   # over-search
                     step_steps(1, INVALID, belief=-0.5),  # invalid
                     step_steps(2, SEARCH, belief=-0.5),   # optimal (no under-search)
                     step_steps(3, ANSWER, belief=0.5))    # optimal (no over-search)
    full = R.belief_reward(mixed, GOLD)
    assert full.outcome == 1.0 and full.consistency == pytest.approx(0.5) and full.penalty == pytest.approx(0.01)
    assert full.total == pytest.approx(1 * (1 + 0.1 * 0.5) - 0.01)
    assert (full.searches, full.invalid_actions) == (2, 1)
    assert full.diagnoses == (OVER_SEARCH, INVALID, OPTIMAL, OPTIMAL) and full.under_search_rate == 0.0
    assert R.belief_over_only_reward(mixed, GOLD).consistency == pytest.approx(0.25)
    assert R.belief_under_only_reward(mixed, GOLD).consistency == pytest.approx(0.25)
    wrong = trace_of(*[g for g in [step_steps(0, SEARCH, belief=-0.5), step_steps(1, ANSWER, belief=0.5)]],
                     answer="Lyon")
    assert R.belief_reward(wrong, GOLD).total == 0.0
    assert R.belief_ungated_reward(wrong, GOLD).total == pytest.approx(0.1)
    assert R.belief_reward(consistent_correct_trace(), GOLD).total == pytest.approx(1.1)
    settings = RewardSettings(consistency_weight=0.4, invalid_penalty=0.0)
    assert R.belief_reward(mixed, GOLD, settings).total == pytest.approx(1.2)
    logged = full.components()
    assert math.isnan(logged.pop("process"))  # HiPRAG's part: not this reward's
    assert math.isnan(logged.pop("retrieval"))  # AutoRefine's and R1-Searcher's: not this reward's
    assert logged == {"reward": full.total, "outcome": 1.0, "consistency": 0.5, "penalty": 0.01, "searches": 2.0,
                      "invalid_actions": 1.0, "under_search_rate": 0.0}
    assert math.isnan(R.search_r1_reward(mixed, GOLD).components()["consistency"])


def test_an_under_search_answer_counts_in_the_trajectory_rate():
    trace = trace_of(step_steps(0, ANSWER, belief=-0.8), answer="Lyon")
    reward = R.belief_reward(trace, GOLD)
    assert reward.diagnoses == (UNDER_SEARCH,) and reward.under_search_rate == 1.0 and reward.total == 0.0


def test_a_failed_trajectory_scores_zero_outcome():
    failed = trace_of(step_steps(0, SEARCH, belief=-0.5), answer=None, error="BackendError: down")
    for name in REWARDS:
        if name == "beta-grpo":
            continue
        reward = reward_function(name)(failed, GOLD)
        assert reward.outcome == 0.0
    assert R.belief_ungated_reward(failed, GOLD).total == pytest.approx(0.1)  # one optimal step of one


def test_search_r1_reward_is_the_outcome_alone():
    trace = trace_of(step_steps(0, INVALID), step_steps(1, SEARCH), step_steps(2, ANSWER))
    reward = R.search_r1_reward(trace, GOLD)
    assert (reward.total, reward.outcome, reward.consistency, reward.penalty) == (1.0, 1.0, None, 0.0)
    assert reward.diagnoses == (None, None, None) and reward.under_search_rate is None
    assert R.search_r1_reward(trace_of(step_steps(0, ANSWER), answer="the Paris!"), GOLD).total == 1.0  # EM rules


def search_with_confidence(t: int, lowest: float) -> list:
    toks = tokens(("<search>", -0.01), (" capital", math.log(0.9)), (" of", math.log(lowest)), (" France", -0.02))
    return step_steps(t, SEARCH, text="<search> capital of France", logprobs=toks)


@pytest.mark.parametrize("lowests, answer, expected", [
    ((0.5,), "Paris", 1.0), ((0.4,), "Paris", 1.0),      # at the threshold counts as confident
    ((0.39,), "Paris", 0.0), ((0.9, 0.2), "Paris", 0.0),  # one unconfident search is enough
    ((0.9,), "Lyon", 0.0), ((), "Paris", 1.0),           # wrong; no search at all
])
def test_beta_grpo_rewards_correct_trajectories_with_confident_queries(lowests, answer, expected):
    groups = [search_with_confidence(t, p) for t, p in enumerate(lowests)]
    trace = trace_of(*groups, step_steps(len(lowests), ANSWER), answer=answer)
    reward = R.beta_grpo_reward(trace, GOLD)
    assert reward.total == expected and reward.searches == len(lowests)


def test_beta_grpo_threshold_is_a_setting_and_needs_logprobs():
    trace = trace_of(search_with_confidence(0, 0.3), step_steps(1, ANSWER))
    assert R.beta_grpo_reward(trace, GOLD, RewardSettings(query_confidence_threshold=0.25)).total == 1.0
    with pytest.raises(DataError, match="agent step 0: a search without its query's token log-probs"):
        R.beta_grpo_reward(trace_of(step_steps(0, SEARCH), step_steps(1, ANSWER)), GOLD)


@given(st.lists(st.tuples(st.sampled_from([SEARCH, ANSWER, INVALID]), beliefs), min_size=1, max_size=4),
       st.booleans(), st.floats(0, 0.4, allow_nan=False))
def test_gated_reward_bounds(spec, correct, weight):
    groups = [step_steps(t, action, belief=b) for t, (action, b) in enumerate(spec)]
    trace = trace_of(*groups, answer="Paris" if correct else "Lyon")
    settings = RewardSettings(consistency_weight=weight)
    reward = R.belief_reward(trace, GOLD, settings)
    invalid = sum(a == INVALID for a, _ in spec)
    assert reward.penalty == pytest.approx(0.01 * invalid)
    assert 0.0 <= reward.consistency <= 1.0
    if correct:
        assert 1.0 - reward.penalty <= reward.total <= 1.0 + weight - reward.penalty + 1e-12
    else:
        assert reward.total == pytest.approx(-reward.penalty)
    ungated = R.belief_ungated_reward(trace, GOLD, settings)
    assert ungated.total >= reward.total - 1e-12 if not correct else ungated.total == pytest.approx(reward.total)


def test_registry_and_settings():
    assert set(REWARDS) == {"search-r1", "belief", "belief-over-only", "belief-under-only", "belief-ungated",
                            "beta-grpo", "hiprag", "r1-searcher-stage1", "r1-searcher", "autorefine"}
    assert R.NEEDS_PROBE < set(REWARDS) and R.NEEDS_STEP_JUDGES < set(REWARDS)
    with pytest.raises(ConfigError, match="unknown reward 'belif'.*did you mean belief"):
        reward_function("belif")
    with pytest.raises(ConfigError, match="margin' must be in \\[0, 1\\)"):
        RewardSettings(margin=1.0)
    with pytest.raises(ConfigError, match="query_confidence_threshold"):
        RewardSettings(query_confidence_threshold=1.5)
    with pytest.raises(DataError, match="gold answers"):
        R.outcome_reward("Paris", ())
    defaults = RewardSettings()
    assert (defaults.consistency_weight, defaults.margin, defaults.invalid_penalty) == (0.1, 0.0, 0.01)


# ------------------------------------------------------------------- a trace the runner made
class ContractAgent:
    """A two-step policy that writes exactly the contract's steps (probe, candidate, generation,
    decision, retrieval), so agent_steps is checked on what the real runner records."""

    name = "contract-agent"

    def policy(self, question: Question):
        for t in range(2):
            yield Note("belief", "no" if t == 0 else "yes", (("step", float(t)), ("b", -0.5 if t == 0 else 0.7)))
            yield Note("agent-candidate", "search", (("step", float(t)),))
            out = yield Ask("agent-step", (Message("user", f"{question.text} step {t}"),),
                            Decoding(max_tokens=32, stop=("</search>", "</answer>"), logprobs=1))
            action = "search" if "<search>" in out.text else "answer"
            yield Note("agent-step", action, (("step", float(t)), ("forced", float(t == 1)), ("verified", 1.0)))
            if action == "search":
                yield Search(out.text.split("<search>")[-1].strip(), 3)
            else:
                return out.text.split("<answer>")[-1].strip()
        return ""


def test_agent_steps_on_a_trace_the_runner_recorded():
    llm = ScriptedLLM([
        ("step 0", ScriptedTokens.of("<think>look", " it up</think>", " <search>", (" capital", -0.3),
                                     (" France", -0.9), "</search>", " ignored")),
        ("step 1", ScriptedTokens.of("<answer>", " Paris", "</answer>")),
    ])
    runtime = Runtime(llm, MemoryRetriever(CITIES, "memory"))
    trace = run(ContractAgent(), Question("q1", "What is the capital of France?", GOLD), runtime)
    assert trace.error is None and trace.answer == "Paris"
    first, second = agent_steps(trace)
    assert first.action == SEARCH and first.query == "capital France" and first.belief == -0.5
    assert first.query_logprobs == pytest.approx((-0.3, -0.9))
    assert first.passage_ids and first.passage_ids[0] == "p1"
    assert second.action == ANSWER and second.forced and second.candidate == "search" and second.verified
    reward = R.belief_reward(trace, GOLD)  # search at b < 0, answer at b > 0: both optimal
    assert reward.diagnoses == (OPTIMAL, OPTIMAL) and reward.total == pytest.approx(1.1)


AGENT_GOLDENS = sorted(p for pattern in ("search-r1-*.json", "belief-agent-*.json")
                       for p in (Path(__file__).parent / "golden").glob(pattern))


@pytest.mark.skipif(not AGENT_GOLDENS, reason="no search-agent golden traces")
@pytest.mark.parametrize("path", AGENT_GOLDENS, ids=lambda p: p.stem)
def test_the_agents_golden_traces_follow_the_contract(path):
    """The search agents' own golden traces read back: steps in order, an answer last, searches with
    their query tokens, beliefs exactly where the probe ran."""
    trace = from_plain(Trace, json.loads(path.read_text()))
    steps = agent_steps(trace)
    assert steps and [s.step for s in steps] == list(range(len(steps))) and steps[-1].action == ANSWER
    for s in steps:
        if s.action == SEARCH:
            assert s.query and s.query_logprobs and s.passage_ids
    probed = "probe" in path.stem
    assert all((s.belief is not None) == probed for s in steps)
    for name, reward in REWARDS.items():
        if name in R.NEEDS_PROBE and not probed:
            continue
        verdicts = {"verdicts": ("not-judged",) * len(steps)} if name in R.NEEDS_STEP_JUDGES else {}
        assert reward(trace, (trace.answer,), **verdicts).outcome == 1.0


def test_every_reward_setting_declares_its_range():
    import dataclasses

    from metarag.settings import Range

    # every number declares its range; the outcome is a name, checked against OUTCOMES
    assert all(isinstance(f.metadata.get("range"), Range) for f in dataclasses.fields(RewardSettings)
               if f.name != "outcome")
    for name in ("consistency_weight", "invalid_penalty"):
        with pytest.raises(ConfigError, match=name):
            RewardSettings(**{name: -0.1})
        with pytest.raises(ConfigError, match=name):
            RewardSettings(**{name: math.nan})


def test_term_flips_counts_the_advantages_a_reward_term_turned_around():
    from metarag.evaluate.training_curves import term_flips

    # two right rollouts, one consistent (1.1) and one not (1.0), and a wrong one: without the term the
    # two right ones tie above the mean; with it, under "none", both stay above: no flip
    assert term_flips([([1.1, 1.0, 0.0], [1.0, 1.0, 0.0])]).flipped == 0
    # one right and one wrong-but-penalty-free group where the term makes the difference: 0.05 vs 0.0
    # (ungated consistency on wrong answers): the sign of both advantages appears only with the term
    result = term_flips([([0.05, 0.0], [0.0, 0.0]), ([1.0], [1.0])])
    assert (result.groups, result.advantages, result.flipped) == (1, 2, 1)
    assert result.mean_change == pytest.approx(0.025)
