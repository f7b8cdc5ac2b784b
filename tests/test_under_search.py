"""The external under-search judge (Appendix G) on the scripted model: exactly its five inputs read off
an agent's trace, its verdicts and fallback, run through the runner; and `report --analysis agent`
over a run folder (Acc, searches, belief-based rates, the judged rate kept in the run folder)."""
from __future__ import annotations

import json
import math

import pytest
from test_rewards import step_steps, trace_of

from metarag.cli import main
from metarag.errors import BackendError, DataError
from metarag.evaluate.agent_analysis import (
    agent_summary,
    format_agent_analysis,
    judge_files,
    judge_run,
    judged_rate,
)
from metarag.evaluate.report import load_run
from metarag.evaluate.runs import QuestionResult, RunStore
from metarag.judges.under_search import (
    NO_PASSAGES,
    NOT_UNDER_SEARCH,
    UNDER_SEARCH,
    UNJUDGED,
    UnderSearchAudit,
    UnderSearchJudge,
    under_search_inputs,
    under_search_prompt,
)
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.runner import Runtime, run_many
from metarag.metrics import score_answer
from metarag.policy.agent_trace import ANSWER, INVALID, SEARCH
from metarag.records import Generate, Judge, Question, Retrieve, Trace, Usage

GOLD = ("Paris",)
YES = "Verdict: Yes\nReason: the passages never name the city."
NO = "Verdict: No\nReason: the first passage says it."


def searched_then_answered(answer: str = "Paris", b0: float | None = -0.5, b1: float | None = 0.5) -> Trace:
    return trace_of(step_steps(0, SEARCH, belief=b0, candidate=ANSWER),
                    step_steps(1, ANSWER, belief=b1, candidate=SEARCH,
                               text="<think>Passage 1 says Paris is the capital.</think>\n<answer> Paris"),
                    answer=answer)


# ---------------------------------------------------------------------------------- inputs
def test_the_inputs_are_exactly_the_papers_five():
    inputs = under_search_inputs(searched_then_answered(), GOLD)
    assert set(inputs) == {"question", "passages", "reasoning", "answer", "gold"}
    assert inputs["question"] == "What is the capital of France?"
    assert inputs["passages"].startswith("[1] Paris\nParis is the capital") and "[3] Berlin" in inputs["passages"]
    assert inputs["reasoning"] == "Passage 1 says Paris is the capital."
    assert (inputs["answer"], inputs["gold"]) == ("Paris", "Paris")
    prompt = under_search_prompt(inputs)[0].content
    for value in inputs.values():
        assert value in prompt
    # the judge never sees beliefs, candidates or rewards
    assert "belief" not in prompt.lower() and "candidate" not in prompt.lower() and "-0.5" not in prompt


def test_the_reasoning_is_the_latest_a_step_wrote_when_the_answer_step_has_none():
    # search-r1's continuation: the think came before the search, the answer step is the bare tag
    trace = trace_of(step_steps(0, SEARCH, text="<think>Need the capital.</think>\n<search> capital of France"),
                     step_steps(1, ANSWER, text="<answer> Paris"), answer="Paris")
    assert under_search_inputs(trace, GOLD)["reasoning"] == "Need the capital."
    # the answer step's own reasoning wins over an earlier one
    own = trace_of(step_steps(0, SEARCH, text="<think>Need the capital.</think>\n<search> capital"),
                   step_steps(1, ANSWER, text="<think>It is Paris.</think><answer> Paris"), answer="Paris")
    assert under_search_inputs(own, GOLD)["reasoning"] == "It is Paris."
    # nothing anywhere: the prompt says so
    bare = trace_of(step_steps(0, SEARCH, text="<search> capital"), step_steps(1, ANSWER, text="<answer> Paris"))
    inputs = under_search_inputs(bare, GOLD)
    assert inputs["reasoning"] == ""
    assert "reasoning just before answering: (none)" in under_search_prompt(inputs)[0].content


