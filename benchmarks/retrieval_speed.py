"""How fast retrieval is: BM25 against raw bm25s and rank_bm25, and (--scale) every back-end at 1M passages.

Default mode (`--mode 2wiki`): loads the 2WikiMultiHopQA 6,119-passage corpus and its 1,000 dev
questions, indexes the corpus once with bm25s, and reports queries per second for
  (a) BM25Retriever.search, (b) raw bm25s (tokenize + retrieve) on the same saved index,
  (c) rank_bm25's BM25Okapi get_scores + argsort (on a subset: it scores every passage in Python),
plus our overhead over raw bm25s and how much faster raw bm25s is than rank_bm25.

Scale mode (`--scale [N]` or `--passages N`, N = 1,000,000 unless given): a synthetic corpus of N
passages (seeded Zipf-distributed random words, `--words` 20-30 per passage) and reports, for the
`--parts` asked (all by default):
  * BM25 index build time, size and this process's peak memory, and peak memory (VmHWM, measured
    in a fresh child process per case) of loading the index with and without memory-mapping;
  * BM25 queries/s, ours against raw bm25s on the same memory-mapped index;
  * dense: FAISS flat against each `--dense-index` type (hnsw, ivfpq): build and training time,
    index size, search speed and recall@10 against flat, over synthetic unit vectors of dimension
    384 (encoding N passages with MiniLM on 2 cores would take hours), over the first
    `--dense-scale` passages; IVF-PQ by its codes alone and with its top R candidates re-scored
    with the exact float16 vectors memory-mapped from disk (`--rescore`, `DenseSettings.ivfpq_rescore`),
    at each of `--nprobes`, with the size of those vectors on disk;
  * hybrid (RRF of BM25 and HNSW top 100, top 5 kept) queries/s with precomputed query embeddings,
    plus MiniLM's query-encoding time measured on its own;
  * per-query latency of the remote retriever (the service in a child process on a free loopback
    port) against in-process search of the same BM25 index.

    PYTHONPATH=src python benchmarks/retrieval_speed.py [--data DIR] [--k 10]
    PYTHONPATH=src python benchmarks/retrieval_speed.py --scale [N] [--dense-scale M]
    PYTHONPATH=src python benchmarks/retrieval_speed.py --passages 5000000 --words 10-15 --parts bm25
    PYTHONPATH=src python benchmarks/retrieval_speed.py --passages 1000000 --parts dense \
        --dense-scale 1000000 --dense-index ivfpq
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from metarag.data.corpus import load_corpus
from metarag.records import Passage
from metarag.retrieve.bm25 import BM25Retriever, BM25Settings
from metarag.retrieve.memory import tokenize

# The shared benchmark data sits beside the repository: <repo>/../shared/data.
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def queries_per_second(run_one: Callable[[str], object], queries: Sequence[str], repeats: int) -> float:
    """Best of `repeats` passes over `queries` (the least disturbed by other work on the machine)."""
    for query in queries[:20]:  # warm caches and memory maps before timing
        run_one(query)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for query in queries:
            run_one(query)
        best = min(best, time.perf_counter() - start)
    return len(queries) / best


def paired_queries_per_second(first: Callable[[str], object], second: Callable[[str], object],
                              queries: Sequence[str], repeats: int) -> tuple[float, float]:
    """Queries per second of two searches timed query by query, alternating which runs first.

    Pairing each query's two runs lets drift in machine load hit both alike; each side keeps its
    best pass of `repeats`.
    """
    for query in queries[:20]:
        first(query)
        second(query)
    best = [float("inf"), float("inf")]
    clock = time.perf_counter
    for rep in range(repeats):
        totals = [0.0, 0.0]
        order = ((0, first), (1, second)) if rep % 2 == 0 else ((1, second), (0, first))
        for query in queries:
            for side, run_one in order:
                start = clock()
                run_one(query)
                totals[side] += clock() - start
        best = [min(b, t) for b, t in zip(best, totals)]
    return len(queries) / best[0], len(queries) / best[1]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("2wiki", "scale"), default="2wiki",
                        help="2wiki: BM25 on the 2Wiki corpus (default); scale: every back-end on N synthetic passages")
    parser.add_argument("--scale", "--passages", type=int, nargs="?", const=1_000_000, default=None, metavar="N",
                        help="scale mode over N synthetic passages (default N: 1,000,000)")
    parser.add_argument("--words", default="20-30", metavar="MIN-MAX",
                        help="scale mode: words per synthetic passage (default 20-30; fewer keep a 5M-passage "
                             "build within a memory budget: bm25s's build holds ~60 bytes per posting)")
    parser.add_argument("--parts", default="bm25,dense,hybrid,remote",
                        help="scale mode: which measurements, comma-separated (default: all of "
                             "bm25,dense,hybrid,remote; hybrid needs bm25 and dense, remote needs bm25)")
    parser.add_argument("--dense-scale", type=int, default=200_000, metavar="M",
                        help="scale mode: passages given dense vectors (default 200,000: building HNSW over 1M "
                             "random 384-d vectors takes over 15 minutes on 2 cores)")
    parser.add_argument("--dense-index", default="hnsw", metavar="TYPES",
                        help="scale mode: approximate index types compared with flat, comma-separated: hnsw, "
                             "ivfpq (default: hnsw; the hybrid part needs hnsw)")
    parser.add_argument("--pq-m", default="0", metavar="M,...",
                        help="scale mode, ivfpq: code counts to compare, comma-separated (default 0: dim/8)")
    parser.add_argument("--rescore", default="100,200,500", metavar="R,...",
                        help="scale mode, ivfpq: re-scoring depths to compare besides the codes alone: IVF-PQ's top R "
                             "re-scored with the exact float16 vectors memory-mapped from disk (DenseSettings."
                             "ivfpq_rescore; default 100,200,500; 0 for none)")
    parser.add_argument("--nprobes", default="8,16,32,64,128,256,512", metavar="N,...",
                        help="scale mode, ivf/ivfpq: the nprobe values timed (default 8,16,32,64,128,256,512)")
    parser.add_argument("--dense-queries", type=int, default=0, metavar="Q",
                        help="scale mode: queries the dense indexes are timed on (default: all --queries; flat "
                             "search over 1M vectors takes ~0.1-0.5 s a query)")
    parser.add_argument("--faiss-threads", type=int, default=0,
                        help="scale mode: FAISS OpenMP threads (default: FAISS's own, one per core; on a loaded "
                             "machine 1 avoids threads spinning against each other)")
    parser.add_argument("--vectors", choices=("structured", "uniform"), default="structured",
                        help="scale mode: synthetic embeddings with low intrinsic dimension, like real ones "
                             "(default), or uniform on the sphere (the worst case for HNSW)")
    parser.add_argument("--queries", type=int, default=300, help="scale mode: queries timed")
    parser.add_argument("--raw-queries", type=int, default=30,
                        help="scale mode: queries raw bm25s is timed on (its top-k selection takes ~1 s per "
                             "query at 1M passages)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--corpus", default="2wikimultihopqa/dev1000_hipporag_corpus.json")
    parser.add_argument("--questions", default="2wikimultihopqa/dev1000_hipporag_questions.json")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=None, help="timed passes (default: 5 for 2wiki, 3 for scale)")
    parser.add_argument("--rank-bm25-queries", type=int, default=200,
                        help="how many questions rank_bm25 is timed on (it is slow)")
    args = parser.parse_args(argv)
    if args.scale is not None or args.mode == "scale":
        args.scale = args.scale or 1_000_000
        scale_benchmark(args)
    else:
        wiki_benchmark(args)


def wiki_benchmark(args: argparse.Namespace) -> None:
    """Our BM25 against raw bm25s and rank_bm25 on the 2Wiki corpus and questions."""
    repeats = args.repeats or 5
    import bm25s
    from rank_bm25 import BM25Okapi

    passages = load_corpus(args.data / args.corpus)
    questions = [q["question"] for q in json.loads((args.data / args.questions).read_text(encoding="utf-8"))]
    settings = BM25Settings()
    print(f"corpus: {len(passages)} passages; {len(questions)} questions; k={args.k}; "
          f"k1={settings.k1} b={settings.b} stopwords={settings.stopwords}")

    start = time.perf_counter()
    built = BM25Retriever.build(passages, settings)
    print(f"bm25s index built in {time.perf_counter() - start:.2f} s")

    with tempfile.TemporaryDirectory() as tmp:
        built.save(tmp)
        # Both read the very same saved files, memory-mapped, as open_bm25 does. The within-run cache
        # is off: the timed passes repeat every query, which it would answer without searching.
        ours = BM25Retriever.load(tmp, passages, settings=dataclasses.replace(settings, cache_size=0))
        raw = bm25s.BM25.load(tmp, mmap=True, show_progress=False)

        def raw_search(query: str) -> object:
            tokens = bm25s.tokenize(query, stopwords=settings.stopwords, return_ids=False,
                                    show_progress=False)
            return raw.retrieve(tokens, k=args.k, show_progress=False, n_threads=0)

        # Compared as sets: bm25s orders tied scores arbitrarily, we keep corpus order; and passages
        # tied for the k-th place may be others (ours: the earliest), so the scores are compared too.
        same_ids = same_scores = 0
        for q in questions:
            got = ours.search(q, args.k)
            indices, scores = (row[0].tolist() for row in raw_search(q))
            same_ids += {h.passage.id for h in got} == {passages[i].id for i, s in zip(indices, scores) if s > 0}
            same_scores += bool(np.allclose([h.score for h in got], [s for s in scores if s > 0], atol=1e-5))
        print(f"same top-{args.k} passages as raw bm25s: {same_ids}/{len(questions)} questions; "
              f"same top-{args.k} scores: {same_scores}/{len(questions)}")

        ours_best, raw_best = paired_queries_per_second(lambda q: ours.search(q, args.k), raw_search,
                                                        questions, repeats)

        start = time.perf_counter()
        ours.search_many(questions, args.k)
        batch_qps = len(questions) / (time.perf_counter() - start)

    stopwords = frozenset(bm25s.stopwords.STOPWORDS_EN) if settings.stopwords else frozenset()
    okapi = BM25Okapi([tokenize(p.contents(), stopwords) for p in passages], k1=settings.k1, b=settings.b)
    subset = questions[: args.rank_bm25_queries]

    def okapi_search(query: str) -> object:
        scores = okapi.get_scores(tokenize(query, stopwords))
        return np.argsort(-scores)[: args.k]

    okapi_qps = queries_per_second(okapi_search, subset, 1)

    print(f"(a) metarag BM25Retriever.search : {ours_best:9.1f} queries/s (best of {repeats} x "
          f"{len(questions)})")
    print(f"(b) raw bm25s tokenize+retrieve  : {raw_best:9.1f} queries/s (best of {repeats} x "
          f"{len(questions)})")
    print(f"(c) rank_bm25 BM25Okapi          : {okapi_qps:9.1f} queries/s (on the first {len(subset)} "
          "questions only)")
    print(f"    metarag search_many (batch)  : {batch_qps:9.1f} queries/s (all {len(questions)} in one call)")
    print(f"our overhead over raw bm25s: {100 * (raw_best / ours_best - 1):+.1f}% time per query")
    print(f"raw bm25s / rank_bm25 speed: {raw_best / okapi_qps:.1f}x")

# ------------------------------------------------------------------------------------ scale mode
VOCABULARY = 50_000
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
DIM = 384  # all-MiniLM-L6-v2's embedding size

# Run in a fresh interpreter per case, so each peak is that case's alone (VmHWM never goes down).
MEMORY_CHILD = r"""
import json, sys, time
def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
import bm25s
folder, mmap, queries_file, k = sys.argv[1], sys.argv[2] == "1", sys.argv[3], int(sys.argv[4])
with open(queries_file) as f:
    queries = json.load(f)
