"""Questions per minute of Standard RAG on the same questions, per way of running the model.

Rows (pick with --rows, comma-separated):

  llama.cpp    the embedded llama.cpp back-end (`--llm embedded`: Qwen2.5-Coder-1.5B), one question after
               another (`run`)
  hf-b1        transformers, Qwen2.5-Coder-0.5B (`--llm hf-0.5b`), `run_many` with a window of 1
  hf-b8        the same, `run_many` with a window of 8: each round's answers as one padded batch
  server-4     a llama.cpp server with 4 parallel slots through the OpenAI-compatible back-end,
               `run_many` with 4 workers. Needs `--server-bin` (llama.cpp's `llama-server`, started here
               with `--parallel 4`) or `--server-url` (one already running); without either it falls back
               to `python -m llama_cpp.server`, which has ONE slot (llama-cpp-python has no parallel slots)
               and says so in the row's name.

Every row answers the same questions (the harness's seeded `--limit` sample, BM25 over the same
corpus, built once), with the response cache off; model loading and one warm-up request are timed
apart and not counted.
The last column is each row's throughput over the llama.cpp row's, measured in the same run.

    .venv/bin/python benchmarks/throughput.py [--limit 20] [--rows llama.cpp,hf-b1,hf-b8,server-4]
        [--dataset hotpotqa-dev500] [--threads N] [--llama-llm embedded] [--hf-llm hf-0.5b]
        [--server-bin PATH | --server-url URL --server-model NAME] [--answers]
"""
from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from metarag.evaluate.harness import DatasetSpec, load_questions
from metarag.llm.base import Decoding, generate
from metarag.llm.registry import make_llm, parse_llm_spec
from metarag.methods.registry import build_method
from metarag.methods.runner import Runtime, run, run_many
from metarag.metrics import score_answer
from metarag.pipeline import open_retriever
from metarag.records import Message, Trace

ROWS = ("llama.cpp", "hf-b1", "hf-b8", "server-4")
LLAMA_MODEL = "qwen2.5-coder-1.5b-instruct"  # what the server row serves: the llama.cpp row's model


@dataclass
class Row:
    name: str
    detail: str
    load_s: float
    run_s: float
    traces: list[Trace]

    @property
    def per_minute(self) -> float:
        return 60 * len(self.traces) / self.run_s if self.run_s > 0 else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=20, help="questions (the harness's seeded sample; default 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dataset", default="hotpotqa-dev500",
                        help="a preset; falls back to the shipped demo set when its files are absent")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of each back-end (default: all)")
    parser.add_argument("--llama-llm", default="embedded", help="the llama.cpp row's --llm (default: embedded)")
    parser.add_argument("--hf-llm", default="hf-0.5b", help="the transformers rows' --llm (default: hf-0.5b)")
    parser.add_argument("--server-bin", default=None, help="llama.cpp's llama-server binary, for server-4")
    parser.add_argument("--server-url", default=None, help="an OpenAI-compatible server already running")
    parser.add_argument("--server-model", default="qwen-1.5b", help="its model name (with --server-url)")
    parser.add_argument("--answers", action="store_true", help="print every row's answers too")
    args = parser.parse_args()
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {', '.join(unknown)}; valid: {', '.join(ROWS)}")

    from metarag.errors import ConfigError

    try:
        dataset = load_questions(DatasetSpec(preset=args.dataset, limit=args.limit, seed=args.seed))
    except ConfigError as exc:
        print(f"{args.dataset}: {exc}; using the shipped demo set", file=sys.stderr)
        dataset = load_questions(DatasetSpec(preset="demo", limit=args.limit, seed=args.seed))
    questions = list(dataset.questions)
    with tempfile.TemporaryDirectory() as tmp:
        retriever = open_retriever(list(dataset.passages), "bm25", f"{tmp}/index")
        print(f"{len(questions)} questions of {dataset.name}, Standard RAG, BM25 over {len(dataset.passages)} "
              f"passages, response cache off", flush=True)
        measured: list[Row] = []
        for name in rows:
            row = MEASURE[name](questions, retriever, args)
            if row is not None:
                measured.append(row)
                print(f"  {row.name}: {row.per_minute:.1f} q/min ({row.detail})", flush=True)
    print_table(measured, {q.id: q.answers for q in questions})
    by_name = {row.name: row for row in measured}
    if "hf-b1" in by_name and "hf-b8" in by_name:  # the same model: batching must not change an answer
        same = sum(a.answer == b.answer for a, b in zip(by_name["hf-b1"].traces, by_name["hf-b8"].traces))
        print(f"hf-b8 answers equal to hf-b1's: {same} of {len(questions)}")
    if args.answers:
        for row in measured:
            print(f"{row.name}: " + " | ".join(repr(t.answer) if t.error is None else f"ERROR {t.error}"
                                               for t in row.traces))


