"""The `metarag` command: parses arguments, calls library functions, prints. No logic of its own."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from metarag.errors import MetaRAGError


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except MetaRAGError as exc:
        print(f"metarag: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("metarag: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metarag",
        description="Metacognitive and adaptive RAG for multi-hop QA, offline by default.")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    ask = sub.add_parser("ask", help="answer one question and show the trace",
                         description="Answer one question with a method and print the answer and a "
                                     "readable trace (each step, what was retrieved, time, tokens).")
    ask.add_argument("question", help="the question to answer")
    add_method_args(ask)
    add_corpus_args(ask)
    add_llm_args(ask)
    ask.add_argument("--json", action="store_true", help="print the whole trace as JSON instead")
    ask.set_defaults(handler=cmd_ask)

    index = sub.add_parser("index", help="build or inspect retrieval indexes")
    index_sub = index.add_subparsers(title="index commands", metavar="ACTION")
    build = index_sub.add_parser("build", help="build the BM25 and dense indexes of a corpus",
                                 description="Build (or reuse, when the corpus and settings match) the "
                                             "indexes of a corpus and report their size and build time.")
    add_corpus_args(build)
    build.add_argument("--retrievers", default="bm25,dense",
                       help="which indexes to build, comma-separated (default: bm25,dense)")
    build.set_defaults(handler=cmd_index_build)
    return parser


def add_method_args(p: argparse.ArgumentParser) -> None:
    from metarag.methods.registry import METHODS

    p.add_argument("--method", default="standard-rag",
                   help=f"method to run: {', '.join(METHODS)} (default: standard-rag)")
    p.add_argument("--k", type=int, default=None, help="passages per retrieval (method default: 5)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a method setting by name; repeatable")


def add_corpus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", default=None,
                   help="corpus file: JSONL {id,title,text} or {id,contents}, or a HippoRAG JSON corpus "
                        "(default: the HotpotQA train100 demo corpus shipped with metarag)")
    p.add_argument("--retriever", default="bm25", choices=("bm25", "dense"),
                   help="retriever for the run (default: bm25)")
    p.add_argument("--index-dir", default=None,
                   help="where indexes live (default: $METARAG_HOME/indexes/<corpus fingerprint>)")


def add_llm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--llm", default="embedded",
                   help="LLM back-end: embedded (Qwen2.5-Coder-1.5B, default), embedded-0.5b, gguf "
                        "(with --gguf PATH), openai (with --base-url and --model)")
    p.add_argument("--gguf", default=None, help="path of a GGUF file, for --llm gguf")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="OpenAI-compatible server URL")
    p.add_argument("--model", default="", help="model name on the server, for --llm openai")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY",
                   help="environment variable holding the API key (default: OPENAI_API_KEY)")
    p.add_argument("--no-cache", action="store_true", help="do not use the persistent response cache")


# ------------------------------------------------------------------------------------- commands
def cmd_ask(args: argparse.Namespace) -> int:
    from metarag.pipeline import answer_question, method_from_args
    from metarag.display import format_trace

    if not args.question.strip():
        raise_config("the question is empty")
    method = method_from_args(args.method, args.k, args.set)
    trace = answer_question(args.question, method, corpus=args.corpus, retriever=args.retriever,
                            index_dir=args.index_dir, llm_spec=llm_spec_from_args(args),
                            on_step=None if args.json else _live_printer())
    if args.json:
        print(trace.to_json())
    else:
        print(format_trace(trace, header_only=True))
    return 0 if trace.error is None else 1


def cmd_index_build(args: argparse.Namespace) -> int:
    from metarag.pipeline import build_indexes

    for line in build_indexes(args.corpus, args.retrievers.split(","), index_dir=args.index_dir):
        print(line)
    return 0


def llm_spec_from_args(args: argparse.Namespace):
    from metarag.llm.registry import LLMSpec, check_spec

    spec = LLMSpec(backend=args.llm, gguf=args.gguf, base_url=args.base_url, model=args.model,
                   api_key_env=args.api_key_env, response_cache=not args.no_cache)
    check_spec(spec)
    return spec


def raise_config(message: str):
    from metarag.errors import ConfigError

    raise ConfigError(message)


def _live_printer():
    from metarag.display import format_step

    def show(step) -> None:
        print(format_step(step), flush=True)
    return show


if __name__ == "__main__":
    sys.exit(main())
