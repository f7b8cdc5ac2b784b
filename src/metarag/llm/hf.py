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
quantized types).
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
import math
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from metarag.errors import BackendError, ConfigError, DataError, MissingDependency
from metarag.llm.base import (
    Decoding,
    Internals,
    Prompt,
    TokenIds,
    TokenStream,
    as_messages,
    entropy_of,
    is_raw,
    label_plan,
    label_prefixes,
    label_probs,
    log_softmax,
    render_continuing,
    sample_token,
    top_alternatives,
)
from metarag.llm.prefix_kv import PrefixKV, common_prefix
from metarag.records import Completion, LabelScores, Message, Usage

WEIGHT_SUFFIXES = (".safetensors", ".gguf")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")  # loading one can run code: refused unless trust_pickle
# the files besides the weights that change what a folder's model answers
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
               "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
               "chat_template.json")
SAMPLING_PLACES = ("device", "host")  # where decoding picks each next token (HFSettings.sampling)


@dataclass(frozen=True)
class HFSettings:
    """How to load and run a model with transformers. `embedded` names an embedded GGUF
    (`metarag.llm.models.EMBEDDED_MODELS`); `path`, a GGUF file or a Hugging Face model folder,
    wins when given. `device` "auto" is cuda when torch sees a GPU, else cpu; `dtype` "auto" is
    bfloat16 on a GPU and float32 on the CPU. Eager attention, so that attention weights can be
    returned. `n_threads` None leaves torch's default. A folder's pickle weight files (.bin, .pt,
    .pth, .ckpt) can run code when loaded: refused unless `trust_pickle`. `autocast` runs every
    forward pass under bf16 autocast over the model's own (float32) weights: a trainer's rollouts in
    its bf16-autocast precision (on a CPU with AVX512-BF16 a bf16 matmul is about 4x a float32 one).
    `prefix_cache_tokens`: the key/value states of up to that many tokens of earlier requests are kept
    (`metarag.llm.prefix_kv`), so a request that extends one (an agent's next turn, a probe of a longer
    history) runs only its new tokens; 0 turns it off. A token of the 1.5B's states is 28 layers x 2
    KV heads x 128 for keys and as much for values: 16,384 tokens take about 0.94 GB in float32 (and
    about 0.7 GB under bf16 autocast, where the values are bf16 and the keys float32: Qwen2's rotary
    tables take the hidden states' dtype), enough for every row of a training step's group (5
    rollouts x 3 turns, their probes).
    `sampling` "device": each decoding step picks every row's next token in torch on the model's
    device, all rows at once, by the shared rule (`metarag.llm.base`: the uniform each draw needs comes
    from the row's numpy generator seeded by `seed`, and the draw is the inverse-CDF search numpy's
    `Generator.choice` makes, so a seed gives the tokens the host rule gives), and only the chosen ids,
    their log-probs, entropies and top alternatives come back to the host; "host": the rule in numpy,
    row by row, the whole logit rows copied to the host at every step (the reference the device path
    is tested and benchmarked against: tests/test_hf.py, benchmarks/rollout_sampling.py)."""

    embedded: str | None = "qwen2.5-coder-1.5b-instruct"
    path: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    n_ctx: int = 4096
    n_threads: int | None = None
    attn_implementation: str = "eager"
    trust_pickle: bool = False
    autocast: bool = False
    prefix_cache_tokens: int = field(default=16384, metadata={"omit_default": True})
    sampling: str = field(default="device", metadata={"omit_default": True})

    def __post_init__(self) -> None:
        if self.prefix_cache_tokens < 0:
            raise ConfigError(f"prefix_cache_tokens must be >= 0, not {self.prefix_cache_tokens}")
        if self.sampling not in SAMPLING_PLACES:
            raise ConfigError(f"sampling must be one of {', '.join(SAMPLING_PLACES)}, not {self.sampling!r}")


def _torch():
    try:
        import torch
        import transformers
    except ModuleNotFoundError:
        raise MissingDependency("torch and transformers", "hf") from None
    return torch, transformers


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
        if isinstance(prompt, TokenIds):
            return self._check_fits(list(prompt.ids))
        messages = as_messages(prompt)
        return self.tokenize(messages[0].content if is_raw(messages) else self.render(messages))

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