base = status("VmRSS")
start = time.perf_counter()
engine = bm25s.BM25.load(folder, mmap=mmap, show_progress=False)
load_s = time.perf_counter() - start
after_load = status("VmHWM")
for query in queries:  # scored as metarag's BM25Retriever does (it selects the top k itself)
    tokens = bm25s.tokenize(query, stopwords="en", return_ids=False, show_progress=False)[0]
    ids = engine.get_tokens_ids(tokens)
    if ids:
        engine.get_scores_from_ids(ids)
print(json.dumps({"base": base, "load_s": load_s, "after_load": after_load, "after_queries": status("VmHWM"),
                  "rss_after_queries": status("VmRSS")}))
"""

SERVER_CHILD = r"""
import sys
from metarag.records import Passage
from metarag.retrieve.bm25 import BM25Settings
from metarag.retrieve.index import open_saved
from metarag.retrieve.memory import MemoryRetriever
from metarag.retrieve.service import serve
if sys.argv[1] == "tiny":  # two passages: what a round trip costs besides the search
    retriever = MemoryRetriever([Passage("a", "", "alpha beta"), Passage("b", "", "beta gamma")])
else:  # the cache is off so repeated benchmark queries are searched, as in-process ones are
    retriever = open_saved(sys.argv[1], "bm25", bm25=BM25Settings(cache_size=0))