def test_passages_are_every_distinct_one_retrieved_before_the_answer():
    trace = trace_of(step_steps(0, SEARCH, hits=("p1", "p2", "p3")), step_steps(1, SEARCH, hits=("p3", "p7", "p1")),
                     step_steps(2, ANSWER), answer="Paris")
    passages = under_search_inputs(trace, ("Paris", "City of Light"))
    titles = [block.split("\n")[0] for block in passages["passages"].split("\n\n")]
    assert titles == ["[1] Paris", "[2] Berlin", "[3] Lyon", "[4] Mars"]
    assert passages["gold"] == "Paris; City of Light"


def test_an_answer_without_search_has_no_passages_in_the_prompt():
    inputs = under_search_inputs(trace_of(step_steps(0, ANSWER), answer="Paris"), GOLD)
    assert inputs["passages"] == "" and NO_PASSAGES in under_search_prompt(inputs)[0].content


def test_no_final_answer_step_means_nothing_to_judge():
    assert under_search_inputs(trace_of(step_steps(0, SEARCH), answer=None, error="BackendError: x"), GOLD) is None
    assert under_search_inputs(trace_of(step_steps(0, SEARCH), step_steps(1, INVALID), answer=""), GOLD) is None
    assert under_search_inputs(Trace("q", "?", "standard-rag", (), answer="Paris"), GOLD) is None


# ---------------------------------------------------------------------------------- verdicts
def judged(reply: str, judge: UnderSearchJudge = UnderSearchJudge()):
    llm = ScriptedLLM([("You review the last step", reply)])
    audit = UnderSearchAudit({"q1": under_search_inputs(searched_then_answered(), GOLD)}, judge)
    (trace,) = run_many(audit, [Question("q1", "What is the capital of France?")], Runtime(llm))
    return trace, llm


@pytest.mark.parametrize("reply, verdict, score", [
    (YES, UNDER_SEARCH, 1.0), (NO, NOT_UNDER_SEARCH, 0.0),
    ("**Verdict:** no\nReason: enough", NOT_UNDER_SEARCH, 0.0),
    ("Yes. The nationality was never retrieved.", UNDER_SEARCH, 1.0),  # no label: the first word
    ("Reason: the reason came first after all.\nVerdict: Yes", UNDER_SEARCH, 1.0),
    ("Reason: a reason that runs on and ends inline. Verdict: No", NOT_UNDER_SEARCH, 0.0),
    ("Reason: hard to say\nVerdict: maybe", UNJUDGED, None),
    ("I cannot tell.", UNJUDGED, None),
])
def test_the_verdict_and_its_fallback(reply, verdict, score):
    trace, _ = judged(reply)
    assert trace.error is None and trace.answer == verdict
    generate, judge = trace.steps[0], trace.steps[1]
    assert isinstance(generate, Generate) and generate.purpose == "under-search"
    assert isinstance(judge, Judge) and judge.name == "under-search" and judge.verdict == verdict
    assert judge.score == score and (judge.fallback is not None) == (verdict == UNJUDGED)
    assert set(judge.inputs) == {"question", "passages", "reasoning", "answer", "gold"}


def test_the_prompt_asks_for_the_verdict_before_the_reason_and_the_reason_is_kept():
    prompt = under_search_prompt(under_search_inputs(searched_then_answered(), GOLD))[0].content
    assert prompt.index("Verdict: <") < prompt.index("Reason: <")
    trace, _ = judged("Verdict: Yes\nReason: the passages never name the city. Verdict: Yes")
    assert trace.steps[1].detail == "the passages never name the city."
    cut, _ = judged("Verdict: No\nReason: the first passage names Paris as the capital and the agent")
    assert cut.answer == NOT_UNDER_SEARCH  # a reason cut off by the token budget loses no verdict


def test_the_judge_decodes_greedily_and_can_name_its_own_model(monkeypatch):
    seen = {}
    import metarag.methods.runner as runner

    def fake(spec):
        seen["spec"] = spec
        return ScriptedLLM([("You review", YES)], name="glm")

    monkeypatch.setattr(runner, "build_named_llm", fake)
    trace, own = judged(YES, UnderSearchJudge(model="openai:glm@http://x"))
    assert seen["spec"] == "openai:glm@http://x" and trace.steps[0].model == "openai:glm@http://x"
    assert own.prompts == [] and trace.answer == UNDER_SEARCH  # the run's LLM was not asked
    ask = UnderSearchJudge().judge({"question": "q", "answer": "a", "gold": "g"}).send(None)
    assert ask.decoding.temperature == 0 and ask.model is None


