"""`run_many`: the traces `run` gives, model requests that go out as real batches (or concurrently
from a thread pool), a failing policy that stops only itself, and a run-level sampling override
under which rollouts differ by seed and repeat with the same seed."""
from __future__ import annotations

import hashlib
import random
import re
import threading
import time

import pytest
from test_methods import without_latency

from metarag.errors import BackendError, ConfigError
from metarag.llm.base import Decoding, generate
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.metarag import MetaRAG, MetaRAGSettings
from metarag.methods.registry import build_method
from metarag.methods.runner import Runtime, Sampling, request_seed, run, run_many
from metarag.policy.actions import Ask, Note, Probe
from metarag.records import Answer, Completion, Generate, Message, Question, Usage

WORDS = ("Paris", "Dijon", "1832", "yes", "no", "the Rhine", "Gustave Eiffel", "Lyon", "1889", "Berlin")


def pick(prompt: str, salt: str = "") -> str:
    """A word chosen by the prompt alone, so an answer never depends on the order of the calls."""
    return WORDS[int(hashlib.sha1((salt + prompt).encode()).hexdigest(), 16) % len(WORDS)]


def standard_llm() -> ScriptedLLM:
    return ScriptedLLM([("Passages:", lambda prompt: f" {pick(prompt)}\n")])


def metarag_llm() -> ScriptedLLM:
    """Every MetaRAG prompt answered as a function of the prompt; label probabilities vary by question."""
    return ScriptedLLM(
        [("Think step by step in at most three",
          lambda p: f"Gustave Eiffel built the tower.\nAnswer: {pick(p)}"),
         ("Copy the shortest span", lambda p: pick(p, "expert")),
         ("Check the proposed answer", "Error: misaligned\nFeedback: Give the birthplace."),
         ("miss information needed", lambda p: f"{pick(p, 'q')} birthplace"),
         ("first simpler sub-question", lambda p: f"Who is {pick(p, 'sub')}?")],
        [(r"from your own knowledge alone(?=.*Question: (?:Who|What))", {"Yes": 0.9, "No": 0.1}),
         ("from your own knowledge alone", {"Yes": 0.2, "No": 0.8}),
         (r"contain all the information(?=.*Question: \S+ \S+ (?:the|a))", {"Yes": 0.8, "No": 0.2}),
         ("contain all the information", {"Yes": 0.3, "No": 0.7}),
         ("entail the claim", {"Yes": 0.4, "No": 0.6})])


