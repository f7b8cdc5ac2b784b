"""The persistent response cache: a repeated request is served from sqlite, and keys separate
everything that can change an answer."""
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
