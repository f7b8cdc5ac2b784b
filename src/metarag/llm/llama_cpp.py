"""The embedded default back-end: a GGUF model run in-process by llama.cpp (llama-cpp-python).

Decoding is done here token by token from the context's logits, so every request can return token
log-probabilities and next-token label probabilities without `logits_all` (which would store a
vocabulary-sized row per prompt token). KV-cache reuse: a request whose prompt shares a prefix with
the state in the context evaluates only the new tokens; beyond that, the states after the last few
distinct prompts are kept in memory (`prefix_cache_mb`), so alternating between two evidence
prompts does not recompute either. Put passages first and the varying part last to benefit.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from metarag.errors import BackendError, ConfigError, MissingDependency
from metarag.llm.base import (
    Decoding,
    Prompt,
    TokenIds,
    TokenStream,
    common_prefix,
    entropy_of,
    label_plan,
    label_probs,
    log_softmax,
    prompt_ids,
    render_continuing,
    sample_token,
    top_alternatives,
)
from metarag.llm.models import check_gguf_path, embedded_model, ensure_gguf, file_sha256
from metarag.records import Completion, LabelScores, Message, Usage


@dataclass(frozen=True)
class LlamaCppSettings:
    """How to load and run a GGUF. `embedded` names a model carried by PyPI wheels
    (`metarag.llm.models.EMBEDDED_MODELS`); `gguf` is any other GGUF file by path and wins when
    given. `n_threads` (None: all cores) runs both the decoding and the prompt's evaluation.
    `prefix_cache_mb` bounds the saved KV states.

    `lookup_tokens` > 0 turns on prompt-lookup decoding for greedy requests: after each token, the
    last `lookup_ngram` tokens (then shorter, down to `lookup_min_ngram`) are looked up earlier in the
    prompt and output, the up to
    `lookup_tokens` tokens that followed there are evaluated in one batch with the new token, and
    every draft the greedy choice confirms is taken without a decode step of its own. A draft only
    saves work, it never chooses a token: the output is the greedy output, up to the floating-point
    difference between a batched and a one-token evaluation (`benchmarks/prompt_lookup.py` counts
    differing outputs and the speed-up). Sampled requests decode one token at a time.

    `prefix_chunk` > 0 makes KV-cache reuse exact: llama.cpp's numbers for a prompt token depend on
    the batch it was evaluated in, so a prompt whose first part came from the cache (evaluated with an
    earlier prompt, in other batches) gets different logits than the same prompt evaluated afresh —
    up to 0.2 in a logit on the 0.5B (`benchmarks/prefix_chunk.py`), enough to flip a greedy token,
    so a method's answer to a question can depend on which questions, methods or resumes came before
    it in the process. With `prefix_chunk` = C every prompt is evaluated in batches that end at
    multiples of C counted from the first token, and only the whole chunks of an earlier prompt (never
    its last partial chunk, never generated tokens) are reused: each prompt's logits are then those of
    a fresh evaluation, bit for bit, whatever ran before. The cost is up to C − 1 recomputed tokens per
    request. Off (0) by default for now, so the cached responses and kept runs of earlier sessions stay
    valid; on, it is part of the model's identity (the response cache keeps its answers apart) and of
    the run id.

    `lora` applies a LoRA adapter on top of the GGUF: a llama.cpp GGUF adapter file, or a PEFT adapter
    folder (a `train-agent` checkpoint), converted once (`llm/lora.py`). The adapter's sha256 joins the
    model's identity. The base stays quantized and the adapter is added in float32, so the trained
    update is applied exactly; but any non-zero adapter moves llama.cpp's int8 rounding of the
    activations, a change of ~0.09 in a logit on the 1.5B whatever the adapter's size (an adapter of
    zeros changes nothing; docs/notes/2026-12-04-training-that-learns-on-the-cpu.md measures both), so
    an adapter's effect below that is seen through that noise.

    `batch_slots` > 1 gives the back-end `generate_batch`: the requests of one round of `run_many`
    (`eval --batch N`) are decoded together, up to this many at a time, in a second context of as
    many sequences (`llm/llama_slots.py`; a single request still takes the one-request path). Off (0)
    by default: a batched request's numbers differ from a lone one's in the last digits, and its
    latency is shared, so greedy tables and their cost columns decode one request at a time. Not part
    of the identity: it changes how fast a sampled run goes, not what it samples from."""

    embedded: str | None = "qwen2.5-coder-1.5b-instruct"
    gguf: str | None = None
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    prefix_cache_mb: int = 1024
    min_cached_prefix: int = 64  # shorter prompts are cheap to recompute: not worth a saved state
    lookup_tokens: int = 0
    lookup_ngram: int = 3
    lookup_min_ngram: int = 2
    prefix_chunk: int = 0
    lora: str | None = None
    batch_slots: int = 0

    def __post_init__(self) -> None:
        if self.batch_slots < 0:
            raise ConfigError(f"batch_slots must be 0 (off) or at least 2, got {self.batch_slots}")
        if self.prefix_chunk < 0 or self.prefix_chunk > self.n_batch:
            raise ConfigError(f"prefix_chunk must be 0 (off) or 1..n_batch ({self.n_batch}), got {self.prefix_chunk}")


def same_threads_for_torch(threads: int) -> None:
    """`--threads N` for the whole run, torch too: a llama.cpp run loads torch only for MiniLM (EvoCtx's
    boundary judge, dense retrieval, the rerankers), which would otherwise take every core, and its threads
    beside another run's on a shared core wait on each other. Before torch is imported, the variable it reads
    when it is (OMP_NUM_THREADS, unless already set); after, `torch.set_num_threads`."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    else:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


