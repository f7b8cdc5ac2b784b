"""Prompt-lookup drafts of the llama.cpp back-end (`llama_cpp.prompt_lookup`): which tokens are
proposed, from where, and when none are. The real model's outputs with and without drafts are
compared in test_embedded.py. Also the aligned batches of `prefix_chunk`."""
from metarag.llm.llama_cpp import aligned_floor, aligned_spans, prompt_lookup


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


def test_prefix_chunk_spans_end_at_multiples_of_the_chunk():
    assert aligned_spans(0, 70, 32) == [(0, 32), (32, 64), (64, 70)]
    assert aligned_spans(40, 100, 32) == [(40, 64), (64, 96), (96, 100)]
    assert aligned_spans(5, 5, 32) == [] and aligned_spans(7, 900, 0) == [(7, 900)]
    assert (aligned_floor(95, 32), aligned_floor(96, 32), aligned_floor(95, 0)) == (64, 96, 95)


def test_a_prefix_chunk_outside_the_batch_is_refused():
    import pytest

    from metarag.errors import ConfigError
    from metarag.llm.llama_cpp import LlamaCppSettings

    for bad in (-1, 513):
        with pytest.raises(ConfigError, match="prefix_chunk"):
            LlamaCppSettings(prefix_chunk=bad)
    assert LlamaCppSettings(prefix_chunk=512).prefix_chunk == 512
