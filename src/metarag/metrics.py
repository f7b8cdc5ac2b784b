"""Answer and retrieval metrics: pure functions from one prediction (or one retrieval) to scores.

The harness scores every trace with these. Answer metrics follow the official SQuAD v1.1 and
HotpotQA evaluation scripts (normalization, token F1, the yes/no rule) and FlashRAG's handling of
gold aliases. Reading the answer out of a model's reply is `metarag.parsing`'s job, before scoring.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# HotpotQA's official script: a prediction or gold that is one of these gets no partial token credit.
_NO_PARTIAL_CREDIT = frozenset({"yes", "no", "noanswer"})


def normalize_answer(s: str) -> str:
    """Normalize an answer for comparison, exactly as the SQuAD v1.1 official script does.

    In this order: lowercase, drop ASCII punctuation (`string.punctuation`, without inserting a
    space, so "rock-n-roll" becomes "rocknroll"), drop the articles a / an / the as whole words,
    collapse whitespace. Non-ASCII characters are kept as they are: accents are not folded and
    typographic quotes or dashes are not removed, as in the official script.
    """
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


@dataclass(frozen=True)
class AnswerScores:
    """All answer metrics of one prediction against its gold aliases, each in [0, 1]."""

    em: float
    f1: float
    precision: float
    recall: float
    acc: float


def _normalized_golds(golds: Sequence[str]) -> list[str]:
    if isinstance(golds, str):
        raise TypeError("golds must be a sequence of answer strings, not a single string")
    if len(golds) == 0:
        raise ValueError("no gold answers to score against")
    return [normalize_answer(g) for g in golds]


def _token_scores(prediction: str, gold: str) -> tuple[float, float, float]:
    """(F1, precision, recall) of two normalized answers, as in HotpotQA's `f1_score`."""
    if (prediction in _NO_PARTIAL_CREDIT or gold in _NO_PARTIAL_CREDIT) and prediction != gold:
        return 0.0, 0.0, 0.0
    pred_tokens = prediction.split()
    gold_tokens = gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def _best_token_scores(prediction: str, golds: Sequence[str]) -> tuple[float, float, float]:
    """Max F1, max precision, max recall over gold aliases, each maximized independently."""
    norm_golds = _normalized_golds(golds)
    norm_pred = normalize_answer(prediction)
    if not norm_pred:
        return 0.0, 0.0, 0.0
    f1s, precisions, recalls = zip(*(_token_scores(norm_pred, g) for g in norm_golds))
    return max(f1s), max(precisions), max(recalls)


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """Score 1.0 if the normalized prediction equals any normalized gold alias, else 0.0.

    A prediction that is empty after normalization scores 0 (an empty or punctuation-only answer
    is no answer, even against a gold alias that itself normalizes to nothing). An empty `golds`
    raises ValueError.
    """
    norm_golds = _normalized_golds(golds)
    norm_pred = normalize_answer(prediction)
    return float(bool(norm_pred) and norm_pred in norm_golds)


def token_f1(prediction: str, golds: Sequence[str]) -> float:
    """Token-level F1 of the prediction, the maximum over gold aliases (SQuAD / HotpotQA).

    Tokens are the whitespace-split words of the normalized answers, counted with multiplicity. As
    in HotpotQA's script, if either side normalizes to yes / no / noanswer and the two differ, the
    pair scores 0 with no partial token credit. An empty prediction scores 0; an empty `golds`
    raises ValueError.
    """
    return _best_token_scores(prediction, golds)[0]


def token_precision(prediction: str, golds: Sequence[str]) -> float:
    """Token precision of the prediction, the maximum over gold aliases.

    The maximum is taken independently of F1 and recall (as FlashRAG does), so the precision may
    come from a different alias than the best F1; the per-alias rules are those of `token_f1`.
    """
    return _best_token_scores(prediction, golds)[1]


def token_recall(prediction: str, golds: Sequence[str]) -> float:
    """Token recall of the prediction, the maximum over gold aliases.

    The maximum is taken independently of F1 and precision (as FlashRAG does); the per-alias rules
    are those of `token_f1`.
    """
    return _best_token_scores(prediction, golds)[2]


