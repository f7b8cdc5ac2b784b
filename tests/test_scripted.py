"""The scripted fake LLM follows the token-level protocol: scripted per-token probabilities,
deterministic ids and offsets, the shared stop rule, continuation, token-id prompts and
teacher-forced label scoring from its script; plus the records and spec strings around it."""
import json
import math

import pytest

from metarag.errors import ConfigError
from metarag.llm.base import Decoding, TokenIds, label_plan, label_variants, sample_token
from metarag.llm.scripted import ALTERNATIVE, ScriptedLLM, ScriptedTokens, split_words, token_id
from metarag.methods.runner import Runtime, run
from metarag.policy.actions import Ask, Probe
from metarag.records import Completion, Generate, LabelScores, Message, Question, Score, TokenLogprob, Trace


def test_a_scripted_low_probability_token_is_reported_with_its_alternatives():
    llm = ScriptedLLM([("capital", ScriptedTokens.of("The", " capital", " is", (" Lyon", -3.0), "."))])
    out = llm.complete("The capital of France?", Decoding(logprobs=2))
    assert out.text == "The capital is Lyon." and out.finish_reason == "eos"
    low = [t for t in out.tokens if t.logprob < math.log(0.5)]
    assert [t.token for t in low] == [" Lyon"] and low[0].offset == len("The capital is")
    assert low[0].top[0] == (ALTERNATIVE, pytest.approx(math.log1p(-math.exp(-3.0))))
    assert low[0].entropy == pytest.approx(-(math.exp(-3) * -3 + (1 - math.exp(-3)) * math.log(1 - math.exp(-3))))


def test_token_ids_and_offsets_are_deterministic_words():
    llm = ScriptedLLM(default="Gustave Eiffel was born  in Dijon.\n")
    out = llm.complete("Who? Where?", Decoding())
    assert [t.token for t in out.tokens] == ["Gustave ", "Eiffel ", "was ", "born  ", "in ", "Dijon.\n"]
    assert [t.offset for t in out.tokens] == [0, 8, 15, 19, 25, 28]
    assert out.token_ids == tuple(token_id(t.token) for t in out.tokens)
    assert out.prompt_ids == (token_id("Who? "), token_id("Where?"))
    assert out.usage.prompt_tokens == 2 and out.usage.completion_tokens == 6
    again = ScriptedLLM(default="Gustave Eiffel was born  in Dijon.\n").complete("Who? Where?")
    assert again.token_ids == out.token_ids
    assert split_words("  a b ") == ["  a ", "b "] and split_words(" ") == [" "] and split_words("") == []


def test_stop_rule_cuts_before_the_stop_and_counts_the_crossing_token():
    llm = ScriptedLLM(default="I will search. <search>Eiffel birthplace</search> and then more")
    out = llm.complete("q", Decoding(stop=("</search>",), logprobs=1))
    assert out.text == "I will search. <search>Eiffel birthplace"
    assert out.finish_reason == "stop" and out.stop == "</search>"
    assert out.tokens[-1].token == "birthplace</search> " and out.usage.completion_tokens == 5
    # the earliest stop wins, whatever the order of the stop strings
    early = llm.complete("q", Decoding(stop=("</search>", "search")))
    assert early.text == "I will " and early.stop == "search"
    cut = llm.complete("q", Decoding(max_tokens=3))
    assert cut.text == "I will search. " and cut.finish_reason == "length" and cut.usage.completion_tokens == 3


def test_an_assistant_prefix_is_continued():
    llm = ScriptedLLM([("<assistant>\nThe answer is$", " Dijon.")])
    msgs = (Message("user", "Where was Eiffel born?"), Message("assistant", "The answer is"))
    assert llm.render(msgs) == "<user>\nWhere was Eiffel born?\n<assistant>\nThe answer is"
    assert llm.render(msgs[:1]) == "<user>\nWhere was Eiffel born?\n<assistant>\n"
    assert llm.chat(msgs).text == " Dijon."


def test_a_token_id_prompt_is_detokenized_and_unknown_ids_are_refused():
    llm = ScriptedLLM([("born", "Dijon")])
    ids = tuple(llm.tokenize("Where was Eiffel born?"))
    out = llm.complete(TokenIds(ids))
    assert out.text == "Dijon" and out.prompt_ids == ids and llm.prompts[-1] == "Where was Eiffel born?"
    with pytest.raises(ConfigError, match="token id 7 was never produced"):
        llm.complete(TokenIds((7,)))
    with pytest.raises(ConfigError, match="at least one token"):
        TokenIds(())


