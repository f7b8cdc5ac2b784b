"""The runner: every action becomes a step, usage is the sum over steps, failures are recorded."""
import pytest

from metarag.errors import BackendError
from metarag.llm.base import Decoding
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.runner import Runtime, run
from metarag.policy.actions import Ask, Note, Probe, Search
from metarag.records import Answer, Decide, Generate, Message, Question, Retrieve, Score
from metarag.retrieve.memory import MemoryRetriever

Q = Question("q", "Where was the engineer of the Eiffel Tower born?", ("Dijon",))


class TwoHop:
    name = "two-hop"

    def policy(self, question):
        first = yield Search(question.text, 2)
        seen = frozenset(h.passage.id for h in first)
        second = yield Search("Gustave Eiffel born", 2, exclude=seen)
        assert not seen & {h.passage.id for h in second}
        probe = yield Probe("enough", (Message("user", "Enough evidence?"),))
        yield Note("stop", "ANSWER", (("p_yes", probe.prob("Yes")),))
        out = yield Ask("answer", (Message("user", "Answer the question now."),))
        return out.text


def test_runner_records_each_action_and_sums_usage(corpus):
    llm = ScriptedLLM([("Answer the question", "Dijon")], [("Enough", {"Yes": 0.8, "No": 0.1})])
    trace = run(TwoHop(), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.error is None and trace.answer == "Dijon"
    assert [type(s) for s in trace.steps] == [Retrieve, Retrieve, Score, Decide, Generate, Answer]
    assert trace.steps[3].signals == {"p_yes": 0.8}
    usage = trace.usage
    assert usage.retrieval_calls == 2
    assert usage.llm_requests == 2
    # scripted token counts are whitespace words: the rendered prompts, one completion word
    assert usage.completion_tokens == 1
    assert usage.prompt_tokens == sum(s.usage.prompt_tokens for s in trace.steps)
    assert usage.prompt_tokens > 0


def test_a_generation_cut_at_max_tokens_is_marked_in_the_trace_and_its_json():
    from metarag.records import from_plain, to_plain

    class TwoAsks:
        name = "two-asks"

        def policy(self, question):
            yield Ask("reason", (Message("user", "Think."),), Decoding(max_tokens=3, stop=("</s>",)))
            out = yield Ask("answer", (Message("user", "Answer."),), Decoding(max_tokens=8, stop=("</s>",)))
            return out.text

    llm = ScriptedLLM([("Think", "one two three four five"), ("Answer", "Dijon </s> more")])
    trace = run(TwoAsks(), Q, Runtime(llm, None))
    reason, answer = [s for s in trace.steps if isinstance(s, Generate)]
    assert reason.cut and not answer.cut  # max_tokens ran out vs. the stop string fired
    plain = to_plain(trace)
    kept = [s for s in plain["steps"] if s["kind"] == "generate"]
    assert kept[0]["cut"] is True and "cut" not in kept[1]  # unchanged JSON for an uncut reply
    assert from_plain(type(trace), plain) == trace


def test_runner_records_a_failure_with_the_steps_before_it(corpus):
    llm = ScriptedLLM([])  # no rule: the first generation raises BackendError
    trace = run(TwoHop(), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.answer is None
    assert trace.error.startswith("BackendError")
    assert [type(s) for s in trace.steps] == [Retrieve, Retrieve]


def test_runner_without_retriever_fails_clearly():
    trace = run(TwoHop(), Q, Runtime(ScriptedLLM(default="x"), None))
    assert "no retriever" in trace.error


def test_a_bug_in_a_method_is_recorded_not_raised():
    class Broken:
        name = "broken"

        def policy(self, question):
            yield Note("x", "y")
            raise ZeroDivisionError("oops")

    trace = run(Broken(), Q, Runtime(ScriptedLLM(default="x")))
    assert trace.error.startswith("ZeroDivisionError: oops")
    assert len(trace.steps) == 1


def test_scripted_llm_unmatched_prompt_names_it():
    with pytest.raises(BackendError, match="no rule"):
        ScriptedLLM([("foo", "bar")]).complete("something else")


def test_a_reranker_sees_the_deeper_candidates_and_the_method_gets_its_top_k(corpus):
    from metarag.records import Rerank
    from metarag.rerank.base import Reranked

    class Reverse:
        name = "reverse"

        def rerank(self, query, hits, k):
            return Reranked(tuple(reversed(hits))[:k])

    class OneSearch:
        name = "one"

        def policy(self, question):
            hits = yield Search(question.text, 2)
            return hits[0].passage.id

    runtime = Runtime(ScriptedLLM(), MemoryRetriever(corpus), reranker=Reverse(), rerank_depth=4)
    trace = run(OneSearch(), Q, runtime)
    retrieve, rerank = trace.steps[0], trace.steps[1]
    assert isinstance(rerank, Rerank) and len(retrieve.hits) == 4 and len(rerank.hits) == 2
    assert rerank.before == tuple(h.passage.id for h in retrieve.hits)
    assert trace.answer == retrieve.hits[3].passage.id
    assert trace.retrieval_rounds() == [rerank.hits]  # what the method saw is what recall counts
