"""HiPRAG's process reward (`--reward hiprag`): the step judges' inputs read off an agent trace, their
verdicts and fallbacks through the runner on the scripted model, the reward's formula
A·(1 − λ_f) + λ_f·F + λ_p·A·F·N_corr/N, judging only correct well-formed rollouts, and the trainer's
wiring (verdicts reach the reward; `--set` routes reward and judge settings)."""
from __future__ import annotations

import pytest
from test_rewards import step_steps, trace_of

from metarag.errors import DataError
from metarag.judges.process import (
    NECESSARY_SEARCH,
    NOT_JUDGED,
    OVER_SEARCH,
    SUFFICIENT_REASONING,
    UNDER_SEARCH,
    ProcessAudit,
    ProcessJudgeSettings,
    clean_share,
    read_true_false,
    step_inputs,
    step_verdicts,
)
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.runner import Runtime, run_many
from metarag.policy.agent_trace import ANSWER, INVALID, SEARCH, agent_steps
from metarag.records import Generate, Judge, Question
from metarag.retrieve.memory import MemoryRetriever
from metarag.train.agent import AgentRollouts, AgentTrainSettings
from metarag.train.rewards import (
    NEEDS_STEP_JUDGES,
    RewardSettings,
    hiprag_needs_judging,
    hiprag_reward,
    reward_function,
)

GOLD = ("Paris",)


def searched_then_answered(answer: str = "Paris"):
    return trace_of(step_steps(0, SEARCH, query="capital of France"),
                    step_steps(1, ANSWER, text="<think>Passage 1 says Paris is the capital.</think>\n<answer> Paris"),
                    answer=answer)


def audited(llm: ScriptedLLM, trace=None, settings: ProcessJudgeSettings = ProcessJudgeSettings()):
    trace = trace or searched_then_answered()
    inputs = step_inputs(trace)
    (audit,) = run_many(ProcessAudit({"r0": inputs}, settings), [Question("r0", trace.question)], Runtime(llm))
    return inputs, audit


def judges(direct: str = "Paris is the capital of France.", same: str = "<answer>True</answer>",
           sound: str = "<answer>True</answer>") -> ScriptedLLM:
    return ScriptedLLM([("from your own knowledge: capital of France", direct),
                        ("Compare two statements", same), ("You check one reasoning step", sound)])


# ---------------------------------------------------------------------------------- inputs
def test_a_search_step_is_judged_on_its_query_and_the_conclusion_drawn_after_it():
    search, answer = step_inputs(searched_then_answered())
    assert search == {"query": "capital of France", "conclusion": "Passage 1 says Paris is the capital. Paris"}
    assert answer == {"question": "What is the capital of France?",
                      "step": "Passage 1 says Paris is the capital. Paris"}


def test_a_trailing_search_and_an_invalid_step_are_not_judged():
    trace = trace_of(step_steps(0, INVALID), step_steps(1, SEARCH), answer=None)
    assert step_inputs(trace) == (None, None)
    # a search followed by an invalid step has no conclusion either
    assert step_inputs(trace_of(step_steps(0, SEARCH), step_steps(1, INVALID), answer=None)) == (None, None)


@pytest.mark.parametrize("reply, said", [
    ("<answer>True</answer>", True), ("<answer> False </answer>", False), ("True. They match.", True),
    ("They differ.\n<answer>False</answer>", False), ("<answer>True", True), ("I am not sure.", None), ("", None),
])
def test_the_reply_form(reply, said):
    assert read_true_false(reply) is said