class LlamaCppLLM:
    """The LLM protocol over llama.cpp, with the GGUF's own chat template."""

    provides = frozenset({"token_logprobs", "token_entropy"})

    def __init__(self, settings: LlamaCppSettings = LlamaCppSettings()):
        if settings.gguf:
            path = check_gguf_path(settings.gguf)
        elif settings.embedded:
            path = ensure_gguf(embedded_model(settings.embedded))
        else:
            raise ConfigError("the llama.cpp back-end needs an embedded model name or a GGUF path")
        try:
            import llama_cpp
        except ModuleNotFoundError:
            raise MissingDependency("llama-cpp-python", "embedded") from None
        self._lib = llama_cpp
        self.settings = settings
        self.path = path
        self.model_sha256 = file_sha256(path)
        self.identity = self.identity_for(settings, self.model_sha256)
        adapter = None
        if settings.lora:
            from metarag.llm.lora import check_adapter, gguf_adapter, probe_adapter

            adapter = gguf_adapter(settings.lora, path)
            check_adapter(adapter, path)  # what llama.cpp would crash on, refused by its metadata
            probe_adapter(adapter, path)  # the first decode, in a child process: a crash there is one line
        self._clean = 0  # the context's leading positions evaluated in whole aligned chunks (prefix_chunk)
        if settings.n_threads:
            same_threads_for_torch(settings.n_threads)
        try:
            threads = settings.n_threads or os.cpu_count()
            # n_threads_batch too: llama-cpp-python's own default for it is every core, so `--threads 1`
            # would still spread each prompt's evaluation over the whole machine
            self._llm = llama_cpp.Llama(model_path=str(path), n_ctx=settings.n_ctx, n_batch=settings.n_batch,
                                        n_threads=threads, n_threads_batch=threads, verbose=False,
                                        **({"lora_path": str(adapter)} if adapter else {}))
        except (ValueError, RuntimeError) as exc:
            raise BackendError(f"llama.cpp could not load {path}{f' with the adapter {adapter}' if adapter else ''}: "
                               f"{exc}") from None
        self._vocab = self._llm._model.vocab
        self._n_vocab = self._llm.n_vocab()
        self._formatter = self._chat_formatter()
        self._states: OrderedDict[tuple[int, ...], bytes] = OrderedDict()
        self.lookup_stats = {"drafted": 0, "accepted": 0}  # prompt-lookup drafts proposed and taken
        self._state_bytes = 0
        # one context, one request at a time: harness workers > 1 queue here instead of corrupting it
        self._lock = threading.Lock()
        self._slots = None  # the batched context (llama_slots.SlotContext), made on the first batch
        if settings.batch_slots > 1:  # offered only when asked for: `generate_many` batches whatever offers it
            self.generate_batch = self._generate_batch
            self.check_prompt = self._prompt_tokens

    @staticmethod
    def identity_for(settings: LlamaCppSettings, model_sha256: str | None = None) -> str:
        """The identity a model of these settings has (what the response cache and a run's manifest
        know it by), computed without loading it: an embedded model's sha256 is its registry's (the
        assembled file is checked against it), a GGUF path's is read (remembered beside the file)."""
        if settings.gguf:
            path = check_gguf_path(settings.gguf)
            name, sha = path.name, model_sha256 or file_sha256(path)
        elif settings.embedded:
            model = embedded_model(settings.embedded)
            name, sha = model.name, model_sha256 or model.sha256
        else:
            raise ConfigError("the llama.cpp back-end needs an embedded model name or a GGUF path")
        identity = f"llama.cpp:{name}:sha256={sha[:16]}"
        if settings.prefix_chunk:  # exact reuse gives other (fresh-evaluation) numbers: kept apart in the cache
            identity += f":prefix_chunk={settings.prefix_chunk}"
        if settings.lora:
            from metarag.llm.lora import adapter_sha256

            identity += f":lora={adapter_sha256(settings.lora)[:16]}"
        return identity

    # -------------------------------------------------------------------------------- protocol
    def complete(self, prompt: str | TokenIds, decoding: Decoding = Decoding()) -> Completion:
        tokens = self._check_fits(list(prompt.ids)) if isinstance(prompt, TokenIds) else self.tokenize(prompt)
        with self._lock:
            return self._generate(tokens, decoding)

    def chat(self, messages: Sequence[Message], decoding: Decoding = Decoding()) -> Completion:
        with self._lock:
            return self._generate(self.tokenize(self.render(messages)), decoding)

    def _generate_batch(self, prompts: Sequence[Prompt], decodings: Sequence[Decoding]) -> list[Completion]:
        """The completions of several requests decoded together (`batch_slots` at a time); one request
        alone takes the one-request path."""
        if len(prompts) != len(decodings):
            raise ValueError(f"{len(prompts)} prompts but {len(decodings)} decodings")
        tokens = [self._prompt_tokens(p) for p in prompts]
        with self._lock:
            if len(tokens) == 1:
                return [self._generate(tokens[0], decodings[0])]
            if self._slots is None:
                from metarag.llm.llama_slots import SlotContext

                self._slots = SlotContext(self, self.settings.batch_slots)
            out: list[Completion] = []
            for lo in range(0, len(tokens), self._slots.slots):
                out += self._slots.generate(tokens[lo:lo + self._slots.slots], decodings[lo:lo + self._slots.slots])
            return out

    def _prompt_tokens(self, prompt: Prompt) -> list[int]:
        """The token ids `generate` would feed for `prompt`, checked to fit the context."""
        return prompt_ids(prompt, self.tokenize, self.render, self._check_fits)

    def score_labels(self, prompt: Prompt, labels: Sequence[str]) -> LabelScores:
        """Whole-label probabilities by the shared rule (`metarag.llm.base.label_plan`): each
        label's variants teacher-forced after the prompt, their token probabilities multiplied."""
        plans = label_plan(labels, self._label_tokens)
        tokens = self._prompt_tokens(prompt)
        start = time.perf_counter()
        with self._lock:
            cached = self._evaluate(tokens)
            root = self._logprobs()
            state = {"after": ()}  # the label tokens in the context after the prompt

            def next_logprobs(prefix: tuple[int, ...]) -> np.ndarray:
                if not prefix:
                    return root
                keep = min(common_prefix(state["after"], prefix), len(prefix) - 1)
                self._llm.n_tokens = len(tokens) + keep  # back to the shared part, then the new tokens
                self._llm.eval(list(prefix[keep:]))
                state["after"] = prefix
                return self._logprobs()

            probs = label_probs(plans, next_logprobs)
        usage = Usage(prompt_tokens=len(tokens), cached_tokens=cached,
                      latency_s=time.perf_counter() - start, llm_requests=1)
        return LabelScores(tuple(labels), probs, usage)

    # ------------------------------------------------------------------------------ templating
    def render(self, messages: Sequence[Message]) -> str:
        """Messages rendered with the GGUF's chat template, the assistant turn opened (a final
        assistant message is continued)."""
        return render_continuing(messages, self._render_open)

    def _render_open(self, messages: Sequence[Message]) -> str:
        return self._formatter(messages=[{"role": m.role, "content": m.content} for m in messages]).prompt

    def tokenize(self, text: str) -> list[int]:
        """Token ids of a prompt text (BOS added where the model uses one, special tokens parsed)."""
        return self._check_fits(self._llm.tokenize(text.encode("utf-8"), add_bos=True, special=True))

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids, special tokens spelled out (as the transformers back-end decodes them)."""
        return self._llm.detokenize(list(ids), special=True).decode("utf-8", errors="replace")

    def piece_tokens(self, text: str) -> list[int]:
        """Token ids of a piece of text inside a sequence: no BOS, special tokens not parsed."""
        return self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)

    def _label_tokens(self, label: str) -> list[int]:
        # special tokens parsed: a label that is one of the vocabulary's added special tokens (Self-RAG's
        # "[Retrieval]", "[Relevant]" ...) is that one token, not its spelling's bytes
        return self._llm.tokenize(label.encode("utf-8"), add_bos=False, special=True)

    def _check_fits(self, tokens: list[int]) -> list[int]:
        if len(tokens) >= self.settings.n_ctx:
            raise BackendError(f"prompt of {len(tokens)} tokens does not fit the context of "
                               f"{self.settings.n_ctx} tokens (raise --n-ctx or retrieve fewer passages)")
        if not tokens:
            raise BackendError("the prompt has no tokens")
        return tokens

    def _chat_formatter(self):
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self._llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise BackendError(f"{self.path} carries no chat template; use complete() with a raw prompt")
        model = self._llm._model
        eos, bos = self._llm.token_eos(), self._llm.token_bos()
        return Jinja2ChatFormatter(template=template,
                                   eos_token=model.token_get_text(eos) if eos != -1 else "",
                                   bos_token=model.token_get_text(bos) if bos != -1 else "",
                                   add_generation_prompt=True)

    # -------------------------------------------------------------------------------- decoding
    def _generate(self, tokens: list[int], decoding: Decoding) -> Completion:
        """The shared stop, sampling and token rules (`metarag.llm.base`), token by token."""
        start = time.perf_counter()
        cached = self._evaluate(tokens)
        budget = min(decoding.max_tokens, self.settings.n_ctx - len(tokens) - 1)
        rng = np.random.default_rng(decoding.seed)
        out: list[int] = []
        raw = b""
        stream = TokenStream(decoding.stop)
        eos = False
        lookup = self.settings.lookup_tokens if decoding.temperature <= 0 else 0
        ahead: list[tuple[int, np.ndarray]] = []  # drafts already in the context, each with its logits
        logits = self._logits()
        while len(out) < budget:
            token = sample_token(logits, decoding, rng, tokens + out if decoding.repetition_penalty != 1.0 else ())
            if ahead and ahead[0][0] != token:  # a draft the greedy choice rejects: drop it and the rest
                self._llm.n_tokens = len(tokens) + len(out)
                ahead = []
            if self._lib.llama_vocab_is_eog(self._vocab, token):
                eos = True
                break
            lp = log_softmax(logits)
            piece = self._llm.detokenize([token], prev_tokens=tokens + out, special=True)
            out.append(token)
            raw += piece
            top = top_alternatives(lp, decoding.logprobs, self._piece)
            if stream.push(token, piece.decode("utf-8", errors="replace"), raw.decode("utf-8", errors="ignore"),
                           float(lp[token]), top, entropy_of(lp)):
                break
            if ahead:  # the draft was right: its logits were computed with the batch
                logits = ahead.pop(0)[1]
                self.lookup_stats["accepted"] += 1
                continue
            drafts = prompt_lookup(tokens + out, lookup, self.settings.lookup_ngram, budget - len(out) - 1,
                                   self.settings.lookup_min_ngram) if lookup else []
            if drafts:
                self.lookup_stats["drafted"] += len(drafts)
                rows = self._eval_rows([token, *drafts])
                logits, ahead = rows[0], list(zip(drafts, rows[1:]))
            else:
                self._llm.eval([token])
                logits = self._logits()
        if ahead:  # drafts evaluated past the last token taken: the context ends at that token
            self._llm.n_tokens = len(tokens) + len(out)
        text, finish, stop = stream.finish(ended_by_eos=eos)
        usage = Usage(prompt_tokens=len(tokens), completion_tokens=len(out), cached_tokens=cached,
                      latency_s=time.perf_counter() - start, llm_requests=1)
        return Completion(text, usage, tuple(stream.tokens), finish, stop, tuple(tokens))

    def _evaluate(self, tokens: list[int]) -> int:
        """Bring the context to the state after `tokens`, recomputing as little as possible; returns
        how many prompt tokens were reused from the KV cache."""
        llm = self._llm
        chunk = self.settings.prefix_chunk
        reusable = self._reusable(llm._input_ids.tolist(), tokens, self._clean)
        saved = self._best_saved(tokens)
        if saved is not None and self._reusable(saved, tokens, aligned_floor(len(saved), chunk)) > reusable:
            self._restore(saved)
            reusable = self._reusable(saved, tokens, aligned_floor(len(saved), chunk))
        reused = min(reusable, len(tokens) - 1)  # one token is always evaluated to produce fresh logits
        if chunk:
            reused = aligned_floor(reused, chunk)
        llm.n_tokens = reused  # Llama.eval drops the KV cache from n_tokens on
        try:
            for start, end in aligned_spans(reused, len(tokens), chunk):
                llm.eval(tokens[start:end])
        except RuntimeError as exc:
            raise BackendError(f"llama.cpp failed to evaluate the prompt: {exc}") from None
        self._clean = aligned_floor(len(tokens), chunk) if chunk else 0
        if len(tokens) >= self.settings.min_cached_prefix:
            self._save(tokens)
        return reused

    def _reusable(self, context: Sequence[int], tokens: Sequence[int], clean: int) -> int:
        """How many leading tokens of `tokens` a context holding `context` can give: the common
        prefix, and with `prefix_chunk` only within the context's whole aligned chunks."""
        n = common_prefix(context, tokens)
        return min(n, clean) if self.settings.prefix_chunk else n

    def _eval_rows(self, batch: list[int]) -> list[np.ndarray]:
        """Evaluate `batch` after the context in one decode, with the logits of every position (the
        one-token `eval` keeps only the last)."""
        llm = self._llm
        llm._ctx.kv_cache_seq_rm(-1, llm.n_tokens, -1)
        n_past = llm.n_tokens
        llm._batch.set_batch(batch=batch, n_past=n_past, logits_all=True)
        try:
            llm._ctx.decode(llm._batch)
        except RuntimeError as exc:
            raise BackendError(f"llama.cpp failed to evaluate a draft: {exc}") from None
        llm.input_ids[n_past:n_past + len(batch)] = batch
        llm.n_tokens = n_past + len(batch)
        ctx = llm._ctx.ctx
        return [np.ctypeslib.as_array(self._lib.llama_get_logits_ith(ctx, i), shape=(self._n_vocab,))
                .astype(np.float32, copy=True) for i in range(len(batch))]

    def _logits(self) -> np.ndarray:
        ptr = self._lib.llama_get_logits_ith(self._llm._ctx.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).astype(np.float32, copy=True)

    def _logprobs(self, logits: np.ndarray | None = None) -> np.ndarray:
        return log_softmax(self._logits() if logits is None else logits)

    def _piece(self, token: int) -> str:
        return self._llm.detokenize([token], special=True).decode("utf-8", errors="replace")

    # ----------------------------------------------------------------------- saved KV states
    def _best_saved(self, tokens: list[int]) -> tuple[int, ...] | None:
        best, best_len = None, 0
        for key in self._states:
            n = common_prefix(key, tokens)
            if n > best_len:
                best, best_len = key, n
        return best

    def _save(self, tokens: list[int]) -> None:
        key = tuple(tokens)
        if key in self._states:
            self._states.move_to_end(key)
            return
        ctx = self._llm._ctx.ctx
        size = self._lib.llama_state_get_size(ctx)
        buffer = (ctypes.c_uint8 * size)()
        n = self._lib.llama_state_get_data(ctx, buffer, size)
        state = bytes(buffer[:n]) if n < size else bytes(buffer)
        self._states[key] = state
        self._state_bytes += len(state)
        limit = self.settings.prefix_cache_mb << 20
        while self._state_bytes > limit and len(self._states) > 1:
            _, old = self._states.popitem(last=False)
            self._state_bytes -= len(old)

    def _restore(self, key: tuple[int, ...]) -> None:
        state = self._states[key]
        self._states.move_to_end(key)
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if self._lib.llama_state_set_data(self._llm._ctx.ctx, buffer, len(state)) != len(state):
            raise BackendError("llama.cpp could not restore a saved KV state")
        self._llm.input_ids[: len(key)] = key
        self._llm.n_tokens = len(key)


