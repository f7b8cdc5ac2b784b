"""The judge protocol: small scoring components methods consult (similarity, entailment,
sufficiency, critics). A method yields `Assess(judge, inputs)`; the runner calls `judge(inputs)`
and records one Judge step with the verdict, score and input sizes.

A judge that asks a model returns a sub-policy: a generator that yields `Ask` / `Probe` (the runner
carries them out like any other request of the run, records each as its own Generate / Score step
and sends back the reply) and returns its `Verdict`. A judge with a model of its own (MiniLM
similarity, an NLI cross-encoder, boundary distances) computes and returns the Verdict directly;
the runner records its wall-clock time as the Judge step's latency. No judge holds the run's LLM.
"""
from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

Inputs = Mapping[str, str | tuple[str, ...]]


@dataclass(frozen=True)
class Verdict:
    """What a judge decided. `fallback` is set (with the reason) when the judge could not read its
    model's output and returned its documented default instead; reports count these. A verdict
    carries no Usage: what its model requests cost is on their own steps."""

    verdict: str
    score: float | None = None
    detail: str = ""
    fallback: str | None = None
    signals: tuple[tuple[str, float], ...] = ()  # named numbers a method may read (e.g. distances)


JudgeCall = Verdict | Generator[Any, Any, Verdict]


@runtime_checkable
class Judge(Protocol):
    """Anything with `judge` is a judge. It gets named text inputs and returns a Verdict, or a
    sub-policy that yields Ask / Probe actions and returns one; it must not raise on model output it
    cannot parse: it falls back and says so."""

    name: str

    def judge(self, inputs: Inputs) -> JudgeCall: ...


class JudgeAudit:
    """A judge over recorded inputs, as a method the runner runs (every model call goes through
    `methods/runner.py`): its policy for a question asks the judge about that question's inputs and
    returns the verdict. `inputs` maps question ids to the judge's inputs. Subclasses name the audit."""

    name = "judge-audit"
    revision = 1

    def __init__(self, inputs: Mapping[str, Mapping[str, str]], judge: Any):
        self.inputs, self.judge = dict(inputs), judge

    def policy(self, question: Any) -> Generator[Any, Any, str]:
        from metarag.policy.actions import Assess

        verdict = yield Assess(self.judge, self.inputs[question.id])
        return verdict.verdict