# ----------------------------------------------------------------------- a run folder, reported
def write_run(folder, traces: dict[str, Trace], method: str = "belief-agent"):
    store = RunStore(folder)
    store.write_json("settings.json", {"method": method, "dataset": {"name": "demo"}, "llm": {"backend": "scripted"}})
    store.write_json("questions.json", list(traces))
    with store.open_for_append() as handle:
        for qid, trace in traces.items():
            prediction = trace.answer or ""
            store.append(QuestionResult(qid, GOLD, prediction, score_answer(prediction, GOLD), None, None, trace,
                                        trace.error), handle)
    return load_run(folder)


def renamed(trace: Trace, qid: str) -> Trace:
    return Trace(qid, trace.question, trace.method, trace.steps, trace.answer, trace.error)


@pytest.fixture
def probed_run(tmp_path):
    traces = {
        "q1": renamed(searched_then_answered(), "q1"),                             # optimal, optimal
        "q2": renamed(trace_of(step_steps(0, ANSWER, belief=-0.6), answer="Lyon"), "q2"),   # under-search
        "q3": renamed(trace_of(step_steps(0, SEARCH, belief=0.8), step_steps(1, INVALID, belief=0.1),
                               step_steps(2, ANSWER, belief=0.2, forced=1), answer="Paris"), "q3"),  # over-search
        "q4": renamed(trace_of(step_steps(0, SEARCH, belief=-0.1), answer=None, error="BackendError: down"), "q4"),
    }
    return write_run(tmp_path / "run-probed", traces)


def test_agent_summary_by_hand(probed_run):
    row = agent_summary(probed_run)
    assert row["n"] == 4 and row["acc"] == pytest.approx(50.0)            # q1, q3 correct
    assert row["searches"] == pytest.approx(3 / 4) and row["invalid"] == pytest.approx(1 / 4)
    assert row["forced"] == pytest.approx(1 / 4) and row["answered"] == pytest.approx(3 / 4)
    assert (row["answer_steps"], row["search_steps"]) == (3, 3)
    assert row["under_search_rate"] == pytest.approx(1 / 3)   # q2's answer at b = -0.6
    assert row["over_search_rate"] == pytest.approx(1 / 3)    # q3's search at b = 0.8
    wide = agent_summary(probed_run, margin=0.55)             # only |b| > 0.55 counts
    assert wide["under_search_rate"] == pytest.approx(1 / 3) and wide["over_search_rate"] == pytest.approx(1 / 3)
    wider = agent_summary(probed_run, margin=0.7)
    assert wider["under_search_rate"] == 0.0 and wider["over_search_rate"] == pytest.approx(1 / 3)


def test_the_judge_over_a_run_is_kept_and_not_asked_again(probed_run):
    def reply(prompt: str) -> str:  # q2 answered Lyon: under-search; q1 reasoned from passage 1; q3 unreadable
        if "final answer: Lyon" in prompt:
            return YES
        return NO if "Passage 1 says" in prompt else "I cannot tell."

    llm = ScriptedLLM([("You review", reply)], name="judge")
    path = judge_run(probed_run, llm)
    assert path.parent == probed_run.path and judge_files(probed_run) == [path]
    assert len(llm.prompts) == 3  # q4 failed before answering: nothing to judge
    rate = judged_rate(probed_run, path)
    assert (rate.judged, rate.under_search, rate.unjudged, rate.no_answer) == (2, 1, 1, 1)
    assert rate.groups == (("searched", 0, 1), ("never searched", 1, 1), ("right (EM)", 0, 1), ("wrong", 1, 1))
    assert rate.rate == pytest.approx(0.5) and rate.judge_model == "scripted:judge"
    # a second report with the same judge asks nothing new (a judge that cannot answer proves it)
    silent = ScriptedLLM([], name="judge")
    assert judge_run(probed_run, silent) == path and silent.prompts == []
    assert judged_rate(probed_run, path) == rate