# ---------------------------------------------------------------------------------- verdicts
def test_the_audit_asks_the_policy_directly_then_the_judge_and_records_each_verdict():
    llm = judges(same="<answer>True</answer>", sound="<answer>False</answer>")
    inputs, audit = audited(llm)
    assert audit.error is None
    purposes = [s.purpose for s in audit.steps if isinstance(s, Generate)]
    assert purposes == ["hiprag-direct-answer", "hiprag-equivalence", "hiprag-step-check"]
    equivalence = next(s for s in audit.steps if isinstance(s, Generate) and s.purpose == "hiprag-equivalence")
    assert "Paris is the capital of France." in equivalence.prompt[0].content  # the direct answer
    assert "Passage 1 says Paris is the capital." in equivalence.prompt[0].content  # the step's conclusion
    assert step_verdicts(inputs, audit) == (OVER_SEARCH, UNDER_SEARCH)
    judged = [s for s in audit.steps if isinstance(s, Judge)]
    assert [j.name for j in judged] == ["hiprag-over-search", "hiprag-under-search"]
    assert all(j.fallback is None for j in judged)


def test_a_reply_without_verdict_counts_the_step_clean_and_says_so():
    inputs, audit = audited(judges(same="Maybe.", sound="hmm"))
    assert step_verdicts(inputs, audit) == (NECESSARY_SEARCH, SUFFICIENT_REASONING)
    assert all(j.fallback and "no True/False" in j.fallback for j in audit.steps if isinstance(j, Judge))


def test_the_judge_can_be_another_model_but_the_direct_answer_is_the_policys(monkeypatch):
    import metarag.methods.runner as runner

    judge = ScriptedLLM([("Compare two statements", "<answer>False</answer>"),
                         ("You check one reasoning step", "<answer>True</answer>")], name="nano")
    monkeypatch.setattr(runner, "build_named_llm", lambda spec: judge)
    policy = ScriptedLLM([("from your own knowledge", "Lyon.")])
    inputs, audit = audited(policy, settings=ProcessJudgeSettings(judge_model="openai:nano@http://x"))
    assert step_verdicts(inputs, audit) == (NECESSARY_SEARCH, SUFFICIENT_REASONING)
    assert len(policy.prompts) == 1 and len(judge.prompts) == 2


def test_verdicts_of_another_trajectory_are_refused():
    inputs, audit = audited(judges())
    with pytest.raises(DataError, match="2 verdicts for 1 judged steps"):
        step_verdicts((inputs[0], None), audit)


# ---------------------------------------------------------------------------------- reward
def test_the_reward_formula():
    s = RewardSettings()
    assert (s.format_weight, s.process_weight) == (0.2, 0.4)
    right = searched_then_answered()
    assert hiprag_needs_judging(right, GOLD)
    r = hiprag_reward(right, GOLD, s, verdicts=(OVER_SEARCH, SUFFICIENT_REASONING))
    assert r.total == pytest.approx(0.8 + 0.2 + 0.4 * 0.5) and r.process == 0.5 and r.outcome == 1.0
    clean = hiprag_reward(right, GOLD, s, verdicts=(NECESSARY_SEARCH, SUFFICIENT_REASONING))
    assert clean.total == pytest.approx(1.4) and clean.components()["process"] == 1.0
    # the outcome is HiPRAG's cover match: the gold inside a longer answer counts
    assert hiprag_reward(searched_then_answered("It is Paris"), GOLD, s,
                         verdicts=(NOT_JUDGED, NOT_JUDGED)).outcome == 1.0


def test_a_wrong_or_malformed_trajectory_gets_no_bonus_and_needs_no_judging():
    wrong = searched_then_answered("Lyon")
    assert not hiprag_needs_judging(wrong, GOLD)
    r = hiprag_reward(wrong, GOLD)
    assert r.total == pytest.approx(0.2) and r.process is None  # well formed, wrong: λ_f only
    malformed = trace_of(step_steps(0, INVALID), step_steps(1, ANSWER), answer="Paris")
    assert not hiprag_needs_judging(malformed, GOLD)
    assert hiprag_reward(malformed, GOLD).total == pytest.approx(0.8)  # right, badly formed: A·(1 − λ_f)
    unfinished = trace_of(step_steps(0, SEARCH), answer=None)
    assert hiprag_reward(unfinished, GOLD).total == 0.0