# ---------------------------------------------------------------------------------- sampling
# What a sampler gives for each unfinished row: the token, its log-prob and the entropy of the model's
# own (temperature 1) distribution, and its top alternatives as (id, log-prob), best first; for an
# end-of-sequence token, which is never kept, the host sampler computes none of them.
Picked = tuple[int, float, "float | None", tuple[tuple[int, float], ...]]


class HostSampler:
    """The shared rule run in numpy on the host (`metarag.llm.base.sample_token`): each step copies the
    logit rows to the host and picks row by row."""

    def __init__(self, rows: Sequence[Sequence[int]], decodings: Sequence[Decoding], rngs: Sequence[Any],
                 eos: Collection[int]):
        self.rows, self.decodings, self.rngs, self.eos = rows, decodings, rngs, eos

    def __call__(self, logits: Any, done: Sequence[bool], outs: Sequence[Sequence[int]]) -> list[Picked | None]:
        table = logits.float().cpu().numpy()
        picked: list[Picked | None] = [None] * len(table)
        for i, d in enumerate(self.decodings):
            if done[i]:
                continue
            history = list(self.rows[i]) + list(outs[i]) if d.repetition_penalty != 1.0 else ()
            token = sample_token(table[i], d, self.rngs[i], history)
            if token in self.eos:  # ends the row, never kept: nothing more to compute
                picked[i] = (token, 0.0, None, ())
                continue
            lp = log_softmax(table[i])
            picked[i] = (token, float(lp[token]), entropy_of(lp), top_alternatives(lp, d.logprobs, int))
        return picked


