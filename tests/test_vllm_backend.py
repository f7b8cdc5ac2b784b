"""The vLLM rollout back-end (`metarag.llm.vllm`) against stand-ins with vLLM's output types
(`LLM.generate`'s RequestOutput / CompletionOutput / Logprob) and TRL's `VLLMClient.generate` dict:
the request each prompt becomes, tokens read through the shared stop rule, and a search agent's
rollout on it laid out for training as on the transformers back-end. vLLM itself cannot be installed
here."""
from dataclasses import dataclass, field

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from metarag.llm.base import Decoding, TokenIds  # noqa: E402
from metarag.llm.vllm import ColocatedEngine, ServerEngine, VLLMRollouts, sampling_request  # noqa: E402
from metarag.methods.registry import build_method  # noqa: E402
from metarag.methods.runner import Runtime, Sampling, run_many  # noqa: E402
from metarag.records import Message, Passage, Question  # noqa: E402
from metarag.retrieve.memory import MemoryRetriever  # noqa: E402

REPLY = " <think> need it </think> <search> capital of France </search> and then more"
ANSWER = " <think> ok </think> <answer> Paris </answer>"


@dataclass
class Logprob:  # vllm.sequence.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:  # vllm.outputs.RequestOutput
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: None
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class SamplingParams:  # the fields of vllm.SamplingParams the back-end sets
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 16
    seed: int | None = None
    logprobs: int | None = None
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True


