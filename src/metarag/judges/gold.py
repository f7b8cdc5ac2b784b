"""The oracle judge: exact match of an answer with the question's gold answers (Reflexion's HotpotQA
evaluator, Shinn et al. 2023, hotpotqa_runs/agents.py `is_correct`). It sees the gold answers, so a
method that consults it gets oracle feedback, which a fair comparison cannot use."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from metarag.judges.base import Verdict
from metarag.metrics import exact_match


@dataclass(frozen=True)
class GoldMatch:
    """Input `answer` against the tuple `gold`: "correct" when it exactly matches one of them after
    SQuAD normalization (the score is the EM, 1.0 or 0.0), else "incorrect"."""

    name: str = "gold-em"

    def judge(self, inputs: Mapping[str, str | tuple[str, ...]]) -> Verdict:
        gold = inputs["gold"]
        score = exact_match(str(inputs["answer"]), (gold,) if isinstance(gold, str) else gold)
        return Verdict("correct" if score else "incorrect", score, detail="oracle feedback")
