"""Answer and retrieval metrics against a hand-computed table, and the short-answer extraction rule."""
from __future__ import annotations

import pytest

from metarag.metrics import (
    AnswerScores,
    accuracy,
    exact_match,
    normalize_answer,
    score_answer,
    support_recall,
    token_f1,
    token_precision,
    token_recall,
)
from metarag.parsing import extract_short_answer

# (prediction, golds, em, f1, precision, recall, acc), worked out by hand from the SQuAD / HotpotQA
# rules: normalize (lower, drop ASCII punctuation, drop a/an/the, collapse spaces), count common
# tokens, P = common / |pred|, R = common / |gold|, F1 = 2PR / (P + R), each maximized over aliases.
TABLE = [
    # exact, case, punctuation, articles, whitespace
    ("Paris", ["Paris"], 1, 1, 1, 1, 1),
    ("paris.", ["Paris"], 1, 1, 1, 1, 1),
    ("The Eiffel Tower", ["Eiffel Tower"], 1, 1, 1, 1, 1),
    ("An apple a day", ["apple day"], 1, 1, 1, 1, 1),
    ("The Theatre", ["theatre"], 1, 1, 1, 1, 1),              # "the" only as a whole word
    ("U.S.A.", ["USA"], 1, 1, 1, 1, 1),
    ("rock-n-roll", ["rocknroll"], 1, 1, 1, 1, 1),             # punctuation dropped, no space added
    ("  New\tYork \n", ["new york"], 1, 1, 1, 1, 1),
    # empty predictions: no answer scores 0 everywhere
    ("", ["Paris"], 0, 0, 0, 0, 0),
    ("   ", ["Paris"], 0, 0, 0, 0, 0),
    ("The.", ["the"], 0, 0, 0, 0, 0),                          # normalizes to nothing
    # numbers and partial overlap
    ("in 1990", ["1990"], 0, 2 / 3, 1 / 2, 1, 1),             # common 1; P 1/2, R 1/1
    ("1990", ["in 1990"], 0, 2 / 3, 1, 1 / 2, 0),             # common 1; P 1/1, R 1/2
    ("1990s", ["1990"], 0, 0, 0, 0, 0),                        # different tokens, no containment
    ("born in 1990", ["1"], 0, 0, 0, 0, 0),                    # "1" is not a token of the prediction
    ("Barack Obama", ["Obama"], 0, 2 / 3, 1 / 2, 1, 1),
    ("He was born in Paris France", ["Paris"], 0, 2 / 7, 1 / 6, 1, 1),  # F1 = 2(1/6)/(7/6)
    ("the the cat cat", ["cat"], 0, 2 / 3, 1 / 2, 1, 1),      # "cat cat" vs "cat": common min(2, 1)
    # yes / no: no partial token credit when they differ
    ("yes", ["no"], 0, 0, 0, 0, 0),
    ("yes", ["yes"], 1, 1, 1, 1, 1),
    ("Yes.", ["yes"], 1, 1, 1, 1, 1),
    ("yes it is", ["yes"], 0, 0, 0, 0, 1),                     # gold is "yes", pred differs -> F1 0
    ("no", ["no way"], 0, 0, 0, 0, 0),                         # pred is "no", gold differs -> F1 0
    # aliases: each of F1, P, R is its own maximum over the aliases
    ("NYC", ["New York City", "NYC"], 1, 1, 1, 1, 1),
    # alias 1 "red": P 1/3, R 1, F1 1/2; alias 2 (6 tokens): P 3/3, R 3/6, F1 2/3
    ("red blue green", ["red", "red blue green yellow purple orange"], 0, 2 / 3, 1, 1, 1),
    ("Paris", ["The", "Paris"], 1, 1, 1, 1, 1),                # an alias empty after normalizing
    # unicode: lowercased, but accents not folded and non-ASCII punctuation kept (as SQuAD does)
    ("Zürich!", ["zürich"], 1, 1, 1, 1, 1),
    ("Beyoncé", ["Beyonce"], 0, 0, 0, 0, 0),
    ("“Paris”", ["Paris"], 0, 0, 0, 0, 0),
    ("São Paulo, Brazil", ["são paulo"], 0, 0.8, 2 / 3, 1, 1),  # P 2/3, R 2/2, F1 = (4/3)/(5/3)
]