serve(retriever, "127.0.0.1", int(sys.argv[2]), log_level="warning")
"""


class LookupEncoder:
    """Stands in for a sentence-transformers model: each query text has a precomputed vector."""

    def __init__(self, vectors: dict[str, np.ndarray]):
        self.vectors = vectors

    def encode(self, texts: Sequence[str], **_: Any) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A markdown table: first column left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(row, widths))) + " |"

    print(f"\n{title}\n{line(cells[0])}")
    print("|" + "|".join(("-" * (w + 1) + ("-" if i == 0 else ":")) for i, w in enumerate(widths)) + "|")
    for row in cells[1:]:
        print(line(row))
    sys.stdout.flush()


def synthetic_corpus(n: int, queries: int, rng: np.random.Generator, words_per_passage: tuple[int, int] = (20, 30)
                     ) -> tuple[list[Passage], list[str]]:
    """N passages of 20-30 words (or `words_per_passage`, inclusive) and `queries` queries of 3-6 words,
    drawn from a Zipf(1) vocabulary.

    Queries skip the 100 most frequent words, as real queries mostly do stopwords.
    """
    vocab: set[str] = set()
    while len(vocab) < VOCABULARY:
        for size in rng.integers(2, 5, VOCABULARY):
            vocab.add("".join(SYLLABLES[i] for i in rng.integers(0, len(SYLLABLES), size)))
    words = sorted(vocab)[:VOCABULARY]
    rng.shuffle(words)  # the rank order must not be alphabetical
    probs = 1.0 / np.arange(1, VOCABULARY + 1)
    probs /= probs.sum()
    lengths = rng.integers(words_per_passage[0], words_per_passage[1] + 1, n)
    passages = []
    # A million passages' words at a time: all of 5M at once is a 1 GB list of pointers. For up to a
    # million passages the draws are those of one batch, so earlier corpora are unchanged.
    for first in range(0, n, 1_000_000):
        part = lengths[first:first + 1_000_000]
        drawn = [words[i] for i in rng.choice(VOCABULARY, size=int(part.sum()), p=probs).tolist()]
        ends = np.cumsum(part).tolist()
        passages.extend(Passage(f"p{first + i}", "", " ".join(drawn[end - length:end]))
                        for i, (end, length) in enumerate(zip(ends, part.tolist())))
        del drawn
    tail = probs[100:] / probs[100:].sum()
    texts = [" ".join(words[100 + i] for i in rng.choice(VOCABULARY - 100, size=size, p=tail))
             for size in rng.integers(3, 7, queries)]
    # Distinct queries: each timed query is a search, never a repeat.
    return passages, list(dict.fromkeys(texts))


def synthetic_vectors(n: int, queries: int, kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """N unit passage vectors of dimension 384 and `queries` query vectors, each near one passage.

    "structured": a 24-dimensional Gaussian latent through a fixed random 384x24 map plus noise (low
    intrinsic dimension, as sentence embeddings have); "uniform": uniform on the sphere.
    """
    if kind == "uniform":
        vectors = rng.standard_normal((n, DIM), dtype=np.float32)
        near = vectors[rng.integers(0, n, queries)] + 0.5 * rng.standard_normal((queries, DIM), dtype=np.float32)
    else:
        latent = rng.standard_normal((n, 24), dtype=np.float32)
        mapping = rng.standard_normal((24, DIM), dtype=np.float32)
        vectors = np.empty((n, DIM), dtype=np.float32)
        for start in range(0, n, 100_000):  # in slices: the noise of all rows at once is another copy
            part = latent[start:start + 100_000]
            vectors[start:start + len(part)] = part @ mapping + rng.standard_normal((len(part), DIM), dtype=np.float32)
        picked = latent[rng.integers(0, n, queries)] + 0.3 * rng.standard_normal((queries, 24), dtype=np.float32)
        near = picked @ mapping + rng.standard_normal((queries, DIM), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    near /= np.linalg.norm(near, axis=1, keepdims=True)
    return vectors, near


def measure_memory(folder: Path, mmap: bool, queries: Sequence[str], k: int) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(list(queries), f)
    try:
        out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(folder), "1" if mmap else "0", f.name, str(k)],
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    return json.loads(out.strip().splitlines()[-1])


def own_memory(key: str) -> int:
    """This process's VmRSS or VmHWM (peak resident) in bytes, from /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def per_query_ms(run_one: Callable[[str], object], queries: Sequence[str]) -> float:
    start = time.perf_counter()
    for query in queries:
        run_one(query)
    return 1000 * (time.perf_counter() - start) / len(queries)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServiceProcess:
    """`metarag`'s retrieval service in a child process on a free loopback port, stopped on exit."""

    def __init__(self, what: str):
        self.what = what
        self.url = f"http://127.0.0.1:{free_port()}"
        self.ready_s = 0.0

    def __enter__(self) -> ServiceProcess:
        from metarag.errors import MetaRAGError
        from metarag.retrieve.remote import RemoteRetriever

        start = time.perf_counter()
        self.child = subprocess.Popen([sys.executable, "-c", SERVER_CHILD, self.what, self.url.rsplit(":", 1)[1]],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        probe = RemoteRetriever(self.url, timeout_s=5, max_retries=0)
        while True:
            if self.child.poll() is not None:
                error = self.child.stderr.read() if self.child.stderr else ""
                raise SystemExit(f"the retrieval service exited: {error}")
            try:
                probe.health()
                break
            except MetaRAGError:
                time.sleep(0.5)
        self.ready_s = time.perf_counter() - start
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.child.send_signal(signal.SIGINT)
        try:
            self.child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


def dense_comparison(args: argparse.Namespace, passages: Sequence[Passage], queries: Sequence[str],
                     timed: Sequence[str], rng: np.random.Generator) -> Any:
    """Flat against each of `--dense-index` over `--dense-scale` synthetic vectors: build (and train)
    time, index memory, ms/query and recall@k against flat; returns the HNSW retriever (or None)."""
    import faiss

    from metarag.retrieve.dense import (
        EXACT_FILE,
        DenseRetriever,
        DenseSettings,
        exact_vectors,
        index_spec,
        make_index,
        with_index_type,
    )

    if args.faiss_threads:
        faiss.omp_set_num_threads(args.faiss_threads)
    kinds = [k.strip() for k in args.dense_index.split(",") if k.strip()]
    m = min(args.dense_scale, len(passages))
    log(f"making {m:,} synthetic {DIM}-d vectors ({args.vectors})")
    vectors, query_vectors = synthetic_vectors(m, len(queries), args.vectors, rng)
    encoder = LookupEncoder(dict(zip(queries, query_vectors)))
    dense_queries = list(timed[:args.dense_queries or len(timed)])

    def index_mb(index: Any) -> str:
        return f"{faiss.serialize_index(index).nbytes / 1e6:,.0f}"

    def timed_build(settings: DenseSettings, spec: dict[str, Any]) -> tuple[DenseRetriever, float, float]:
        before = own_memory("VmRSS")
        start = time.perf_counter()
        retriever = DenseRetriever(passages[:m], make_index([vectors], spec), encoder, settings)
        return retriever, time.perf_counter() - start, (own_memory("VmRSS") - before) / 1e6

    def recall(retriever: DenseRetriever, exact: list) -> float:
        got = retriever.search_many(dense_queries, args.k)
        return statistics.mean(len({h.passage.id for h in g} & {h.passage.id for h in e}) / args.k
                               for g, e in zip(got, exact))

    base = DenseSettings(cache_size=0)
    log("building the flat index")
    flat, flat_s, flat_rss = timed_build(base, {"type": "flat"})
    log("timing flat search")
    for q in dense_queries[:5]:  # warm-up
        flat.search(q, args.k)
    flat_ms = per_query_ms(lambda q: flat.search(q, args.k), dense_queries)
    exact = flat.search_many(dense_queries, args.k)
    rows = [["flat (exact)", f"{flat_s:.1f}", index_mb(flat._index), "-", f"{flat_rss:,.0f}", "-", f"{flat_ms:.2f}",
             f"{1000 / flat_ms:,.0f}", "1.000"]]
    hnsw = None
    for kind in kinds:
        if kind == "hnsw":
            settings = with_index_type(base, "hnsw")
            spec = index_spec(m, settings)
            log(f"building the HNSW index ({spec})")
            hnsw, build_s, rss = timed_build(settings, spec)
            for ef in (32, 64, 128, 256):
                hnsw._index.hnsw.efSearch = ef
                ms = per_query_ms(functools.partial(hnsw.search, k=args.k), dense_queries)
                default = " (default)" if ef == settings.hnsw_ef_search else ""
                rows.append([f"HNSW M={spec['m']} efC={spec['ef_construction']}" if ef == 32 else "",
                             f"{build_s:.1f}" if ef == 32 else "", index_mb(hnsw._index) if ef == 32 else "",
                             "-" if ef == 32 else "", f"{rss:,.0f}" if ef == 32 else "", f"ef_search {ef}{default}",
                             f"{ms:.2f}", f"{1000 / ms:,.0f}", f"{recall(hnsw, exact):.3f}"])
            hnsw._index.hnsw.efSearch = settings.hnsw_ef_search
        elif kind == "ivfpq":
            nprobes = [int(v) for v in args.nprobes.split(",")]
            depths = [int(v) for v in args.rescore.split(",") if int(v) > 0]
            for pq_m in [int(v) for v in args.pq_m.split(",")]:
                settings = with_index_type(DenseSettings(cache_size=0, pq_m=pq_m), "ivfpq")
                spec = index_spec(m, settings)
                log(f"training and filling the IVF-PQ index ({spec})")
                before = own_memory("VmRSS")
                start = time.perf_counter()
                index = make_index([vectors], spec)
                with tempfile.TemporaryDirectory() as folder:  # the exact vectors as a saved index keeps them
                    exact_file = Path(folder) / EXACT_FILE
                    on_disk = exact_vectors([vectors], exact_file)
                    build_s = time.perf_counter() - start
                    ivfpq = DenseRetriever(passages[:m], index, encoder, settings, on_disk)
                    rss = (own_memory("VmRSS") - before) / 1e6
                    exact_mb = f"{exact_file.stat().st_size / 1e6:,.0f}"
                    codes = ivfpq._index.pq.M
                    first = True
                    for depth in [0, *depths]:
                        for nprobe in nprobes if depth == 0 else [n for n in nprobes if n >= 32]:
                            ivfpq.settings = dataclasses.replace(settings, ivfpq_rescore=depth, ivf_nprobe=nprobe)
                            ivfpq._index.nprobe = nprobe
                            ms = per_query_ms(functools.partial(ivfpq.search, k=args.k), dense_queries)
                            default = " (default)" if (nprobe, depth) == (settings.ivf_nprobe,
                                                                           settings.ivfpq_rescore) else ""
                            how = f"nprobe {nprobe}, " + (f"top {depth} re-scored" if depth else "codes only")
                            rows.append([f"IVF{spec['nlist']},PQ{codes}x{spec['nbits']}" if first else "",
                                         f"{build_s:.1f}" if first else "", index_mb(ivfpq._index) if first else "",
                                         exact_mb if first else "", f"{rss:,.0f}" if first else "", how + default,
                                         f"{ms:.2f}", f"{1000 / ms:,.0f}", f"{recall(ivfpq, exact):.3f}"])
                            first = False
                    mapped = (own_memory("VmRSS") - before) / 1e6
                    print(f"(IVF-PQ pq_m {codes}: RSS growth after every search above {mapped:,.0f} MB, the "
                          "exact vectors' pages read by re-scoring included)")
                    del ivfpq, on_disk
        else:
            raise SystemExit(f"--dense-index {kind!r}: compare flat with hnsw and/or ivfpq")
    vector_note = ("24-d Gaussian latent through a fixed random map plus noise, normalized"
                   if args.vectors == "structured" else "uniform on the sphere")
    print_table(f"Dense search over {m:,} SYNTHETIC random unit vectors of dimension {DIM} ({vector_note}; "
                f"not MiniLM embeddings), one query at a time, k={args.k}, {len(dense_queries)} queries, FAISS "
                f"threads {faiss.omp_get_max_threads()}",
                ["index", "build s (incl. training)", "index MB (serialized)", "exact vectors on disk MB",
                 "RSS growth MB", "search setting", "ms/query", "queries/s", f"recall@{args.k} vs flat"], rows)
    if m < len(passages):
        print(f"(dense over the first {m:,} passages only: --dense-scale)")
    return hnsw


def scale_benchmark(args: argparse.Namespace) -> None:
    """Every back-end over `args.scale` synthetic passages: build, memory, speed, recall, service."""
    import bm25s

    from metarag.errors import MetaRAGError
    from metarag.retrieve.dense import DenseSettings
    from metarag.retrieve.fusion import FusionRetriever
    from metarag.retrieve.index import index_stats, open_bm25, save_corpus
    from metarag.retrieve.remote import RemoteRetriever

    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    unknown = parts - {"bm25", "dense", "hybrid", "remote"}
    if unknown or ("hybrid" in parts and not {"bm25", "dense"} <= parts) or ("remote" in parts and "bm25" not in parts):
        raise SystemExit(f"--parts {args.parts!r}: choose from bm25,dense,hybrid,remote (hybrid needs bm25 and "
                         "dense, remote needs bm25)")
    if "hybrid" in parts and "hnsw" not in args.dense_index.split(","):
        raise SystemExit("--parts hybrid fuses BM25 with HNSW: keep hnsw in --dense-index")
    repeats = args.repeats or 3
    rng = np.random.default_rng(args.seed)
    n = args.scale
    log(f"generating {n:,} passages")
    start = time.perf_counter()
    low, _, high = args.words.partition("-")
    words = (int(low), int(high or low))
    passages, queries = synthetic_corpus(n, args.queries + 20, rng, words)
    timed = queries[:args.queries]
    print(f"synthetic corpus: {n:,} passages of {words[0]}-{words[1]} words (Zipf over {VOCABULARY:,} made-up "
          "words, seed "
          f"{args.seed}), made in {time.perf_counter() - start:.0f} s; {len(timed)} distinct queries of 3-6 "
          f"words; k={args.k}; {os.cpu_count()} CPU cores; load average at start "
          f"{os.getloadavg()[0]:.1f}; this process holds {own_memory('VmRSS') / 1e9:.2f} GB with the corpus")

    with tempfile.TemporaryDirectory(prefix="metarag-scale-") as tmp:
        root = Path(tmp) / "index"
        settings = BM25Settings(cache_size=0)  # every timed query is searched, never answered from cache
        # ------------------------------------------------------------------------------ BM25
        if "bm25" in parts:
            log("building the BM25 index")
            start = time.perf_counter()
            open_bm25(passages, root, settings)
            build_s = time.perf_counter() - start
            folder = root / "bm25"
            start = time.perf_counter()
            ours = open_bm25(passages, root, settings)
            reopen_s = time.perf_counter() - start
            print_table(f"BM25 index of {n:,} passages", ["measure", "value"], [
                ["first open_bm25: fingerprint, tokenize, index, save", f"{build_s:.1f} s"],
                ["reopen (fingerprint check + memory-mapped load)", f"{reopen_s:.1f} s"],
                ["index size on disk", f"{index_stats(folder).size_bytes / 1e6:.0f} MB"],
                ["peak resident memory of this process so far (VmHWM: corpus, build, save)",
                 f"{own_memory('VmHWM') / 1e9:.2f} GB"],
            ])

            log("measuring load memory in child processes")
            rows = []
            for mmap in (True, False):
                m = measure_memory(folder, mmap, timed, args.k)
                rows.append(["memory-mapped" if mmap else "read into memory", f"{m['load_s']:.2f} s",
                             f"{(m['after_load'] - m['base']) / 1e6:.0f} MB",
                             f"{(m['after_queries'] - m['base']) / 1e6:.0f} MB", f"{m['base'] / 1e6:.0f} MB"])
            print_table("BM25 index load: peak resident memory (VmHWM) above the interpreter with bm25s imported, "
                        "fresh process each; passages not included",
                        ["load", "load time", "peak after load", f"peak after {len(timed)} queries", "baseline"], rows)
            print("(memory-mapped pages touched by queries are file-backed: shared between processes and "
                  "reclaimable, unlike a private copy)")

            log("timing BM25 search: ours against raw bm25s")
            raw = bm25s.BM25.load(str(folder), mmap=True, show_progress=False)

            def raw_search(query: str) -> object:
                tokens = bm25s.tokenize(query, stopwords=settings.stopwords, return_ids=False, show_progress=False)
                return raw.retrieve(tokens, k=args.k, show_progress=False, n_threads=0)

            ours_qps = queries_per_second(lambda q: ours.search(q, args.k), timed, repeats)
            start = time.perf_counter()
            ours.search_many(timed, args.k)
            batch_qps = len(timed) / (time.perf_counter() - start)
            few = timed[:args.raw_queries]
            ours_few, raw_few = paired_queries_per_second(lambda q: ours.search(q, args.k), raw_search, few, 1)
            # Same answers: the k best scores agree (which of tied passages fill the last places may not).
            agree = sum(np.allclose([h.score for h in ours.search(q, args.k)],
                                    [s for s in raw_search(q)[1][0].tolist() if s > 0], atol=1e-5) for q in few)
            overhead = raw_few / ours_few - 1
            print_table(f"BM25 search, {n:,} passages, memory-mapped, k={args.k}, one query at a time",
                        ["search", "queries", "queries/s", "ms/query"], [
                            ["metarag BM25Retriever.search", f"{len(timed)} (best of {repeats})", f"{ours_qps:.1f}",
                             f"{1000 / ours_qps:.2f}"],
                            ["metarag search_many (one batch)", f"{len(timed)}", f"{batch_qps:.1f}",
                             f"{1000 / batch_qps:.2f}"],
                            ["metarag BM25Retriever.search", f"{len(few)} (paired)", f"{ours_few:.1f}",
                             f"{1000 / ours_few:.2f}"],
                            ["raw bm25s tokenize + retrieve", f"{len(few)} (paired)", f"{raw_few:.1f}",
                             f"{1000 / raw_few:.2f}"],
                        ])
            print(f"same top-{args.k} scores as raw bm25s: {agree}/{len(few)} queries; our time per query over raw "
                  f"bm25s: {100 * overhead:+.1f}% ({'within' if overhead <= 0.10 else 'OVER'} the +10% budget)")

        # ----------------------------------------------------------------------------- dense
        if "dense" in parts:
            hnsw = dense_comparison(args, passages, queries, timed, rng)

        # ---------------------------------------------------------------------------- hybrid
        if "hybrid" in parts:
            log("timing hybrid search")
            fused = FusionRetriever([ours, hnsw])
            bm25_100 = per_query_ms(lambda q: ours.search(q, 100), timed)
            hnsw_100 = per_query_ms(lambda q: hnsw.search(q, 100), timed)
            hybrid_ms = per_query_ms(lambda q: fused.search(q, 5), timed)
            rows = [["BM25 top 100", f"{1000 / bm25_100:.1f}", f"{bm25_100:.2f}"],
                    ["HNSW top 100 (precomputed query vector)", f"{1000 / hnsw_100:.1f}", f"{hnsw_100:.2f}"],
                    ["hybrid: RRF k=60 of both top 100, top 5", f"{1000 / hybrid_ms:.1f}", f"{hybrid_ms:.2f}"]]
            try:
                from metarag.retrieve.dense import encoder_path, load_encoder

                minilm = load_encoder(encoder_path(DenseSettings()))
                minilm.encode(timed[:5], show_progress_bar=False)
                encode_ms = per_query_ms(lambda q: minilm.encode([q], show_progress_bar=False), timed[:100])
                rows.append(["MiniLM query encoding alone (measured, 100 queries)", f"{1000 / encode_ms:.1f}",
                             f"{encode_ms:.2f}"])
                total = hybrid_ms + encode_ms
                rows.append(["hybrid with MiniLM encoding (sum of the two)", f"{1000 / total:.1f}", f"{total:.2f}"])
            except MetaRAGError as exc:
                rows.append([f"MiniLM query encoding: not measured ({exc})", "-", "-"])
            print_table(f"Hybrid retrieval, BM25 over {n:,} passages + HNSW over {m:,} vectors, one query at a time",
                        ["retriever", "queries/s", "ms/query"], rows)

        # ---------------------------------------------------------------------------- remote
        if "remote" in parts:
            log("writing the corpus copy and starting the retrieval service in a child process")
            save_corpus(root, passages)
            with ServiceProcess(str(root)) as service:
                remote = RemoteRetriever(service.url, cache_size=0)
                for query in queries[len(timed):]:  # warm both paths on queries not timed
                    remote.search(query, args.k)
                    ours.search(query, args.k)
                local_ms, remote_ms = [], []
                for query in timed:
                    t0 = time.perf_counter()
                    local_hits = ours.search(query, args.k)
                    t1 = time.perf_counter()
                    remote_hits = remote.search(query, args.k)
                    t2 = time.perf_counter()
                    local_ms.append(1000 * (t1 - t0))
                    remote_ms.append(1000 * (t2 - t1))
                    if remote_hits != local_hits:
                        raise SystemExit(f"remote and in-process hits differ for {query!r}")
                batch = timed[:100]
                t0 = time.perf_counter()
                ours.search_many(batch, args.k)
                t1 = time.perf_counter()
                remote.search_many(batch, args.k)
                t2 = time.perf_counter()
            with ServiceProcess("tiny") as tiny_service:
                tiny = RemoteRetriever(tiny_service.url, cache_size=0)
                for _ in range(20):
                    tiny.search("beta", 2)
                tiny_ms = []
                for _ in timed:
                    t3 = time.perf_counter()
                    tiny.search("beta", 2)
                    tiny_ms.append(1000 * (time.perf_counter() - t3))

            def p95(values: list[float]) -> float:
                return sorted(values)[int(0.95 * (len(values) - 1))]

            print_table(f"Remote retriever against in-process, same BM25 index ({n:,} passages), k={args.k}, "
                        f"{len(timed)} queries one at a time (service ready {service.ready_s:.0f} s after start, "
                        "corpus load included); every remote hit list equal to the in-process one",
                        ["path", "median ms", "p95 ms", "mean ms"], [
                            ["in-process BM25Retriever.search", f"{statistics.median(local_ms):.2f}",
                             f"{p95(local_ms):.2f}", f"{statistics.mean(local_ms):.2f}"],
                            ["RemoteRetriever.search (HTTP, loopback)", f"{statistics.median(remote_ms):.2f}",
                             f"{p95(remote_ms):.2f}", f"{statistics.mean(remote_ms):.2f}"],
                            ["RemoteRetriever.search, 2-passage index (HTTP round trip alone)",
                             f"{statistics.median(tiny_ms):.2f}", f"{p95(tiny_ms):.2f}",
                             f"{statistics.mean(tiny_ms):.2f}"],
                            [f"in-process search_many, {len(batch)} queries (per query)",
                             f"{1000 * (t1 - t0) / len(batch):.2f}", "-", "-"],
                            [f"remote search_many, {len(batch)} queries in one POST (per query)",
                             f"{1000 * (t2 - t1) / len(batch):.2f}", "-", "-"],
                        ])
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other jobs share this "
          "machine: absolute times are pessimistic; paired figures compare like with like)")


if __name__ == "__main__":
    main()
