"""How fast `metarag view` opens a large run: a synthetic 500-question MetaRAG-like run folder.

Each question's trace has the shape of MetaRAG's golden "rewrite" trace (two iterations: retrieval of
five ~90-word passages, a reasoning generation with its full prompt, the expert, the monitor, three
checks, the plan, a rewritten query, a second retrieval and reasoning, the answer), so results.jsonl
is the size a real run writes. The run names a HotpotQA-format dataset file of its 500 questions with
ten paragraphs each, which the viewer reads for question types and supporting flags.

Timed in this process, each the best of --repeat tries, and printed as seconds and as a ratio to
reading the results file with `RunStore.load_results` (what `metarag report` does first):

  runs page     a new app over the folder, then GET /, its scripts and GET /api/runs (the report table)
  first list    GET /api/questions, the question list's first page of 50 (reads the dataset file)
  open trace    GET /api/question for a question in the middle of the run (its line read from disk)
  grown         GET /api/runs again after one more line was appended (only that line is parsed)

The issue's goal: runs page plus first list under a second on this machine.

    .venv/bin/python benchmarks/view_speed.py [--questions 500] [--repeat 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from metarag.evaluate.harness import score
from metarag.evaluate.runs import RunStore
from metarag.records import Hit, Message, Passage, Question, Retrieve, Trace, from_plain, to_plain

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "golden" / "metarag-rewrite.json"
WORDS = ("river valley town founded century engineer railway bridge province museum album director band "
         "record label season league captain island coast harbour festival novel author prize").split()


def words(seed: int, n: int) -> str:
    return " ".join(WORDS[(seed * 7 + i * 13) % len(WORDS)] for i in range(n))


def write_dataset(path: Path, n: int) -> None:
    records = []
    for i in range(n):
        context = [[f"Title {i}-{j}", [words(i + j, 45) + ".", " " + words(i * j + 3, 45) + "."]] for j in range(10)]
        records.append({"_id": f"q{i}", "question": f"Which {words(i, 8)}?", "answer": f"answer {i}",
                        "type": "bridge" if i % 3 else "comparison", "level": "medium",
                        "supporting_facts": [[f"Title {i}-0", 0], [f"Title {i}-1", 1]], "context": context})
    path.write_text(json.dumps(records))


def trace_for(i: int, golden: Trace) -> tuple[Question, Trace]:
    """The golden trace with question i's text, passages and prompts of realistic sizes."""
    question = Question(f"q{i}", f"Which {words(i, 8)}?", (f"answer {i}",), supporting_ids=(f"p{i}-0", f"p{i}-1"))
    passages = [Passage(f"p{i}-{j}", f"Title {i}-{j}", words(i + j, 90)) for j in range(10)]
    listed = "\n\n".join(f"[{j + 1}] {p.title}\n{p.text}" for j, p in enumerate(passages[:5]))
    steps = []
    for number, step in enumerate(golden.steps):
        if isinstance(step, Retrieve):
            first = number == 0
            hits = tuple(Hit(p, 3.0 - 0.3 * j, "bm25") for j, p in enumerate(passages[:5] if first else passages[5:]))
            step = dataclasses.replace(step, query=question.text if first else words(i, 5), hits=hits)
        elif getattr(step, "prompt", None):
            prompt = (Message("system", step.prompt[0].content),
                      Message("user", f"Passages:\n{listed}\n\nQuestion: {question.text}\n{words(i, 40)}"))
            step = dataclasses.replace(step, prompt=prompt)
        steps.append(step)
    return question, dataclasses.replace(golden, question_id=question.id, question=question.text, steps=tuple(steps),
                                         answer=f"answer {i}" if i % 2 else "something else")


def make_run(root: Path, n: int) -> Path:
    data = root / "questions.json"
    write_dataset(data, n)
    golden = from_plain(Trace, json.loads(GOLDEN.read_text()))
    store = RunStore(root / "metarag-synthetic")
    store.write_json("settings.json", {"method": "metarag", "method_settings": {"k": 5, "max_iter": 3},
                                       "dataset": {"file": str(data), "format": "hotpotqa", "name": "synthetic"},
                                       "retriever": "bm25", "llm": {"backend": "scripted"}})
    store.write_json("questions.json", [f"q{i}" for i in range(n)])
    store.write_json("manifest.json", {"model_identity": "scripted:scripted", "sessions": []})
    with store.open_for_append() as handle:
        for i in range(n):
            question, trace = trace_for(i, golden)
            result = score(question, trace)
            handle.write(json.dumps(to_plain(result), ensure_ascii=False) + "\n")
    return store.path


def best(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from fastapi.testclient import TestClient

    from metarag.view import loading
    from metarag.view.server import create_app

    with tempfile.TemporaryDirectory() as tmp:
        path = make_run(Path(tmp), args.questions)
        size = (path / "results.jsonl").stat().st_size
        baseline = best(args.repeat, lambda: RunStore(path).load_results())
        clients: list[TestClient] = []

        def runs_page() -> None:
            loading._DATASETS.clear()  # each try reads the dataset afresh, as a new `metarag view` does
            client = TestClient(create_app([path]))
            for url in ("/", "/static/app.js", "/static/charts.js", "/static/style.css", "/api/runs"):
                assert client.get(url).status_code == 200
            clients.append(client)

        def first_list() -> None:
            loading._DATASETS.clear()
            response = clients[-1].get("/api/questions", params={"limit": 50})
            assert response.status_code == 200 and len(response.json()["items"]) == 50

        def open_trace() -> None:
            response = clients[-1].get("/api/question", params={"id": f"q{args.questions // 2}"})
            assert response.status_code == 200 and response.json()["runs"][0]["trace"]["steps"]

        def grown() -> None:  # the run grows by a line (a retry's): only that line is parsed again
            with open(path / "results.jsonl", "rb+") as f:
                last = f.read().splitlines(keepends=True)[-1]
                f.write(last)
            assert clients[-1].get("/api/runs").status_code == 200

        page = best(args.repeat, runs_page)
        listing = best(args.repeat, first_list)
        trace = best(args.repeat, open_trace)
        growth = best(args.repeat, grown)
        print(f"{args.questions} questions, results.jsonl {size / 1e6:.1f} MB; best of {args.repeat}")
        print("| step | seconds | × load_results |\n|---|---|---|")
        for name, seconds in [("load_results (baseline)", baseline), ("runs page", page), ("first list page", listing),
                              ("runs page + first list", page + listing), ("open a trace", trace),
                              ("runs page after the run grew a line", growth)]:
            print(f"| {name} | {seconds:.3f} | {seconds / baseline:.2f} |")
        verdict = "under" if page + listing < 1.0 else "OVER"
        print(f"\nruns page and first list page: {page + listing:.2f} s, {verdict} the one-second goal")


if __name__ == "__main__":
    main()