def test_labels_are_scored_from_the_script_when_no_label_rule_matches():
    llm = ScriptedLLM([("true", ScriptedTokens.of(("Yes", -0.2), (",", -0.5), " it", " is")),
                       ("false", "no")],
                      label_rules=[("forced", {"Yes": 0.3, "No": 0.6})])
    one = llm.score_labels("Is it true?", ["Yes,", "No"])
    assert one.probs == pytest.approx((math.exp(-0.7), 0.0))
    lower = llm.score_labels("Is it false?", ["Yes", "No"])  # 'no' is a case variant of 'No'
    assert lower.probs == pytest.approx((0.0, math.exp(-0.01)))
    assert llm.score_labels("forced: true?", ["Yes", "No"]).probs == (0.3, 0.6)
    assert len(llm.prompts) == 3 and llm.rules[0].calls == 0  # scoring does not use up a response


def test_the_label_rule_variants_collisions_and_the_one_no_mass_rule():
    assert label_variants("yes") == ("yes", "Yes", "YES", " yes", " Yes", " YES")
    chars = lambda v: [ord(c) for c in v]  # noqa: E731
    assert len(label_plan(["Yes", "No"], chars)[0]) == 6
    with pytest.raises(ConfigError, match="'Yes' and 'Yes sir' collide"):
        label_plan(["Yes", "Yes sir"], chars)
    with pytest.raises(ConfigError, match="distinct"):
        label_plan(["Yes", "Yes"], chars)
    with pytest.raises(ConfigError, match="empty"):
        label_plan(["Yes", " "], chars)
    assert LabelScores(("Yes", "No"), (0.3, 0.1)).p("Yes") == (pytest.approx(0.75), None)
    p, fallback = LabelScores(("Yes", "No"), (0.0, 0.00005)).p("Yes")
    assert p == 0.5 and "no probability mass on the labels Yes/No" in fallback


def test_sampling_rule_top_p_keeps_the_nucleus_and_seeds_repeat():
    import numpy as np

    logits = np.array([2.0, 1.0, 0.5, -1.0])
    draws = {sample_token(logits, Decoding(temperature=1.0, seed=s), np.random.default_rng(s)) for s in range(400)}
    assert draws == {0, 1, 2, 3}
    nucleus = {sample_token(logits, Decoding(temperature=1.0, top_p=0.5), np.random.default_rng(s)) for s in range(50)}
    assert nucleus == {0}  # p(0) = 0.61 already reaches top_p
    wider = {sample_token(logits, Decoding(temperature=1.0, top_p=0.7), np.random.default_rng(s)) for s in range(200)}
    assert wider == {0, 1}  # 0.61 + 0.22 reaches 0.7
    assert sample_token(logits, Decoding(), np.random.default_rng(0)) == 0
    with pytest.raises(ConfigError, match="top_p"):
        Decoding(top_p=0.0)
    with pytest.raises(ConfigError, match="tuple of strings"):
        Decoding(stop="\n")


def test_traces_keep_per_token_data_only_when_asked_and_token_id_prompts_by_their_ids():
    llm = ScriptedLLM(default="Dijon", label_rules=[(".", {"Yes": 0.9, "No": 0.1})])
    ids = tuple(llm.tokenize("Where was he born?"))

    class Method:
        name = "m"

        def policy(self, question):
            yield Ask("plain", (Message("user", "q"),))
            yield Ask("tokens", (Message("user", "q"),), Decoding(keep_tokens=True))
            yield Ask("by-ids", TokenIds(ids), Decoding(logprobs=1))
            yield Probe("probe", TokenIds(ids))
            return "Dijon"

    trace = run(Method(), Question("q1", "?"), Runtime(llm))
    plain, kept, by_ids = trace.of_kind(Generate)
    assert plain.logprobs is None and kept.logprobs[0].id == token_id("Dijon")
    assert by_ids.prompt == () and by_ids.prompt_ids == ids and by_ids.logprobs[0].top
    assert trace.of_kind(Score)[0].prompt_ids == ids
    assert Trace.from_json(trace.to_json()) == trace
    assert "prompt_ids" not in json.loads(trace.to_json())["steps"][0]  # absent when unused: old traces unchanged


def test_old_records_load_old_token_fields():
    old_step = {"kind": "generate", "usage": {"prompt_tokens": 1}, "purpose": "answer", "prompt": [],
                "text": "Paris", "logprobs": [{"token": "Paris", "logprob": -0.1, "top": [["Paris", -0.1]]}]}
    trace = Trace.from_json(json.dumps({"question_id": "q", "question": "?", "method": "m", "steps": [old_step]}))
    token = trace.steps[0].logprobs[0]
    assert token == TokenLogprob("Paris", -0.1, (("Paris", -0.1),)) and token.id is None and token.offset == 0
    from metarag.records import from_plain

    cached = from_plain(Completion, {"text": "Paris", "usage": {}, "logprobs": [{"token": "Paris", "logprob": -0.1}],
                                     "finish_reason": "stop"})
    assert cached.tokens == (TokenLogprob("Paris", -0.1),) and cached.logprobs == cached.tokens
