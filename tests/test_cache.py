"""The persistent response cache: a repeated request is served from sqlite, and keys separate
everything that can change an answer."""

import pytest

from metarag.llm.base import Decoding
from metarag.llm.cache import CachedLLM, ResponseCache
from metarag.llm.scripted import ScriptedLLM
from metarag.records import Message


def test_second_identical_call_is_served_from_cache(tmp_path):
    inner = ScriptedLLM([("capital", ["Paris", "WRONG"])])
    llm = CachedLLM(inner, ResponseCache(tmp_path / "c.sqlite"))
    msgs = (Message("user", "The capital of France?"),)
    first = llm.chat(msgs, Decoding(max_tokens=8))
    second = llm.chat(msgs, Decoding(max_tokens=8))
    assert first.text == second.text == "Paris"
    assert len(inner.prompts) == 1  # the model was asked once
    assert first.usage.cache_hits == 0 and second.usage.cache_hits == 1
    assert second.usage.prompt_tokens == first.usage.prompt_tokens


def test_different_decoding_or_prompt_misses(tmp_path):
    inner = ScriptedLLM([("capital", ["Paris", "Lyon", "Nice"])])
    llm = CachedLLM(inner, ResponseCache(tmp_path / "c.sqlite"))
    msgs = (Message("user", "The capital of France?"),)
    llm.chat(msgs, Decoding(max_tokens=8))
    assert llm.chat(msgs, Decoding(max_tokens=9)).text == "Lyon"
    assert llm.complete("The capital of France?", Decoding(max_tokens=8)).text == "Nice"


def test_cache_persists_across_processes_and_covers_label_scores(tmp_path):
    path = tmp_path / "c.sqlite"
    inner = ScriptedLLM(label_rules=[("true", {"Yes": 0.9, "No": 0.05})])
    CachedLLM(inner, ResponseCache(path)).score_labels("Is it true?", ["Yes", "No"])
    fresh = ScriptedLLM()  # has no rules: would raise if asked
    scores = CachedLLM(fresh, ResponseCache(path)).score_labels("Is it true?", ["Yes", "No"])
    assert scores.probs == (0.9, 0.05) and scores.usage.cache_hits == 1


# ------------------------------------------------------------------- honest keys (sampling, weights)
def cached(tmp_path, inner):
    return CachedLLM(inner, ResponseCache(tmp_path / "c.sqlite"))


def test_a_sampled_request_is_served_to_its_own_seed_only(tmp_path):
    inner = ScriptedLLM([("capital", ["Paris", "Lyon", "Nice", "Lille"])])
    llm = cached(tmp_path, inner)
    msgs = (Message("user", "The capital of France?"),)
    seed_1 = llm.chat(msgs, Decoding(temperature=0.7, seed=1))
    assert llm.chat(msgs, Decoding(temperature=0.7, seed=2)).text == "Lyon"  # another seed: asked anew
    again = llm.chat(msgs, Decoding(temperature=0.7, seed=1))
    assert again.text == seed_1.text == "Paris" and again.usage.cache_hits == 1
    assert llm.chat(msgs, Decoding(temperature=0.7, seed=1, top_p=0.9)).text == "Nice"
    assert len(inner.prompts) == 3


def test_another_checkpoint_is_never_served_the_old_answers(tmp_path):
    path = tmp_path / "c.sqlite"
    msgs = (Message("user", "The capital of France?"),)
    before = ScriptedLLM([("capital", "Paris")], name="policy")
    before.identity = "hf:policy:weights=aaaa"
    CachedLLM(before, ResponseCache(path)).chat(msgs)
    trained = ScriptedLLM([("capital", "Lyon")], name="policy")
    trained.identity = "hf:policy:weights=bbbb"
    assert CachedLLM(trained, ResponseCache(path)).chat(msgs).text == "Lyon"
    # a live model whose weights change under the same wrapper: the identity is read per request
    live = ScriptedLLM([("capital", ["Paris", "Berlin"])])
    llm = cached(tmp_path, live)
    live.identity = "hf:live:step=0"
    llm.chat(msgs)
    live.identity = "hf:live:step=1"
    assert llm.chat(msgs).text == "Berlin" and llm.identity == "hf:live:step=1"


def test_every_decoding_field_is_in_the_key_and_old_keys_still_match():
    import dataclasses
    import hashlib
    import json

    from metarag.llm.cache import decoding_settings, request_key

    msgs = (Message("user", "q"),)
    base = request_key("m", "chat", msgs, decoding_settings(Decoding(max_tokens=8)))
    # the key the cache wrote before Decoding grew top_p and the token flags: cached answers stay found
    legacy = {"model": "m", "op": "chat", "prompt": [{"role": "user", "content": "q"}],
              "settings": {"max_tokens": 8, "stop": [], "temperature": 0.0, "seed": 0, "logprobs": 0}}
    assert base == hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()
    other = {bool: True, int: 7, float: 0.5, tuple: ("\n",)}
    for f in dataclasses.fields(Decoding):
        value = other[type(getattr(Decoding(), f.name))]
        changed = dataclasses.replace(Decoding(max_tokens=8), **{f.name: value})
        assert request_key("m", "chat", msgs, decoding_settings(changed)) != base, f.name


def test_requests_for_live_tensors_are_not_cached(tmp_path):
    inner = ScriptedLLM([("capital", ["Paris", "Lyon"])])
    llm = cached(tmp_path, inner)
    llm.complete("The capital?", Decoding(hidden_states=True))
    assert llm.complete("The capital?", Decoding(hidden_states=True)).text == "Lyon"
    assert len(llm.cache) == 0


