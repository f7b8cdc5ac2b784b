"""The transformers back-end: any Hugging Face causal LM, or the embedded Qwen GGUFs read through
transformers' GGUF reader (dequantized), run by torch on the CPU, or the GPU when torch sees one.

The back-end training uses: it wraps a live model (`HFLLM.from_model`), returns token ids, log-probs
and entropy for every generated token, attention weights and hidden states when a request asks
(`Decoding.attentions` / `hidden_states`: one teacher-forced pass over prompt and output, in
`Completion.internals`), and runs many prompts as one left-padded batch (`generate_batch`,
`score_labels_batch`), each row starting from the stored key/value states of the longest prefix an
earlier request shares with it (`metarag.llm.prefix_kv`). Decoding follows the shared rules of
`metarag.llm.base` token by token, every row of the batch at once, the next tokens picked in torch on
the model's device (`HFSettings.sampling`), so greedy output matches the llama.cpp back-end's rules
exactly (not necessarily its tokens: the GGUF here is dequantized to float, llama.cpp computes in its
quantized types). Its settings and model files are `metarag.llm.hf_loading`'s; the
next-token pickers, `metarag.llm.hf_sampling`'s.
"""
from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from metarag.errors import BackendError, ConfigError
from metarag.llm.base import (
    Decoding,
    Internals,
    Prompt,
    TokenIds,
    TokenStream,
    label_plan,
    label_prefixes,
    label_probs,
    log_softmax,
    prompt_ids,
    render_continuing,
)
from metarag.llm.hf_loading import (
    MODEL_FILES,
    PICKLE_SUFFIXES,
    SAMPLING_PLACES,
    WEIGHT_SUFFIXES,
    HFSettings,
    _device,
    _dtype,
    _resolve,
    _torch,
    folder_sha256,
    meta_model,
)
from metarag.llm.hf_sampling import DeviceSampler, HostSampler, Picked
from metarag.llm.prefix_kv import PrefixKV, common_prefix
from metarag.records import Completion, LabelScores, Message, Usage

__all__ = ["HFLLM", "HFSettings", "MODEL_FILES", "PICKLE_SUFFIXES", "SAMPLING_PLACES", "WEIGHT_SUFFIXES",
           "DeviceSampler", "HostSampler", "Picked", "folder_sha256", "meta_model"]