class DeviceSampler:
    """The shared rule run in torch on the logits' device, for every unfinished row at once: the
    repetition penalty, greedy argmax, temperature, top-k (ties at the cut kept) and top-p as
    `metarag.llm.base.sample_token` applies them, in float64; each sampled row's draw is the inverse-CDF
    search numpy's `Generator.choice` makes (cumulative sum, divided by its last value, the first entry
    above the uniform), the uniform drawn from the row's own numpy generator, so a seed gives the host
    rule's tokens up to the rounding of the sums. Only the picked ids, log-probs, entropies and top
    alternatives are copied back."""

    def __init__(self, torch: Any, rows: Sequence[Sequence[int]], decodings: Sequence[Decoding], rngs: Sequence[Any]):
        self.torch, self.rows, self.decodings, self.rngs = torch, rows, decodings, rngs
        self.seen = None  # (rows, vocabulary) bool: the ids of each row's prompt and output, for the penalty
        self.counted = [0] * len(rows)  # output tokens of each row already marked in `seen`

    def __call__(self, logits: Any, done: Sequence[bool], outs: Sequence[Sequence[int]]) -> list[Picked | None]:
        torch = self.torch
        live = [i for i in range(len(done)) if not done[i]]
        decodings = [self.decodings[i] for i in live]
        where = torch.tensor(live, device=logits.device)
        x = logits.index_select(0, where).double()
        top, best = x.max(dim=-1, keepdim=True)  # the largest logit and its first id
        e = torch.exp(x - top)
        total = e.sum(dim=-1, keepdim=True)
        p = e / total  # the model's own distribution (temperature 1), as the host rule computes it
        lse = top + total.log()  # a token's log-prob is its logit minus this
        entropy = lse[:, 0] - (p * x).nansum(dim=-1)  # a -inf logit has p 0: its term is 0, not nan
        penalized = any(d.repetition_penalty != 1.0 for d in decodings)
        z = self._penalized(x, where, live, outs) if penalized else x
        tokens = z.max(dim=-1).indices if penalized else best[:, 0].clone()
        hot = [j for j, d in enumerate(decodings) if d.temperature > 0]
        if hot:
            tokens[hot] = self._drawn(z, p, hot, decodings, [self.rngs[live[j]] for j in hot])
        k = min(max(d.logprobs for d in decodings), x.shape[-1])
        columns = [tokens.double()[:, None], x.gather(1, tokens[:, None]) - lse, entropy[:, None]]
        if k:  # ids as float64 hold any vocabulary's ids exactly
            values, ids = (top, best) if k == 1 else x.topk(k, dim=-1)
            columns += [ids.double(), values - lse]
        table = torch.cat(columns, dim=1).cpu().tolist()  # the one copy to the host this step
        picked: list[Picked | None] = [None] * len(done)
        for i, d, row in zip(live, decodings, table):
            top_ids = tuple((int(row[3 + a]), row[3 + k + a]) for a in range(min(d.logprobs, k)))
            picked[i] = (int(row[0]), row[1], row[2], top_ids)
        return picked

    def _penalized(self, x: Any, where: Any, live: Sequence[int], outs: Sequence[Sequence[int]]) -> Any:
        """`x` with the repetition penalty on every id each row's prompt or output so far holds."""
        torch = self.torch
        if self.seen is None:
            self.seen = torch.zeros((len(self.rows), x.shape[-1]), dtype=torch.bool, device=x.device)
            for i, row in enumerate(self.rows):
                self.seen[i, torch.tensor(list(row), dtype=torch.long, device=x.device)] = True
        for i in live:
            new = outs[i][self.counted[i]:]
            if new:
                self.seen[i, torch.tensor(list(new), dtype=torch.long, device=x.device)] = True
                self.counted[i] = len(outs[i])
        penalty = torch.tensor([self.decodings[i].repetition_penalty for i in live], dtype=x.dtype,
                               device=x.device)[:, None]
        seen = self.seen.index_select(0, where)
        return torch.where(seen & (penalty != 1.0), torch.where(x > 0, x / penalty, x * penalty), x)

    def _drawn(self, z: Any, p: Any, hot: Sequence[int], decodings: Sequence[Decoding], rngs: Sequence[Any]) -> Any:
        """One token for each row `hot` of `z` (float64 logits, penalty applied), drawn with `rngs`: from
        `p` (the distribution at temperature 1) where nothing reshapes it, else by `_distribution`."""
        torch = self.torch
        shaped = [a for a, j in enumerate(hot) if decodings[j].temperature != 1.0 or decodings[j].top_k
                  or decodings[j].top_p < 1.0 or decodings[j].repetition_penalty != 1.0]
        probs = p if not shaped and len(hot) == len(p) else p[list(hot)]
        if shaped:
            rows = [hot[a] for a in shaped]
            probs[shaped] = self._distribution(z[rows], [decodings[j] for j in rows])
        cdf = probs.cumsum(dim=-1)
        cdf = cdf / cdf[:, -1:]
        uniform = torch.tensor([[rng.random()] for rng in rngs], dtype=z.dtype, device=z.device)
        return torch.searchsorted(cdf, uniform, right=True)[:, 0].clamp(max=z.shape[-1] - 1)

    def _distribution(self, z: Any, decodings: Sequence[Decoding]) -> Any:
        """The distribution each row of `z` is drawn from: softmax at its temperature over its top-k
        (ties at the cut kept), cut to its top-p nucleus."""
        torch = self.torch
        vocab = z.shape[-1]
        scaled = z / torch.tensor([d.temperature for d in decodings], dtype=z.dtype, device=z.device)[:, None]
        cut = [j for j, d in enumerate(decodings) if 0 < d.top_k < vocab]
        if cut:
            ks = torch.tensor([decodings[j].top_k for j in cut], device=z.device)
            best = scaled[cut].topk(int(ks.max()), dim=-1).values
            kth = best.gather(1, (ks - 1)[:, None])
            scaled[cut] = torch.where(scaled[cut] >= kth, scaled[cut], torch.full_like(scaled[cut], -math.inf))
        p = torch.exp(scaled - scaled.max(dim=-1, keepdim=True).values)
        p = p / p.sum(dim=-1, keepdim=True)
        nucleus = [j for j, d in enumerate(decodings) if d.top_p < 1.0]
        if nucleus:
            top_p = torch.tensor([decodings[j].top_p for j in nucleus], dtype=z.dtype, device=z.device)[:, None]
            ordered, order = p[nucleus].sort(dim=-1, descending=True, stable=True)
            keep = (ordered.cumsum(dim=-1) < top_p).sum(dim=-1, keepdim=True) + 1
            ordered = torch.where(torch.arange(vocab, device=z.device)[None, :] < keep, ordered,
                                  torch.zeros_like(ordered))
            kept = torch.zeros_like(ordered).scatter(1, order, ordered)
            p[nucleus] = kept / kept.sum(dim=-1, keepdim=True)
        return p


