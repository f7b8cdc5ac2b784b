"""Questions per second of `metarag eval --llm openai --workers K` against a served model that is never the bottleneck.

A stand-in OpenAI-compatible server (started here in its own process: asyncio, no model) answers
every completion after a fixed latency whatever the concurrency and counts the requests in flight,
so any shortfall from the ideal K / (latency x requests per question) questions per second is the
client's. Each row runs the whole harness (BM25 over the dataset's passages built once, the runner,
scoring, the fsync'd run folder) with the response cache off, for Standard RAG (one request per
question) and IRCoT (one request per reasoning step; the stand-in's reply never says "So the answer
is", so every question takes IRCoT's full number of steps, each with a retrieval). The dataset's
questions are repeated (ids made unique) so that every row runs several waves of K.

Marginal throughput leaves out what a run spends once (start-up, the first and last waves): each
row runs `--waves` x K questions and half as many, and divides the extra questions by the extra
seconds (each the least of `--repeat` runs); "of ideal" divides that by K / (latency x requests
per question). "peak" is the most
requests the stand-in saw in flight at once in the longer run (K at best).

    .venv/bin/python benchmarks/served_throughput.py [--workers 16,64,256] [--latency 0.5]
        [--methods standard-rag,ircot] [--dataset hotpotqa-dev500] [--waves 4] [--repeat 1]
    .venv/bin/python benchmarks/served_throughput.py --serve [--port 0] [--latency 0.5]   # the stand-in alone
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPLY = "The passages name the place in the question."  # no "So the answer is": IRCoT runs every step
# Rendered here, so that IRCoT can continue its reasoning turn on /completions (as with `chat_template`).
TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: "


# ------------------------------------------------------------------------------------ the stand-in
def serve(port: int, latency_s: float, reply: str) -> None:
    """The stand-in server: HTTP/1.1 with keep-alive on asyncio, one coroutine per connection; prints
    its port. `GET /stats` answers the requests in flight, their peak, the completions and the
    connections opened (`/stats?reset` starts the peak and the counts again)."""
    state = {"inflight": 0, "peak": 0, "requests": 0, "connections": 0}

    def completion(path: str, body: bytes) -> bytes:
        asked = json.loads(body) if body else {}
        chat = path.endswith("/chat/completions")
        logprobs = None
        if asked.get("logprobs"):  # a label probe: "Yes" on top, "No" beside it
            top = [("Yes", -0.2), ("No", -1.7)]
            logprobs = ({"content": [{"token": "Yes", "logprob": -0.2, "bytes": None,
                                      "top_logprobs": [{"token": t, "logprob": v, "bytes": None} for t, v in top]}]}
                        if chat else {"tokens": ["Yes"], "token_logprobs": [-0.2], "top_logprobs": [dict(top)],
                                      "text_offset": [0]})
        text = "Yes" if logprobs else reply
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                      "logprobs": logprobs}
        else:
            choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": logprobs}
        return json.dumps({"id": "x", "object": "chat.completion" if chat else "text_completion", "created": 0,
                           "model": "stand-in", "choices": [choice],
                           "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}}).encode()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state["connections"] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    if line[:15].lower() == "content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length) if length else b""
                if method == "POST" and path.endswith("completions"):
                    state["inflight"] += 1
                    state["requests"] += 1
                    state["peak"] = max(state["peak"], state["inflight"])
                    try:
                        await asyncio.sleep(latency_s)
                    finally:
                        state["inflight"] -= 1
                    answer = completion(path, body)
                elif path.startswith("/stats"):
                    answer = json.dumps(state).encode()
                    if "reset" in path:
                        state["peak"] = state["inflight"]
                        state["requests"] = state["connections"] = 0
                else:  # /v1/models and anything else
                    answer = json.dumps({"object": "list", "data": [{"id": "stand-in", "object": "model"}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(answer)).encode() + b"\r\n\r\n" + answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    async def listen() -> None:
        server = await asyncio.start_server(connection, "127.0.0.1", port, backlog=4096)
        print(server.sockets[0].getsockname()[1], flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(listen())


class StandIn:
    """The stand-in in a subprocess (its own interpreter, so it never competes for this one's GIL)."""

    def __init__(self, latency_s: float):
        # it exits when its stdin closes: with this process, however this one ends
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", "--latency", str(latency_s),
                                      "--exit-with-stdin"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def stats(self, reset: bool = False) -> dict:
        with urllib.request.urlopen(self.url + ("/stats?reset" if reset else "/stats"), timeout=10) as response:
            return json.loads(response.read())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# ------------------------------------------------------------------------------------ the client
def timed(method: str, workers: int, n: int, stand_in: StandIn, retriever, questions_file: str,
          runs_dir: str) -> tuple[float, dict, list]:
    """Seconds `evaluate` takes over the first `n` questions of `questions_file` with `workers` at
    once (the whole harness: run folder, checks, every result written), the stand-in's counts, the results."""
    from metarag.evaluate.harness import DatasetSpec, EvalConfig, evaluate
    from metarag.llm.openai_compat import OpenAICompatLLM, OpenAISettings
    from metarag.llm.registry import LLMSpec

    llm = OpenAICompatLLM(OpenAISettings(base_url=stand_in.url + "/v1", model="stand-in", chat_template=TEMPLATE))
    config = EvalConfig(method=method, dataset=DatasetSpec(file=questions_file, format="ircot", limit=n),
                        llm=LLMSpec(backend="openai", base_url=llm.settings.base_url, model="stand-in",
                                    response_cache=False),
                        workers=workers, runs_dir=tempfile.mkdtemp(dir=runs_dir))  # a fresh run each time
    stand_in.stats(reset=True)
    start = time.perf_counter()
    _, results = evaluate(config, progress=False, llm=llm, retriever=retriever)
    return time.perf_counter() - start, stand_in.stats(), results


def measure(method: str, workers: int, waves: int, stand_in: StandIn, retriever, questions_file: str,
            latency_s: float, runs_dir: str, repeat: int = 1) -> dict:
    """One row: the extra questions of a run of `waves` x K over a run of half as many, per extra
    second; each run's time is the least of `repeat` (a loaded machine's noise only adds time)."""
    short = min(timed(method, workers, waves // 2 * workers, stand_in, retriever, questions_file, runs_dir)[0]
                for _ in range(repeat))
    longs = [timed(method, workers, waves * workers, stand_in, retriever, questions_file, runs_dir)
             for _ in range(repeat)]
    long, stats, results = min(longs, key=lambda run: run[0])
    requests = stats["requests"] / len(results)
    extra = (waves - waves // 2) * workers
    ideal = workers / (latency_s * requests)
    return {"questions": len(results), "failed": sum(r.failed for r in results), "requests": requests,
            "marginal": extra / (long - short), "ideal": ideal, "share": extra / (long - short) / ideal,
            "peak": max(run[1]["peak"] for run in longs), "connections": stats["connections"]}


def questions_file_of(dataset: str) -> Path:
    from metarag.data.datasets import PRESETS, find_data_dir

    return find_data_dir() / PRESETS[dataset].path


def repeated_questions(dataset: str, at_least: int, path: str) -> None:
    """The preset's questions repeated (ids made unique) until there are `at_least`, in its own
    format (an "ircot" file: each question carries its paragraphs, so the passages stay the same)."""
    lines = questions_file_of(dataset).read_text(encoding="utf-8").splitlines()
    with open(path, "w", encoding="utf-8") as out:
        for copy in range(math.ceil(at_least / len(lines))):
            for line in lines:
                record = json.loads(line)
                record["question_id"] = f"{record['question_id']}#{copy}"
                out.write(json.dumps(record) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="run the stand-in server alone (prints its port)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--exit-with-stdin", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the stand-in takes per request")
    parser.add_argument("--workers", default="16,64,256")
    parser.add_argument("--methods", default="standard-rag,ircot")
    parser.add_argument("--dataset", default="hotpotqa-dev500", help="a preset in the IRCoT format")
    parser.add_argument("--waves", type=int, default=4, help="questions per row: this many times K")
    parser.add_argument("--repeat", type=int, default=1, help="time each run this many times, keep the least "
                                                               "(a loaded machine's noise only slows a run)")
    args = parser.parse_args()
    if args.serve:
        if args.exit_with_stdin:
            threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
        serve(args.port, args.latency, REPLY)
        return

    from metarag.data.datasets import load_dataset
    from metarag.pipeline import open_retriever

    ks = [int(k) for k in args.workers.split(",")]
    stand_in = StandIn(args.latency)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            questions_file = f"{tmp}/questions.jsonl"
            repeated_questions(args.dataset, args.waves * max(ks), questions_file)
            passages = load_dataset(questions_file, "ircot").passages
            retriever = open_retriever(list(passages), "bm25", f"{tmp}/index")
            print(f"stand-in server: {args.latency:g} s per request at any concurrency; {args.dataset}'s questions "
                  f"(repeated), BM25 over {len(passages)} passages, response cache off")
            print(f"{'method':<14}{'K':>5}{'questions':>11}{'req/q':>7}{'marginal q/s':>14}{'ideal q/s':>11}"
                  f"{'of ideal':>10}{'peak in flight':>16}")
            for method in args.methods.split(","):
                for workers in ks:
                    row = measure(method, workers, args.waves, stand_in, retriever, questions_file, args.latency,
                                  tmp, args.repeat)
                    failed = f"  ({row['failed']} failed)" if row["failed"] else ""
                    print(f"{method:<14}{workers:>5}{row['questions']:>11}{row['requests']:>7.1f}"
                          f"{row['marginal']:>14.1f}{row['ideal']:>11.1f}{row['share']:>10.2f}"
                          f"{row['peak']:>16}{failed}", flush=True)
    finally:
        stand_in.close()


if __name__ == "__main__":
    main()
