"""Any OpenAI-compatible server (vLLM, llama.cpp's server, Ollama, OpenAI) through the `openai` client.

This is how users scale out: point `base_url` at a served model. Requests that fail with 429, a 5xx
or a connection error are retried with exponential backoff; after the last try a BackendError names
the URL and what went wrong.
"""
from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from metarag.errors import BackendError, ConfigError, MissingDependency
from metarag.llm.base import Decoding, Prompt, as_messages, is_raw
from metarag.records import Completion, LabelScores, Message, TokenLogprob, Usage


@dataclass(frozen=True)
class OpenAISettings:
    """Connection settings for an OpenAI-compatible server.

    `api_key_env` names the environment variable holding the key (local servers accept any key, so
    a missing variable falls back to "EMPTY", as vLLM's documentation does). `top_logprobs_for_labels`
    is the number of alternatives requested to read label probabilities (OpenAI allows at most 20).
    """

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_s: float = 1.0
    top_logprobs_for_labels: int = 20


class OpenAICompatLLM:
    """The LLM protocol over an OpenAI-compatible HTTP API."""

    def __init__(self, settings: OpenAISettings):
        if not settings.model:
            raise ConfigError("the openai back-end needs a model name (--model NAME)")
        try:
            import openai
        except ModuleNotFoundError:
            raise MissingDependency("openai", "openai") from None
        self._openai = openai
        self.settings = settings
        self.client = openai.OpenAI(base_url=settings.base_url,
                                    api_key=os.environ.get(settings.api_key_env) or "EMPTY",
                                    timeout=settings.timeout_s, max_retries=0)
        self.identity = f"openai:{settings.model}@{settings.base_url}"

    # -------------------------------------------------------------------------------- protocol
    def complete(self, prompt: str, decoding: Decoding = Decoding()) -> Completion:
        kwargs = dict(model=self.settings.model, prompt=prompt, max_tokens=decoding.max_tokens,
                      temperature=decoding.temperature, seed=decoding.seed)
        if decoding.stop:
            kwargs["stop"] = list(decoding.stop)
        if decoding.logprobs:
            kwargs["logprobs"] = decoding.logprobs
        response, latency = self._call(self.client.completions.create, **kwargs)
        choice = response.choices[0]
        logprobs = None
        if decoding.logprobs and choice.logprobs is not None and choice.logprobs.tokens:
            lp = choice.logprobs
            logprobs = tuple(
                TokenLogprob(tok, float(lp.token_logprobs[i] if lp.token_logprobs[i] is not None else 0.0),
                             tuple(sorted(((t, float(v)) for t, v in (lp.top_logprobs[i] or {}).items()),
                                          key=lambda tv: -tv[1])) if lp.top_logprobs else ())
                for i, tok in enumerate(lp.tokens))
        return Completion(choice.text or "", self._usage(response, latency), logprobs,
                          choice.finish_reason or "stop")

    def chat(self, messages: Sequence[Message], decoding: Decoding = Decoding()) -> Completion:
        kwargs = dict(model=self.settings.model, messages=[{"role": m.role, "content": m.content}
                                                           for m in messages],
                      max_tokens=decoding.max_tokens, temperature=decoding.temperature, seed=decoding.seed)
        if decoding.stop:
            kwargs["stop"] = list(decoding.stop)
        if decoding.logprobs:
            kwargs.update(logprobs=True, top_logprobs=decoding.logprobs)
        response, latency = self._call(self.client.chat.completions.create, **kwargs)
        choice = response.choices[0]
        logprobs = None
        if decoding.logprobs and choice.logprobs is not None and choice.logprobs.content:
            logprobs = tuple(TokenLogprob(t.token, float(t.logprob),
                                          tuple((a.token, float(a.logprob)) for a in (t.top_logprobs or ())))
                             for t in choice.logprobs.content)
        return Completion(choice.message.content or "", self._usage(response, latency), logprobs,
                          choice.finish_reason or "stop")

    def score_labels(self, prompt: Prompt, labels: Sequence[str]) -> LabelScores:
        """Label probabilities from the top log-probs of one generated token. A label whose first
        token is not among the returned alternatives gets probability 0 (a server returns at most
        `top_logprobs_for_labels` of them); leading spaces and case are matched exactly."""
        messages = as_messages(prompt)
        decoding = Decoding(max_tokens=1, logprobs=self.settings.top_logprobs_for_labels)
        completion = (self.complete(messages[0].content, decoding) if is_raw(messages)
                      else self.chat(messages, decoding))
        top = dict(completion.logprobs[0].top) if completion.logprobs else {}
        probs = tuple(math.exp(top[label]) if label in top else 0.0 for label in labels)
        return LabelScores(tuple(labels), probs, completion.usage)

    def check(self, timeout_s: float = 5.0) -> None:
        """Fail in seconds when the server is down or hung, before a run spends minutes of retries
        per question: one `GET {base_url}/models`, no retry. A server that answers 404 there is up."""
        openai, url = self._openai, self.settings.base_url
        try:
            self.client.with_options(timeout=timeout_s, max_retries=0).models.list()
        except openai.APITimeoutError:
            raise BackendError(f"LLM server at {url} did not answer GET /models within {timeout_s:g} s (hung, or "
                               "still loading?)", retryable=True) from None
        except openai.APIConnectionError as exc:
            raise BackendError(f"LLM server at {url} is not reachable ({_brief(exc.__cause__ or exc)}): start it "
                               "or fix --base-url", retryable=True) from None
        except openai.NotFoundError:
            return
        except openai.APIStatusError as exc:
            raise BackendError(f"LLM server at {url} answered GET /models with HTTP {exc.status_code}: {_brief(exc)}",
                               retryable=exc.status_code >= 500 or exc.status_code == 429) from None

    # ------------------------------------------------------------------------------- transport
    def _call(self, method, **kwargs):
        openai, settings = self._openai, self.settings
        last: Exception | None = None
        for attempt in range(settings.max_retries + 1):
            start = time.perf_counter()
            try:
                return method(**kwargs), time.perf_counter() - start
            except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError) as exc:
                last = exc
            except openai.APIStatusError as exc:
                if exc.status_code < 500 and exc.status_code != 429:
                    raise BackendError(f"{settings.base_url} refused the request "
                                       f"(HTTP {exc.status_code}): {_brief(exc)}") from None
                last = exc
            if attempt < settings.max_retries:
                time.sleep(settings.backoff_s * (2 ** attempt) * (1 + 0.1 * random.random()))
        raise BackendError(f"{settings.base_url} did not answer after {settings.max_retries + 1} tries: "
                           f"{_brief(last)}", retryable=True)

    @staticmethod
    def _usage(response, latency: float) -> Usage:
        usage = response.usage
        cached = 0
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        if details is not None and getattr(details, "cached_tokens", None):
            cached = int(details.cached_tokens)
        return Usage(prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                     completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
                     cached_tokens=cached, latency_s=latency, llm_requests=1)


def _brief(exc: Exception | None) -> str:
    text = str(exc) if exc is not None else "no error recorded"
    return text.splitlines()[0][:200] if text else type(exc).__name__
