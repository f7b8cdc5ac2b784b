"""Many requests decoded together in one llama.cpp context: the embedded back-end's `generate_batch`.

On a CPU core, decoding one token of a 1.5B model is bound by reading its weights, so decoding four
sequences a step costs little more than one (`benchmarks/llama_batch.py` measures the ratio). A
`SlotContext` is a second llama.cpp context over the same loaded model, with `slots` sequences in
one unified KV cache of `slots` x `n_ctx` cells (each sequence fits the back-end's own `n_ctx`).
A request takes the slot that already holds the longest prefix of its prompt (an agent's next turn
continues its last one), and requests of one call whose prompts share a longer prefix (the K
samples of one question) share that part's KV cells instead of evaluating it again: the first is
evaluated, the others are given its cells (`llama_memory_seq_cp`) and evaluate only the rest. Then
every live sequence takes one token a step, all in one decode, each by its own request's rule
(`metarag.llm.base`: temperature, top-p, seed, stop strings) until each stops.

What it gives is what the one-request path gives up to the floating-point difference between a
token evaluated alone and in a batch of others (llama.cpp's CPU kernels sum in another order): a
sampled request's tokens are drawn by the same seeded rule from logits that differ in the last
digits, a greedy one may flip a near-tie. So a measurement whose rows must be decoded alike (a
table's greedy rows, its latency columns: a batched request's `latency_s` is the wall time it
waited, shared with the others) runs one request at a time, and batching is for sampled runs
(a difficulty filter's K samples). Prompt-lookup drafts and `prefix_chunk` apply to the one-request
path only.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from metarag.errors import BackendError
from metarag.llm.base import (
    Decoding,
    TokenStream,
    common_prefix,
    entropy_of,
    log_softmax,
    sample_token,
    top_alternatives,
)
from metarag.records import Completion, Usage

SHARE_MIN = 32  # a shared prefix shorter than this is evaluated again rather than copied


@dataclass
class _Request:
    tokens: list[int]
    decoding: Decoding
    slot: int = -1
    keep: int = 0  # leading prompt tokens already in the slot's cells
    donor: int | None = None  # the request whose evaluated prompt lends this one its first `keep` tokens
    start: float = 0.0
    out: list[int] = field(default_factory=list)
    raw: bytes = b""
    logits: np.ndarray | None = None
    rng: np.random.Generator | None = None
    stream: TokenStream | None = None
    budget: int = 0
    done: Completion | None = None


class SlotContext:
    """A llama.cpp context of `slots` sequences over the model of `llm` (a `LlamaCppLLM`), decoding
    several requests in lockstep. Not thread-safe: the back-end calls it under its own lock."""

    def __init__(self, llm, slots: int):
        import llama_cpp
        from llama_cpp._internals import LlamaBatch, LlamaContext

        if slots < 2:
            raise BackendError(f"a batched llama.cpp context needs at least 2 slots, got {slots}")
        self._lib = llama_cpp
        self._owner = llm
        settings = llm.settings
        self.slots = slots
        self.n_ctx = settings.n_ctx  # each sequence's room, as on the one-request path
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = slots * settings.n_ctx
        params.n_batch = params.n_ubatch = settings.n_batch
        params.n_seq_max = slots
        params.kv_unified = True  # one pool of cells: a shared prompt prefix is held once, by several sequences
        threads = llm._llm.n_threads  # the one-request context's thread count (--threads)
        params.n_threads = params.n_threads_batch = threads
        try:
            self._ctx = LlamaContext(model=llm._llm._model, params=params, verbose=False)
        except ValueError as exc:
            raise BackendError(f"llama.cpp could not make a context of {slots} sequences x {settings.n_ctx} "
                               f"tokens: {exc}") from None
        self._apply_adapter(llm._llm)
        self._batch = LlamaBatch(n_tokens=settings.n_batch, embd=0, n_seq_max=1, verbose=False)
        self._n_vocab = llm._n_vocab
        self._held: list[list[int]] = [[] for _ in range(slots)]  # the tokens whose cells each slot holds

    def _apply_adapter(self, loaded) -> None:
        """The LoRA adapter of the one-request context (`LlamaCppSettings.lora`), on this context too:
        llama.cpp sets adapters per context, so without it a batched request of a checkpoint's run would
        be answered by the base model."""
        import ctypes

        adapter = getattr(loaded, "_lora_adapter", None)
        if adapter is None:
            return
        adapters = (self._lib.llama_adapter_lora_p_ctypes * 1)(adapter)
        scales = (ctypes.c_float * 1)(loaded.lora_scale)
        if self._lib.llama_set_adapters_lora(self._ctx.ctx, adapters, 1, scales):
            raise BackendError(f"llama.cpp could not apply the LoRA adapter {loaded.lora_path} to the batched context")

    # ------------------------------------------------------------------------------------ public
    def generate(self, prompts: Sequence[list[int]], decodings: Sequence[Decoding]) -> list[Completion]:
        """One completion per prompt (token ids that fit `n_ctx`), at most `slots` of them."""
        if len(prompts) > self.slots:
            raise BackendError(f"{len(prompts)} requests for a context of {self.slots} sequences")
        start = time.perf_counter()
        requests = [_Request(list(p), d, start=start) for p, d in zip(prompts, decodings)]
        try:
            self._place(requests)
            self._evaluate_prompts(requests)
            self._decode(requests)
        except BaseException:
            self._forget()  # cells half written: no slot's content is known any more
            raise
        return [r.done for r in requests]  # type: ignore[misc]

    # ------------------------------------------------------------------------------- placement
    def _place(self, requests: list[_Request]) -> None:
        """Each request's slot (the free one holding the longest prefix of its prompt) and what it
        keeps there; a request another one of the call shares a longer prefix with borrows it."""
        reuse = [[min(common_prefix(h, r.tokens), len(r.tokens) - 1) for h in self._held] for r in requests]
        free, todo = set(range(self.slots)), set(range(len(requests)))
        while todo:
            j, s = max(((j, s) for j in todo for s in free), key=lambda js: (reuse[js[0]][js[1]], -js[0], -js[1]))
            requests[j].slot, requests[j].keep = s, reuse[j][s]
            todo.discard(j)
            free.discard(s)
        for j, request in enumerate(requests):
            lenders = [(min(common_prefix(requests[i].tokens, request.tokens), len(request.tokens) - 1), i)
                       for i in range(j) if requests[i].donor is None]
            shared, i = max(lenders, default=(0, None))
            if i is not None and shared >= request.keep + SHARE_MIN:
                request.donor, request.keep = i, shared
        memory = self._ctx.memory
        for request in requests:
            cut = 0 if request.donor is not None else request.keep
            self._lib.llama_memory_seq_rm(memory, request.slot, cut, -1)
            self._held[request.slot] = request.tokens[:cut]

    # ---------------------------------------------------------------------------------- prompts
    def _evaluate_prompts(self, requests: list[_Request]) -> None:
        """The prompts' new tokens, lenders first; each request ends with its next-token logits."""
        own = [r for r in requests if r.donor is None]
        self._feed([(r, r.tokens[r.keep:], r.keep) for r in own])
        borrowers = [r for r in requests if r.donor is not None]
        for request in borrowers:
            lender = requests[request.donor]  # type: ignore[index]
            self._lib.llama_memory_seq_cp(self._ctx.memory, lender.slot, request.slot, 0, request.keep)
            self._held[request.slot] = request.tokens[:request.keep]
        self._feed([(r, r.tokens[r.keep:], r.keep) for r in borrowers])
        for request in requests:
            self._held[request.slot] = list(request.tokens)

    def _feed(self, parts: list[tuple[_Request, list[int], int]]) -> None:
        """Evaluate each (request, tokens, first position) in batches of up to n_batch tokens; the
        logits of each part's last token become its request's."""
        queue = [(r, t, p, i == len(tokens) - 1) for r, tokens, pos in parts
                 for i, (t, p) in enumerate(zip(tokens, range(pos, pos + len(tokens))))]
        size = self._batch._n_tokens
        for lo in range(0, len(queue), size):
            chunk = queue[lo:lo + size]
            self._decode_batch([(r.slot, t, p, last) for r, t, p, last in chunk])
            for i, (request, _, _, last) in enumerate(chunk):
                if last:
                    request.logits = self._logits(i)

    # --------------------------------------------------------------------------------- decoding
    def _decode(self, requests: list[_Request]) -> None:
        live = []
        for request in requests:
            request.rng = np.random.default_rng(request.decoding.seed)
            request.stream = TokenStream(request.decoding.stop)
            request.budget = min(request.decoding.max_tokens, self.n_ctx - len(request.tokens) - 1)
            if request.budget <= 0:
                self._finish(request, eos=False)
            else:
                live.append(request)
        while live:
            step = []
            for request in live:
                if self._take(request):
                    step.append(request)
            if step:
                self._decode_batch([(r.slot, r.out[-1], len(r.tokens) + len(r.out) - 1, True) for r in step])
                for i, request in enumerate(step):
                    request.logits = self._logits(i)
                    self._held[request.slot].append(request.out[-1])
                    if len(request.out) >= request.budget:
                        self._finish(request, eos=False)
            live = [r for r in step if r.done is None]

    def _take(self, request: _Request) -> bool:
        """Sample the request's next token; True when it goes on (the token is to be evaluated)."""
        decoding = request.decoding
        history = request.tokens + request.out if decoding.repetition_penalty != 1.0 else ()
        token = sample_token(request.logits, decoding, request.rng, history)  # type: ignore[arg-type]
        if self._lib.llama_vocab_is_eog(self._owner._vocab, token):
            self._finish(request, eos=True)
            return False
        lp = log_softmax(request.logits)  # type: ignore[arg-type]
        piece = self._owner._llm.detokenize([token], prev_tokens=request.tokens + request.out, special=True)
        request.out.append(token)
        request.raw += piece
        top = top_alternatives(lp, decoding.logprobs, self._owner._piece)
        if request.stream.push(token, piece.decode("utf-8", errors="replace"),  # type: ignore[union-attr]
                               request.raw.decode("utf-8", errors="ignore"), float(lp[token]), top, entropy_of(lp)):
            self._finish(request, eos=False)  # a stop string: the token that completed it is not evaluated
            return False
        return True

    def _finish(self, request: _Request, eos: bool) -> None:
        text, finish, stop = request.stream.finish(ended_by_eos=eos)  # type: ignore[union-attr]
        # cached: the prompt tokens this request did not evaluate (its slot's, or a lender's of this call)
        usage = Usage(prompt_tokens=len(request.tokens), completion_tokens=len(request.out),
                      cached_tokens=request.keep, latency_s=time.perf_counter() - request.start, llm_requests=1)
        request.done = Completion(text, usage, tuple(request.stream.tokens),  # type: ignore[union-attr]
                                  finish, stop, tuple(request.tokens))

    # ---------------------------------------------------------------------------------- llama.cpp
    def _decode_batch(self, items: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (slot, token, position, wants logits) items."""
        batch = self._batch.batch
        batch.n_tokens = len(items)
        for i, (slot, token, pos, logits) in enumerate(items):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.seq_id[i][0] = slot
            batch.n_seq_id[i] = 1
            batch.logits[i] = logits
        status = self._lib.llama_decode(self._ctx.ctx, batch)
        if status != 0:
            raise BackendError(f"llama.cpp failed to decode a batch of {len(items)} tokens over "
                               f"{len({s for s, *_ in items})} sequences (status {status})")

    def _logits(self, i: int) -> np.ndarray:
        ptr = self._lib.llama_get_logits_ith(self._ctx.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).astype(np.float32, copy=True)

    def _forget(self) -> None:
        self._lib.llama_memory_clear(self._ctx.memory, True)
        self._held = [[] for _ in range(self.slots)]