def timed_row(name: str, detail: str, load: Callable[[], object], go: Callable[[object], list[Trace]]) -> Row:
    """Load (and warm up with one short request: first-touch costs are not throughput), then time `go`."""
    start = time.perf_counter()
    llm = load()
    generate(llm, (Message("user", "Say hi."),), Decoding(max_tokens=2))
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    traces = go(llm)
    return Row(name, detail, load_s, time.perf_counter() - start, traces)


def local_llm(spec: str, args):
    """The back-end `--llm spec` names, without the response cache: every row measures its model."""
    return make_llm(parse_llm_spec(spec, n_threads=args.threads, response_cache=False))


def llama_row(questions, retriever, args) -> Row:
    method = build_method("standard-rag")
    return timed_row("llama.cpp", f"--llm {args.llama_llm}, in turn", lambda: local_llm(args.llama_llm, args),
                     lambda llm: [run(method, q, Runtime(llm, retriever)) for q in questions])


_HF: list = []  # the hf rows share one loaded model: the second row's load time is 0


def hf_row(window: int) -> Callable:
    def measure(questions, retriever, args) -> Row:
        def load():
            if not _HF:
                _HF.append(local_llm(args.hf_llm, args))
            return _HF[0]

        method = build_method("standard-rag")
        return timed_row(f"hf-b{window}", f"--llm {args.hf_llm}, batch {window}", load,
                         lambda llm: run_many(method, questions, Runtime(llm, retriever), window=window))
    return measure


def server_row(questions, retriever, args) -> Row | None:
    from metarag.llm.openai_compat import OpenAICompatLLM, OpenAISettings

    method = build_method("standard-rag")
    with served(args) as (url, model, detail):
        return timed_row("server-4" if "1 slot" not in detail else "server-1slot", detail,
                         lambda: OpenAICompatLLM(OpenAISettings(base_url=url, model=model, timeout_s=600)),
                         lambda llm: run_many(method, questions, Runtime(llm, retriever, workers=4)))


@contextlib.contextmanager
def served(args) -> Iterator[tuple[str, str, str]]:
    """(base URL, model name, description) of the server row's server, started here unless given."""
    if args.server_url:
        yield args.server_url, args.server_model, f"{args.server_url}, 4 workers"
        return
    from metarag.llm.models import embedded_model, ensure_gguf

    gguf = ensure_gguf(embedded_model(LLAMA_MODEL))
    port = _free_port()
    threads = [] if args.threads is None else ["--threads", str(args.threads)]
    if args.server_bin:  # 4 slots of 4096 tokens each: -c is split between the slots
        argv = [args.server_bin, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--parallel", "4",
                "-c", str(4 * 4096), "--alias", "bench", *threads]
        detail = f"llama-server --parallel 4, {LLAMA_MODEL}, 4 workers"
    else:
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                "--port", str(port), "--n_ctx", "4096", "--model_alias", "bench",
                *(["--n_threads", str(args.threads)] if args.threads else [])]
        detail = (f"llama_cpp.server, 1 slot (no --server-bin: llama-cpp-python has no parallel slots), "
                  f"{LLAMA_MODEL}, 4 workers")
    url = f"http://127.0.0.1:{port}/v1"
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    log.seek(0)
                    err = log.read().decode(errors="replace")[-400:]
                    raise SystemExit(f"the server did not start: {err}") from None
                time.sleep(0.5)
        yield url, "bench", detail
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


MEASURE = {"llama.cpp": llama_row, "hf-b1": hf_row(1), "hf-b8": hf_row(8), "server-4": server_row}


def print_table(rows: list[Row], golds: dict[str, tuple[str, ...]]) -> None:
    base = next((r for r in rows if r.name == "llama.cpp"), None)
    print()
    print("| row | how | load s | run s | q/min | EM | F1 | failed | × llama.cpp |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        scores = [score_answer(t.answer or "", golds[t.question_id]) for t in row.traces]
        em = 100 * sum(s.em for s in scores) / len(scores)
        f1 = 100 * sum(s.f1 for s in scores) / len(scores)
        failed = sum(t.error is not None for t in row.traces)
        ratio = f"{row.per_minute / base.per_minute:.2f}" if base is not None else "n/a"
        print(f"| {row.name} | {row.detail} | {row.load_s:.1f} | {row.run_s:.1f} | {row.per_minute:.1f} | "
              f"{em:.1f} | {f1:.1f} | {failed} | {ratio} |")
    for row in rows:
        for trace in row.traces:
            if trace.error:
                print(f"{row.name}: {trace.question_id}: {trace.error}")
                break


if __name__ == "__main__":
    main()
