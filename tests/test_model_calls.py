"""Every model call is a trace step: MetaRAG's judges, SIM-RAG's LLM critic, EvoCtx's decision model
(also as a separate model) and both LLM rerankers ask through the runner, so the back-end sees
exactly the requests the trace records, in order, each counted once; a judge's Probe goes out in
the same batch as the other policies' Probes under `run_many`."""
from __future__ import annotations

import pytest
import test_evoctx
import test_metarag
import test_sim_rag
from test_run_many import BatchingLLM

from metarag.llm.base import is_raw
from metarag.llm.scripted import ScriptedLLM, render
from metarag.methods.evoctx import EvoCtx, EvoCtxSettings
from metarag.methods.registry import build_method
from metarag.methods.runner import Runtime, run, run_many
from metarag.methods.sim_rag import SimRAG, SimRAGSettings
from metarag.records import Generate, Judge, Question, Rerank, Score
from metarag.rerank.listwise import ListwiseReranker
from metarag.rerank.pointwise import LLMJudgeReranker
from metarag.retrieve.memory import MemoryRetriever

Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))


def as_seen(messages) -> str:
    """A step's prompt as the scripted back-end saw it (what it records in `prompts`)."""
    return messages[0].content if is_raw(messages) else render(messages)


def model_steps(trace) -> list:
    return [s for s in trace.steps if isinstance(s, (Generate, Score))]


def assert_every_call_is_a_step(trace, llm: ScriptedLLM) -> None:
    assert trace.error is None, trace.error
    steps = model_steps(trace)
    # the back-end saw exactly the requests the trace records, in the same order
    assert [as_seen(s.prompt) for s in steps] == llm.prompts
    # cost is the sum of the steps: one request per Generate/Score step, none on the verdicts
    assert trace.usage.llm_requests == len(llm.prompts) == sum(s.usage.llm_requests for s in steps)
    assert all(s.usage.llm_requests == 0 and s.usage.total_tokens == 0
               for s in trace.steps if isinstance(s, (Judge, Rerank)))


def rerank_run(reranker, corpus):
    llm = ScriptedLLM([("Rank the", "[3] > [1] > [2]"), ("Passages:", " Dijon\n")],
                      [("Passage: Gustave Eiffel", {"Yes": 0.9, "No": 0.1}), ("Passage:", {"Yes": 0.2, "No": 0.8})])
    runtime = Runtime(llm, MemoryRetriever(corpus), reranker, rerank_depth=4)
    return run(build_method("standard-rag", {"k": 2}), Q, runtime), llm