def test_a_failed_judge_request_is_unjudged_and_retried_next_time(probed_run):
    with pytest.raises(BackendError):
        ScriptedLLM([], name="judge").complete("x")
    path = judge_run(probed_run, ScriptedLLM([], name="judge"))  # every request fails: recorded, not raised
    assert judged_rate(probed_run, path).unjudged == 3
    path2 = judge_run(probed_run, ScriptedLLM([("You review", YES)], name="judge"))
    assert path2 == path and judged_rate(probed_run, path).judged == 3


def test_the_analysis_table(probed_run, tmp_path):
    judge_run(probed_run, ScriptedLLM([("You review", YES)], name="judge"))
    unprobed = write_run(tmp_path / "run-unprobed", {"q1": renamed(searched_then_answered(b0=None, b1=None), "q1")},
                         method="search-r1")
    searched = Trace("q1", "?", "standard-rag", (Retrieve(Usage(), query="?", k=5, hits=()),), answer="Paris")
    other = write_run(tmp_path / "run-rag", {"q1": searched}, method="standard-rag")
    text = format_agent_analysis([probed_run, unprobed, other])
    lines: dict[str, str] = {}  # each run's row of the first table
    for line in text.splitlines():
        if line.startswith("| run-"):
            lines.setdefault(line.split(" | ")[0].strip("| "), line)
    assert lines["run-probed"] == ("| run-probed | belief-agent | 4 | 50.0 | 0.75 | 0.25 | 0.25 | 33.3% of 3 "
                                   "| 33.3% of 3 | 100.0% of 3 (scripted:judge) |")
    assert lines["run-unprobed"].endswith("| – | – | – |")
    assert "run-unprobed: not probed; belief-based rates need --set probe=true" in text
    assert "run-unprobed: no judged under-search rate yet (add --judge-llm SPEC)" in text
    assert "run-rag: no search-agent steps" in text
    assert lines["run-rag"].startswith("| run-rag | standard-rag | 1 | 100.0 | 1.00 |")  # its retrieval is a search
    assert "1 trajectories without a final answer" in text
    # the check of what the judge measures: q1, q3 searched and right; q2 answered Lyon without searching
    assert "| run | judge | searched | never searched | right (EM) | wrong |" in text
    assert "| run-probed | scripted:judge | 2 of 2 | 1 of 1 | 2 of 2 | 1 of 1 |" in text


def test_report_analysis_agent_on_the_command_line(probed_run, monkeypatch, capsys, tmp_path):
    import metarag.methods.runner as runner

    monkeypatch.setattr(runner, "build_named_llm", lambda spec, **_: ScriptedLLM([("You review", NO)], name=spec))
    code = main(["report", str(probed_run.path), "--analysis", "agent", "--judge-llm", "glm",
                 "--csv", str(tmp_path / "r.csv")])
    out = capsys.readouterr().out
    assert code == 0 and "under-search judge: " in out and "### Search-agent analysis" in out
    assert "0.0% of 3 (scripted:glm)" in out
    assert json.loads(next(probed_run.path.glob("under-search-*.json")).read_text())["judge_model"] == "scripted:glm"
    code = main(["report", str(probed_run.path), "--judge-llm", "glm", "--csv", str(tmp_path / "r.csv")])
    assert code == 1 and "--judge-llm runs the under-search judge of --analysis agent" in capsys.readouterr().err


def test_nan_rates_print_as_dashes(tmp_path):
    run = write_run(tmp_path / "r", {"q1": renamed(trace_of(step_steps(0, SEARCH, belief=0.3), answer=None,
                                                            error="x"), "q1")})
    row = agent_summary(run)
    assert math.isnan(row["under_search_rate"]) and row["over_search_rate"] == 1.0
    assert "| – | – |" in format_agent_analysis([run])


def test_the_judge_settings_are_ranged():
    from metarag.errors import ConfigError

    with pytest.raises(ConfigError, match="max_tokens' must be >= 8"):
        UnderSearchJudge(max_tokens=2)