def prompt_lookup(ids: Sequence[int], k: int, ngram: int, room: int, min_ngram: int = 1) -> list[int]:
    """Prompt-lookup drafts (Saxena, 2023): the up to `k` (and `room`) tokens that followed the latest
    earlier occurrence of the sequence's last `ngram` tokens, trying shorter n-grams down to
    `min_ngram` when a longer one does not occur; [] when none does."""
    k = min(k, room)
    if k <= 0 or len(ids) < 2:
        return []
    seq = np.asarray(ids, dtype=np.int64)
    for n in range(min(ngram, len(seq) - 1), max(min_ngram, 1) - 1, -1):
        tail = seq[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)  # every n-gram that has a successor
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return seq[start:start + k].tolist()
    return []


def aligned_floor(n: int, chunk: int) -> int:
    """`n` rounded down to a multiple of `chunk` (0: no chunking, `n` itself)."""
    return n - n % chunk if chunk else n


def aligned_spans(start: int, end: int, chunk: int) -> list[tuple[int, int]]:
    """The batches that evaluate positions start..end-1: with `chunk`, each ends at the next multiple
    of `chunk` counted from position 0 (or at `end`); without, one span (llama-cpp-python splits it
    by n_batch itself)."""
    if start >= end:
        return []
    if not chunk:
        return [(start, end)]
    spans = []
    while start < end:
        stop = min(end, (start // chunk + 1) * chunk)
        spans.append((start, stop))
        start = stop
    return spans

