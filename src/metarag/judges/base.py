"""The judge protocol: small scoring components methods consult (similarity, entailment,
sufficiency, critics). A method yields `Assess(judge, inputs)`; the runner calls the judge with
the run's components and records one Judge step with the verdict, score, input sizes and Usage."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from metarag.records import Usage

if TYPE_CHECKING:
    from metarag.methods.runner import Runtime


@dataclass(frozen=True)
class Verdict:
    """What a judge decided. `fallback` is set (with the reason) when the judge could not read its
    model's output and returned its documented default instead; reports count these."""

    verdict: str
    score: float | None = None
    usage: Usage = Usage()
    detail: str = ""
    fallback: str | None = None
    signals: tuple[tuple[str, float], ...] = ()  # named numbers a method may read (e.g. distances)


@runtime_checkable
class Judge(Protocol):
    """Anything with `judge` is a judge. It gets the run's Runtime (for its LLM) and named text
    inputs, and must not raise on model output it cannot parse: it falls back and says so."""

    name: str

    def judge(self, runtime: Runtime, inputs: Mapping[str, str | tuple[str, ...]]) -> Verdict: ...
