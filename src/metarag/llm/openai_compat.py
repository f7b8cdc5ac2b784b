"""Any OpenAI-compatible server (vLLM, llama.cpp's server, Ollama, OpenAI) through the `openai` client.

This is how users scale out: point `base_url` at a served model. Requests that fail with 429, a 5xx
or a connection error are retried with exponential backoff; after the last try a BackendError names
the URL and what went wrong. A server that takes requests but never answers them is not waited on
forever: after `circuit_timeouts` requests in a row time out, the client sends no more (a circuit
breaker): every request and `check()` then fail at once, naming the server.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from metarag.errors import BackendError, ConfigError, MissingDependency, retrying
from metarag.llm.base import (
    PRUNE_LOGPROB,
    Decoding,
    Prompt,
    TokenIds,
    as_messages,
    is_raw,
    label_plan,
    render_continuing,
    split_prefix,
)
from metarag.records import Completion, LabelScores, Message, TokenLogprob, Usage


@dataclass(frozen=True)
class OpenAISettings:
    """Connection settings for an OpenAI-compatible server.

    `api_key_env` names the environment variable holding the key (local servers accept any key, so
    a missing variable falls back to "EMPTY", as vLLM's documentation does). `top_logprobs_for_labels`
    is the number of alternatives requested to read label probabilities (OpenAI allows at most 20).
    `chat_template` (a Jinja chat template, or "gguf:PATH" to read the one in a GGUF file) renders
    conversations here and sends them to the completions endpoint: then `render` works, a final
    assistant message is continued, and multi-token labels are scored exactly after a chat. Without
    it the server renders, and continuing an assistant turn is refused.
    """

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    circuit_timeouts: int = 2  # requests in a row without an answer in timeout_s before no more are sent
    max_retries: int = 4
    backoff_s: float = 1.0
    top_logprobs_for_labels: int = 20
    chat_template: str = ""


class OpenAICompatLLM:
    """The LLM protocol over an OpenAI-compatible HTTP API."""

    provides = frozenset({"token_logprobs"})  # top alternatives only: no full distribution, no entropy

    def __init__(self, settings: OpenAISettings):
        if not settings.model:
            raise ConfigError("the openai back-end needs a model name (--model NAME)")
        try:
            import openai
        except ModuleNotFoundError:
            raise MissingDependency("openai", "openai") from None
        self._openai = openai
        self.settings = settings
        self._api_key = os.environ.get(settings.api_key_env) or "EMPTY"
        self._tls = None  # one TLS context for every client (making one costs ~50 ms)
        self._idle: list = []  # clients not in use: a request takes one (or makes one) and puts it back
        self._idle_lock = threading.Lock()
        self._timeouts = 0  # requests in a row that got no answer within timeout_s (any answer resets it)
        self._circuit: str | None = None  # why no more requests are sent, once the breaker has opened
        self.identity = self.identity_for(settings)

    @staticmethod
    def identity_for(settings: OpenAISettings) -> str:
        """The identity a client of these settings has: the served model's name and the server's URL."""
        return f"openai:{settings.model}@{settings.base_url}"

    @contextlib.contextmanager
    def _client(self):
        """A client no other request is using, for one request. Each has its own connection pool:
        with hundreds of requests in flight from the harness's threads, one shared pool is the
        bottleneck (httpx's pool does work that grows with its connections under one lock, for
        each request and each response). Clients are kept and reused, so their connections are."""
        with self._idle_lock:
            client = self._idle.pop() if self._idle else None
        if client is None:
            openai = self._openai
            if self._tls is None:
                import httpx2

                self._tls = httpx2.create_ssl_context()
            client = openai.OpenAI(base_url=self.settings.base_url, api_key=self._api_key,
                                   timeout=self.settings.timeout_s, max_retries=0,
                                   http_client=openai.DefaultHttpxClient(verify=self._tls))
        try:
            yield client
        finally:
            with self._idle_lock:
                self._idle.append(client)

    # -------------------------------------------------------------------------------- protocol
    # What the HTTP API gives: tokens (text and log-prob, top alternatives) only when logprobs are
    # asked; no token ids and no entropy (only the top alternatives come back). The server applies
    # the stop rule (text cut before the stop string). When stop strings were sent, finish "stop"
    # covers both a stop string and the end of the turn: `stop_cause` tells them apart where the
    # server says (vLLM's `stop_reason`, llama.cpp's llama-server run with --verbose); elsewhere
    # (llama_cpp.server, Ollama, OpenAI) it stays "stop" with `stop` None. The seed is sent; whether
    # a sampled request repeats with it is the server's affair (llama_cpp.server 0.3.36: it does not).
    def complete(self, prompt: str | TokenIds, decoding: Decoding = Decoding()) -> Completion:
        sent = list(prompt.ids) if isinstance(prompt, TokenIds) else prompt
        kwargs = dict(model=self.settings.model, prompt=sent, max_tokens=decoding.max_tokens,
                      temperature=decoding.temperature, seed=decoding.seed, **self._sampling(decoding))
        if decoding.stop:
            kwargs["stop"] = list(decoding.stop)
        if decoding.logprobs:
            kwargs["logprobs"] = decoding.logprobs
        response, latency = self._call(lambda client: client.completions.create, **kwargs)
        choice = response.choices[0]
        tokens = None
        if decoding.logprobs and choice.logprobs is not None and choice.logprobs.tokens:
            lp = choice.logprobs
            tokens = _with_offsets(
                (tok, float(lp.token_logprobs[i] if lp.token_logprobs[i] is not None else 0.0),
                 tuple(sorted(((t, float(v)) for t, v in (lp.top_logprobs[i] or {}).items()),
                              key=lambda tv: -tv[1]))[:decoding.logprobs] if lp.top_logprobs else ())
                for i, tok in enumerate(lp.tokens))
        return self._completion(choice, choice.text or "", response, latency, tokens, decoding,
                                tuple(prompt.ids) if isinstance(prompt, TokenIds) else None)

    def chat(self, messages: Sequence[Message], decoding: Decoding = Decoding()) -> Completion:
        if self.settings.chat_template:
            return self.complete(self.render(messages), decoding)
        if split_prefix(messages)[1] is not None:
            raise ConfigError("the openai back-end cannot continue an assistant turn through the chat API: "
                              "set OpenAISettings.chat_template (a template, or gguf:PATH) to render here")
        kwargs = dict(model=self.settings.model, messages=[{"role": m.role, "content": m.content}
                                                           for m in messages],
                      max_tokens=decoding.max_tokens, temperature=decoding.temperature, seed=decoding.seed,
                      **self._sampling(decoding))
        if decoding.stop:
            kwargs["stop"] = list(decoding.stop)
        if decoding.logprobs:
            kwargs.update(logprobs=True, top_logprobs=decoding.logprobs)
        response, latency = self._call(lambda client: client.chat.completions.create, **kwargs)
        choice = response.choices[0]
        tokens = None
        if decoding.logprobs and choice.logprobs is not None and choice.logprobs.content:
            tokens = _with_offsets((t.token, float(t.logprob),
                                    tuple((a.token, float(a.logprob)) for a in (t.top_logprobs or ())))
                                   for t in choice.logprobs.content)
        return self._completion(choice, choice.message.content or "", response, latency, tokens, decoding, None)

    def render(self, messages: Sequence[Message]) -> str:
        """The conversation rendered with `chat_template` (the server's own rendering is not visible)."""
        if not self.settings.chat_template:
            raise ConfigError("the openai back-end renders on the server; set OpenAISettings.chat_template "
                              "(a template, or gguf:PATH) to render here")
        return render_continuing(messages, self._template())

    def score_labels(self, prompt: Prompt, labels: Sequence[str]) -> LabelScores:
        """Whole-label probabilities from the top log-probs of generated tokens, without a tokenizer.

        Label collisions are checked on text (a variant that starts another label's variant). A
        variant's probability is summed over the ways the returned alternatives spell it: an
        alternative equal to the rest of the variant ends it; one that starts it is continued by
        another one-token request on the prompt text plus that piece (the server re-tokenizes it).
        A continuation needs a text prompt: a raw prompt, or a conversation with `chat_template`.
        Through the server's own chat rendering only one-token spellings are counted (a lower
        bound). An alternative outside the `top_logprobs_for_labels` returned counts 0."""
        plans = label_plan(labels, lambda v: [ord(c) for c in v])  # text-level collision check
        variants = [["".join(map(chr, seq)) for seq in seqs] for seqs in plans]
        decoding = Decoding(max_tokens=1, logprobs=self.settings.top_logprobs_for_labels)
        if isinstance(prompt, TokenIds):
            raise ConfigError("the openai back-end scores labels on text prompts, not token ids")
        messages = as_messages(prompt)
        text = messages[0].content if is_raw(messages) else (self.render(messages) if self.settings.chat_template
                                                              else None)
        usage = Usage()
        tops: dict[str, dict[str, float]] = {}

        def top_after(piece: str) -> dict[str, float]:
            nonlocal usage
            if piece not in tops:
                if text is None:
                    completion = self.chat(messages, decoding)
                else:
                    completion = self.complete(text + piece, decoding)
                usage = usage + completion.usage
                tops[piece] = dict(completion.tokens[0].top) if completion.tokens else {}
            return tops[piece]

        def prob(done: str, rest: str, logprob: float) -> float:
            total = 0.0
            for tok, lp in top_after(done).items():
                if not tok or not rest.startswith(tok) or logprob + lp < PRUNE_LOGPROB:
                    continue
                if tok == rest:
                    total += math.exp(logprob + lp)
                elif text is not None:
                    total += prob(done + tok, rest[len(tok):], logprob + lp)
            return total

        probs = tuple(min(1.0, sum(prob("", v, 0.0) for v in vs)) for vs in variants)
        return LabelScores(tuple(labels), probs, usage)

    def _completion(self, choice, text: str, response, latency: float, tokens, decoding: Decoding,
                    prompt_ids) -> Completion:
        reason, stop = choice.finish_reason or "stop", None
        if reason == "stop":
            reason, stop = stop_cause(choice, response, decoding.stop)
        return Completion(text, self._usage(response, latency), tokens, reason, stop, prompt_ids)

    @staticmethod
    def _sampling(decoding: Decoding) -> dict:
        """top-p as the API has it; top-k and the repetition penalty, which it has not, in the request
        body under vLLM's names and llama.cpp server's (`repeat_penalty`); OpenAI's API refuses them."""
        extra = {**({"top_k": decoding.top_k} if decoding.top_k else {}),
                 **({"repetition_penalty": decoding.repetition_penalty, "repeat_penalty": decoding.repetition_penalty}
                    if decoding.repetition_penalty != 1.0 else {})}
        return {**({"top_p": decoding.top_p} if decoding.top_p < 1.0 else {}),
                **({"extra_body": extra} if extra else {})}

    def _template(self):
        """A function rendering messages with the configured template, the assistant turn opened."""
        if getattr(self, "_render_open", None) is None:
            template = self.settings.chat_template
            if template.startswith("gguf:"):
                template = gguf_chat_template(template[len("gguf:"):])
            try:
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ModuleNotFoundError:
                raise MissingDependency("jinja2", "openai") from None

            def raise_exception(message):
                raise ConfigError(f"the chat template refused the conversation: {message}")

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            compiled = env.from_string(template)
            self._render_open = lambda messages: compiled.render(
                messages=[{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True,
                bos_token="", eos_token="", raise_exception=raise_exception)
        return self._render_open

    def check(self, timeout_s: float = 5.0) -> None:
        """Fail in seconds when the server is down or hung, before a run spends minutes of retries
        per question: one `GET {base_url}/models`, no retry. A server that answers 404 there is up."""
        openai, url = self._openai, self.settings.base_url
        if self._circuit is not None:
            raise BackendError(self._circuit, retryable=True)
        try:
            with self._client() as client:
                client.with_options(timeout=timeout_s, max_retries=0).models.list()
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
    def _call(self, endpoint, **kwargs):
        """`endpoint(client)(**kwargs)` and its latency, retried as the module docstring says."""
        openai, settings = self._openai, self.settings

        def attempt():
            if self._circuit is not None:  # not retryable here, so `retrying` stops at once (made so below)
                raise BackendError(self._circuit)
            start = time.perf_counter()
            try:
                with self._client() as client:
                    answer = endpoint(client)(**kwargs), time.perf_counter() - start
            except openai.APITimeoutError as exc:
                self._timed_out()
                raise BackendError(self._circuit or _brief(exc), retryable=self._circuit is None) from None
            except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError) as exc:
                raise BackendError(_brief(exc), retryable=True) from None
            except openai.APIStatusError as exc:
                self._answered()
                if exc.status_code < 500 and exc.status_code != 429:
                    raise BackendError(f"{settings.base_url} refused the request "
                                       f"(HTTP {exc.status_code}): {_brief(exc)}") from None
                raise BackendError(_brief(exc), retryable=True) from None
            self._answered()
            return answer

        try:
            return retrying(attempt, tries=settings.max_retries + 1, backoff_s=settings.backoff_s, jitter=0.1,
                            failed=f"{settings.base_url} did not answer")
        except BackendError:
            if self._circuit is not None:  # a question stopped by the breaker may succeed once the server is back
                raise BackendError(self._circuit, retryable=True) from None
            raise

    def _timed_out(self) -> None:
        """Count a request that got no answer within `timeout_s`; open the breaker at `circuit_timeouts`."""
        with self._idle_lock:
            self._timeouts += 1
            if self._circuit is None and 0 < self.settings.circuit_timeouts <= self._timeouts:
                self._circuit = (f"LLM server at {self.settings.base_url}: {self._timeouts} requests in a row got no "
                                 f"answer within {self.settings.timeout_s:g} s, so no more are sent (it takes "
                                 "requests but does not complete them: hung, or overloaded); restart it and re-run")

    def _answered(self) -> None:
        with self._idle_lock:
            self._timeouts = 0

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


def stop_cause(choice, response, stops: Sequence[str]) -> tuple[str, str | None]:
    """(finish reason, stop string) of a choice the server finished with "stop": ("eos", None) when
    the model ended its turn, ("stop", the string) when a stop string fired, ("stop", None) when
    stop strings were sent and the server does not say which of the two happened."""
    if not stops:
        return "eos", None  # no stop string was asked for: the model ended its turn
    fields = getattr(choice, "model_extra", None) or {}
    if "stop_reason" in fields:  # vLLM: the stop string, a stop token id (an end of turn), or None (EOS)
        value = fields["stop_reason"]
        return ("stop", value) if isinstance(value, str) else ("eos", None)
    verbose = (getattr(response, "model_extra", None) or {}).get("__verbose")
    if isinstance(verbose, dict) and verbose.get("stop_type") in ("eos", "word"):  # llama-server --verbose
        word = verbose.get("stopping_word")
        return ("eos", None) if verbose["stop_type"] == "eos" else ("stop", word if isinstance(word, str) and word
                                                                     else None)
    return "stop", None


def _with_offsets(items) -> tuple[TokenLogprob, ...]:
    """Tokens from (text, log-prob, top) triples, offsets counted along the joined texts."""
    out, offset = [], 0
    for text, logprob, top in items:
        out.append(TokenLogprob(text, logprob, top, None, offset, None))
        offset += len(text)
    return tuple(out)


def gguf_chat_template(path: str) -> str:
    """The chat template stored in a GGUF file's metadata."""
    from metarag.llm.models import check_gguf_path

    checked = check_gguf_path(path)
    try:
        from gguf import GGUFReader
    except ModuleNotFoundError:
        raise MissingDependency("gguf", "hf") from None
    field = GGUFReader(str(checked)).fields.get("tokenizer.chat_template")
    if field is None:
        raise ConfigError(f"{checked} carries no chat template")
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def _brief(exc: Exception | None) -> str:
    text = str(exc) if exc is not None else "no error recorded"
    return text.splitlines()[0][:200] if text else type(exc).__name__
