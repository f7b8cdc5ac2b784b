"""Money cost of a run from its token counts and a per-model price table the user can set.

Prices are US dollars per million tokens, input and output priced separately, looked up by the
exact model name (the server's model name, or the GGUF's name for llama.cpp). A model not in the
table costs nothing when it runs locally (llama.cpp) and is reported as unknown (None) otherwise,
never guessed.

Requests are counted twice: all of them (what the papers' tables count) and the model-served ones
(`served_usage`), leaving out those metarag's response cache answered, whose tokens are the original
request's and whose latency is a lookup's.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from metarag.errors import DataError
from metarag.records import Step, Usage


@dataclass(frozen=True)
class Price:
    """USD per million input (prompt) and output (completion) tokens."""

    input_per_1m: float
    output_per_1m: float

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input_per_1m + completion_tokens * self.output_per_1m) / 1e6


# List prices of the models the MetaRAG reproducibility study used (Table 6), per 1M tokens.
DEFAULT_PRICES: dict[str, Price] = {
    "gpt-3.5-turbo-16k": Price(3.0, 4.0),
    "gpt-3.5-turbo": Price(0.5, 1.5),
    "gpt-4o-mini": Price(0.15, 0.6),
}


def model_name(identity: str) -> str:
    """The model name inside an LLM identity ('openai:NAME@URL', 'llama.cpp:NAME:sha256=...'); a llama.cpp
    model with a LoRA adapter applied ('...:lora=HASH') is 'NAME+lora:HASH8', since it is another model
    (a table of a trained checkpoint against its base tells them apart by it)."""
    backend, _, rest = identity.partition(":")
    if backend == "openai":
        return rest.rsplit("@", 1)[0]
    if backend == "llama.cpp":
        _, tagged, adapter = rest.partition(":lora=")
        name = rest.split(":", 1)[0]
        return f"{name}+lora:{adapter[:8]}" if tagged else name
    return rest or identity


def price_for(identity: str, table: dict[str, Price] | None = None) -> Price | None:
    """The price of the model behind `identity`: the table's entry, 0 for local llama.cpp models,
    None (unknown) for a served model the table does not list."""
    table = {**DEFAULT_PRICES, **(table or {})}
    name = model_name(identity)
    if name in table:
        return table[name]
    if identity.startswith(("llama.cpp:", "scripted:")):
        return Price(0.0, 0.0)
    return None


def load_price_table(path: str | Path) -> dict[str, Price]:
    """A JSON file {"model name": {"input_per_1m": USD, "output_per_1m": USD}, ...}."""
    try:
        raw = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError("price table not found", path=str(path)) from None
    except ValueError as exc:
        raise DataError(f"price table is not valid JSON: {exc}", path=str(path)) from None
    table = {}
    for name, entry in raw.items() if isinstance(raw, dict) else []:
        try:
            table[name] = Price(float(entry["input_per_1m"]), float(entry["output_per_1m"]))
        except (TypeError, KeyError, ValueError):
            raise DataError(f"entry {name!r} needs numeric input_per_1m and output_per_1m",
                            path=str(path)) from None
    if not isinstance(raw, dict):
        raise DataError("price table must be a JSON object of model name -> prices", path=str(path))
    return table


def served_usage(steps: Iterable[Step]) -> Usage:
    """The part of the steps' cost the model (and the retriever, and any judge that computes) really
    served: every step's Usage, less the requests the response cache answered. A step whose requests
    all came from the cache counts nothing; a step of several requests with some cached (a reranker's)
    counts the served share of its tokens and latency. `llm_requests` is the served count; `cache_hits` 0."""
    total = Usage()
    for step in steps:
        u = step.usage
        if not u.cache_hits:
            total += u
            continue
        served = max(u.llm_requests - u.cache_hits, 0)
        share = served / u.llm_requests if u.llm_requests else 0.0
        total += Usage(round(u.prompt_tokens * share), round(u.completion_tokens * share),
                       round(u.cached_tokens * share), u.latency_s * share, served, u.retrieval_calls, 0)
    return total