@pytest.mark.parametrize(("prediction", "golds", "em", "f1", "precision", "recall", "acc"), TABLE)
def test_answer_metrics_match_hand_computed_table(prediction, golds, em, f1, precision, recall, acc):
    assert exact_match(prediction, golds) == em
    assert token_f1(prediction, golds) == pytest.approx(f1)
    assert token_precision(prediction, golds) == pytest.approx(precision)
    assert token_recall(prediction, golds) == pytest.approx(recall)
    assert accuracy(prediction, golds) == acc
    scores = score_answer(prediction, golds)
    assert scores == AnswerScores(em=em, f1=pytest.approx(f1), precision=pytest.approx(precision),
                                  recall=pytest.approx(recall), acc=acc)


@pytest.mark.parametrize(("raw", "normalized"), [
    ("The  Quick, brown FOX!", "quick brown fox"),
    ("a", ""),
    ("banana", "banana"),              # "an" inside a word is kept
    ("Theresa May", "theresa may"),
    ("Apple-A-Day", "appleaday"),      # punctuation goes first, so "a" is no longer a whole word
    ("O'Neill", "oneill"),
])
def test_normalize_answer_follows_squad_order(raw, normalized):
    assert normalize_answer(raw) == normalized


def test_empty_gold_list_is_an_error():
    for metric in (exact_match, token_f1, token_precision, token_recall, accuracy, score_answer):
        with pytest.raises(ValueError):
            metric("Paris", [])


def test_a_single_string_is_not_taken_as_a_list_of_golds():
    # Iterating "Paris" would give the aliases P, a, r, i, s.
    with pytest.raises(TypeError):
        token_f1("a", "Paris")


def test_empty_prediction_scores_zero_even_against_empty_gold():
    assert score_answer("", [""]) == AnswerScores(0.0, 0.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize(("retrieved", "supporting", "expected"), [
    (["p1", "p2", "p3"], ["p1", "p3"], 1.0),
    (["p1", "p2"], ["p1", "p9"], 0.5),
    (["p1", "p1", "p2"], ["p3"], 0.0),
    ([], ["p1", "p2"], 0.0),
    (["p1"], ["p1", "p1", "p2"], 0.5),          # supporting ids counted once
    (iter(["p2", "p1"]), ("p1", "p2"), 1.0),     # any iterables
])
def test_support_recall(retrieved, supporting, expected):
    assert support_recall(retrieved, supporting) == expected


def test_support_recall_is_none_without_supporting_ids():
    assert support_recall(["p1"], []) is None


@pytest.mark.parametrize(("text", "answer"), [
    ("So the answer is: Paris.", "Paris"),
    ("**Answer:** Paris", "Paris"),
    ("Paris", "Paris"),
    ("Paris.\nIt is the capital of France.", "Paris"),
    ("Spielberg was born in 1946.\nScott was born in 1937.\n1937 is earlier.\nFinal answer: 1990", "1990"),
    (("Jaws was directed by Steven Spielberg. Alien was directed by Ridley Scott, born in 1937.\n"
      "So the answer is: Ridley Scott."), "Ridley Scott"),
    ("At first I thought the answer is London. On reflection, the answer is Paris.", "Paris"),
    ('The answer is "Ridley Scott".', "Ridley Scott"),
    ("The answer is **Paris**.", "Paris"),
    ("**Final Answer**: Paris", "Paris"),
    ("FINAL ANSWER: yes", "yes"),
    ("Answer:\nParis", "Paris"),
    ("The answer is 3.5.", "3.5"),
    ("So the answer is: yes.\n\nExplanation: both are American.", "yes"),
    ("The answer isn't obvious, but Paris fits.", "The answer isn't obvious, but Paris fits"),
    ("\n\n  *Paris*  \n", "Paris"),
    ("Both directors are American. So the answer is:", "Both directors are American. So the answer is:"),
    ("I think the answer is Lyon.\nThe answer is:", "Lyon"),
    ("", ""),
    ("  \n ", ""),
])
def test_extract_short_answer(text, answer):
    assert extract_short_answer(text) == answer
