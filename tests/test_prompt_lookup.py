"""Prompt-lookup drafts of the llama.cpp back-end (`llama_cpp.prompt_lookup`): which tokens are
proposed, from where, and when none are. The real model's outputs with and without drafts are
compared in test_embedded.py."""
from metarag.llm.llama_cpp import prompt_lookup


def test_the_tokens_after_the_latest_earlier_occurrence_of_the_last_ngram():
    ids = [5, 1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 0, 1, 2, 3]
    assert prompt_lookup(ids, k=3, ngram=3, room=10) == [7, 8, 0]  # the later of the two "1 2 3"
    assert prompt_lookup(ids, k=10, ngram=3, room=2) == [7, 8]  # no more than the budget leaves


def test_shorter_ngrams_down_to_the_minimum_then_nothing():
    ids = [4, 6, 7, 1, 6, 7]  # "1 6 7" never occurred before, "6 7" did
    assert prompt_lookup(ids, k=2, ngram=3, room=5) == [1, 6]
    assert prompt_lookup([4, 6, 8, 1, 2, 6], k=2, ngram=3, room=5, min_ngram=2) == []
    assert prompt_lookup([4, 6, 8, 1, 2, 6], k=2, ngram=3, room=5, min_ngram=1) == [8, 1]
    assert prompt_lookup([1, 2, 3], k=2, ngram=2, room=5) == []
    assert prompt_lookup([1], k=2, ngram=2, room=5) == [] and prompt_lookup([1, 1], k=0, ngram=1, room=5) == []