CASES = {
    "standard-rag": (lambda: build_method("standard-rag"), standard_llm),
    "metarag": (lambda: MetaRAG(MetaRAGSettings(similarity="token-f1", max_iter=2)), metarag_llm),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("window", [None, 3])
def test_run_many_gives_the_traces_of_run_question_by_question(name, window, sample20):
    questions, retriever = sample20
    make_method, make_llm = CASES[name]
    one_by_one = [run(make_method(), q, Runtime(make_llm(), retriever)) for q in questions]
    seen: list[tuple[int, object]] = []
    finished: list[int] = []
    together = run_many(make_method(), questions, Runtime(make_llm(), retriever), window=window,
                        on_step=lambda i, step: seen.append((i, step)), on_trace=lambda i, t: finished.append(i))
    assert all(t.error is None for t in one_by_one), [t.error for t in one_by_one if t.error]
    assert [without_latency(t) for t in together] == [without_latency(t) for t in one_by_one]
    assert len({t.answer for t in together}) > 1  # the questions really got different answers
    # every step was reported once, in its trace's order, and every trace once
    for i, trace in enumerate(together):
        assert [s for j, s in seen if j == i] == list(trace.steps)
    assert sorted(finished) == list(range(len(questions)))
    if name == "metarag":  # the script reaches several plans, so policies leave the lockstep
        assert len({len(t.steps) for t in together}) > 1


class BatchingLLM(ScriptedLLM):
    """A scripted back-end that batches: it records the size of every batch it is sent."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[tuple[str, int]] = []

    def generate_batch(self, prompts, decodings):
        self.batches.append(("generate", len(prompts)))
        return [generate(self, p, d) for p, d in zip(prompts, decodings)]

    def score_labels_batch(self, prompts, labels):
        self.batches.append(("score", len(prompts)))
        return [self.score_labels(p, labels) for p in prompts]

    def complete(self, prompt, decoding=Decoding()):
        if not self.batches:
            raise AssertionError("a request went to the back-end outside a batch")
        return super().complete(prompt, decoding)


def test_each_round_goes_to_the_back_end_as_one_batch(sample20):
    questions, retriever = sample20
    llm = BatchingLLM([("Passages:", lambda prompt: f" {pick(prompt)}\n")])
    traces = run_many(build_method("standard-rag"), questions, Runtime(llm, retriever))
    assert llm.batches == [("generate", 20)]  # one search round, then one answer round of all 20
    assert all(t.answer for t in traces)
    llm.batches.clear()
    run_many(build_method("standard-rag"), questions, Runtime(llm, retriever), window=8)
    assert llm.batches == [("generate", 8), ("generate", 8), ("generate", 4)]
    llm.batches.clear()
    run(build_method("standard-rag"), questions[0], Runtime(llm, retriever))
    assert llm.batches == [("generate", 1)]


class Probing:
    """A policy that probes, then asks, then probes with another label set."""

    name = "probing"

    def policy(self, question):
        first = yield Probe("first", (Message("user", f"Is {question.text} known?"),))
        out = yield Ask("answer", (Message("user", f"Answer {question.text}"),), Decoding(max_tokens=4))
        yield Probe("second", (Message("user", f"Sure about {out.text}?"),), ("True", "False"))
        return out.text if first.p("Yes")[0] > 0.5 else "unknown"


def test_probes_are_batched_per_label_set_and_failures_stay_with_their_question():
    rules = [("Answer q1", "one"), ("Answer q3", "three")]
    label_rules = [("known", {"Yes": 0.9, "No": 0.1}), ("Sure", {"True": 0.6, "False": 0.4})]
    questions = [Question(f"q{i}", f"q{i}") for i in (1, 2, 3)]
    llm = BatchingLLM([*rules, ("Answer q2", "two")], label_rules)
    assert [t.answer for t in run_many(Probing(), questions, Runtime(llm))] == ["one", "two", "three"]
    assert llm.batches == [("score", 3), ("generate", 3), ("score", 3)]
    # in turn, q2 (no generation rule) fails alone, with the step before its failure
    traces = run_many(Probing(), questions, Runtime(ScriptedLLM(rules, label_rules)))
    assert [t.answer for t in traces] == ["one", None, "three"]
    assert traces[1].error.startswith("BackendError: scripted LLM has no rule") and len(traces[1].steps) == 1
    assert [type(s).__name__ for s in traces[0].steps] == ["Score", "Generate", "Score", "Answer"]


def test_mixed_label_sets_in_one_round_go_as_one_batch_each():
    class TwoKinds:
        name = "two-kinds"

        def policy(self, question):
            labels = ("Yes", "No") if question.id == "a" else ("True", "False")
            scores = yield Probe("p", (Message("user", f"known {question.id}?"),), labels)
            return scores.best()

    llm = BatchingLLM(label_rules=[("known", {"Yes": 0.9, "No": 0.1, "True": 0.2, "False": 0.8})])
    traces = run_many(TwoKinds(), [Question(i, i) for i in "abab"], Runtime(llm))
    assert [t.answer for t in traces] == ["Yes", "False", "Yes", "False"]
    assert llm.batches == [("score", 2), ("score", 2)]


def test_a_batch_that_fails_everywhere_fails_each_question_and_records_retryability():
    class DownLLM(BatchingLLM):
        def generate_batch(self, prompts, decodings):
            raise BackendError("server down", retryable=True)

    traces = run_many(Probing(), [Question("a", "a"), Question("b", "b")],
                      Runtime(DownLLM(label_rules=[("known", {"Yes": 1.0})])))
    assert [t.error for t in traces] == ["BackendError: server down"] * 2
    assert all(t.retryable for t in traces)


class PickyLLM(BatchingLLM):
    """A batching back-end that refuses a whole batch holding a prompt about "bad" (as transformers
    does for one prompt too long for the context)."""

    def generate_batch(self, prompts, decodings):
        self.batches.append(("generate", len(prompts)))
        if any("bad" in str(p) for p in prompts):
            raise BackendError("prompt does not fit the context")
        return [generate(self, p, d) for p, d in zip(prompts, decodings)]


def test_one_bad_prompt_in_a_batch_fails_only_its_own_question(notes):
    questions = [Question(f"q{i}", "bad" if i == 5 else f"w{i}") for i in range(8)]

    class OneAsk:
        name = "one-ask"

        def policy(self, question):
            out = yield Ask("answer", (Message("user", f"Say {question.text}"),))
            return out.text

    llm = PickyLLM([("Say", lambda p: re.search(r"Say (\S+)", p).group(1))])
    traces = run_many(OneAsk(), questions, Runtime(llm))
    assert [t.answer for t in traces] == [f"w{i}" if i != 5 else None for i in range(8)]
    assert traces[5].error == "BackendError: prompt does not fit the context" and not traces[5].retryable
    # halves, then halves of the failing half (q4-q7, then q4-q5): the good prompts still go batched
    assert llm.batches == [("generate", 8), ("generate", 4), ("generate", 4), ("generate", 2), ("generate", 1),
                           ("generate", 1), ("generate", 2)]
    # each split said once, not swallowed: a batch that always failed would otherwise run one by one unseen
    said = notes()
    assert said.count("generate_batch of 8 requests failed (BackendError: prompt does not fit the context)") == 1
    assert "generate_batch of 4 requests failed" in said and "generate_batch of 2 requests failed" in said


def test_a_back_end_that_checks_prompts_batches_only_those_that_pass():
    class Checking(PickyLLM):
        def check_prompt(self, prompt):
            if "bad" in str(prompt):
                raise BackendError("prompt of 9000 tokens does not fit the context")

    class Probe2:
        name = "probe2"

        def policy(self, question):
            scores = yield Probe("p", (Message("user", f"known {question.text}?"),))
            out = yield Ask("answer", (Message("user", f"Say {question.text}"),))
            return f"{scores.best()} {out.text}"

    llm = Checking([("Say", lambda p: re.search(r"Say (\S+)", p).group(1))], [("known", {"Yes": 0.9, "No": 0.1})])
    traces = run_many(Probe2(), [Question(i, t) for i, t in (("a", "w1"), ("b", "bad"), ("c", "w3"))], Runtime(llm))
    assert [t.answer for t in traces] == ["Yes w1", None, "Yes w3"]
    assert traces[1].error.startswith("BackendError: prompt of 9000 tokens") and len(traces[1].steps) == 0
    assert llm.batches == [("score", 2), ("generate", 2)]


def test_a_policy_bug_stops_only_its_own_question():
    class Sometimes:
        name = "sometimes"

        def policy(self, question):
            yield Note("start", question.id)
            if question.id == "bad":
                raise ZeroDivisionError("oops")
            yield Note("more", "x")
            return question.id

    traces = run_many(Sometimes(), [Question(i, i) for i in ("a", "bad", "c")], Runtime(ScriptedLLM()))
    assert [t.answer for t in traces] == ["a", None, "c"]
    assert traces[1].error.startswith("ZeroDivisionError: oops (at ") and not traces[1].retryable
    assert [type(s) for s in traces[0].steps][-1] is Answer


def test_without_a_batching_back_end_workers_send_a_round_concurrently():
    barrier = threading.Barrier(4, timeout=10)

    class SlotsLLM:
        """A server with four slots: each request waits until four are in flight at once."""

        identity = "fake-server"

        def chat(self, messages, decoding=Decoding()):
            barrier.wait()  # breaks (and fails the request) unless four requests are in flight together
            return Completion(messages[-1].content.split()[-1], Usage(llm_requests=1))

    class OneAsk:
        name = "one-ask"

        def policy(self, question):
            out = yield Ask("answer", (Message("user", f"Say {question.text}"),))
            return out.text

    questions = [Question(str(i), f"w{i}") for i in range(8)]
    traces = run_many(OneAsk(), questions, Runtime(SlotsLLM(), workers=4))
    assert [t.error for t in traces] == [None] * 8
    assert [t.answer for t in traces] == [f"w{i}" for i in range(8)]


def test_in_turn_without_workers_sends_one_request_at_a_time():
    in_flight, peak = [0], [0]
    lock = threading.Lock()

    class Counting:
        identity = "counting"

        def chat(self, messages, decoding=Decoding()):
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
            time.sleep(0.01)
            with lock:
                in_flight[0] -= 1
            return Completion("x", Usage(llm_requests=1))

    class OneAsk:
        name = "one-ask"

        def policy(self, question):
            yield Ask("answer", (Message("user", question.text),))
            return "done"

    run_many(OneAsk(), [Question(str(i), str(i)) for i in range(4)], Runtime(Counting()))
    assert peak[0] == 1


# ------------------------------------------------------------------------------ sampled rollouts
class SampledLLM(ScriptedLLM):
    """A scripted model with seeded sampling: greedy gives the script's answer; a sampled request
    draws a word from (seed, temperature, top_p, prompt) alone, as a real seeded sampler would."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.decodings: list[Decoding] = []

    def complete(self, prompt, decoding=Decoding()):
        self.decodings.append(decoding)
        if decoding.temperature == 0:
            return super().complete(prompt, decoding)
        draw = random.Random(f"{decoding.seed}|{decoding.temperature}|{decoding.top_p}|{prompt}")
        word = " ".join(draw.choice(WORDS) + str(draw.randrange(1000)) for _ in range(2))
        return Completion(word, Usage(llm_requests=1, completion_tokens=2))


class TwoAsks:
    name = "two-asks"

    def policy(self, question):
        hint = yield Ask("hint", (Message("user", f"Hint for {question.text}"),), Decoding(max_tokens=8, stop=("\n",)))
        out = yield Ask("answer", (Message("user", f"Answer {question.text} using {hint.text}"),),
                        Decoding(max_tokens=16))
        return out.text


def test_sampled_rollouts_differ_by_seed_and_repeat_with_the_same_seed():
    q = Question("q", "Where was Eiffel born?")
    llm = SampledLLM(default="Dijon")
    sampled = Runtime(llm, sampling=Sampling(temperature=0.8, top_p=0.9))
    first = run_many(TwoAsks(), [q] * 4, sampled, seeds=range(4))
    again = run_many(TwoAsks(), [q] * 4, sampled, seeds=range(4))
    assert [t.answer for t in first] == [t.answer for t in again]
    assert len({t.answer for t in first}) == 4
    # every request got a distinct seed; the method's max_tokens and stop were kept
    seeds = [d.seed for d in llm.decodings[:8]]
    assert len(set(seeds)) == 8
    assert {(d.temperature, d.top_p) for d in llm.decodings} == {(0.8, 0.9)}
    assert [d.max_tokens for d in llm.decodings[:8]] == [8] * 4 + [16] * 4
    assert [d.stop for d in llm.decodings[:4]] == [("\n",)] * 4
    # rollout r's n-th request: request_seed(r, n), the same whether run alone or in a group
    assert seeds == [request_seed(r, 0) for r in range(4)] + [request_seed(r, 1) for r in range(4)]
    alone = run(TwoAsks(), q, sampled, seed=2)
    assert alone.answer == first[2].answer
    # the same policy under the method's own decoding: greedy, seed untouched
    llm.decodings.clear()
    greedy = run_many(TwoAsks(), [q] * 2, Runtime(llm))
    assert [t.answer for t in greedy] == ["Dijon", "Dijon"]
    assert {(d.temperature, d.seed) for d in llm.decodings} == {(0.0, 0)}


def test_request_seeds_are_distinct_across_rollouts_and_requests():
    grid = {request_seed(r, n) for r in range(64) for n in range(16)}
    assert len(grid) == 64 * 16
    assert all(0 <= s < 2 ** 31 for s in grid)
    assert request_seed(0, 1) != request_seed(1, 0)


def test_bad_run_settings_fail_before_anything_runs():
    q = Question("q", "x")
    with pytest.raises(ConfigError, match="does not sample"):
        run_many(TwoAsks(), [q], Runtime(ScriptedLLM()), seeds=[1])
    with pytest.raises(ConfigError, match="2 rollout seeds for 1 questions"):
        run_many(TwoAsks(), [q], Runtime(ScriptedLLM(), sampling=Sampling()), seeds=[1, 2])
    with pytest.raises(ConfigError, match="window"):
        run_many(TwoAsks(), [q], Runtime(ScriptedLLM()), window=0)
    with pytest.raises(ConfigError, match="top_p"):
        Sampling(top_p=0)
    with pytest.raises(ConfigError, match="temperature"):
        Sampling(temperature=-1)


def test_the_answer_step_is_reported_and_recorded_once():
    steps = []
    trace = run(TwoAsks(), Question("q", "x"), Runtime(ScriptedLLM(default="y")), on_step=steps.append)
    assert steps == list(trace.steps) and isinstance(steps[-1], Answer)
    assert sum(isinstance(s, Generate) for s in steps) == 2


def test_sampled_rollouts_through_a_batching_transformers_model():
    """G rollouts of one question as one padded batch per round on a tiny random Qwen2: they differ
    by seed and repeat exactly with the same seeds; greedy ignores the seeds."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_hf import tiny_llm

    llm = tiny_llm()
    sizes: list[int] = []
    batch = llm.generate_batch

    def recording(prompts, decodings):
        sizes.append(len(prompts))
        return batch(prompts, decodings)

    llm.generate_batch = recording
    q = Question("q", "Who built the tower?")
    sampled = Runtime(llm, sampling=Sampling(temperature=1.0, top_p=0.95))
    first = run_many(TwoAsks(), [q] * 4, sampled, seeds=range(4))
    again = run_many(TwoAsks(), [q] * 4, sampled, seeds=range(4))
    assert sizes == [4, 4, 4, 4]  # two Asks per rollout, each round one batch of the four rollouts
    assert [t.error for t in first] == [None] * 4
    assert [t.answer for t in first] == [t.answer for t in again]
    assert len({t.answer for t in first}) == 4
    greedy = run_many(TwoAsks(), [q] * 2, Runtime(llm))
    assert greedy[0].answer == greedy[1].answer


@pytest.mark.embedded
def test_run_many_matches_run_on_the_embedded_model(sample20):
    """One real-model check: llama.cpp (in turn) gives the same greedy traces through both loops."""
    pytest.importorskip("llama_cpp")
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

    questions, retriever = sample20
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-0.5b-instruct", n_ctx=4096))
    method = build_method("standard-rag")
    one_by_one = [run(method, q, Runtime(llm, retriever)) for q in questions[:3]]
    together = run_many(method, questions[:3], Runtime(llm, retriever))
    assert [t.error for t in together] == [None] * 3

    def comparable(trace):  # latency and KV-cache reuse depend on what ran before, not on the answer
        plain = without_latency(trace)
        for step in plain["steps"]:
            step["usage"]["cached_tokens"] = 0
        return plain

    assert [comparable(t) for t in together] == [comparable(t) for t in one_by_one]


# ------------------------------------------------------------------------------ the harness
def test_eval_with_batch_writes_what_one_at_a_time_writes(tmp_path):
    from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate

    def results(batch, llm):
        cfg = EvalConfig(method="standard-rag", dataset=DatasetSpec(preset="demo", limit=6), batch=batch,
                         runs_dir=str(tmp_path / f"runs-{batch}"))
        store, out = evaluate(cfg, progress=False, llm=llm)
        lines = (store.path / "results.jsonl").read_text().splitlines()
        return store, [(r.question_id, r.prediction, r.scores) for r in out], lines

    single_store, single, _ = results(1, standard_llm())
    llm = BatchingLLM([("Passages:", lambda prompt: f" {pick(prompt)}\n")])
    batched_store, batched, lines = results(4, llm)
    assert batched == single and len(lines) == 6
    assert llm.batches == [("generate", 4), ("generate", 2)]
    assert batched_store.path.name == single_store.path.name  # how a run is batched is not in its id


def test_a_batched_eval_stops_after_consecutive_retryable_failures(tmp_path):
    from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate

    class Down(BatchingLLM):
        def generate_batch(self, prompts, decodings):
            raise BackendError("server down", retryable=True)

    cfg = EvalConfig(method="standard-rag", dataset=DatasetSpec(preset="demo", limit=8), batch=5,
                     runs_dir=str(tmp_path / "runs"), max_consecutive_failures=3)
    with pytest.raises(BackendError, match="stopped after 3 consecutive.*5 questions not tried"):
        evaluate(cfg, progress=False, llm=Down())
    with pytest.raises(ConfigError, match="--batch"):
        evaluate(EvalConfig(method="standard-rag", dataset=DatasetSpec(preset="demo"), batch=0,
                            runs_dir=str(tmp_path / "runs")), progress=False, llm=Down())