CASES = {
    **{f"metarag-{name}": (lambda c, n=name: test_metarag.run_case(n, c)) for name in test_metarag.CASES},
    **{f"sim-rag-{name}": (lambda c, n=name: test_sim_rag.run_case(n, c)) for name in test_sim_rag.CASES},
    **{f"evoctx-{name}": (lambda c, n=name: test_evoctx.run_case(n, c)) for name in test_evoctx.CASES},
    "rerank-llm-judge": lambda c: rerank_run(LLMJudgeReranker(), c),
    "rerank-listwise": lambda c: rerank_run(ListwiseReranker(), c),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_model_call_is_a_trace_step(name, corpus):
    trace, llm = CASES[name](corpus)
    assert_every_call_is_a_step(trace, llm)


@pytest.mark.parametrize("name, purposes", [
    ("metarag-keep", {"expert", "reasoning-check", "internal-sufficiency", "external-sufficiency", "entailment"}),
    ("sim-rag-reject", {"sim-rag-critic"}),
    ("evoctx-retrieve-think-answer", {"evoctx-decision-model"}),
    ("rerank-llm-judge", {"llm-judge"}),
    ("rerank-listwise", {"listwise"}),
])
def test_judge_requests_come_just_before_their_verdict_and_name_the_judge(name, purposes, corpus):
    trace, _ = CASES[name](corpus)
    steps = list(trace.steps)
    judged = {s.purpose for s in model_steps(trace)} - {"answer", "reason", "query", "retrieve-query",
                                                        "sub-query", "sufficiency", "decompose-query"}
    assert judged == purposes
    for i, step in enumerate(steps):
        if isinstance(step, (Generate, Score)) and step.purpose in purposes:
            after = next(s for s in steps[i + 1:] if not isinstance(s, (Generate, Score)))
            assert isinstance(after, (Judge, Rerank))  # the sub-policy's requests, then its outcome
            assert (after.name if isinstance(after, Judge) else after.reranker) == step.purpose


def test_the_decision_model_is_another_model_built_once_and_named_on_its_steps(corpus, monkeypatch):
    from metarag.methods import runner

    values, decisions, _ = test_evoctx.CASES["retrieve-think-answer"]
    generator = test_evoctx.scripted([])  # the run's LLM has no decision script: it must not be asked
    decider = ScriptedLLM([("Decide the next step", list(decisions) * 2)])
    built: list[str] = []

    def build(spec):
        built.append(spec)
        return decider

    monkeypatch.setattr(runner, "build_named_llm", build)
    method = EvoCtx(EvoCtxSettings(**values, decision_llm="embedded-0.5b"), encoder=test_evoctx.StubEncoder())
    runtime = Runtime(generator, MemoryRetriever(corpus))
    traces = [run(method, Q, runtime) for _ in range(2)]
    assert built == ["embedded-0.5b"]  # once per runtime, however many questions ask for it
    for trace in traces:
        assert trace.error is None, trace.error
        decided = [s for s in trace.of_kind(Generate) if s.purpose == "evoctx-decision-model"]
        assert len(decided) == 3 and all(s.model == "embedded-0.5b" for s in decided)
        assert all(s.model is None for s in model_steps(trace) if s not in decided)
    assert not any("Decide the next step" in p for p in generator.prompts)
    assert len(decider.prompts) == 6
    # the same judge on the run's own LLM: its steps name no model, and the trace JSON has no such field
    own = run(EvoCtx(EvoCtxSettings(**values), encoder=test_evoctx.StubEncoder()), Q,
              Runtime(test_evoctx.scripted(decisions), MemoryRetriever(corpus)))
    assert '"model"' not in own.to_json()


def test_a_model_that_cannot_be_built_fails_the_question_that_asked_for_it(corpus, monkeypatch):
    from metarag.errors import ConfigError
    from metarag.methods import runner

    def build(spec):
        raise ConfigError(f"no such model {spec!r}")

    monkeypatch.setattr(runner, "build_named_llm", build)
    values, decisions, _ = test_evoctx.CASES["retrieve-think-answer"]
    method = EvoCtx(EvoCtxSettings(**values, decision_llm="embedded-0.5b"), encoder=test_evoctx.StubEncoder())
    trace = run(method, Q, Runtime(test_evoctx.scripted(decisions), MemoryRetriever(corpus)))
    assert trace.error == "ConfigError: no such model 'embedded-0.5b'"


def test_a_judges_probe_is_batched_with_the_other_policies_probes(corpus):
    questions = [Question(f"q{i}", Q.text, ("Dijon",)) for i in range(3)]
    llm = BatchingLLM([("Answer this multi-hop question", test_sim_rag.RIGHT)],
                      [("Proposed answer: Dijon", {"Yes": 0.9, "No": 0.1})])
    traces = run_many(SimRAG(SimRAGSettings()), questions, Runtime(llm, MemoryRetriever(corpus)))
    assert [t.answer for t in traces] == ["Dijon"] * 3
    # the three answers in one batch, then the three critics' probes in one batch
    assert llm.batches == [("generate", 3), ("score", 3)]
    for trace in traces:
        assert [s.purpose for s in model_steps(trace)] == ["answer", "sim-rag-critic"]


def test_a_rerankers_probes_are_batched_across_policies(corpus):
    questions = [Question(f"q{i}", Q.text, ("Dijon",)) for i in range(2)]
    llm = BatchingLLM([("Passages:", " Dijon\n")], [("Passage:", {"Yes": 0.5, "No": 0.5})])
    runtime = Runtime(llm, MemoryRetriever(corpus), LLMJudgeReranker(), rerank_depth=3)
    traces = run_many(build_method("standard-rag", {"k": 2}), questions, runtime)
    assert [t.answer for t in traces] == ["Dijon"] * 2
    # one probe per candidate, each round holding both questions' probes, then both answers at once
    assert llm.batches == [("score", 2)] * 3 + [("generate", 2)]
