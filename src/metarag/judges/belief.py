"""The internal belief probe of the belief-action aligned search agent (Qi et al., 2026, "MetaRAG:
Belief-Action Aligned Policy Optimization for Agentic RAG", §3.3): one extra label read on the
decision context c_t = (question, history h_t) of a step, b_t = P(Yes) − P(No) ∈ [−1, 1] over the
two-label softmax. A sub-policy yielding one `Probe`, so the runner records it as a Score step.

The paper probes only in training; `search-r1` and `belief-agent` probe with `--set probe=true`.
Left out: the alternative probe "Internal Confidence" (Appendix A, Chen et al. 2025a: self-evaluation
signals aggregated over layers and token positions). Its layer and position weighting is not given
in the card or the seed text, so it cannot be built faithfully here; the transformers back-end's
hidden states (`Decoding.hidden_states`) are where it would read them.
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from metarag.policy.actions import Probe
from metarag.records import Message

# The paper's Probe Instruction (§3.3), verbatim.
PROBE_INSTRUCTION = ("Respond ONLY with 'Yes' or 'No' to indicate whether you are capable of answering the "
                     "question confidently.")
PROBE_LABELS = ("Yes", "No")
PROBE_PURPOSE = "belief-probe"


@dataclass(frozen=True)
class Belief:
    """A step's belief: b = P(Yes) − P(No) with P renormalized over the two labels (`LabelScores.p`).
    `fallback` is set when neither label got probability mass: then P(Yes) = P(No) = 1/2, b = 0."""

    b: float
    p_yes: float
    fallback: str | None = None

    @property
    def answerable(self) -> bool:
        """The probe's verdict: "yes, I can answer" when b >= 0."""
        return self.b >= 0


def probe_prompt(context: str) -> tuple[Message, ...]:
    """The probe's request: the step's question-and-history context, then the Probe Instruction."""
    return (Message("user", f"{context.rstrip()}\n\n{PROBE_INSTRUCTION}"),)


def belief_probe(context: str) -> Generator[Probe, Any, Belief]:
    """Probe the model's belief that it can answer, on `context` (the question and the history of the
    step, as the agent's own prompt shows them)."""
    scores = yield Probe(PROBE_PURPOSE, probe_prompt(context), PROBE_LABELS)
    p_yes, fallback = scores.p("Yes")
    p_no, _ = scores.p("No")
    return Belief(p_yes - p_no, p_yes, fallback)