# ------------------------------------------------------------------------------ batches and runs
class Batching(ScriptedLLM):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    def generate_batch(self, prompts, decodings):
        from metarag.llm.base import generate

        self.batches.append(len(prompts))
        return [generate(self, p, d) for p, d in zip(prompts, decodings)]


class TwoSampled:
    name = "two-sampled"

    def policy(self, question):
        from metarag.policy.actions import Ask

        out = yield Ask("answer", (Message("user", f"Say {question.text}"),))
        return out.text


def test_a_batch_goes_through_the_cache_and_only_its_misses_reach_the_model(tmp_path):
    from metarag.methods.runner import Runtime, Sampling, run_many
    from metarag.records import Question

    inner = Batching([("Say", lambda p: p.split("Say ")[1].split()[0])])
    llm = cached(tmp_path, inner)
    questions = [Question(str(i), f"w{i}") for i in range(6)]
    first = run_many(TwoSampled(), questions[:4], Runtime(llm))
    both = run_many(TwoSampled(), questions, Runtime(llm))
    assert inner.batches == [4, 2]  # the second run asked the model for the two new questions only
    assert [t.answer for t in both] == [f"w{i}" for i in range(6)]
    assert [t.usage.cache_hits for t in both] == [1, 1, 1, 1, 0, 0]
    assert [t.answer for t in first] == [t.answer for t in both[:4]]
    # sampled rollouts of one question: each seed is its own entry, a repeated seed is served
    inner.batches.clear()
    sampled = Runtime(llm, sampling=Sampling(temperature=0.9))
    run_many(TwoSampled(), [questions[0]] * 3, sampled, seeds=[0, 1, 2])
    run_many(TwoSampled(), [questions[0]] * 3, sampled, seeds=[2, 3, 0])
    assert inner.batches == [3, 1]
    assert not hasattr(llm, "generate_batch")  # nothing can reach the inner batch past the cache


def test_no_response_cache_flag_switches_the_cache_off_for_the_run():
    from metarag.cli import build_parser, llm_spec_from_args

    parser = build_parser()
    for flag in ("--no-response-cache", "--no-cache"):
        args = parser.parse_args(["ask", "What?", flag])
        assert llm_spec_from_args(args).response_cache is False
    assert llm_spec_from_args(parser.parse_args(["ask", "What?"])).response_cache is True


def test_answers_stored_before_the_token_level_protocol_are_not_served_where_it_changed(tmp_path):
    """A first-token label probability is not a whole-label one, and old per-token data has no ids:
    such stored answers are keyed apart; a plain greedy answer's key is unchanged."""
    import hashlib
    import json

    from metarag.records import LabelScores, to_plain

    def legacy_key(op, prompt, settings):
        payload = {"model": "scripted:scripted", "op": op, "prompt": prompt, "settings": settings}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    raw = [{"role": "raw", "content": "Is it true?"}]
    store = ResponseCache(tmp_path / "c.sqlite")
    store.put(legacy_key("score_labels", raw, {"labels": ["Yes", "No"]}),
              to_plain(LabelScores(("Yes", "No"), (0.5, 0.5))))
    old = {"max_tokens": 4, "stop": [], "temperature": 0.0, "seed": 0, "logprobs": 0}
    store.put(legacy_key("complete", raw, old), {"text": "stored"})
    store.put(legacy_key("complete", raw, {**old, "logprobs": 2}), {"text": "stored", "logprobs": []})
    inner = ScriptedLLM([("true", "fresh")], [("true", {"Yes": 0.9, "No": 0.1})])
    llm = CachedLLM(inner, store)
    assert llm.score_labels("Is it true?", ["Yes", "No"]).probs == (0.9, 0.1)
    assert llm.complete("Is it true?", Decoding(max_tokens=4)).text == "stored"
    assert llm.complete("Is it true?", Decoding(max_tokens=4, logprobs=2)).text == "fresh"


def test_n_ctx_flag_sets_the_window_of_the_run_and_of_training(capsys, tmp_path):
    from metarag.cli import build_parser, llm_spec_from_args, main
    from metarag.llm.registry import backend_settings

    parser = build_parser()
    assert llm_spec_from_args(parser.parse_args(["ask", "What?"])).n_ctx == 4096
    eval_args = ["eval", "--method", "metarag", "--dataset", "demo"]
    spec = llm_spec_from_args(parser.parse_args([*eval_args, "--n-ctx", "8192"]))
    assert spec.n_ctx == 8192 and backend_settings(spec).n_ctx == 8192
    assert backend_settings(spec).prefix_chunk == 0
    exact = llm_spec_from_args(parser.parse_args([*eval_args, "--prefix-chunk", "32"]))
    assert backend_settings(exact).prefix_chunk == 32
    with pytest.raises(SystemExit):
        parser.parse_args(["ask", "What?", "--n-ctx", "0"])
    assert main(["train-agent", "--out", str(tmp_path), "--dataset", "demo", "--dry-run", "--n-ctx", "2048"]) == 0
    assert "context 2048" in capsys.readouterr().out
    assert main(["train-agent", "--out", str(tmp_path), "--dataset", "demo", "--dry-run", "--n-ctx", "2048",
                 "--set", "n_ctx=1024"]) == 1
    assert "--n-ctx 2048 and --set n_ctx=1024 disagree" in capsys.readouterr().err