def vllm_tokens(tokenizer, prompt_text: str, max_tokens: int, stop: list[str]) -> tuple[list[int], str, str | None]:
    """What vLLM returns for a scripted continuation: tokens up to the one that completes a stop
    string (stop reason: that string), else up to the budget, else through EOS."""
    ids = tokenizer.encode(ANSWER if "Doc 1(" in prompt_text else REPLY, add_special_tokens=False)
    ids += [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    out: list[int] = []
    for token in ids[:max_tokens]:
        out.append(token)
        text = tokenizer.decode(out)
        fired = [s for s in stop if s in text]
        if fired:
            return out, "stop", fired[0]
        if token == ids[-1]:
            return out, "stop", None
    return out, "length", None


class FakeVLLM:
    """`vllm.LLM.generate` over scripted replies, with a log-prob table per token."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls = []

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append((prompts, sampling_params))
        outputs = []
        for i, (p, params) in enumerate(zip(prompts, sampling_params)):
            text = self.tokenizer.decode(p["prompt_token_ids"])
            ids, finish, reason = vllm_tokens(self.tokenizer, text, params.max_tokens, params.stop)
            tables = [{t: Logprob(-0.1 * (j + 1), 1), 7: Logprob(-3.0, 2)} if t != 7 else {t: Logprob(-0.5, 1)}
                      for j, t in enumerate(ids)]
            outputs.append(RequestOutput(str(i), None, p["prompt_token_ids"], None,
                                         [CompletionOutput(0, "", ids, None, tables, finish, reason)]))
        return outputs


class FakeClient:
    """TRL's `VLLMClient.generate`: prompt ids, completion ids, log-probs sorted by rank and their ids."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.requests = []

    def generate(self, prompts, n=1, temperature=1.0, top_p=1.0, max_tokens=16, logprobs=0,
                 generation_kwargs=None):
        self.requests.append(dict(prompts=prompts, n=n, temperature=temperature, max_tokens=max_tokens,
                                  logprobs=logprobs, **(generation_kwargs or {})))
        ids, _, _ = vllm_tokens(self.tokenizer, self.tokenizer.decode(prompts[0]), max_tokens,
                                (generation_kwargs or {}).get("stop", []))
        return {"prompt_ids": [list(prompts[0])], "completion_ids": [ids],
                "logprobs": [[[-0.2, -4.0] for _ in ids]], "logprob_token_ids": [[[t, 5] for t in ids]]}


@pytest.fixture(scope="module")
def policy():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_hf import tiny_llm

    return tiny_llm("tiny-qwen2:vllm-test")


def test_each_request_becomes_vllm_sampling_params():
    request = sampling_request(Decoding(max_tokens=512, stop=("</search>", "</answer>"), temperature=1.0, seed=42,
                                        logprobs=1), budget=300)
    assert request == {"n": 1, "temperature": 1.0, "top_p": 1.0, "max_tokens": 300, "seed": 42, "logprobs": 1,
                       "stop": ["</search>", "</answer>"], "include_stop_str_in_output": True,
                       "skip_special_tokens": False}
    SamplingParams(**request)  # every key is one of vLLM's


def test_colocated_vllm_tokens_read_through_the_shared_stop_rule(policy):
    fake = FakeVLLM(policy.tokenizer)
    llm = VLLMRollouts(ColocatedEngine(fake, SamplingParams), policy, "tiny:step0")
    prompt = (Message("user", "Question: capital of France?"),)
    out = llm.generate_batch([prompt], [Decoding(max_tokens=64, stop=("</search>", "</answer>"), temperature=1.0,
                                                 seed=9, logprobs=1)])[0]
    assert out.finish_reason == "stop" and out.stop == "</search>"
    assert out.text == " <think> need it </think> <search> capital of France "
    sent = fake.calls[0][0][0]["prompt_token_ids"]
    assert list(out.prompt_ids) == sent == policy.tokenize(policy.render(prompt))  # the policy's template and ids
    params = fake.calls[0][1][0]
    assert params.seed == 9 and params.max_tokens == 64 and params.stop == ["</search>", "</answer>"]
    assert [t.logprob for t in out.tokens] == pytest.approx([-0.1 * (j + 1) if t.id != 7 else -0.5
                                                             for j, t in enumerate(out.tokens)])
    assert all(t.id is not None for t in out.tokens) and out.usage.completion_tokens == len(out.tokens)
    # the budget: vLLM stops at max_tokens, read as "length"
    short = llm.generate_batch([TokenIds(tuple(sent))], [Decoding(max_tokens=3, temperature=1.0)])[0]
    assert short.finish_reason == "length" and len(short.tokens) == 3
    # the end of the turn: vLLM's EOS token ends the output and is not a token of it
    whole = llm.generate_batch([TokenIds(tuple(sent))], [Decoding(max_tokens=200, temperature=1.0)])[0]
    assert whole.finish_reason == "eos" and whole.text == REPLY


def test_server_vllm_and_a_search_agent_rollout_laid_out_for_training(policy):
    from metarag.train.agent import rollout_sample, step_generations

    client = FakeClient(policy.tokenizer)
    llm = VLLMRollouts(ServerEngine(client), policy, "tiny:step0")
    question = Question("q1", "What is the capital of France?", ("Paris",))
    runtime = Runtime(llm=llm, retriever=MemoryRetriever([Passage("p1", "France", "The capital of France is Paris.")]),
                      sampling=Sampling(temperature=1.0))
    trace = run_many(build_method("search-r1", {"k": 1, "probe": True}), [question], runtime, seeds=[5])[0]
    assert trace.error is None and trace.answer == "Paris"
    assert [r["stop"] for r in client.requests] == [["</search>", "</answer>"]] * 2
    assert len({r["seed"] for r in client.requests}) == 2  # each request its own seed
    generations = step_generations(trace)
    assert [t.logprob for g in generations for t in g.logprobs] == pytest.approx([-0.2] * sum(
        len(g.logprobs) for g in generations))
    sample = rollout_sample(trace, llm)
    assert [i for i, m in zip(sample.completion_ids, sample.env_mask) if m] == [t.id for g in generations
                                                                               for t in g.logprobs]
    assert "<information>" in policy.detokenize([i for i, m in zip(sample.completion_ids, sample.env_mask) if not m])
    # the belief probe scored on the live policy: a Score step with a probability in [0, 1]
    assert any(getattr(s, "purpose", "") == "belief-probe" for s in trace.steps)


def test_a_process_without_trls_client_opens_its_own_for_requests(policy, monkeypatch):
    """In server mode TRL keeps its client (and the weight-sync communicator) on the main process;
    every other process's rollouts need one to send requests with."""
    from types import SimpleNamespace

    pytest.importorskip("trl")
    import trl.generation.vllm_client as client_module

    opened = []

    class Client(FakeClient):
        def __init__(self, base_url=None, connection_timeout=0.0):
            super().__init__(policy.tokenizer)
            opened.append(base_url)

    monkeypatch.setattr(client_module, "VLLMClient", Client)
    generation = SimpleNamespace(mode="server", server_base_url=None, server_host="10.0.0.7", server_port=8000,
                                 server_timeout=240.0)
    trainer = SimpleNamespace(vllm_generation=generation, processing_class=policy.tokenizer)
    llm = VLLMRollouts.from_trainer(trainer, policy.model, "tiny:step1", n_ctx=512)
    assert opened == ["http://10.0.0.7:8000"] and isinstance(llm.engine, ServerEngine)
    out = llm.generate_batch([(Message("user", "Question: capital of France?"),)],
                             [Decoding(max_tokens=64, stop=("</search>",), temperature=1.0, seed=1)])[0]
    assert out.stop == "</search>"


# ------------------------------------------------------------------------------------ edge cases
def test_a_request_vllm_would_refuse_is_refused_here_in_one_line():
    from metarag.errors import BackendError, ConfigError

    with pytest.raises(BackendError, match="token budget of at least 1, not 0") as caught:
        sampling_request(Decoding(max_tokens=0), budget=0)  # vLLM: "max_tokens must be at least 1, got 0."
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="temperatures up to 2, not 2.5"):
        sampling_request(Decoding(temperature=2.5), budget=8)
    # an empty stop string (vLLM: "stop cannot contain an empty string") is left out: the stop rule ignores it
    assert sampling_request(Decoding(stop=("", "</search>")), budget=8)["stop"] == ["</search>"]