def test_the_judge_model_can_reuse_its_kv_cache_exactly(probed_run, monkeypatch, capsys, tmp_path):
    import metarag.methods.runner as runner

    seen = {}

    def build(spec, **fields):
        seen.update(fields, spec=spec)
        return ScriptedLLM([("You review", NO)], name=spec)

    monkeypatch.setattr(runner, "build_named_llm", build)
    csv = ["--csv", str(tmp_path / "r.csv")]
    assert main(["report", str(probed_run.path), "--analysis", "agent", "--judge-llm", "embedded",
                 "--judge-prefix-chunk", "32", *csv]) == 0
    assert seen == {"spec": "embedded", "prefix_chunk": 32}
    monkeypatch.undo()
    # the setting reaches the spec, which refuses it for a back-end that is not llama.cpp (nothing loads)
    code = main(["report", str(probed_run.path), "--analysis", "agent", "--judge-llm", "hf",
                 "--judge-prefix-chunk", "32", *csv])
    assert code == 1 and "--prefix-chunk is a llama.cpp setting; --llm hf does not take it" in capsys.readouterr().err
    code = main(["report", str(probed_run.path), "--analysis", "agent", "--judge-prefix-chunk", "32", *csv])
    assert code == 1 and "--judge-prefix-chunk sets the model of --judge-llm; give both" in capsys.readouterr().err


def test_searches_split_by_what_the_closed_book_model_knows(probed_run, tmp_path):
    from metarag.evaluate.agent_analysis import format_search_by_knowledge, search_by_knowledge

    # the closed-book model knows q1 and q2 (answers Paris), not q3 and q4
    book = write_run(tmp_path / "cb", {q: trace_of(answer=a) for q, a in
                                       (("q1", "Paris"), ("q2", "Paris"), ("q3", "Rome"), ("q4", "Rome"))},
                     method="closed-book")
    split = search_by_knowledge(probed_run, book)
    # searches: q1 one, q2 none (known: 0.5 a question); q3 one, q4 one (unknown: 1.0)
    assert (split.known, split.unknown) == (2, 2)
    assert (split.searches_known, split.searches_unknown, split.difference) == pytest.approx((0.5, 1.0, 0.5))
    assert split.low <= 0.5 <= split.high
    assert "| run-probed | 2 | 2 | 1.00 | 0.50 | +0.50 |" in format_search_by_knowledge([probed_run], book)


def test_the_lean_toward_what_the_model_does_not_know_against_a_baseline_run(probed_run, tmp_path, capsys):
    from metarag.evaluate.agent_analysis import alignment_shift, format_alignment_shift

    book = write_run(tmp_path / "cb", {q: trace_of(answer=a) for q, a in
                                       (("q1", "Paris"), ("q2", "Paris"), ("q3", "Rome"), ("q4", "Rome"))},
                     method="closed-book")
    # the baseline searches everywhere once: gap 0; the probed run's gap is 1.0 - 0.5 = +0.5 (known q1 1, q2 0;
    # unknown q3 1, q4 1)
    flat = write_run(tmp_path / "run-flat", {q: renamed(trace_of(step_steps(0, SEARCH, belief=0.0),
                                                                 step_steps(1, ANSWER, belief=0.0), answer="Paris"), q)
                                             for q in ("q1", "q2", "q3", "q4")})
    shift = alignment_shift(probed_run, flat, book)
    assert (shift.unknown, shift.known) == (2, 2)
    assert (shift.run_gap, shift.baseline_gap, shift.difference) == pytest.approx((0.5, 0.0, 0.5))
    assert shift.low <= 0.5 <= shift.high
    # against itself nothing moves, whatever the resample
    same = alignment_shift(probed_run, probed_run, book)
    assert (same.difference, same.low, same.high) == (0.0, 0.0, 0.0)
    table = format_alignment_shift([flat, probed_run], 0, book)
    assert "| run-probed | run-flat | 2 | 2 | +0.50 | +0.00 | +0.50 |" in table
    # report prints it under the split when given several runs and a closed-book run
    assert main(["report", str(flat.path), str(probed_run.path), "--analysis", "agent",
                 "--closed-book", str(book.path)]) == 0
    assert "| run-probed | run-flat | 2 | 2 | +0.50 | +0.00 | +0.50 |" in capsys.readouterr().out
    with pytest.raises(DataError, match="knows none of the 4 questions"):
        alignment_shift(probed_run, flat, write_run(tmp_path / "cb2", {q: trace_of(answer="Rome") for q in
                                                                       ("q1", "q2", "q3", "q4")}, method="closed-book"))