class HFLLM:
    """The LLM protocol over a transformers causal LM and its tokenizer (with its chat template)."""

    provides = frozenset({"token_logprobs", "token_entropy", "attentions", "hidden_states"})

    def __init__(self, settings: HFSettings = HFSettings()):
        torch, transformers = _torch()
        path, name, sha = _resolve(settings)
        device = _device(torch, settings.device)
        dtype = _dtype(torch, settings.dtype, device)
        if settings.n_threads:
            torch.set_num_threads(settings.n_threads)
        kwargs: dict[str, Any] = {}
        folder = path
        if path.is_file():  # a GGUF: transformers reads it from its folder by file name
            folder, kwargs["gguf_file"] = path.parent, path.name
        elif not settings.trust_pickle:
            kwargs["use_safetensors"] = True  # never unpickle a shared folder's weights
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), **kwargs)
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(folder), dtype=dtype, attn_implementation=settings.attn_implementation, **kwargs)
        except (OSError, ValueError, RuntimeError, ImportError) as exc:
            raise BackendError(f"transformers could not load {path}: {str(exc).splitlines()[0][:300]}") from None
        model.to(device)
        # the numbers depend on the dtype and device too: a GPU bf16 run never gets a CPU fp32 run's answers
        dtype_name = str(dtype).removeprefix("torch.")
        autocast = "+autocast-bf16" if settings.autocast else ""
        self._setup(model, tokenizer, f"hf:{name}:sha256={sha[:16]}:{dtype_name}{autocast}@{device.type}", settings)
        self.path = path
        self.model_sha256 = sha

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, *, identity: str, settings: HFSettings | None = None) -> HFLLM:
        """Wrap an in-memory model and tokenizer (a trainer's live policy). `identity` names the
        weights (e.g. a checkpoint's hash): assign `llm.identity` again whenever they change, so the
        response cache never serves an old checkpoint's answers."""
        if not identity:
            raise ConfigError("HFLLM.from_model needs an identity naming the weights")
        _torch()
        llm = cls.__new__(cls)
        llm._setup(model, tokenizer, identity, settings or HFSettings(embedded=None))
        llm.path = None
        llm.model_sha256 = None
        return llm

    def _setup(self, model: Any, tokenizer: Any, identity: str, settings: HFSettings) -> None:
        self._torch_mod, _ = _torch()
        self.model, self.tokenizer = model, tokenizer
        self._lock = threading.Lock()
        self.prefix = PrefixKV(settings.prefix_cache_tokens) if settings.prefix_cache_tokens else None
        self._storable = True  # False once the model's cache is found to keep less than whole sequences
        self.identity = identity
        self.settings = settings
        eos = set()
        for source in (getattr(tokenizer, "eos_token_id", None),
                       getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
            if isinstance(source, int):
                eos.add(source)
            elif source:
                eos.update(int(t) for t in source)
        for special in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            tid = tokenizer.convert_tokens_to_ids(special) if special in tokenizer.get_vocab() else None
            if isinstance(tid, int) and tid >= 0:
                eos.add(tid)
        if not eos:
            raise ConfigError("the tokenizer names no end-of-sequence token")
        self._eos = frozenset(eos)
        self._pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
        # transformers 5.x names the KV cache `cache`; 4.x `past_key_values`
        self._cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @contextlib.contextmanager
    def _inference(self):
        """One request at a time, in eval mode (no dropout), without gradients; a live model being
        trained gets its training mode back afterwards."""
        torch = self._torch_mod
        precision = torch.autocast(self.device.type, dtype=torch.bfloat16) if self.settings.autocast \
            else contextlib.nullcontext()
        with self._lock, torch.no_grad(), precision:
            training = self.model.training
            self.model.eval()
            try:
                yield
            finally:
                self.model.train(training)

    @property
    def device(self):
        return next(self.model.parameters()).device

    @property
    def identity(self) -> str:
        return self._identity

    @identity.setter
    def identity(self, value: str) -> None:
        """New weights under this name: the stored key/value states were another model's (cleared
        between requests, never under one)."""
        with self._lock:
            self._identity = value
            if self.prefix is not None:
                self.prefix.clear()

    # -------------------------------------------------------------------------------- protocol
    def complete(self, prompt: str | TokenIds, decoding: Decoding = Decoding()) -> Completion:
        return self.generate_batch([prompt], [decoding])[0]

    def chat(self, messages: Sequence[Message], decoding: Decoding = Decoding()) -> Completion:
        return self.generate_batch([tuple(messages)], [decoding])[0]

    def score_labels(self, prompt: Prompt, labels: Sequence[str]) -> LabelScores:
        """Whole-label probabilities by the shared rule (`metarag.llm.base.label_plan`)."""
        return self.score_labels_batch([prompt], labels)[0]

    def render(self, messages: Sequence[Message]) -> str:
        """Messages rendered with the tokenizer's chat template, the assistant turn opened (a final
        assistant message is continued)."""
        return render_continuing(messages, self._render_open)

    def _render_open(self, messages: Sequence[Message]) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise BackendError("the tokenizer carries no chat template; use complete() with a raw prompt")
        return self.tokenizer.apply_chat_template([{"role": m.role, "content": m.content} for m in messages],
                                                  tokenize=False, add_generation_prompt=True)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of a prompt text (special tokens in the text parsed; BOS where the tokenizer adds one)."""
        bos = getattr(self.tokenizer, "bos_token", None)
        add = not (bos and text.startswith(bos))
        return self._check_fits(list(self.tokenizer.encode(text, add_special_tokens=add)))

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def piece_tokens(self, text: str) -> list[int]:
        """Token ids of a piece of text inside a sequence: no BOS or other special tokens added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # ----------------------------------------------------------------------------- batching
    def check_prompt(self, prompt: Prompt) -> None:
        """Raise the error this prompt alone would fail a batch with (longer than the context, no chat
        template), so that `metarag.llm.batch` batches only the prompts that pass."""
        self._prompt_ids(prompt)

    def generate_batch(self, prompts: Sequence[Prompt], decodings: Sequence[Decoding]) -> list[Completion]:
        """One completion per prompt, decoded together as one left-padded batch. Each completion's
        latency is its share of the batch's wall time, so a trace's sum is the time spent."""
        if len(prompts) != len(decodings):
            raise ConfigError(f"{len(prompts)} prompts but {len(decodings)} decodings")
        if not prompts:
            return []
        rows = [self._prompt_ids(p) for p in prompts]
        start = time.perf_counter()
        with self._inference():
            streams, eos, outs = self._decode(rows, decodings)
            internals = [self._internals(row + out, len(row), d) if (d.attentions or d.hidden_states) else None
                         for row, out, d in zip(rows, outs, decodings)]
        share = (time.perf_counter() - start) / len(rows)
        completions = []
        for row, stream, ended, out, inside in zip(rows, streams, eos, outs, internals):
            text, finish, stop = stream.finish(ended_by_eos=ended)
            usage = Usage(prompt_tokens=len(row), completion_tokens=len(out), latency_s=share, llm_requests=1)
            completions.append(Completion(text, usage, tuple(stream.tokens), finish, stop, tuple(row), inside))
        return completions

    def score_labels_batch(self, prompts: Sequence[Prompt], labels: Sequence[str]) -> list[LabelScores]:
        """The label scores of every prompt against the same labels: one padded forward pass over
        each prompt followed by each label-token prefix the rule needs."""
        plans = label_plan(labels, self._label_tokens)
        prefixes = label_prefixes(plans)
        rows = [self._prompt_ids(p) for p in prompts]
        start = time.perf_counter()
        sequences = [row + list(prefix) for row in rows for prefix in prefixes]
        with self._inference():
            last = self._last_logprobs(sequences)
        share = (time.perf_counter() - start) / max(len(rows), 1)
        out = []
        for i, row in enumerate(rows):
            dists = {prefix: last[i * len(prefixes) + j] for j, prefix in enumerate(prefixes)}
            probs = label_probs(plans, dists.__getitem__)
            out.append(LabelScores(tuple(labels), probs, Usage(prompt_tokens=len(row), latency_s=share,
                                                               llm_requests=1)))
        return out

    # -------------------------------------------------------------------------------- internals
    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        return prompt_ids(prompt, self.tokenize, self.render, self._check_fits)

    def _label_tokens(self, label: str) -> list[int]:
        return list(self.tokenizer.encode(label, add_special_tokens=False))

    def _check_fits(self, tokens: list[int]) -> list[int]:
        if not tokens:
            raise BackendError("the prompt has no tokens")
        if len(tokens) >= self.settings.n_ctx:
            raise BackendError(f"prompt of {len(tokens)} tokens does not fit the context of "
                               f"{self.settings.n_ctx} tokens (raise --n-ctx or retrieve fewer passages)")
        return tokens

    def _last_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
        result, _, _, columns = self._prefill(sequences)
        self._store(sequences, columns, result)
        return [log_softmax(row) for row in result.logits[:, -1, :].float().cpu().numpy()]

    def _prefill(self, rows: Sequence[Sequence[int]]):
        """One forward pass over the rows' prompts, left-padded, each row's longest stored prefix
        (`self.prefix`) given as the cache instead of run again; the G rows of one group share a
        prefix no row has stored yet (the instructions and the question): it runs once first.
        Returns the model's output, the attention mask and positions to continue from, and each
        row's cache columns (where its prompt tokens' states sit in the output's cache)."""
        torch = self._torch_mod
        if self.prefix is not None and self._storable and len(rows) > 1:
            self._share_common_prefix(rows)
        reuse = [self.prefix.match(r) if self.prefix is not None else (0, None) for r in rows]
        n, cached = len(rows), max(c for c, _ in reuse)
        tails = [list(r[c:]) for r, (c, _) in zip(rows, reuse)]
        width = max(len(t) for t in tails)
        ids = torch.full((n, width), self._pad, dtype=torch.long)
        mask = torch.zeros((n, cached + width), dtype=torch.long)
        positions = torch.zeros((n, width), dtype=torch.long)
        columns = []
        for i, (tail, (c, _)) in enumerate(zip(tails, reuse)):
            start = width - len(tail)
            ids[i, start:] = torch.tensor(tail, dtype=torch.long)
            mask[i, cached - c:cached] = 1
            mask[i, cached + start:] = 1
            positions[i, start:] = torch.arange(c, c + len(tail))
            columns.append(np.concatenate([np.arange(cached - c, cached), np.arange(cached + start, cached + width)]))
        device = self.device
        kwargs: dict[str, Any] = {}
        if cached:
            kwargs[self._cache_arg] = self._past(reuse, cached, device)
        if self.prefix is not None:
            self.prefix.reused += sum(c for c, _ in reuse)
            self.prefix.computed += sum(len(t) for t in tails)
        mask, positions = mask.to(device), positions.to(device)
        with torch.no_grad():
            result = self.model(input_ids=ids.to(device), attention_mask=mask, position_ids=positions,
                                use_cache=True, logits_to_keep=1, **kwargs)
        return result, mask, positions, columns

    def _share_common_prefix(self, rows: Sequence[Sequence[int]]) -> None:
        """Run the rows' common prefix once (and store it) when it is longer than the store's best."""
        first = np.asarray(rows[0], dtype=np.int64)
        common = min(len(r) for r in rows) - 1
        for r in rows[1:]:
            common = min(common, common_prefix(first, np.asarray(r, dtype=np.int64)))
        if common >= 16 and common > self.prefix.match(first[:common + 1].tolist())[0]:
            head = [first[:common].tolist()]
            result, _, _, columns = self._prefill(head)
            self._store(head, columns, result)

    def _past(self, reuse, cached: int, device):
        """The stored prefixes as one cache, each row's states right-aligned at column `cached`."""
        torch = self._torch_mod
        from transformers.cache_utils import DynamicCache

        stored = next(s for _, s in reuse if s is not None)
        layers = []
        for layer, (k0, v0) in enumerate(stored.kv):
            keys = torch.zeros((len(reuse), k0.shape[0], cached, k0.shape[2]), dtype=k0.dtype, device=device)
            values = torch.zeros((len(reuse), v0.shape[0], cached, v0.shape[2]), dtype=v0.dtype, device=device)
            for i, (c, s) in enumerate(reuse):
                if c:
                    keys[i, :, cached - c:] = s.kv[layer][0][:, :c]
                    values[i, :, cached - c:] = s.kv[layer][1][:, :c]
            layers.append((keys, values))
        return DynamicCache(layers)

    def _store(self, sequences: Sequence[Sequence[int]], columns: Sequence[np.ndarray], result: Any) -> None:
        """Copy each row's states out of the output's cache into `self.prefix` (plain full-attention
        layers only: a sliding-window cache keeps a window, not the sequence)."""
        if self.prefix is None:
            return
        from transformers.cache_utils import DynamicLayer

        cache = getattr(result, "cache", None)
        if cache is None:
            cache = getattr(result, "past_key_values", None)
        layers = getattr(cache, "layers", None)
        if not layers or any(type(layer) is not DynamicLayer or layer.keys is None for layer in layers):
            self._storable = False
            return
        torch = self._torch_mod
        for i, (seq, cols) in enumerate(zip(sequences, columns)):
            index = torch.as_tensor(cols, device=layers[0].keys.device)
            kv = [(layer.keys[i].index_select(1, index), layer.values[i].index_select(1, index))  # copies
                  for layer in layers]
            self.prefix.put(list(seq), kv)

    def _decode(self, rows: list[list[int]], decodings: Sequence[Decoding]):
        """Decoding of all rows at once with a KV cache, a token a step for every unfinished row;
        finished rows are fed padding (their outputs are ignored: rows never attend to each other).
        Each step's next tokens are picked on the device or on the host (`HFSettings.sampling`)."""
        torch = self._torch_mod
        n = len(rows)
        budgets = [min(d.max_tokens, self.settings.n_ctx - len(r) - 1) for r, d in zip(rows, decodings)]
        rngs = [np.random.default_rng(d.seed) for d in decodings]
        streams = [TokenStream(d.stop) for d in decodings]
        outs: list[list[int]] = [[] for _ in rows]
        eos = [False] * n
        done = [b <= 0 for b in budgets]
        if all(done):  # nothing to generate (a request for the prompt's internals only): no prefill
            return streams, eos, outs
        result, mask, positions, columns = self._prefill(rows)
        pick = DeviceSampler(torch, rows, decodings, rngs) if self.settings.sampling == "device" \
            else HostSampler(rows, decodings, rngs, self._eos)
        fed = [0] * n  # output tokens of each row whose states the cache holds (column width + j for token j)
        width = mask.shape[1]
        with torch.no_grad():
            while not all(done):
                picked = pick(result.logits[:, -1, :], done, outs)
                step = []
                for i in range(n):
                    if done[i]:
                        step.append(self._pad)
                        continue
                    token, logprob, entropy, top_ids = picked[i]
                    step.append(token)
                    if token in self._eos:
                        eos[i] = done[i] = True
                        continue
                    outs[i].append(token)
                    raw = self.tokenizer.decode(outs[i], skip_special_tokens=False).rstrip("\ufffd")
                    piece = self.tokenizer.decode([token], skip_special_tokens=False)
                    top = tuple((self._piece(t), v) for t, v in top_ids)
                    fired = streams[i].push(token, piece, raw, logprob, top, entropy)
                    if fired or len(outs[i]) >= budgets[i]:
                        done[i] = True
                if all(done):
                    break
                fed = [len(o) for o in outs]
                mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=mask.device)], dim=1)
                positions = positions[:, -1:] + 1
                cache = getattr(result, "cache", None)
                if cache is None:
                    cache = getattr(result, "past_key_values", None)
                result = self.model(input_ids=torch.tensor(step, device=mask.device).unsqueeze(1),
                                    attention_mask=mask, position_ids=positions, use_cache=True,
                                    **{self._cache_arg: cache})
        self._store([r + o[:f] for r, o, f in zip(rows, outs, fed)],
                    [np.concatenate([c, width + np.arange(f)]) for c, f in zip(columns, fed)], result)
        return streams, eos, outs

    def _internals(self, ids: list[int], n_prompt: int, decoding: Decoding) -> Internals:
        """Attention weights / hidden states of one teacher-forced pass over prompt and output."""
        torch = self._torch_mod
        with torch.no_grad():
            result = self.model(input_ids=torch.tensor([ids], device=self.device),
                                output_attentions=decoding.attentions, output_hidden_states=decoding.hidden_states,
                                logits_to_keep=1)
        attentions = hidden = None
        if decoding.attentions:
            if not result.attentions or result.attentions[0] is None:
                raise BackendError("the model returned no attention weights (load it with attn_implementation="
                                   "'eager')")
            attentions = tuple(a[0].float().cpu().numpy() for a in result.attentions)
        if decoding.hidden_states:
            hidden = tuple(h[0].float().cpu().numpy() for h in result.hidden_states)
        return Internals(tuple(ids), n_prompt, attentions, hidden)

    def _piece(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)