def test_a_request_with_no_room_left_ends_without_reaching_vllm(policy):
    """A budget of 0 (0 tokens asked, or a prompt one token short of the context) is answered here,
    as the transformers back-end answers it: no tokens, finish "length"; vLLM gets only the others,
    each with a budget of at least 1."""
    fake = FakeVLLM(policy.tokenizer)
    llm = VLLMRollouts(ColocatedEngine(fake, SamplingParams), policy, "tiny:step0")
    prompt = (Message("user", "Question: capital of France?"),)
    ids = tuple(policy.tokenize(policy.render(prompt)))
    full = TokenIds(tuple(ids) + (ids[-1],) * (policy.settings.n_ctx - 1 - len(ids)))  # fills the context
    outs = llm.generate_batch([prompt, prompt, full], [Decoding(max_tokens=0), Decoding(max_tokens=5, seed=1),
                                                       Decoding(max_tokens=5, seed=2)])
    assert [o.finish_reason for o in outs[::2]] == ["length", "length"] and [o.text for o in outs[::2]] == ["", ""]
    assert [o.usage.completion_tokens for o in outs] == [0, 5, 0]
    [(sent, params)] = fake.calls
    assert len(sent) == 1 and [p.max_tokens for p in params] == [5]
    assert llm.generate_batch([prompt], [Decoding(max_tokens=0)])[0].text == "" and len(fake.calls) == 1


def test_a_server_that_returns_other_log_probs_is_refused():
    from types import SimpleNamespace

    from metarag.errors import ConfigError
    from metarag.llm.vllm import check_server_logprobs
    from metarag.train.agent.training import _check_vllm_server

    check_server_logprobs({"model_config": {"logprobs_mode": "processed_logprobs"}})
    for mode in ("raw_logprobs", "raw_logits", None):
        with pytest.raises(ConfigError, match="--logprobs-mode processed_logprobs") as caught:
            check_server_logprobs({"model_config": {"logprobs_mode": mode}}, "http://h:8000")
        assert "\n" not in str(caught.value) and "http://h:8000" in str(caught.value)

    def trainer(info):
        client = SimpleNamespace(get_server_info=info)
        return SimpleNamespace(accelerator=SimpleNamespace(is_main_process=True),
                               vllm_generation=SimpleNamespace(vllm_client=client))

    with pytest.raises(ConfigError, match="runs with --logprobs-mode raw_logprobs"):
        _check_vllm_server(trainer(lambda: {"model_config": {"logprobs_mode": "raw_logprobs"}}), "u", 1)

    def unreachable():
        raise RuntimeError("Connection refused\nat ...")

    with pytest.raises(ConfigError, match="cannot read the vLLM server's configuration at u: Connection refused$"):
        _check_vllm_server(trainer(unreachable), "u", 1)
    _check_vllm_server(trainer(lambda: {"model_config": {"logprobs_mode": "processed_logprobs"}}), "u", 1)


def test_colocated_vllm_is_refused_a_policy_without_a_safetensors_folder(tmp_path, capsys):
    from metarag.cli import main
    from metarag.errors import ConfigError
    from metarag.llm.vllm import check_colocated_model

    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "model.gguf").write_bytes(b"GGUF")
    for path in (tmp_path / "gguf", tmp_path / "gguf" / "model.gguf", None):
        with pytest.raises(ConfigError, match="vllm=colocate loads the policy into vLLM from a model folder"):
            check_colocated_model(None if path is None else str(path))
    (tmp_path / "folder").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "folder" / name).write_text("{}")
    check_colocated_model(str(tmp_path / "folder"))
    # the command refuses before loading anything: the default --llm is the 0.5B GGUF
    assert main(["train-agent", "--out", str(tmp_path / "out"), "--dataset", "demo", "--set", "vllm=colocate"]) == 1
    err = capsys.readouterr().err
    assert "--llm hf-0.5b is none (a GGUF read by transformers?)" in err and err.count("\n") == 1