def accuracy(prediction: str, golds: Sequence[str]) -> float:
    """Score 1.0 if any gold alias is contained in the prediction (the "Acc" of EvoCtx / FlashRAG).

    Containment is tested on normalized answers and on token boundaries: the gold's tokens must
    appear as a contiguous run of the prediction's tokens, so "1" is not found in "1990" and "paris"
    is not found in "parisian". Gold aliases that normalize to nothing never match. The yes/no rule
    of `token_f1` does not apply here: "yes it is" contains the gold "yes". An empty prediction
    scores 0; an empty `golds` raises ValueError.
    """
    norm_golds = _normalized_golds(golds)
    norm_pred = normalize_answer(prediction)
    if not norm_pred:
        return 0.0
    padded = f" {norm_pred} "
    return float(any(g and f" {g} " in padded for g in norm_golds))


# ------------------------------------------------------------- the agentic papers' own accuracies
# R1-Searcher's normalization (`evaluation/metric_calc_rule.py`): punctuation, typographic quotes too,
# becomes a space rather than nothing, and underscores are spaces.
_R1_PUNCTUATION = re.compile("[" + re.escape(string.punctuation + "‘’´`") + "]")


def r1_normalize(text: str) -> str:
    """An answer as R1-Searcher's scripts normalize it (`normalize_answer` after `bool_mapping`,
    `evaluation/metric_calc_rule.py` lines 15-41): "True" / "False" read as yes / no, underscores and
    punctuation made spaces, lowercased, articles dropped, whitespace collapsed."""
    text = {"True": "yes", "False": "no"}.get(text, text).replace("_", " ").lower()
    return " ".join(_ARTICLES.sub(" ", _R1_PUNCTUATION.sub(" ", text)).split())


def r1_searcher_accuracy(prediction: str, golds: Sequence[str]) -> float:
    """R1-Searcher's ACC_R (Song et al., 2025; "Cover-Exect-Match" in its README): 1.0 when every token
    of a gold answer occurs among the prediction's tokens, in any order and not necessarily together,
    the best over the gold aliases (`cover_exact_match_score_1`, `evaluation/metric_calc_rule.py`
    lines 79-88, whose count `acc_num` is its accuracy); tokens of `r1_normalize`d text split on
    single spaces, so an empty prediction holds only the empty token and matches only a gold that
    normalizes to nothing, as theirs. "Paris, France" has the gold "France Paris"; "1" is not in "1990"."""
    _normalized_golds(golds)  # the input checks; R1-Searcher normalizes its own way
    tokens = r1_normalize(prediction).split(" ")
    return float(any(all(t in tokens for t in r1_normalize(g).split(" ")) for g in golds))


def search_o1_accuracy(prediction: str, golds: Sequence[str]) -> float:
    """Search-o1's accuracy on open-domain QA ("acc" of `evaluate_predictions`, `scripts/evaluate.py`
    lines 70-87, "qa" mode): 1.0 when a normalized gold answer (SQuAD's normalization) is a substring
    of the normalized prediction, characters not tokens, so "new york" is found in "new yorker"; the
    best over the gold aliases, a gold counting only when it shares a token with the prediction (their
    loop skips a gold with no common token before it updates the accuracy), so "paris" is not found
    in "parisian", nor an empty gold anywhere."""
    norm_pred = normalize_answer(prediction)
    pred_tokens = Counter(norm_pred.split())
    return float(any(g in norm_pred and sum((pred_tokens & Counter(g.split())).values()) > 0
                     for g in _normalized_golds(golds)))


def score_answer(prediction: str, golds: Sequence[str]) -> AnswerScores:
    """All answer metrics of one prediction at once (see each metric's function for its rules)."""
    f1, precision, recall = _best_token_scores(prediction, golds)
    return AnswerScores(em=exact_match(prediction, golds), f1=f1, precision=precision, recall=recall,
                        acc=accuracy(prediction, golds))


def support_recall(retrieved_ids: Iterable[str], supporting_ids: Iterable[str]) -> float | None:
    """Share of the distinct supporting passage ids that appear among the retrieved ids.

    Used over everything a method retrieved and over its first retrieval alone. Returns None when
    the question has no supporting ids (the metric is undefined there, not 0).
    """
    support = set(supporting_ids)
    if not support:
        return None
    return len(support & set(retrieved_ids)) / len(support)

