"""LLM back-end names -> lazy import paths and settings classes; one spec string names a model.

The same spec string names the run's LLM (`--llm`), EvoCtx's `decision_llm` and any judge's model:
`embedded` (Qwen2.5-Coder-1.5B through llama.cpp, the default), `embedded-0.5b`, `gguf:PATH`,
`hf` (the 1.5B GGUF through transformers), `hf-0.5b`, `hf:PATH` (a GGUF file or a Hugging Face
model folder), `openai:MODEL` or `openai:MODEL@URL`, and `scripted:FILE` (no model: answers from a
script file, `metarag.testing`). Nothing is imported or loaded until
`make_llm`; an unknown name fails at start-up with the close matches.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Any

from metarag.errors import ConfigError, MetaRAGError, close_matches
from metarag.llm.base import LLM


@dataclass(frozen=True)
class Backend:
    """One back-end name: the module and class that implement it, its settings class, the embedded
    model it preselects (if any), which spec field it needs ("path" or "model"), and whether it is
    `served` (a client of a model behind a server: building it loads nothing, and `check()` asks it)."""

    module: str
    cls: str
    settings_cls: str
    embedded: str | None = None
    needs: str | None = None
    served: bool = False


_LLAMA = ("metarag.llm.llama_cpp", "LlamaCppLLM", "LlamaCppSettings")
_HF = ("metarag.llm.hf", "HFLLM", "HFSettings")
BACKENDS: dict[str, Backend] = {
    "embedded": Backend(*_LLAMA, embedded="qwen2.5-coder-1.5b-instruct"),
    "embedded-0.5b": Backend(*_LLAMA, embedded="qwen2.5-coder-0.5b-instruct"),
    "gguf": Backend(*_LLAMA, needs="path"),
    "hf": Backend(*_HF, embedded="qwen2.5-coder-1.5b-instruct"),
    "hf-0.5b": Backend(*_HF, embedded="qwen2.5-coder-0.5b-instruct"),
    "openai": Backend("metarag.llm.openai_compat", "OpenAICompatLLM", "OpenAISettings", needs="model", served=True),
    "scripted": Backend("metarag.llm.scripted", "ScriptFileLLM", "ScriptSettings", needs="path"),
}
# Back-ends whose spec string takes ":PATH" (`hf:PATH` is the `hf` back-end with a path).
PATH_BACKENDS = ("gguf", "hf", "scripted")


@dataclass(frozen=True)
class LLMSpec:
    """Which LLM to use: `backend` is a name in BACKENDS; `gguf` is the model path (a GGUF file for
    'gguf'; a GGUF file or a model folder for 'hf', where it replaces the embedded model);
    `base_url`/`model` for 'openai'; `n_ctx`/`n_threads` for the local back-ends.
    `response_cache` keeps every answer in `$METARAG_HOME/responses.sqlite`. `prefix_chunk` > 0
    makes llama.cpp's KV-cache reuse exact (`LlamaCppSettings.prefix_chunk`; 0, off, by default).
    `lora` a LoRA adapter on a llama.cpp model (`LlamaCppSettings.lora`: a GGUF adapter or a PEFT folder).
    (The field names are those of the first version, so the run ids hashed from them stay put.)"""

    backend: str = "embedded"
    gguf: str | None = None
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    n_ctx: int = 4096
    n_threads: int | None = None
    response_cache: bool = True
    prefix_chunk: int = 0
    lora: str | None = None

    def label(self) -> str:
        """The spec string naming this model (the inverse of `parse_llm_spec`)."""
        if self.backend == "openai":
            return f"openai:{self.model}@{self.base_url}"
        if self.backend in PATH_BACKENDS and self.gguf:
            return f"{self.backend}:{self.gguf}"
        return self.backend


def parse_llm_spec(text: str, **fields: Any) -> LLMSpec:
    """The LLMSpec a spec string names (see the module docstring); `fields` fill the rest (threads,
    the cache, a path or model given by a separate flag). Checked, not loaded."""
    text = text.strip()
    name, colon, rest = text.partition(":")
    if name not in BACKENDS:
        raise ConfigError(f"unknown LLM back-end {name!r}{close_matches(name, BACKENDS)}; valid: embedded, "
                          "embedded-0.5b, gguf:PATH, hf, hf-0.5b, hf:PATH, openai:MODEL[@URL], scripted:FILE")
    if colon:
        if not rest:
            raise ConfigError(f"LLM spec {text!r} names no {'model' if name == 'openai' else 'path'} after ':'")
        if name in PATH_BACKENDS:
            fields["gguf"] = rest
        elif name == "openai":
            model, at, url = rest.partition("@")
            fields["model"] = model
            if at:
                fields["base_url"] = url
        else:
            raise ConfigError(f"LLM {name!r} takes nothing after ':' (got {text!r})")
    spec = LLMSpec(backend=name, **fields)
    check_spec(spec)
    return spec


def check_spec(spec: LLMSpec) -> None:
    """Fail on an unknown back-end or a missing argument before anything is loaded."""
    backend = BACKENDS.get(spec.backend)
    if backend is None:
        raise ConfigError(f"unknown LLM back-end {spec.backend!r}{close_matches(spec.backend, BACKENDS)}")
    if spec.backend == "scripted" and not spec.gguf:
        raise ConfigError("--llm scripted answers from a script file: --llm scripted:FILE (its format: "
                          "metarag.testing, `load_script`)")
    if backend.needs == "path" and not spec.gguf:
        raise ConfigError(f"--llm {spec.backend} needs a model path (--llm {spec.backend}:PATH, or --gguf PATH)")
    if backend.needs == "model" and not spec.model:
        raise ConfigError("--llm openai needs a model name (--llm openai:MODEL@URL, or --model NAME --base-url URL)")
    if spec.prefix_chunk and backend.cls != "LlamaCppLLM":
        raise ConfigError(f"--prefix-chunk is a llama.cpp setting; --llm {spec.backend} does not take it")
    if spec.lora and backend.cls != "LlamaCppLLM":
        raise ConfigError(f"--lora applies an adapter on a llama.cpp model (embedded, embedded-0.5b, gguf:PATH); "
                          f"for --llm {spec.backend} give the checkpoint's merged model (hf:CHECKPOINT/merged)")
    if spec.gguf and spec.backend not in PATH_BACKENDS:
        raise ConfigError(f"a model path was given, but --llm {spec.backend} takes none (use gguf:PATH or hf:PATH)")


def backend_settings(spec: LLMSpec) -> Any:
    """The settings object of the spec's back-end (its module imported; no model loaded)."""
    check_spec(spec)
    backend = BACKENDS[spec.backend]
    settings_cls = getattr(importlib.import_module(backend.module), backend.settings_cls)
    if spec.backend == "openai":
        return settings_cls(base_url=spec.base_url, model=spec.model, api_key_env=spec.api_key_env)
    if spec.backend == "scripted":
        return settings_cls(path=spec.gguf, n_ctx=spec.n_ctx, n_threads=spec.n_threads)
    if backend.cls == "HFLLM":
        return settings_cls(embedded=None if spec.gguf else backend.embedded, path=spec.gguf, n_ctx=spec.n_ctx,
                            n_threads=spec.n_threads)
    return settings_cls(embedded=backend.embedded, gguf=spec.gguf, n_ctx=spec.n_ctx, n_threads=spec.n_threads,
                        prefix_chunk=spec.prefix_chunk, lora=spec.lora)


