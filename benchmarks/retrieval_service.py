"""Queries per second and latency of the retrieval service at 1, 50 and 500 concurrent clients, batched or not.

The service (`metarag serve-retriever`'s app, in a child process) searches BM25 over `--passages`
passages pooled from the shipped datasets' paragraphs. Each client (asyncio, one keep-alive
connection each) sends one question per request (topk 5, a unique suffix so that no answer comes
from the retriever's cache) and the next as soon as the answer arrives, for `--seconds`; every
client's first request is a warm-up, not counted. Rows: "unbatched" is the service searching one
request at a time (`ServiceSettings(max_batch_queries=1, batch_window_s=0)`, as before batching);
"batched" its defaults (the requests that arrive while a batch is searched form the next batch).
Last, a 40 MB body is sent to the batched service: the time to its answer (413) and to a /health
asked meanwhile. The last column is the
batched service's throughput over the unbatched one's at the same number of clients, measured in
the same run.

    .venv/bin/python benchmarks/retrieval_service.py [--clients 1,50,500] [--seconds 5] [--passages 20000]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PRESETS = ("hotpotqa-dev500", "2wiki-dev1000", "multihop-rag-500", "hotpotqa-train100", "musique-train100")
UNBATCHED = {"max_batch_queries": 1, "batch_window_s": 0.0}


def pool(n: int):
    """Up to `n` distinct passages and every question text, from the presets that are present."""
    from metarag.data.datasets import PRESETS as KNOWN
    from metarag.data.datasets import resolve_preset
    from metarag.errors import MetaRAGError

    passages, seen, questions = [], set(), []
    for name in (p for p in PRESETS if p in KNOWN):
        try:
            dataset = resolve_preset(name)
        except MetaRAGError:
            continue
        questions.extend(q.text for q in dataset.questions)
        for passage in dataset.passages or ():
            if passage.id not in seen and len(passages) < n:
                seen.add(passage.id)
                passages.append(passage)
    return passages, questions


def serve(passages: int, settings: dict) -> None:
    """The child: build BM25 over the pool, serve it, print the URL."""
    from metarag.pipeline import open_retriever
    from metarag.retrieve.service import ServiceSettings
    from metarag.retrieve.service import serve as serve_app

    with tempfile.TemporaryDirectory() as tmp:
        retriever = open_retriever(pool(passages)[0], "bm25", f"{tmp}/index")
        serve_app(retriever, "127.0.0.1", 0, log_level="warning", settings=ServiceSettings(**settings),
                  on_listening=lambda url: print(url, flush=True))


async def load(host: str, port: int, clients: int, seconds: float, questions: list[str]) -> tuple[int, list[float]]:
    """`clients` closed-loop clients for `seconds`: (requests answered, their latencies in seconds)."""
    latencies: list[float] = []
    counter = iter(range(10 ** 9))
    start_line = asyncio.Event()
    ready = 0
    end = [0.0]

    async def client() -> None:
        nonlocal ready
        reader, writer = await asyncio.open_connection(host, port)

        async def ask() -> None:
            n = next(counter)
            body = json.dumps({"queries": [f"{questions[n % len(questions)]} q{n}"], "topk": 5}).encode()
            writer.write(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace").splitlines()[0])
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            await reader.readexactly(length)

        await ask()  # warm-up
        ready += 1
        if ready == clients:
            end[0] = time.perf_counter() + seconds
            start_line.set()
        await start_line.wait()
        while time.perf_counter() < end[0]:
            sent = time.perf_counter()
            await ask()
            latencies.append(time.perf_counter() - sent)
        writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return len(latencies), latencies


async def oversized(host: str, port: int, size: int) -> tuple[str, float, float]:
    """Send a body of `size` bytes and, meanwhile, GET /health on another connection: (the big
    request's status line, seconds to it, seconds to the /health answer)."""
    async def big() -> tuple[str, float]:
        start = time.perf_counter()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(size).encode() + b"\r\n\r\n")
        body = b'{"queries": ["' + b"a" * (size - 20) + b'"], "topk": 5}'
        try:
            writer.write(body[:size])
            await asyncio.wait_for(writer.drain(), 30)
        except (ConnectionError, asyncio.TimeoutError):
            pass  # the service answered and closed before taking it all
        status = (await reader.readline()).decode().strip()
        writer.close()
        return status, time.perf_counter() - start

    async def health() -> float:
        await asyncio.sleep(0.01)
        start = time.perf_counter()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readline()
        writer.close()
        return time.perf_counter() - start

    (status, big_s), health_s = await asyncio.gather(big(), health())
    return status, big_s, health_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", help="run the service alone with these ServiceSettings (JSON)")
    parser.add_argument("--passages", type=int, default=20000)
    parser.add_argument("--clients", default="1,50,500")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--window-ms", type=float, default=None,
                        help="the batched service's batch_window_s in ms (default: ServiceSettings')")
    args = parser.parse_args()
    if args.serve is not None:
        # a child exits when its stdin closes: with its parent, however that ends
        threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
        serve(args.passages, json.loads(args.serve))
        return

    passages, questions = pool(args.passages)
    counts = [int(c) for c in args.clients.split(",")]
    print(f"BM25 over {len(passages)} passages, {len(questions)} questions, topk 5, one query per request, "
          f"{args.seconds:g} s per row")
    print(f"{'service':<11}{'clients':>8}{'queries/s':>11}{'p50 ms':>9}{'p99 ms':>9}{'vs unbatched':>14}")
    unbatched: dict[int, float] = {}
    batched = {} if args.window_ms is None else {"batch_window_s": args.window_ms / 1000}
    for name, settings in (("unbatched", UNBATCHED), ("batched", batched)):
        child = subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(settings), "--passages",
                                  str(args.passages)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            host, port = child.stdout.readline().strip().removeprefix("http://").rsplit(":", 1)
            for clients in counts:
                answered, latencies = asyncio.run(load(host, int(port), clients, args.seconds, questions))
                qps = answered / args.seconds
                ordered = sorted(latencies)
                p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
                if name == "unbatched":
                    unbatched[clients] = qps
                ratio = f"{qps / unbatched[clients]:.2f}x" if name == "batched" else ""
                print(f"{name:<11}{clients:>8}{qps:>11.0f}{1000 * statistics.median(latencies):>9.1f}"
                      f"{1000 * p99:>9.1f}{ratio:>14}", flush=True)
            if name == "batched":
                status, big_s, health_s = asyncio.run(oversized(host, int(port), 40_000_000))
                print(f"a 40 MB body: {status!r} after {1000 * big_s:.0f} ms; /health meanwhile answered in "
                      f"{1000 * health_s:.1f} ms")
        finally:
            child.terminate()
            child.wait(10)


if __name__ == "__main__":
    main()
