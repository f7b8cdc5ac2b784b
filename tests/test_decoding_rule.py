"""The shared sampling rule's top-k and repetition penalty (vLLM's parameters, which Search-o1 samples
with), how the back-ends pass them on, and how a method that samples on its own is seeded by the run's
seed (issue 52)."""
from __future__ import annotations

import numpy as np
import pytest

from metarag.errors import ConfigError
from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate, sample_seed
from metarag.llm.base import Decoding, penalized, sample_token
from metarag.llm.cache import decoding_settings
from metarag.llm.openai_compat import OpenAICompatLLM
from metarag.llm.vllm import sampling_request
from metarag.methods.runner import Runtime, question_seed, request_seed, run
from metarag.policy.actions import Ask
from metarag.records import Completion, Message, Question, Usage

LOGITS = np.array([2.0, 1.0, 0.5, -1.0, -3.0])


def draws(decoding: Decoding, n: int = 2000, history=()) -> set[int]:
    rng = np.random.default_rng(0)
    return {sample_token(LOGITS, decoding, rng, history) for _ in range(n)}


def test_top_k_keeps_the_k_best_tokens_and_ties_at_the_cut():
    assert draws(Decoding(temperature=5.0)) == {0, 1, 2, 3, 4}  # a hot distribution reaches every token
    assert draws(Decoding(temperature=5.0, top_k=2)) == {0, 1}
    assert draws(Decoding(temperature=5.0, top_k=1)) == {0}
    tied = np.array([1.0, 1.0, 1.0, 0.0])
    rng = np.random.default_rng(0)
    assert {sample_token(tied, Decoding(temperature=1.0, top_k=2), rng) for _ in range(500)} == {0, 1, 2}  # as vLLM
    # top-k first, then top-p over what is left: of the top 3 (p 0.63, 0.23, 0.14 at T 1) top-p 0.8 keeps 2
    assert draws(Decoding(temperature=1.0, top_k=3, top_p=0.8)) == {0, 1}


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    out = penalized(LOGITS, [0, 3, 3], 2.0)
    assert out.tolist() == [1.0, 1.0, 0.5, -2.0, -3.0]  # token 0: 2/2; token 3: -1*2; the others as they were
    # greedy with the penalty: the seen best token loses to the next when the penalty is large enough
    assert sample_token(LOGITS, Decoding(), np.random.default_rng(0), [0]) == 0
    assert sample_token(LOGITS, Decoding(repetition_penalty=3.0), np.random.default_rng(0), [0]) == 1
    assert sample_token(LOGITS, Decoding(repetition_penalty=3.0), np.random.default_rng(0), ()) == 0  # nothing seen
    with pytest.raises(ConfigError, match="repetition_penalty"):
        Decoding(repetition_penalty=0)
    with pytest.raises(ConfigError, match="top_k"):
        Decoding(top_k=-1)


def test_the_back_ends_pass_them_on_and_the_cache_keys_them_only_when_set():
    assert "top_k" not in decoding_settings(Decoding()) and "repetition_penalty" not in decoding_settings(Decoding())
    set_ = decoding_settings(Decoding(temperature=0.7, top_k=20, repetition_penalty=1.05))
    assert (set_["top_k"], set_["repetition_penalty"]) == (20, 1.05)
    request = sampling_request(Decoding(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05), 64)
    assert (request["top_k"], request["repetition_penalty"], request["top_p"]) == (20, 1.05, 0.8)
    plain = sampling_request(Decoding(), 64)
    assert "top_k" not in plain and "repetition_penalty" not in plain
    sent = OpenAICompatLLM._sampling(Decoding(top_p=0.8, top_k=20, repetition_penalty=1.05))
    assert sent == {"top_p": 0.8, "extra_body": {"top_k": 20, "repetition_penalty": 1.05, "repeat_penalty": 1.05}}
    assert OpenAICompatLLM._sampling(Decoding()) == {}


# ------------------------------------------------------------------- a method that samples on its own
class Recording:
    identity = "recording"

    def __init__(self, reply: str = "Paris"):
        self.reply, self.decodings = reply, []

    def chat(self, messages, decoding=Decoding()):
        self.decodings.append(decoding)
        return Completion(self.reply, Usage(llm_requests=1), finish_reason="eos")

    complete = chat


class SamplesTwice:
    name = "samples-twice"

    def policy(self, question):
        yield Ask("a", (Message("user", question.text),), Decoding(temperature=0.7, top_k=20))
        out = yield Ask("b", (Message("user", question.text),), Decoding())  # greedy: its seed left alone
        return out.text


def test_a_methods_own_sampled_requests_are_seeded_by_the_run_seed_and_the_question():
    llm = Recording()
    run(SamplesTwice(), Question("q1", "Capital?"), Runtime(llm, seed=3))
    sampled, greedy = llm.decodings
    assert sampled.seed == request_seed(question_seed(3, "q1"), 0) and greedy.seed == 0
    assert (sampled.temperature, sampled.top_k) == (0.7, 20)  # the method's own sampling kept
    # the question's seed is the harness's sample-0 seed of the question
    assert question_seed(3, "q1") == sample_seed(3, "q1", 0)
    run(SamplesTwice(), Question("q2", "Capital?"), Runtime(llm, seed=3))
    run(SamplesTwice(), Question("q1", "Capital?"), Runtime(llm, seed=4))
    assert len({d.seed for d in llm.decodings[::2]}) == 3  # other question, other run seed: other seeds


def test_eval_seeds_search_o1_by_the_run_seed_so_a_run_repeats_and_another_seed_differs(tmp_path):
    from test_harness import write_hotpot

    data = write_hotpot(tmp_path / "hotpot.json")
    seeds = {}
    for seed in (0, 5):
        llm = Recording(reply="So it is \\boxed{Paris}.")
        config = EvalConfig(method="search-o1", dataset=DatasetSpec(file=str(data), seed=seed),
                            runs_dir=str(tmp_path / "runs"))
        store, results = evaluate(config, progress=False, llm=llm)
        assert [r.prediction for r in results] == ["Paris"] * len(results)
        ids = [r.question_id for r in results]
        seeds[seed] = [d.seed for d in llm.decodings]
        assert seeds[seed] == [request_seed(question_seed(seed, q), 0) for q in ids]
        assert {(d.temperature, d.top_p, d.top_k) for d in llm.decodings} == {(0.7, 0.8, 20)}
    assert len(set(seeds[0]) | set(seeds[5])) == 2 * len(seeds[0])
