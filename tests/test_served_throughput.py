"""`eval --llm openai --workers K` keeps K requests in flight against a server that answers slowly."""
import importlib.util
import json
import time

import pytest
from fake_openai import FakeOpenAIServer

from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
from metarag.llm.registry import LLMSpec

if importlib.util.find_spec("openai") is None:
    pytest.skip("needs pip install 'metarag[openai]'", allow_module_level=True)


def many_questions(path, n):
    """An official-format HotpotQA file of `n` questions, each with its own paragraph."""
    path.write_text(json.dumps([
        {"_id": f"q{i}", "question": f"What is the number of town {i}?", "answer": str(i), "type": "bridge",
         "level": "easy", "supporting_facts": [[f"Town {i}", 0]],
         "context": [[f"Town {i}", [f"Town {i} has the number {i}."]]]} for i in range(n)]))
    return path


@pytest.mark.parametrize("workers", [64])
def test_k_workers_keep_k_requests_in_flight(tmp_path, workers):
    questions = 2 * workers
    data = many_questions(tmp_path / "towns.json", questions)
    with FakeOpenAIServer(answer="7", delay_s=0.5) as server:
        config = EvalConfig(method="standard-rag", dataset=DatasetSpec(file=str(data)),
                            llm=LLMSpec(backend="openai", base_url=server.url, model="fake", response_cache=False),
                            workers=workers, runs_dir=str(tmp_path / "runs"))
        start = time.perf_counter()
        store, results = evaluate(config, progress=False)
        elapsed = time.perf_counter() - start
    assert server.peak_in_flight == workers
    assert server.requests == questions
    assert len(results) == questions and not any(r.failed for r in results)
    # every result written once, in a file a re-run reads back as done
    assert sorted(r.question_id for r in store.load_results().values()) == sorted(f"q{i}" for i in range(questions))
    # two waves of 0.5 s; a harness that ran the requests one after another would take 64 s
    assert elapsed < 20
