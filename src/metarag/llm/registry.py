"""LLM back-end names -> lazily built back-ends, wrapped in the persistent response cache."""
from __future__ import annotations

from dataclasses import dataclass

from metarag.errors import ConfigError, close_matches
from metarag.llm.base import LLM

BACKENDS = ("embedded", "embedded-0.5b", "gguf", "openai")


@dataclass(frozen=True)
class LLMSpec:
    """Which LLM to use: `backend` is one of BACKENDS; `gguf` a file path for backend 'gguf';
    `base_url`/`model` for 'openai'; `n_ctx`/`n_threads` for the llama.cpp back-ends.
    `response_cache` keeps every answer in `$METARAG_HOME/responses.sqlite`."""

    backend: str = "embedded"
    gguf: str | None = None
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    n_ctx: int = 4096
    n_threads: int | None = None
    response_cache: bool = True


def check_spec(spec: LLMSpec) -> None:
    """Fail on an unknown back-end or a missing argument before anything is loaded."""
    if spec.backend not in BACKENDS:
        raise ConfigError(f"unknown LLM back-end {spec.backend!r}{close_matches(spec.backend, BACKENDS)}")
    if spec.backend == "gguf" and not spec.gguf:
        raise ConfigError("--llm gguf needs --gguf PATH")
    if spec.backend == "openai" and not spec.model:
        raise ConfigError("--llm openai needs --model NAME (and --base-url URL)")


def make_llm(spec: LLMSpec) -> LLM:
    """Build the back-end named by `spec` (this is where models load)."""
    check_spec(spec)
    llm: LLM
    if spec.backend == "openai":
        from metarag.llm.openai_compat import OpenAICompatLLM, OpenAISettings

        llm = OpenAICompatLLM(OpenAISettings(base_url=spec.base_url, model=spec.model,
                                             api_key_env=spec.api_key_env))
    else:
        from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

        model = {"embedded": "qwen2.5-coder-1.5b-instruct", "embedded-0.5b": "qwen2.5-coder-0.5b-instruct",
                 "gguf": None}[spec.backend]
        llm = LlamaCppLLM(LlamaCppSettings(embedded=model, gguf=spec.gguf, n_ctx=spec.n_ctx,
                                           n_threads=spec.n_threads))
    if spec.response_cache:
        from metarag.llm.cache import CachedLLM, ResponseCache

        llm = CachedLLM(llm, ResponseCache())
    return llm
