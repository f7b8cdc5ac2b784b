"""Batched decoding on llama.cpp (`LlamaCppSettings.batch_slots`, `llm/llama_slots.py`): the same
completions as one request at a time, a shared prompt prefix evaluated once, an agent's next turn
continuing in its own slot. The mechanics on a tiny GGUF (its next-token distribution is the same
after any prompt, so a batched and a lone request see identical logits and must sample identically);
the KV cells on the 0.5B, whose output depends on them."""
from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from metarag.errors import ConfigError  # noqa: E402
from metarag.llm.base import Decoding, TokenIds, generate  # noqa: E402
from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings  # noqa: E402
from metarag.records import Message  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_gguf import write_tiny_gguf

    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_gguf(path, favour="[Relevant]", logit=0.05)  # favoured, not certain: samples differ by seed
    return str(path)


def _llm(gguf: str, slots: int) -> LlamaCppLLM:
    return LlamaCppLLM(LlamaCppSettings(embedded=None, gguf=gguf, n_ctx=256, n_threads=1, batch_slots=slots))


def test_batching_is_offered_only_when_asked_for(tiny):
    assert not hasattr(_llm(tiny, 0), "generate_batch")
    assert hasattr(_llm(tiny, 3), "generate_batch")
    with pytest.raises(ConfigError, match="batch_slots must be 0"):
        LlamaCppSettings(batch_slots=-1)


def test_batched_sampled_requests_give_what_each_gives_alone_with_its_seed_and_stop(tiny):
    llm = _llm(tiny, 3)
    prompts = [f"Passage {i}: Paris is in France." for i in range(5)]  # more requests than slots: two lots
    decodings = [Decoding(max_tokens=6 + i, temperature=1.0, seed=i, stop=("a",) if i == 2 else ()) for i in range(5)]
    alone = [generate(llm, (Message("raw", p),), d) for p, d in zip(prompts, decodings)]
    together = llm.generate_batch([(Message("raw", p),) for p in prompts], decodings)
    assert [c.text for c in together] == [c.text for c in alone]
    assert [c.usage.completion_tokens for c in together] == [c.usage.completion_tokens for c in alone]
    assert len({c.text for c in together}) > 1  # the seeds drew different samples
    assert all(c.usage.llm_requests == 1 and c.usage.prompt_tokens > 0 for c in together)


def test_a_shared_prompt_is_evaluated_once_and_a_next_turn_continues_its_own_slot(tiny):
    llm = _llm(tiny, 4)
    long_prompt = "Passage: " + "Paris is the capital of France. " * 4  # over SHARE_MIN tokens
    n = len(llm.tokenize(long_prompt))
    first = llm.generate_batch([long_prompt] * 3, [Decoding(max_tokens=3, temperature=1.0, seed=s) for s in range(3)])
    # the first evaluates it; the two others take its cells: all but the last prompt token are theirs
    assert [c.usage.cached_tokens for c in first] == [0, n - 1, n - 1]
    turns = [TokenIds(tuple(c.prompt_ids) + tuple(t.id for t in c.tokens) + (10, 11)) for c in first]
    second = llm.generate_batch(turns, [Decoding(max_tokens=2)] * 3)
    # each next turn found the slot holding its prompt and its own output: only the new tokens are evaluated
    assert [c.usage.cached_tokens for c in second] == [len(t.ids) - 2 for t in turns]


def test_batched_greedy_answers_of_the_0_5b_match_lone_ones():
    """A wrong position or sequence id in the batch would change what the model reads: the greedy text
    of three prompts decoded together equals each decoded alone (the 0.5B, 24 tokens each)."""
    from metarag.llm.models import EMBEDDED_MODELS

    pytest.importorskip(EMBEDDED_MODELS["qwen2.5-coder-0.5b-instruct"].part_modules[0])
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-0.5b-instruct", n_ctx=512, n_threads=1,
                                       batch_slots=3))
    prompts = [(Message("user", q),) for q in ("What is the capital of France?", "Who wrote Hamlet?",
                                                 "What is 17 times 3?")]
    decodings = [Decoding(max_tokens=24)] * 3
    alone = [generate(llm, p, d).text for p, d in zip(prompts, decodings)]
    assert [c.text for c in llm.generate_batch(prompts, decodings)] == alone
    assert "Paris" in alone[0] and "Shakespeare" in alone[1]