def test_a_correct_trajectory_without_verdicts_is_an_error():
    with pytest.raises(DataError, match="needs the process judges"):
        hiprag_reward(searched_then_answered(), GOLD)


def test_every_step_counts_in_n():
    steps = agent_steps(searched_then_answered())
    assert clean_share((OVER_SEARCH, UNDER_SEARCH), steps) == 0.0
    assert clean_share((NOT_JUDGED, SUFFICIENT_REASONING), steps) == 1.0
    with pytest.raises(DataError):
        clean_share((OVER_SEARCH,), steps)


# ---------------------------------------------------------------------------------- trainer
def test_the_trainer_judges_only_correct_rollouts_and_passes_the_verdicts():
    assert "hiprag" in NEEDS_STEP_JUDGES and reward_function("hiprag") is hiprag_reward
    question = Question("q1", "What is the capital of France?", GOLD)
    rollouts = AgentRollouts([question], MemoryRetriever([]), AgentTrainSettings(method="search-r1", reward="hiprag"))
    traces = [searched_then_answered(), searched_then_answered("Lyon"), searched_then_answered()]
    llm = judges(sound="<answer>False</answer>")
    verdicts = rollouts._step_verdicts(traces, [question] * 3, llm)
    assert verdicts[1] is None and verdicts[0] == verdicts[2] == (OVER_SEARCH, UNDER_SEARCH)
    assert sum("Compare two statements" in p for p in llm.prompts) == 2  # the wrong rollout was not judged
    rewards = [rollouts._reward(t, question, v) for t, v in zip(traces, verdicts)]
    assert [round(r.total, 6) for r in rewards] == [1.0, 0.2, 1.0]
    # another reward asks no judge
    plain = AgentRollouts([question], MemoryRetriever([]), AgentTrainSettings(method="search-r1", reward="search-r1"))
    assert plain._step_verdicts(traces, [question] * 3, ScriptedLLM()) == [None, None, None]


def test_cli_routes_reward_and_judge_settings(capsys, tmp_path):
    from metarag.cli import main

    assert main(["train-agent", "--out", str(tmp_path), "--dataset", "demo", "--reward", "hiprag",
                 "--set", "process_weight=-1"]) == 1
    assert "process_weight" in capsys.readouterr().err
    assert main(["train-agent", "--out", str(tmp_path), "--dataset", "demo", "--reward", "hiprag",
                 "--set", "direct_max_tokens=0"]) == 1
    assert "direct_max_tokens" in capsys.readouterr().err
    assert main(["train-agent", "--out", str(tmp_path), "--dataset", "demo", "--set", "no_such_knob=1"]) == 1
    assert "no_such_knob" in capsys.readouterr().err
    assert main(["train-agent", "--out", str(tmp_path), "--dataset", "demo", "--set", "judge_model=embedded"]) == 1
    assert "--reward hiprag only" in capsys.readouterr().err


def test_a_named_judge_model_is_built_once_across_training_steps(monkeypatch):
    import metarag.methods.runner as runner

    built = []

    def build(spec):
        built.append(spec)
        return ScriptedLLM([("Compare two statements", "<answer>False</answer>"),
                            ("You check one reasoning step", "<answer>True</answer>")], name="judge")

    monkeypatch.setattr(runner, "build_named_llm", build)
    question = Question("q1", "What is the capital of France?", GOLD)
    rollouts = AgentRollouts([question], MemoryRetriever([]), AgentTrainSettings(method="search-r1", reward="hiprag"),
                             judge_settings=ProcessJudgeSettings(judge_model="embedded"))
    policy = ScriptedLLM([("from your own knowledge", "Lyon.")])
    for _ in range(2):  # two training steps
        verdicts = rollouts._step_verdicts([searched_then_answered()], [question], policy)
        assert verdicts == [(NECESSARY_SEARCH, SUFFICIENT_REASONING)]
    assert built == ["embedded"]
