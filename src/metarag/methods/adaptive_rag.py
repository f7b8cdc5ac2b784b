"""Adaptive-RAG (Jeong et al., NAACL 2024, "Adaptive-RAG: Learning to Adapt Retrieval-Augmented Large
Language Models through Question Complexity"): a query-complexity classifier routes each question to
no retrieval, single-step retrieval or multi-step retrieval (§3.2, §3.3).

One question, as a policy over the shared runner loop:

1. Classify: the question's complexity label, A (simple: the LLM answers it alone), B (moderate: one
   retrieval) or C (complex: multi-step retrieval). The route is the most probable label, recorded as
   an `adaptive-rag-route` Decide step with the three probabilities.
2. Run the route's strategy as a sub-policy (`yield from`), its steps in the same trace:
   A = `closed-book`, B = `standard-rag` (one retrieval, top-k), C = `ircot` (as in the paper, §4.1),
   each with its own defaults.

The classifier (`classifier` setting) is either "llm": the run's LLM reads a short description of the
three classes and its label probability over "A" / "B" / "C" (one Probe) is the classifier's output;
or the folder of a router trained by `metarag train-router` (`metarag.train.router`): a multinomial
logistic regression on MiniLM embeddings of the question, trained with the paper's silver labels (the
cheapest strategy that answers each training question correctly; for a question none answers, the
dataset's inductive bias: C for multi-hop datasets, B for single-hop ones, §3.3).
Departure, on purpose: the paper's classifier is a fine-tuned T5-Large; the toolkit ships no such
model, so the "llm" classifier prompts the run's model and the trained one is a linear model on
sentence embeddings.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from metarag.errors import ConfigError
from metarag.judges.router import ROUTES, Route, load_router
from metarag.methods.closed_book import ClosedBook
from metarag.methods.ircot import IRCoT
from metarag.methods.runner import Policy
from metarag.methods.standard_rag import StandardRAG
from metarag.policy.actions import Assess, Note, Probe
from metarag.records import Decide, Message, Question, Trace
from metarag.settings import check_ranges

STRATEGIES = {"A": "closed-book", "B": "standard-rag", "C": "ircot"}
ROUTE_STEP = "adaptive-rag-route"
CLASSIFY_SYSTEM = "You judge how much outside information a question needs before it can be answered."
CLASSIFY_TASK = (
    "Question: {question}\n\n"
    "A: a simple question the assistant can answer from its own knowledge, with no search.\n"
    "B: a question that needs one search for one fact.\n"
    "C: a complex question that needs several searches, one fact leading to the next.\n"
    "Which class is this question? Reply with the letter only.")
FALLBACK_ROUTE = "C"  # no probability on any letter: the strategy that is right most often


@dataclass(frozen=True)
class AdaptiveRAGSettings:
    """Adaptive-RAG settings. classifier: "llm" (default: the run's LLM, label probability over the three
    classes) or the folder of a router trained by `metarag train-router`. route: "auto" classifies;
    "A", "B" or "C" forces that route (the paper's single-strategy rows; what the router's silver
    labels compare). The strategies run with their own defaults: standard-rag top-5, IRCoT K = 6."""

    classifier: str = "llm"
    route: Literal["auto", Route] = "auto"

    def __post_init__(self) -> None:
        check_ranges(self)
        if not self.classifier.strip():
            raise ConfigError("adaptive-rag classifier must be 'llm' or the folder of a router trained with "
                              "`metarag train-router`")


class AdaptiveRAG:
    """Adaptive-RAG as a policy: classify the question's complexity, then run the strategy it routes to."""

    name = "adaptive-rag"
    revision = 1
    components = ("closed-book", "standard-rag", "ircot")

    def __init__(self, settings: AdaptiveRAGSettings = AdaptiveRAGSettings(), router=None):
        self.settings = settings
        self.router = router
        if router is None and settings.classifier != "llm" and settings.route == "auto":
            self.router = load_router(settings.classifier)
        self.strategies = {"A": ClosedBook(), "B": StandardRAG(), "C": IRCoT()}

    def policy(self, question: Question) -> Policy:
        route = yield from self._route(question)
        return (yield from self.strategies[route].policy(question))

    def _route(self, question: Question) -> Policy:
        if self.settings.route != "auto":
            yield Note(ROUTE_STEP, self.settings.route, (("forced", 1.0),))
            return self.settings.route
        if self.router is not None:
            verdict = yield Assess(self.router, {"question": question.text})
            probs = dict(verdict.signals)
            route, fallback = verdict.verdict, verdict.fallback
        else:
            prompt = (Message("system", CLASSIFY_SYSTEM), Message("user", CLASSIFY_TASK.format(question=question.text)))
            scores = yield Probe("complexity", prompt, ROUTES)
            probs = {f"p_{label}": scores.p(label)[0] for label in ROUTES}
            fallback = scores.p(ROUTES[0])[1]
            route = FALLBACK_ROUTE if fallback else max(ROUTES, key=lambda label: (probs[f"p_{label}"], -ord(label)))
        signals = tuple((f"p_{label}", float(probs.get(f"p_{label}", 0.0))) for label in ROUTES)
        yield Note(ROUTE_STEP, route, (*signals, ("fallback", float(fallback is not None))))
        return route


def route_of(trace: Trace) -> str | None:
    """The route a trace took (its `adaptive-rag-route` step), None when it has none."""
    return next((s.choice for s in trace.of_kind(Decide) if s.name == ROUTE_STEP), None)


def route_shares(traces: Iterable[Trace]) -> dict[str, float]:
    """The share of questions routed to each strategy (A, B, C), over the traces that were routed."""
    counts = Counter(r for r in map(route_of, traces) if r is not None)
    total = sum(counts.values())
    return {label: (counts[label] / total if total else 0.0) for label in ROUTES}