# ----------------------------------------------------------------------------------- loading
def meta_model(settings: HFSettings) -> tuple[Any, Any]:
    """The model `settings` name as its architecture alone, its parameters on torch's meta device (no
    weight read, none allocated), with its tokenizer and generation config: what a training process
    holds whose weights the main process sends it as the model is sharded (FSDP2's rank-0 loading,
    `metarag.train.agent.load_base`). Its parameters have the names and shapes `HFLLM` loads."""
    torch, transformers = _torch()
    path = _locate(settings)
    kwargs: dict[str, Any] = {}
    folder = path
    if path.is_file():
        folder, kwargs["gguf_file"] = path.parent, path.name
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), **kwargs)
        config = transformers.AutoConfig.from_pretrained(str(folder), **kwargs)
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        raise BackendError(f"transformers could not read {path}: {str(exc).splitlines()[0][:300]}") from None
    from accelerate import init_empty_weights

    dtype = _dtype(torch, settings.dtype, torch.device("cpu"))
    # parameters on the meta device; buffers (the rotary frequencies) computed on the CPU: FSDP2 sends
    # the parameters and persistent buffers, and keeps each process's own non-persistent ones
    with init_empty_weights(include_buffers=False):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                              attn_implementation=settings.attn_implementation)
    model.tie_weights()  # from_config on the meta device leaves tied embeddings untied; the loaded model ties them
    try:  # the end-of-turn ids the rollouts stop at, as from_pretrained reads them
        model.generation_config = transformers.GenerationConfig.from_pretrained(str(folder))
    except OSError:  # none in the folder (a GGUF's): the one from_pretrained derives from the config
        pass
    return model, tokenizer


def _locate(settings: HFSettings) -> Path:
    """The file or folder `settings` name (no hashing)."""
    from metarag.llm.models import check_gguf_path, embedded_model, ensure_gguf

    if settings.path:
        path = Path(settings.path).expanduser()
        if path.is_dir():
            return path
        if path.is_file():
            return check_gguf_path(path)
        raise DataError("model file or folder not found", path=str(path))
    if settings.embedded:
        return ensure_gguf(embedded_model(settings.embedded))
    raise ConfigError("the transformers back-end needs an embedded model name or a path")


def _resolve(settings: HFSettings) -> tuple[Path, str, str]:
    """(path to load, display name, sha256 of the weights)."""
    from metarag.llm.models import check_gguf_path, embedded_model, ensure_gguf, file_sha256

    if settings.path:
        path = Path(settings.path).expanduser()
        if path.is_dir():
            return path, path.name, folder_sha256(path, trust_pickle=settings.trust_pickle)
        if path.is_file():
            checked = check_gguf_path(path)
            return checked, checked.name, file_sha256(checked)
        raise DataError("model file or folder not found", path=str(path))
    if settings.embedded:
        model = embedded_model(settings.embedded)
        return ensure_gguf(model), model.name, model.sha256
    raise ConfigError("the transformers back-end needs an embedded model name or a path")


def folder_sha256(folder: Path, *, trust_pickle: bool = False) -> str:
    """One hash of a model folder's weight, config and tokenizer files (names and contents), so a
    retrained checkpoint or a changed tokenizer in the same folder gets a new identity."""
    from metarag.llm.models import file_sha256

    suffixes = WEIGHT_SUFFIXES + (PICKLE_SUFFIXES if trust_pickle else ())
    weights = [p for p in folder.rglob("*") if p.is_file() and p.suffix in suffixes]
    if not weights:
        pickles = sorted(p.name for p in folder.rglob("*") if p.is_file() and p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise DataError(f"only pickle weight files ({', '.join(pickles[:3])}), which can run code when loaded: "
                            "convert them to safetensors, or set trust_pickle", path=str(folder))
        raise DataError("no weight files (*.safetensors, *.gguf) in the model folder", path=str(folder))
    files = sorted(weights + [p for p in folder.rglob("*") if p.is_file() and p.name in MODEL_FILES])
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.relative_to(folder)}:{file_sha256(f)}\n".encode())
    return digest.hexdigest()


def _device(torch, name: str):
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown torch device {name!r}") from None


def _dtype(torch, name: str, device):
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ConfigError(f"unknown torch dtype {name!r} (float32, bfloat16, float16)")
    return value

