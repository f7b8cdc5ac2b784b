"""`metarag ask`, `index build` and `serve-retriever`: one question answered with its trace, and the
indexes and retrieval service an evaluation retrieves from."""
from __future__ import annotations

import argparse
import sys

from metarag.cli.args import (
    add_corpus_args,
    add_llm_args,
    add_method_args,
    add_options,
    add_reranker_args,
    llm_spec_from_args,
    port_number,
    raise_config,
)
from metarag.retrieve.index import RETRIEVERS


def add_ask(sub) -> None:
    ask = sub.add_parser("ask", help="answer one question and show the trace",
                         description="Answer one question with a method and print the answer and a "
                                     "readable trace (each step, what was retrieved, time, tokens).")
    ask.add_argument("question", help="the question to answer")
    add_method_args(ask)
    add_corpus_args(ask)
    add_options(ask, ("retriever",), defaults=True)
    add_reranker_args(ask)
    add_llm_args(ask)
    ask.add_argument("--json", action="store_true", help="print the whole trace as JSON instead")
    ask.set_defaults(handler=cmd_ask)


def add_index(sub) -> None:
    index = sub.add_parser("index", help="build or inspect retrieval indexes")
    index_sub = index.add_subparsers(title="index commands", metavar="ACTION")
    build = index_sub.add_parser("build", help="build the BM25 and dense indexes of a corpus",
                                 description="Build (or reuse, when the corpus and settings match) the "
                                             "indexes of a corpus and report their size and build time.")
    add_corpus_args(build)
    build.add_argument("--retrievers", default="bm25,dense",
                       help="which indexes to build, comma-separated (default: bm25,dense)")
    build.add_argument("--dense-index", default=None, metavar="TYPE",
                       help="flat, hnsw, ivf or ivfpq: the dense index's FAISS type whatever the corpus size "
                            "(default: flat up to 200,000 passages, HNSW beyond; ivfpq: product-quantized, "
                            "~32x smaller, for corpora that do not fit in memory as float32)")
    build.set_defaults(handler=cmd_index_build)


def add_serve_retriever(sub) -> None:
    srv = sub.add_parser("serve-retriever", help="serve an index over HTTP for many workers",
                         description="Serve a built index (from `metarag index build`) on POST /retrieve "
                                     '{"queries": [...], "topk": k} and GET /health, bound to 127.0.0.1 unless '
                                     "--host says otherwise. Evaluations use it with --retriever remote:URL.")
    srv.add_argument("--index", required=True, metavar="DIR", help="the index folder `metarag index build` printed")
    srv.add_argument("--corpus", default=None, help="the corpus file, if the index folder holds no copy of it")
    srv.add_argument("--retriever", default="bm25", choices=RETRIEVERS)
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; 0.0.0.0: every "
                     "interface)")
    srv.add_argument("--port", type=port_number, default=8000, help="port, 0..65535 (0: a free one; default: 8000)")
    srv.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="a batching setting or request limit (repeatable): batch_window_s, max_batch_queries, "
                          "max_body_bytes, max_queries, max_query_chars, max_topk, max_hits (see ServiceSettings)")
    srv.set_defaults(handler=cmd_serve_retriever)


def cmd_ask(args: argparse.Namespace) -> int:
    from metarag.display import format_trace
    from metarag.pipeline import answer_question, method_from_args

    if not args.question.strip():
        raise_config("the question is empty")
    method = method_from_args(args.method, args.k, args.set)
    trace = answer_question(args.question, method, corpus=args.corpus, retriever=args.retriever,
                            index_dir=args.index_dir, reranker=args.reranker, rerank_depth=args.rerank_depth,
                            llm_spec=llm_spec_from_args(args),
                            on_step=None if args.json else _live_printer())
    if args.json:
        print(trace.to_json())
    else:
        print(format_trace(trace, header_only=True))
    if trace.error is not None:
        print(f"metarag: error: {trace.error}", file=sys.stderr)
        return 1
    return 0


def cmd_index_build(args: argparse.Namespace) -> int:
    from metarag.pipeline import build_indexes

    for line in build_indexes(args.corpus, args.retrievers.split(","), index_dir=args.index_dir,
                              dense_index=args.dense_index):
        print(line)
    return 0


def cmd_serve_retriever(args: argparse.Namespace) -> int:
    from metarag.retrieve.index import open_saved
    from metarag.retrieve.service import ServiceSettings, check_address, serve
    from metarag.settings import override, parse_assignments

    check_address(args.host, args.port)  # before the index loads
    settings = override(ServiceSettings(), parse_assignments(args.set), owner="serve-retriever")
    retriever = open_saved(args.index, args.retriever, args.corpus)
    serve(retriever, args.host, args.port, settings=settings, on_listening=lambda url: print(
        f"serving {args.retriever} over {args.index} on {url} (POST /retrieve, GET /health)", file=sys.stderr,
        flush=True))
    return 0


def _live_printer():
    from metarag.display import format_step

    def show(step) -> None:
        print(format_step(step), flush=True)
    return show