def expected_identity(spec: LLMSpec) -> str | None:
    """The identity a model built from `spec` will have (`LLM.identity`), where its back-end can tell
    without loading it (a class-level `identity_for(settings)`: llama.cpp, an OpenAI-compatible server);
    None where it cannot (transformers picks its dtype and device at load) or its files are missing."""
    backend = BACKENDS[spec.backend]
    identity_for = getattr(getattr(importlib.import_module(backend.module), backend.cls), "identity_for", None)
    if identity_for is None:
        return None
    try:
        return identity_for(backend_settings(spec))
    except MetaRAGError:
        return None


def make_llm(spec: LLMSpec | str, *, batch: int = 1) -> LLM:
    """Build the back-end named by `spec` (this is where models load), behind the response cache
    unless the spec turns it off. `batch` > 1: the requests of a round of `run_many` come this many
    at a time (`eval --batch N`), and a llama.cpp model decodes them together
    (`LlamaCppSettings.batch_slots`); how a model is run, not what it is: no part of the spec."""
    if isinstance(spec, str):
        spec = parse_llm_spec(spec)
    settings = backend_settings(spec)
    if batch > 1 and hasattr(settings, "batch_slots"):
        settings = replace(settings, batch_slots=batch)
    backend = BACKENDS[spec.backend]
    llm: LLM = getattr(importlib.import_module(backend.module), backend.cls)(settings)
    if spec.response_cache and spec.backend != "scripted":  # a script answers at once: nothing to keep
        from metarag.llm.cache import CachedLLM, ResponseCache

        llm = CachedLLM(llm, ResponseCache())
    return llm
