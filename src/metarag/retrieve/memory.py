"""An exact, pure-Python BM25 over a passage list held in memory: the retriever tests run on.

It scores exactly as `BM25Retriever` (bm25s, method "lucene") does, so a method tested against it
sees the rankings the real index would give on the same small corpus, with no dependency beyond
the standard library.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Sequence

from metarag.records import Hit, Passage

# bm25s's default pattern (scikit-learn's): words of two or more word characters.
TOKEN_PATTERN = re.compile(r"(?u)\b\w\w+\b")


def tokenize(text: str, stopwords: Collection[str] = ()) -> list[str]:
    """Lower-cased words of two or more characters, stopwords left out, no stemming."""
    return [t for t in TOKEN_PATTERN.findall(text.lower()) if t not in stopwords]


class MemoryRetriever:
    """BM25 over `passages` (title and text, as `Passage.contents`), computed exactly per query.

    Scores follow Lucene's BM25 (as bm25s's "lucene" method): idf = log(1 + (N - df + 0.5) /
    (df + 0.5)) times tf / (tf + k1 * (1 - b + b * dl / avgdl)), summed over query tokens
    (repeated tokens count each time). k1=0.9 and b=0.4 are Pyserini's defaults. Only passages
    sharing a token with the query are returned, as with Lucene; ties keep corpus order.
    """

    def __init__(self, passages: Sequence[Passage], name: str = "memory", *, k1: float = 0.9,
                 b: float = 0.4, stopwords: Collection[str] = ()):
        self.name = name
        self.passages = list(passages)
        self.k1, self.b = k1, b
        self.stopwords = frozenset(stopwords)
        docs = [Counter(tokenize(p.contents(), self.stopwords)) for p in self.passages]
        lengths = [sum(doc.values()) for doc in docs]
        n = len(docs)
        avgdl = (sum(lengths) / n) if n else 0.0
        # Postings hold each (passage index, term weight) with the length normalization already
        # applied, so a query only sums; the idf is per term.
        self._postings: dict[str, list[tuple[int, float]]] = {}
        for i, (doc, dl) in enumerate(zip(docs, lengths)):
            norm = k1 * (1 - b + b * dl / avgdl) if avgdl else k1
            for term, tf in doc.items():
                self._postings.setdefault(term, []).append((i, tf / (tf + norm)))
        self._idf = {term: math.log(1 + (n - len(post) + 0.5) / (len(post) + 0.5))
                     for term, post in self._postings.items()}

    def scores(self, query: str) -> dict[int, float]:
        """BM25 score of every passage (by corpus position) that shares a token with `query`."""
        totals: dict[int, float] = {}
        for term in tokenize(query, self.stopwords):
            idf = self._idf.get(term)
            if idf is None:
                continue
            for i, weight in self._postings[term]:
                totals[i] = totals.get(i, 0.0) + idf * weight
        return totals

    def search(self, query: str, k: int, exclude: Collection[str] = ()) -> list[Hit]:
        """The k best passages for `query`, skipping ids in `exclude`."""
        if k <= 0:
            return []
        if not isinstance(exclude, (set, frozenset)):
            exclude = set(exclude)
        ranked = sorted(self.scores(query).items(), key=lambda item: (-item[1], item[0]))
        hits = []
        for i, score in ranked:
            passage = self.passages[i]
            if passage.id in exclude:
                continue
            hits.append(Hit(passage, score, self.name))
            if len(hits) == k:
                break
        return hits
